"""Argument checks of the blockwise-FP8 batched matmul, shared by the public `fp8_bmm`, the
Triton `fp8_bmm_triton` (which callers may use directly) and the MLA branch's weight checks.

Metadata only (no tensor values read, no host sync); failures raise `InvalidArgumentError`
naming the argument.
"""

from __future__ import annotations

import torch

from ...errors import check
from .._checks import check_granularities
from .._checks import describe as _describe

X_DTYPES = (torch.bfloat16, torch.float16, torch.float32)  # activations and outputs
W_SCALE_DTYPES = (torch.float32, torch.float8_e8m0fnu)  # weight block scales


def check_fp8_bmm_args(
    x: torch.Tensor,
    w: torch.Tensor,
    w_scale: torch.Tensor,
    k_gran: int,
    n_gran: int,
    out_dtype: torch.dtype,
    names: tuple[str, str, str] = ("x", "w", "w_scale"),
) -> None:
    """Shape/dtype/device checks of `fp8_bmm(x, w, w_scale, k_gran=, n_gran=, out_dtype=)`.
    `names` lets a caller report its own argument names."""
    xn, wn, sn = names
    check_granularities(k_gran, n_gran)
    check(
        isinstance(x, torch.Tensor) and x.ndim == 3 and x.dtype in X_DTYPES,
        xn,
        f"a [batch, m, k] tensor with dtype in {X_DTYPES}",
        _describe(x),
    )
    check(
        isinstance(w, torch.Tensor) and w.ndim == 3 and w.dtype == torch.float8_e4m3fn,
        wn,
        "a [batch, n, k] torch.float8_e4m3fn tensor",
        _describe(w),
    )
    batch, _, k = x.shape
    check(
        w.shape[0] == batch and w.shape[2] == k,
        wn,
        f"shape [batch={batch}, n, k={k}] matching {xn}",
        tuple(w.shape),
    )
    n = w.shape[1]
    want = (batch, -(-n // n_gran), -(-k // k_gran))
    check(
        isinstance(w_scale, torch.Tensor)
        and tuple(w_scale.shape) == want
        and w_scale.dtype in W_SCALE_DTYPES,
        sn,
        f"a tensor of shape {want} (batch, ceil(n/n_gran), ceil(k/k_gran)) with dtype in "
        f"{W_SCALE_DTYPES}",
        _describe(w_scale),
    )
    check(
        w.device == x.device and w_scale.device == x.device,
        f"{wn}/{sn}",
        f"tensors on {xn}.device={x.device}",
        f"{w.device}, {w_scale.device}",
    )
    check(out_dtype in X_DTYPES, "out_dtype", f"one of {X_DTYPES}", out_dtype)


__all__ = ["W_SCALE_DTYPES", "X_DTYPES", "check_fp8_bmm_args"]
