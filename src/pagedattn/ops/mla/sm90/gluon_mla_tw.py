"""Gluon sm_90 warp-specialized keys-as-M MLA decode for rope-aware FP8 caches and few query
rows (h_q <= 16): the memory-bound decode of DeepSeek-style models at small head counts.

`_mla_decode_sm90_tw` has the contract, arguments and grid of `gluon_mla._mla_decode_sm90_t`
(NR = 16 query rows: the heads of a token, or of TPT tokens; padded), runs its tile step
`t_tile` and epilogue `t_store`, and keeps NBUF 40 KB tiles in a ring with one CTA a SM:
- the CTA's own warps issue the first PRE tiles right after their page ids arrive, before q's
  store and the partitions' start; a producer warpgroup gathers the rest, BN = 64 keys a tile
  (any page size, sparse indices), with cp.async into the ring, each stage's arrivals on its
  `ready` barrier (`_tw_issue`: PS_C a compile-time power-of-two page size, ADDR int32 rows);
- two consumer warpgroups own alternate tiles (warpgroup w: tiles w, w + 2, ...), each with its
  own softmax state and O^T [512, NR] accumulator (FOLD, SPEC: `t_tile`'s softmax variants; with
  SPEC, P and the keys' flags go into the warpgroup's own buffers, else P goes into the tile's
  rope rows, free once S is done), and free a stage on its `empty` barrier once its tile is done;
- at the end warpgroup 0 leaves its state (O in float32 through the ring stage of its last tile,
  which nothing reads any more) and warpgroup 1, whose last tile lands last, merges and stores it.
So a request's keys need no second CTA and no combine pass at batch >= the SM count.

The selection (`ops.mla.triton_mla_plan`) takes it on sm_90 for rope-aware FP8 caches with h_q <=
16 (dense tiles hold the heads of up to 16 // h_q tokens), unless turned off (then
`_mla_decode_sm90_t` serves). Limits: rope-aware FP8, d_qk 576, BN 64 (asserted), NR 16; NBUF 3,
4 on an H200 (H200: 0.158 against 0.161 ms at s_k 8192); registers 232 a consumer
thread, 48 for the producer; SPEC adds 4 KB of shared memory.

Design history, measurements and the variants not kept: docs/kernels/gluon_mla_tw.md.
"""

from __future__ import annotations

from ...gluon_imports import HAS_GLUON, fence_async_shared, gl, gluon, mbarrier

