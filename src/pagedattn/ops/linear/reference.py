"""Reference FP8 batched matmul, RoPE and RMSNorm: plain torch, fp32 math, any device.

FP8 scheme (DeepSeek-V3's "128x128 weight blocks / 1x128 activation groups"):

- Weights `w [..., n, k]` are e4m3 with one scale per `(n_gran, k_gran)` block:
  `w_scale [..., ceil(n / n_gran), ceil(k / k_gran)]`, `w ~= w_q[n, k] * w_scale[n // n_gran,
  k // k_gran]`. The last block of each axis may be partial.
- Activations `x [..., m, k]` are quantized dynamically: one float32 scale per row and group of
  `k_gran` consecutive k elements, `scale = amax(|group|) / 448`, `x_q = x / scale` in e4m3.
- The product is `out[m, n] = sum_k x_q[m, k] * sx[m, k // k_gran] * w_q[n, k] *
  sw[n // n_gran, k // k_gran]`, accumulated in fp32.

RoPE `freqs_cis` layout (MAX's): float32 `[max_pos, rope_dim]` whose row p holds, for each
frequency i in [0, rope_dim / 2), the pair `(cos(p * theta_i), sin(p * theta_i))` at columns
`(2i, 2i + 1)`, with `theta_i = theta ** (-2i / rope_dim)`. It is the real view of the complex
`[max_pos, rope_dim / 2]` table `exp(1j * p * theta_i)`. `make_freqs_cis` builds it.
"""

from __future__ import annotations

import math

import torch

from ...errors import check
from ...fp8 import FP8_MAX, dequantize_blockwise, quantize_blockwise, round_scale
from ...fp8.blockwise import FP8_DTYPE, amax_over_fp8_max
from .._checks import INT32_MAX


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _gran(name: str, g: object, extent: int) -> int:
    """Block size `g` (an int in [1, 2^31 - 1]) of an axis of `extent` elements, clamped to
    the extent: a block at least as long as the axis is one block of the whole axis, so the
    padding below never exceeds the axis."""
    check(
        isinstance(g, int) and not isinstance(g, bool) and 1 <= g <= INT32_MAX,
        name,
        f"an int in [1, {INT32_MAX}]",
        repr(g),
    )
    return max(1, min(g, extent))


def _pad_last(x: torch.Tensor, multiple: int) -> torch.Tensor:
    """Zero-pad the last dim up to a multiple (zeros never change a group's amax)."""
    pad = _cdiv(x.shape[-1], multiple) * multiple - x.shape[-1]
    if pad == 0:
        return x
    return torch.nn.functional.pad(x, (0, pad))


def quantize_activation_groups(
    x: torch.Tensor, k_gran: int = 128, scale_dtype: torch.dtype = torch.float32
) -> tuple[torch.Tensor, torch.Tensor]:
    """Dynamic 1 x k_gran activation quantization.

    x: [..., k] float -> (x_q [..., k] e4m3, scales [..., ceil(k / k_gran)] in scale_dtype).
    scale = amax(|group|) / 448 (float32, floored at 2^-126; e8m0 rounds up to a power of 2).
    The last group may be partial.
    """
    k = x.shape[-1]
    k_gran = _gran("k_gran", k_gran, k)
    q, s = quantize_blockwise(_pad_last(x, k_gran), k_gran, scale_dtype)
    return q[..., :k], s


