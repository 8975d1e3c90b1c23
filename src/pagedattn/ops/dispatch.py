"""One dispatcher for every op: Triton on CUDA, the reference elsewhere.

Override with the op's `backend=` argument or the PAGEDATTN_BACKEND environment variable
("triton" or "reference", read through `pagedattn.env`; docs/env.md). On a CPU, "triton" runs
the kernels under TRITON_INTERPRET=1 (the variable must be set before triton is imported),
which is how CI checks kernel indexing.
"""

from __future__ import annotations

import torch

from .. import env
from ..errors import check

BACKENDS = ("triton", "reference")


def triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def choose_backend(device: torch.device, backend: str | None = None) -> str:
    """'triton' or 'reference' for tensors on `device`. `backend`: None (by device, or
    $PAGEDATTN_BACKEND) or one of BACKENDS; anything else (an empty string, 0, False, a
    list) raises InvalidArgumentError naming "backend"."""
    if backend is None:
        backend = env.read("BACKEND")
    if backend is not None:
        check(
            type(backend) is str and backend in BACKENDS,
            "backend",
            f"None or one of {BACKENDS}",
            repr(backend),
        )
        if backend == "triton":
            check(
                triton_available() and (device.type == "cuda" or env.triton_interpreter()),
                "backend",
                "'triton' only on CUDA or with TRITON_INTERPRET=1",
                f"'triton' on {device}",
            )
        return backend
    if device.type == "cuda" and triton_available():
        return "triton"
    return "reference"
