"""Blockwise, per-token and per-tensor FP8 e4m3 quantization."""

from __future__ import annotations

import torch

from ..errors import check

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0  # largest finite e4m3fn
SCALE_FLOOR = 2.0**-126  # keeps all-zero blocks finite; also the smallest normal e8m0 scale


def round_scale(scale: torch.Tensor, scale_dtype: torch.dtype) -> torch.Tensor:
    """Scale in its storage dtype. e8m0 rounds *up* to a power of two (x/scale stays <= 448)."""
    scale = scale.float().clamp_min(SCALE_FLOOR)
    if scale_dtype == torch.float32:
        return scale
    check(
        scale_dtype == torch.float8_e8m0fnu,
        "scale_dtype",
        "torch.float32 or torch.float8_e8m0fnu",
        scale_dtype,
    )
    # frexp is exact: scale = m * 2^e with m in [0.5, 1); the next power of two >= scale is
    # 2^(e-1) when m == 0.5 exactly, else 2^e.
    m, e = torch.frexp(scale)
    e = torch.where(m == 0.5, e - 1, e)
    p2 = torch.ldexp(torch.ones_like(scale), e)
    return torch.where(torch.isfinite(scale), p2, scale).to(torch.float8_e8m0fnu)


def amax_over_fp8_max(amax: torch.Tensor) -> torch.Tensor:
    """amax / 448, correctly rounded on every device. (On CUDA, torch turns a division by a
    Python scalar into a multiply by its reciprocal, which can differ by one ulp and flip
    e4m3 ties against kernels that divide exactly; dividing by a tensor does not.)"""
    return amax / torch.full_like(amax, FP8_MAX)


def quantize_blockwise(
    x: torch.Tensor, G: int, scale_dtype: torch.dtype = torch.float32
) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., D] -> (q [..., D] e4m3, scales [..., D // G] in scale_dtype).

    scale = amax(|block|) / 448 (e8m0: rounded up to a power of two); q = x / scale.
    Non-finite inputs propagate (NaN stays NaN through e4m3).
    """
    D = x.shape[-1]
    check(G >= 1 and D % G == 0, "G", f"a divisor of the last dim {D}", G)
    xb = x.float().reshape(*x.shape[:-1], D // G, G)
    amax = xb.abs().amax(dim=-1)
    scale = round_scale(amax_over_fp8_max(amax), scale_dtype)
    q = (xb / scale.float().unsqueeze(-1)).clamp(-FP8_MAX, FP8_MAX)
    return q.reshape(x.shape).to(FP8_DTYPE), scale


def dequantize_blockwise(
    q: torch.Tensor, scales: torch.Tensor, G: int, out_dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """Inverse of `quantize_blockwise`: q [..., D] * scales[..., d // G]."""
    D = q.shape[-1]
    check(
        scales.shape[-1] * G == D,
        "scales",
        f"last dim {D // max(G, 1)} (= {D} / G={G})",
        tuple(scales.shape),
    )
    s = scales.float().repeat_interleave(G, dim=-1)
    return (q.float() * s).to(out_dtype)


def quantize_per_tensor(x: torch.Tensor, scale: torch.Tensor | float) -> torch.Tensor:
    """x / scale clamped to the e4m3 range, with a fixed (calibrated) float32 scale."""
    s = scale.float() if isinstance(scale, torch.Tensor) else float(scale)
    return (x.float() / s).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
