"""Gluon sm_90 persistent cluster seesaw MLA decode: sparse V32 caches, two head blocks a token
(h_q 65..128), d_qk 576.

`_mla_decode_sm90_ps` computes what `gluon_mla_ss._mla_decode_sm90_ss` does for these launches
with the same tile step (`ss_cross_tile` in the producers, `ss_pair` in the consumers: each CTA
of a 2-CTA cluster dequantizes half of every tile for both), on a different schedule:
- G clusters (one a pair of SMs) walk the batch's work, which is every token's ceil(width /
  128) pairs of 64-key tiles (NPR pairs a token, `indices`' width, not its top-k length).
  Cluster c takes the pairs [c L, (c + 1) L) of the work order, with L = ceil(tokens NPR / G)
  >= NPR, so that no cluster has more than one pair of work more than another. Where all
  requests have the same query length the work order takes the i-th token of every request,
  then the (i + 1)-th (`_ps_order`, `_ps_token`; ORDER 1, the default), else (or with ORDER 0)
  the token order;
- a segment is a token's part of that range. A token the range holds whole gets its output and
  LSE stored as `gluon_mla_ss` would. A token cut at a cluster boundary leaves two float32
  partials (slot c - part, part 0 from the cluster it starts in, 1 from the next) and its id:
  `triton_mla_combine` merges them afterwards and folds the sink in;
- the ring's barrier phases run on across segments. Each consumer arrives on `qfree` once it has
  done its last S of a segment. The producer then writes the next segment's info into shared
  memory and loads its q (cp.async; both complete `qready`) while the consumers still run that
  segment's last P V products and epilogue. It also fills the next segment's first tiles as
  the ring frees;
- the epilogue stores O from the accumulators (EPI 0, 4-byte stores) or through
  `convert_layout`'s scratch in 16-byte stores (EPI 1, the default): the ring stage that
  `gluon_mla_ss.ss_finish` stages O in is already the next segment's.

The selection (`ops.mla.triton_mla_plan`) takes it only where the tuning asks for it
(`ss_persist`, off by default), for a launch the cluster seesaw would serve unsplit (P = 1):
sparse V32, h_q 65..128. It is slower than
`gluon_mla_ss` on the H100 and the H200 (H200: 0.451 against 0.416 ms) and kept as the
base of the schedule that issue 5's sparse target needs. Limits: launch with num_warps=4 in
clusters of 2 (`launch(..., cluster=2)`), G = min(SM count / 2, tokens) unless overridden (more
clusters run in waves); registers (consumer / producer) 200 / 104, as the cluster seesaw's.

Its measurements against `gluon_mla_ss`, and what they ruled out: docs/kernels/gluon_mla_ps.md.
"""

from __future__ import annotations

from ...gluon_imports import HAS_GLUON, cp, fence_async_shared, gl, gluon, mbarrier

