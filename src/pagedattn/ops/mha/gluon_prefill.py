"""Gluon (sm_90) MHA/GQA prefill: flash-attention forward whose P V product runs on the
tensor cores under the softmax of the next tile (`_mha_prefill_sm90`), and the helpers it shares
with the warp-specialized `gluon_prefill_ws`.

Same contract, grid and block order as `triton_prefill._mha_prefill_kernel` (one program per
(query block of one request, query head), each request's heaviest block first under causal
masks, the blocks of one head back to back). For BF16/FP16 K/V without quantization, head dim
64 or 128 (d_qk == d_v), every mask except the tensor mask, sinks and the LSE. The dispatcher
(`selection.sm90_prefill_serves`) takes it on sm_90 for paged caches whose tiles are not TMA
boxes (pages of 1, or of sizes that do not divide 128), or when a tuning override asks; the rest
go to `gluon_prefill_ws` (H100, causal 8 x 4096 d128: 352 vs 317 TFLOP/s for the tl kernel at
pages of 16).

Per program, num_warps warps of 16 query rows each (8 warps: 2 warpgroups, 128 rows); tiles
of BLOCK_N keys in an NBUF-deep ring (NBUF >= 3): iteration j fills tile j + NBUF - 2 into
tile j - 2's stage, freed by the iteration's barrier.
- TMA: where a tile stays in one page (pages a multiple of BLOCK_N, or row-offset K/V), one
  [BLOCK_N, D] box each of K and V, completing on the stage's mbarrier. Boxes copy rows past
  the keys too: masked for K, zeroed in the last V tile (unwritten cache slots may be NaN).
- cp.async otherwise (any page size, NHD or HND), rows past the keys zero-filled.
- Iteration j issues S_j = Q K_j^T and O += P_{j-1} V_{j-1} (P from registers, wgmma's
  register A operand: no shared-memory round trip), waits for S_j alone, runs the softmax of
  tile j while the P V product still runs, then rescales O.
- Tiles that every row sees in full run a loop without the per-element mask.
Limit: both warpgroups meet at the ring's CTA barrier every tile, so their softmaxes line up;
`gluon_prefill_ws` removes that barrier. Measurements and ncu analysis:
docs/kernels/gluon_prefill.md."""

from __future__ import annotations

from ..gluon_imports import (
    HAS_GLUON,
    cp,
    fence_async_shared,
    gl,
    gluon,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)
from ..specialize import INDEX_VIEWS, STEP_INTS
from ..triton_constants import LN2, LOG2E
from .triton_prefill import block_ranges
from .triton_tiles import visible_range

