"""Gluon (sm_90) warp-specialized MHA/GQA prefill (`_mha_prefill_ws`): a TMA producer warp and
two consumer warpgroups of 64 query rows each that share the K/V ring and release its stages on
their own.

Same contract, grid and block order as `gluon_prefill._mha_prefill_sm90` (128 query rows a
program), for K/V whose [BLOCK_N, D] tiles are TMA boxes: one a tile where tiles stay in one
page (ragged / row-offset K/V, pages a multiple of BLOCK_N), one a page for pages of 8 or more
rows that divide BLOCK_N. The dispatcher (`selection.sm90_prefill_plan`) takes it on sm_90
wherever that holds (H100, causal 8 x 4096 d128: ragged 509-515 TFLOP/s against 422 for the
tl kernel; pages of 16 499). It also takes d_qk = d_v + DR (DR 16 / 32 / 64: MLA's expanded
prefill, 192 / 128), K's columns past d_v a second box into the same stage and a second product
into S (H200, DeepSeek-V3 causal 8 x 2048 over 2048: 641 TFLOP/s, FlashInfer's ragged prefill
637 in the same run; docs/kernels/gluon_prefill.md).

The stages have "ready" mbarriers (TMA bytes, count 1) and "empty" ones (count 2: each consumer
arrives once its products that read the stage are complete), K and V rings apart so K is freed
after S = Q K^T and V after P V; the consumers never meet at a CTA barrier (which is what limits
`gluon_prefill`).

Per consumer, iteration j: wait K_j and V_{j-1}; issue S_j = Q K_j^T and O += P_{j-1} V_{j-1};
wait S_j; softmax of tile j under the P V product; wait it; free K_j and V_{j-1}; rescale O.
A TMA box copies rows past the request's keys too (unwritten cache slots may hold NaN): masked
for K; the last V tile (read after the loop) has them zeroed, each consumer half of its rows,
meeting on one mbarrier before either reads it. Measurements and the variants tried (ping-pong,
a persistent grid): docs/kernels/gluon_prefill.md."""

from __future__ import annotations

from ..gluon_imports import (
    HAS_GLUON,
    fence_async_shared,
    gl,
    gluon,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)
from ..specialize import INDEX_VIEWS, STEP_INTS
from .gluon_prefill import (
    g_epilogue,
    g_first_tile,
    g_part_range,
    g_program_block,
    g_row0,
    g_row_bases,
    g_row_ranges,
    g_store_q,
    g_tile_products,
    g_zero_rows_past,
)

