"""MLA decode in Triton: dense or sparse, BF16 or FP8 caches, extra cache, sinks, split-K.

Same contract as `pagedattn.ops.mla.mla_decode` (docs/ops.md). Five kernels:
  - `gluon_mla_ss._mla_decode_sm90_ss` (Gluon, Hopper only): BF16 and FlashMLA V32 caches with
    d_qk 576, paged, without an extra cache, 64-row tiles: warp-specialized "seesaw" (a
    producer warpgroup, two consumer warpgroups that own alternate key tiles and split O by
    columns). See that module.
  - `gluon_mla._mla_decode_sm90` (Gluon, Hopper only): the same for rope-aware caches (and
    BF16/V32 when the seesaw is turned off). 64-row tiles (padded for small h_q), S split by
    keys between two warpgroups, cp.async K ring. See that module.
  - `gluon_mla._mla_decode_sm90_t` (Gluon, Hopper only): the same caches (BF16 and
    rope-aware) when a tile has at most 16-32 query rows (small h_q): keys are the MMA's M
    dimension, so nothing is padded to 64 rows; FP8 runs float16 MMAs whose A operand (the
    dequantized tile) is built in registers from 16-byte shared-memory loads.
  - `gluon_mla_tw._mla_decode_sm90_tw` (Gluon, Hopper only): the rope-aware FP8 case of the
    previous kernel (up to 16 query rows), warp-specialized: a producer warpgroup and two
    consumer warpgroups that take alternate tiles, one CTA a SM. See that module.
  - `_mla_decode_kernel` (tl): every case, every GPU and Triton's CPU interpreter (CI); one
    kernel specialised at compile time on format, mode and tile shape.

Work decomposition
  - A tile is BM query rows of one request: rows are (query token, head) pairs, token-major.
    With h_q < BM several tokens of one request share a tile (dense mode only: sparse tokens
    have their own indices), so K is read once for all of them. With h_q > BM the heads are
    split in blocks of BM; the tiles of one token sit next to each other in the grid so their
    shared K tiles meet in L2. Heads are padded inside the kernel; callers pad nothing.
  - grid = (tokens * head_blocks, num_partitions). The request of a token is found in-kernel
    from `q_row_offsets`; a program whose token does not lead a tile exits at once.
  - Split-K: partition p of a request covers the contiguous keys [p*chunk, (p+1)*chunk) of
    (main keys ++ extra keys), chunk rounded to BN. Partials (f32) are merged by
    `triton_mla_combine`, which also folds the sink into the global LSE. With one partition the
    kernel writes the output and applies the sink itself.
  - Every K tile is loaded once and used twice: S = Q K^T over d_qk and O += P V with V the
    first 512 dims of the same tile (shared memory for the tensor cores).

FP8 caches are dequantized in the kernel; the query stays BF16:
  - one scale per token (rope-aware, blockwise with G = d_qk, per-tensor): e4m3 -> bf16 is
    exact, so the scale is folded into S's columns and into P's columns instead of K;
  - several scales per token (FlashMLA V32: 4 x 128, MODEL1: 7 x 64 e8m0, blockwise G | 512):
    the tile is viewed as [BN, chunks, chunk_width] and scaled per chunk in f32, then rounded to
    bf16 once;
  - any other G: per-element scale gather (slow path).

Invalid keys (past a length, masked by causality, invalid sparse indices, sentinel pages) are
loaded from clamped in-bounds addresses with masked loads (value 0), and their scores are set to
-inf with `tl.where`, so NaN in unreferenced cache slots never reaches the output.

Loads are software-pipelined by hand (lookup-table / index loads two tiles ahead, K one tile
ahead): Triton's own pipeliner serialises this loop (see `_attend`).
"""

from __future__ import annotations

import math
from typing import Any

import torch
import triton
import triton.language as tl

from ...cache.dispatch import cuda_capability, fast_hbm, mla_num_partitions, mla_tile, num_sms
from ...errors import Lazy, check
from ..launch import launch
from ..pdl import pdl_enabled, pdl_signal
from .sm90.gluon_mla import _HAS_GLUON, TILE_TRACE_SLOTS, _mla_decode_sm90, _mla_decode_sm90_t
from .sm90.gluon_mla_ps import _mla_decode_sm90_ps
from .sm90.gluon_mla_ss import _mla_decode_sm90_ss
from .sm90.gluon_mla_st import _mla_decode_sm90_st, _st_descriptors
from .sm90.gluon_mla_tw import _mla_decode_sm90_tw
from .triton_mla_combine import LN2, LOG2E, mla_combine_triton

# Cache formats (compile-time).
FMT_BF16, FMT_BLOCKWISE, FMT_PER_TENSOR, FMT_ROPE_AWARE, FMT_V32, FMT_MODEL1 = range(6)
# How the first 512 dims of a K tile (also V) are built.
A_PLAIN, A_FOLD, A_CHUNK, A_GATHER = range(4)

_FORMATS = {
    None: FMT_BF16,
    "blockwise": FMT_BLOCKWISE,
    "per_tensor": FMT_PER_TENSOR,
    "mla_rope_aware": FMT_ROPE_AWARE,
    "flashmla_v32": FMT_V32,
    "flashmla_model1": FMT_MODEL1,
}
V32_ROW, MODEL1_DATA, MODEL1_ROW = 656, 576, 584


from .._triton_interpreter import install_interpreter_shim  # noqa: E402

install_interpreter_shim()


# ------------------------------------------------------------------------------------------
# Device helpers
# ------------------------------------------------------------------------------------------
@triton.jit
def _e8m0_to_f32(e):
    """uint8 e8m0 -> float32 2^(e-127); 0xFF is NaN."""
    ei = e.to(tl.int32)
    f = (ei << 23).to(tl.float32, bitcast=True)
    f = tl.where(ei == 0, 5.877471754111438e-39, f)
    return tl.where(ei == 255, float("nan"), f)


@triton.jit
def _load_scale(sc, off, mask, E8M0: tl.constexpr):
    """Scales at `sc + off` (f32, or e8m0 bytes when E8M0) as float32; masked lanes give 0."""
    if E8M0:
        return tl.where(mask, _e8m0_to_f32(tl.load(sc + off, mask=mask, other=127)), 0.0)
    else:
        return tl.load(sc + off, mask=mask, other=0.0)


@triton.jit
def _tile_keys(start, hi, b, tok, lut, idx, lut_stride, page_size, idx_stride,
               PAGED: tl.constexpr, SPARSE: tl.constexpr, BN: tl.constexpr):  # fmt: skip
    """The one global load of a tile's addressing: per key position in [start, start + BN),
    its encoded sparse index (sparse), lookup-table page id (dense, paged) or position."""
    pos = start + tl.arange(0, BN)
    inb = pos < hi
    if SPARSE:
        key = tl.load(idx + tok * idx_stride + pos, mask=inb, other=-1)
    elif PAGED:
        # Masked per page, not per position (same in-bounds columns: a page is read iff it
        # starts before `hi`), so the key is visibly constant over each page. With a
        # per-position mask Triton 3.6's axis analysis loses that, and for page sizes that
        # are multiples of 16 it then takes every row `blk * psr + pos % page_size` for a
        # multiple of 16: the scale loads `sc + rows * sc_stride + c` became 8-byte vectors,
        # misaligned when sc_stride * scale bytes is not (blockwise G=64, d_qk 576: 9 scales).
        pg = pos // page_size
        key = tl.load(lut + b * lut_stride + pg, mask=pg * page_size < hi, other=0)
    else:
        key = pos
    return key


@triton.jit
def _tile_rows(start, hi, key, row_base, page_size, psr, n_enc, n_pages,
               PAGED: tl.constexpr, SPARSE: tl.constexpr, BN: tl.constexpr):  # fmt: skip
    """Keys of a tile -> (pos, valid, rows, blk, off); no memory access.

    rows: [BN] int64 physical rows, clamped in bounds for invalid keys; blk/off: page id and
    offset in the page (paged operands). Sparse: an entry is valid iff pos < hi and
    0 <= encoded < n_enc; dense: pos < hi (lookup-table ids are clamped to real pages).
    """
    pos = start + tl.arange(0, BN)
    inb = pos < hi
    if SPARSE:
        valid = inb & (key >= 0) & (key < n_enc)
        enc = tl.where(valid, key, 0)
        if PAGED:
            blk = enc // page_size
            off = enc % page_size
            rows = blk.to(tl.int64) * psr + off
        else:
            blk = enc
            off = enc
            rows = enc.to(tl.int64)
    else:
        valid = inb
        if PAGED:
            blk = tl.minimum(tl.maximum(key, 0), n_pages - 1)
            off = pos % page_size
            rows = blk.to(tl.int64) * psr + off
        else:
            blk = pos
            off = pos
            rows = row_base + tl.where(valid, pos, 0).to(tl.int64)
    return pos, valid, rows, blk, off


