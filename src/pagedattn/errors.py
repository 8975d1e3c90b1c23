"""Typed errors. Every error pagedattn raises on purpose derives from `PagedAttnError`."""

from __future__ import annotations


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
