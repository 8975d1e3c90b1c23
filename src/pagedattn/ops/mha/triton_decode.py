"""Triton MHA/GQA decode kernel: `_mha_decode_kernel`, one program per (query row, split-K
partition, KV head), KV head fastest, or (BALANCED) per (item of the balanced work list
`triton_worklist`, KV head). The dispatcher (`selection.plan`) takes it where every
request has one query.

The `GROUP` query heads of one KV head are packed into the M dimension of the tile (padded to
`GP` rows, `gp_min` 16 by default) so GQA runs on the tensor cores. The row finds its request
itself (one query per request is the fast path), so a ragged batch with total_q == batch is
served too. Its visible keys [lo, hi) are split into `num_partitions` contiguous chunks
(multiples of BLOCK_N); with one partition the kernel writes the final output (sinks folded in),
otherwise normalised partials + LSEs for `triton_combine`.

Inputs: any operand (`triton_tiles`: paged with any page size, row offsets), BF16/FP16/FP32 or
FP8 K/V (per-tensor, per-token, blockwise; float32 or e8m0 scales), every mask of `ops.masks`,
sinks, the LSE. Two loops:
- the general one (`triton_tiles.qk_tile` / `pv_tile`), P carried as a bf16 hi + lo pair
  through P @ V (P_SPLIT) and optionally blockwise K/V too (K_LO / V_LO);
- `_fp8_fast_loop` for FP8 per-token / per-tensor K/V with fp16 MMAs on one page table of
  power-of-two pages (the shipped FP8 choice; its knobs: `selection.fast_flags`).
Launch configurations and their measurements: `selection.decode_config`,
docs/kernels/mha_decode.md.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ..pdl import pdl_signal, pdl_wait
from ..specialize import STEP_INTS
from ..triton_constants import LN2, LOG2E
from .triton_tiles import (
    kv_bases,
    pv_tile,
    q_to_f16,
    qk_tile,
    row_request,
    scales_at,
    visible_range,
)
from .triton_worklist import find_item, merge_items_online, store_merged, work_list


@triton.jit
def e4m3_to_f16_lo(x, ASM: tl.constexpr):
    """e4m3 tile -> float16 tile holding value * 2^-8, with integer ops instead of the
    conversion unit (the caller folds 2^8 into its scales). Exact for every finite e4m3 value
    (subnormals included: e4m3's bias 7 vs fp16's 15 is the 2^-8); the NaN codes 0x7f / 0xff
    become the finite +-1.875 (a garbage row then stays finite, and its probability is 0).

    ASM: PTX (4 bytes -> two f16x2: 2 prmt, 2 and, 2 add, 2 shl); otherwise the same bit
    arithmetic in plain tl (the interpreter has no inline asm)."""
    u = x.to(tl.uint8, bitcast=True)
    if ASM:
        # w = [0, b1, 0, b0] / [0, b3, 0, b2]; w + (w & 0x80) moves the sign from bit 7 to
        # bit 8 of each half (magnitude bits 6..0 stay); << 7 puts sign at 15, eeeemmm at 13..7.
        y = tl.inline_asm_elementwise(
            asm="""{
            .reg .b32 w0, w1, s0, s1;
            prmt.b32 w0, $2, 0, 0x4140;
            prmt.b32 w1, $2, 0, 0x4342;
            and.b32 s0, w0, 0x00800080;
            and.b32 s1, w1, 0x00800080;
            add.u32 w0, w0, s0;
            add.u32 w1, w1, s1;
            shl.b32 $0, w0, 7;
            shl.b32 $1, w1, 7;
            }""",
            constraints="=r,=r,r",
            args=[u],
            dtype=tl.float16,
            is_pure=True,
            pack=4,
        )
    else:
        i = u.to(tl.int32)
        h = (i + (i & 0x80)) << 7
        y = h.to(tl.int16).to(tl.float16, bitcast=True)
    return y


@triton.jit
def _e4m3_to_f16_hw(x, ASM: tl.constexpr):
    """e4m3 tile -> float16 (exact) by the conversion unit, 4 elements an inline-asm call:
    the compiler then packs 4 bytes into one register with byte permutes (instead of
    extract / shift / or per pair) before two cvt.f16x2.e4m3x2. Plain cast without ASM."""
    if ASM:
        y = tl.inline_asm_elementwise(
            asm="""{
            .reg .b16 lo, hi;
            mov.b32 {lo, hi}, $2;
            cvt.rn.f16x2.e4m3x2 $0, lo;
            cvt.rn.f16x2.e4m3x2 $1, hi;
            }""",
            constraints="=r,=r,r",
            args=[x.to(tl.uint8, bitcast=True)],
            dtype=tl.float16,
            is_pure=True,
            pack=4,
        )
    else:
        y = x.to(tl.float16)
    return y


@triton.jit
def _e4m3_to_f16(x, CVT: tl.constexpr, ASM: tl.constexpr):
    """e4m3 tile -> float16: CVT 0 a plain cast, 1 integer ops (`e4m3_to_f16_lo`: value *
    2^-8), 2 the conversion unit through inline asm (`_e4m3_to_f16_hw`)."""
    if CVT == 1:
        y = e4m3_to_f16_lo(x, ASM)
    elif CVT == 2:
        y = _e4m3_to_f16_hw(x, ASM)
    else:
        y = x.to(tl.float16)
    return y


@triton.jit
def _load_rows(ptrs, valid, CLAMP: tl.constexpr):
    """[BN, D] tile at `ptrs`: unmasked where CLAMP (the rows of clamped, always mapped token
    indices), else masked by `valid` rows (zero fill)."""
    if CLAMP:
        x = tl.load(ptrs)
    else:
        x = tl.load(ptrs, mask=valid[:, None], other=0.0)
    return x


@triton.jit
def _perm_cols(x, BN: tl.constexpr, D: tl.constexpr, W: tl.constexpr):
    """x [BN, D] -> x[:, perm] with perm(n) = `_perm_index(n)`: for an fp16 MMA over D output
    columns split across W warps (mma layout warpsPerCTA [1, W]), the columns one thread
    holds in its B operand become D // (8 W) contiguous bytes of a row (one wide shared load
    instead of a byte load per element). D a power of two >= 8 W."""
    y = tl.reshape(x, (BN, W, 8, D // (8 * W)))
    y = tl.permute(y, (0, 3, 1, 2))
    return tl.reshape(y, (BN, D))


@triton.jit
def _perm_index(n, D: tl.constexpr, W: tl.constexpr):
    """The column of x that `_perm_cols` puts at column n."""
    return (n // 8 % W) * (D // W) + (n % 8) * (D // (8 * W)) + n // (8 * W)


@triton.jit
def _perm_cols_t(x, BN: tl.constexpr, D: tl.constexpr, W: tl.constexpr):
    """As `_perm_cols` for V^T as the MMA A operand (the transposed loop): M = D rows over W
    warps (warpsPerCTA [W, 1]), a thread holding rows g + 8 h + 16 w + 16 W r; those become
    contiguous bytes. Column m of the result is column `_perm_index_t(m)` of x."""
    R: tl.constexpr = D // (16 * W)
    y = tl.reshape(x, (BN, W, 8, 2, R))
    y = tl.permute(y, (0, 4, 1, 3, 2))
    return tl.reshape(y, (BN, D))


@triton.jit
def _perm_index_t(m, D: tl.constexpr, W: tl.constexpr):
    """The column of x that `_perm_cols_t` puts at column m."""
    R: tl.constexpr = D // (16 * W)
    r = m // (16 * W)
    w = m // 16 % W
    h = m // 8 % 2
    g = m % 8
    return w * (D // W) + g * (2 * R) + h * R + r


@triton.jit
def _fp8_fast_loop(
    acc,
    m_i,
    l_i,
    q,
    qk_scale,
    p_lo,
    p_hi,
    lo,
    b,
    row64,
    offs_n,
    offs_dk,
    offs_dv,
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
    BLOCK_N: tl.constexpr,
    PAGE: tl.constexpr,
    K_QUANT: tl.constexpr,
    V_QUANT: tl.constexpr,
    K_E8M0: tl.constexpr,
    V_E8M0: tl.constexpr,
    MASK: tl.constexpr,
    ADDR: tl.constexpr,
    LOG2_PAGE: tl.constexpr,
    CLAMP: tl.constexpr,
    V_DELTA: tl.constexpr,
    VS_DELTA: tl.constexpr,
    K_CVT: tl.constexpr,
    V_CVT: tl.constexpr,
    V_SEL: tl.constexpr,
    ASM: tl.constexpr,
    V_PERM: tl.constexpr,
    DV: tl.constexpr,
    TRANS: tl.constexpr,
    NUM_STAGES: tl.constexpr,
):
    """Decode loop for FP8 K/V with per-token / per-tensor scales (fp16 MMAs, q already fp16
    and qk_scale folded), K and V sharing one page table (or none) and power-of-two pages
    (PAGE = 2^LOG2_PAGE, or 0), unpadded head dims. Same math as the generic loop; cheaper
    per-tile work (launch knobs, see `decode_config`):
    - page / in-page index by shift and mask; row offsets as one 32x32->64 multiply-add;
      ADDR 2 (PAGE % BLOCK_N == 0): one scalar page id a tile and loop-invariant row offsets.
    - V_DELTA / VS_DELTA: V (V scales) lie at a fixed element offset from K (K scales) in the
      same storage: their addresses are K's plus a constant (no second address computation).
    - CLAMP: tokens outside [lo, p_hi) load the nearest visible token's row (always mapped,
      always finite) instead of masked loads; their scores are still masked to -inf, so
      their probabilities (and P x V contributions) are exactly 0.
    - K_CVT / V_CVT: e4m3 -> fp16 upcast: 0 a plain cast, 1 integer ops (`e4m3_to_f16_lo`,
      value * 2^-8; 2^8 folds into qk_scale / the final acc), 2 the conversion unit through
      inline asm (`_e4m3_to_f16_hw`).
    - V_SEL: the select that makes the compiler upcast V in registers (see the generic loop).
    - V_PERM = W > 0: V's columns (and so acc's) permuted by `_perm_cols` for W warps: V's MMA
      operand comes from shared memory by wide loads, without V_SEL's fp16 staging copy.
    - TRANS: scores^T = K q^T and acc^T += V^T p^T, so that keys (and head dims) are the MMA's
      M and the few query heads its N (n8 tiles instead of m16 ones: half the MMAs, and q is
      the small B operand).
    Returns (acc, m_i, l_i) as the generic loop does."""
    if K_CVT == 1:
        qk_scale = qk_scale * 256.0
    lut_b = K_lut + b * stride_klut
    kp_el = k_page_stride * stride_kr  # int32: host-checked
    vp_el = v_page_stride * stride_vr
    ksp_el = k_page_stride * stride_ksr
    vsp_el = v_page_stride * stride_vsr
    MASKED: tl.constexpr = not CLAMP
    if TRANS:
        qt = tl.trans(q)
        acc_t = tl.trans(acc)
    for t0 in tl.range(p_lo, p_hi, BLOCK_N, num_stages=NUM_STAGES):
        tok = t0 + offs_n
        valid = (tok >= lo) & (tok < p_hi)
        if CLAMP:
            tk = tl.minimum(tl.maximum(tok, lo), p_hi - 1)
        else:
            tk = tok
        # Element offsets (int64 [BN]) of each token's row of this KV head in K / V / scales.
        if PAGE == 0:
            koff = (k_base + tk) * stride_kr + k_head
            voff = (v_base + tk) * stride_vr + v_head
            ksoff = (k_base + tk) * stride_ksr + ks_head
            vsoff = (v_base + tk) * stride_vsr + vs_head
        elif ADDR == 2:
            # The tile lies inside one page: a scalar page id, row offsets relative to t0.
            pg = tl.load(lut_b + (t0 >> LOG2_PAGE)).to(tl.int64)
            r0 = t0 & (PAGE - 1)
            if CLAMP:
                rel = tk - t0
            else:
                rel = offs_n
            koff = (pg * kp_el + (r0 * stride_kr + k_head)) + rel * stride_kr
            voff = (pg * vp_el + (r0 * stride_vr + v_head)) + rel * stride_vr
            ksoff = (pg * ksp_el + (r0 * stride_ksr + ks_head)) + rel * stride_ksr
            vsoff = (pg * vsp_el + (r0 * stride_vsr + vs_head)) + rel * stride_vsr
        else:
            if CLAMP:
                pgv = tl.load(lut_b + (tk >> LOG2_PAGE))
            else:
                pgv = tl.load(lut_b + (tk >> LOG2_PAGE), mask=valid, other=0)
            pgv = pgv.to(tl.int64)
            r_in = tk & (PAGE - 1)
            koff = pgv * kp_el + (r_in * stride_kr + k_head)
            voff = pgv * vp_el + (r_in * stride_vr + v_head)
            ksoff = pgv * ksp_el + (r_in * stride_ksr + ks_head)
            vsoff = pgv * vsp_el + (r_in * stride_vsr + vs_head)
        kptrs = K + koff[:, None] + offs_dk[None, :]
        if V_DELTA is not None:
            vptrs = kptrs + V_DELTA
        else:
            vptrs = V + voff[:, None] + offs_dv[None, :]
        k = _e4m3_to_f16(_load_rows(kptrs, valid, CLAMP), K_CVT, ASM)
        keep = valid
        if MASK == 5:
            mt = tl.load(MaskT + row64 * stride_mt + tok, mask=valid & (tok < mask_cols), other=0)
            keep = keep & (mt != 0)
        if TRANS:  # scores^T [BN, GP] = K q^T: keys are the MMA's M, the heads its N
            st = tl.dot(k, qt)
            if K_QUANT == 2:
                st = st * scales_at(KS, ksoff, valid, K_E8M0, MASKED)[:, None]
            st = tl.where(keep[:, None], st, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(st, 0) * qk_scale)
            m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
            alpha = tl.math.exp2(m_i - m_use)
            p = tl.math.exp2(st * qk_scale - m_use[None, :])
            l_i = l_i * alpha + tl.sum(p, 0)
        else:
            s = tl.dot(q, tl.trans(k))
            if K_QUANT == 2:
                s = s * scales_at(KS, ksoff, valid, K_E8M0, MASKED)[None, :]
            s = tl.where(keep[None, :], s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale)
            m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
            alpha = tl.math.exp2(m_i - m_use)
            p = tl.math.exp2(s * qk_scale - m_use[:, None])
            l_i = l_i * alpha + tl.sum(p, 1)

        v8 = _load_rows(vptrs, valid, CLAMP)
        if V_PERM:
            if TRANS:
                v8 = _perm_cols_t(v8, BLOCK_N, DV, V_PERM)
            else:
                v8 = _perm_cols(v8, BLOCK_N, DV, V_PERM)
        v = _e4m3_to_f16(v8, V_CVT, ASM)
        if V_SEL:
            v = tl.where(valid[:, None], v, 0.0)
        if V_QUANT == 2:
            if VS_DELTA is not None:
                vs = scales_at(KS, ksoff + VS_DELTA, valid, V_E8M0, MASKED)
            else:
                vs = scales_at(VS, vsoff, valid, V_E8M0, MASKED)
            if TRANS:
                p = p * vs[:, None]
            else:
                p = p * vs[None, :]
        if TRANS:  # acc^T [DV, GP] += V^T p^T
            acc_t = acc_t * alpha[None, :]
            acc_t = tl.dot(tl.trans(v), p.to(tl.float16), acc_t)
        else:
            acc = acc * alpha[:, None]
            acc = tl.dot(p.to(tl.float16), v, acc)
        m_i = m_new
    if TRANS:
        acc = tl.trans(acc_t)
    if V_CVT == 1:
        acc = acc * 256.0
    return acc, m_i, l_i


@triton.jit(do_not_specialize=STEP_INTS)
def _mha_decode_kernel(
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
    PO,
    PL,
    num_partitions,
    sm_scale_log2,
    Plan,
    Sem,
    H_KV: tl.constexpr,
    GROUP: tl.constexpr,
    GP: tl.constexpr,
    DK: tl.constexpr,
    DKP: tl.constexpr,
    DV: tl.constexpr,
    DVP: tl.constexpr,
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
    SPLIT: tl.constexpr,
    WRITE_LSE: tl.constexpr,
    K_TMA: tl.constexpr,
    V_TMA: tl.constexpr,
    DOT_PREC: tl.constexpr,
    P_SPLIT: tl.constexpr,
    MMA_F16: tl.constexpr,
    K_LO: tl.constexpr,
    V_LO: tl.constexpr,
    BLOCK_B: tl.constexpr,
    NUM_STAGES: tl.constexpr,
    FAST: tl.constexpr = False,
    ADDR: tl.constexpr = 1,
    LOG2_PAGE: tl.constexpr = 0,
    CLAMP: tl.constexpr = False,
    V_DELTA: tl.constexpr = None,
    VS_DELTA: tl.constexpr = None,
    K_CVT: tl.constexpr = 0,
    V_CVT: tl.constexpr = 0,
    V_SEL: tl.constexpr = True,
    ASM: tl.constexpr = False,
    V_PERM: tl.constexpr = 0,
    TRANS: tl.constexpr = False,
    PDL: tl.constexpr = False,
    BALANCED: tl.constexpr = False,
    TARGET: tl.constexpr = 1,
    MIN_BLOCKS: tl.constexpr = 1,
    PLAN: tl.constexpr = False,
    FUSED: tl.constexpr = False,
    MERGE_GP: tl.constexpr = 1,
    MERGE_STAGES: tl.constexpr = 1,
    LIST_ORDER: tl.constexpr = 0,
    PDL_WAIT: tl.constexpr = False,
):
    """One (query row, partition, KV head): GROUP query heads x the partition's keys.

    Q [total_q, h_q, DK]; Out [total_q, h_q, DV] (q dtype); Lse [total_q, h_q] f32;
    PO [total_q, h_q, P, DV] f32 / PL [total_q, h_q, P] f32 partials when SPLIT.
    BALANCED: one (work item, KV head) instead (`triton_worklist`: the grid is (TARGET +
    batch) x H_KV, programs past the list exit); a row of several items writes partials
    PO [items, h_q, DV] / PL [items, h_q] at its items, a row of one the output. PLAN (with
    BALANCED): the items come from a step's plan (`work_plan`, int32 Plan: n_items, then
    (row, k_lo, k_hi, n_row) an item from word 8) instead of the kernel's own list, whose
    order is LIST_ORDER's (`triton_worklist.work_list`).
    FUSED (with BALANCED): a split row's items merge in this launch, no combine launch: each
    item, after writing its partials, counts itself on the int32 Sem [rows, H_KV] (zero
    before the launch, `ops.prepared.semaphores`); the row's last item to count merges every
    item (`triton_worklist.merge_items_online`: one item's MERGE_GP heads a step, loads
    MERGE_STAGES deep), writes the output and LSE, and sets the count back to 0.
    PDL_WAIT: launched as a link of the PDL chain (`ops.pdl.pdl_chain_kwargs`): nothing is read
    or written before the wait.
    """
    pdl_wait(PDL_WAIT)
    pdl_signal(PDL)  # the combine may launch (it waits for this grid before reading)
    pid = tl.program_id(0)
    hkv = pid % H_KV
    rest = pid // H_KV
    if PLAN:
        # a grid larger than the plan's items (a device plan's: its capacity) exits its first
        # programs (docs/kernels/mha_decode.md, "the step's plan": the grid's size, not the
        # order, costs a step)
        rest -= tl.num_programs(0) // H_KV - tl.load(Plan)
        if rest < 0:
            return
        at = Plan + 8 + 4 * rest
        row = tl.load(at)
        k_lo = tl.load(at + 1)
        k_hi = tl.load(at + 2)
        n_row = tl.load(at + 3)
        split = n_row > 1
    elif BALANCED:
        w_r, w_n, w_end, w_lo, w_chunk = work_list(
            cache_lens, q_offsets, batch, mask_param, MASK, BLOCK_N, TARGET, MIN_BLOCKS, BLOCK_B,
            LIST_ORDER,
        )  # fmt: skip
        if rest >= tl.sum(w_n, 0):
            return
        row, n_row, part, _w_lo, chunk = find_item(w_r, w_n, w_end, w_lo, w_chunk, rest)
        split = n_row > 1
    else:
        part = rest % num_partitions
        row = rest // num_partitions
        split = SPLIT

    b, o_lo, o_hi = row_request(q_offsets, batch, row, BLOCK_B, False)
    cache_len = tl.load(cache_lens + b)
    kv_len = cache_len + (o_hi - o_lo)
    pos = cache_len + (row - o_lo)
    lo, hi = visible_range(pos, kv_len, MASK, mask_param)
    # Split [lo, hi) into num_partitions chunks of whole tiles (tile starts BLOCK_N-aligned).
    lo_al = (lo // BLOCK_N) * BLOCK_N
    if PLAN:  # the item's keys, within the row's (the last item: to the row's end)
        p_lo = tl.maximum(lo_al, k_lo)
        p_hi = tl.where(k_hi < 0, hi, tl.minimum(k_hi, hi))
    else:
        if BALANCED:  # the item's chunk of `chunk` tiles (a row of one item: all of it)
            per = tl.where(split, chunk * BLOCK_N, tl.maximum(hi - lo_al, 0))
        else:
            per = tl.cdiv(tl.cdiv(tl.maximum(hi - lo_al, 0), num_partitions), BLOCK_N) * BLOCK_N
        p_lo = lo_al + part * per
        p_hi = tl.minimum(p_lo + per, hi)

    offs_g = tl.arange(0, GP)
    offs_n = tl.arange(0, BLOCK_N)
    offs_dk = tl.arange(0, DKP)
    offs_dv = tl.arange(0, DVP)
    gmask = offs_g < GROUP
    hq = hkv * GROUP + offs_g
    row64 = row.to(tl.int64)
    q = tl.load(
        Q + row64 * stride_qt + hq[:, None] * stride_qh + offs_dk[None, :],
        mask=gmask[:, None] & (offs_dk[None, :] < DK),
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

    m_i = tl.full([GP], float("-inf"), tl.float32)
    l_i = tl.zeros([GP], tl.float32)
    acc = tl.zeros([GP, DVP], tl.float32)
    if FAST:
        acc, m_i, l_i = _fp8_fast_loop(
            acc, m_i, l_i, q, qk_scale, p_lo, p_hi, lo, b, row64, offs_n, offs_dk, offs_dv,
            K, stride_kr, k_head, K_lut, stride_klut, k_base, k_page_stride,
            V, stride_vr, v_head, v_base, v_page_stride,
            KS, stride_ksr, ks_head, VS, stride_vsr, vs_head, MaskT, stride_mt, mask_cols,
            BLOCK_N, K_PAGE, K_QUANT, V_QUANT, K_E8M0, V_E8M0, MASK, ADDR, LOG2_PAGE, CLAMP,
            V_DELTA, VS_DELTA, K_CVT, V_CVT, V_SEL, ASM, V_PERM, DV, TRANS, NUM_STAGES,
        )  # fmt: skip
    else:
        kop = (K, stride_kr, k_head, K_lut, stride_klut, k_base, k_page_stride, KS, stride_ksr,
               ks_head)  # fmt: skip
        vop = (V, stride_vr, v_head, V_lut, stride_vlut, v_base, v_page_stride, VS, stride_vsr,
               vs_head)  # fmt: skip
        for t0 in tl.range(p_lo, p_hi, BLOCK_N, num_stages=NUM_STAGES):
            tok = t0 + offs_n
            valid = (tok >= lo) & (tok < p_hi)
            s, krows, k_row0 = qk_tile(
                q, t0, tok, valid, b, hkv, kop, offs_dk, DK, DKP, K_PAGE, K_QUANT, KG, K_E8M0,
                K_TMA, K_LO, DOT_PREC, dtype,
            )  # fmt: skip
            keep = valid[None, :]
            if MASK == 5:
                mt = tl.load(
                    MaskT + row64 * stride_mt + tok, mask=valid & (tok < mask_cols), other=0
                )
                keep = keep & (mt != 0)[None, :]
            s = tl.where(keep, s, float("-inf"))
            # log2 units of the scaled scores; qk_scale > 0 folds into one FMA per score
            m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale)
            m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
            alpha = tl.math.exp2(m_i - m_use)
            p = tl.math.exp2(s * qk_scale - m_use[:, None])
            l_i = l_i * alpha + tl.sum(p, 1)
            # (TMA boxes may hold rows past the valid keys, NaN pools: V's are zeroed)
            acc = pv_tile(acc, p, alpha, t0, tok, valid, b, hkv, krows, k_row0, vop, offs_dv, DV,
                          DVP, V_PAGE, V_SAME_ROWS, V_QUANT, VG, V_E8M0, V_TMA, V_LO, True,
                          DOT_PREC, P_SPLIT, dtype)  # fmt: skip
            m_i = m_new

    if V_QUANT == 1:
        acc = acc * tl.load(VS)
    m_fin = tl.where(m_i == float("-inf"), 0.0, m_i)
    # l_i != 0 (not > 0): a NaN row sum (a NaN or +inf score) keeps its NaN, in the LSE too
    lse = tl.where(l_i != 0, (m_i + tl.math.log2(tl.where(l_i != 0, l_i, 1.0))) * LN2,
                   float("-inf"))  # fmt: skip
    hq64 = hq.to(tl.int64)
    offs_out = offs_dv
    if V_PERM:  # acc columns are V's columns permuted by `_perm_cols` / `_perm_cols_t`
        if TRANS:
            offs_out = _perm_index_t(offs_dv, DVP, V_PERM)
        else:
            offs_out = _perm_index(offs_dv, DVP, V_PERM)
    if split:
        o = acc / tl.where(l_i != 0, l_i, 1.0)[:, None]
        if BALANCED:
            pbase = rest.to(tl.int64) * (H_KV * GROUP) + hq64
        else:
            pbase = (row64 * (H_KV * GROUP) + hq64) * num_partitions + part
        tl.store(
            PO + pbase[:, None] * DV + offs_out[None, :],
            o,
            mask=gmask[:, None] & (offs_dv[None, :] < DV),
        )
        tl.store(PL + pbase, lse, mask=gmask)
        if FUSED:
            if PLAN:  # (the plan's request table: first item, items)
                first = tl.load(Plan + 8 + 4 * tl.load(Plan + 3) + 2 * row)
            else:
                first = rest - part
            # every thread's partial stores precede the count (bar.sync, then one thread's
            # acq_rel atomic at GPU scope: CUDA's grid-sync pattern); the last item's loads
            # follow its count and bypass L1
            tl.debug_barrier()
            at_sem = Sem + row64 * H_KV + hkv
            if tl.atomic_add(at_sem, 1, sem="acq_rel", scope="gpu") == n_row - 1:
                tl.store(at_sem, 0)
                offs_m = tl.arange(0, DVP)
                mo, lse2, den, mhq, mg, md = merge_items_online(
                    PO, PL, first, n_row, hkv, offs_m, H_KV * GROUP, GROUP, MERGE_GP, DV,
                    MERGE_STAGES,
                )  # fmt: skip
                store_merged(mo, lse2, den, row, mhq, mg, offs_m, md, Sinks, Out, stride_ot,
                             stride_oh, Lse, stride_lt, stride_lh, HAS_SINKS, WRITE_LSE,
                             True)  # fmt: skip
    else:
        den = l_i
        if HAS_SINKS:
            sink = tl.load(Sinks + hq, mask=gmask, other=float("-inf")) * LOG2E
            den = den + tl.math.exp2(sink - m_fin)
        o = acc / tl.where(l_i != 0, den, 1.0)[:, None]  # a row with no key: 0, any sink
        tl.store(
            Out + row64 * stride_ot + hq64[:, None] * stride_oh + offs_out[None, :],
            o.to(Out.dtype.element_ty),
            mask=gmask[:, None] & (offs_dv[None, :] < DV),
        )
        if WRITE_LSE:
            tl.store(Lse + row64 * stride_lt + hq64 * stride_lh, lse, mask=gmask)
