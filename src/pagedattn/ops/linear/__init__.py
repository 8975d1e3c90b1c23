"""Linear-algebra pieces of the MLA branch: FP8 batched matmul (DeepSeek's 128x128 weight
blocks / 1x128 dynamic activation groups), RoPE and RMSNorm. See `reference.py` for the
formats and the `freqs_cis` layout.

`fp8_bmm` validates its arguments (`checks.check_fp8_bmm_args`: metadata only, no host sync;
the values of weight scales only when they are on the CPU, where reading them costs no sync)
and dispatches with `ops.dispatch.choose_backend`: "triton" -> `triton_fp8_bmm.fp8_bmm_triton`
(CUDA), "reference" -> `fp8_bmm_reference` (CPU). `rope` and `rmsnorm` are plain torch and run
on any device.
"""

from __future__ import annotations

import torch

from .._checks import typed_binding
from ..dispatch import choose_backend
from .checks import check_fp8_bmm_args
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


@typed_binding
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
      n_gran x k_gran block of w (partial last blocks allowed), each finite and > 0. Values
      are checked when w_scale is on the CPU (both backends); on a GPU they are trusted (no
      host sync): a NaN scale there gives NaN products, as the reference computes them.
    k_gran, n_gran: block sizes, ints in [1, 2^31 - 1] (a block past its axis covers it).
    out_dtype: bf16, fp16 or fp32. backend: "triton" or "reference" (default: by device, or
      $PAGEDATTN_BACKEND).
    Returns [batch, m, n] in out_dtype (fp32 accumulation).

    Raises InvalidArgumentError naming the argument (a missing or unknown one included).
    """
    check_fp8_bmm_args(x, w, w_scale, k_gran, n_gran, out_dtype)
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
