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

import torch

from ..errors import InvalidArgumentError, check
from ..ops._checks import typed_binding
from ..ops.dispatch import BACKENDS, choose_backend

# A compat function or method whose call does not bind raises `InvalidArgumentError` naming the
# offending argument (the body never ran, so state is untouched): `ops._checks.typed_binding`.
typed_call = typed_binding


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
