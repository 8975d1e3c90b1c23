"""Gluon sm_90 seesaw MLA decode fed by TMA, for dense BF16 caches whose pages hold whole 64-key
tiles (page size a multiple of 64).

`_mla_decode_sm90_st` has the contract, arguments and grid of `gluon_mla_ss._mla_decode_sm90_ss`
(64 query rows, one key partition a program, two consumer warpgroups splitting O by columns, the
seesaw order of its products: `gluon_mla_ss` order 2), with the ring fed differently:
- no producer warpgroup: a stage is refilled by the warpgroup that reads a part of it last, as
  soon as its product on that part is complete, by TMA into one of three `ready` mbarriers a
  stage (byte counts): the rope columns (read by the tile's S only; a [64 keys, 64 columns]
  box), columns 0..255 (read by S and warpgroup 0's P V) and 256..511 (S and warpgroup 1's P V;
  one [4, 64, 64] box of a 3D descriptor that sees a row's 64-column chunks as its outer
  dimension, so the box lands as the four swizzled chunks the stage holds). No `empty`
  barriers: the refill is issued after the reads it must follow;
- S = Q K^T waits for each part as it needs it, in the order the parts are refilled: the rope
  product (Q's rope columns in registers, so its 8 KB hold warpgroup 1's P) on the first 8 KB
  of a refilled stage, then columns 0..255, then 256..511;
- P goes into its own buffers (one a warpgroup), not the stage's rope slot;
- rows of the last tile past the key range (a page's unwritten slots may hold NaN) are zeroed
  by the tile's S warpgroup before its P is published.

The selection (`ops.mla.triton_mla_plan`) takes it for every seesaw launch (see `gluon_mla_ss`) over
a dense BF16 cache with pages of a multiple of 64 rows, unless the TMA seesaw is turned off.
Limits: BF16, dense (no sparse indices), d_qk 576, BN 64 (asserted); the cache rows' base and
stride 16-byte aligned (TMA descriptors from `st_descriptors`); launch with num_warps=4, one
worker partition, REGS registers a thread (240).

Design history and measurements: docs/kernels/gluon_mla_st.md.
"""

from __future__ import annotations

import torch

from ...gluon_imports import (
    HAS_GLUON,
    GluonTensorDescriptor,
    fence_async_shared,
    gl,
    gluon,
    mbarrier,
    nvmma_128b,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)


def st_descriptors(rows: torch.Tensor):
    """The kernel's two Gluon TMA descriptors (128-byte swizzle) over BF16 cache rows
    [rows, 1, 576] (16-byte aligned base and row stride: `triton_mla_plan.sm90_serves`): KD of
    [64, 64] boxes over [rows, 576] (the rope columns), KD3 of [4, 64, 64] boxes over the rows
    seen as [chunk, row, 64] (the nine 64-column chunks outermost: a box is the four swizzled
    chunks of a column half, as the stage holds them)."""
    view = rows[:, 0]
    kd = GluonTensorDescriptor(view, list(view.shape), list(view.stride()), [64, 64], nvmma_128b(2))
    shape, strides = [9, rows.shape[0], 64], [64, rows.stride(0), 1]
    return kd, GluonTensorDescriptor(rows, shape, strides, [4, 64, 64], nvmma_128b(3))