if HAS_GLUON:

    @gluon.jit
    def _ws_producer(
        args, WG: gl.constexpr,
        D: gl.constexpr, BN: gl.constexpr, NBUF: gl.constexpr, K_PAGE: gl.constexpr,
        V_PAGE: gl.constexpr, K_BOX: gl.constexpr, V_BOX: gl.constexpr, MASK: gl.constexpr,
        HAS_SINKS: gl.constexpr, WRITE_LSE: gl.constexpr, DR: gl.constexpr,
    ):  # fmt: skip
        """One warp: TMA boxes of K and V for tiles 0 .. max(n_it, 1) - 1, each into its ring
        stage once both consumers have freed it. (WG is unused: worker partitions share one
        signature.)"""
        (Q, stride_qt, stride_qh, K, K_lut, stride_klut, k_base, k_page_stride,
         V, V_lut, stride_vlut, v_base, v_page_stride, Sinks, mask_param,
         Out, stride_ot, stride_oh, Lse, stride_lt, stride_lh, qk_scale,
         bc, hq, k_col, v_col, q_start, q_len, m0, cache_len, kv_len, lo_u, start, end, f_lo,
         f_hi, q_s, k_s, v_s, bars, KR, qr_s, kr_s) = args  # fmt: skip
        k_ready, k_empty, v_ready, v_empty, _vfix = bars
        n_t = gl.maximum(gl.cdiv(gl.maximum(end - start, 0), BN), 1)
        for j in range(n_t):
            st = j % NBUF
            ph = ((j // NBUF) & 1) ^ 1  # a fresh mbarrier passes a wait on phase 1
            t0 = start + j * BN
            mbarrier.wait(k_empty.index(st), ph)
            _ws_fill(K, k_s.index(st), k_ready.index(st), t0, kv_len, bc, k_col, K_lut,
                     stride_klut, k_base, k_page_stride, K_PAGE, K_BOX, BN, KR, kr_s.index(st),
                     k_col + D, DR)  # fmt: skip
            mbarrier.wait(v_empty.index(st), ph)
            _ws_fill(V, v_s.index(st), v_ready.index(st), t0, kv_len, bc, v_col, V_lut,
                     stride_vlut, v_base, v_page_stride, V_PAGE, V_BOX, BN)  # fmt: skip

    @gluon.jit
    def _ws_fill(desc, dst, bar, t0, kv_len, b, col, lut, stride_lut, row_base, page_stride,
                 PAGE: gl.constexpr, BOX: gl.constexpr, BN: gl.constexpr, desc2=None,
                 dst2=None, col2=0, DR: gl.constexpr = 0):  # fmt: skip
        """TMA boxes of BOX rows filling the [BN, D] tile `dst` with key positions
        [t0, t0 + BN) (one box where the tile stays in one page, else one a page), completing
        on `bar`; where DR > 0 also the [BN, DR] tile `dst2` from `desc2` at column col2 (the
        same rows: K's columns past d_v). Boxes past the request's keys read page 0 (rows the
        consumers mask in S and zero in V; boxes before kv_len, past the visible range, hold
        the request's own finite keys)."""
        if DR > 0:
            mbarrier.expect(bar, (desc.block_type.nbytes + desc2.block_type.nbytes) * (BN // BOX))
        else:
            mbarrier.expect(bar, desc.block_type.nbytes * (BN // BOX))
        for i in gl.static_range(BN // BOX):
            t = t0 + i * BOX
            r0 = g_row0(t, t < kv_len, b, lut, stride_lut, row_base, page_stride, PAGE)
            tma.async_copy_global_to_shared(desc, [r0, col], bar, dst.slice(i * BOX, BOX))
            if DR > 0:
                tma.async_copy_global_to_shared(desc2, [r0, col2], bar,
                                                dst2.slice(i * BOX, BOX))  # fmt: skip

    @gluon.jit
    def _ws_step(
        j, start, acc, p_op, m_i, l_i, lo_r, hi_r, qk_scale, q_w, k_s, v_s, bars, zero_s,
        qr_w, kr_s, MASKED: gl.constexpr, BN: gl.constexpr, NBUF: gl.constexpr,
        s_l: gl.constexpr, o_l: gl.constexpr, dot_l: gl.constexpr, DR: gl.constexpr,
    ):  # fmt: skip
        """Iteration j >= 1 of one consumer (see the module docstring). Returns (O, P_j as the
        register A operand, m, l)."""
        k_ready, k_empty, v_ready, v_empty, _vfix = bars
        st = j % NBUF
        pst = (j - 1) % NBUF
        # Both waits before either product: a wait is a loop, and ptxas completes every wgmma
        # in flight at a branch.
        mbarrier.wait(k_ready.index(st), (j // NBUF) & 1)
        mbarrier.wait(v_ready.index(pst), ((j - 1) // NBUF) & 1)
        acc, p_op, m_i, l_i = g_tile_products(
            q_w, k_s.index(st), v_s.index(pst), zero_s, acc, p_op, m_i, l_i, start + j * BN,
            lo_r, hi_r, MASKED, qk_scale, BN, s_l, o_l, dot_l, qr_w, kr_s.index(st), DR,
        )  # fmt: skip
        mbarrier.arrive(k_empty.index(st), count=1)
        mbarrier.arrive(v_empty.index(pst), count=1)
        return acc, p_op, m_i, l_i

    @gluon.jit
    def _ws_consume(
        args, WG: gl.constexpr,
        D: gl.constexpr, BN: gl.constexpr, NBUF: gl.constexpr, K_PAGE: gl.constexpr,
        V_PAGE: gl.constexpr, K_BOX: gl.constexpr, V_BOX: gl.constexpr, MASK: gl.constexpr,
        HAS_SINKS: gl.constexpr, WRITE_LSE: gl.constexpr, DR: gl.constexpr,
    ):  # fmt: skip
        """One warpgroup: query rows [m0 + 64 WG, m0 + 64 WG + 64) of the program's block, over
        every tile of the block's key range; writes their output (and LSE)."""
        (Q, stride_qt, stride_qh, K, K_lut, stride_klut, k_base, k_page_stride,
         V, V_lut, stride_vlut, v_base, v_page_stride, Sinks, mask_param,
         Out, stride_ot, stride_oh, Lse, stride_lt, stride_lh, qk_scale,
         bc, hq, k_col, v_col, q_start, q_len, m0, cache_len, kv_len, lo_u, start, end, f_lo,
         f_hi, q_s, k_s, v_s, bars, KR, qr_s, kr_s) = args  # fmt: skip
        k_ready, k_empty, v_ready, v_empty, vfix = bars
        BM: gl.constexpr = 64
        dtype: gl.constexpr = Q.dtype.element_ty
        s_l: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BN, 16]
        )
        o_l: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, D, 16]
        )
        dot_l: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_l, k_width=2)
        TD: gl.constexpr = D // 8  # threads along d (16 bytes each)
        ld_l: gl.constexpr = gl.BlockedLayout([1, 8], [32 // TD, TD], [4, 1], [1, 0])
        srow_l: gl.constexpr = gl.SliceLayout(1, s_l)
        mw = m0 + WG * BM
        offs_m, row_valid, lo_r, hi_r = g_row_ranges(
            mw, q_len, cache_len, kv_len, lo_u, mask_param, MASK, BM, srow_l
        )
        q_w = q_s.index(WG)
        g_store_q(Q, stride_qt, stride_qh, q_start, q_len, mw, hq, q_w, BM, D, ld_l)
        qr_w = qr_s.index(WG)
        if DR > 0:  # q's columns D .. D + DR
            TDR: gl.constexpr = DR // 8
            ldr_l: gl.constexpr = gl.BlockedLayout([1, 8], [32 // TDR, TDR], [4, 1], [1, 0])
            g_store_q(Q + D, stride_qt, stride_qh, q_start, q_len, mw, hq, qr_w, BM, DR, ldr_l)
        fence_async_shared()
        gl.thread_barrier()

        zero_s = gl.zeros([BM, BN], gl.float32, s_l)
        n_it = gl.cdiv(gl.maximum(end - start, 0), BN)

        # Tile 0: S and its softmax (the accumulator starts at zero, no rescale).
        mbarrier.wait(k_ready.index(0), 0)
        p_op, m_i, l_i, acc, n_lo, n_hi = g_first_tile(
            q_w, k_s.index(0), zero_s, start, f_lo, f_hi, n_it, lo_r, hi_r, qk_scale, dtype,
            BM, BN, D, s_l, o_l, dot_l, qr_w, kr_s.index(0), DR,
        )  # fmt: skip
        mbarrier.arrive(k_empty.index(0), count=1)

        # Tiles 1 .. n_it-1: masked leading edge, full tiles, masked trailing edge (loop bodies
        # without a branch, as in gluon_prefill).
        for part in gl.static_range(3):
            j_lo, j_hi = g_part_range(part, n_lo, n_hi, n_it)
            for j in range(j_lo, j_hi):
                acc, p_op, m_i, l_i = _ws_step(
                    j, start, acc, p_op, m_i, l_i, lo_r, hi_r, qk_scale, q_w, k_s, v_s, bars,
                    zero_s, qr_w, kr_s, part != 1, BN, NBUF, s_l, o_l, dot_l, DR,
                )  # fmt: skip

        last = gl.maximum(n_it, 1) - 1
        lst = last % NBUF
        mbarrier.wait(v_ready.index(lst), (last // NBUF) & 1)
        t_last = start + last * BN
        if t_last + BN > kv_len:
            # Zero this consumer's half of the last V tile's rows past the keys, then wait
            # for the other half.
            HB: gl.constexpr = BN // 2
            g_zero_rows_past(v_s.index(lst).slice(WG * HB, HB, dim=0), t_last + WG * HB, kv_len,
                              HB, ld_l)  # fmt: skip
            mbarrier.arrive(vfix, count=1)
            mbarrier.wait(vfix, 0)
        acc = warpgroup_mma(p_op, v_s.index(lst), acc, is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))

        g_epilogue(acc, m_i, l_i, offs_m, row_valid, mw, q_start, q_len, hq, Sinks, Out,
                    stride_ot, stride_oh, Lse, stride_lt, stride_lh, HAS_SINKS, WRITE_LSE, BM, D,
                    o_l)  # fmt: skip

    @gluon.jit(do_not_specialize=STEP_INTS, do_not_specialize_on_alignment=INDEX_VIEWS)
    def _mha_prefill_ws(
        Q, stride_qt, stride_qh,
        K, K_lut, stride_klut, K_off, k_page_stride,
        V, V_lut, stride_vlut, V_off, v_page_stride,
        cache_lens, q_offsets, batch, Sinks, mask_param,
        Out, stride_ot, stride_oh, Lse, stride_lt, stride_lh, sm_scale_log2,
        H_Q: gl.constexpr, GROUP: gl.constexpr, D: gl.constexpr, BLOCK_N: gl.constexpr,
        K_PAGE: gl.constexpr, V_PAGE: gl.constexpr, K_BOX: gl.constexpr, V_BOX: gl.constexpr,
        MASK: gl.constexpr, HAS_SINKS: gl.constexpr, WRITE_LSE: gl.constexpr,
        REVERSE: gl.constexpr, BLOCKS_FASTEST: gl.constexpr, BLOCK_B: gl.constexpr,
        NBUF: gl.constexpr, CONSUMER_REGS: gl.constexpr, DR: gl.constexpr = 0, KR=None,
    ):  # fmt: skip
        """Q [total_q, H_Q, D + DR] -> Out [total_q, H_Q, D] (q dtype), Lse [total_q, H_Q] f32
        (natural log). K, V: Gluon TMA descriptors of [K_BOX / V_BOX, D] boxes of the [rows,
        heads * (D + DR)] and [rows, heads * D] views; where DR > 0 (d_qk = d_v + DR: MLA's
        expanded prefill, 192 = 128 + 64), KR one of [K_BOX, DR] boxes of K's view (its
        columns past D), whose products join S. Launch with num_warps=4 (the first consumer);
        the second consumer and the producer are worker partitions."""
        BM: gl.constexpr = 128
        BN: gl.constexpr = BLOCK_N
        dtype: gl.constexpr = Q.dtype.element_ty
        sm_l: gl.constexpr = gl.NVMMASharedLayout(
            swizzle_byte_width=128, element_bitwidth=16, rank=2
        )
        one_l: gl.constexpr = gl.BlockedLayout([1], [32], [gl.num_warps()], [0])

        bc, hq, hkv, q_start, q_len, m0, cache_len, kv_len, lo_u, start, end, f_lo, f_hi = (
            g_program_block(q_offsets, cache_lens, batch, mask_param, H_Q, GROUP, MASK, REVERSE,
                             BLOCKS_FASTEST, BLOCK_B, BM, BN, one_l)
        )  # fmt: skip
        k_base, v_base = g_row_bases(K_off, V_off, bc, K_PAGE, V_PAGE)

        q_s = gl.allocate_shared_memory(dtype, [2, 64, D], sm_l)
        k_s = gl.allocate_shared_memory(dtype, [NBUF, BN, D], sm_l)
        v_s = gl.allocate_shared_memory(dtype, [NBUF, BN, D], sm_l)
        if DR > 0:  # q's and K's columns past D (rows of DR * 2 bytes: a swizzle that fits)
            r_l: gl.constexpr = gl.NVMMASharedLayout(
                swizzle_byte_width=2 * DR if DR < 64 else 128, element_bitwidth=16, rank=2
            )
            qr_s = gl.allocate_shared_memory(dtype, [2, 64, DR], r_l)
            kr_s = gl.allocate_shared_memory(dtype, [NBUF, BN, DR], r_l)
        else:  # (unread)
            qr_s = q_s
            kr_s = k_s
        bar_l: gl.constexpr = mbarrier.MBarrierLayout()
        k_ready = gl.allocate_shared_memory(gl.int64, [NBUF, 1], bar_l)
        k_empty = gl.allocate_shared_memory(gl.int64, [NBUF, 1], bar_l)
        v_ready = gl.allocate_shared_memory(gl.int64, [NBUF, 1], bar_l)
        v_empty = gl.allocate_shared_memory(gl.int64, [NBUF, 1], bar_l)
        vfix = gl.allocate_shared_memory(gl.int64, [1, 1], bar_l).index(0)
        for i in gl.static_range(NBUF):
            mbarrier.init(k_ready.index(i), count=1)
            mbarrier.init(v_ready.index(i), count=1)
            mbarrier.init(k_empty.index(i), count=2)
            mbarrier.init(v_empty.index(i), count=2)
        mbarrier.init(vfix, count=2)
        fence_async_shared()

        args = (
            Q, stride_qt, stride_qh, K, K_lut, stride_klut, k_base, k_page_stride,
            V, V_lut, stride_vlut, v_base, v_page_stride, Sinks, mask_param,
            Out, stride_ot, stride_oh, Lse, stride_lt, stride_lh, sm_scale_log2,
            bc, hq, hkv * (D + DR), hkv * D, q_start, q_len, m0, cache_len, kv_len, lo_u, start,
            end, f_lo, f_hi, q_s, k_s, v_s, (k_ready, k_empty, v_ready, v_empty, vfix), KR, qr_s,
            kr_s,
        )  # fmt: skip
        # fmt: off
        gl.warp_specialize(
            [
                (_ws_consume, (args, 0, D, BN, NBUF, K_PAGE, V_PAGE, K_BOX, V_BOX, MASK,
                               HAS_SINKS, WRITE_LSE, DR)),
                (_ws_consume, (args, 1, D, BN, NBUF, K_PAGE, V_PAGE, K_BOX, V_BOX, MASK,
                               HAS_SINKS, WRITE_LSE, DR)),
                (_ws_producer, (args, 0, D, BN, NBUF, K_PAGE, V_PAGE, K_BOX, V_BOX, MASK,
                                HAS_SINKS, WRITE_LSE, DR)),
            ],
            [4, 1],
            [CONSUMER_REGS, 24],
        )
        # fmt: on
