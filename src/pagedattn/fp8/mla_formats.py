"""Packed FP8 MLA cache rows: rope-aware, FlashMLA V32 and FlashMLA MODEL1 (pure torch).

An MLA token is one latent "head" of d_qk = latent + rope values. Every format stores the
latent as FP8 e4m3 with per-group scales and keeps the rope part unquantized in bf16. Bytes
are little-endian, as torch's dtype views lay them out on every supported device.

Rope-aware (DESIGN.md; `KVQuantConfig.mla_rope_aware`), `latent + 2*rope` bytes a token,
640 for DeepSeek V3 (d_qk 576):

    [0, latent)                 latent, e4m3, x / s
    [latent, latent + 2*rope)   rope, bf16
    scale buffer                s = amax(|latent|) / 448, one float32 per token (not rounded)

FlashMLA V32 (`flash_mla_with_kvcache` with `is_fp8_kvcache`, d_qk 576), 656 bytes a token:

    [0, 512)     latent, e4m3, 4 tiles of 128 values
    [512, 528)   4 float32 tile scales s_i
    [528, 656)   rope, 64 bf16

FlashMLA MODEL1 (d_qk 512 = 448 latent + 64 rope). A page (FlashMLA "block") of P tokens is
one contiguous run of P * 584 bytes: first every token's 576 data bytes, then a trailer of
8 scale bytes per token:

    token o's data     [o*576, o*576 + 448)   latent, e4m3, 7 tiles of 64 values
                       [o*576 + 448, o*576 + 576)   rope, 64 bf16
    token o's scales   [P*576 + o*8, P*576 + o*8 + 7)   7 e8m0 tile scales, then 1 pad byte (0)

Scales (facts from FlashMLA's `tests/quant.py` and its sm90 sparse decode kernel):
  - V32 and MODEL1 tile scales are powers of two, 2^ceil(log2(amax / 448)). MODEL1 stores
    them as e8m0; V32 stores the same values as float32, because FlashMLA's kernel converts
    each float32 scale to bf16 and dequantizes in bf16, which is exact only for powers of two.
  - The rope-aware scale is the plain float32 amax / 448 (one scale per token, MAX's layout).
  - An all-zero group gets the floor scale 2^-126 (`blockwise.SCALE_FLOOR`) and stores zeros.
    FlashMLA's own quantizer floors amax / 448 at 1e-4 instead, which only matters for groups
    with amax < 0.045; both dequantize with any FlashMLA kernel.
  - Non-finite latent input: a NaN or +-inf in a group makes that group's scale non-finite,
    so the whole group dequantizes to NaN (never to a wrong finite value). Rope values keep
    NaN/inf element by element.

Dequantization is exact in float32 for power-of-two scales (e4m3 * 2^k); the rope-aware
product q * s rounds once in float32.

This module converts bytes <-> tensors only (layer 0). Rows read and written through an
operand live above it: `operands.load_model1_rows` / `operands.model1_page_views` (reading a
MODEL1 page) and `ops.store_kv.reference.store_rows` (writing any packed format); one cache
layer as FlashMLA's `k_cache` and back is `cache.flashmla`.
"""

from __future__ import annotations

import torch

from ..errors import check
from .blockwise import FP8_DTYPE, FP8_MAX, SCALE_FLOOR, quantize_blockwise

E8M0_DTYPE = torch.float8_e8m0fnu
BF16 = torch.bfloat16

# Rope-aware defaults (DeepSeek V3): 512 latent + 64 rope.
ROPE_AWARE_LATENT, ROPE_AWARE_ROPE = 512, 64
ROPE_AWARE_BYTES = ROPE_AWARE_LATENT + 2 * ROPE_AWARE_ROPE  # 640

# FlashMLA V32 (DeepSeek V3.2): d_qk 576.
V32_LATENT, V32_TILE, V32_ROPE = 512, 128, 64
V32_NUM_TILES = V32_LATENT // V32_TILE  # 4
V32_D_QK = V32_LATENT + V32_ROPE  # 576
V32_SCALE_OFFSET = V32_LATENT  # 512
V32_ROPE_OFFSET = V32_LATENT + 4 * V32_NUM_TILES  # 528
V32_BYTES = V32_ROPE_OFFSET + 2 * V32_ROPE  # 656

