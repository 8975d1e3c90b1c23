"""Layer 0: FP8 (e4m3) quantization formats, pure torch (any device).

Blockwise: one scale per G consecutive elements of the last dim; the scale of element d is
`scales[..., d // G]`. G = head_dim is one scale per token per head. Scales are float32, or
float8_e8m0fnu (powers of two, rounded up so that |x| / scale <= 448 still holds).
Packed MLA rows (rope-aware, FlashMLA V32 and MODEL1) live in `mla_formats`.
"""

from .blockwise import (
    FP8_MAX,
    dequantize_blockwise,
    quantize_blockwise,
    quantize_per_tensor,
    round_scale,
)

__all__ = [
    "FP8_MAX",
    "dequantize_blockwise",
    "quantize_blockwise",
    "quantize_per_tensor",
    "round_scale",
]