if HAS_GLUON:
    from .gluon_mla import (
        g_clock,
        g_issue_lat,
        g_issue_main,
        g_issue_rope,
        g_issue_scales,
        g_key_range,
        g_keys,
        g_program,
        g_request,
        g_rows,
        g_trace_close,
        g_trace_open,
        g_work_item,
        t_q_load,
        t_q_store,
        t_raw_layout,
        t_state,
        t_store,
        t_tile,
    )
    from .gluon_mla_ss import ss_release

    @gluon.jit
    def _tw_n_pairs(lo, hi, BN: gl.constexpr):
        """The key range's tile pairs: the consumers take turns, so the tile count is rounded
        up to even (a last odd tile is all masked) and consumer 1 owns the last tile."""
        return gl.cdiv(gl.cdiv(gl.maximum(hi - lo, 0), BN), 2)

    @gluon.jit
    def _tw_issue(k_main, k_sc, k_rope, vbuf, ready, st, rows, valid, K, K_SC, K_stride,
                  K_stride_h, K_stride_q, K_sc_stride, FMT: gl.constexpr,
                  ld_l: gl.constexpr, ADDR: gl.constexpr):  # fmt: skip
        """cp.async a tile's rows (`g_rows`) into stage st: dims 0..511 and scales, the rope
        dims; then its validity and the ready arrivals (`ss_release`). Four warps. ADDR: row
        numbers in int32 (the launcher checks that they fit) and one int64 byte offset a row
        for both the e4m3 bytes and the rope part."""
        if ADDR:  # (in the order measured: e4m3 bytes, rope part, scales)
            rows = rows.to(gl.int32).to(gl.int64)
            roff = gl.multiple_of(rows * K_stride, 16)  # bytes
            g_issue_lat(k_main, st, rows, valid, K, K_stride, FMT, ld_l, 4, roff)
            g_issue_rope(k_rope.index(st), rows, valid, K, K_stride, K_stride_h, FMT, ld_l,
                         roff >> 1)  # fmt: skip
            g_issue_scales(k_sc, st, rows, valid, K, K_SC, K_stride_q, K_sc_stride, FMT, 4)
        else:
            g_issue_main(k_main, k_sc, st, rows, valid, K, K_SC, K_stride, K_stride_q,
                         K_sc_stride, FMT, ld_l, 4)  # fmt: skip
            g_issue_rope(k_rope.index(st), rows, valid, K, K_stride, K_stride_h, FMT, ld_l)
        ss_release(ready, st, vbuf, valid)

    @gluon.jit
    def _tw_producer(args, SPARSE: gl.constexpr, BN: gl.constexpr, FMT: gl.constexpr,
                     NBUF: gl.constexpr, PRE: gl.constexpr, PS_C: gl.constexpr,
                     ADDR: gl.constexpr, TRACE: gl.constexpr):  # fmt: skip
        """Four warps: tiles min(PRE, n_t) .. n_t - 1 (n_t = 2 `_tw_n_pairs`; the first PRE
        were issued before the partitions started) into stage j % NBUF once its previous
        tile's consumer has freed it; the key (look-up-table or index) load of tile j + 1 is
        issued before tile j is filled."""
        _outs, cache, tok, smem = args  # `_mla_decode_sm90_tw`'s
        (K, K_SC, K_LUT, K_IDX, K_stride, K_stride_h, K_stride_q, K_sc_stride, K_lut_stride,
         K_ps, K_psr, K_nenc, K_npages, K_idx_stride) = cache  # fmt: skip
        t, hb, b, i0, q_len, part, cache_len, lo, hi, lat_scale, trp, _split = tok
        q_lat, q_rope, k_main, k_sc, k_rope, vbuf, x_buf, bars, p_buf, f_buf = smem
        ready, empty, xb = bars
        K_ps = PS_C if PS_C else K_ps  # a power-of-two page size: shifts, not divisions
        ld_l: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
        row_l: gl.constexpr = gl.SliceLayout(1, ld_l)
        n_t = _tw_n_pairs(lo, hi, BN) * 2
        j0 = gl.minimum(n_t, PRE)
        key = g_keys(lo + j0 * BN, hi, b, t, K_LUT, K_IDX, K_lut_stride, K_ps, K_idx_stride,
                     SPARSE, BN, row_l)  # fmt: skip
        for j in range(j0, n_t):
            st = j % NBUF
            start = lo + j * BN
            key_next = g_keys(start + BN, hi, b, t, K_LUT, K_IDX, K_lut_stride, K_ps,
                              K_idx_stride, SPARSE, BN, row_l)  # fmt: skip
            rows, valid = g_rows(start, hi, key, K_ps, K_psr, K_nenc, K_npages, SPARSE, BN,
                                 row_l)  # fmt: skip
            mbarrier.wait(empty.index(st), ((j // NBUF) & 1) ^ 1)  # fresh barriers pass phase 1
            _tw_issue(k_main, k_sc, k_rope, vbuf, ready, st, rows, valid, K, K_SC, K_stride,
                      K_stride_h, K_stride_q, K_sc_stride, FMT, ld_l, ADDR)  # fmt: skip
            key = key_next
            if TRACE:
                if j == 0:
                    gl.store(trp + 1, g_clock())
        if TRACE:
            gl.store(trp + 5, g_clock())
            gl.store(trp + 7, n_t.to(gl.int64))

    @gluon.jit
    def _tw_consume(args, W: gl.constexpr, H_Q: gl.constexpr, HPT: gl.constexpr,
                    TPT: gl.constexpr, CAUSAL: gl.constexpr, HAS_SINK: gl.constexpr,
                    SPLIT: gl.constexpr, SPARSE: gl.constexpr, D_V: gl.constexpr,
                    BN: gl.constexpr, FMT: gl.constexpr, NBUF: gl.constexpr,
                    NR: gl.constexpr, PF: gl.constexpr, FOLD: gl.constexpr,
                    TRACE: gl.constexpr, SPEC: gl.constexpr = False,
                    BALANCED: gl.constexpr = False):  # fmt: skip
        """Consumer warpgroup W: tiles W, W + 2, ... of the key range; warpgroup 0 hands its
        state to warpgroup 1 (whose last tile lands last), which merges and stores the output
        (and the LSE)."""
        outs, _cache, tok, smem = args  # `_mla_decode_sm90_tw`'s
        OUT, stride_ot, stride_oh, LSE, PO, PL, SINK, qk_scale, n_tokens = outs
        t, hb, b, i0, q_len, part, cache_len, lo, hi, lat_scale, trp, split = tok
        q_lat_buf, q_rope_buf, k_main, k_sc, k_rope, vbuf, x_buf, bars, p_buf, f_buf = smem
        ready, empty, xb = bars
        mma_l: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, NR, 16]
        )
        col_l: gl.constexpr = gl.SliceLayout(0, mma_l)  # per query row (columns)
        x_l: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=64, element_bitwidth=32, rank=2)
        sm_l: gl.constexpr = gl.NVMMASharedLayout(
            swizzle_byte_width=128, element_bitwidth=16, rank=2
        )

        row_lim, kpos, acc, m_i, l_acc, tau, zero_s = t_state(
            t, hb, i0, q_len, cache_len, H_Q, HPT, TPT, NR, BN
        )

        n_own = _tw_n_pairs(lo, hi, BN)
        for i in range(n_own):
            j = 2 * i + W
            st = j % NBUF
            mbarrier.wait(ready.index(st), (j // NBUF) & 1)
            if TRACE and W == 0:
                if i == 0:
                    gl.store(trp + 2, g_clock())
            # An index the compiler cannot fold to 0 (`_mla_decode_sm90_t`: hoisted wgmma
            # descriptors of fixed buffers spill).
            zero = i // 2147483647
            kr = k_rope.index(st)
            # P^T [NR, BN] goes into the stage's rope rows 0..NR-1 (read by S only, done then)
            if SPEC:
                p_smem = p_buf.index(W)
                f_smem = f_buf.index(W)
            else:
                p_smem = kr.slice(0, NR, dim=0)._reinterpret(gl.float16, [NR, BN], sm_l)
                f_smem = p_smem
            # The extra tile of an odd tile count has no key: its stage is freed at once (a
            # full tile step there sat on the CTA's critical path: H100, last loop to
            # store 2.4 -> 1.5 us at s_k 4096 + 1; docs/kernels/gluon_mla_tw.md)
            if lo + j * BN < hi:
                acc, m_i, l_acc, tau = t_tile(
                    k_main.index(st), kr, k_sc.index(st), vbuf.index(st),
                    q_lat_buf.index(zero), q_rope_buf.index(zero), p_smem, lo + j * BN, kpos,
                    row_lim, acc, m_i, l_acc, tau, zero_s, lat_scale, qk_scale, FMT,
                    CAUSAL and not SPARSE, PF, FOLD, SPEC, f_smem=f_smem,
                )  # fmt: skip
            gl.thread_barrier()  # every thread is done with the stage
            mbarrier.arrive(empty.index(st), count=1)

        if TRACE and W == 0:
            gl.store(trp + 3, g_clock())
        l_i = gl.sum(l_acc, 0)
        # warpgroup 0's last tile's stage: no tile is copied into it or read from it any more
        xo = k_main.index((2 * n_own + NBUF - 2) % NBUF)._reinterpret(gl.float32, [512, NR], x_l)
        if W == 0:
            xo.store(acc * tau[None, :])
            x_buf.index(0).store(m_i)
            x_buf.index(1).store(l_i)
            gl.thread_barrier()
            mbarrier.arrive(xb, count=1)
        else:
            mbarrier.wait(xb, 0)
            m_x = x_buf.index(0).load(col_l)
            l_x = x_buf.index(1).load(col_l)
            m = gl.maximum(m_i, m_x)
            m_use = gl.where(m == float("-inf"), 0.0, m)
            a_own = gl.exp2(m_i - m_use)
            a_x = gl.exp2(m_x - m_use)
            acc = acc * (tau * a_own)[None, :] + xo.load(mma_l) * a_x[None, :]
            l_m = l_i * a_own + l_x * a_x
            one = gl.full([NR], 1.0, gl.float32, col_l)
            if BALANCED:  # partial rows item * TPT + i where the tile has several items
                if split:
                    t_store(acc, m, l_m, one, t, hb, i0, q_len, part, 1, OUT, stride_ot,
                            stride_oh, LSE, PO, PL, SINK, H_Q, HPT, TPT, D_V, HAS_SINK, True,
                            FMT)  # fmt: skip
                else:
                    t_store(acc, m, l_m, one, t, hb, i0, q_len, part, 1, OUT, stride_ot,
                            stride_oh, LSE, PO, PL, SINK, H_Q, HPT, TPT, D_V, HAS_SINK, False,
                            FMT)  # fmt: skip
            else:
                t_store(acc, m, l_m, one, t, hb, i0, q_len, part, n_tokens, OUT, stride_ot,
                        stride_oh, LSE, PO, PL, SINK, H_Q, HPT, TPT, D_V, HAS_SINK, SPLIT,
                        FMT)  # fmt: skip
            if TRACE:
                gl.thread_barrier()
                g_trace_close(trp)

    @gluon.jit
    def _mla_decode_sm90_tw(
        q_args, out_args, k_args,
        H_Q: gl.constexpr, D_QK: gl.constexpr, D_V: gl.constexpr, HPT: gl.constexpr,
        TPT: gl.constexpr, NHB: gl.constexpr, B_P2: gl.constexpr, CAUSAL: gl.constexpr,
        HAS_SINK: gl.constexpr, SPLIT: gl.constexpr, SPARSE: gl.constexpr,
        HAS_TOPK: gl.constexpr, TOPK_TOK: gl.constexpr, FMT: gl.constexpr,
        BN: gl.constexpr, NBUF: gl.constexpr, NR: gl.constexpr, CONSUMER_REGS: gl.constexpr,
        PRODUCER_REGS: gl.constexpr, PF: gl.constexpr = True, KSWZ: gl.constexpr = 1,
        PRE: gl.constexpr = 1, PS_C: gl.constexpr = 0, ADDR: gl.constexpr = False,
        FOLD: gl.constexpr = True, SPEC: gl.constexpr = False, PDL: gl.constexpr = False,
        TRACE: gl.constexpr = False,
        TR=None,
        BALANCED: gl.constexpr = False, TARGET: gl.constexpr = 1, MIN_BLOCKS: gl.constexpr = 1,
        LIST_ORDER: gl.constexpr = 0,
    ):  # fmt: skip
        """See the module docstring. Rope-aware FP8 cache, d_qk 576, BN 64, NR 16. Launch with
        num_warps=4 (consumer 0); consumer 1 and the producer are worker partitions. PS_C: the
        page size if a power of two, else 0 (run-time K_ps); ADDR: `_tw_issue`'s; FOLD: `t_tile`'s
        (the softmax's one reduction a tile); SPEC (with FOLD): `t_tile`'s (that reduction
        only on tiles with a key past the reference max by 2^8; 4 KB more shared memory).

        TRACE (development, `dev/gpu_mla_dev.py --trace`): int64 TR [CTAs, 10] gets the
        globaltimer at the CTA's start (slot 0), when the producer has issued its first tile
        (1), when consumer 0's first tile has landed (2), after its loop (3), after consumer
        1's store (4) and when the producer has issued its last tile (5), the SM (6), the
        tile count (7) and the SM's cycle counter at the start and end (8, 9)."""
        Q, stride_qt, stride_qh, QOFF, batch, n_tokens = q_args
        OUT, stride_ot, stride_oh, LSE, PO, PL, SINK, qk_scale, NUM_P = out_args
        (K, K_SC, K_LUT, K_CL, K_IDX, K_TOPK, K_stride, K_stride_h, K_stride_q, K_sc_stride,
         K_lut_stride, K_ps, K_psr, K_nenc, K_npages, K_idx_stride, K_idx_len) = k_args  # fmt: skip
        gl.static_assert(FMT == 3, "rope-aware FP8 caches")
        gl.static_assert(D_QK == 576, "d_qk 576")
        gl.static_assert(BN == 64, "64 keys a tile")
        ld_l: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
        one_l: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
        row_l: gl.constexpr = gl.SliceLayout(1, ld_l)
        sm_l: gl.constexpr = gl.NVMMASharedLayout(
            swizzle_byte_width=128, element_bitwidth=16, rank=2
        )
        raw_l: gl.constexpr = t_raw_layout(KSWZ)
        v1_l: gl.constexpr = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[0])
        bar_l: gl.constexpr = mbarrier.MBarrierLayout()

        if BALANCED:  # one item of the balanced list (`g_work_item`)
            ok, t, hb, w_lo, w_hi, split, part = g_work_item(
                QOFF, K_CL, batch, NHB, TPT, BN, TARGET, MIN_BLOCKS, B_P2, PDL, one_l,
                LIST_ORDER,
            )  # fmt: skip
            if not ok:
                return
            item = (w_lo, w_hi)
        else:
            t, hb, part = g_program(NHB, PDL)
            split = part < 0  # (unused: a placeholder for the partitions' arguments)
            item = None
        trp = part  # a placeholder (warp_specialize arguments cannot be None)
        if TRACE:
            trp = g_trace_open(TR)
        b, live, i0, leader, q_len = g_request(QOFF, batch, t, TPT, B_P2, one_l)
        # q's loads are issued before the dependent loads of the key range
        qa, qr = t_q_load(Q, stride_qt, stride_qh, t, hb, i0, q_len, H_Q, HPT, TPT, NR, FMT, ld_l)
        cache_len, lo, hi = g_key_range(
            K_CL, K_TOPK, b, t, live, leader, i0, q_len, part, NUM_P, K_idx_len,
            SPARSE, HAS_TOPK, TOPK_TOK, CAUSAL, TPT, BN, item,
        )  # fmt: skip

        q_lat = gl.allocate_shared_memory(gl.float16, [1, NR, 512], sm_l)
        q_rope = gl.allocate_shared_memory(gl.bfloat16, [1, NR, 64], sm_l)
        k_main = gl.allocate_shared_memory(gl.float8e4nv, [NBUF, BN, 512], raw_l)
        k_rope = gl.allocate_shared_memory(gl.bfloat16, [NBUF, BN, 64], sm_l)
        k_sc = gl.allocate_shared_memory(gl.float32, [NBUF, BN], v1_l)
        vbuf = gl.allocate_shared_memory(gl.int32, [NBUF, BN], v1_l)
        x_buf = gl.allocate_shared_memory(gl.float32, [2, NR], v1_l)
        if SPEC:  # each consumer's own P^T and key flags (`t_tile` SPEC)
            p_buf = gl.allocate_shared_memory(gl.float16, [2, NR, BN], sm_l)
            f_buf = gl.allocate_shared_memory(gl.int8, [2, BN], v1_l)
        else:
            p_buf = x_buf
            f_buf = x_buf
        ready = gl.allocate_shared_memory(gl.int64, [NBUF, 1], bar_l)
        empty = gl.allocate_shared_memory(gl.int64, [NBUF, 1], bar_l)
        xb = gl.allocate_shared_memory(gl.int64, [1, 1], bar_l).index(0)
        for i in gl.static_range(NBUF):
            mbarrier.init(ready.index(i), count=129)  # 128 cp.async arrivals + the release
            mbarrier.init(empty.index(i), count=1)
        mbarrier.init(xb, count=1)
        if PRE > 0:
            fence_async_shared()
            gl.thread_barrier()  # the barriers before any thread's arrivals
            n_t = _tw_n_pairs(lo, hi, BN) * 2
            ps = PS_C if PS_C else K_ps
            key = g_keys(lo, hi, b, t, K_LUT, K_IDX, K_lut_stride, ps, K_idx_stride, SPARSE,
                         BN, row_l)  # fmt: skip
            for j in gl.static_range(PRE):
                start = lo + j * BN
                if j + 1 < PRE:
                    key_next = g_keys(start + BN, hi, b, t, K_LUT, K_IDX, K_lut_stride, ps,
                                      K_idx_stride, SPARSE, BN, row_l)  # fmt: skip
                if j < n_t:
                    rows, valid = g_rows(start, hi, key, ps, K_psr, K_nenc, K_npages, SPARSE,
                                         BN, row_l)  # fmt: skip
                    _tw_issue(k_main, k_sc, k_rope, vbuf, ready, j, rows, valid, K, K_SC,
                              K_stride, K_stride_h, K_stride_q, K_sc_stride, FMT, ld_l,
                              ADDR)  # fmt: skip
                    if TRACE:
                        if j == 0:
                            gl.store(trp + 1, g_clock())
                if j + 1 < PRE:
                    key = key_next
        lat_scale = t_q_store(q_lat.index(0), q_rope.index(0), qa, qr, FMT)
        fence_async_shared()  # q before the consumers' wgmma reads
        gl.thread_barrier()

        # The partitions' arguments, in groups: the outputs (consumers), the cache (producer),
        # the token's request, key range, q scale and trace row, and the shared memory (both).
        outs = (OUT, stride_ot, stride_oh, LSE, PO, PL, SINK, qk_scale, n_tokens)
        cache = (K, K_SC, K_LUT, K_IDX, K_stride, K_stride_h, K_stride_q, K_sc_stride,
                 K_lut_stride, K_ps, K_psr, K_nenc, K_npages, K_idx_stride)  # fmt: skip
        tok = (t, hb, b, i0, q_len, part, cache_len, lo, hi, lat_scale, trp, split)
        bars = (ready, empty, xb)
        args = (outs, cache, tok, (q_lat, q_rope, k_main, k_sc, k_rope, vbuf, x_buf, bars, p_buf,
                                   f_buf))  # fmt: skip
        # fmt: off
        gl.warp_specialize(
            [
                (_tw_consume, (args, 0, H_Q, HPT, TPT, CAUSAL, HAS_SINK, SPLIT, SPARSE, D_V, BN,
                               FMT, NBUF, NR, PF, FOLD, TRACE, SPEC, BALANCED)),
                (_tw_consume, (args, 1, H_Q, HPT, TPT, CAUSAL, HAS_SINK, SPLIT, SPARSE, D_V, BN,
                               FMT, NBUF, NR, PF, FOLD, TRACE, SPEC, BALANCED)),
                (_tw_producer, (args, SPARSE, BN, FMT, NBUF, PRE, PS_C, ADDR, TRACE)),
            ],
            [4, 4],
            [CONSUMER_REGS, PRODUCER_REGS],
        )
        # fmt: on

else:  # Triton without Gluon: never launched (`triton_mla._use_sm90_path`)
    _mla_decode_sm90_tw = None
