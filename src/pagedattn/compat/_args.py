"""Argument plumbing shared by the compat layers.

- `typed_call`: a public compat function or wrapper method whose call does not bind to its
  signature (an unknown keyword, a missing required argument, surplus positional arguments,
  an argument given twice) raises `InvalidArgumentError` naming the argument, not Python's
  bare `TypeError`. The message is `ops._checks.binding_error`'s (the ops' `typed_binding`),
  with the method's qualified name and its signature without `self`.
- `resolve_backend`: the pagedattn backend ("triton" / "reference") a call will use, with
  errors naming the caller's argument (`backend` for FlashMLA, `pagedattn_backend` for the
  FlashInfer wrappers).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import TypeVar

import torch

from ..errors import InvalidArgumentError, check
from ..ops._checks import binding_error
from ..ops.dispatch import BACKENDS, choose_backend

F = TypeVar("F", bound=Callable)


def typed_call(fn: F) -> F:
    """Decorate a compat function or method: a call that does not bind raises
    `InvalidArgumentError` naming the offending argument (state is untouched: the body never
    ran). Only a `TypeError` raised by the binding itself (its traceback holds the wrapper's
    frame alone) is translated; a call that binds pays one extra frame (~0.1 us)."""
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

    return wrapper  # type: ignore[return-value]


def resolve_backend(device: torch.device, backend: object, name: str) -> str:
    """`ops.dispatch.choose_backend(device, backend)` with errors naming `name`: None (by
    device, or $PAGEDATTN_BACKEND) or one of BACKENDS ("triton" only on CUDA or under
    TRITON_INTERPRET=1)."""
    if backend is not None:
        check(
            type(backend) is str and backend in BACKENDS,
            name,
            f"None or one of {BACKENDS}",
            repr(backend),
        )
    try:
        return choose_backend(device, backend)  # type: ignore[arg-type]
    except InvalidArgumentError as e:
        msg = str(e)
        if backend is None or not msg.startswith("backend:"):
            raise  # $PAGEDATTN_BACKEND: the environment variable is at fault
        raise InvalidArgumentError(name + msg[len("backend") :]) from None
