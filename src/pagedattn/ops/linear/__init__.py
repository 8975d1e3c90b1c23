"""Linear-algebra pieces of the MLA branch: FP8 batched matmul (DeepSeek's 128x128 weight
blocks / 1x128 dynamic activation groups), RoPE and RMSNorm. See `reference.py` for the
formats and the `freqs_cis` layout.

`fp8_bmm` validates its arguments (metadata only, no host sync) and dispatches with
`ops.dispatch.choose_backend`: "triton" -> `triton_fp8_bmm.fp8_bmm_triton`, "reference" ->
`fp8_bmm_reference`. `rope` and `rmsnorm` are plain torch and run on any device.
"""

from __future__ import annotations

import torch

from ...errors import check
from .._checks import check_granularities
from .._checks import describe as _describe
from ..dispatch import choose_backend
from .reference import (
    dequantize_activation_groups,
    dequantize_weight_blocks,
    fp8_bmm_reference,
    make_freqs_cis,
    quantize_activation_groups,
    quantize_weight_blocks,
    rmsnorm,
    rope,
)

X_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
W_SCALE_DTYPES = (torch.float32, torch.float8_e8m0fnu)


def _check_fp8_bmm_args(
    x: torch.Tensor,
    w: torch.Tensor,
    w_scale: torch.Tensor,
    k_gran: int,
    n_gran: int,
    out_dtype: torch.dtype,
    names: tuple[str, str, str] = ("x", "w", "w_scale"),
) -> None:
    """Shape/dtype/device checks of `fp8_bmm`. `names` lets a caller report its own argument
    names (e.g. the MLA branch's `w_uk`, `w_uk_scale`)."""
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


def fp8_bmm(
    x: torch.Tensor,
    w: torch.Tensor,
    w_scale: torch.Tensor,
    *,
    k_gran: int = 128,
    n_gran: int = 128,
    out_dtype: torch.dtype = torch.bfloat16,
    backend: str | None = None,
) -> torch.Tensor:
    """Blockwise-FP8 batched matmul `x @ w^T` (docs/ops.md, `fp8_bmm`).

    x: [batch, m, k] bf16/fp16/fp32, quantized here to e4m3 in 1 x k_gran groups along k (one
      float32 scale per row and group, amax / 448).
    w: [batch, n, k] float8_e4m3fn.
    w_scale: [batch, ceil(n/n_gran), ceil(k/k_gran)] float32 or float8_e8m0fnu, one per
      n_gran x k_gran block of w (partial last blocks allowed).
    Returns [batch, m, n] in out_dtype (fp32 accumulation).
    """
    _check_fp8_bmm_args(x, w, w_scale, k_gran, n_gran, out_dtype)
    if choose_backend(x.device, backend) == "triton":
        from .triton_fp8_bmm import fp8_bmm_triton

        return fp8_bmm_triton(x, w, w_scale, k_gran=k_gran, n_gran=n_gran, out_dtype=out_dtype)
    return fp8_bmm_reference(x, w, w_scale, k_gran=k_gran, n_gran=n_gran, out_dtype=out_dtype)


__all__ = [
    "dequantize_activation_groups",
    "dequantize_weight_blocks",
    "fp8_bmm",
    "fp8_bmm_reference",
    "make_freqs_cis",
    "quantize_activation_groups",
    "quantize_weight_blocks",
    "rmsnorm",
    "rope",
]