# FlashMLA MODEL1 (DeepSeek V4): d_qk 512.
MODEL1_LATENT, MODEL1_TILE, MODEL1_ROPE = 448, 64, 64
MODEL1_NUM_TILES = MODEL1_LATENT // MODEL1_TILE  # 7
MODEL1_D_QK = MODEL1_LATENT + MODEL1_ROPE  # 512
MODEL1_DATA_BYTES = MODEL1_LATENT + 2 * MODEL1_ROPE  # 576 data bytes a token
MODEL1_SCALE_BYTES = 8  # 7 e8m0 scales + 1 pad byte a token, in the page trailer
MODEL1_BYTES = MODEL1_DATA_BYTES + MODEL1_SCALE_BYTES  # 584
# FlashMLA's reference allocator pads each MODEL1 block to a multiple of 576 bytes; its
# kernels load 16-byte vectors, so every block must start on a 16-byte boundary.
MODEL1_BLOCK_ALIGN = 576
FLASHMLA_ALIGN = 16

PACKED_FORMATS = ("mla_rope_aware", "flashmla_v32", "flashmla_model1")


# Byte helpers --------------------------------------------------------------------------------
def _bytes_of(t: torch.Tensor) -> torch.Tensor:
    """[..., n] tensor of a k-byte dtype -> [..., n*k] uint8 (native little-endian)."""
    return t.contiguous().view(torch.uint8)