def dequantize_activation_groups(
    x_q: torch.Tensor, scales: torch.Tensor, k_gran: int, out_dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """Inverse of `quantize_activation_groups`: [..., k] = x_q * scales[..., k // k_gran]."""
    k = x_q.shape[-1]
    k_gran = _gran("k_gran", k_gran, k)
    return dequantize_blockwise(_pad_last(x_q.float(), k_gran), scales, k_gran, out_dtype)[..., :k]


def quantize_weight_blocks(
    w: torch.Tensor,
    n_gran: int = 128,
    k_gran: int = 128,
    scale_dtype: torch.dtype = torch.float32,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Blockwise weight quantization.

    w: [..., n, k] float -> (w_q [..., n, k] e4m3,
    scales [..., ceil(n / n_gran), ceil(k / k_gran)] in scale_dtype), one scale per
    n_gran x k_gran block (partial last blocks allowed): scale = amax(|block|) / 448.
    """
    check(
        isinstance(w, torch.Tensor) and w.ndim >= 2,
        "w",
        "a [..., n, k] tensor",
        getattr(w, "shape", type(w)),
    )
    n, k = w.shape[-2:]
    n_gran, k_gran = _gran("n_gran", n_gran, n), _gran("k_gran", k_gran, k)
    nb, kb = _cdiv(n, n_gran), _cdiv(k, k_gran)
    wp = _pad_last(w.float(), k_gran)
    wp = _pad_last(wp.transpose(-1, -2), n_gran).transpose(-1, -2)  # [..., nb*n_gran, kb*k_gran]
    blocks = wp.reshape(*w.shape[:-2], nb, n_gran, kb, k_gran)
    amax = blocks.abs().amax(dim=(-3, -1))  # [..., nb, kb]
    scales = round_scale(amax_over_fp8_max(amax), scale_dtype)
    s = scales.float()[..., :, None, :, None]
    q = (blocks / s).clamp(-FP8_MAX, FP8_MAX).reshape(wp.shape)[..., :n, :k]
    return q.to(FP8_DTYPE), scales


def dequantize_weight_blocks(
    w_q: torch.Tensor,
    scales: torch.Tensor,
    n_gran: int = 128,
    k_gran: int = 128,
    out_dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Inverse of `quantize_weight_blocks`: [..., n, k] = w_q * scales[n // n_gran, k // k_gran]."""
    n, k = w_q.shape[-2:]
    n_gran, k_gran = _gran("n_gran", n_gran, n), _gran("k_gran", k_gran, k)
    s = scales.float().repeat_interleave(n_gran, dim=-2).repeat_interleave(k_gran, dim=-1)
    return (w_q.float() * s[..., :n, :k]).to(out_dtype)


def fp8_bmm_reference(
    x: torch.Tensor,
    w: torch.Tensor,
    w_scale: torch.Tensor,
    *,
    k_gran: int = 128,
    n_gran: int = 128,
    out_dtype: torch.dtype = torch.bfloat16,
) -> torch.Tensor:
    """x [batch, m, k] (quantized here in 1 x k_gran groups) @ w [batch, n, k]^T (e4m3 with
    [batch, ceil(n/n_gran), ceil(k/k_gran)] block scales) -> [batch, m, n] in out_dtype.

    fp32 accumulation. Arguments are not validated here (see `fp8_bmm`)."""
    x_q, x_s = quantize_activation_groups(x, k_gran)
    xd = dequantize_activation_groups(x_q, x_s, k_gran)
    wd = dequantize_weight_blocks(w, w_scale, n_gran, k_gran)
    return torch.matmul(xd, wd.transpose(-1, -2)).to(out_dtype)


# RoPE ---------------------------------------------------------------------------------------
def make_freqs_cis(
    rope_dim: int,
    max_pos: int,
    theta: float = 10000.0,
    *,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """float32 [max_pos, rope_dim]: row p holds (cos(p*theta_i), sin(p*theta_i)) at columns
    (2i, 2i+1), theta_i = theta ** (-2i / rope_dim). Angles are computed in float64."""
    check(
        isinstance(rope_dim, int) and rope_dim >= 2 and rope_dim % 2 == 0,
        "rope_dim",
        "an even int >= 2",
        rope_dim,
    )
    check(isinstance(max_pos, int) and max_pos >= 1, "max_pos", "an int >= 1", max_pos)
    check(
        isinstance(theta, (int, float)) and math.isfinite(theta) and theta > 0,
        "theta",
        "a finite float > 0",
        theta,
    )
    i = torch.arange(rope_dim // 2, dtype=torch.float64)
    inv_freq = float(theta) ** (-2.0 * i / rope_dim)
    ang = torch.arange(max_pos, dtype=torch.float64)[:, None] * inv_freq[None, :]
    out = torch.stack([ang.cos(), ang.sin()], dim=-1).reshape(max_pos, rope_dim)
    return out.to(torch.float32).to(device)


def _data_checks_enabled(t: torch.Tensor) -> bool:
    """Value checks need a host sync: skip them while compiling or capturing a CUDA graph."""
    if torch.compiler.is_compiling():
        return False
    return not (t.is_cuda and torch.cuda.is_current_stream_capturing())


def rope(
    x: torch.Tensor,
    freqs_cis: torch.Tensor,
    positions: torch.Tensor,
    *,
    interleaved: bool,
) -> torch.Tensor:
    """Rotary position embedding.

    x: [tokens, ..., rope_dim] (e.g. [tokens, heads, rope_dim]) bf16/fp16/fp32.
    freqs_cis: float32 [max_pos, rope_dim] (cos, sin) pairs, see `make_freqs_cis`.
    positions: [tokens] integer absolute positions in [0, max_pos).
    interleaved: True rotates pairs (2i, 2i+1) by theta_i (DeepSeek / MAX complex form);
      False rotates pairs (i, i + rope_dim/2) by theta_i (Llama's rotate_half).
    Returns x's shape and dtype; the rotation is computed in fp32. x is not modified.
    """
    check(
        isinstance(x, torch.Tensor) and x.ndim >= 2 and x.is_floating_point(),
        "x",
        "a floating [tokens, ..., rope_dim] tensor",
        getattr(x, "shape", type(x)),
    )
    d = x.shape[-1]
    check(d % 2 == 0, "x", "an even last dim (rope_dim)", tuple(x.shape))
    check(
        isinstance(freqs_cis, torch.Tensor)
        and freqs_cis.ndim == 2
        and freqs_cis.shape[1] == d
        and freqs_cis.is_floating_point(),
        "freqs_cis",
        f"a float [max_pos, rope_dim={d}] tensor of (cos, sin) pairs",
        getattr(freqs_cis, "shape", type(freqs_cis)),
    )
    check(
        isinstance(positions, torch.Tensor)
        and positions.ndim == 1
        and positions.shape[0] == x.shape[0]
        and not positions.is_floating_point(),
        "positions",
        f"an integer tensor of shape ({x.shape[0]},)",
        getattr(positions, "shape", type(positions)),
    )
    check(
        freqs_cis.device == x.device and positions.device == x.device,
        "freqs_cis/positions",
        f"tensors on x.device={x.device}",
        f"{freqs_cis.device}, {positions.device}",
    )
    if _data_checks_enabled(positions) and positions.numel():
        lo, hi = int(positions.min()), int(positions.max())
        check(
            0 <= lo and hi < freqs_cis.shape[0],
            "positions",
            f"values in [0, max_pos={freqs_cis.shape[0]})",
            f"values in [{lo}, {hi}]",
        )
    cs = freqs_cis.float()[positions.long()].reshape(x.shape[0], *([1] * (x.ndim - 2)), d // 2, 2)
    cos, sin = cs[..., 0], cs[..., 1]
    xf = x.float()
    if interleaved:
        a, b = xf[..., 0::2], xf[..., 1::2]
        out = torch.stack([a * cos - b * sin, a * sin + b * cos], dim=-1).reshape(x.shape)
    else:
        a, b = xf[..., : d // 2], xf[..., d // 2 :]
        out = torch.cat([a * cos - b * sin, a * sin + b * cos], dim=-1)
    return out.to(x.dtype)


def rmsnorm(x: torch.Tensor, gamma: torch.Tensor, eps: float) -> torch.Tensor:
    """x [..., d] * rsqrt(mean(x^2, -1) + eps) * gamma [d], all in fp32; returns x.dtype."""
    check(
        isinstance(x, torch.Tensor) and x.ndim >= 1 and x.is_floating_point(),
        "x",
        "a floating [..., d] tensor",
        getattr(x, "shape", type(x)),
    )
    check(
        isinstance(gamma, torch.Tensor)
        and tuple(gamma.shape) == (x.shape[-1],)
        and gamma.device == x.device,
        "gamma",
        f"a tensor of shape ({x.shape[-1]},) on {x.device}",
        getattr(gamma, "shape", type(gamma)),
    )
    check(
        isinstance(eps, (int, float)) and math.isfinite(eps) and eps >= 0,
        "eps",
        "a finite float >= 0",
        eps,
    )
    xf = x.float()
    inv = torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + float(eps))
    return (xf * inv * gamma.float()).to(x.dtype)
