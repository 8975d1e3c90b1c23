"""Metadata-only argument checks shared by the ops' and the compat layers' validators.

Every helper raises `errors.InvalidArgumentError` (through `errors.check`) naming the argument;
none reads tensor values, so callers stay free of host syncs (CUDA-graph safe).

`typed_binding` makes a public op's bad call binding (a missing required argument, an unknown
keyword, too many positional arguments) an `InvalidArgumentError` naming the argument instead
of Python's bare `TypeError`, at no cost to a call that binds.
"""

from __future__ import annotations

import functools
import inspect
import math
import numbers

import torch

from ..errors import InvalidArgumentError, Lazy, check

#: Upper bound of an explicit split-K partition count: the partitions are a CUDA grid
#: dimension of the decode kernels (at most 65535), and past the number of keys more
#: partitions only add empty ones.
MAX_NUM_PARTITIONS = 65535
#: Largest int32: sizes, positions and mask parameters the kernels index with.
INT32_MAX = 2**31 - 1


def is_int(x: object) -> bool:
    """An integer (Python or numpy), not a bool."""
    return type(x) is int or (isinstance(x, numbers.Integral) and not isinstance(x, bool))


def binding_error(fn_name: str, sig: inspect.Signature, args: tuple, kwargs: dict) -> Exception:
    """The `InvalidArgumentError` of a call `fn_name(*args, **kwargs)` that does not bind to
    `sig`: it names the unknown keyword, the argument given twice, the missing required
    argument, or the surplus positional arguments."""
    params = sig.parameters
    P = inspect.Parameter
    positional = [
        p.name for p in params.values() if p.kind in (P.POSITIONAL_ONLY, P.POSITIONAL_OR_KEYWORD)
    ]
    takes_var_kw = any(p.kind is P.VAR_KEYWORD for p in params.values())
    where = f"{fn_name}{sig}"
    for k in kwargs:
        p = params.get(k)
        if (p is None and not takes_var_kw) or (p is not None and p.kind is P.POSITIONAL_ONLY):
            return InvalidArgumentError(
                f"{k}: expected a keyword argument of {where}, got an unknown keyword {k!r}"
            )
    if len(args) > len(positional) and not any(p.kind is P.VAR_POSITIONAL for p in params.values()):
        return InvalidArgumentError(
            f"{fn_name}: expected at most {len(positional)} positional arguments "
            f"({', '.join(positional)}; the rest are keyword-only), got {len(args)}"
        )
    given_pos = positional[: len(args)]
    for k in given_pos:
        if k in kwargs:
            return InvalidArgumentError(
                f"{k}: expected one value, got one positionally and one as a keyword"
            )
    given = set(given_pos) | set(kwargs)
    for p in params.values():
        if p.default is P.empty and p.kind not in (P.VAR_POSITIONAL, P.VAR_KEYWORD):
            if p.name not in given:
                kind = "keyword-only " if p.kind is P.KEYWORD_ONLY else ""
                return InvalidArgumentError(
                    f"{p.name}: expected a value (a required {kind}argument of {where}), got none"
                )
    try:  # not expected: the cases above cover Python's binding errors
        sig.bind(*args, **kwargs)
    except TypeError as e:
        return InvalidArgumentError(f"{fn_name}: expected arguments binding to {where}, got {e}")
    return InvalidArgumentError(f"{fn_name}: expected arguments binding to {where}")


def typed_binding(fn):
    """Decorate a public op (or a method: a first parameter named `self` is left out of the
    messages) so that a call whose arguments do not bind to its signature raises
    `InvalidArgumentError` (`binding_error`) instead of Python's `TypeError`.

    The call is made as is; only a `TypeError` raised by the binding itself (its traceback
    holds the wrapper's frame alone: the op's body never ran) is translated, so a TypeError
    from inside the op is left alone, and a call that binds pays one extra frame (0.3-0.5 us
    on the loaded 2-core CI host)."""
    sig = inspect.signature(fn)
    params = list(sig.parameters.values())
    is_method = bool(params) and params[0].name == "self"
    shown = sig.replace(parameters=params[1:]) if is_method else sig
    name = fn.__qualname__

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except TypeError as e:
            if e.__traceback__ is not None and e.__traceback__.tb_next is None:
                rest = args[1:] if is_method and args else args
                raise binding_error(name, shown, rest, kwargs) from None
            raise

    return wrapper


