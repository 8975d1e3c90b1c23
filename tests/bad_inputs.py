"""Shared tools of the bad-input tests: a state fingerprint, a rejection assertion, and
hypothesis strategies of bad argument values.

A public entry point that gets a bad argument must raise a `PagedAttnError` subclass (normally
`InvalidArgumentError`) whose message names the argument, and must change no state: no byte of
any tensor it was given, no entry of a manager.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import torch
from hypothesis import strategies as st

from pagedattn.errors import PagedAttnError


def fingerprint(*objs: object) -> list:
    """A comparable copy of everything observable in objs: tensors byte for byte (NaN-safe),
    managers through `snapshot()`, containers recursively, other values as they are."""
    out: list = []
    for o in objs:
        if isinstance(o, torch.Tensor):
            t = o.detach()
            raw = t.cpu().contiguous().reshape(-1).view(torch.uint8).clone()  # 0-dim too
            out.append((t.dtype, tuple(t.shape), raw))
        elif hasattr(o, "snapshot") and callable(o.snapshot):
            out.append(o.snapshot())
        elif isinstance(o, (list, tuple)):
            out.append(fingerprint(*o))
        elif isinstance(o, dict):
            out.append(fingerprint(*o.values()))
        elif hasattr(o, "__dataclass_fields__"):
            out.append(fingerprint(*(getattr(o, f) for f in o.__dataclass_fields__)))
        else:
            out.append(o)
    return out


def _same(a: list, b: list) -> bool:
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        if isinstance(x, tuple) and len(x) == 3 and isinstance(x[2], torch.Tensor):
            if not (
                isinstance(y, tuple)
                and x[:2] == y[:2]
                and x[2].shape == y[2].shape
                and torch.equal(x[2], y[2])
            ):
                return False
        elif isinstance(x, list):
            if not (isinstance(y, list) and _same(x, y)):
                return False
        elif x != y:
            return False
    return True


def assert_rejected(
    fn: Callable, *args, state: tuple = (), names: str | tuple[str, ...] | None = None, **kw
) -> PagedAttnError:
    """Call fn(*args, **kw); assert it raises a PagedAttnError (whose message contains one of
    `names`, when given) and that nothing in `state` changed. Returns the error."""
    before = fingerprint(*state)
    try:
        fn(*args, **kw)
    except PagedAttnError as e:
        err = e
    except Exception as e:  # noqa: BLE001 - the point is to catch untyped errors
        raise AssertionError(f"untyped error {type(e).__name__}: {e}") from e
    else:
        raise AssertionError("no error raised")
    if names is not None:
        wanted = (names,) if isinstance(names, str) else names
        assert any(n in str(err) for n in wanted), f"message {str(err)!r} names none of {wanted}"
    assert _same(before, fingerprint(*state)), f"state changed by a rejected call ({err})"
    return err


# Strategies of bad values ------------------------------------------------------------------
#: Values that are not an int at all (an int argument must reject each one).
NOT_INTS = st.sampled_from(
    [None, True, False, 1.5, float("nan"), float("inf"), "3", b"3", [1], (2,), object()]
)


def bad_ints(low: int, high: int | None = None) -> st.SearchStrategy:
    """Values an int argument with range [low, high] must reject: out of range, not ints."""
    out_of_range = st.integers(max_value=low - 1)
    if high is not None:
        out_of_range = out_of_range | st.integers(min_value=high + 1)
    return out_of_range | NOT_INTS | st.sampled_from([2**64, -(2**63) - 1, float(low)])


def bad_floats(finite: bool = True, positive: bool = False) -> st.SearchStrategy:
    """Values a float argument must reject."""
    vals: list = [None, "1.0", [1.0], object()]
    if finite:
        vals += [float("nan"), float("inf"), float("-inf")]
    if positive:
        vals += [0.0, -1.0, -1e-30]
    return st.sampled_from(vals)


def bad_token_lists() -> st.SearchStrategy:
    """Token sequences a manager must reject: negative ids, ids past int64, non-ints, strings."""
    bad_tok = st.sampled_from([-1, -(2**31), 2**63, 2**64, 1.0, "7", None, True, np.float32(1)])
    good = st.integers(0, 1000)
    return st.one_of(
        st.tuples(st.lists(good, max_size=4), bad_tok, st.lists(good, max_size=4)).map(
            lambda t: [*t[0], t[1], *t[2]]
        ),
        st.sampled_from(["abc", b"abc", 5, None, {1: 2}, np.zeros((2, 2), np.int64)]),
    )


def tensor_variants(t: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
    """Wrong versions of a good tensor argument: dtype, rank, shape, layout, device."""
    other_dtype = torch.float16 if t.dtype != torch.float16 else torch.float32
    if not t.is_floating_point():
        other_dtype = torch.int64 if t.dtype != torch.int64 else torch.int32
    out = [
        ("dtype", t.to(other_dtype)),
        ("rank+1", t.unsqueeze(0)),
        ("meta device", torch.empty_like(t, device="meta")),
    ]
    if t.ndim >= 1 and t.shape[-1] > 1:
        out.append(("last dim - 1", t[..., :-1].clone()))
    if t.ndim >= 1:
        out.append(("rank-1", t.reshape(-1)[: max(1, math.prod(t.shape[1:]))].clone()))
    return out
