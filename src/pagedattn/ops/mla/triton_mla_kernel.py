"""The portable MLA decode kernel (`_mla_decode_kernel`, Triton tl): every cache format, dense or
sparse, an extra sparse cache, sinks and split-K, on any GPU and in Triton's CPU interpreter.

Same contract as `pagedattn.ops.mla.mla_decode` (docs/ops.md). `triton_mla.mla_decode_triton`
launches it wherever the Gluon sm_90 kernels do not serve (`triton_mla_plan`); one kernel,
specialised at compile time on format, mode and tile shape (`triton_mla_plan.tl_plan`).

Work decomposition
  - A tile is BM query rows of one request: (query token, head) pairs, token-major. With h_q <
    BM several tokens of a request share a tile (dense only: sparse tokens have their own
    indices), so K is read once for all of them; with h_q > BM the heads split in blocks of BM,
    the tiles of one token next to each other in the grid (their K tiles meet in L2). Heads are
    padded inside the kernel; callers pad nothing.
  - grid = (tokens * head_blocks, num_partitions). A token's request is found in-kernel from
    `q_row_offsets`; a program whose token does not lead a tile exits at once.
  - Split-K: partition p covers the keys [p*chunk, (p+1)*chunk) of (main keys ++ extra keys),
    chunk rounded to BN. Partials (f32) are merged by `triton_mla_combine`, which also folds
    the sink into the global LSE; with one partition the kernel writes the output and applies
    the sink itself.
  - Every K tile is loaded once and used twice: S = Q K^T over d_qk, O += P V with V the first
    512 dims of the same tile.

FP8 caches are dequantized in the kernel; the query stays BF16:
  - one scale per token (rope-aware, blockwise with G = d_qk, per-tensor): e4m3 -> bf16 is
    exact, so the scale is folded into S's columns and into P's columns instead of K (A_FOLD);
  - several scales per token (FlashMLA V32: 4 x 128, MODEL1: 7 x 64 e8m0, blockwise G | 512):
    the tile is viewed as [BN, chunks, chunk_width], scaled per chunk in f32 and rounded to
    bf16 once (A_CHUNK);
  - any other G: a per-element scale gather (A_GATHER, the slow path).

Dimensions: the FP8 formats take d_qk 576 (512 latent + 64 rope) or 512; BF16 / FP16 caches
take any d_qk <= 576 (a checkpoint's kv_lora_rank + rope dim, e.g. 128 + 32): the tile keeps its
512 + 64 columns, the dims past d_qk load as 0 (masked loads: only the row's bytes are read)
and V is the first d_v <= min(512, d_qk) of them.

Invalid keys (past a length, masked by causality, invalid sparse indices, sentinel pages) are
loaded from clamped in-bounds addresses with masked loads (value 0) and their scores set to -inf
with `tl.where`, so NaN in unreferenced cache slots never reaches the output.

Loads are software-pipelined by hand (lookup-table / index loads two tiles ahead, K one tile
ahead; PREFETCH): Triton's own pipeliner serialises this loop (see `_attend`).
"""

from __future__ import annotations

import triton
import triton.language as tl

