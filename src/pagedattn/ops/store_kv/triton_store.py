"""Triton store_kv: write new ragged K/V tokens into their cache rows, fusing the FP8
quantization and its scale computation (same results as `store_kv_reference`).

One program per new token writes every head of K (and V): it finds its request from
`q_row_offsets` (no host sync), its position `cache_length + i`, and the physical row through the
operand's addressing (paged lookup table or row offsets). Formats:
- none: a plain copy (cast to the cache dtype);
- per-tensor: q = clamp(x / scale, +-448) with the operand's static float32 scale;
- blockwise G (per-token when G = head_dim): scale = amax(|block|) / 448, floored at 2^-126;
  float32 scales are stored as is, e8m0 scales are rounded up to a power of two (the exact
  ceil(log2), read off the float32 bits), then q = clamp(x / scale, +-448). NaN in a block makes
  its scale and values NaN, as in the reference.
- packed MLA formats (rope-aware, FlashMLA V32 / MODEL1): written by the reference writer for
  now (`reference.write_rows`).
Divisions are correctly rounded (`div_rn`) so results match the reference bit for bit.

Index values live on the device and are not checked on the host here: a token is skipped
(no byte of the cache or of its scales changes) by the rules of `reference.py`'s module
docstring, which the kernel applies as a predicate on its stores: a token outside every
request's q_row_offsets range, at a negative position, past the lookup table's reach, or on a
page id outside [0, num_pages) (non-paged: a row outside [0, num_kv_rows)).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...operands import RowOperand
from .._triton_interpreter import install_interpreter_shim
from ..mha.triton_tiles import row_request
from ..pdl import pdl_chain_kwargs, pdl_wait
from ..prepared import cached_launch
from ..specialize import STORE_INTS, request_block

install_interpreter_shim()


@triton.jit
def _quantize_store(
    x,
    Dst,
    dst_off,
    S,
    s_off,
    elem,
    m,
    keep,
    QUANT: tl.constexpr,
    E8M0: tl.constexpr,
):
    """x [HP, NGP, GP] f32 -> Dst (+ scales [HP, NGP] at S + s_off) for one token row;
    nothing is stored unless `keep` (a scalar) holds."""
    if QUANT == 0:
        tl.store(Dst + dst_off + elem, x.to(Dst.dtype.element_ty), mask=m & keep)
    elif QUANT == 1:
        s = tl.load(S)
        q = tl.clamp(tl.math.div_rn(x, s), -448.0, 448.0, propagate_nan=tl.PropagateNan.ALL)
        tl.store(Dst + dst_off + elem, q.to(tl.float8e4nv), mask=m & keep)
    else:
        nan = tl.max((x != x).to(tl.int32), 2) > 0
        amax = tl.max(tl.where(m, tl.abs(x), 0.0), 2)
        scale = tl.math.div_rn(amax, tl.full(amax.shape, 448.0, tl.float32))
        scale = tl.maximum(scale, 1.1754943508222875e-38)  # 2^-126
        scale = tl.where(nan, float("nan"), scale)
        if E8M0:
            bits = scale.to(tl.int32, bitcast=True)
            e = (bits >> 23) & 0xFF
            byte = tl.where(e == 255, 255, e + ((bits & 0x7FFFFF) != 0).to(tl.int32))
            byte = tl.minimum(byte, 255)
            scale = (byte << 23).to(tl.float32, bitcast=True)
            scale = tl.where(byte == 255, float("nan"), scale)
            stored = byte.to(tl.uint8)
        else:
            stored = scale
        q = tl.math.div_rn(x, scale[:, :, None])
        q = tl.clamp(q, -448.0, 448.0, propagate_nan=tl.PropagateNan.ALL)
        tl.store(Dst + dst_off + elem, q.to(tl.float8e4nv), mask=m & keep)
        sm = tl.max(m.to(tl.int32), 2) > 0
        tl.store(S + s_off, stored, mask=sm & keep)


@triton.jit
def token_position(q_offsets, cache_lens, batch, t, BLOCK_B: tl.constexpr):
    """(request b, absolute position cache_lens[b] + t - q_offsets[b], ok) of ragged token t;
    ok: t lies in a request and its position is >= 0 (a token outside every request is
    skipped by the stores). One token per request is the fast path (no search): `row_request`."""
    b, o_lo, o_hi = row_request(q_offsets, batch, t, BLOCK_B, True)
    ok = (o_lo <= t) & (t < o_hi)
    pos = tl.load(cache_lens + b, mask=ok, other=-1) + (t - o_lo)
    return b, pos, ok & (pos >= 0)


@triton.jit(do_not_specialize=("reach", "limit", "reach2", "limit2") + STORE_INTS)  # one binary
def _store_kv_kernel(
    X,
    stride_xt,
    stride_xh,
    Dst,
    stride_dr,
    stride_dh,
    Lut,
    stride_lut,
    RowOff,
    page_stride,
    S,
    stride_sr,
    stride_sh,
    reach,
    limit,
    X2,
    stride_x2t,
    stride_x2h,
    Dst2,
    stride_d2r,
    stride_d2h,
    Lut2,
    stride_lut2,
    RowOff2,
    page_stride2,
    S2,
    stride_s2r,
    stride_s2h,
    reach2,
    limit2,
    cache_lens,
    q_offsets,
    batch,
    H: tl.constexpr,
    HP: tl.constexpr,
    NG: tl.constexpr,
    NGP: tl.constexpr,
    G: tl.constexpr,
    GP: tl.constexpr,
    PAGE: tl.constexpr,
    PAGE2: tl.constexpr,
    QUANT: tl.constexpr,
    QUANT2: tl.constexpr,
    E8M0: tl.constexpr,
    E8M02: tl.constexpr,
    HAS_V: tl.constexpr,
    BLOCK_B: tl.constexpr,
    PDL: tl.constexpr = False,
):
    """Token t of X [total, H, NG * G] (and X2) -> its cache row(s); a token outside every
    request, at a negative position, past the table's reach (`reach`) or on a page id outside
    [0, limit) (non-paged: a row outside [0, limit)) is skipped (see reference.py)."""
    pdl_wait(PDL)
    t = tl.program_id(0)
    b, pos, ok = token_position(q_offsets, cache_lens, batch, t, BLOCK_B)

    offs_h = tl.arange(0, HP)[:, None, None]
    offs_g = tl.arange(0, NGP)[None, :, None]
    offs_e = tl.arange(0, GP)[None, None, :]
    m = (offs_h < H) & (offs_g < NG) & (offs_e < G)
    d = offs_g * G + offs_e
    t64 = t.to(tl.int64)
    sh = tl.arange(0, HP)[:, None]
    sg = tl.arange(0, NGP)[None, :]

    if PAGE > 0:
        ok1 = ok & (pos < reach)
        page = tl.load(Lut + b * stride_lut + pos // PAGE, mask=ok1, other=-1)
        ok1 = ok1 & (page >= 0) & (page < limit)
        row = page.to(tl.int64) * page_stride + pos % PAGE
    else:
        row = tl.load(RowOff + b, mask=ok, other=0).to(tl.int64) + pos
        ok1 = ok & (row >= 0) & (row < limit)
    x = tl.load(X + t64 * stride_xt + offs_h * stride_xh + d, mask=m, other=0.0).to(tl.float32)
    _quantize_store(
        x,
        Dst,
        row * stride_dr,
        S,
        row * stride_sr + sh * stride_sh + sg,
        offs_h * stride_dh + d,
        m,
        ok1,
        QUANT,
        E8M0,
    )
    if HAS_V:
        if PAGE2 > 0:
            ok2 = ok & (pos < reach2)
            page2 = tl.load(Lut2 + b * stride_lut2 + pos // PAGE2, mask=ok2, other=-1)
            ok2 = ok2 & (page2 >= 0) & (page2 < limit2)
            row2 = page2.to(tl.int64) * page_stride2 + pos % PAGE2
        else:
            row2 = tl.load(RowOff2 + b, mask=ok, other=0).to(tl.int64) + pos
            ok2 = ok & (row2 >= 0) & (row2 < limit2)
        x2 = tl.load(X2 + t64 * stride_x2t + offs_h * stride_x2h + d, mask=m, other=0.0)
        _quantize_store(
            x2.to(tl.float32),
            Dst2,
            row2 * stride_d2r,
            S2,
            row2 * stride_s2r + sh * stride_s2h + sg,
            offs_h * stride_d2h + d,
            m,
            ok2,
            QUANT2,
            E8M02,
        )


def _op_args(op: RowOperand, x: torch.Tensor) -> tuple[list, dict]:
    """Launch args and constexprs of one (new tokens, cache operand) pair."""
    r = op.rows
    if r.stride(2) != 1:
        raise ValueError("store_kv_triton: cache rows need a contiguous last dim")
    paged = op.page_size > 0
    f = op.quant_format
    quant = {None: 0, "per_tensor": 1, "blockwise": 2}[f]
    e8m0 = False
    scales, s_r, s_h = r, 0, 0
    if quant == 2:
        s = op.scales
        e8m0 = s.dtype == torch.float8_e8m0fnu
        scales = s.view(torch.uint8) if e8m0 else s
        s_r, s_h = s.stride(0), s.stride(1)
    elif quant == 1:
        scales = op.scales
    args = [
        x,
        x.stride(0),
        x.stride(1),
        r,
        r.stride(0),
        r.stride(1),
        op.lut if paged else op.cache_lengths,
        op.lut.stride(0) if paged else 0,
        op.row_offsets if not paged else op.cache_lengths,
        op.page_stride_rows if paged else 0,
        scales,
        s_r,
        s_h,
        op.lut.shape[1] * op.page_size if paged else 0,
        op.num_sparse_slots() // op.page_size if paged else op.num_kv_rows(),
    ]
    return args, dict(PAGE=op.page_size, QUANT=quant, E8M0=e8m0)


def store_kv_triton(
    k_new: torch.Tensor,
    v_new: torch.Tensor | None,
    k_cache: RowOperand,
    v_cache: RowOperand | None,
    q_row_offsets: torch.Tensor,
) -> None:
    """Write token i of request b at position cache_length(b) + i of each operand.

    k_new, v_new: [total_new_tokens, heads, head_dim] (v_new None for MLA); q_row_offsets:
    [batch + 1] int32 (device). No host sync and no value check: tokens whose target lies
    outside the operand are skipped (module docstring). `store_kv` validates the arguments.
    """
    packed = k_cache.quant_format not in (None, "per_tensor", "blockwise")
    if packed or (v_new is not None and v_cache.quant_format != k_cache.quant_format):
        # Packed MLA rows (and mixed formats) go through the reference writer.
        from .reference import store_kv_reference

        store_kv_reference(k_new, v_new, k_cache, v_cache, q_row_offsets)
        return
    total, H, D = k_new.shape
    if total == 0:
        return
    if k_new.stride(2) != 1:
        k_new = k_new.contiguous()
    if v_new is not None and v_new.stride(2) != 1:
        v_new = v_new.contiguous()
    batch = q_row_offsets.shape[0] - 1
    G = k_cache.quantization_granularity or D
    if k_cache.quant_format != "blockwise":
        G = D
    ng = D // G
    k_args, kcx = _op_args(k_cache, k_new)
    if v_new is not None:
        v_args, vcx = _op_args(v_cache, v_new)
    else:
        v_args, vcx = k_args, kcx
    cached_launch(
        _store_kv_kernel,
        (total,),
        *k_args,
        *v_args,
        k_cache.cache_lengths,
        q_row_offsets,
        batch,
        H=H,
        HP=triton.next_power_of_2(H),
        NG=ng,
        NGP=triton.next_power_of_2(ng),
        G=G,
        GP=triton.next_power_of_2(G),
        PAGE=kcx["PAGE"],
        PAGE2=vcx["PAGE"],
        QUANT=kcx["QUANT"],
        QUANT2=vcx["QUANT"],
        E8M0=kcx["E8M0"],
        E8M02=vcx["E8M0"],
        HAS_V=v_new is not None,
        BLOCK_B=request_block(batch),
        num_warps=4 if H * D >= 1024 else 2,
        **pdl_chain_kwargs(k_new),
    )


__all__ = ["store_kv_triton"]