if HAS_GLUON:

    @gluon.jit
    def _g_add(a, b):
        return a + b

    @gluon.jit
    def _g_find_block(offsets, batch, tile, BLOCK_M: gl.constexpr, BLOCK_B: gl.constexpr,
                      one_l: gl.constexpr):  # fmt: skip
        """(request b, its first global block) of global query block `tile`; b == batch past
        the end. Blocks of request r: cdiv(q_len(r), BLOCK_M) (as `_find_block`)."""
        cnt = gl.to_tensor(0)
        before = gl.to_tensor(0)
        carry = gl.to_tensor(0)
        for c in range(0, batch, BLOCK_B):
            o = c + gl.arange(0, BLOCK_B, layout=one_l)
            m = o < batch
            lo = gl.load(offsets + o, mask=m, other=0)
            hi = gl.load(offsets + o + 1, mask=m, other=0)
            nb = gl.cdiv(hi - lo, BLOCK_M)
            cum = gl.associative_scan(nb, 0, _g_add) + carry
            done = (cum <= tile) & m
            cnt += gl.sum(done.to(gl.int32), 0)
            before += gl.sum(gl.where(done, nb, 0), 0)
            carry += gl.sum(nb, 0)
        return cnt, before

    @gluon.jit
    def _g_rows(t0, hi, b, lut, stride_lut, row_base, page_stride, PAGE: gl.constexpr,
                BN: gl.constexpr, row_l: gl.constexpr):  # fmt: skip
        """int64 physical rows and validity of key positions [t0, t0 + BN) of request b."""
        pos = t0 + gl.arange(0, BN, layout=row_l)
        valid = pos < hi
        if PAGE > 0:
            page = gl.load(lut + b * stride_lut + pos // PAGE, mask=valid, other=0)
            rows = page.to(gl.int64) * page_stride + (pos % PAGE)
        else:
            rows = row_base + pos
        return rows, valid

    @gluon.jit
    def _g_issue_kv(
        k_s, v_s, stage, t0, hi, b,
        K, stride_kr, k_head, K_lut, stride_klut, k_base, k_page_stride,
        V, stride_vr, v_head, V_lut, stride_vlut, v_base, v_page_stride,
        D: gl.constexpr, BN: gl.constexpr, K_PAGE: gl.constexpr, V_PAGE: gl.constexpr,
        V_SAME_ROWS: gl.constexpr, ld_l: gl.constexpr,
    ):  # fmt: skip
        """cp.async the K and V tiles of key positions [t0, t0 + BN) into ring stage `stage`
        (rows past `hi` are zero-filled); one commit group."""
        row_l: gl.constexpr = gl.SliceLayout(1, ld_l)
        offs_d = gl.arange(0, D, layout=gl.SliceLayout(0, ld_l))
        krows, valid = _g_rows(t0, hi, b, K_lut, stride_klut, k_base, k_page_stride, K_PAGE,
                               BN, row_l)  # fmt: skip
        kp = K + gl.multiple_of(krows * stride_kr + k_head, 8)[:, None] + offs_d[None, :]
        cp.async_copy_global_to_shared(k_s.index(stage), kp, mask=valid[:, None])
        if V_SAME_ROWS:
            vrows = krows
        else:
            vrows, valid = _g_rows(t0, hi, b, V_lut, stride_vlut, v_base, v_page_stride,
                                   V_PAGE, BN, row_l)  # fmt: skip
        vp = V + gl.multiple_of(vrows * stride_vr + v_head, 8)[:, None] + offs_d[None, :]
        cp.async_copy_global_to_shared(v_s.index(stage), vp, mask=valid[:, None])
        cp.commit_group()

    @gluon.jit
    def g_row0(t0, ok, b, lut, stride_lut, row_base, page_stride, PAGE: gl.constexpr):
        """int32 physical row of key position t0 (a tile inside one page); `ok` guards the
        page-table read."""
        if PAGE > 0:
            page = gl.load(lut + b * stride_lut + t0 // PAGE, mask=ok, other=0)
            row0 = page * page_stride + t0 % PAGE
        else:
            row0 = (row_base + t0).to(gl.int32)
        return row0

    @gluon.jit
    def _g_issue_kv_tma(
        k_s, v_s, bars, stage, t0, ok, b, col,
        K, K_lut, stride_klut, k_base, k_page_stride,
        V, V_lut, stride_vlut, v_base, v_page_stride,
        K_PAGE: gl.constexpr, V_PAGE: gl.constexpr, V_SAME_ROWS: gl.constexpr,
    ):  # fmt: skip
        """TMA boxes [BN, D] of K and V (key positions [t0, t0 + BN), column `col` of the
        [rows, heads * D] descriptors) into ring stage `stage`, completing on its mbarrier;
        nothing when `ok` is False. Rows past the tensor are zero-filled; rows past the keys
        are whatever the cache holds (masked for K, zeroed for the last V tile)."""
        bar = bars.index(stage)
        mbarrier.expect(bar, K.block_type.nbytes + V.block_type.nbytes, pred=ok)
        k0 = g_row0(t0, ok, b, K_lut, stride_klut, k_base, k_page_stride, K_PAGE)
        tma.async_copy_global_to_shared(K, [k0, col], bar, k_s.index(stage), pred=ok)
        if V_SAME_ROWS:
            v0 = k0
        else:
            v0 = g_row0(t0, ok, b, V_lut, stride_vlut, v_base, v_page_stride, V_PAGE)
        tma.async_copy_global_to_shared(V, [v0, col], bar, v_s.index(stage), pred=ok)

    @gluon.jit
    def _g_softmax(s, m_i, l_i, t0, lo_r, hi_r, masked, qk_scale, BN: gl.constexpr,
                   s_l: gl.constexpr):  # fmt: skip
        """Online-softmax step of one S tile [BM, BN] (raw scores): returns P (f32, in S's
        layout), the new running max (log2 units of scaled scores), row sums and the rescale
        factor of the previous accumulator. `masked` (uniform): apply the [lo_r, hi_r) ranges."""
        if masked:
            tok = t0 + gl.arange(0, BN, layout=gl.SliceLayout(0, s_l))
            keep = (tok[None, :] >= lo_r[:, None]) & (tok[None, :] < hi_r[:, None])
            s = gl.where(keep, s, float("-inf"))
        m_new = gl.maximum(m_i, gl.max(s, 1) * qk_scale)
        m_use = gl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = gl.exp2(m_i - m_use)
        p = gl.exp2(s * qk_scale - m_use[:, None])
        l_i = l_i * alpha + gl.sum(p, 1)
        return p, m_new, l_i, alpha

    @gluon.jit
    def g_program_block(q_offsets, cache_lens, batch, mask_param, H_Q: gl.constexpr,
                         GROUP: gl.constexpr, MASK: gl.constexpr, REVERSE: gl.constexpr,
                         BLOCKS_FASTEST: gl.constexpr, BLOCK_B: gl.constexpr, BM: gl.constexpr,
                         BN: gl.constexpr, one_l: gl.constexpr):  # fmt: skip
        """This program's request (bc, clamped), query and KV heads, the request's q_start,
        q_len (0 for a spare program), cache_len and kv_len, its block's first row m0, and the
        block's key ranges (lo_u, start, end, f_lo, f_hi: `block_ranges`). Grid and block
        order of the tl kernel: one program per (query block of BM rows, head)."""
        pid = gl.program_id(0)
        hq = pid % H_Q
        tile = pid // H_Q
        b, before = _g_find_block(q_offsets, batch, tile, BM, BLOCK_B, one_l)
        live = b < batch
        bc = gl.minimum(b, batch - 1)
        q_start = gl.load(q_offsets + bc)
        q_len = gl.where(live, gl.load(q_offsets + bc + 1) - q_start, 0)
        blk = tile - before
        if BLOCKS_FASTEST:
            nb = gl.maximum(gl.cdiv(q_len, BM), 1)
            local = pid - before * H_Q
            hq = gl.where(live, local // nb, 0)
            blk = local % nb
        if REVERSE:
            blk = gl.cdiv(q_len, BM) - 1 - blk
        m0 = gl.where(live, blk, 0) * BM
        cache_len = gl.load(cache_lens + bc)
        kv_len = cache_len + q_len
        lo_u, start, end, f_lo, f_hi = block_ranges(
            cache_len, m0, q_len, kv_len, MASK, mask_param, BM, BN
        )
        hkv = hq // GROUP
        return bc, hq, hkv, q_start, q_len, m0, cache_len, kv_len, lo_u, start, end, f_lo, f_hi

    @gluon.jit
    def g_row_bases(K_off, V_off, bc, K_PAGE: gl.constexpr, V_PAGE: gl.constexpr):
        """int64 first rows of request bc in K and V (row-offset operands; 0 for paged ones)."""
        k_base = gl.to_tensor(0).to(gl.int64)
        v_base = gl.to_tensor(0).to(gl.int64)
        if K_PAGE == 0:
            k_base = gl.load(K_off + bc).to(gl.int64)
        if V_PAGE == 0:
            v_base = gl.load(V_off + bc).to(gl.int64)
        return k_base, v_base

    @gluon.jit
    def g_row_ranges(m0, q_len, cache_len, kv_len, lo_u, mask_param, MASK: gl.constexpr,
                      BM: gl.constexpr, srow_l: gl.constexpr):  # fmt: skip
        """Rows [m0, m0 + BM) of a block: positions, validity and visible key ranges
        [lo_r, hi_r) (empty for rows past q_len)."""
        offs_m = m0 + gl.arange(0, BM, layout=srow_l)
        row_valid = offs_m < q_len
        lo_r, hi_r = visible_range(cache_len + offs_m, kv_len, MASK, mask_param)
        lo_r = gl.where(row_valid, lo_r, lo_u)
        hi_r = gl.where(row_valid, hi_r, lo_u)
        return offs_m, row_valid, lo_r, hi_r

    @gluon.jit
    def g_store_q(Q, stride_qt, stride_qh, q_start, q_len, m0, hq, q_s, BM: gl.constexpr,
                   D: gl.constexpr, ld_l: gl.constexpr):  # fmt: skip
        """Query rows [m0, m0 + BM) of head hq (zero past q_len) into shared memory q_s."""
        qr = m0 + gl.arange(0, BM, layout=gl.SliceLayout(1, ld_l))
        qd = gl.arange(0, D, layout=gl.SliceLayout(0, ld_l))
        q_rows = (q_start + qr).to(gl.int64)
        q = gl.load(
            Q + (q_rows * stride_qt + hq * stride_qh)[:, None] + qd[None, :],
            mask=(qr < q_len)[:, None],
            other=0.0,
        )
        q_s.store(q)

    @gluon.jit
    def g_part_range(part: gl.constexpr, n_lo, n_hi, n_it):
        """Tiles [j_lo, j_hi) of loop `part` over tiles 1 .. n_it-1: 0 the masked leading edge,
        1 the full tiles [n_lo, n_hi), 2 the masked trailing edge."""
        if part == 0:
            j_lo = gl.to_tensor(1)
            j_hi = n_lo
        elif part == 1:
            j_lo = gl.maximum(n_lo, 1)
            j_hi = n_hi
        else:
            j_lo = gl.maximum(n_hi, 1)
            j_hi = n_it
        return j_lo, j_hi

    @gluon.jit
    def g_epilogue(acc, m_i, l_i, offs_m, row_valid, m0, q_start, q_len, hq, Sinks,
                    Out, stride_ot, stride_oh, Lse, stride_lt, stride_lh,
                    HAS_SINKS: gl.constexpr, WRITE_LSE: gl.constexpr, BM: gl.constexpr,
                    D: gl.constexpr, o_l: gl.constexpr):  # fmt: skip
        """Normalise O (sink in the denominator) and store rows [m0, m0 + BM) of head hq, and
        their natural-log LSE (sink left out)."""
        m_fin = gl.where(m_i == float("-inf"), 0.0, m_i)
        den = l_i
        if HAS_SINKS:
            den = den + gl.exp2(gl.load(Sinks + hq) * LOG2E - m_fin)
        inv = 1.0 / gl.where(l_i != 0, den, 1.0)  # a row with no key: 0, any sink
        o = acc * gl.convert_layout(inv, gl.SliceLayout(1, o_l))[:, None]
        orow = m0 + gl.arange(0, BM, layout=gl.SliceLayout(1, o_l))
        od = gl.arange(0, D, layout=gl.SliceLayout(0, o_l))
        o_rows = (q_start + orow).to(gl.int64)
        gl.store(
            Out + (o_rows * stride_ot + hq * stride_oh)[:, None] + od[None, :],
            o.to(Out.dtype.element_ty),
            mask=(orow < q_len)[:, None],
        )
        if WRITE_LSE:
            # l_i != 0 (not > 0): a NaN row sum (a NaN or +inf score) keeps its NaN
            lse = gl.where(
                l_i != 0, (m_i + gl.log2(gl.where(l_i != 0, l_i, 1.0))) * LN2, float("-inf")
            )
            gl.store(
                Lse + (q_start + offs_m).to(gl.int64) * stride_lt + hq * stride_lh,
                lse,
                mask=row_valid,
            )

    @gluon.jit
    def g_scores(q_s, k_tile, zero_s, qr_s, kr_tile, DR: gl.constexpr):
        """S = Q K^T issued (async): Q's first D columns against the tile's (q_s, k_tile), and
        where DR > 0 its next DR columns (qr_s, kr_tile: d_qk = D + DR, MLA's expanded form)
        accumulated into the same S."""
        s = warpgroup_mma(q_s, k_tile.permute((1, 0)), zero_s, use_acc=False, is_async=True)
        if DR > 0:
            s = warpgroup_mma(qr_s, kr_tile.permute((1, 0)), s, is_async=True)
        return s

    @gluon.jit
    def g_first_tile(q_s, k_tile, zero_s, start, f_lo, f_hi, n_it, lo_r, hi_r, qk_scale,
                      dtype: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr, D: gl.constexpr,
                      s_l: gl.constexpr, o_l: gl.constexpr, dot_l: gl.constexpr,
                      qr_s=None, kr_tile=None, DR: gl.constexpr = 0):  # fmt: skip
        """S = Q K^T of the first tile (k_tile landed; `g_scores`) and its softmax (nothing to
        rescale yet). Returns P (dtype) as the register A operand of the P V product, m, l, a
        zero O, and [n_lo, n_hi): the tile indices that every row sees in full."""
        s = g_scores(q_s, k_tile, zero_s, qr_s, kr_tile, DR)
        s = warpgroup_mma_wait(num_outstanding=0, deps=(s,))
        m_i = gl.full([BM], float("-inf"), gl.float32, gl.SliceLayout(1, s_l))
        l_i = gl.zeros([BM], gl.float32, gl.SliceLayout(1, s_l))
        masked = (start < f_lo) | (start >= f_hi) | (n_it == 0)
        p, m_i, l_i, _alpha = _g_softmax(s, m_i, l_i, start, lo_r, hi_r, masked, qk_scale, BN,
                                         s_l)  # fmt: skip
        p_op = gl.convert_layout(p.to(dtype), dot_l)
        acc = gl.zeros([BM, D], gl.float32, o_l)
        return p_op, m_i, l_i, acc, (f_lo - start) // BN, (f_hi - start) // BN

    @gluon.jit
    def g_tile_products(q_s, k_tile, v_prev, zero_s, acc, p_op, m_i, l_i, t0, lo_r, hi_r,
                         masked: gl.constexpr, qk_scale, BN: gl.constexpr, s_l: gl.constexpr,
                         o_l: gl.constexpr, dot_l: gl.constexpr, qr_s=None, kr_tile=None,
                         DR: gl.constexpr = 0):  # fmt: skip
        """One iteration's products once tile t0's K (k_tile, and kr_tile where DR > 0) and the
        previous tile's V (v_prev) have landed: S = Q K^T (`g_scores`) and O += P_prev V_prev
        issued together, the softmax of S under the P V product, then O rescaled. Returns (O,
        P as the register A operand, m, l); both products are complete on return."""
        s = g_scores(q_s, k_tile, zero_s, qr_s, kr_tile, DR)
        acc = warpgroup_mma(p_op, v_prev, acc, is_async=True)
        s = warpgroup_mma_wait(num_outstanding=1, deps=(s,))
        p, m_i, l_i, alpha = _g_softmax(s, m_i, l_i, t0, lo_r, hi_r, masked, qk_scale, BN, s_l)
        acc, p_op = warpgroup_mma_wait(num_outstanding=0, deps=(acc, p_op))
        acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, o_l))[:, None]
        p_op = gl.convert_layout(p.to(p_op.dtype), dot_l)
        return acc, p_op, m_i, l_i

    @gluon.jit
    def g_zero_rows_past(tile, r0, kv_len, ROWS: gl.constexpr, ld_l: gl.constexpr):
        """Zero the rows of a shared [ROWS, D] V tile holding key positions >= kv_len (rows
        r0, r0 + 1, ...): a TMA box copies rows past the keys too, a cache's unwritten slots
        may hold NaN, and 0 * NaN is NaN in the P V product."""
        vt = tile.load(ld_l)
        vr = r0 + gl.arange(0, ROWS, layout=gl.SliceLayout(1, ld_l))
        tile.store(gl.where((vr < kv_len)[:, None], vt, 0.0).to(vt.dtype))
        fence_async_shared()

    @gluon.jit
    def _g_step(

        j, start, end, bc, acc, p_op, m_i, l_i, lo_r, hi_r, qk_scale, q_s, k_s, v_s, bars, zero_s,
        K, stride_kr, k_head, K_lut, stride_klut, k_base, k_page_stride,
        V, stride_vr, v_head, V_lut, stride_vlut, v_base, v_page_stride, col,
        MASKED: gl.constexpr, D: gl.constexpr, BN: gl.constexpr, NBUF: gl.constexpr,
        K_PAGE: gl.constexpr, V_PAGE: gl.constexpr, V_SAME_ROWS: gl.constexpr,
        TMA: gl.constexpr, ld_l: gl.constexpr, s_l: gl.constexpr, o_l: gl.constexpr,
        dot_l: gl.constexpr,
    ):  # fmt: skip
        """Iteration j >= 1: S_j = Q K_j^T and O += P_{j-1} V_{j-1} issued together, the
        softmax of S_j under the P V product, then O rescaled; tile j + NBUF - 2 is issued into
        tile j - 2's stage first. Returns (O, P_j as the register A operand, m, l)."""
        t0 = start + j * BN
        t_next = t0 + (NBUF - 2) * BN
        if TMA:
            mbarrier.wait(bars.index(j % NBUF), (j // NBUF) & 1)  # tile j has landed
            gl.thread_barrier()  # every warpgroup is done with tile j - 2's stage
            _g_issue_kv_tma(
                k_s, v_s, bars, (j + NBUF - 2) % NBUF, t_next, t_next < end, bc, col,
                K, K_lut, stride_klut, k_base, k_page_stride,
                V, V_lut, stride_vlut, v_base, v_page_stride, K_PAGE, V_PAGE, V_SAME_ROWS,
            )  # fmt: skip
        else:
            cp.wait_group(NBUF - 3)  # tile j has landed
            fence_async_shared()
            # Every warpgroup has finished iteration j - 1, so tile j - 2's stage is free.
            gl.thread_barrier()
            # (Issued here, right after the barrier, Triton adds no barrier of its own for the
            # stage write, and ptxas keeps the softmax between the two wgmma waits.)
            _g_issue_kv(
                k_s, v_s, (j + NBUF - 2) % NBUF, t_next, end, bc,
                K, stride_kr, k_head, K_lut, stride_klut, k_base, k_page_stride,
                V, stride_vr, v_head, V_lut, stride_vlut, v_base, v_page_stride,
                D, BN, K_PAGE, V_PAGE, V_SAME_ROWS, ld_l,
            )  # fmt: skip
        return g_tile_products(
            q_s, k_s.index(j % NBUF), v_s.index((j - 1) % NBUF), zero_s, acc, p_op, m_i, l_i, t0,
            lo_r, hi_r, MASKED, qk_scale, BN, s_l, o_l, dot_l,
        )  # fmt: skip

    @gluon.jit(do_not_specialize=STEP_INTS, do_not_specialize_on_alignment=INDEX_VIEWS)
    def _mha_prefill_sm90(
        Q, stride_qt, stride_qh,
        K, stride_kr, stride_kh, K_lut, stride_klut, K_off, k_page_stride,
        V, stride_vr, stride_vh, V_lut, stride_vlut, V_off, v_page_stride,
        cache_lens, q_offsets, batch, Sinks, mask_param,
        Out, stride_ot, stride_oh, Lse, stride_lt, stride_lh, sm_scale_log2,
        H_Q: gl.constexpr, GROUP: gl.constexpr, D: gl.constexpr, BLOCK_N: gl.constexpr,
        K_PAGE: gl.constexpr, V_PAGE: gl.constexpr, V_SAME_ROWS: gl.constexpr,
        MASK: gl.constexpr, HAS_SINKS: gl.constexpr, WRITE_LSE: gl.constexpr,
        REVERSE: gl.constexpr, BLOCKS_FASTEST: gl.constexpr, BLOCK_B: gl.constexpr,
        NBUF: gl.constexpr, TMA: gl.constexpr,
    ):  # fmt: skip
        """Q [total_q, H_Q, D] -> Out [total_q, H_Q, D] (q dtype), Lse [total_q, H_Q] f32
        (natural log). 16 query rows a warp: BLOCK_M = 16 * num_warps."""
        NW: gl.constexpr = gl.num_warps()
        BM: gl.constexpr = 16 * NW
        BN: gl.constexpr = BLOCK_N
        dtype: gl.constexpr = Q.dtype.element_ty
        s_l: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[NW, 1], instr_shape=[16, BN, 16]
        )
        o_l: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[NW, 1], instr_shape=[16, D, 16]
        )
        dot_l: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_l, k_width=2)
        TD: gl.constexpr = D // 8  # threads along d (16 bytes each)
        ld_l: gl.constexpr = gl.BlockedLayout([1, 8], [32 // TD, TD], [NW, 1], [1, 0])
        sm_l: gl.constexpr = gl.NVMMASharedLayout(
            swizzle_byte_width=128, element_bitwidth=16, rank=2
        )
        one_l: gl.constexpr = gl.BlockedLayout([1], [32], [NW], [0])
        srow_l: gl.constexpr = gl.SliceLayout(1, s_l)

        bc, hq, hkv, q_start, q_len, m0, cache_len, kv_len, lo_u, start, end, f_lo, f_hi = (
            g_program_block(q_offsets, cache_lens, batch, mask_param, H_Q, GROUP, MASK, REVERSE,
                             BLOCKS_FASTEST, BLOCK_B, BM, BN, one_l)
        )  # fmt: skip
        offs_m, row_valid, lo_r, hi_r = g_row_ranges(
            m0, q_len, cache_len, kv_len, lo_u, mask_param, MASK, BM, srow_l
        )

        q_s = gl.allocate_shared_memory(dtype, [BM, D], sm_l)
        k_s = gl.allocate_shared_memory(dtype, [NBUF, BN, D], sm_l)
        v_s = gl.allocate_shared_memory(dtype, [NBUF, BN, D], sm_l)
        bars = gl.allocate_shared_memory(gl.int64, [NBUF, 1], mbarrier.MBarrierLayout())
        if TMA:
            for i in gl.static_range(NBUF):
                mbarrier.init(bars.index(i), count=1)
            fence_async_shared()
            gl.thread_barrier()
        col = hkv * D

        k_head = hkv * stride_kh
        v_head = hkv * stride_vh
        k_base, v_base = g_row_bases(K_off, V_off, bc, K_PAGE, V_PAGE)

        # Prologue: tiles 0 .. NBUF-2 in flight (cp.async: empty groups past the end; TMA:
        # nothing past the end except tile 0, which is always waited for).
        for i in gl.static_range(NBUF - 1):
            if TMA:
                _g_issue_kv_tma(
                    k_s, v_s, bars, i, start + i * BN, (i == 0) | (start + i * BN < end), bc,
                    col, K, K_lut, stride_klut, k_base, k_page_stride,
                    V, V_lut, stride_vlut, v_base, v_page_stride, K_PAGE, V_PAGE, V_SAME_ROWS,
                )  # fmt: skip
            else:
                _g_issue_kv(
                    k_s, v_s, i, start + i * BN, end, bc,
                    K, stride_kr, k_head, K_lut, stride_klut, k_base, k_page_stride,
                    V, stride_vr, v_head, V_lut, stride_vlut, v_base, v_page_stride,
                    D, BN, K_PAGE, V_PAGE, V_SAME_ROWS, ld_l,
                )  # fmt: skip
        g_store_q(Q, stride_qt, stride_qh, q_start, q_len, m0, hq, q_s, BM, D, ld_l)

        qk_scale = sm_scale_log2
        zero_s = gl.zeros([BM, BN], gl.float32, s_l)
        n_it = gl.cdiv(gl.maximum(end - start, 0), BN)

        # Tile 0: S and its softmax (the accumulator starts at zero, no rescale).
        if TMA:
            mbarrier.wait(bars.index(0), 0)
            fence_async_shared()  # q_s's generic store, before the wgmma reads it
        else:
            cp.wait_group(NBUF - 2)
            fence_async_shared()
        gl.thread_barrier()
        p_op, m_i, l_i, acc, n_lo, n_hi = g_first_tile(
            q_s, k_s.index(0), zero_s, start, f_lo, f_hi, n_it, lo_r, hi_r, qk_scale, dtype,
            BM, BN, D, s_l, o_l, dot_l,
        )  # fmt: skip

        # Tiles 1 .. n_it-1 in three loops (masked leading edge, full tiles, masked trailing
        # edge) whose bodies have no branch: ptxas waits for every wgmma in flight at a branch,
        # which would put the P V product back in front of the softmax.
        for part in gl.static_range(3):
            j_lo, j_hi = g_part_range(part, n_lo, n_hi, n_it)
            for j in range(j_lo, j_hi):
                acc, p_op, m_i, l_i = _g_step(
                    j, start, end, bc, acc, p_op, m_i, l_i, lo_r, hi_r, qk_scale, q_s, k_s, v_s,
                    bars, zero_s, K, stride_kr, k_head, K_lut, stride_klut, k_base,
                    k_page_stride, V, stride_vr, v_head, V_lut, stride_vlut, v_base,
                    v_page_stride, col, part != 1, D, BN, NBUF, K_PAGE, V_PAGE, V_SAME_ROWS,
                    TMA, ld_l, s_l, o_l, dot_l,
                )  # fmt: skip
        last_st = (gl.maximum(n_it, 1) - 1) % NBUF
        if TMA:
            # The last tile's V is read only here: zero its rows past the keys.
            t_last = start + (gl.maximum(n_it, 1) - 1) * BN
            if t_last + BN > kv_len:
                g_zero_rows_past(v_s.index(last_st), t_last, kv_len, BN, ld_l)
                gl.thread_barrier()
        acc = warpgroup_mma(p_op, v_s.index(last_st), acc, is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        if TMA:
            for i in gl.static_range(NBUF):
                mbarrier.invalidate(bars.index(i))
        else:
            cp.wait_group(0)

        g_epilogue(acc, m_i, l_i, offs_m, row_valid, m0, q_start, q_len, hq, Sinks, Out,
                    stride_ot, stride_oh, Lse, stride_lt, stride_lh, HAS_SINKS, WRITE_LSE, BM, D,
                    o_l)  # fmt: skip
