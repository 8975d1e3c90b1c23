"""Triton MHA/GQA prefill / chunked-prefill kernel `_mha_prefill_kernel` (flash-attention
forward over ragged queries and a cached prefix). The dispatcher (`selection.plan`) takes it for
every launch with more than one query a request that no Gluon sm_90 prefill serves: FP8 K/V,
tensor masks, head dims other than 64 / 128 or d_qk != d_v, FP32, devices other than sm_90, or
a `gluon` False override. Any operand, mask, sinks, the LSE; never split along K.

Grid: one program per (query block of BLOCK_M rows of one request, query head), head fastest so
that the heads of one KV group read the same K/V tiles from L2 at about the same time
(BLOCKS_FASTEST: the blocks of one (request, head) back to back instead, so that the blocks
reading the same K/V run together; `PrefillConfig.blocks_fastest`, shipped on). The
block -> (request, block) map is computed in the kernel from `q_row_offsets` (a cumulative sum
of per-request block counts), so the grid is the static upper bound
`min(cdiv(total_q, BLOCK_M) + batch, total_q)` blocks and needs no host sync; programs past the
last block return at once. With REVERSE (causal masks) each request's heaviest block runs first.

Loop bounds are mask-aware: the keys the block's rows can see, [lo(first row), hi(last row)),
split into masked edge tiles and a run of tiles every row sees in full, which skips the mask.
P is rounded to q's dtype before P @ V (FlashAttention's numerics; `hi_lo` carries a hi + lo
pair). Tiles and measurements: `selection.prefill_config`, docs/kernels/mha_prefill.md.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ..specialize import INDEX_VIEWS, STEP_INTS
from ..triton_constants import LN2, LOG2E
from .triton_tiles import kv_bases, pv_tile, q_to_f16, qk_tile, visible_range


@triton.jit
def _find_block(offsets, batch, tile, BLOCK_M: tl.constexpr, BLOCK_B: tl.constexpr):
    """(request b, its first global block) of global query block `tile`; b == batch past the
    end. Blocks of request r: cdiv(q_len(r), BLOCK_M)."""
    cnt = tl.full((), 0, tl.int32)
    before = tl.full((), 0, tl.int32)
    carry = tl.full((), 0, tl.int32)
    for c in range(0, batch, BLOCK_B):
        o = c + tl.arange(0, BLOCK_B)
        m = o < batch
        lo = tl.load(offsets + o, mask=m, other=0)
        hi = tl.load(offsets + o + 1, mask=m, other=0)
        nb = tl.cdiv(hi - lo, BLOCK_M)
        cum = tl.cumsum(nb, 0) + carry
        done = (cum <= tile) & m
        cnt += tl.sum(done.to(tl.int32), 0)
        before += tl.sum(tl.where(done, nb, 0), 0)
        carry += tl.sum(nb, 0)
    return cnt, before


@triton.jit
def block_ranges(cache_len, m0, q_len, kv_len, MASK: tl.constexpr, W, BLOCK_M: tl.constexpr,
                  BLOCK_N: tl.constexpr):  # fmt: skip
    """Key ranges of the query block [m0, m0 + BLOCK_M) of a request (scalars; also called from
    the Gluon kernel): lo_u, the first key any row sees; [start, end), the tiles to visit
    (BLOCK_N-aligned start, empty when the block has no row); [f_lo, f_hi), the aligned run of
    tiles that every row sees in full, inside [start, end) (empty for the tensor mask and for a
    block without rows)."""
    last = cache_len + tl.minimum(m0 + BLOCK_M, q_len) - 1
    first = cache_len + m0
    lo_u, _h0 = visible_range(first, kv_len, MASK, W)
    _l1, hi_u = visible_range(last, kv_len, MASK, W)
    lo_f, _h1 = visible_range(last, kv_len, MASK, W)
    _l2, hi_f = visible_range(first, kv_len, MASK, W)
    start = (lo_u // BLOCK_N) * BLOCK_N
    end = tl.where(q_len > m0, hi_u, start)
    if MASK == 5:
        f_lo = start
        f_hi = start
    else:
        f_lo = tl.minimum(
            tl.maximum(tl.cdiv(lo_f, BLOCK_N) * BLOCK_N, start), tl.cdiv(end, BLOCK_N) * BLOCK_N
        )
        # (min with end: a no-op for a block with rows, hi_f <= end; empty for one without,
        # whose first position may still see keys)
        f_hi = tl.maximum(tl.minimum((hi_f // BLOCK_N) * BLOCK_N, end), f_lo)
    return lo_u, start, end, f_lo, f_hi


@triton.jit(do_not_specialize=STEP_INTS, do_not_specialize_on_alignment=INDEX_VIEWS)
def _mha_prefill_kernel(
    Q,
    stride_qt,
    stride_qh,
    K,
    stride_kr,
    stride_kh,
    K_lut,
    stride_klut,
    K_off,
    k_page_stride,
    V,
    stride_vr,
    stride_vh,
    V_lut,
    stride_vlut,
    V_off,
    v_page_stride,
    KS,
    stride_ksr,
    stride_ksh,
    VS,
    stride_vsr,
    stride_vsh,
    cache_lens,
    q_offsets,
    batch,
    Sinks,
    MaskT,
    stride_mt,
    mask_cols,
    mask_param,
    Out,
    stride_ot,
    stride_oh,
    Lse,
    stride_lt,
    stride_lh,
    sm_scale_log2,
    H_Q: tl.constexpr,
    GROUP: tl.constexpr,
    DK: tl.constexpr,
    DKP: tl.constexpr,
    DV: tl.constexpr,
    DVP: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    K_PAGE: tl.constexpr,
    V_PAGE: tl.constexpr,
    V_SAME_ROWS: tl.constexpr,
    K_QUANT: tl.constexpr,
    V_QUANT: tl.constexpr,
    KG: tl.constexpr,
    VG: tl.constexpr,
    K_E8M0: tl.constexpr,
    V_E8M0: tl.constexpr,
    MASK: tl.constexpr,
    HAS_SINKS: tl.constexpr,
    WRITE_LSE: tl.constexpr,
    REVERSE: tl.constexpr,
    K_TMA: tl.constexpr,
    V_TMA: tl.constexpr,
    DOT_PREC: tl.constexpr,
    P_SPLIT: tl.constexpr,
    MMA_F16: tl.constexpr,
    K_LO: tl.constexpr,
    V_LO: tl.constexpr,
    BLOCK_B: tl.constexpr,
    NUM_STAGES: tl.constexpr,
    BLOCKS_FASTEST: tl.constexpr = False,
):
    """Q [total_q, H_Q, DK] -> Out [total_q, H_Q, DV] (q dtype), Lse [total_q, H_Q] f32."""
    pid = tl.program_id(0)
    hq = pid % H_Q
    tile = pid // H_Q
    b, before = _find_block(q_offsets, batch, tile, BLOCK_M, BLOCK_B)
    if b >= batch:
        return
    q_start = tl.load(q_offsets + b)
    q_len = tl.load(q_offsets + b + 1) - q_start
    blk = tile - before
    if BLOCKS_FASTEST:
        # Request b owns programs [before * H_Q, (before + nb) * H_Q) in either order; here
        # its blocks run fastest (all blocks of one head back to back: they share K/V in L2).
        nb = tl.cdiv(q_len, BLOCK_M)
        local = pid - before * H_Q
        hq = local // nb
        blk = local % nb
    hkv = hq // GROUP
    if REVERSE:
        blk = tl.cdiv(q_len, BLOCK_M) - 1 - blk
    m0 = blk * BLOCK_M
    cache_len = tl.load(cache_lens + b)
    kv_len = cache_len + q_len

    offs_m = m0 + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_dk = tl.arange(0, DKP)
    offs_dv = tl.arange(0, DVP)
    row_valid = offs_m < q_len
    row_ids = (q_start + offs_m).to(tl.int64)
    pos = cache_len + offs_m
    lo_r, hi_r = visible_range(pos, kv_len, MASK, mask_param)
    lo_u, start, end, f_lo, f_hi = block_ranges(
        cache_len, m0, q_len, kv_len, MASK, mask_param, BLOCK_M, BLOCK_N
    )
    # Per-row ranges only for rows that exist (padding rows read nothing beyond the union).
    lo_r = tl.where(row_valid, lo_r, lo_u)
    hi_r = tl.where(row_valid, hi_r, lo_u)

    q = tl.load(
        Q + row_ids[:, None] * stride_qt + hq * stride_qh + offs_dk[None, :],
        mask=row_valid[:, None] & (offs_dk[None, :] < DK),
        other=0.0,
    )
    qk_scale = sm_scale_log2
    if K_QUANT == 1:
        qk_scale = qk_scale * tl.load(KS)
    if MMA_F16:  # FP8 K/V with per-token / per-tensor scales: fp16 MMAs
        q, qk_scale = q_to_f16(q, qk_scale)
        dtype = tl.float16
    else:
        dtype = Q.dtype.element_ty
    k_head = hkv * stride_kh
    v_head = hkv * stride_vh
    ks_head = hkv * stride_ksh
    vs_head = hkv * stride_vsh
    k_base, v_base = kv_bases(K_off, V_off, b, K_PAGE, V_PAGE)
    kop = (K, stride_kr, k_head, K_lut, stride_klut, k_base, k_page_stride, KS, stride_ksr,
           ks_head)  # fmt: skip
    vop = (V, stride_vr, v_head, V_lut, stride_vlut, v_base, v_page_stride, VS, stride_vsr,
           vs_head)  # fmt: skip

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, DVP], tl.float32)
    # Three runs of KV tiles, unrolled at compile time into three loops: the masked leading
    # edge (sliding windows, chunks), the tiles every row sees in full (no mask), the masked
    # trailing edge (the diagonal, the last partial tile).
    for part in tl.static_range(3):
        if part == 0:
            t_lo = start
            t_hi = f_lo
        elif part == 1:
            t_lo = f_lo
            t_hi = f_hi
        else:
            t_lo = f_hi
            t_hi = end
        for t0 in tl.range(t_lo, t_hi, BLOCK_N, num_stages=NUM_STAGES):
            # one KV tile [t0, t0 + BLOCK_N) of the online softmax; the edges (part != 1) are
            # masked, the run of tiles every row sees in full (all keys valid) is not
            tile_dk = tl.arange(0, DKP)
            tile_dv = tl.arange(0, DVP)
            tok = t0 + offs_n
            if part != 1:
                valid = (tok >= tl.min(lo_r, 0)) & (tok < tl.max(hi_r, 0))
            else:
                valid = tok >= 0
            s, krows, k_row0 = qk_tile(
                q, t0, tok, valid, b, hkv, kop, tile_dk, DK, DKP, K_PAGE, K_QUANT, KG, K_E8M0,
                K_TMA, K_LO, DOT_PREC, dtype,
            )  # fmt: skip
            # m_i is kept in log2 units of the scaled scores; the scale folds into one FMA per
            # score (qk_scale > 0: softmax scale x log2(e) x per-tensor K scale).
            if part != 1:
                keep = (tok[None, :] >= lo_r[:, None]) & (tok[None, :] < hi_r[:, None])
                if MASK == 5:
                    mt = tl.load(
                        MaskT + row_ids[:, None] * stride_mt + tok[None, :],
                        mask=keep & (tok[None, :] < mask_cols),
                        other=0,
                    )
                    keep = keep & (mt != 0)
                s = tl.where(keep, s, float("-inf"))
                m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale)
                m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
            else:
                m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale)
                m_use = m_new
            alpha = tl.math.exp2(m_i - m_use)
            p = tl.math.exp2(s * qk_scale - m_use[:, None])
            l_i = l_i * alpha + tl.sum(p, 1)
            # (TMA boxes of masked tiles may hold rows past the valid keys, NaN pools: zeroed)
            acc = pv_tile(acc, p, alpha, t0, tok, valid, b, hkv, krows, k_row0, vop, tile_dv, DV,
                          DVP, V_PAGE, V_SAME_ROWS, V_QUANT, VG, V_E8M0, V_TMA, V_LO, part != 1,
                          DOT_PREC, P_SPLIT, dtype)  # fmt: skip
            m_i = m_new

    if V_QUANT == 1:
        acc = acc * tl.load(VS)
    m_fin = tl.where(m_i == float("-inf"), 0.0, m_i)
    den = l_i
    if HAS_SINKS:
        den = den + tl.math.exp2(tl.load(Sinks + hq) * LOG2E - m_fin)
    o = acc / tl.where(l_i != 0, den, 1.0)[:, None]  # a row with no key: 0, any sink
    tl.store(
        Out + row_ids[:, None] * stride_ot + hq * stride_oh + offs_dv[None, :],
        o.to(Out.dtype.element_ty),
        mask=row_valid[:, None] & (offs_dv[None, :] < DV),
    )
    if WRITE_LSE:
        # l_i != 0 (not > 0): a NaN row sum (a NaN or +inf score) keeps its NaN
        lse = tl.where(
            l_i != 0, (m_i + tl.math.log2(tl.where(l_i != 0, l_i, 1.0))) * LN2, float("-inf")
        )
        tl.store(Lse + row_ids * stride_lt + hq * stride_lh, lse, mask=row_valid)