if HAS_GLUON:
    from ...gluon_cluster import cl_arrive, cl_fence_init, cl_sync, cl_wait
    from .gluon_mla import (
        TILE_TRACE,
        g_clock,
        g_cycles,
        g_key_range,
        g_keys,
        g_normalize,
        g_pair_slots,
        g_request,
        g_rows,
        g_smid,
        g_tick,
        g_tile_slots,
    )
    from .gluon_mla_ss import (
        SS_O_L,
        SS_S_L,
        ss_alloc,
        ss_cross_tile,
        ss_issue_q,
        ss_pair,
        ss_tick_ready,
    )

    @gluon.jit
    def _ps_segments(L, NPR, n_tokens):
        """This cluster's pair range [g0, g1) and its number of segments."""
        c = gl.program_id(0) // 2
        g0 = c * L
        g1 = gl.minimum(g0 + L, n_tokens * NPR)
        n_seg = gl.where(g1 > g0, gl.cdiv(g1, NPR) - g0 // NPR, 0)
        return g0, g1, n_seg

    @gluon.jit
    def _ps_order(QOFF, batch, n_tokens, B_P2: gl.constexpr, ORDER: gl.constexpr):
        """The work order's query length s (`_ps_token`): every request's where they are all
        the same and ORDER is 1, else 0 (token order). Loaded once a CTA."""
        if ORDER == 0:
            return n_tokens * 0
        one_l: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
        ob = gl.arange(0, B_P2, layout=one_l)
        sq = n_tokens // batch
        offs = gl.load(QOFF + ob, mask=ob <= batch, other=0)
        uniform = gl.sum(((ob <= batch) & (offs != ob * sq)).to(gl.int32), 0) == 0
        return gl.where(uniform, sq, 0)

    @gluon.jit
    def _ps_token(u, batch, sq):
        """The token at place u of the work order. Where every request has the same query
        length sq > 0 (`_ps_order`), place u holds token sq (u % batch) + u // batch: the
        i-th tokens of all requests, then the (i + 1)-th, so that the clusters that run at the
        same time hold the tokens of a request together (their keys' rows and pages shared in
        L2); else u."""
        return gl.where(sq > 0, (u % batch) * sq + u // batch, u)

    @gluon.jit
    def _ps_segment(s, g0, g1, NPR, QOFF, batch, sq, K_CL, K_TOPK, K_idx_len,
                    HAS_TOPK: gl.constexpr, TOPK_TOK: gl.constexpr, B_P2: gl.constexpr,
                    BN: gl.constexpr):  # fmt: skip
        """Segment s of the pair range [g0, g1): (t, b, lo, hi, whole, part): token t (request
        b), its keys [lo, hi) (top-k positions), whether the range holds all of the token's
        pairs, else which part of it this is (0: its first pairs, 1: its last)."""
        one_l: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
        u = g0 // NPR + s  # the token's place in the work order
        p0 = gl.maximum(g0 - u * NPR, 0)
        p1 = gl.minimum(g1 - u * NPR, NPR)
        t = _ps_token(u, batch, sq)
        b, live, i0, leader, q_len = g_request(QOFF, batch, t, 1, B_P2, one_l)
        _cl, _lo, n_keys = g_key_range(
            K_CL, K_TOPK, b, t, live, leader, i0, q_len, 0, 1, K_idx_len, True, HAS_TOPK,
            TOPK_TOK, False, 1, BN,
        )  # fmt: skip
        lo = p0 * (2 * BN)
        hi = gl.minimum(p1 * (2 * BN), n_keys)
        whole = (p0 == 0) & (p1 == NPR)
        part = (p0 > 0).to(gl.int32)
        return t, b, lo, hi, whole, part

    @gluon.jit
    def _ps_put_info(info, t, lo, hi, whole, part):
        """Segment info (t, lo, hi, whole, part) into int32 info [8] (the producer's)."""
        one_l: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
        k = gl.arange(0, 8, layout=one_l)
        v = gl.where(k == 0, t, gl.where(k == 1, lo, gl.where(k == 2, hi, 0)))
        v = gl.where(k == 3, whole.to(gl.int32), gl.where(k == 4, part, v))
        info.store(v)

    @gluon.jit
    def _ps_get_info(info):
        """`_ps_put_info`'s (t, lo, hi, whole, part), in a consumer."""
        one_l: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
        k = gl.arange(0, 8, layout=one_l)
        v = info.load(one_l)
        t = gl.sum(gl.where(k == 0, v, 0), 0)
        lo = gl.sum(gl.where(k == 1, v, 0), 0)
        hi = gl.sum(gl.where(k == 2, v, 0), 0)
        whole = gl.sum(gl.where(k == 3, v, 0), 0) != 0
        part = gl.sum(gl.where(k == 4, v, 0), 0)
        return t, lo, hi, whole, part

    @gluon.jit
    def _ps_producer(args, cl, trp, H_Q: gl.constexpr, HAS_TOPK: gl.constexpr,
                     TOPK_TOK: gl.constexpr, B_P2: gl.constexpr, BN: gl.constexpr,
                     TRACE: gl.constexpr, ORDER: gl.constexpr, DEQ1: gl.constexpr,
                     PS_C: gl.constexpr, ADDR: gl.constexpr):  # fmt: skip
        """Four warps: for each segment, its info (`_ps_put_info`) and q once the consumers
        are done with the last one's (`qfree`; q and info complete `qready`), then its tiles
        (`ss_cross_tile`; an odd last tile all masked) into stage j % 2, the barrier phases
        counted over all pairs so far. PS_C, ADDR: as `gluon_mla_ss._ss_producer`'s."""
        (Q, stride_qt, stride_qh, QOFF, batch, n_tokens, K, K_IDX, K_CL, K_TOPK, K_stride,
         K_stride_h, K_stride_q, K_ps, K_psr, K_nenc, K_npages, K_idx_stride, K_idx_len, L,
         NPR, q_lat, q_rope, k_lat, k_rope, vbuf, bars, qready, qfree, info) = args  # fmt: skip
        ld_l: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
        row_l: gl.constexpr = gl.SliceLayout(1, ld_l)
        K_ps = PS_C if PS_C else K_ps
        cl_sync()  # the peer's barriers are initialized
        hb = gl.program_id(0) % 2
        g0, g1, n_seg = _ps_segments(L, NPR, n_tokens)
        sq = _ps_order(QOFF, batch, n_tokens, B_P2, ORDER)
        gp = g0 * 0  # pairs issued so far (the ring's phases)
        for s in range(n_seg):
            t, b, lo, hi, whole, part = _ps_segment(
                s, g0, g1, NPR, QOFF, batch, sq, K_CL, K_TOPK, K_idx_len, HAS_TOPK, TOPK_TOK, B_P2,
                BN,
            )  # fmt: skip
            mbarrier.wait(qfree, (s + 1) & 1, pred=s > 0)  # both consumers' last S of s - 1
            # (after that wait: the consumers read segment s - 2's info in its epilogue)
            _ps_put_info(info.index(s % 2), t, lo, hi, whole, part)
            ss_issue_q(Q, stride_qt, stride_qh, t, hb, q_lat, q_rope, H_Q, ld_l)
            cp.mbarrier_arrive(qready, increment_count=False)
            gl.thread_barrier()
            mbarrier.arrive(qready, count=1)  # (release: the info)
            if TRACE:
                gl.store(trp + 50 + 2 * s, g_clock(), mask=s < 14)
            n_it = gl.cdiv(gl.maximum(hi - lo, 0), BN)
            n_t = gl.cdiv(n_it, 2) * 2
            key = g_keys(lo, hi, b, t, K_IDX, K_IDX, 0, K_ps, K_idx_stride, True, BN, row_l)
            for j in range(n_t):
                start = lo + j * BN
                key_next = g_keys(start + BN, hi, b, t, K_IDX, K_IDX, 0, K_ps, K_idx_stride,
                                  True, BN, row_l)  # fmt: skip
                rows, valid = g_rows(start, hi, key, K_ps, K_psr, K_nenc, K_npages, True, BN,
                                     row_l)  # fmt: skip
                # (TRACE 2: the tile trace's first 32 tiles)
                tt = g_tile_slots(trp, 80, 2 * gp + j) if TRACE == 2 else 0
                ss_cross_tile(K, K_stride, K_stride_h, K_stride_q, k_lat, k_rope, vbuf, bars,
                              cl, j % 2, rows, valid, ((gp + j // 2) & 1) ^ 1, BN, False,
                              TRACE == 2, tt, DEQ1, ADDR)  # fmt: skip
                if TRACE:
                    gl.store(trp + 51 + 2 * s, g_clock(), mask=(s < 14) & (j == 0))
                key = key_next
            gp += n_t // 2
        cl_sync()  # no CTA exits while the other may still signal it

    @gluon.jit
    def _ps_finish(acc, m_o, m_w, l_w, l_buf, lx, s, t, hb, whole, part, OUT, stride_ot,
                   stride_oh, LSE, PO, PL, CUT_T, SINK, W: gl.constexpr, H_Q: gl.constexpr,
                   D_V: gl.constexpr, HAS_SINK: gl.constexpr, EPI: gl.constexpr,
                   srow: gl.constexpr, o_l: gl.constexpr):  # fmt: skip
        """Epilogue of consumer W for segment s: the row sums exchanged (l_buf [4, 64]: slots
        2 (s % 2) + w), O's 256 columns of this warpgroup normalized and stored from the
        accumulator layout: a whole token's into OUT (W = 0: and the LSE), with the sink; a
        cut one's float32 partial into PO / PL [2, G, h_q, ...] at (part, slot c - part), and
        its token into CUT_T [G] at that slot."""
        BM: gl.constexpr = 64
        orow: gl.constexpr = gl.SliceLayout(1, o_l)
        m_fin = gl.convert_layout(m_o, srow)
        m_fin_use = gl.where(m_fin == float("-inf"), 0.0, m_fin)
        lb = 2 * (s % 2)
        l_buf.index(lb + W).store(l_w * gl.exp2(m_w - m_fin_use))
        gl.thread_barrier()
        mbarrier.arrive(lx, count=1)
        mbarrier.wait(lx, s & 1)
        l_i = l_buf.index(lb).load(srow) + l_buf.index(lb + 1).load(srow)
        head_s = hb * BM + gl.arange(0, BM, layout=srow)
        ok_s = head_s < H_Q
        lse, inv = g_normalize(m_fin, l_i, SINK, head_s, ok_s, HAS_SINK)
        if HAS_SINK:  # a cut token's partials leave the sink to the combine
            _lse, inv_p = g_normalize(m_fin, l_i, SINK, head_s, ok_s, False)
            inv = gl.where(whole, inv, inv_p)
        o = acc * gl.convert_layout(inv, orow)[:, None]
        head_o = (hb * BM + gl.arange(0, BM, layout=orow)).to(gl.int64)
        do = W * 256 + gl.arange(0, 256, layout=gl.SliceLayout(0, o_l))
        omask = (head_o < H_Q)[:, None] & (do < D_V)[None, :]
        lse_o = gl.convert_layout(lse, orow)
        if whole:
            ob = o.to(OUT.dtype.element_ty)
            if EPI == 1:  # 16-byte stores: 8 columns a thread (convert_layout's scratch)
                st_l: gl.constexpr = gl.DistributedLinearLayout(
                    reg_bases=[[0, 1], [0, 2], [0, 4], [8, 0], [0, 32], [0, 64], [0, 128]],
                    lane_bases=[[0, 8], [0, 16], [1, 0], [2, 0], [4, 0]],
                    warp_bases=[[16, 0], [32, 0]],
                    block_bases=[],
                    shape=[BM, 256],
                )
                ob = gl.convert_layout(ob, st_l)
                hx = (hb * BM + gl.arange(0, BM, layout=gl.SliceLayout(1, st_l))).to(gl.int64)
                dx = W * 256 + gl.arange(0, 256, layout=gl.SliceLayout(0, st_l))
                optr = OUT + t.to(gl.int64) * stride_ot + hx[:, None] * stride_oh + dx[None, :]
                gl.store(optr, ob, mask=(hx < H_Q)[:, None] & (dx < D_V)[None, :])
            else:
                optr = OUT + t.to(gl.int64) * stride_ot + head_o[:, None] * stride_oh + do[None, :]
                gl.store(optr, ob, mask=omask)
            if W == 0:
                gl.store(LSE + t.to(gl.int64) * H_Q + head_o, lse_o, mask=head_o < H_Q)
        else:
            slot = gl.program_id(0) // 2 - part
            G = gl.num_programs(0) // 2
            prow = (part * G + slot).to(gl.int64) * H_Q + head_o
            gl.store(PO + prow[:, None] * D_V + do[None, :], o, mask=omask)
            if W == 0:
                gl.store(PL + prow, lse_o, mask=head_o < H_Q)
                gl.store(CUT_T + slot, t)  # (for the combine)

    @gluon.jit
    def _ps_consume(args, cl, trp, W: gl.constexpr, H_Q: gl.constexpr,
                    HAS_SINK: gl.constexpr, D_V: gl.constexpr, BN: gl.constexpr,
                    EPI: gl.constexpr, TRACE: gl.constexpr):  # fmt: skip
        """Consumer warpgroup W: for each segment, wait for its q, run its pairs of tiles
        (`ss_pair`, order 1, half stages, cluster), then `_ps_finish`."""
        if W == 1:  # (warpgroup 0 arrived at the end of the kernel's prologue)
            cl_arrive()
        cl_wait()
        (OUT, stride_ot, stride_oh, LSE, PO, PL, CUT_T, SINK, qk_scale, n_tokens, L, NPR,
         q_lat, q_rope, k_lat, k_rope, vbuf, m_buf, l_buf, bars, qready, qfree,
         info) = args  # fmt: skip
        ready, empty, pm, lx, rempty = bars
        BM: gl.constexpr = 64
        s_l: gl.constexpr = SS_S_L
        o_l: gl.constexpr = SS_O_L
        srow: gl.constexpr = gl.SliceLayout(1, s_l)
        orow: gl.constexpr = gl.SliceLayout(1, o_l)
        hb = gl.program_id(0) % 2
        kcol = gl.arange(0, BN, layout=gl.SliceLayout(0, s_l))
        zero_s = gl.zeros([BM, BN], gl.float32, s_l)
        row_lim = gl.zeros([BM], gl.int32, srow)  # (no causal mask: sparse)
        g0, g1, n_seg = _ps_segments(L, NPR, n_tokens)
        gp = g0 * 0  # pairs consumed so far (the ring's phases)
        for s in range(n_seg):
            acc = gl.zeros([BM, 256], gl.float32, o_l)
            m_o = gl.full([BM], float("-inf"), gl.float32, orow)
            m_w = gl.full([BM], float("-inf"), gl.float32, srow)
            l_w = gl.zeros([BM], gl.float32, srow)
            mbarrier.wait(qready, s & 1)
            fence_async_shared()  # q's cp.async writes, before wgmma reads them
            _t, lo, hi, _whole, _part = _ps_get_info(info.index(s % 2))
            n_pairs = gl.cdiv(gl.cdiv(gl.maximum(hi - lo, 0), BN), 2)
            if TRACE and W == 0:
                gl.store(trp + 2 + 4 * s, g_clock(), mask=s < 12)
            mbarrier.arrive(qfree, count=1, pred=n_pairs == 0)  # no S reads this q
            for i in range(n_pairs):
                if TRACE == 2:
                    tt = g_pair_slots(trp, 80, W, gp + i)
                    ss_tick_ready(tt, ready, W, (gp + i) & 1)
                acc, m_o, m_w, l_w = ss_pair(
                    acc, m_o, m_w, l_w, (gp + i) // 2147483647, (gp + i) & 1, 2 * i, lo, q_lat,
                    q_rope, k_lat, k_rope, vbuf, m_buf, bars, cl, qfree, i == n_pairs - 1, kcol,
                    row_lim, zero_s, qk_scale, True, W, False, 1, True, True, BN, o_l,
                )  # fmt: skip
                if TRACE == 2:
                    g_tick(tt, 3)
                if TRACE and W == 0:
                    gl.store(trp + 3 + 4 * s, g_clock(), mask=(s < 12) & (i == 0))
            gp += n_pairs
            if TRACE and W == 0:
                gl.store(trp + 4 + 4 * s, g_clock(), mask=s < 12)
            t, _lo, _hi, whole, part = _ps_get_info(info.index(s % 2))  # (not kept in registers)
            _ps_finish(acc, m_o, m_w, l_w, l_buf, lx, s, t, hb, whole, part, OUT, stride_ot,
                       stride_oh, LSE, PO, PL, CUT_T, SINK, W, H_Q, D_V, HAS_SINK, EPI, srow,
                       o_l)  # fmt: skip
            if TRACE and W == 0:
                gl.store(trp + 5 + 4 * s, g_clock(), mask=s < 12)
        if TRACE and W == 0:
            gl.store(trp + 78, g_clock())
            gl.store(trp + 76, g_cycles())
        cl_sync()  # no CTA exits while the other may still signal it

    @gluon.jit(do_not_specialize=["OFF_K", "OFF_READY", "OFF_REMPTY", "L", "NPR"])
    def _mla_decode_sm90_ps(
        q_args, out_args, k_args, L, NPR,
        H_Q: gl.constexpr, D_V: gl.constexpr, B_P2: gl.constexpr, HAS_SINK: gl.constexpr,
        HAS_TOPK: gl.constexpr, TOPK_TOK: gl.constexpr, BN: gl.constexpr,
        CONSUMER_REGS: gl.constexpr, PRODUCER_REGS: gl.constexpr,
        EPI: gl.constexpr = 0, ORDER: gl.constexpr = 1, OFF_K=0, OFF_READY=0, OFF_REMPTY=0,
        TRACE: gl.constexpr = False, TR=None, DEQ1: gl.constexpr = False,
        PS_C: gl.constexpr = 0, ADDR: gl.constexpr = False,
    ):  # fmt: skip
        """See the module docstring. Grid: G clusters of 2 CTAs (`launch(..., cluster=2)`;
        CTA 2 c + r: head block r of cluster c's tokens); L, NPR: pairs a cluster, pairs a
        token; PO [2, G, h_q, D_V] / PL [2, G, h_q] float32, CUT_T [G] int32: the cut tokens'
        partials and tokens. ORDER: the work order (1: the i-th tokens of all requests first
        where the query lengths are equal, 0: token order; `_ps_order`). OFF_*: shared
        offsets of k_lat, ready and rempty (`gluon_cluster.smem_offsets`). Launch
        with num_warps=4 (consumer 0). TRACE: development timestamps into int64 TR [CTAs,
        80] (`dev/gpu_mla_dev.py --trace ps`): 0 start, 1 SM, 2 + 4 s .. 5 + 4 s segment s's
        q ready / first pair done / loop end / stored (consumer 0), 50 + 2 s, 51 + 2 s its q
        issued / first tile released (producer), 79 the segment count; 77 / 76 the SM's cycle
        counter at the start / end, 78 the end's time. TRACE 2: TR [CTAs, 464] with the tile
        trace of the first 32 tiles in slots 80 + 8 j + e (producer) and 336 + 64 W + 4 i + e
        (consumer W, pair i), as `gluon_mla_ss`'s TRACE 2 lays it out from slot 10."""
        Q, stride_qt, stride_qh, QOFF, batch, n_tokens = q_args
        OUT, stride_ot, stride_oh, LSE, PO, PL, CUT_T, SINK, qk_scale = out_args
        (K, K_CL, K_IDX, K_TOPK, K_stride, K_stride_h, K_stride_q, K_ps, K_psr, K_nenc,
         K_npages, K_idx_stride, K_idx_len) = k_args  # fmt: skip
        BM: gl.constexpr = 64
        trp = gl.program_id(0)
        if TRACE:
            trp = TR + gl.program_id(0) * (80 + TILE_TRACE if TRACE == 2 else 80)
            gl.store(trp, g_clock())
            gl.store(trp + 1, g_smid())
            gl.store(trp + 77, g_cycles())
        ld_l: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
        v1_l: gl.constexpr = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[0])
        bar_l: gl.constexpr = mbarrier.MBarrierLayout()
        q_lat, q_rope, k_lat, k_rope, vbuf, m_buf, l_buf, ready, empty, pm, lx, rempty = ss_alloc(
            BN, 2
        )  # l_buf: a set a segment parity; rempty: the peer's consumers' arrivals
        qbar = gl.allocate_shared_memory(gl.int64, [2, 1], bar_l)  # qready, qfree
        info = gl.allocate_shared_memory(gl.int32, [2, 8], v1_l)  # `_ps_put_info`, by parity
        for i in gl.static_range(2):
            mbarrier.init(ready.index(i), count=129)  # 128 cp.async arrivals + the release
            for h in gl.static_range(2):  # [stage, half]: consumer `half` (of the peer)
                mbarrier.init(empty.index(2 * i + h), count=1)
                mbarrier.init(rempty.index(2 * i + h), count=1)
            mbarrier.init(pm.index(i), count=1)
        mbarrier.init(lx, count=2)
        mbarrier.init(qbar.index(0), count=129)  # the producer's cp.async arrivals + release
        mbarrier.init(qbar.index(1), count=2)  # both consumers
        # No NaN from an unwritten slot: a masked row's rope cp.async is skipped and keeps
        # what the stage held (these zeros, an earlier finite row or P); the latent part of
        # every row is written (masked rows as zeros).
        for i in gl.static_range(2):
            k_rope.index(i).store(gl.zeros([BN, 64], gl.bfloat16, ld_l))
        if H_Q < 2 * BM:  # padded query rows: zeros (`ss_issue_q` skips them)
            q_lat.index(0).store(gl.zeros([BM, 512], gl.bfloat16, ld_l))
            q_rope.index(0).store(gl.zeros([BM, 64], gl.bfloat16, ld_l))
        fence_async_shared()
        gl.thread_barrier()
        cl_fence_init()  # barriers and zeroed stages, before the peer may touch them
        cl_arrive()
        cl = (OFF_K, OFF_READY, OFF_REMPTY, gl.program_id(0) % 2)
        bars = (ready, empty, pm, lx, rempty)
        qready = qbar.index(0)
        qfree = qbar.index(1)
        c_args = (
            OUT, stride_ot, stride_oh, LSE, PO, PL, CUT_T, SINK, qk_scale, n_tokens, L, NPR,
            q_lat, q_rope, k_lat, k_rope, vbuf, m_buf, l_buf, bars, qready, qfree, info,
        )  # fmt: skip
        p_args = (
            Q, stride_qt, stride_qh, QOFF, batch, n_tokens, K, K_IDX, K_CL, K_TOPK, K_stride,
            K_stride_h, K_stride_q, K_ps, K_psr, K_nenc, K_npages, K_idx_stride, K_idx_len, L,
            NPR, q_lat, q_rope, k_lat, k_rope, vbuf, bars, qready, qfree, info,
        )  # fmt: skip
        if TRACE:
            g0, g1, n_seg = _ps_segments(L, NPR, n_tokens)
            gl.store(trp + 79, n_seg.to(gl.int64))
        # fmt: off
        gl.warp_specialize(
            [
                (_ps_consume, (c_args, cl, trp, 0, H_Q, HAS_SINK, D_V, BN, EPI, TRACE)),
                (_ps_consume, (c_args, cl, trp, 1, H_Q, HAS_SINK, D_V, BN, EPI, TRACE)),
                (_ps_producer, (p_args, cl, trp, H_Q, HAS_TOPK, TOPK_TOK, B_P2, BN, TRACE,
                                ORDER, DEQ1, PS_C, ADDR)),
            ],
            [4, 4],
            [CONSUMER_REGS, PRODUCER_REGS],
        )
        # fmt: on

else:  # Triton without Gluon: never launched (`triton_mla._use_sm90_path`)
    _mla_decode_sm90_ps = None
