"""Typed errors. Every error pagedattn raises on purpose derives from `PagedAttnError`.

Also the argument checks that raise them: `check` (a condition), `check_int` (an int in a
range; bool, float, str and None rejected) and `check_bool` (a bool, not 1 or "yes")."""

from __future__ import annotations

import numpy as np


class PagedAttnError(Exception):
    """Base class of every error pagedattn raises on purpose."""


class InvalidArgumentError(PagedAttnError, ValueError):
    """An argument has the wrong type, dtype, shape or value. The message names it."""


class OutOfPagesError(PagedAttnError, RuntimeError):
    """The page pool cannot satisfy an allocation. No state was changed."""


class UnknownRequestError(PagedAttnError, KeyError):
    """A request id that was never claimed (or was already released)."""

    def __str__(self) -> str:  # KeyError quotes its message; keep it readable.
        return str(self.args[0]) if self.args else ""


class DuplicateRequestError(PagedAttnError, ValueError):
    """A request id that is already claimed."""


class MaxLengthExceededError(PagedAttnError, ValueError):
    """Tokens past the manager's maximum sequence length."""


class CapacityError(PagedAttnError, RuntimeError):
    """Too many concurrent requests for the manager's batch capacity."""


class Lazy:
    """A `check` message part built only if the check fails: `Lazy(lambda: f"...")`. Hot
    paths (a decode launch's argument checks) pass these instead of formatted strings; the
    formatting of a dtype or shape cost about a us each (dev/host_cost.py)."""

    __slots__ = ("fn",)

    def __init__(self, fn) -> None:
        self.fn = fn

    def __str__(self) -> str:
        return str(self.fn())


def check(cond: bool, name: str, expected: object, got: object) -> None:
    """Raise `InvalidArgumentError` naming `name` unless `cond` holds."""
    if not cond:
        raise InvalidArgumentError(f"{name}: expected {expected}, got {got}")


#: Largest int32 / int64 values; page ids, lengths and token ids are stored in these types.
INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1


def check_int(name: str, v: object, low: int, high: int | None = None) -> int:
    """`v` as a Python int in [low, high] (high None: no upper bound); raises
    `InvalidArgumentError` naming `name` otherwise. bool, float, str, None and NaN are
    rejected; numpy integer scalars are accepted."""
    if type(v) is int and v >= low and (high is None or v <= high):
        return v  # fast path
    # Type first (a bool is an int; numpy integers are not), so no comparison can raise.
    if isinstance(v, (int, np.integer)) and not isinstance(v, bool):
        iv = int(v)
        if iv >= low and (high is None or iv <= high):
            return iv
    raise InvalidArgumentError(
        f"{name}: expected an int in [{low}, {'inf' if high is None else high}], got {v!r}"
    )


def check_bool(name: str, v: object) -> bool:
    """`v` as a Python bool; raises `InvalidArgumentError` naming `name` for anything that is
    not a bool (1, "yes" and None included). numpy bools are accepted."""
    if v is True or v is False:
        return v
    if isinstance(v, np.bool_):
        return bool(v)
    raise InvalidArgumentError(f"{name}: expected a bool, got {v!r}")