def describe(x: object) -> str:
    """A short description of an argument for error messages."""
    if isinstance(x, torch.Tensor):
        return f"{x.dtype} tensor of shape {tuple(x.shape)} on {x.device}"
    return type(x).__name__


class Described(Lazy):
    """`describe(x)` as a lazy `check` argument (formatted only when the check fails). Seven
    described arguments made a third of an MLA decode call's argument checks (13.2 -> 9.1 us
    on the CI CPU)."""

    __slots__ = ("x",)

    def __init__(self, x: object) -> None:  # no closure: the common (passing) case is cheaper
        self.x = x

    def __str__(self) -> str:
        return describe(self.x)


def describe_value(x: object) -> str:
    """As `describe`, but scalars, strings and None by their repr (the compat layers' messages
    quote the offending value)."""
    if isinstance(x, (int, float, str, type(None))):  # bools are ints
        return repr(x)
    return describe(x)


class DescribedValue(Described):
    """`describe_value(x)` as a lazy `check` argument (the compat layers': formatted only when
    the check fails or the object is put in a string)."""

    __slots__ = ()

    def __str__(self) -> str:
        return describe_value(self.x)


def is_positive_finite(x: object) -> bool:
    """A real number (not a bool) that is finite and > 0."""
    return isinstance(x, numbers.Real) and not isinstance(x, bool) and math.isfinite(x) and x > 0


def check_scale(
    scale: object, name: str = "scale", *, optional: bool = True, describe_got: bool = False
) -> None:
    """A finite float > 0 (None allowed when `optional`)."""
    if optional and scale is None:
        return
    check(
        is_positive_finite(scale),
        name,
        f"{'None or ' if optional else ''}a finite float > 0",
        describe(scale) if describe_got else scale,
    )


def check_granularities(k_gran: object, n_gran: object) -> None:
    """Block sizes `k_gran` and `n_gran` of the blockwise-FP8 matmuls: each an int in
    [1, 2^31 - 1] (a block larger than its axis is one block of the whole axis)."""
    for name, g in (("k_gran", k_gran), ("n_gran", n_gran)):
        ok = isinstance(g, int) and not isinstance(g, bool) and 1 <= g <= INT32_MAX
        check(ok, name, f"an int in [1, {INT32_MAX}]", Lazy(lambda g=g: repr(g)))


def check_num_partitions(num_partitions: object, name: str = "num_partitions") -> None:
    """None or an int in [1, MAX_NUM_PARTITIONS]."""
    if num_partitions is None:
        return
    check(
        is_int(num_partitions) and 1 <= num_partitions <= MAX_NUM_PARTITIONS,
        name,
        f"None or an int in [1, {MAX_NUM_PARTITIONS}]",
        Lazy(lambda: repr(num_partitions)),
    )


def check_head_vector(t: object, name: str, h_q: int, device: torch.device) -> None:
    """A float32 [h_q] tensor on `device` (attention sinks); None is allowed."""
    if t is None:
        return
    check(
        isinstance(t, torch.Tensor)
        and t.dtype == torch.float32
        and tuple(t.shape) == (h_q,)
        and t.device == device,
        name,
        Lazy(lambda: f"a float32 tensor of shape ({h_q},) on {device}"),
        Described(t),
    )


def check_out(out: object, want: tuple[int, ...], q: torch.Tensor) -> None:
    """None or a preallocated output of shape `want` in q's dtype, on q's device."""
    if out is None:
        return
    check(
        isinstance(out, torch.Tensor)
        and tuple(out.shape) == want
        and out.dtype == q.dtype
        and out.device == q.device,
        "out",
        Lazy(lambda: f"a {q.dtype} tensor of shape {want} on {q.device}"),
        Described(out),
    )


def check_int32(
    t: object, name: str, shape: tuple[int | None, ...], what: str, device: torch.device
) -> None:
    """An int32 tensor of `shape` (None: any extent) on `device`."""
    ok = (
        isinstance(t, torch.Tensor)
        and t.dtype == torch.int32
        and t.ndim == len(shape)
        and all(s is None or t.shape[i] == s for i, s in enumerate(shape))
        and t.device == device
    )
    check(ok, name, Lazy(lambda: f"an int32 {what} tensor on {device}"), Described(t))