from .._triton_interpreter import install_interpreter_shim
from ..pdl import pdl_signal
from ..triton_constants import LN2, LOG2E
from .worklist import (
    mla_find_item,
    mla_run_meta,
    mla_run_piece,
    mla_run_segment,
    mla_run_stream,
    mla_tile_tokens,
    mla_work_list,
)

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

    xa [BN, NC, CW] dims 0..511 in storage dtype (NC * CW = 512; dims >= D_QK are 0); sa their
    float32 scales ([BN, NC]; [BN, 512] per element in A_GATHER mode; ones for bf16); xt [BN, 64]
    dims 512..575 (D_QK > 512; dims >= D_QK are 0) in storage dtype, st their per-element scales ([BN, 64], blockwise
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
    if FMT == 0:  # plain 16-bit rows of D_QK elements (any D_QK <= 576: dims past it are 0)
        xa = tl.load(kv + base[:, None, None] + cj, mask=v3 & (cj < D_QK), other=0.0)
        if D_QK > 512:
            tm = vm & (512 + dT < D_QK)[None, :]
            xt = tl.load(kv + base[:, None] + 512 + dT[None, :], mask=tm, other=0.0)
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
        if D_QK > 512:
            if FOLD_T:
                s = (s + tl.dot(q_t, tl.trans(k_t))) * s_tok[None, :]
            else:
                s = s * s_tok[None, :] + tl.dot(q_t, tl.trans(k_t))
        else:
            s = s * s_tok[None, :]
    elif D_QK > 512:
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
def _tile(start, hi, key, row_base, kv, sc, stride, stride_h, stride_q, sc_stride, page_size,
          psr, psb, psb_h, n_enc, n_pages, FMT: tl.constexpr, AMODE: tl.constexpr,
          NC: tl.constexpr, CW: tl.constexpr, G: tl.constexpr, E8M0: tl.constexpr,
          PAGED: tl.constexpr, SPARSE: tl.constexpr, D_QK: tl.constexpr, BN: tl.constexpr,
          ALIGN: tl.constexpr):  # fmt: skip
    """The tile of BN keys at `start` (`_tile_rows`), loaded raw (`_load_raw`): (pos, valid,
    xa, sa, xt, st, xr)."""
    pos, valid, rows, blk, off = _tile_rows(
        start, hi, key, row_base, page_size, psr, n_enc, n_pages, PAGED, SPARSE, BN
    )
    xa, sa, xt, st, xr = _load_raw(
        kv, sc, rows, blk, off, valid, stride, stride_h, stride_q, sc_stride, page_size,
        psb, psb_h, FMT, AMODE, NC, CW, G, E8M0, D_QK, BN, ALIGN,
    )  # fmt: skip
    return pos, valid, xa, sa, xt, st, xr


@triton.jit
def _consume(acc, m_i, l_i, q_a, q_t, xa, sa, xt, st, xr, pos, valid, row_lim, qk_scale,
             FMT: tl.constexpr, AMODE: tl.constexpr, FOLD_T: tl.constexpr, NC: tl.constexpr,
             CAUSAL: tl.constexpr, D_QK: tl.constexpr, BN: tl.constexpr,
             DT: tl.constexpr):  # fmt: skip
    """A raw tile (`_tile`) finished (`_finish`) into the online softmax (`_update`)."""
    k_a, k_t, s_tok = _finish(xa, sa, xt, st, xr, FMT, AMODE, NC, D_QK, BN, DT)
    return _update(
        acc, m_i, l_i, q_a, q_t, k_a, k_t, s_tok, pos, valid, row_lim, qk_scale,
        AMODE, FOLD_T, CAUSAL, D_QK,
    )  # fmt: skip


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
        pos, valid, xa, sa, xt, st, xr = _tile(
            lo, hi, key, row_base, kv, sc, stride, stride_h, stride_q, sc_stride, page_size,
            psr, psb, psb_h, n_enc, n_pages, FMT, AMODE, NC, CW, G, E8M0, PAGED, SPARSE, D_QK,
            BN, ALIGN,
        )  # fmt: skip
        for start in tl.range(lo, hi, BN, num_stages=1):
            key_nn = _tile_keys(start + 2 * BN, hi, b, tok, lut, idx, lut_stride, page_size,
                                idx_stride, PAGED, SPARSE, BN)  # fmt: skip
            pos_n, valid_n, xa_n, sa_n, xt_n, st_n, xr_n = _tile(
                start + BN, hi, key_n, row_base, kv, sc, stride, stride_h, stride_q,
                sc_stride, page_size, psr, psb, psb_h, n_enc, n_pages, FMT, AMODE, NC, CW, G,
                E8M0, PAGED, SPARSE, D_QK, BN, ALIGN,
            )  # fmt: skip
            acc, m_i, l_i = _consume(
                acc, m_i, l_i, q_a, q_t, xa, sa, xt, st, xr, pos, valid, row_lim, qk_scale,
                FMT, AMODE, FOLD_T, NC, CAUSAL, D_QK, BN, DT,
            )  # fmt: skip
            pos, valid, xa, sa, xt, st, xr = pos_n, valid_n, xa_n, sa_n, xt_n, st_n, xr_n
            key_n = key_nn
    else:
        for start in tl.range(lo, hi, BN, num_stages=NUM_STAGES):
            key = _tile_keys(start, hi, b, tok, lut, idx, lut_stride, page_size, idx_stride,
                             PAGED, SPARSE, BN)  # fmt: skip
            pos, valid, xa, sa, xt, st, xr = _tile(
                start, hi, key, row_base, kv, sc, stride, stride_h, stride_q, sc_stride,
                page_size, psr, psb, psb_h, n_enc, n_pages, FMT, AMODE, NC, CW, G, E8M0, PAGED,
                SPARSE, D_QK, BN, ALIGN,
            )  # fmt: skip
            acc, m_i, l_i = _consume(
                acc, m_i, l_i, q_a, q_t, xa, sa, xt, st, xr, pos, valid, row_lim, qk_scale,
                FMT, AMODE, FOLD_T, NC, CAUSAL, D_QK, BN, DT,
            )  # fmt: skip
    return acc, m_i, l_i


@triton.jit
def _topk_len(TOPK, idx_len, t, b, live, HAS_TOPK: tl.constexpr, TOPK_TOK: tl.constexpr):
    """The keys a sparse operand's row selects: idx_len, or the top-k length (token t's with
    TOPK_TOK, else request b's) clamped to [0, idx_len]."""
    n = idx_len
    if HAS_TOPK:
        if TOPK_TOK:
            n = tl.load(TOPK + t)
        else:
            n = tl.load(TOPK + b, mask=live, other=0)
        n = tl.minimum(tl.maximum(n, 0), idx_len)
    return n


@triton.jit
def _mla_decode_kernel(
    q_args,  # (Q, strides, its request offsets QOFF, batch, n_tokens)
    out_args,  # (OUT, strides, LSE, PO, PL, SINK, qk_scale, NUM_P)
    k_args,  # the main operand
    x_args,  # the extra operand (sparse only)
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
    BALANCED: tl.constexpr = False,
    TARGET: tl.constexpr = 1,
    MIN_BLOCKS: tl.constexpr = 1,
    RUNS: tl.constexpr = False,
    RUN_P: tl.constexpr = 1,
    RUN_OVH: tl.constexpr = 0,
    ITEM_WAVES: tl.constexpr = 1,
    META=None,
    LIST_ORDER: tl.constexpr = 0,
):
    """One (tile, partition): BM (token, head) rows of one request over one key partition.
    BALANCED (dense, no extra operand): one (item of the balanced work list `worklist`, head
    block) instead: the grid is (TARGET + tokens) x NHB, programs past the list exit; a tile of
    several items writes partials at rows item * TPT + i of PO / PL, a tile of one the output;
    LIST_ORDER: the list's ORDER (`worklist.mla_work_list`).
    RUNS (same modes): program p of RUN_P for head block hb (grid RUN_P x NHB): item p of the
    list where its items fit one wave of RUN_P (ITEM_WAVES 1; 0: never) and none exceeds 9/8 of
    a run, else
    piece p of the contiguous runs (`worklist`, "Contiguous runs"), one tile's blocks a
    segment; a tile cut into several items or pieces writes partials at rows slot * TPT + i, a
    whole tile the output; the program holding a tile's first block writes META (slot,
    pieces, i) of its tokens for the combine."""
    Q, stride_qt, stride_qh, QOFF, batch, n_tokens = q_args
    OUT, stride_ot, stride_oh, LSE, PO, PL, SINK, qk_scale, NUM_P = out_args
    (K, K_SC, K_LUT, K_ROFF, K_CL, K_IDX, K_TOPK, K_stride, K_stride_h, K_stride_q, K_sc_stride,
     K_lut_stride, K_ps, K_psr, K_psb, K_psb_h, K_nenc, K_npages, K_idx_stride,
     K_idx_len) = k_args  # fmt: skip
    (X, X_SC, X_IDX, X_TOPK, X_stride, X_stride_h, X_stride_q, X_sc_stride, X_ps, X_psr, X_psb,
     X_psb_h, X_nenc, X_idx_stride, X_idx_len) = x_args  # fmt: skip
    pdl_signal(PDL)  # the combine may launch (it waits for this grid before reading)
    pid = tl.program_id(0)
    hb = pid % NHB
    if RUNS:
        tl.static_assert(not (K_SPARSE or HAS_X), "the runs are for dense decode")
        p = pid // NHB
        r_r, r_o, r_q, r_w, r_span, r_incl = mla_run_stream(
            QOFF, K_CL, batch, TPT, BN, RUN_OVH, B_P2
        )
        size, total = mla_run_piece(r_incl, RUN_P, MIN_BLOCKS)
        # one wave of whole items where the list fits it (ITEM_WAVES 1) and none exceeds 9/8 of a
        # run (program p: item p), else the runs; one code path (as the sm_90 kernel)
        w_r, w_c, w_n, w_end, w_chunk, w_lo = mla_work_list(
            QOFF, K_CL, batch, TPT, BN, RUN_P, MIN_BLOCKS, B_P2
        )
        max_chunk = tl.max(tl.where(w_n > 0, w_chunk, 0), 0)
        # (ITEM_WAVES scales the bound: a constant `& False` broke the sm_90 lowering)
        tl.static_assert(ITEM_WAVES <= 1, "one item a program")
        use_items = (tl.sum(w_n, 0) <= RUN_P * ITEM_WAVES) & (max_chunk * 8 <= size * (9 * BN))
        ok, t_i, lo_i, hi_i, c_i, _s = mla_find_item(w_r, w_c, w_n, w_end, w_chunk, w_lo, p, TPT)
        _runs(
            q_args, out_args, k_args, x_args, META, p, hb, r_r, r_o, r_q, r_w, r_span, r_incl,
            size, total, use_items, ok, t_i, lo_i, hi_i, c_i, H_Q, D_QK, D_V, BM, BN, HPT, TPT,
            B_P2, CAUSAL, HAS_SINK, K_FMT, K_AMODE, K_FOLD_T, K_NC, K_CW, K_G, K_E8M0, K_PAGED,
            K_SPARSE, K_HAS_TOPK, K_TOPK_TOK, HAS_X, X_FMT, X_AMODE, X_FOLD_T, X_NC, X_CW, X_G,
            X_E8M0, X_PAGED, X_HAS_TOPK, X_TOPK_TOK, NUM_STAGES, K_PREFETCH, X_PREFETCH, K_ALIGN,
            X_ALIGN, RUN_OVH,
        )  # fmt: skip
    elif BALANCED:
        tl.static_assert(not (K_SPARSE or HAS_X), "the balanced list is for dense decode")
        w_r, w_c, w_n, w_end, w_chunk, w_lo = mla_work_list(
            QOFF, K_CL, batch, TPT, BN, TARGET, MIN_BLOCKS, B_P2, LIST_ORDER
        )
        item = pid // NHB
        valid, t, w_klo, w_khi, c_tile, slot = mla_find_item(
            w_r, w_c, w_n, w_end, w_chunk, w_lo, item, TPT, LIST_ORDER
        )
        if valid:  # partial rows slot * TPT + i (`worklist`: request order)
            _decode_tile(
                q_args, out_args, k_args, x_args, t, hb, slot * TPT - t, c_tile > 1, w_klo,
                w_khi, H_Q, D_QK, D_V, BM, BN, HPT, TPT, B_P2, False, CAUSAL, HAS_SINK, K_FMT,
                K_AMODE, K_FOLD_T, K_NC, K_CW, K_G, K_E8M0, K_PAGED, K_SPARSE, K_HAS_TOPK,
                K_TOPK_TOK, HAS_X, X_FMT, X_AMODE, X_FOLD_T, X_NC, X_CW, X_G, X_E8M0, X_PAGED,
                X_HAS_TOPK, X_TOPK_TOK, NUM_STAGES, K_PREFETCH, X_PREFETCH, K_ALIGN, X_ALIGN,
                True,
            )  # fmt: skip
    else:
        _decode_tile(
            q_args, out_args, k_args, x_args, pid // NHB, hb, tl.program_id(1), False, 0, 0,
            H_Q, D_QK, D_V, BM, BN, HPT, TPT, B_P2, SPLIT, CAUSAL, HAS_SINK, K_FMT, K_AMODE,
            K_FOLD_T, K_NC, K_CW, K_G, K_E8M0, K_PAGED, K_SPARSE, K_HAS_TOPK, K_TOPK_TOK, HAS_X,
            X_FMT, X_AMODE, X_FOLD_T, X_NC, X_CW, X_G, X_E8M0, X_PAGED, X_HAS_TOPK, X_TOPK_TOK,
            NUM_STAGES, K_PREFETCH, X_PREFETCH, K_ALIGN, X_ALIGN, False,
        )  # fmt: skip


@triton.jit
def _runs(
    q_args, out_args, k_args, x_args, META, p, hb, r_r, r_o, r_q, r_w, r_span, r_incl, size,
    total, use_items, ok, t_i, lo_i, hi_i, c_i, H_Q: tl.constexpr, D_QK: tl.constexpr,
    D_V: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, HPT: tl.constexpr,
    TPT: tl.constexpr, B_P2: tl.constexpr, CAUSAL: tl.constexpr, HAS_SINK: tl.constexpr,
    K_FMT: tl.constexpr, K_AMODE: tl.constexpr, K_FOLD_T: tl.constexpr, K_NC: tl.constexpr,
    K_CW: tl.constexpr, K_G: tl.constexpr, K_E8M0: tl.constexpr, K_PAGED: tl.constexpr,
    K_SPARSE: tl.constexpr, K_HAS_TOPK: tl.constexpr, K_TOPK_TOK: tl.constexpr,
    HAS_X: tl.constexpr, X_FMT: tl.constexpr, X_AMODE: tl.constexpr, X_FOLD_T: tl.constexpr,
    X_NC: tl.constexpr, X_CW: tl.constexpr, X_G: tl.constexpr, X_E8M0: tl.constexpr,
    X_PAGED: tl.constexpr, X_HAS_TOPK: tl.constexpr, X_TOPK_TOK: tl.constexpr,
    NUM_STAGES: tl.constexpr, K_PREFETCH: tl.constexpr, X_PREFETCH: tl.constexpr,
    K_ALIGN: tl.constexpr, X_ALIGN: tl.constexpr, RUN_OVH: tl.constexpr,
):  # fmt: skip
    """Program p's tiles one after the other (`_decode_tile` each), the META of the tiles it
    starts: where `use_items`, its item of the list (ok: it has one; t_i, [lo_i, hi_i) keys,
    c_i items in its tile; partial slot 2 p), else piece p of the contiguous runs
    (`mla_run_stream`: size units a piece)."""
    QOFF = q_args[3]
    batch = q_args[4]
    begin = tl.where(use_items, 0, p.to(tl.int64) * size)
    end = tl.where(use_items, ok.to(tl.int64), tl.minimum(begin + size, total))
    pos = begin
    while pos < end:
        if use_items:
            t = t_i
            n_tok = mla_tile_tokens(QOFF, batch, t_i, TPT, B_P2)
            lo = lo_i
            hi = hi_i
            slot = 2 * p
            n_pieces = c_i
            first = lo_i == 0
            nxt = end
        else:
            t, n_tok, lo_b, hi_b, w_b, b0, b1, slot = mla_run_segment(
                r_r, r_o, r_q, r_w, r_span, r_incl, pos, end, begin, p, TPT, RUN_OVH
            )
            lo = lo_b * BN
            hi = tl.where(lo_b < hi_b, hi_b * BN, lo)
            n_pieces = ((b1 - 1) // size - b0 // size + 1).to(tl.int32)
            first = lo_b == 0
            nxt = b1
        if lo < hi:
            if first & (hb == 0):  # the tile's first item or piece: the combine's META
                mla_run_meta(META, t, n_tok, slot, n_pieces, TPT)
            _decode_tile(
                q_args, out_args, k_args, x_args, t, hb, slot * TPT - t, n_pieces > 1, lo, hi,
                H_Q, D_QK, D_V, BM, BN, HPT, TPT, B_P2, False, CAUSAL, HAS_SINK, K_FMT, K_AMODE,
                K_FOLD_T, K_NC, K_CW, K_G, K_E8M0, K_PAGED, K_SPARSE, K_HAS_TOPK, K_TOPK_TOK,
                HAS_X, X_FMT, X_AMODE, X_FOLD_T, X_NC, X_CW, X_G, X_E8M0, X_PAGED, X_HAS_TOPK,
                X_TOPK_TOK, NUM_STAGES, K_PREFETCH, X_PREFETCH, K_ALIGN, X_ALIGN, True,
            )  # fmt: skip
        pos = nxt


@triton.jit
def _decode_tile(
    q_args, out_args, k_args, x_args, t, hb, part, split, item_lo, item_hi,
    H_Q: tl.constexpr, D_QK: tl.constexpr, D_V: tl.constexpr, BM: tl.constexpr,
    BN: tl.constexpr, HPT: tl.constexpr, TPT: tl.constexpr, B_P2: tl.constexpr,
    SPLIT: tl.constexpr, CAUSAL: tl.constexpr, HAS_SINK: tl.constexpr, K_FMT: tl.constexpr,
    K_AMODE: tl.constexpr, K_FOLD_T: tl.constexpr, K_NC: tl.constexpr, K_CW: tl.constexpr,
    K_G: tl.constexpr, K_E8M0: tl.constexpr, K_PAGED: tl.constexpr, K_SPARSE: tl.constexpr,
    K_HAS_TOPK: tl.constexpr, K_TOPK_TOK: tl.constexpr, HAS_X: tl.constexpr,
    X_FMT: tl.constexpr, X_AMODE: tl.constexpr, X_FOLD_T: tl.constexpr, X_NC: tl.constexpr,
    X_CW: tl.constexpr, X_G: tl.constexpr, X_E8M0: tl.constexpr, X_PAGED: tl.constexpr,
    X_HAS_TOPK: tl.constexpr, X_TOPK_TOK: tl.constexpr, NUM_STAGES: tl.constexpr,
    K_PREFETCH: tl.constexpr, X_PREFETCH: tl.constexpr, K_ALIGN: tl.constexpr,
    X_ALIGN: tl.constexpr, ITEM: tl.constexpr,
):  # fmt: skip
    """One tile of `_mla_decode_kernel`: the BM (token, head) rows of head block hb of the
    tile led by token t over one key range. ITEM: [item_lo, item_hi) of its keys (a balanced
    item or a run's segment); the output (sinks folded), or where `split` (run time)
    normalised partials at rows part + t + i of PO / PL. Else split-K partition `part` of
    NUM_P: the output, or where SPLIT partials at rows part * n_tokens + t + i."""
    Q, stride_qt, stride_qh, QOFF, batch, n_tokens = q_args
    OUT, stride_ot, stride_oh, LSE, PO, PL, SINK, qk_scale, NUM_P = out_args
    (K, K_SC, K_LUT, K_ROFF, K_CL, K_IDX, K_TOPK, K_stride, K_stride_h, K_stride_q, K_sc_stride,
     K_lut_stride, K_ps, K_psr, K_psb, K_psb_h, K_nenc, K_npages, K_idx_stride,
     K_idx_len) = k_args  # fmt: skip
    (X, X_SC, X_IDX, X_TOPK, X_stride, X_stride_h, X_stride_q, X_sc_stride, X_ps, X_psr, X_psb,
     X_psb_h, X_nenc, X_idx_stride, X_idx_len) = x_args  # fmt: skip

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
    q_a = tl.load(qp[:, None] + dA[None, :], mask=row_ok[:, None] & (dA < D_QK)[None, :], other=0.0)
    if D_QK > 512:
        tm = row_ok[:, None] & (512 + dT < D_QK)[None, :]
        q_t = tl.load(qp[:, None] + 512 + dT[None, :], mask=tm, other=0.0)
    else:
        q_t = tl.zeros([BM, 64], Q.dtype.element_ty)

    # Keys of the main operand (positions) and of the extra operand.
    cache_len = tl.load(K_CL + b, mask=live, other=0)
    if K_SPARSE:
        n_main = _topk_len(K_TOPK, K_idx_len, t, b, live, K_HAS_TOPK, K_TOPK_TOK)
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
        n_x = _topk_len(X_TOPK, X_idx_len, t, b, live, X_HAS_TOPK, X_TOPK_TOK)
        n_x = tl.where(live & leader, n_x, 0)
    total = n_main + n_x
    if ITEM:
        lo = item_lo
        hi = tl.minimum(item_hi, total)
    else:
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
    seen = l_i != 0.0  # not > 0: a NaN row sum (a NaN or +inf score) keeps its NaN
    l_safe = tl.where(seen, l_i, 1.0)
    lse = tl.where(seen, (m_i + tl.log2(l_safe)) * LN2, float("-inf"))
    dmask = dA < D_V
    smask = row_ok[:, None] & dmask[None, :]
    if ITEM:
        if split:
            _store_partial(PO, PL, acc, lse, seen, l_safe, part, tok_c, head_c, dA, row_ok,
                           smask, H_Q, D_V)  # fmt: skip
        else:
            _store_out(OUT, stride_ot, stride_oh, LSE, SINK, acc, m_i, lse, seen, l_safe, tok_c,
                       head_c, dA, row_ok, smask, H_Q, HAS_SINK)  # fmt: skip
    elif SPLIT:
        _store_partial(PO, PL, acc, lse, seen, l_safe, part * n_tokens, tok_c, head_c, dA,
                       row_ok, smask, H_Q, D_V)  # fmt: skip
    else:
        _store_out(OUT, stride_ot, stride_oh, LSE, SINK, acc, m_i, lse, seen, l_safe, tok_c,
                   head_c, dA, row_ok, smask, H_Q, HAS_SINK)  # fmt: skip


@triton.jit
def _store_partial(PO, PL, acc, lse, seen, l_safe, base, tok_c, head_c, dA, row_ok, smask,
                   H_Q: tl.constexpr, D_V: tl.constexpr):  # fmt: skip
    """Normalised float32 partials of a tile's rows at rows base + token of PO / PL."""
    inv = tl.where(seen, 1.0 / l_safe, 0.0)
    prow = (base + tok_c) * H_Q + head_c
    tl.store(PO + prow[:, None] * D_V + dA[None, :], acc * inv[:, None], mask=smask)
    tl.store(PL + prow, lse, mask=row_ok)


@triton.jit
def _store_out(OUT, stride_ot, stride_oh, LSE, SINK, acc, m_i, lse, seen, l_safe, tok_c, head_c,
               dA, row_ok, smask, H_Q: tl.constexpr, HAS_SINK: tl.constexpr):  # fmt: skip
    """A tile's output rows (the sink joining the denominator) and their LSE."""
    inv = tl.where(seen, 1.0 / l_safe, 0.0)
    if HAS_SINK:
        sink = tl.load(SINK + head_c, mask=row_ok, other=0.0)
        m_use = tl.where(seen, m_i, 0.0)
        inv = tl.where(seen, 1.0 / (l_safe + tl.exp2(sink * LOG2E - m_use)), 0.0)
    optr = OUT + tok_c[:, None] * stride_ot + head_c[:, None] * stride_oh + dA[None, :]
    tl.store(optr, (acc * inv[:, None]).to(OUT.dtype.element_ty), mask=smask)
    tl.store(LSE + tok_c * H_Q + head_c, lse, mask=row_ok)