@triton.jit
def _load_raw(
    kv,
    sc,
    rows,
    blk,
    off,
    valid,
    stride,
    stride_h,
    stride_q,
    sc_stride,
    page_size,
    psb,
    psb_h,
    FMT: tl.constexpr,
    AMODE: tl.constexpr,
    NC: tl.constexpr,
    CW: tl.constexpr,
    G: tl.constexpr,
    E8M0: tl.constexpr,
    D_QK: tl.constexpr,
    BN: tl.constexpr,
    ALIGN: tl.constexpr,
):
    """Issue the loads of one K tile; returns its raw pieces (xa, sa, xt, st, xr):

    xa [BN, NC, CW] dims 0..511 in storage dtype (NC * CW = 512); sa their float32 scales
    ([BN, NC]; [BN, 512] per element in A_GATHER mode; ones for bf16); xt [BN, 64] dims
    512..575 (D_QK == 576) in storage dtype, st their per-element scales ([BN, 64], blockwise
    only); xr [BN, 64] bf16 rope placed in the last chunk (rope-aware d_qk 512, MODEL1).
    Invalid rows load as 0 (masked loads at clamped addresses). ALIGN: every row starts on a
    16-byte boundary (checked by the host), which lets the loads use 16-byte vectors.
    """
    c = tl.arange(0, NC)
    j = tl.arange(0, CW)
    dT = tl.arange(0, 64)
    vm = valid[:, None]
    v3 = valid[:, None, None]
    sa = tl.full([BN, NC], 1.0, tl.float32)
    st = tl.full([BN, 1], 1.0, tl.float32)
    xt = tl.zeros([BN, 64], tl.bfloat16)
    xr = tl.zeros([BN, 64], tl.bfloat16)
    cj = (c[:, None] * CW + j[None, :])[None, :, :]
    base = rows * stride
    rh = rows * stride_h
    rq = rows * stride_q
    if ALIGN:
        base = tl.multiple_of(base, 16 // kv.dtype.element_ty.primitive_bitwidth * 8)
        rh = tl.multiple_of(rh, 8)
        rq = tl.multiple_of(rq, 4)
    if FMT == 0:  # plain 16-bit rows of D_QK elements
        xa = tl.load(kv + base[:, None, None] + cj, mask=v3, other=0.0)
        if D_QK == 576:
            xt = tl.load(kv + base[:, None] + 512 + dT[None, :], mask=vm, other=0.0)
    elif FMT == 1 or FMT == 2:  # e4m3 rows of D_QK elements + scale buffer / one scale
        xa = tl.load(kv + base[:, None, None] + cj, mask=v3, other=0.0)
        if D_QK == 576:
            xt = tl.load(kv + base[:, None] + 512 + dT[None, :], mask=vm, other=0.0)
        if FMT == 2:
            sa = tl.zeros([BN, 1], tl.float32) + tl.load(sc)
        elif AMODE == 1:
            sa = _load_scale(sc, (rows * sc_stride)[:, None], vm, E8M0)
        elif AMODE == 2:
            sa = _load_scale(sc, rows[:, None] * sc_stride + c[None, :], vm, E8M0)
        else:
            dA = tl.arange(0, 512)
            sa = _load_scale(sc, rows[:, None] * sc_stride + (dA // G)[None, :], vm, E8M0)
        if D_QK == 576 and AMODE != 1 and FMT == 1:
            st = _load_scale(sc, rows[:, None] * sc_stride + ((512 + dT) // G)[None, :], vm, E8M0)
    elif FMT == 3:  # rope-aware: (D_QK-64) e4m3 + 64 bf16, one f32 scale per token
        kv8 = kv.to(tl.pointer_type(tl.float8e4nv))
        kv16 = kv.to(tl.pointer_type(tl.bfloat16))
        sa = tl.load(sc + (rows * sc_stride)[:, None], mask=vm, other=0.0)
        if D_QK == 576:
            xa = tl.load(kv8 + base[:, None, None] + cj, mask=v3, other=0.0)
            xt = tl.load(kv16 + (rh + 256)[:, None] + dT[None, :], mask=vm, other=0.0)
        else:  # 448 e4m3 in chunks 0..6 of 64, the rope is chunk 7
            lat = (c < NC - 1)[None, :, None]
            xa = tl.load(kv8 + base[:, None, None] + cj, mask=v3 & lat, other=0.0)
            xr = tl.load(kv16 + (rh + 224)[:, None] + j[None, :], mask=vm, other=0.0)
    elif FMT == 4:  # FlashMLA V32: 512 e4m3 | 4 f32 scales (one per 128) | 64 bf16
        kv8 = kv.to(tl.pointer_type(tl.float8e4nv))
        kv16 = kv.to(tl.pointer_type(tl.bfloat16))
        kv32 = kv.to(tl.pointer_type(tl.float32))
        xa = tl.load(kv8 + base[:, None, None] + cj, mask=v3, other=0.0)
        sa = tl.load(kv32 + (rq + 128)[:, None] + c[None, :], mask=vm, other=0.0)
        xt = tl.load(kv16 + (rh + 264)[:, None] + dT[None, :], mask=vm, other=0.0)
    else:  # FlashMLA MODEL1 page: per token 448 e4m3 | 64 bf16; trailer of 8 B (7 e8m0) a token
        kv8 = kv.to(tl.pointer_type(tl.float8e4nv))
        kv16 = kv.to(tl.pointer_type(tl.bfloat16))
        kvu = kv.to(tl.pointer_type(tl.uint8))
        b64 = blk.to(tl.int64)
        o64 = off.to(tl.int64)
        data = b64 * psb + o64 * 576
        dh = b64 * psb_h + o64 * 288
        if ALIGN:
            data = tl.multiple_of(data, 16)
            dh = tl.multiple_of(dh, 8)
        lat = (c < NC - 1)[None, :]
        xa = tl.load(kv8 + data[:, None, None] + cj, mask=v3 & lat[:, :, None], other=0.0)
        soff = (b64 * psb + page_size * 576 + o64 * 8)[:, None] + c[None, :]
        sa = _e8m0_to_f32(tl.load(kvu + soff, mask=vm & lat, other=127))
        xr = tl.load(kv16 + (dh + 224)[:, None] + j[None, :], mask=vm, other=0.0)
    return xa, sa, xt, st, xr


@triton.jit
def _finish(
    xa,
    sa,
    xt,
    st,
    xr,
    FMT: tl.constexpr,
    AMODE: tl.constexpr,
    NC: tl.constexpr,
    D_QK: tl.constexpr,
    BN: tl.constexpr,
    DT: tl.constexpr,
):
    """Raw tile pieces -> (k_a [BN, 512] DT (also V), k_t [BN, 64] DT, s_tok [BN] f32).

    A_FOLD leaves the per-token scale out of K (s_tok is applied to S and P instead); the
    other FP8 modes scale in float32 and round to DT once."""
    s_tok = tl.full([BN], 1.0, tl.float32)
    k_t = xt.to(DT)
    if AMODE == 0:
        k_a = tl.reshape(xa, [BN, 512]).to(DT)
    elif AMODE == 1:
        k_a = tl.reshape(xa, [BN, 512]).to(DT)
        s_tok = tl.reshape(sa, [BN])
    elif AMODE == 2:
        x = xa.to(tl.float32) * sa[:, :, None]
        if FMT == 5 or (FMT == 3 and D_QK == 512):
            c = tl.arange(0, NC)
            x = tl.where((c == NC - 1)[None, :, None], xr.to(tl.float32)[:, None, :], x)
        k_a = tl.reshape(x.to(DT), [BN, 512])
    else:
        k_a = (tl.reshape(xa, [BN, 512]).to(tl.float32) * sa).to(DT)
    if D_QK == 576 and FMT == 1 and AMODE != 1:
        k_t = (xt.to(tl.float32) * st).to(DT)
    return k_a, k_t, s_tok


@triton.jit
def _update(
    acc,
    m_i,
    l_i,
    q_a,
    q_t,
    k_a,
    k_t,
    s_tok,
    pos,
    valid,
    row_lim,
    qk_scale,
    AMODE: tl.constexpr,
    FOLD_T: tl.constexpr,
    CAUSAL: tl.constexpr,
    D_QK: tl.constexpr,
):
    """One online-softmax step over a K tile (scores in log2 units)."""
    s = tl.dot(q_a, tl.trans(k_a))
    if AMODE == 1:
        if D_QK == 576:
            if FOLD_T:
                s = (s + tl.dot(q_t, tl.trans(k_t))) * s_tok[None, :]
            else:
                s = s * s_tok[None, :] + tl.dot(q_t, tl.trans(k_t))
        else:
            s = s * s_tok[None, :]
    elif D_QK == 576:
        s = s + tl.dot(q_t, tl.trans(k_t))
    keep = valid[None, :]
    if CAUSAL:
        keep = keep & (pos[None, :] < row_lim[:, None])
    s = tl.where(keep, s * qk_scale, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m_i - m_use)
    p = tl.exp2(s - m_use[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None]
    if AMODE == 1:
        p = p * s_tok[None, :]
    acc = tl.dot(p.to(k_a.dtype), k_a, acc)
    return acc, m_new, l_i


@triton.jit
def _attend(
    acc,
    m_i,
    l_i,
    q_a,
    q_t,
    lo,
    hi,
    row_lim,
    qk_scale,
    b,
    tok,
    kv,
    sc,
    lut,
    idx,
    row_base,
    stride,
    stride_h,
    stride_q,
    sc_stride,
    lut_stride,
    page_size,
    psr,
    psb,
    psb_h,
    n_enc,
    n_pages,
    idx_stride,
    FMT: tl.constexpr,
    AMODE: tl.constexpr,
    FOLD_T: tl.constexpr,
    NC: tl.constexpr,
    CW: tl.constexpr,
    G: tl.constexpr,
    E8M0: tl.constexpr,
    PAGED: tl.constexpr,
    SPARSE: tl.constexpr,
    CAUSAL: tl.constexpr,
    D_QK: tl.constexpr,
    BN: tl.constexpr,
    NUM_STAGES: tl.constexpr,
    PREFETCH: tl.constexpr,
    ALIGN: tl.constexpr,
):
    """Online softmax over key positions [lo, hi) of one operand; returns (acc, m, l).

    PREFETCH=True (default): a hand-made software pipeline in registers. Triton's own
    pipeliner (PREFETCH=False) serialises this loop: the K addresses come from a lookup-table
    or index load, its cp.async wait covers every outstanding copy (wait_group 0) and the next
    copies are issued after the dots, so no load overlaps compute; it also stages no FP8 tile
    (those are converted before the dot).
    row_lim [BM]: causal key limit of each row (dense + CAUSAL only).
    """
    DT = q_a.dtype
    if PREFETCH:
        # Software pipeline by hand: keys (the lookup-table / index load) two tiles ahead,
        # K tile data one tile ahead, both in registers, so neither latency is exposed.
        key = _tile_keys(lo, hi, b, tok, lut, idx, lut_stride, page_size, idx_stride,
                         PAGED, SPARSE, BN)  # fmt: skip
        key_n = _tile_keys(lo + BN, hi, b, tok, lut, idx, lut_stride, page_size, idx_stride,
                           PAGED, SPARSE, BN)  # fmt: skip
        pos, valid, rows, blk, off = _tile_rows(
            lo, hi, key, row_base, page_size, psr, n_enc, n_pages, PAGED, SPARSE, BN
        )
        xa, sa, xt, st, xr = _load_raw(
            kv, sc, rows, blk, off, valid, stride, stride_h, stride_q, sc_stride, page_size,
            psb, psb_h, FMT, AMODE, NC, CW, G, E8M0, D_QK, BN, ALIGN,
        )  # fmt: skip
        for start in tl.range(lo, hi, BN, num_stages=1):
            key_nn = _tile_keys(start + 2 * BN, hi, b, tok, lut, idx, lut_stride, page_size,
                                idx_stride, PAGED, SPARSE, BN)  # fmt: skip
            pos_n, valid_n, rows_n, blk_n, off_n = _tile_rows(
                start + BN, hi, key_n, row_base, page_size, psr, n_enc, n_pages, PAGED,
                SPARSE, BN,
            )  # fmt: skip
            xa_n, sa_n, xt_n, st_n, xr_n = _load_raw(
                kv, sc, rows_n, blk_n, off_n, valid_n, stride, stride_h, stride_q, sc_stride,
                page_size, psb, psb_h, FMT, AMODE, NC, CW, G, E8M0, D_QK, BN, ALIGN,
            )  # fmt: skip
            k_a, k_t, s_tok = _finish(xa, sa, xt, st, xr, FMT, AMODE, NC, D_QK, BN, DT)
            acc, m_i, l_i = _update(
                acc, m_i, l_i, q_a, q_t, k_a, k_t, s_tok, pos, valid, row_lim, qk_scale,
                AMODE, FOLD_T, CAUSAL, D_QK,
            )  # fmt: skip
            pos, valid, xa, sa, xt, st, xr = pos_n, valid_n, xa_n, sa_n, xt_n, st_n, xr_n
            key_n = key_nn
    else:
        for start in tl.range(lo, hi, BN, num_stages=NUM_STAGES):
            key = _tile_keys(start, hi, b, tok, lut, idx, lut_stride, page_size, idx_stride,
                             PAGED, SPARSE, BN)  # fmt: skip
            pos, valid, rows, blk, off = _tile_rows(
                start, hi, key, row_base, page_size, psr, n_enc, n_pages, PAGED, SPARSE, BN
            )
            xa, sa, xt, st, xr = _load_raw(
                kv, sc, rows, blk, off, valid, stride, stride_h, stride_q, sc_stride,
                page_size, psb, psb_h, FMT, AMODE, NC, CW, G, E8M0, D_QK, BN, ALIGN,
            )  # fmt: skip
            k_a, k_t, s_tok = _finish(xa, sa, xt, st, xr, FMT, AMODE, NC, D_QK, BN, DT)
            acc, m_i, l_i = _update(
                acc, m_i, l_i, q_a, q_t, k_a, k_t, s_tok, pos, valid, row_lim, qk_scale,
                AMODE, FOLD_T, CAUSAL, D_QK,
            )  # fmt: skip
    return acc, m_i, l_i


@triton.jit
def _mla_decode_kernel(
    Q,
    stride_qt,
    stride_qh,
    QOFF,
    batch,
    n_tokens,
    OUT,
    stride_ot,
    stride_oh,
    LSE,
    PO,
    PL,
    SINK,
    qk_scale,
    NUM_P,
    # main operand
    K,
    K_SC,
    K_LUT,
    K_ROFF,
    K_CL,
    K_IDX,
    K_TOPK,
    K_stride,
    K_stride_h,
    K_stride_q,
    K_sc_stride,
    K_lut_stride,
    K_ps,
    K_psr,
    K_psb,
    K_psb_h,
    K_nenc,
    K_npages,
    K_idx_stride,
    K_idx_len,
    # extra operand (sparse only)
    X,
    X_SC,
    X_IDX,
    X_TOPK,
    X_stride,
    X_stride_h,
    X_stride_q,
    X_sc_stride,
    X_ps,
    X_psr,
    X_psb,
    X_psb_h,
    X_nenc,
    X_idx_stride,
    X_idx_len,
    # compile-time
    H_Q: tl.constexpr,
    D_QK: tl.constexpr,
    D_V: tl.constexpr,
    BM: tl.constexpr,
    BN: tl.constexpr,
    HPT: tl.constexpr,
    TPT: tl.constexpr,
    NHB: tl.constexpr,
    B_P2: tl.constexpr,
    SPLIT: tl.constexpr,
    CAUSAL: tl.constexpr,
    HAS_SINK: tl.constexpr,
    K_FMT: tl.constexpr,
    K_AMODE: tl.constexpr,
    K_FOLD_T: tl.constexpr,
    K_NC: tl.constexpr,
    K_CW: tl.constexpr,
    K_G: tl.constexpr,
    K_E8M0: tl.constexpr,
    K_PAGED: tl.constexpr,
    K_SPARSE: tl.constexpr,
    K_HAS_TOPK: tl.constexpr,
    K_TOPK_TOK: tl.constexpr,
    HAS_X: tl.constexpr,
    X_FMT: tl.constexpr,
    X_AMODE: tl.constexpr,
    X_FOLD_T: tl.constexpr,
    X_NC: tl.constexpr,
    X_CW: tl.constexpr,
    X_G: tl.constexpr,
    X_E8M0: tl.constexpr,
    X_PAGED: tl.constexpr,
    X_HAS_TOPK: tl.constexpr,
    X_TOPK_TOK: tl.constexpr,
    NUM_STAGES: tl.constexpr,
    K_PREFETCH: tl.constexpr,
    X_PREFETCH: tl.constexpr,
    K_ALIGN: tl.constexpr,
    X_ALIGN: tl.constexpr,
    PDL: tl.constexpr = False,
):
    """One (tile, partition): BM (token, head) rows of one request over one key partition."""
    pdl_signal(PDL)  # the combine may launch (it waits for this grid before reading)
    pid = tl.program_id(0)
    part = tl.program_id(1)
    t = pid // NHB
    hb = pid % NHB

    # Request of token t: the last b with q_row_offsets[b] <= t (b == batch: orphan token).
    ob = tl.arange(0, B_P2)
    offs = tl.load(QOFF + ob, mask=ob <= batch, other=2147483647)
    b = tl.sum((offs <= t).to(tl.int32), 0) - 1
    live = b < batch
    # offsets are non-decreasing: offs[b] and offs[b + 1] come from the same load
    q_start = tl.max(tl.where(offs <= t, offs, -1), 0)
    q_end = tl.min(tl.where(offs > t, offs, 2147483647), 0)
    q_start = tl.where(live, q_start, t)
    q_end = tl.where(live, q_end, t + 1)
    i0 = t - q_start
    leader = (i0 % TPT) == 0  # a non-leading token's rows belong to an earlier tile
    q_len = tl.where(leader, q_end - q_start, 0)

    # Rows of this tile.
    r = tl.arange(0, BM)
    tq = r // HPT
    head = hb * HPT + r % HPT
    tok = t + tq
    row_ok = (tq < TPT) & (i0 + tq < q_len) & (head < H_Q)
    tok_c = tl.where(row_ok, tok, t).to(tl.int64)
    head_c = tl.where(row_ok, head, 0).to(tl.int64)
    qp = Q + tok_c * stride_qt + head_c * stride_qh
    dA = tl.arange(0, 512)
    dT = tl.arange(0, 64)
    q_a = tl.load(qp[:, None] + dA[None, :], mask=row_ok[:, None], other=0.0)
    if D_QK == 576:
        q_t = tl.load(qp[:, None] + 512 + dT[None, :], mask=row_ok[:, None], other=0.0)
    else:
        q_t = tl.zeros([BM, 64], Q.dtype.element_ty)

    # Keys of the main operand (positions) and of the extra operand.
    cache_len = tl.load(K_CL + b, mask=live, other=0)
    if K_SPARSE:
        n_main = K_idx_len
        if K_HAS_TOPK:
            if K_TOPK_TOK:
                n_main = tl.load(K_TOPK + t)
            else:
                n_main = tl.load(K_TOPK + b, mask=live, other=0)
            n_main = tl.minimum(tl.maximum(n_main, 0), K_idx_len)
        row_lim = tl.zeros([BM], tl.int32)
        main_lim = n_main
    else:
        n_main = cache_len + q_len
        if CAUSAL:
            row_lim = tl.where(row_ok, cache_len + i0 + tq + 1, 0)
            main_lim = tl.minimum(cache_len + i0 + TPT, n_main)
        else:
            row_lim = tl.zeros([BM], tl.int32) + n_main
            main_lim = n_main
    n_main = tl.where(live, n_main, 0)
    main_lim = tl.where(live & leader, main_lim, 0)
    n_x = 0
    if HAS_X:
        n_x = X_idx_len
        if X_HAS_TOPK:
            if X_TOPK_TOK:
                n_x = tl.load(X_TOPK + t)
            else:
                n_x = tl.load(X_TOPK + b, mask=live, other=0)
            n_x = tl.minimum(tl.maximum(n_x, 0), X_idx_len)
        n_x = tl.where(live & leader, n_x, 0)
    total = n_main + n_x
    chunk = tl.cdiv(tl.cdiv(total, NUM_P), BN) * BN
    lo = part * chunk
    hi = tl.minimum(lo + chunk, total)

    acc = tl.zeros([BM, 512], tl.float32)
    m_i = tl.full([BM], float("-inf"), tl.float32)
    l_i = tl.zeros([BM], tl.float32)
    row_base = tl.load(K_ROFF + b, mask=live, other=0).to(tl.int64)
    if K_PAGED:
        row_base = 0
    acc, m_i, l_i = _attend(
        acc, m_i, l_i, q_a, q_t, lo, tl.minimum(hi, main_lim), row_lim, qk_scale, b, t,
        K, K_SC, K_LUT, K_IDX, row_base, K_stride, K_stride_h, K_stride_q, K_sc_stride,
        K_lut_stride, K_ps, K_psr, K_psb, K_psb_h, K_nenc, K_npages, K_idx_stride,
        K_FMT, K_AMODE, K_FOLD_T, K_NC, K_CW, K_G, K_E8M0, K_PAGED, K_SPARSE,
        CAUSAL and not K_SPARSE, D_QK, BN, NUM_STAGES, K_PREFETCH, K_ALIGN,
    )  # fmt: skip
    if HAS_X:
        x_lo = tl.maximum(lo - n_main, 0)
        x_hi = tl.maximum(hi - n_main, 0)
        acc, m_i, l_i = _attend(
            acc, m_i, l_i, q_a, q_t, x_lo, x_hi, row_lim, qk_scale, b, t,
            X, X_SC, X, X_IDX, 0, X_stride, X_stride_h, X_stride_q, X_sc_stride,
            0, X_ps, X_psr, X_psb, X_psb_h, X_nenc, 1, X_idx_stride,
            X_FMT, X_AMODE, X_FOLD_T, X_NC, X_CW, X_G, X_E8M0, X_PAGED, True,
            False, D_QK, BN, NUM_STAGES, X_PREFETCH, X_ALIGN,
        )  # fmt: skip

    # Epilogue.
    seen = l_i > 0.0
    l_safe = tl.where(seen, l_i, 1.0)
    lse = tl.where(seen, (m_i + tl.log2(l_safe)) * LN2, float("-inf"))
    dmask = dA < D_V
    smask = row_ok[:, None] & dmask[None, :]
    if not SPLIT:
        inv = tl.where(seen, 1.0 / l_safe, 0.0)
        if HAS_SINK:
            sink = tl.load(SINK + head_c, mask=row_ok, other=0.0)
            m_use = tl.where(seen, m_i, 0.0)
            inv = tl.where(seen, 1.0 / (l_safe + tl.exp2(sink * LOG2E - m_use)), 0.0)
        o = acc * inv[:, None]
        optr = OUT + tok_c[:, None] * stride_ot + head_c[:, None] * stride_oh + dA[None, :]
        tl.store(optr, o.to(OUT.dtype.element_ty), mask=smask)
        tl.store(LSE + tok_c * H_Q + head_c, lse, mask=row_ok)
    else:
        inv = tl.where(seen, 1.0 / l_safe, 0.0)
        o = acc * inv[:, None]
        prow = (part * n_tokens + tok_c) * H_Q + head_c
        tl.store(PO + prow[:, None] * D_V + dA[None, :], o, mask=smask)
        tl.store(PL + prow, lse, mask=row_ok)


# ------------------------------------------------------------------------------------------
# Host side
# ------------------------------------------------------------------------------------------
# Launch configuration knobs. `bench/gpu_mla_dev.py` overrides them to time variants (and sets
# "trace" to an int64 buffer for `--trace`); None means the heuristic in `_tile_config`.
TUNING: dict[str, Any] = {
    "BN": None, "num_stages": None, "num_warps": None, "BM": None, "prefetch": None,
    "gluon": None, "sm90_bn": None, "sm90_nbuf": None, "sm90_t": None, "sm90_t_nbuf": None,
    "sm90_pipe": None, "sm90_ss": None, "ss_regs": None, "ss_order": None, "ss_half": None,
    "trace": None, "sm90_tw": None, "tw_nbuf": None, "tw_regs": None, "tw_psc": None,
    "tw_addr": None, "tw_fold": None, "tw_spec": None, "t_pf": None, "t_kswz": None,
    "tw_pre": None, "ss_tma": None, "st_regs": None, "ss_cross": None,
    "ss_persist": None, "ps_epi": None, "ss_splitcp": None, "ps_g": None,
    "ps_order": None, "ss_deq1": None, "ps_const": None, "ss_addr": None, "ss_qasync": None,
}  # fmt: skip


def _tuned(key: str, default: Any) -> Any:
    """TUNING[key] where set (development sweeps), else the shipped default."""
    v = TUNING.get(key)
    return default if v is None else v


def _ss_qasync(cfg: dict, h_q: int, default: bool) -> bool:
    """Whether the seesaw kernel cp.asyncs q (`gluon_mla_ss` SS_QASYNC; TUNING["ss_qasync"],
    else `default`): one token a tile and whole 64-head blocks (h_q 64 or 128) only. The
    default is the sparse V32 cluster kernel: H200 (2026-11-28, `bench/gpu_mla_dev.py`, b 128
    s_q 2 h_q 128 top-k 2048, two leases of two passes) graph replays 0.414-0.415 ms against
    0.416-0.418, the suite's cold-L2 call 0.4168-0.4196 against 0.4186-0.4195; dense V32 h_q
    128 s_k 8192 0.782-0.787 against 0.776-0.780 (slower), sparse bf16 within the passes'
    spread (record `bench/results/h200_2026-11-28_mla_v32_prologue.json`)."""
    eligible = cfg["TPT"] == 1 and cfg["HPT"] == 64 and h_q == 64 * cfg["NHB"]
    return eligible and bool(_tuned("ss_qasync", default))


def _page_size_constexpr(ps: int, key: str = "ps_const") -> int:
    """The page size as a compile-time constant of a producer's tile loop (PS_C), or 0 (a
    run-time value): powers of two, which then split an index into page and offset with a
    shift and a mask instead of a run-time integer division (a reciprocal and ~15
    instructions a row, on the producer's path to its next tile's loads: 57 of the V32
    cluster producer's 770 sm_90 instructions a tile, 97 of `gluon_mla_tw`'s 330).
    TUNING[key] False: always 0."""
    return ps if _tuned(key, True) and ps & (ps - 1) == 0 else 0


class _Operand:
    """Kernel arguments of one MLA operand (main or extra)."""

    def __init__(self, op, d_qk: int, q_dtype: torch.dtype, name: str) -> None:
        check(hasattr(op, "kernel_args"), name, "an MHAOperand with kernel_args()", type(op))
        a = op.kernel_args()
        rows = a.rows
        check(
            rows.ndim == 3 and rows.shape[1] == 1,
            f"{name}.rows",
            "[rows, 1, row_elems]",
            rows.shape,
        )
        self.fmt = _FORMATS.get(a.quant_format, -1)
        check(
            self.fmt >= 0,
            f"{name}.quant_format",
            Lazy(lambda: f"one of {list(_FORMATS)}"),
            a.quant_format,
        )
        head_dim = getattr(op, "head_dim", d_qk)
        check(head_dim == d_qk, f"{name}.head_dim", f"{d_qk} (q's last dim)", head_dim)
        self.data = rows
        self.stride = rows.stride(0)
        self.sc = a.scales
        self.sc_stride = 0
        self.e8m0 = False
        self.amode, self.fold_t, self.nc, self.cw, self.g = A_PLAIN, False, 1, 512, 1
        fmt = self.fmt
        expect = {
            FMT_BF16: (q_dtype, d_qk),
            FMT_BLOCKWISE: (torch.float8_e4m3fn, d_qk),
            FMT_PER_TENSOR: (torch.float8_e4m3fn, d_qk),
            FMT_ROPE_AWARE: (torch.uint8, d_qk - 64 + 128),
            FMT_V32: (torch.uint8, V32_ROW),
            FMT_MODEL1: (torch.uint8, MODEL1_ROW),
        }[fmt]
        check(
            rows.dtype == expect[0] and rows.shape[2] == expect[1] and rows.stride(2) == 1,
            f"{name}.rows",
            Lazy(
                lambda: (
                    f"{expect[0]} rows of {expect[1]} contiguous elements for format "
                    f"{a.quant_format!r}"
                )
            ),
            Lazy(lambda: f"{rows.dtype} {tuple(rows.shape)} strides {rows.stride()}"),
        )
        if fmt == FMT_V32:
            check(d_qk == 576, name, "d_qk 576 for the V32 format", d_qk)
        if fmt == FMT_MODEL1:
            check(d_qk == 512, name, "d_qk 512 for the MODEL1 format", d_qk)
            check(a.page_size > 0, name, "a paged operand for the MODEL1 format", "not paged")
        if fmt in (FMT_ROPE_AWARE, FMT_V32, FMT_MODEL1):
            check(
                self.stride % 4 == 0, f"{name}.rows.stride(0)", "a multiple of 4 bytes", self.stride
            )
        if fmt in (FMT_BLOCKWISE, FMT_ROPE_AWARE):
            check(self.sc is not None, f"{name}.scales", "a scale tensor", None)
            self.sc_stride = self.sc.stride(0)
            self.e8m0 = self.sc.dtype == torch.float8_e8m0fnu
            check(
                self.sc.dtype in (torch.float32, torch.float8_e8m0fnu),
                f"{name}.scales.dtype",
                "float32 or float8_e8m0fnu",
                self.sc.dtype,
            )
            if self.e8m0:
                self.sc = self.sc.view(torch.uint8)
        if fmt == FMT_PER_TENSOR:
            check(
                self.sc is not None and self.sc.numel() == 1, f"{name}.scales", "one scale", self.sc
            )
            self.sc = self.sc.float()
        if fmt == FMT_BLOCKWISE:
            g = a.granularity or d_qk
            check(d_qk % g == 0, f"{name}.granularity", f"a divisor of {d_qk}", g)
            self.g = g
            if g == d_qk:
                self.amode, self.fold_t = A_FOLD, True
            elif 512 % g == 0 and g >= 8:
                self.amode, self.nc, self.cw = A_CHUNK, 512 // g, g
            else:
                self.amode = A_GATHER
        elif fmt == FMT_PER_TENSOR:
            self.amode, self.fold_t = A_FOLD, True
        elif fmt == FMT_ROPE_AWARE:
            if d_qk == 576:
                self.amode = A_FOLD
            else:
                self.amode, self.nc, self.cw = A_CHUNK, 8, 64
        elif fmt == FMT_V32:
            self.amode, self.nc, self.cw = A_CHUNK, 4, 128
        elif fmt == FMT_MODEL1:
            self.amode, self.nc, self.cw = A_CHUNK, 8, 64
        # Hand-pipelined loads (see `_attend`), except for the per-element-gather slow path
        # whose [BN, 512] scale tile would not fit in registers twice.
        self.prefetch_default = self.amode != A_GATHER
        self.paged = a.page_size > 0
        n_rows = rows.shape[0]
        if self.paged:
            self.ps, self.psr = a.page_size, a.page_stride_rows
            self.npages = max((n_rows - self.ps) // self.psr + 1, 1)
            self.nenc = self.npages * self.ps
            self.lut = a.lut
            self.roff = None
        else:
            self.ps, self.psr, self.npages, self.nenc = 1, 1, 1, n_rows
            self.lut = None
            self.roff = a.row_offsets
        self.psb = self.psr * self.stride if fmt == FMT_MODEL1 else 0
        row_bytes = (MODEL1_DATA if fmt == FMT_MODEL1 else self.stride) * rows.element_size()
        self.align = (
            rows.data_ptr() % 16 == 0
            and row_bytes % 16 == 0
            and self.psb % 16 == 0
            and (fmt == FMT_MODEL1 or (self.stride * rows.element_size()) % 16 == 0)
        )
        self.cl = a.cache_lengths
        if self.sc is None:
            self.sc = rows  # never read


def _sparse_args(indices, lengths, tokens: int, batch: int, name: str):
    check(
        indices.ndim == 2 and indices.shape[0] == tokens and indices.dtype == torch.int32,
        name,
        f"an int32 [tokens={tokens}, stride] tensor",
        Lazy(lambda: f"{indices.dtype} {tuple(indices.shape)}"),
    )
    if indices.stride(1) != 1:
        indices = indices.contiguous()
    per_tok = False
    if lengths is not None:
        n = lengths.numel()
        check(
            lengths.dtype == torch.int32 and n in (batch, tokens),
            f"{name} lengths",
            f"int32 [batch={batch}] (or [tokens={tokens}])",
            Lazy(lambda: f"{lengths.dtype} {tuple(lengths.shape)}"),
        )
        per_tok = n != batch
    return indices, lengths, per_tok


def _tile_config(h_q: int, tokens: int, batch: int, sparse: bool, fp8: bool) -> dict:
    """BM (query rows a tile), HPT (heads a tile), TPT (tokens a tile), head blocks, BN,
    warps and pipeline depth. Rows are (token, head) pairs of one request."""
    est_sq = min(8, max(1, -(-tokens // max(batch, 1))))
    want = h_q if sparse else h_q * est_sq
    bm = _tuned("BM", min(64, max(16, triton.next_power_of_2(want))))
    if h_q > bm:  # heads in blocks of BM, one token a tile
        hpt, tpt = bm, 1
    else:  # all heads of up to BM // h_q tokens (dense) a tile
        hpt, tpt = h_q, (1 if sparse else max(1, bm // h_q))
    nhb = -(-h_q // hpt)
    # Measured on an H200 (bench/gpu_mla_dev.py, runs 2-3): the hand-pipelined loop wants as
    # many bytes in flight as the registers allow without spilling.
    if bm <= 32:  # memory-bound tiles: BF16 BN=16 x 4 warps (2 CTAs/SM), FP8 BN=64 x 8 warps
        warps = _tuned("num_warps", 8 if fp8 else 4)
        bn = _tuned("BN", 64 if fp8 else 16)
    else:  # 64-row tiles (on sm_90 the Gluon kernel serves most of these)
        warps = _tuned("num_warps", 8)
        bn = _tuned("BN", 32)
    stages = _tuned("num_stages", 3)
    return dict(BM=bm, HPT=hpt, TPT=tpt, NHB=nhb, BN=bn, num_warps=warps, num_stages=stages)


def _prefetch(op: _Operand, cfg: dict) -> bool:
    """Hand-pipelined loads for memory-bound (<= 32-row) tiles; Triton's pipeliner for 64-row
    tiles, where the register-held next tile would spill (measured: 88 vs 121 TFLOP/s)."""
    pf = TUNING.get("prefetch")
    if pf is not None:
        return bool(pf) and op.prefetch_default
    return op.prefetch_default and cfg["BM"] <= 32


def _sm90_config(h_q: int, sparse: bool, fmt: int) -> dict:
    """Tile of the sm_90 kernel: always 64 rows (heads of one token, or all heads of up to
    64 // h_q tokens in dense mode; padded), BN keys a tile, an NBUF-deep cp.async ring."""
    fp8 = fmt != FMT_BF16
    hpt = min(h_q, 64)
    tpt = 1 if (sparse or h_q >= 64) else 64 // h_q
    # H200, run 3 of bench/gpu_mla_dev.py: BN=64 with 2 stages beat BN=32 with 3-4 stages
    # (dense bf16 h_q 128: 0.80 vs 1.12 ms; sparse V32: 0.58 vs 0.78 ms): with 32 keys the
    # S product becomes n16 wgmma instructions and costs more than the deeper ring saves.
    bn = _tuned("sm90_bn", 64)
    nbuf = _tuned("sm90_nbuf", 4 if bn == 32 else 2)
    # PIPE (BF16 only: FP8 tiles are dequantized into one shared buffer that the previous
    # tile's P V product still reads): that product is waited for behind the next S product.
    # H100, bench/gpu_mla_dev.py (2026-11-21), PIPE vs not: dense h_q 128 s_k 4096 0.398 vs
    # 0.424 ms, s_k 8192 0.757 vs 0.797 ms; sparse h_q 128 s_q 2 top-k 2048 0.423 vs 0.430 ms.
    pipe = (not fp8) and TUNING.get("sm90_pipe") is not False
    # SS: the warp-specialized seesaw kernel (gluon_mla_ss) for BF16 and V32 caches. H100,
    # bench/gpu_mla_dev.py (2026-11-22), seesaw vs this module's key-split kernel (TFLOP/s,
    # b 128, page 64): dense bf16 h_q 128 s_k 8192 484 vs 387, s_k 4096 460 vs 360; sparse
    # s_q 2 top-k 2048 bf16 426 vs 348, V32 322 vs 248. Rope-aware FP8 stays on the key-split
    # kernel: it folds the per-token scale into S and P, where the seesaw producer would
    # round the dequantized tile to bf16 (outside that format's tolerance).
    ss = (
        bn == 64 and nbuf == 2 and fmt in (FMT_BF16, FMT_V32) and TUNING.get("sm90_ss") is not False
    )
    return dict(BM=64, HPT=hpt, TPT=tpt, NHB=-(-h_q // hpt), BN=bn, NBUF=nbuf, PIPE=pipe, SS=ss)


def _sm90_t_config(
    h_q: int, tokens: int, batch: int, sparse: bool, fmt: int, hbm3e: bool = False
) -> dict | None:
    """Tile of the keys-as-M sm_90 kernels (`_mla_decode_sm90_t`; TW: `_mla_decode_sm90_tw`),
    or None where they do not serve (hbm3e: an H200-class device, `cache.dispatch.fast_hbm`,
    where TW keeps 4 ring stages instead of 3): BF16 caches with at most 32 query rows a tile,
    rope-aware FP8 with at most 16 (in dense mode the heads of several tokens of a request
    share the tile, as many as the average query length asks for). The measurements below
    up to the TW comment are of `_mla_decode_sm90_t`. NR (the rows, padded) is 16 or 32. Two
    stages: BF16 tiles take 73 KB; FP8 (40 KB tiles, no float16 copy) fits two CTAs a SM with
    two stages and one with three. Offline sm_90 compiles: BF16 NR 16 128 registers, NR 32
    236; FP8 NR 16 238.
    H100 (2026-11-22, b 128, h_q 16, kernel alone): FP8 register operands 196 us (s_k 4096)
    and 380 us (8192) at one CTA a SM, 146 / 264 us at two (P = 2), against 210 / 402 us when
    the tile was first dequantized into shared memory (then 211 KB: one CTA a SM).
    H100 (2026-11-22, GPU time of CUDA-graph replays, b 128, h_q 16, P = 2): s_k 2048 / 4096 /
    8192 / 16384 take 84 / 141 / 258 / 487 us: added keys stream at 0.97 of copy, plus ~27
    us fixed, of which the combine kernel takes 1-5 us (`bench/gpu_mla_dev.py --fixed`: the
    split kernel alone 79 / 136 / 256 us); BF16 at P = 1: ~14 us. The e4m3 upcast is not
    the limit: integer-op upcasts (prmt / shl / and, value * 2^-8) ran 6-15% slower, half
    and half 3-6% slower, and no upcast at all (garbage values) only 3% faster.
    Per-CTA timeline (`gpu_mla_dev.py --trace`, H100 2026-11-22, s_k 4096, P = 2): 5 us of
    prologue (the dependent loads of request offsets, cache length and page ids), the first
    tile 2.5-3 us later, 32 tiles at 3.6 us (2.9 at best), 1.4 us of epilogue (3.3 before O
    was un-permuted in registers: vector stores), CTAs ending between 120 and 132 us (the 8
    SMs with one CTA at 100). Steady state streams 2.93 TB/s against BF16's 3.15 (P = 1:
    3.0 us tiles, 2.6 at best), so FP8 cannot make up its ramp and tail; one FP8 CTA alone
    takes 2.8 us a tile (P = 1: 184 us). After the epilogue and scale-ring changes FP8 takes
    138 / 254 us (s_k 4096 / 8192) against 141 / 259 in the same run. An L2 prefetch of the
    tile after next (cp.async.bulk.prefetch.L2) made every kernel slower: FP8 142 -> 150 us,
    BF16 h_q 16 208 -> 227 us (s_k 4096)."""
    want = TUNING.get("sm90_t")
    if want is False or h_q > 32 or fmt not in (FMT_BF16, FMT_ROPE_AWARE):
        return None
    max_rows = 32 if fmt == FMT_BF16 else 16  # FP8 with 32 rows: 64 more accumulator registers
    if h_q > max_rows:
        return None
    est_sq = 1 if sparse else min(8, max(1, -(-tokens // max(batch, 1))))
    tpt = 1 if sparse else max(1, min(est_sq, max_rows // h_q))
    nr = max(16, triton.next_power_of_2(h_q * tpt))
    nbuf = _tuned("sm90_t_nbuf", 2)
    # TW: rope-aware FP8 takes the warp-specialized kernel (`gluon_mla_tw`, one CTA a SM, P = 1
    # at b 128). H100 (2026-11-22, bench/gpu_mla_dev.py, b 128 h_q 16 page 64, graph replays,
    # P = 1), ring stages 2 / 3 / 4 / 5: s_k 4096 135 / 126 / 128 / 130 us, s_k 8192 255 / 237
    # / 240 / 244 us (s_k 2048 75 / 70 / 71, 16384 500 / 465 / 461); this kernel at P = 2 (two
    # CTAs a SM): 137 / 253 us. With every request reading request 0's pages (L2-resident)
    # the 3-stage kernel takes 103 / 197 us: its two consumers are close to compute-bound.
    # Later the same day, with `_t_tile` loading each e4m3 chunk one chunk ahead (PF) and the
    # stages laid out without bank conflicts (`_t_raw_layout` 1): L2-resident 102 -> 93 us at
    # s_k 4096 (PF alone 96, the layout alone 101), 193 -> 176 at 8192; from HBM 125 -> 124
    # and 237 -> 236 us; the one-warpgroup `_mla_decode_sm90_t` at P = 1 177 -> 157 us.
    tw = fmt == FMT_ROPE_AWARE and nr == 16 and TUNING.get("sm90_tw") is not False
    # On an H200 four stages (H200 2026-11-28, bench/mla_power_probe.py, b 128 h_q 16 page 64,
    # graph replays of 20 launches, alternated 3 / 4 / 5 stages, 3 / 2 / 3 runs; record
    # bench/results/h200_2026-11-28_mla_fp8_power.json): s_k 8192 0.1608-0.1612 / 0.1580-0.1584 /
    # 0.1597-0.1603 ms after an idle second, 0.1752-0.1760 / 0.1740-0.1743 / 0.1743-0.1747 under
    # sustained load (power-capped at 700 W, SM clock ~1700 MHz); s_k 4096 0.0863-0.0864 /
    # 0.0852-0.0855 / 0.0867-0.0871 and 0.0907-0.0911 / 0.0904-0.0907 / 0.0907-0.0910. A lease
    # before (a368133's kernel, graph replays): 0.195 / 0.193 / 0.194 ms at s_k 8192. The H100
    # measurements above keep three there.
    if tw:
        nbuf = _tuned("tw_nbuf", 4 if hbm3e else 3)
    return dict(HPT=h_q, TPT=tpt, NHB=1, BN=64, NBUF=nbuf, NR=nr, TW=tw)


# The cluster seesaw's runtime arguments that hold shared offsets (`ops.launch` smem_args).
_SS_CROSS_SMEM = {"OFF_K": "k_lat", "OFF_READY": "ready", "OFF_REMPTY": "rempty"}


def _use_sm90_path(q: torch.Tensor, K: _Operand, has_x: bool, d_qk: int) -> bool:
    """Whether the Gluon sm_90 kernel serves this launch (TUNING["gluon"] forces it off/on)."""
    want = TUNING.get("gluon")
    if want is False or not _HAS_GLUON or not q.is_cuda:
        return False
    if cuda_capability(q.device) != (9, 0):
        return False
    return _sm90_serves(q, K, has_x, d_qk)


def _sm90_serves(q: torch.Tensor, K: _Operand, has_x: bool, d_qk: int) -> bool:
    """Whether the Gluon sm_90 kernels take these operands on an sm_90 device (what
    `_use_sm90_path` asks beside the device; `ops.offline` captures take it alone)."""
    return (
        q.dtype == torch.bfloat16
        and d_qk == 576
        and K.fmt in (FMT_BF16, FMT_ROPE_AWARE, FMT_V32)
        and K.paged
        and not has_x
        and K.data.data_ptr() % 16 == 0
        and (K.stride * K.data.element_size()) % 16 == 0
        and (K.fmt != FMT_ROPE_AWARE or K.sc.data_ptr() % 4 == 0)
    )


def _st_eligible(K: _Operand, sparse: bool) -> bool:
    """Whether the TMA-fed seesaw (`gluon_mla_st`) serves a seesaw launch: dense BF16 pages of
    whole 64-key tiles (TUNING["ss_tma"] False: the cp.async seesaw). H100 (bench/gpu_mla_dev,
    2026-11-22, b 128 h_q 128 page 64, graph replays, two runs): s_k 8192 0.589-0.592 vs
    0.613-0.614 ms, s_k 4096 0.308-0.309 vs 0.324-0.330 (four TMA boxes a column half; with
    one: 0.586-0.590 and 0.308-0.315; with warpgroup 1's S starting on columns 0..255, as it
    ships: 0.557 and 0.298-0.304, `gluon_mla_st`)."""
    return (
        TUNING.get("ss_tma") is not False
        and K.fmt == FMT_BF16
        and not sparse
        and K.paged
        and K.ps % 64 == 0
    )


def _int32_rows(K: _Operand, key: str = "ss_addr") -> bool:
    """Whether a producer numbers a tile's rows in int32 and derives every pointer of a row
    from one int64 offset product (ADDR: the V32 cluster producer's tile loop 711 -> 671 sm_90
    instructions, `gluon_mla_tw`'s 233 -> 206): where the cache has fewer than 2^31 rows,
    unless TUNING[key] is False."""
    return bool(_tuned(key, True)) and K.data.shape[0] < 2**31


def _ps_plan(tokens: int, n_idx: int, dev: torch.device) -> tuple[int, int, int]:
    """(G, L, NPR) of the persistent sparse V32 kernel (`gluon_mla_ps`): G clusters of two
    CTAs (one a pair of SMs, at most one a token), L pairs of 64-key tiles a cluster (>= NPR),
    NPR pairs a token (its `indices` width)."""
    npr = max(1, -(-n_idx // 128))
    # TUNING["ps_g"] (development): G > num_sms // 2 runs in waves (G = tokens: one token a
    # cluster, gluon_mla_ps's docstring compares that with gluon_mla_ss)
    g = max(1, min(_tuned("ps_g", num_sms(dev) // 2), tokens))
    return g, -(-tokens * npr // g), npr


def _trace_level(tr: torch.Tensor) -> int:
    """A development trace buffer's TRACE level: 2 (the seesaws' tile trace) for rows that
    hold one (`gluon_mla.TILE_TRACE_SLOTS` after the kernel's own slots), else 1."""
    return 2 if tr.shape[1] > TILE_TRACE_SLOTS else 1


def _launch_ps(q, q_row_offsets, K, idx, topk, topk_tok, out, lse, attn_sink, sm_scale, d_v,
               regs, step):  # fmt: skip
    """Sparse V32 decode with two head blocks a token on the persistent cluster kernel, then
    the combine of the tokens cut at cluster boundaries; regs and step (DEQ1, PS_C, ADDR: the
    producer's tile step) as the per-token cluster kernel takes them. Returns (out, lse)."""
    tokens, h_q, _d = q.shape
    batch = q_row_offsets.numel() - 1
    g, L, npr = _ps_plan(tokens, idx.shape[1], q.device)
    tr = TUNING.get("trace")  # int64 [>= 2 G, 80] (gpu_mla_dev --ps-trace; 464: --tile-trace)
    trace = dict(TRACE=_trace_level(tr), TR=tr) if tr is not None else {}
    po = torch.empty(2, g, h_q, d_v, dtype=torch.float32, device=q.device)
    pl = torch.empty(2, g, h_q, dtype=torch.float32, device=q.device)
    cut_t = torch.empty(g, dtype=torch.int32, device=q.device)
    launch(
        _mla_decode_sm90_ps, (g,),
        q, q.stride(0), q.stride(1), q_row_offsets, batch, tokens,
        out, out.stride(0), out.stride(1), lse, po, pl, cut_t,
        attn_sink if attn_sink is not None else lse, sm_scale * LOG2E.value,
        K.data, K.cl, idx, topk if topk is not None else q_row_offsets,
        K.stride, K.stride // 2, K.stride // 4, K.ps, K.psr, K.nenc, K.npages,
        idx.stride(0), idx.shape[1], L, npr,
        H_Q=h_q, D_V=d_v, B_P2=triton.next_power_of_2(batch + 1),
        HAS_SINK=attn_sink is not None, HAS_TOPK=topk is not None, TOPK_TOK=topk_tok, BN=64,
        CONSUMER_REGS=regs[0], PRODUCER_REGS=regs[1], EPI=_tuned("ps_epi", 1),
        ORDER=_tuned("ps_order", 1), num_warps=4,
        cluster=2, smem_args=_SS_CROSS_SMEM, **step, **trace,
    )  # fmt: skip
    if L % npr:  # else every cluster boundary falls between tokens: none is cut
        mla_combine_triton(po, pl, out, lse, attn_sink, cut=(L, npr, cut_t))
    return out, lse


def mla_decode_triton(
    q: torch.Tensor,
    kv,
    q_row_offsets: torch.Tensor,
    *,
    d_v: int = 512,
    scale: float | None = None,
    causal: bool = True,
    indices: torch.Tensor | None = None,
    topk_lengths: torch.Tensor | None = None,
    extra_kv=None,
    extra_indices: torch.Tensor | None = None,
    extra_topk_lengths: torch.Tensor | None = None,
    attn_sink: torch.Tensor | None = None,
    num_partitions: int | None = None,
    out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """MLA decode (docs/ops.md `mla_decode`), Triton kernels.

    q: [tokens, h_q, d_qk] bf16, d_qk 576 or 512; kv: an MLA operand (one latent head) in
    bf16 or any FP8 layout; q_row_offsets: [batch + 1] int32; indices: [tokens, stride] int32
    encoded block*page_size+offset (sparse mode); topk_lengths: [batch] int32; extra_kv with
    extra_indices/extra_topk_lengths: a second sparse operand joined in the same softmax;
    attn_sink: [h_q] f32. Returns (out [tokens, h_q, d_v] q.dtype, lse [tokens, h_q] f32, natural
    log over keys only). No host synchronisation; sizes depend only on shapes.
    """
    check(q.ndim == 3, "q", "a [tokens, h_q, d_qk] tensor", tuple(q.shape))
    tokens, h_q, d_qk = q.shape
    check(
        q.dtype in (torch.bfloat16, torch.float16),
        "q.dtype",
        "torch.bfloat16 or torch.float16 (use the reference backend for float32)",
        q.dtype,
    )
    check(d_qk in (576, 512), "q.shape[-1]", "576 or 512", d_qk)
    check(q.stride(2) == 1, "q", "a last dim of stride 1", q.stride())
    check(1 <= d_v <= 512 and d_v <= d_qk, "d_v", f"in [1, {min(512, d_qk)}]", d_v)
    check(
        q_row_offsets.ndim == 1
        and q_row_offsets.dtype == torch.int32
        and q_row_offsets.numel() >= 1,
        "q_row_offsets",
        "a 1-D int32 [batch + 1] tensor",
        Lazy(lambda: f"{q_row_offsets.dtype} {tuple(q_row_offsets.shape)}"),
    )
    batch = q_row_offsets.numel() - 1
    dev = q.device
    if out is None:
        out = torch.empty(tokens, h_q, d_v, dtype=q.dtype, device=dev)
    else:
        check(
            tuple(out.shape) == (tokens, h_q, d_v) and out.dtype == q.dtype and out.stride(2) == 1,
            "out",
            Lazy(lambda: f"a {q.dtype} [{tokens}, {h_q}, {d_v}] tensor with unit last stride"),
            Lazy(lambda: f"{out.dtype} {tuple(out.shape)}"),
        )
    lse = torch.empty(tokens, h_q, dtype=torch.float32, device=dev)
    if tokens == 0 or h_q == 0:
        return out, lse

    K = _Operand(kv, d_qk, q.dtype, "kv")
    check(K.cl.numel() == batch, "kv.cache_lengths", f"[batch={batch}]", tuple(K.cl.shape))
    sparse = indices is not None
    if sparse:
        idx, topk, topk_tok = _sparse_args(indices, topk_lengths, tokens, batch, "indices")
    else:
        check(topk_lengths is None, "topk_lengths", "None without indices", "a tensor")
        idx, topk, topk_tok = q_row_offsets, None, False
    has_x = extra_kv is not None
    if has_x:
        check(extra_indices is not None, "extra_indices", "a tensor with extra_kv", None)
        X = _Operand(extra_kv, d_qk, q.dtype, "extra_kv")
        x_idx, x_topk, x_topk_tok = _sparse_args(
            extra_indices, extra_topk_lengths, tokens, batch, "extra_indices"
        )
    else:
        check(extra_indices is None, "extra_indices", "None without extra_kv", "a tensor")
        X, x_idx, x_topk, x_topk_tok = K, idx, None, False
    if attn_sink is not None:
        check(
            attn_sink.numel() == h_q and attn_sink.dtype == torch.float32,
            "attn_sink",
            f"a float32 [h_q={h_q}] tensor",
            Lazy(lambda: f"{attn_sink.dtype} {tuple(attn_sink.shape)}"),
        )
        attn_sink = attn_sink.contiguous()

    sm90 = _use_sm90_path(q, K, has_x, d_qk)
    cfg_t = _sm90_t_config(h_q, tokens, batch, sparse, K.fmt, fast_hbm(dev)) if sm90 else None
    if cfg_t is not None:
        cfg = cfg_t
    elif sm90:
        cfg = _sm90_config(h_q, sparse, K.fmt)
    else:
        cfg = _tile_config(h_q, tokens, batch, sparse, K.fmt != FMT_BF16)
    if num_partitions is None:
        if sparse:
            bound = idx.shape[1]
        elif K.paged:
            bound = K.lut.shape[1] * K.ps
        else:
            bound = K.data.shape[0]
        if has_x:
            bound += x_idx.shape[1]
        est_sq = 1 if sparse else min(8, max(1, -(-tokens // max(batch, 1))))
        units_batch = tokens if sparse else batch
        # the register-operand FP8 kernel (cfg_t with a rope-aware cache) has its own tile
        tile = mla_tile(h_q, d_qk, cfg_t is not None and K.fmt == FMT_ROPE_AWARE, dev)
        num_partitions = mla_num_partitions(units_batch, h_q, est_sq, bound, num_sms(dev), *tile)
    P = int(num_partitions)
    check(P >= 1, "num_partitions", "an int >= 1", num_partitions)

    if P > 1:
        po = torch.empty(P, tokens, h_q, d_v, dtype=torch.float32, device=dev)
        pl = torch.empty(P, tokens, h_q, dtype=torch.float32, device=dev)
    else:
        po, pl = lse, lse  # not written
    sm_scale = (1.0 / math.sqrt(d_qk)) if scale is None else float(scale)
    grid = (tokens * cfg["NHB"], P)
    pdl = P > 1 and pdl_enabled(q)  # the split kernel lets its combine launch early (opt-in)
    dummy = q_row_offsets
    cluster = 1
    if sm90:
        if cfg_t is not None:  # keys-as-M: `_t_tile` PF, `_t_raw_layout` (see `_sm90_t_config`)
            extra = dict(NR=cfg["NR"], PF=_tuned("t_pf", True), KSWZ=_tuned("t_kswz", 1))
            if cfg["TW"]:
                kernel = _mla_decode_sm90_tw
                regs = _tuned("tw_regs", (232, 48))
                fold = bool(_tuned("tw_fold", True))
                extra.update(
                    CONSUMER_REGS=regs[0],
                    PRODUCER_REGS=regs[1],
                    PRE=_tuned("tw_pre", 1),
                    # The producer's tile loop is on the tiles' critical path: a constant page
                    # size and int32 rows (330 -> 206 sm_90 instructions a tile) took the
                    # H200's graph replays (b 128 h_q 16 page 64, s_k 4096 / 8192) from 0.100
                    # / 0.193 ms to 0.095 / 0.186 from HBM, 0.090 / 0.172 to 0.085 / 0.162 in
                    # L2 (2026-11-28, bench/results/h200_2026-11-28_mla_fp8_producer.json).
                    PS_C=_page_size_constexpr(K.ps, "tw_psc"),
                    ADDR=_int32_rows(K, "tw_addr"),
                    # The softmax's one cross-warp reduction a tile (scale folded into the max,
                    # `_t_tile` FOLD) against the pair (max, largest scale) and a division an
                    # element: H200 graph replays (b 128 h_q 16 page 64, s_k 8192 / 4096, from
                    # HBM and L2; 2026-11-28, bench/results/h200_2026-11-28_mla_fp8_fold.json)
                    # 0.186 / 0.097 -> 0.184 / 0.096 ms and 0.162 / 0.085 -> 0.157 / 0.082.
                    FOLD=fold,
                    # SPEC (H200 2026-11-28, graph replays, b 128 h_q 16 page 64, s_k 8192 /
                    # 4096, bench/results/h200_2026-11-28_mla_fp8_spec.json): 0.193 / 0.099 ->
                    # 0.185 / 0.095 ms from HBM, 0.156 / 0.082 -> 0.144 / 0.076 in L2.
                    SPEC=fold and bool(_tuned("tw_spec", True)),  # SPEC needs FOLD
                )
            else:
                kernel = _mla_decode_sm90_t
            extra.update(num_warps=4)
        elif cfg["SS"] and _st_eligible(K, sparse):  # the TMA-fed seesaw (gluon_mla_st)
            kernel = _mla_decode_sm90_st
            kd, kd3 = _st_descriptors(K.data)
            extra = dict(REGS=_tuned("st_regs", 240), KD=kd, KD3=kd3, num_warps=4,
                         K_lut_len=K.lut.shape[1])  # fmt: skip
        elif cfg["SS"]:
            kernel = _mla_decode_sm90_ss
            # Warpgroup 1's order in a pair of tiles and half-stage release (gluon_mla_ss):
            # H100 graph replays, 3 runs 2026-11-22 (bench/gpu_mla_dev.py), against order 0
            # with whole-stage release: dense bf16 h_q 128 s_k 8192 0.626-0.641 -> 0.605-0.615
            # ms with order 2 (order 1: 0.618-0.631); sparse V32 0.492-0.497 -> 0.472-0.477
            # with order 1 (order 2: 0.480-0.485); sparse bf16 0.337-0.344 either way.
            extra = dict(
                SS_ORDER=_tuned("ss_order", 2 if K.fmt == FMT_BF16 else 1),
                SS_HALF=bool(_tuned("ss_half", True)),
                num_warps=4,
            )
            # V32 with two head blocks a token: the 2-CTA cluster kernel (each CTA dequantizes
            # half of every tile; `gluon_mla_ss._ss_cross_tile`). H100 graph replays
            # (2026-11-22, bench/gpu_mla_dev.py, b 128 h_q 128 s_q 2 top-k 2048, two runs):
            # 0.445-0.446 ms against 0.468-0.469 from HBM; slower where the keys are in L2
            # (0.413 / 0.381) or none is loaded (0.365 / 0.342).
            cross = (
                K.fmt == FMT_V32
                and cfg["NHB"] == 2
                and extra["SS_HALF"]
                and _tuned("ss_cross", True)
            )
            # setmaxnreg per thread (consumer, producer): gluon_mla_ss's docstring has the sweep.
            # The cluster kernel: 200 / 104, where every tile loop is spill-free (offline sm_90
            # SASS; 200 / 112 left 8 LDL a pair in consumer 1) and its producer's tile step is
            # shortest (H100 2026-11-28, bench/results/h100_2026-11-28_mla_v32_producer.json:
            # with the single store, constant page size and one offset product a row, sparse V32
            # 0.415-0.417 ms against 0.424-0.426 at 200 / 112, dense s_k 8192 0.777-0.778).
            regs = _tuned(
                "ss_regs", (232, 48) if K.fmt == FMT_BF16 else (200, 104) if cross else (200, 112)
            )
            extra.update(CONSUMER_REGS=regs[0], PRODUCER_REGS=regs[1],
                         SS_QASYNC=_ss_qasync(cfg, h_q, cross and sparse))  # fmt: skip
            if cross:
                # SS_SPLITCP: each 16 KB group of a half goes to the peer once stored (the
                # second converted under the first one's copy). H100 graph replays (2026-11-23,
                # two leases, bench/results/h100_2026-11-23_mla_v32_rope_regs.json runs 9-10):
                # dense V32 h_q 128 s_k 8192 0.797 against 0.820 ms (L2 0.721-0.731 / 0.752-
                # 0.757); sparse 0.435 against 0.428-0.431, so dense only. SS_DEQ1 (sparse: the
                # half's two groups in one store, no warpgroup barrier between them), PS_C and
                # SS_ADDR: see `_page_size_constexpr` and `_int32_rows`; H100 2026-11-28 (same
                # record) sparse V32 0.419-0.424 ms with SS_DEQ1 against 0.428-0.434 without.
                step = dict(DEQ1=bool(_tuned("ss_deq1", True)), PS_C=_page_size_constexpr(K.ps),
                            ADDR=_int32_rows(K))  # fmt: skip
                extra.update(SS_CROSS=True, SS_SPLITCP=bool(_tuned("ss_splitcp", not sparse)),
                             SS_DEQ1=step["DEQ1"], PS_C=step["PS_C"],
                             SS_ADDR=step["ADDR"])  # fmt: skip
                cluster = 2
                if sparse and P == 1 and _tuned("ss_persist", False):
                    return _launch_ps(q, q_row_offsets, K, idx, topk, topk_tok, out, lse,
                                      attn_sink, sm_scale, d_v, regs, step)  # fmt: skip
        else:
            kernel, extra = _mla_decode_sm90, dict(PIPE=cfg["PIPE"], num_warps=8)
        traced = kernel in (_mla_decode_sm90_t, _mla_decode_sm90_tw, _mla_decode_sm90_st,
                            _mla_decode_sm90_ss)  # fmt: skip
        if traced and TUNING.get("trace") is not None:  # int64 [>= grid, 10] (gpu_mla_dev --trace)
            extra.update(TRACE=_trace_level(TUNING["trace"]), TR=TUNING["trace"])
        sm90_args = (
            q, q.stride(0), q.stride(1), q_row_offsets, batch, tokens,
            out, out.stride(0), out.stride(1), lse, po, pl,
            attn_sink if attn_sink is not None else lse, sm_scale * LOG2E.value, P,
            K.data, K.sc, K.lut, K.cl, idx, topk if topk is not None else dummy,
            K.stride, K.stride // 2, K.stride // 4, K.sc_stride, K.lut.stride(0), K.ps, K.psr,
            K.nenc, K.npages, idx.stride(0), idx.shape[1] if sparse else 0,
        )  # fmt: skip
        extra.update(
            H_Q=h_q, D_QK=d_qk, D_V=d_v, HPT=cfg["HPT"], TPT=cfg["TPT"], NHB=cfg["NHB"],
            B_P2=triton.next_power_of_2(batch + 1), CAUSAL=bool(causal),
            HAS_SINK=attn_sink is not None, SPLIT=P > 1, SPARSE=sparse,
            HAS_TOPK=topk is not None, TOPK_TOK=topk_tok, FMT=K.fmt, BN=cfg["BN"],
            NBUF=cfg["NBUF"], PDL=pdl,
        )  # fmt: skip
        smem = None
        if cluster > 1:  # grid x counts clusters; the kernel takes its own shared offsets
            grid, smem = (grid[0] // cluster, grid[1]), _SS_CROSS_SMEM
        launch(kernel, grid, *sm90_args, cluster=cluster, smem_args=smem, **extra)
    else:
        launch(_mla_decode_kernel, grid,
            q, q.stride(0), q.stride(1), q_row_offsets, batch, tokens,
            out, out.stride(0), out.stride(1), lse, po, pl,
            attn_sink if attn_sink is not None else lse, sm_scale * LOG2E.value, P,
            K.data, K.sc, K.lut if K.paged else dummy, K.roff if K.roff is not None else dummy,
            K.cl, idx, topk if topk is not None else dummy,
            K.stride, K.stride // 2, K.stride // 4, K.sc_stride,
            K.lut.stride(0) if K.paged else 0, K.ps, K.psr, K.psb, K.psb // 2, K.nenc, K.npages,
            idx.stride(0), idx.shape[1] if sparse else 0,
            X.data, X.sc, x_idx, x_topk if x_topk is not None else dummy,
            X.stride, X.stride // 2, X.stride // 4, X.sc_stride, X.ps, X.psr, X.psb, X.psb // 2,
            X.nenc, x_idx.stride(0), x_idx.shape[1] if has_x else 0,
            H_Q=h_q, D_QK=d_qk, D_V=d_v, BM=cfg["BM"], BN=cfg["BN"], HPT=cfg["HPT"],
            TPT=cfg["TPT"], NHB=cfg["NHB"], B_P2=triton.next_power_of_2(batch + 1), SPLIT=P > 1,
            CAUSAL=bool(causal), HAS_SINK=attn_sink is not None,
            K_FMT=K.fmt, K_AMODE=K.amode, K_FOLD_T=K.fold_t, K_NC=K.nc, K_CW=K.cw, K_G=K.g,
            K_E8M0=K.e8m0, K_PAGED=K.paged, K_SPARSE=sparse, K_HAS_TOPK=topk is not None,
            K_TOPK_TOK=topk_tok,
            HAS_X=has_x, X_FMT=X.fmt, X_AMODE=X.amode, X_FOLD_T=X.fold_t, X_NC=X.nc, X_CW=X.cw,
            X_G=X.g, X_E8M0=X.e8m0, X_PAGED=X.paged, X_HAS_TOPK=x_topk is not None,
            X_TOPK_TOK=x_topk_tok,
            NUM_STAGES=cfg["num_stages"], K_PREFETCH=_prefetch(K, cfg), X_PREFETCH=_prefetch(X, cfg),
            K_ALIGN=K.align, X_ALIGN=X.align, PDL=pdl,
            num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
        )  # fmt: skip
    if P > 1:
        mla_combine_triton(po, pl, out, lse, attn_sink)
    return out, lse