if HAS_GLUON:
    from .gluon_mla import (
        g_clock,
        g_early_q,
        g_key_range,
        g_list_item,
        g_put_q,
        g_request,
        g_run_choice,
        g_run_meta,
        g_run_step,
        g_run_stream,
        g_seesaw_start,
        g_tile_rows,
        g_trace_close,
        g_trace_open,
        g_work_item,
    )
    from .gluon_mla_ss import (
        ss_finish,
        ss_other,
        ss_pv_own,
        ss_softmax,
    )

    @gluon.jit
    def _st_row(LUT, b, lut_stride, start, ok, ps, psr, n_pages):
        """Physical row (int32) of key position `start`, a tile's first (the tile stays in its
        page), its look-up-table entry loaded where `ok` (0 elsewhere: the caller predicates
        the copy on the tile's existence)."""
        blk = gl.load(LUT + b * lut_stride + start // ps, mask=ok, other=0)
        blk = gl.minimum(gl.maximum(blk, 0), n_pages - 1)
        return blk * psr + start % ps

    @gluon.jit
    def _st_issue(kd, k_lat, k_rope, ready, st: gl.constexpr, g: gl.constexpr, row, pred):
        """TMA part g of a tile (0: columns 0..255, 1: 256..511, 2: the rope columns) at
        physical row `row` into stage st, completing on ready[3 st + g]; nothing unless pred.
        kd = (KD, KD3) of `st_descriptors`: the rope columns are a KD box, a column half one
        KD3 box."""
        KD, KD3 = kd
        bar = ready.index(3 * st + g)
        if g == 2:
            mbarrier.expect(bar, 64 * 64 * 2, pred=pred)
            tma.async_copy_global_to_shared(KD, [row, 512], bar, k_rope.index(st), pred=pred)
        else:
            l3: gl.constexpr = gl.NVMMASharedLayout(
                swizzle_byte_width=128, element_bitwidth=16, rank=3
            )
            dst = k_lat.index(st)._reinterpret(gl.bfloat16, [8, 64, 64], l3).slice(4 * g, 4, dim=0)
            mbarrier.expect(bar, 4 * 64 * 64 * 2, pred=pred)
            tma.async_copy_global_to_shared(KD3, [4 * g, row, 0], bar, dst, pred=pred)

    @gluon.jit
    def _st_s(q_lat, q_rope, kl, kr, ready, st: gl.constexpr, ph, zero_s):
        """S = Q K^T of the tile in stage st: the rope product once that part has landed, then
        columns 0..255 and 256..511, each once landed (the order the parts are refilled in:
        module docstring); complete."""
        mbarrier.wait(ready.index(3 * st + 2), ph)
        s = warpgroup_mma(q_rope, kr.permute((1, 0)), zero_s, use_acc=False, is_async=True)
        for h in gl.static_range(2):
            mbarrier.wait(ready.index(3 * st + h), ph)
            s = warpgroup_mma(
                q_lat.slice(h * 256, 256, dim=1),
                kl.slice(h * 256, 256, dim=1).permute((1, 0)),
                s,
                is_async=True,
            )
        return warpgroup_mma_wait(num_outstanding=0, deps=(s,))

    @gluon.jit
    def _st_own_s(q_l, q_rope, kl, kr, kd, k_lat, k_rope, ready, st: gl.constexpr, ph, zero_s,
                  start, hi, r_next, BN: gl.constexpr):  # fmt: skip
        """S of the own tile (`_st_s`), then the refill of its rope part with the tile two
        ahead (at row r_next) and, for a tile past the key range's end, its rows past it
        zeroed (before P is published)."""
        s = _st_s(q_l, q_rope, kl, kr, ready, st, ph, zero_s)
        _st_issue(kd, k_lat, k_rope, ready, st, 2, r_next, start + 2 * BN < hi)
        if start + BN > hi:
            _st_zero_tail(kl, hi - start)
        return s

    @gluon.jit
    def _st_own(acc, m_o, m_prev, m_w, l_w, q_l, q_rope, kl, kr, p_own, kd, k_lat, k_rope, ready,
                pm, m_buf, ph, zero_s, start, hi, r_next, kcol, row_lim, qk_scale,
                W: gl.constexpr, MASK_CAUSAL: gl.constexpr, BN: gl.constexpr,
                o_l: gl.constexpr):  # fmt: skip
        """Warpgroup W's own tile (stage W) whole: S (`_st_own_s`), softmax against m_prev (P
        into p_own, published on pm[W]), its P V, then the refill of the column half it read
        last. Returns (O, m_o, new max, m_w, l_w)."""
        s = _st_own_s(q_l, q_rope, kl, kr, kd, k_lat, k_rope, ready, W, ph, zero_s, start, hi,
                      r_next, BN)  # fmt: skip
        keep = (start + kcol < hi)[None, :]
        pb, m_new, m_w, l_w = ss_softmax(s, m_prev, m_w, l_w, p_own, keep, m_buf, pm, start,
                                         kcol, row_lim, W, MASK_CAUSAL, qk_scale)  # fmt: skip
        acc, m_o = ss_pv_own(acc, m_o, m_new, pb, kl, W, o_l)
        _st_issue(kd, k_lat, k_rope, ready, W, W, r_next, start + 2 * BN < hi)
        return acc, m_o, m_new, m_w, l_w

    @gluon.jit
    def _st_zero_tail(kl, n_ok):
        """Rows n_ok.. of a stage's columns 0..511 set to 0 (a tile's rows past the key range:
        P is 0 there, but 0 * NaN is not)."""
        z_l: gl.constexpr = gl.BlockedLayout([1, 8], [2, 16], [4, 1], [1, 0])
        r = gl.arange(0, 64, layout=gl.SliceLayout(1, z_l))
        for c in gl.static_range(4):
            part = kl.slice(c * 128, 128, dim=1)
            x = part.load(z_l)
            part.store(gl.where((r < n_ok)[:, None], x, gl.zeros_like(x)))

    @gluon.jit
    def _st_walk(q_lat, k_lat, k_rope, p_buf, m_buf, ready, pm, kd, K_LUT, K_lut_stride, K_ps,
                 K_psr, K_npages, trp, t, hb, b, i0, q_len, cache_len, lo, hi, qk_scale, ph0,
                 ph1, W: gl.constexpr, H_Q: gl.constexpr, HPT: gl.constexpr, TPT: gl.constexpr,
                 CAUSAL: gl.constexpr, BN: gl.constexpr, TRACE: gl.constexpr):  # fmt: skip
        """Consumer warpgroup W's walk of the keys [lo, hi) of one tile (the module docstring's
        pairs of tiles), tiles 0 and 1 already issued and q in q_lat / Q's rope columns in P's
        buffer of warpgroup 1. ph0 / ph1: how many times the barriers of stage 0 / stage 1
        (and pm[0] / pm[1]) completed before this walk (0 for a kernel's only tile; the runs
        walk several). Returns (O [64, 256] f32 scaled to max m_o, m_o, m_w, l_w, head_s,
        rows_ok_s, tiles walked)."""
        BM: gl.constexpr = 64
        s_l: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BN, 16]
        )
        o_l: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 256, 16]
        )
        q_dot: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=s_l, k_width=2)
        srow: gl.constexpr = gl.SliceLayout(1, s_l)
        orow: gl.constexpr = gl.SliceLayout(1, o_l)
        MASK_CAUSAL: gl.constexpr = CAUSAL

        rs = gl.arange(0, BM, layout=srow)
        rows_ok_s, tqs, _tok, head_s = g_tile_rows(rs, t, hb, i0, q_len, H_Q, HPT, TPT)
        row_lim = gl.where(rows_ok_s, cache_len + i0 + tqs + 1, 0)
        kcol = gl.arange(0, BN, layout=gl.SliceLayout(0, s_l))
        zero_s = gl.zeros([BM, BN], gl.float32, s_l)
        # Q's rope columns, the A operand of the rope product, in registers (from P's buffer
        # of warpgroup 1, which writes its first P after warpgroup 0's first P is out)
        q_rope = p_buf.index(1).load(q_dot)

        acc = gl.zeros([BM, 256], gl.float32, o_l)
        m_o = gl.full([BM], float("-inf"), gl.float32, orow)  # running max O is scaled to
        m_w = gl.full([BM], float("-inf"), gl.float32, srow)  # ... l_w is scaled to
        l_w = gl.zeros([BM], gl.float32, srow)  # row sums of this warpgroup's own tiles
        m_prev = gl.full([BM], float("-inf"), gl.float32, srow)  # W 0: max after tile 2 i - 1
        n_it = gl.cdiv(gl.maximum(hi - lo, 0), BN)
        n_pairs = gl.cdiv(n_it, 2)
        for i in range(n_pairs):
            f0 = (ph0 + i) & 1  # phase of stage 0's barriers and pm[0] in this pair
            f1 = (ph1 + i) & 1  # ... stage 1's and pm[1]
            # A zero the compiler cannot fold: with constant buffer indices the wgmma
            # descriptors (64-bit, one a k-step) are hoisted out of the loop and spill.
            z = i // 2147483647
            q_l = q_lat.index(z)
            kl0 = k_lat.index(z)
            kr0 = k_rope.index(z)
            kl1 = k_lat.index(1 + z)
            kr1 = k_rope.index(1 + z)
            p0 = p_buf.index(z)
            p1 = p_buf.index(1 + z)
            s0 = lo + 2 * i * BN
            s1 = s0 + BN
            has1 = s1 < hi
            # the next pair's rows, loaded under this pair's products
            r0 = _st_row(K_LUT, b, K_lut_stride, s0 + 2 * BN, s0 + 2 * BN < hi, K_ps, K_psr,
                         K_npages)  # fmt: skip
            r1 = _st_row(K_LUT, b, K_lut_stride, s1 + 2 * BN, s1 + 2 * BN < hi, K_ps, K_psr,
                         K_npages)  # fmt: skip
            if W == 0:
                acc, m_o, m_prev, m_w, l_w = _st_own(
                    acc, m_o, m_prev, m_w, l_w, q_l, q_rope, kl0, kr0, p0, kd, k_lat, k_rope,
                    ready, pm, m_buf, f0, zero_s, s0, hi, r0, kcol, row_lim, qk_scale, 0,
                    MASK_CAUSAL, BN, o_l,
                )  # fmt: skip
                if has1:
                    mbarrier.wait(pm.index(1), f1)  # P and max of tile 2 i + 1
                    m_prev = m_buf.index(1).load(srow)
                    acc, m_o = ss_other(acc, m_o, gl.convert_layout(m_prev, orow), kl1, p1, 0)
                    _st_issue(kd, k_lat, k_rope, ready, 1, 0, r1, s1 + 2 * BN < hi)
            elif has1:  # warpgroup 1: S and softmax of tile 2 i + 1, tile 2 i's P V, its P V
                s = _st_own_s(q_l, q_rope, kl1, kr1, kd, k_lat, k_rope, ready, 1, f1, zero_s,
                              s1, hi, r1, BN)  # fmt: skip
                mbarrier.wait(pm.index(0), f0)  # P and max of tile 2 i
                m_x = m_buf.index(0).load(srow)
                keep = (s1 + kcol < hi)[None, :]
                pb, m_new, m_w, l_w = ss_softmax(
                    s, m_x, m_w, l_w, p1, keep, m_buf, pm, s1, kcol, row_lim, 1, MASK_CAUSAL,
                    qk_scale,
                )  # fmt: skip
                acc, m_o = ss_other(acc, m_o, gl.convert_layout(m_x, orow), kl0, p0, 1)
                _st_issue(kd, k_lat, k_rope, ready, 0, 1, r0, s0 + 2 * BN < hi)
                acc, m_o = ss_pv_own(acc, m_o, m_new, pb, kl1, 1, o_l)
                _st_issue(kd, k_lat, k_rope, ready, 1, 1, r1, s1 + 2 * BN < hi)
            else:  # warpgroup 1, a last pair of one tile: that tile's P V
                # P from shared memory into registers (the A operand), not `ss_other` again:
                # for a second call site of that product ptxas 12.8 (Triton 3.6) took the
                # k-step 1-3 descriptors of P from a uniform register set only on the path
                # above, so a key range of one tile summed P V over its first 16 keys, and a
                # stale descriptor could fault (docs/kernels/gluon_mla_st.md). Once a request.
                mbarrier.wait(pm.index(0), f0)
                m_x = m_buf.index(0).load(srow)
                acc, m_o = ss_pv_own(acc, m_o, m_x, p0.load(s_l), kl0, 1, o_l)
            if TRACE and W == 0:
                if i == 0:
                    gl.store(trp + 2, g_clock())
        return acc, m_o, m_w, l_w, head_s, rows_ok_s, n_it

    @gluon.jit
    def _st_store(acc, m_o, m_w, l_w, head_s, rows_ok_s, o_stage, l_buf, lx, outs, t, hb, i0,
                  q_len, part, split, lx_ph, W: gl.constexpr, H_Q: gl.constexpr,
                  HPT: gl.constexpr, TPT: gl.constexpr, D_V: gl.constexpr,
                  HAS_SINK: gl.constexpr, BN: gl.constexpr):  # fmt: skip
        """A balanced tile's epilogue (`ss_finish` through o_stage [64, 512], columns W * 256..
        its own): where `split` (run time), partials at rows part + t + i, else the output
        (sinks folded)."""
        OUT, stride_ot, stride_oh, LSE, PO, PL, SINK = outs
        s_l: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BN, 16]
        )
        o_l: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 256, 16]
        )
        srow: gl.constexpr = gl.SliceLayout(1, s_l)
        if split:
            ss_finish(acc, m_o, m_w, l_w, l_buf, lx, head_s, rows_ok_s, o_stage, OUT, stride_ot,
                      stride_oh, LSE, PO, PL, SINK, t, hb, i0, q_len, part, 1, W, H_Q, HPT, TPT,
                      D_V, HAS_SINK, True, srow, o_l, lx_ph)  # fmt: skip
        else:
            ss_finish(acc, m_o, m_w, l_w, l_buf, lx, head_s, rows_ok_s, o_stage, OUT, stride_ot,
                      stride_oh, LSE, PO, PL, SINK, t, hb, i0, q_len, part, 1, W, H_Q, HPT, TPT,
                      D_V, HAS_SINK, False, srow, o_l, lx_ph)  # fmt: skip

    @gluon.jit
    def _st_consume(args, W: gl.constexpr, H_Q: gl.constexpr, HPT: gl.constexpr,
                    TPT: gl.constexpr, CAUSAL: gl.constexpr, HAS_SINK: gl.constexpr,
                    SPLIT: gl.constexpr, D_V: gl.constexpr, BN: gl.constexpr,
                    TRACE: gl.constexpr, BALANCED: gl.constexpr = False):  # fmt: skip
        """Consumer warpgroup W (see the module docstring) of a one-tile CTA; writes its 256
        output columns (and, W = 0, the LSE)."""
        (OUT, stride_ot, stride_oh, LSE, PO, PL, SINK, qk_scale, n_tokens, kd, K_LUT,
         K_lut_stride, K_ps, K_psr, K_npages, trp,
         t, hb, b, i0, q_len, part, cache_len, lo, hi, split,
         q_lat, k_lat, k_rope, p_buf, m_buf, l_buf, bars) = args  # fmt: skip
        ready, pm, lx = bars
        acc, m_o, m_w, l_w, head_s, rows_ok_s, n_it = _st_walk(
            q_lat, k_lat, k_rope, p_buf, m_buf, ready, pm, kd, K_LUT, K_lut_stride, K_ps, K_psr,
            K_npages, trp, t, hb, b, i0, q_len, cache_len, lo, hi, qk_scale, 0, 0, W, H_Q, HPT,
            TPT, CAUSAL, BN, TRACE,
        )  # fmt: skip
        if TRACE:
            gl.store(trp + 3 + 2 * W, g_clock())
            gl.store(trp + 7, n_it.to(gl.int64))
        if BALANCED:  # partial rows item * TPT + i where the tile has several items
            _st_store(acc, m_o, m_w, l_w, head_s, rows_ok_s, k_lat.index(W), l_buf, lx,
                      (OUT, stride_ot, stride_oh, LSE, PO, PL, SINK), t, hb, i0, q_len, part,
                      split, 0, W, H_Q, HPT, TPT, D_V, HAS_SINK, BN)  # fmt: skip
        else:
            s_l: gl.constexpr = gl.NVMMADistributedLayout(
                version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BN, 16]
            )
            o_l: gl.constexpr = gl.NVMMADistributedLayout(
                version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 256, 16]
            )
            srow: gl.constexpr = gl.SliceLayout(1, s_l)
            ss_finish(acc, m_o, m_w, l_w, l_buf, lx, head_s, rows_ok_s, k_lat.index(W), OUT,
                      stride_ot, stride_oh, LSE, PO, PL, SINK, t, hb, i0, q_len, part, n_tokens,
                      W, H_Q, HPT, TPT, D_V, HAS_SINK, SPLIT, srow, o_l)  # fmt: skip
        if TRACE and W == 0:
            gl.thread_barrier()
            g_trace_close(trp)

    @gluon.jit
    def _st_segment(pos, begin, end, p, size, use_items, list_in, TPT: gl.constexpr,
                    BN: gl.constexpr, B_P2: gl.constexpr, RUN_OVH: gl.constexpr,
                    RUN_P: gl.constexpr, MIN_BLOCKS: gl.constexpr,
                    CAUSAL: gl.constexpr):  # fmt: skip
        """The segment a `RUNS` program walks at position pos (`g_run_step`), with its
        request's fields: (ok, t, n_tok, lo, hi, slot, n_pieces, first, nxt, b, i0, q_len,
        cache_len). ok: pos is before the end and the segment holds blocks (an empty segment
        is a piece's last: it ends in its tile's prologue units); [lo, hi): its keys after
        the causal clamp (`g_key_range`; may be empty, and the tile's epilogue still runs)."""
        QOFF, batch, K_CL, K_TOPK, NUM_P, K_idx_len = list_in
        one_l: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
        stream = g_run_stream(QOFF, K_CL, batch, TPT, BN, RUN_OVH, B_P2, one_l)
        t_i, lo_i, hi_i, c_i = 0, 0, 0, 1
        if use_items:
            _n, _ok, t_i, lo_i, hi_i, c_i, _m, _s = g_list_item(
                QOFF, K_CL, batch, pos.to(gl.int32), TPT, BN, RUN_P, MIN_BLOCKS, B_P2, one_l
            )
        t, n_tok, lo, hi, slot, n_pieces, first, nxt = g_run_step(
            stream, use_items, (t_i, lo_i, hi_i, c_i), p, pos, begin, end, size, QOFF, batch,
            TPT, BN, RUN_OVH, B_P2, RUN_P,
        )  # fmt: skip
        ok = (pos < end) & (lo < hi)
        b, live, i0, leader, q_len = g_request(QOFF, batch, t, TPT, B_P2, one_l)
        cache_len, lo, hi = g_key_range(
            K_CL, K_TOPK, b, t, live & ok, leader, i0, q_len, 0, NUM_P, K_idx_len, False, False,
            False, CAUSAL, TPT, BN, (lo, hi),
        )  # fmt: skip
        return ok, t, n_tok, lo, hi, slot, n_pieces, first, nxt, b, i0, q_len, cache_len

    @gluon.jit
    def _st_issue_first(kd, k_lat, k_rope, ready, K_LUT, b, K_lut_stride, lo, hi, K_ps, K_psr,
                        K_npages, BN: gl.constexpr):  # fmt: skip
        """Tiles 0 and 1 of the key range [lo, hi) of request b into stages 0 and 1
        (`_st_issue_rows`)."""
        r0 = _st_row(K_LUT, b, K_lut_stride, lo, lo < hi, K_ps, K_psr, K_npages)
        r1 = _st_row(K_LUT, b, K_lut_stride, lo + BN, lo + BN < hi, K_ps, K_psr, K_npages)
        _st_issue_rows(kd, k_lat, k_rope, ready, r0, r1, lo, hi, BN)

    @gluon.jit
    def _st_issue_rows(kd, k_lat, k_rope, ready, r0, r1, lo, hi, BN: gl.constexpr):
        """Tiles 0 and 1 of the key range [lo, hi) (physical rows r0, r1) into stages 0 and 1,
        each part in the order S reads them (`_st_s`)."""
        _st_issue(kd, k_lat, k_rope, ready, 0, 2, r0, lo < hi)
        _st_issue(kd, k_lat, k_rope, ready, 0, 0, r0, lo < hi)
        _st_issue(kd, k_lat, k_rope, ready, 0, 1, r0, lo < hi)
        _st_issue(kd, k_lat, k_rope, ready, 1, 2, r1, lo + BN < hi)
        _st_issue(kd, k_lat, k_rope, ready, 1, 0, r1, lo + BN < hi)
        _st_issue(kd, k_lat, k_rope, ready, 1, 1, r1, lo + BN < hi)

    @gluon.jit
    def _st_runs(args, W: gl.constexpr, H_Q: gl.constexpr, HPT: gl.constexpr,
                 TPT: gl.constexpr, CAUSAL: gl.constexpr, HAS_SINK: gl.constexpr,
                 D_V: gl.constexpr, BN: gl.constexpr, B_P2: gl.constexpr,
                 RUN_OVH: gl.constexpr, RUN_P: gl.constexpr,
                 MIN_BLOCKS: gl.constexpr):  # fmt: skip
        """Consumer warpgroup W of a `RUNS` CTA: its segments one after the other
        (`_st_segment`: where `use_items`, items p, p + RUN_P, ... of the list; else piece p
        of the contiguous runs), each a walk of its keys (`_st_walk`) and its epilogue
        (partials at slot rows where its tile is cut, else the output). Per segment,
        warpgroup 0 finds it, waits until both warpgroups are done with the previous one
        (barrier `seg_done`, count 2: the epilogues' ring stages, q and P's buffers are free),
        issues its first two tiles, stores its q and signals warpgroup 1 (barrier `q_ready`);
        it also writes the META of the tiles whose first block its segments hold. The walks'
        barriers keep their phases across segments (`_st_walk`'s ph0 / ph1).

        (Two ways of starting a segment earlier measured slower on the H200,
        docs/kernels/gluon_mla_st.md, "Contiguous runs": the next segment found and its first
        tiles issued before the epilogue, staged through q's buffer; the first segment issued
        by the kernel's prologue.)"""
        (outs, qk_scale, kd, K_LUT, K_lut_stride, K_ps, K_psr, K_npages, q_in, list_in, META,
         p, hb, begin, end, size, use_items,
         q_lat, k_lat, k_rope, p_buf, m_buf, l_buf, bars) = args  # fmt: skip
        Q, stride_qt, stride_qh = q_in
        ready, pm, lx, seg_done, q_ready = bars
        ld_l: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
        pos = begin
        k = 0  # segments walked
        ph0 = 0  # completions of stage 0's barriers (and pm[0]) so far
        ph1 = 0  # ... stage 1's (and pm[1])
        while pos < end:
            ok, t, n_tok, lo, hi, slot, n_pieces, first, nxt, b, i0, q_len, cache_len = (
                _st_segment(pos, begin, end, p, size, use_items, list_in, TPT, BN, B_P2,
                            RUN_OVH, RUN_P, MIN_BLOCKS, CAUSAL)
            )  # fmt: skip
            pos = nxt
            if ok:
                if W == 0:
                    early = g_early_q(t, Q, stride_qt, stride_qh, t, hb, H_Q, HPT, TPT, ld_l)
                    if k > 0:  # both warpgroups are done with the previous segment
                        mbarrier.wait(seg_done, (k - 1) & 1)
                    _st_issue_first(kd, k_lat, k_rope, ready, K_LUT, b, K_lut_stride, lo, hi,
                                    K_ps, K_psr, K_npages, BN)  # fmt: skip
                    g_put_q(early, Q, stride_qt, stride_qh, t, hb, i0, q_len, q_lat.index(0),
                            p_buf.index(1), H_Q, HPT, TPT, ld_l)  # fmt: skip
                    mbarrier.arrive(q_ready, count=1)
                    if first & (hb == 0):  # the tile's first item or piece: its META
                        g_run_meta(META, t, n_tok, slot, n_pieces, TPT)
                else:
                    mbarrier.wait(q_ready, k & 1)
                acc, m_o, m_w, l_w, head_s, rows_ok_s, n_it = _st_walk(
                    q_lat, k_lat, k_rope, p_buf, m_buf, ready, pm, kd, K_LUT, K_lut_stride,
                    K_ps, K_psr, K_npages, p, t, hb, b, i0, q_len, cache_len, lo, hi, qk_scale,
                    ph0, ph1, W, H_Q, HPT, TPT, CAUSAL, BN, False,
                )  # fmt: skip
                _st_store(acc, m_o, m_w, l_w, head_s, rows_ok_s, k_lat.index(W), l_buf, lx,
                          outs, t, hb, i0, q_len, slot * TPT - t, n_pieces > 1, k & 1, W, H_Q,
                          HPT, TPT, D_V, HAS_SINK, BN)  # fmt: skip
                # this warpgroup's reads of the ring, q and P are done (generic and async
                # proxies) before warpgroup 0 refills them for the next segment
                fence_async_shared()
                gl.thread_barrier()
                mbarrier.arrive(seg_done, count=1)
                ph0 += gl.cdiv(n_it, 2)
                ph1 += n_it // 2
                k += 1

    @gluon.jit
    def _st_smem(BM: gl.constexpr, BN: gl.constexpr):
        """The kernel's shared memory (q, the two-stage ring, P, row maxima and sums) and its
        barriers: ready [6] (a stage's three parts), pm [2], lx (count 2), and the runs'
        segment hand-offs seg_done (count 2) and q_ready, initialised and fenced."""
        sm_l: gl.constexpr = gl.NVMMASharedLayout(
            swizzle_byte_width=128, element_bitwidth=16, rank=2
        )
        v1_l: gl.constexpr = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[0])
        bar_l: gl.constexpr = mbarrier.MBarrierLayout()
        q_lat = gl.allocate_shared_memory(gl.bfloat16, [1, BM, 512], sm_l)
        k_lat = gl.allocate_shared_memory(gl.bfloat16, [2, BN, 512], sm_l)
        k_rope = gl.allocate_shared_memory(gl.bfloat16, [2, BN, 64], sm_l)
        p_buf = gl.allocate_shared_memory(gl.bfloat16, [2, BM, BN], sm_l)
        m_buf = gl.allocate_shared_memory(gl.float32, [2, BM], v1_l)
        l_buf = gl.allocate_shared_memory(gl.float32, [2, BM], v1_l)
        ready = gl.allocate_shared_memory(gl.int64, [6, 1], bar_l)
        pm = gl.allocate_shared_memory(gl.int64, [2, 1], bar_l)
        hand = gl.allocate_shared_memory(gl.int64, [3, 1], bar_l)
        for i in gl.static_range(6):
            mbarrier.init(ready.index(i), count=1)
        for i in gl.static_range(2):
            mbarrier.init(pm.index(i), count=1)
        mbarrier.init(hand.index(0), count=2)
        mbarrier.init(hand.index(1), count=2)
        mbarrier.init(hand.index(2), count=1)
        fence_async_shared()
        gl.thread_barrier()  # the barriers before the first TMA boxes
        bars = (ready, pm, hand.index(0), hand.index(1), hand.index(2))
        return q_lat, k_lat, k_rope, p_buf, m_buf, l_buf, bars

    @gluon.jit
    def _mla_decode_sm90_st(
        q_args, out_args, k_args,
        H_Q: gl.constexpr, D_QK: gl.constexpr, D_V: gl.constexpr, HPT: gl.constexpr,
        TPT: gl.constexpr, NHB: gl.constexpr, B_P2: gl.constexpr, CAUSAL: gl.constexpr,
        HAS_SINK: gl.constexpr, SPLIT: gl.constexpr, SPARSE: gl.constexpr,
        HAS_TOPK: gl.constexpr, TOPK_TOK: gl.constexpr, FMT: gl.constexpr,
        BN: gl.constexpr, NBUF: gl.constexpr, REGS: gl.constexpr, PDL: gl.constexpr = False,
        KD=None, KD3=None, K_lut_len=1, TRACE: gl.constexpr = False, TR=None,
        BALANCED: gl.constexpr = False, TARGET: gl.constexpr = 1, MIN_BLOCKS: gl.constexpr = 1,
        RUNS: gl.constexpr = False, RUN_P: gl.constexpr = 1, RUN_OVH: gl.constexpr = 0,
        ITEM_WAVES: gl.constexpr = 1, META=None, LIST_ORDER: gl.constexpr = 0,
    ):  # fmt: skip
        """See the module docstring. Dense BF16 cache, d_qk 576, BN 64, pages of a multiple
        of 64 rows; KD: a Gluon TMA descriptor of [64, 64] boxes (128-byte swizzle) over the
        cache rows [rows, 576]. Launch with num_warps=4 (consumer 0); consumer 1 is the
        worker partition.

        BALANCED: one item of the balanced list a program (`g_work_item`). RUNS (grid RUN_P x
        NHB): where the list's items fit ITEM_WAVES waves of RUN_P and ITEM_WAVES of its
        longest items take at most 9/8 of a run, program p takes items p, p + RUN_P, ... of
        it (a uniform batch keeps whole tiles), else piece p of the contiguous runs
        (`ops.mla.worklist`, "Contiguous runs"); its segments one after the other
        (`_st_runs`); a tile cut into several items or pieces to partials at rows slot * TPT + i
        (slots < 2 RUN_P ITEM_WAVES), a whole tile to the output; META (slot, pieces, index
        in the tile) of the tiles whose first block a program holds, for the runs' combine.
        Not with TRACE.

        TRACE (development, `dev/gpu_mla_dev.py --trace`): int64 TR
        [CTAs, 10] gets the globaltimer at the CTA's start (slot 0), after its prologue (1),
        when warpgroup 0 is done with the first pair (2), after warpgroup 0's loop (3), after
        its epilogue (4) and after warpgroup 1's loop (5), its SM (6), tile count (7) and the
        SM's cycle counter at the start and end (8, 9)."""
        Q, stride_qt, stride_qh, QOFF, batch, n_tokens = q_args
        OUT, stride_ot, stride_oh, LSE, PO, PL, SINK, qk_scale, NUM_P = out_args
        (K, K_SC, K_LUT, K_CL, K_IDX, K_TOPK, K_stride, K_stride_h, K_stride_q, K_sc_stride,
         K_lut_stride, K_ps, K_psr, K_nenc, K_npages, K_idx_stride, K_idx_len) = k_args  # fmt: skip
        gl.static_assert(FMT == 0, "BF16 caches")
        gl.static_assert(not SPARSE, "dense decode")
        gl.static_assert(D_QK == 576, "d_qk 576")
        gl.static_assert(BN == 64, "64 keys a tile")
        BM: gl.constexpr = 64
        ld_l: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
        one_l: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
        kd = (KD, KD3)

        if RUNS:
            gl.static_assert(not TRACE, "no trace on the runs")
            p, hb, _stream, total, size, n_items, _item, use_items = g_run_choice(
                QOFF, K_CL, batch, NHB, TPT, BN, RUN_OVH, RUN_P, MIN_BLOCKS, ITEM_WAVES, B_P2,
                PDL, one_l,
            )  # fmt: skip
            # items: program p takes items p, p + RUN_P, ...; runs: piece p
            begin = gl.where(use_items, p.to(gl.int64), p.to(gl.int64) * size)
            end = gl.where(use_items, n_items.to(gl.int64), gl.minimum(begin + size, total))
            q_lat, k_lat, k_rope, p_buf, m_buf, l_buf, bars = _st_smem(BM, BN)
            args = (
                (OUT, stride_ot, stride_oh, LSE, PO, PL, SINK), qk_scale, kd, K_LUT,
                K_lut_stride, K_ps, K_psr, K_npages, (Q, stride_qt, stride_qh),
                (QOFF, batch, K_CL, K_TOPK, NUM_P, K_idx_len), META,
                p, hb, begin, end, size, use_items,
                q_lat, k_lat, k_rope, p_buf, m_buf, l_buf, bars,
            )  # fmt: skip
            # fmt: off
            gl.warp_specialize(
                [
                    (_st_runs, (args, 0, H_Q, HPT, TPT, CAUSAL, HAS_SINK, D_V, BN, B_P2,
                                RUN_OVH, RUN_P, MIN_BLOCKS)),
                    (_st_runs, (args, 1, H_Q, HPT, TPT, CAUSAL, HAS_SINK, D_V, BN, B_P2,
                                RUN_OVH, RUN_P, MIN_BLOCKS)),
                ],
                [4],
                [REGS],
            )
            # fmt: on
        else:
            # `g_program`, `g_request`, `g_key_range`, with the loads that do not need the key
            # range issued before them: q (`g_seesaw_start`) and, unsplit (lo = 0), the
            # look-up-table entries of tiles 0 and 1 (next to the cache length's load), so
            # that the first copies wait for two dependent loads, not three (H100: prologue
            # 7.7-8.0 -> 4.6-5.0 us a CTA; docs/kernels/gluon_mla_st.md).
            if BALANCED:  # one item of the balanced list (`g_work_item`), then q's loads
                trp = gl.program_id(0)
                if TRACE:
                    trp = g_trace_open(TR)
                ok, t, hb, w_lo, w_hi, split, part = g_work_item(
                    QOFF, K_CL, batch, NHB, TPT, BN, TARGET, MIN_BLOCKS, B_P2, PDL, one_l,
                    LIST_ORDER,
                )  # fmt: skip
                if not ok:
                    return
                early = g_early_q(trp, Q, stride_qt, stride_qh, t, hb, H_Q, HPT, TPT, ld_l)
                item = (w_lo, w_hi)
            else:
                trp, t, hb, part, early = g_seesaw_start(Q, stride_qt, stride_qh, TR, H_Q, HPT,
                                                         TPT, NHB, PDL, TRACE, ld_l)  # fmt: skip
                split = part < 0  # (unused: a placeholder for the partitions' arguments)
                item = None
            b, live, i0, leader, q_len = g_request(QOFF, batch, t, TPT, B_P2, one_l)
            if not (SPLIT or BALANCED):
                # (an entry is loaded wherever the table has it: the key range is not known)
                r0 = _st_row(K_LUT, b, K_lut_stride, 0, live & (0 < K_lut_len), K_ps, K_psr,
                             K_npages)  # fmt: skip
                r1 = _st_row(K_LUT, b, K_lut_stride, BN, live & (BN // K_ps < K_lut_len), K_ps,
                             K_psr, K_npages)  # fmt: skip
            cache_len, lo, hi = g_key_range(
                K_CL, K_TOPK, b, t, live, leader, i0, q_len, part, NUM_P, K_idx_len, SPARSE,
                HAS_TOPK, TOPK_TOK, CAUSAL, TPT, BN, item,
            )  # fmt: skip
            if SPLIT or BALANCED:
                r0 = _st_row(K_LUT, b, K_lut_stride, lo, lo < hi, K_ps, K_psr, K_npages)
                r1 = _st_row(K_LUT, b, K_lut_stride, lo + BN, lo + BN < hi, K_ps, K_psr,
                             K_npages)  # fmt: skip

            q_lat, k_lat, k_rope, p_buf, m_buf, l_buf, bars = _st_smem(BM, BN)
            ready, pm, lx, _seg_done, _q_ready = bars
            _st_issue_rows(kd, k_lat, k_rope, ready, r0, r1, lo, hi, BN)

            # Q's rope columns go to P's buffer of warpgroup 1 until the consumers hold them
            g_put_q(early, Q, stride_qt, stride_qh, t, hb, i0, q_len, q_lat.index(0),
                    p_buf.index(1), H_Q, HPT, TPT, ld_l)  # fmt: skip
            if TRACE:
                gl.store(trp + 1, g_clock())

            args = (
                OUT, stride_ot, stride_oh, LSE, PO, PL, SINK, qk_scale, n_tokens, kd, K_LUT,
                K_lut_stride, K_ps, K_psr, K_npages, trp,
                t, hb, b, i0, q_len, part, cache_len, lo, hi, split,
                q_lat, k_lat, k_rope, p_buf, m_buf, l_buf, (ready, pm, lx),
            )  # fmt: skip
            # fmt: off
            gl.warp_specialize(
                [
                    (_st_consume, (args, 0, H_Q, HPT, TPT, CAUSAL, HAS_SINK, SPLIT, D_V, BN,
                                   TRACE, BALANCED)),
                    (_st_consume, (args, 1, H_Q, HPT, TPT, CAUSAL, HAS_SINK, SPLIT, D_V, BN,
                                   TRACE, BALANCED)),
                ],
                [4],
                [REGS],
            )
            # fmt: on

else:  # Triton without Gluon: never launched (`triton_mla._use_sm90_path`)
    _mla_decode_sm90_st = None
