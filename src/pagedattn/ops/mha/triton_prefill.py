"""Triton MHA/GQA prefill / chunked-prefill kernel (flash-attention forward over ragged queries
and a cached prefix).

Grid: one program per (query block of BLOCK_M rows of one request, query head), head fastest so
that the heads of one KV group read the same K/V tiles from L2 at about the same time
(BLOCKS_FASTEST: the blocks of one (request, head) back to back instead, so that the blocks
reading the same K/V run together; a launch knob, `prefill_config`'s "blocks_fastest"). The
block -> (request, block) map is computed in the kernel from `q_row_offsets` (a cumulative sum
of per-request block counts), so the grid is the static upper bound
`min(cdiv(total_q, BLOCK_M) + batch, total_q)` blocks and needs no host sync; programs past the
last block return at once. With REVERSE (causal masks) each request's heaviest block runs first.

Loop bounds are mask-aware: the keys the block's rows can see, [lo(first row), hi(last row)),
split into masked edge tiles and a run of tiles every row sees in full, which skips the mask.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .triton_decode import (
    LN2,
    LOG2E,
    _kv_operand,
    _load_tile,
    _pv_dot,
    _q_to_f16,
    _tile_row0,
    _token_rows,
    _token_scales,
    _visible_range,
)


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
def _block_ranges(cache_len, m0, q_len, kv_len, MASK: tl.constexpr, W, BLOCK_M: tl.constexpr,
                  BLOCK_N: tl.constexpr):  # fmt: skip
    """Key ranges of the query block [m0, m0 + BLOCK_M) of a request (scalars; also called from
    the Gluon kernel): lo_u, the first key any row sees; [start, end), the tiles to visit
    (BLOCK_N-aligned start, empty when the block has no row); [f_lo, f_hi), the aligned run of
    tiles that every row sees in full, inside [start, end) (empty for the tensor mask and for a
    block without rows)."""
    last = cache_len + tl.minimum(m0 + BLOCK_M, q_len) - 1
    first = cache_len + m0
    lo_u, _h0 = _visible_range(first, kv_len, MASK, W)
    _l1, hi_u = _visible_range(last, kv_len, MASK, W)
    lo_f, _h1 = _visible_range(last, kv_len, MASK, W)
    _l2, hi_f = _visible_range(first, kv_len, MASK, W)
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


@triton.jit
def _attn_tile(
    acc,
    m_i,
    l_i,
    q,
    t0,
    offs_n,
    lo_r,
    hi_r,
    b,
    row_ids,
    K,
    stride_kr,
    k_head,
    K_lut,
    stride_klut,
    k_base,
    k_page_stride,
    V,
    stride_vr,
    v_head,
    V_lut,
    stride_vlut,
    v_base,
    v_page_stride,
    KS,
    stride_ksr,
    ks_head,
    VS,
    stride_vsr,
    vs_head,
    MaskT,
    stride_mt,
    mask_cols,
    qk_scale,
    hkv,
    DK: tl.constexpr,
    DKP: tl.constexpr,
    DV: tl.constexpr,
    DVP: tl.constexpr,
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
    MASKED: tl.constexpr,
    K_TMA: tl.constexpr,
    V_TMA: tl.constexpr,
    DOT_PREC: tl.constexpr,
    P_SPLIT: tl.constexpr,
    K_LO: tl.constexpr,
    V_LO: tl.constexpr,
    dtype: tl.constexpr,
):
    """One KV tile [t0, t0 + BLOCK_N) of the online softmax. lo_r/hi_r: [BM] visible ranges;
    MASKED=False for tiles every row sees in full (no per-element mask, all keys valid)."""
    offs_dk = tl.arange(0, DKP)
    offs_dv = tl.arange(0, DVP)
    tok = t0 + offs_n
    if MASKED:
        valid = (tok >= tl.min(lo_r, 0)) & (tok < tl.max(hi_r, 0))
    else:
        valid = tok >= 0
    krows = _token_rows(tok, valid, b, K_lut, stride_klut, k_base, k_page_stride, K_PAGE)
    k_row0 = 0
    if K_TMA:
        k_row0 = _tile_row0(t0, b, K_lut, stride_klut, k_base, k_page_stride, K_PAGE)
    k = _load_tile(K, hkv * DK, krows, k_row0, stride_kr, k_head, valid, offs_dk, DK, DKP, K_TMA)
    k, k_lo = _kv_operand(
        k, KS, krows, stride_ksr, ks_head, valid, offs_dk, K_QUANT, KG, DK, K_E8M0, K_LO, dtype
    )
    s = tl.dot(q, tl.trans(k), input_precision=DOT_PREC)
    if K_LO:
        s = tl.dot(q, tl.trans(k_lo), s, input_precision=DOT_PREC)
    if K_QUANT == 2:
        s = s * _token_scales(KS, krows, stride_ksr, ks_head, valid, K_E8M0)[None, :]
    # m_i is kept in log2 units of the scaled scores; the scale folds into one FMA per score
    # (qk_scale > 0: softmax scale x log2(e) x per-tensor K scale).
    if MASKED:
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

    if V_SAME_ROWS:
        vrows = krows
        v_row0 = k_row0
    else:
        vrows = _token_rows(tok, valid, b, V_lut, stride_vlut, v_base, v_page_stride, V_PAGE)
        v_row0 = 0
        if V_TMA:
            v_row0 = _tile_row0(t0, b, V_lut, stride_vlut, v_base, v_page_stride, V_PAGE)
    v = _load_tile(V, hkv * DV, vrows, v_row0, stride_vr, v_head, valid, offs_dv, DV, DVP, V_TMA)
    v, v_lo = _kv_operand(
        v, VS, vrows, stride_vsr, vs_head, valid, offs_dv, V_QUANT, VG, DV, V_E8M0, V_LO, dtype
    )
    if (MASKED and V_TMA) or V_QUANT != 0:
        # rows past the valid keys may be NaN pools; for FP8 the select also keeps the upcast
        # in registers with wide shared-memory reads (see the decode kernel)
        v = tl.where(valid[:, None], v, 0.0)
    if V_QUANT == 2:
        p = p * _token_scales(VS, vrows, stride_vsr, vs_head, valid, V_E8M0)[None, :]
    acc = acc * alpha[:, None]
    acc = _pv_dot(p, v, acc, dtype, DOT_PREC, P_SPLIT)
    if V_LO:
        acc = tl.dot(p.to(dtype), v_lo, acc, input_precision=DOT_PREC)
    return acc, m_new, l_i


@triton.jit
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
    lo_r, hi_r = _visible_range(pos, kv_len, MASK, mask_param)
    lo_u, start, end, f_lo, f_hi = _block_ranges(
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
        q, qk_scale = _q_to_f16(q, qk_scale)
        dtype = tl.float16
    else:
        dtype = Q.dtype.element_ty
    k_head = hkv * stride_kh
    v_head = hkv * stride_vh
    ks_head = hkv * stride_ksh
    vs_head = hkv * stride_vsh
    k_base = tl.full((), 0, tl.int64)
    v_base = tl.full((), 0, tl.int64)
    if K_PAGE == 0:
        k_base = tl.load(K_off + b).to(tl.int64)
    if V_PAGE == 0:
        v_base = tl.load(V_off + b).to(tl.int64)

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
            acc, m_i, l_i = _attn_tile(
                acc,
                m_i,
                l_i,
                q,
                t0,
                offs_n,
                lo_r,
                hi_r,
                b,
                row_ids,
                K,
                stride_kr,
                k_head,
                K_lut,
                stride_klut,
                k_base,
                k_page_stride,
                V,
                stride_vr,
                v_head,
                V_lut,
                stride_vlut,
                v_base,
                v_page_stride,
                KS,
                stride_ksr,
                ks_head,
                VS,
                stride_vsr,
                vs_head,
                MaskT,
                stride_mt,
                mask_cols,
                qk_scale,
                hkv,
                DK,
                DKP,
                DV,
                DVP,
                K_PAGE,
                V_PAGE,
                V_SAME_ROWS,
                K_QUANT,
                V_QUANT,
                KG,
                VG,
                K_E8M0,
                V_E8M0,
                MASK,
                part != 1,
                K_TMA,
                V_TMA,
                DOT_PREC,
                P_SPLIT,
                K_LO,
                V_LO,
                dtype,
            )

    if V_QUANT == 1:
        acc = acc * tl.load(VS)
    m_fin = tl.where(m_i == float("-inf"), 0.0, m_i)
    den = l_i
    if HAS_SINKS:
        den = den + tl.math.exp2(tl.load(Sinks + hq) * LOG2E - m_fin)
    o = acc / tl.where(den > 0, den, 1.0)[:, None]
    tl.store(
        Out + row_ids[:, None] * stride_ot + hq * stride_oh + offs_dv[None, :],
        o.to(Out.dtype.element_ty),
        mask=row_valid[:, None] & (offs_dv[None, :] < DV),
    )
    if WRITE_LSE:
        lse = tl.where(
            l_i > 0, (m_i + tl.math.log2(tl.where(l_i > 0, l_i, 1.0))) * LN2, float("-inf")
        )
        tl.store(Lse + row_ids * stride_lt + hq * stride_lh, lse, mask=row_valid)