def _view_bytes_as(b: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """[..., n*k] uint8 -> [..., n] of a k-byte dtype (copies a misaligned slice first)."""
    b = b.contiguous()
    size = dtype.itemsize
    if b.storage_offset() % size:
        b = b.clone()
    return b.view(dtype)


def check_float_input(x: object, name: str, last: int | None = None) -> None:
    """x: a floating-point tensor of >= 2-byte elements, at least 1 dim (last dim `last`)."""
    check(
        isinstance(x, torch.Tensor) and x.is_floating_point() and x.element_size() > 1,
        name,
        "a bf16/fp16/fp32/fp64 tensor",
        x.dtype if isinstance(x, torch.Tensor) else type(x),
    )
    check(x.ndim >= 1, name, "at least 1 dim", tuple(x.shape))
    if last is not None:
        check(x.shape[-1] == last, f"{name}.shape[-1]", str(last), tuple(x.shape))


def _check_raw(raw: object, name: str, last: int) -> None:
    check(
        isinstance(raw, torch.Tensor) and raw.dtype == torch.uint8,
        name,
        "a uint8 tensor",
        raw.dtype if isinstance(raw, torch.Tensor) else type(raw),
    )
    check(raw.ndim >= 1 and raw.shape[-1] == last, f"{name}.shape[-1]", str(last), raw.shape)


def _check_out_dtype(out_dtype: torch.dtype) -> None:
    check(
        isinstance(out_dtype, torch.dtype) and out_dtype.is_floating_point,
        "out_dtype",
        "a floating-point torch.dtype",
        out_dtype,
    )


def _check_token_scales(scales: object, raw: torch.Tensor) -> None:
    """scales: float32 [..., 1], one per row of raw [..., bytes]."""
    check(
        isinstance(scales, torch.Tensor)
        and scales.dtype == torch.float32
        and tuple(scales.shape) == (*raw.shape[:-1], 1),
        "scales",
        f"a float32 tensor of shape {(*raw.shape[:-1], 1)}",
        f"{tuple(scales.shape)} {scales.dtype}" if isinstance(scales, torch.Tensor) else scales,
    )


def _pow2_tile_scales(latent: torch.Tensor, tile: int) -> tuple[torch.Tensor, torch.Tensor]:
    """latent [..., L] -> (q [..., L] e4m3, scales [..., L // tile] e8m0, powers of two)."""
    return quantize_blockwise(latent, tile, E8M0_DTYPE)


# Rope-aware ----------------------------------------------------------------------------------
def pack_rope_aware(
    x: torch.Tensor, rope_dim: int = ROPE_AWARE_ROPE
) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize MLA tokens to the rope-aware row.

    x: [..., d_qk] float (latent = d_qk - rope_dim, then rope_dim rope values).
    Returns (raw [..., latent + 2*rope_dim] uint8, scales [..., 1] float32), where
    scale = amax(|latent|) / 448 (floored at 2^-126) and the rope is stored as bf16.
    """
    check_float_input(x, "x")
    d = x.shape[-1]
    check(
        isinstance(rope_dim, int) and 0 < rope_dim < d,
        "rope_dim",
        f"an int in (0, d_qk={d})",
        rope_dim,
    )
    latent = d - rope_dim
    q, s = quantize_blockwise(x[..., :latent], latent, torch.float32)
    rope = _bytes_of(x[..., latent:].to(BF16))
    raw = torch.cat([q.view(torch.uint8), rope], dim=-1)
    return raw, s


def unpack_rope_aware(
    raw: torch.Tensor,
    scales: torch.Tensor,
    rope_dim: int = ROPE_AWARE_ROPE,
    out_dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Inverse of `pack_rope_aware`: raw [..., latent + 2*rope_dim] uint8 and scales
    [..., 1] float32 -> [..., latent + rope_dim] in out_dtype."""
    check(isinstance(rope_dim, int) and rope_dim > 0, "rope_dim", "a positive int", rope_dim)
    check(
        isinstance(raw, torch.Tensor)
        and raw.dtype == torch.uint8
        and raw.ndim >= 1
        and raw.shape[-1] > 2 * rope_dim,
        "raw",
        f"a uint8 tensor [..., latent + {2 * rope_dim}] with latent > 0",
        f"{tuple(raw.shape)} {raw.dtype}" if isinstance(raw, torch.Tensor) else type(raw),
    )
    _check_token_scales(scales, raw)
    _check_out_dtype(out_dtype)
    latent = raw.shape[-1] - 2 * rope_dim
    lat = _view_bytes_as(raw[..., :latent], FP8_DTYPE).float() * scales
    rope = _view_bytes_as(raw[..., latent:], BF16).float()
    return torch.cat([lat, rope], dim=-1).to(out_dtype)


# FlashMLA V32 --------------------------------------------------------------------------------
def pack_v32(x: torch.Tensor) -> torch.Tensor:
    """Quantize tokens to FlashMLA's 656-byte V32 row.

    x: [..., 576] float -> [..., 656] uint8: 512 e4m3 | 4 float32 power-of-two tile scales
    (one per 128 latent values) | 64 bf16 rope.
    """
    check_float_input(x, "x", V32_D_QK)
    q, s = _pow2_tile_scales(x[..., :V32_LATENT], V32_TILE)
    rope = _bytes_of(x[..., V32_LATENT:].to(BF16))
    return torch.cat([q.view(torch.uint8), _bytes_of(s.float()), rope], dim=-1)


def v32_scales(raw: torch.Tensor) -> torch.Tensor:
    """The 4 float32 tile scales of V32 rows: raw [..., 656] uint8 -> [..., 4] float32."""
    _check_raw(raw, "raw", V32_BYTES)
    return _view_bytes_as(raw[..., V32_SCALE_OFFSET:V32_ROPE_OFFSET], torch.float32)


def unpack_v32(raw: torch.Tensor, out_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Inverse of `pack_v32`: raw [..., 656] uint8 -> [..., 576] in out_dtype."""
    _check_raw(raw, "raw", V32_BYTES)
    _check_out_dtype(out_dtype)
    q = _view_bytes_as(raw[..., :V32_LATENT], FP8_DTYPE).float()
    s = v32_scales(raw)
    lat = (q.unflatten(-1, (V32_NUM_TILES, V32_TILE)) * s.unsqueeze(-1)).flatten(-2)
    rope = _view_bytes_as(raw[..., V32_ROPE_OFFSET:], BF16).float()
    return torch.cat([lat, rope], dim=-1).to(out_dtype)


# Rope-aware <-> V32 --------------------------------------------------------------------------
def rope_aware_to_v32(
    raw: torch.Tensor, scales: torch.Tensor, *, requantize: bool = False
) -> torch.Tensor:
    """Rope-aware rows (d_qk 576) -> V32 rows: raw [..., 640] uint8, scales [..., 1] float32
    -> [..., 656] uint8.

    requantize=False (default): lossless. The e4m3 bytes and rope are copied and the token's
    float32 scale is repeated in all 4 tile slots, so `unpack_v32` returns exactly what
    `unpack_rope_aware` did. FlashMLA's kernel rounds float32 scales to bf16, so it sees each
    token's latent multiplied by bf16(s) / s (within 2^-9 of 1).
    requantize=True: dequantize, then quantize again with power-of-two tile scales as
    `pack_v32` does (exact in FlashMLA's bf16 dequantization, one more e4m3 rounding).
    """
    _check_raw(raw, "raw", ROPE_AWARE_BYTES)
    if requantize:
        return pack_v32(unpack_rope_aware(raw, scales, ROPE_AWARE_ROPE, torch.float32))
    _check_token_scales(scales, raw)
    s4 = _bytes_of(scales.expand(*scales.shape[:-1], V32_NUM_TILES))
    return torch.cat([raw[..., :V32_LATENT], s4, raw[..., V32_LATENT:]], dim=-1)


def v32_to_rope_aware(raw: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """V32 rows -> rope-aware rows: raw [..., 656] uint8 -> (raw [..., 640] uint8,
    scales [..., 1] float32).

    The token scale is the largest of the 4 tile scales, so |x| / s <= 448 still holds.
    Tiles already at that scale keep their bytes; the others are rescaled by s_i / s (a
    power of two for FlashMLA's scales, exact unless values drop into e4m3's subnormal
    range). Rows whose 4 scales are equal round-trip bit for bit.
    """
    _check_raw(raw, "raw", V32_BYTES)
    s4 = v32_scales(raw)
    s = s4.amax(dim=-1, keepdim=True).clamp_min(SCALE_FLOOR)
    q = _view_bytes_as(raw[..., :V32_LATENT], FP8_DTYPE).float()
    q = q.unflatten(-1, (V32_NUM_TILES, V32_TILE)) * (s4 / s).unsqueeze(-1)
    q = q.flatten(-2).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE).view(torch.uint8)
    return torch.cat([q, raw[..., V32_ROPE_OFFSET:]], dim=-1), s


# FlashMLA MODEL1 -----------------------------------------------------------------------------
def pack_model1_tokens(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize tokens to MODEL1's per-token pieces.

    x: [N, 1, 512] float -> (data [N, 576] uint8: 448 e4m3 | 64 bf16 rope,
    scale_bytes [N, 8] uint8: 7 e8m0 tile scales (one per 64 latent values) | 0 pad).
    Where they go in a page: see the module docstring and `ops.store_kv.reference.store_rows`.
    """
    check_float_input(x, "x", MODEL1_D_QK)
    check(x.ndim == 3 and x.shape[1] == 1, "x", "a [N, 1, 512] tensor", tuple(x.shape))
    x = x[:, 0]
    q, s = _pow2_tile_scales(x[:, :MODEL1_LATENT], MODEL1_TILE)
    data = torch.cat([q.view(torch.uint8), _bytes_of(x[:, MODEL1_LATENT:].to(BF16))], dim=-1)
    n_pad = MODEL1_SCALE_BYTES - MODEL1_NUM_TILES
    pad = torch.zeros(x.shape[0], n_pad, dtype=torch.uint8, device=x.device)
    scale_bytes = torch.cat([s.view(torch.uint8), pad], dim=-1)
    return data, scale_bytes


def unpack_model1_tokens(
    data: torch.Tensor, scale_bytes: torch.Tensor, out_dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """Inverse of `pack_model1_tokens`: data [N, 576] uint8, scale_bytes [N, 8] uint8
    -> [N, 1, 512] in out_dtype. The pad byte is ignored."""
    _check_raw(data, "data", MODEL1_DATA_BYTES)
    _check_raw(scale_bytes, "scale_bytes", MODEL1_SCALE_BYTES)
    check(data.ndim == 2, "data", "a [N, 576] tensor", tuple(data.shape))
    check(
        tuple(scale_bytes.shape) == (data.shape[0], MODEL1_SCALE_BYTES),
        "scale_bytes",
        f"shape ({data.shape[0]}, {MODEL1_SCALE_BYTES})",
        tuple(scale_bytes.shape),
    )
    _check_out_dtype(out_dtype)
    q = _view_bytes_as(data[:, :MODEL1_LATENT], FP8_DTYPE).float()
    s = _view_bytes_as(scale_bytes[:, :MODEL1_NUM_TILES], E8M0_DTYPE).float()
    lat = (q.unflatten(-1, (MODEL1_NUM_TILES, MODEL1_TILE)) * s.unsqueeze(-1)).flatten(-2)
    rope = _view_bytes_as(data[:, MODEL1_LATENT:], BF16).float()
    return torch.cat([lat, rope], dim=-1).unsqueeze(1).to(out_dtype)
