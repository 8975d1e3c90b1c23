"""Gluon sm_90 warp-specialized "seesaw" MLA decode: 64-row tiles over BF16 and V32 caches.

`_mla_decode_sm90_ss` has the contract, arguments and grid of `gluon_mla._mla_decode_sm90` (64
query rows: the heads of one token, or of up to 64 // h_q tokens; one key partition a program;
dense or sparse, any page size), with three warpgroups (launch with num_warps=4; setmaxnreg
splits the registers) around a 2-stage ring of 64-key tiles (Q 72 KB, a stage 72 KB):
- a producer gathers each tile with cp.async (BF16), or (V32: FlashMLA's 656-byte rows, 4
  float32 scales a row) loads its e4m3 bytes into registers before it waits for the stage and
  dequantizes them into it as bf16 (e4m3 -> f16 -> f32, times the scale, -> bf16: the
  reference's rounding);
- two consumers own alternate tiles: warpgroup w computes S = Q K^T of tiles w, w + 2, ..., its
  softmax against the running max the other left, and writes P (bf16) into the tile's rope slot;
  O [64, 512] is split by columns, each adding P_j V_j of every tile to its 256 columns.
  SS_ORDER sets warpgroup 1's steps in a pair of tiles (`_ss_consume`); SS_HALF frees and refills
  a stage by column halves;
- SS_CROSS (V32, two head blocks a token): the kernel runs in 2-CTA clusters; each producer
  dequantizes one column half of every tile and bulk-copies it into the peer's stage
  (`ss_cross_tile`). SS_SPLITCP, SS_DEQ1, PS_C, SS_ADDR and SS_QASYNC are variants of that tile
  step and of the prologue (`_mla_decode_sm90_ss`).

Synchronisation is by mbarriers only: `ready` (the producer's cp.async arrivals plus one
release arrival for the validity mask), `empty` (each consumer once its last product that
reads the stage is complete; SS_HALF: a barrier for each consumer's half of a stage), `pm` (a
tile's P and running max are in shared memory) and one for the final row-sum exchange. A
consumer never waits on a barrier with a wgmma in flight (ptxas would complete it at the
branch anyway).

The selection (`ops.mla.triton_mla_plan`) takes it on sm_90 for BF16 caches with h_q > 32 and V32
caches at any h_q, unless the TMA-fed `gluon_mla_st` serves the launch (dense BF16, pages of a
multiple of 64 rows); the cluster form for V32 with h_q 65..128. Rope-aware FP8 stays on
`gluon_mla._mla_decode_sm90`, which folds its per-token scale into S and P instead of rounding
the scaled tile to bf16. Limits: d_qk 576, BN 64, NBUF 2 (asserted); registers (consumer /
producer) 232 / 48 for BF16, 200 / 112 for V32, 200 / 104 for the cluster kernel (more producer
lookahead spills). The helpers `ss_*` are public for `gluon_mla_st`, `gluon_mla_tw` and
`gluon_mla_ps`, which reuse this kernel's tile steps.

What was built, measured and dropped, by date: docs/kernels/gluon_mla_ss.md.
"""

from __future__ import annotations

from ...gluon_imports import (
    HAS_GLUON,
    cp,
    fence_async_shared,
    gl,
    gluon,
    mbarrier,
    warpgroup_mma,
    warpgroup_mma_wait,
)

if HAS_GLUON:
    from ...gluon_cluster import (
        cl_arrive,
        cl_copy_to_peer,
        cl_fence_init,
        cl_remote_arrive,
        cl_sync,
        cl_wait,
    )
    from .gluon_mla import (
        g_clock,
        g_issue_cols,
        g_issue_rope,
        g_key_range,
        g_keys,
        g_normalize,
        g_pair_slots,
        g_put_q,
        g_request,
        g_rope_ptrs,
        g_rows,
        g_seesaw_ids,
        g_seesaw_start,
        g_tick,
        g_tile_rows,
        g_tile_slots,
        g_trace_close,
    )

    # A consumer warpgroup's S tile [64, 64] and O columns [64, 256] (wgmma accumulators).
    SS_S_L = gl.constexpr(
        gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 64, 16])
    )
    SS_O_L = gl.constexpr(
        gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 256, 16])
    )

    # e4m3 x 4 (one int32) times a float32 scale -> 2 x bf16x2 (exact through float16 and
    # float32: the same rounding as bf16(float32(x) * scale)).
    _DEQ4_ASM = gl.constexpr("""{
    .reg .b16 lo, hi, a0, a1, a2, a3;
    .reg .b32 h01, h23;
    .reg .f32 f0, f1, f2, f3;
    mov.b32 {lo, hi}, $2;
    cvt.rn.f16x2.e4m3x2 h01, lo;
    cvt.rn.f16x2.e4m3x2 h23, hi;
    mov.b32 {a0, a1}, h01;
    mov.b32 {a2, a3}, h23;
    cvt.f32.f16 f0, a0;
    cvt.f32.f16 f1, a1;
    cvt.f32.f16 f2, a2;
    cvt.f32.f16 f3, a3;
    mul.f32 f0, f0, $3;
    mul.f32 f1, f1, $3;
    mul.f32 f2, f2, $3;
    mul.f32 f3, f3, $3;
    cvt.rn.bf16x2.f32 $0, f1, f0;
    cvt.rn.bf16x2.f32 $1, f3, f2;
    }""")

    @gluon.jit
    def _ss_fp8_ptrs(rows, valid, K, SC, stride, stride_q, sc_stride, FMT: gl.constexpr):
        """Row offsets (in int32 words) of a tile's e4m3 bytes, the pointers of its scales
        (V32: 4 float32 at byte 512 of the row, one per 128 dims; rope-aware: one float32 per
        token in the scale buffer) and the rows' validity, in the load layout of
        `_ss_fp8_group` (a thread: 4 rows x 16 bytes)."""
        c_l: gl.constexpr = gl.BlockedLayout([1, 4], [4, 8], [4, 1], [1, 0])
        r8 = gl.convert_layout(rows, gl.SliceLayout(1, c_l))
        v8 = gl.convert_layout(valid, gl.SliceLayout(1, c_l))
        roff = gl.multiple_of(r8.to(gl.int64) * stride_q, 4)
        if FMT == 4:
            sp = K.to(gl.pointer_type(gl.float32)) + roff + 128
        else:
            sp = SC + r8 * sc_stride
        return roff, sp, v8

    @gluon.jit
    def _ss_fp8_group(K, roff, sp, v8, g, FMT: gl.constexpr):
        """Column group g (dims 128 g .. 128 g + 127) of a tile: e4m3 bytes as int32 words
        (0 in invalid rows; 4 registers a thread, where e4m3 elements would take one each)
        and their scale per row."""
        c_l: gl.constexpr = gl.BlockedLayout([1, 4], [4, 8], [4, 1], [1, 0])
        d = g * 32 + gl.arange(0, 32, layout=gl.SliceLayout(0, c_l))
        ptr = K.to(gl.pointer_type(gl.int32)) + roff[:, None] + d[None, :]
        x = gl.load(ptr, mask=v8[:, None], other=0)
        if FMT == 4:
            sc = gl.load(sp + g, mask=v8, other=0.0)
        else:
            sc = gl.load(sp, mask=v8, other=0.0)
        return x, sc

    @gluon.jit
    def _ss_deq(x, sc):
        """Column group of a tile [BN, 128 dims] from its packed e4m3 words and scales, as
        [BN, 64] int32 words (bf16 pairs)."""
        BN: gl.constexpr = x.shape[0]
        scb = sc[:, None] + gl.zeros_like(x).to(gl.float32)
        lo, hi = gl.inline_asm_elementwise(
            _DEQ4_ASM, "=r,=r,r,f", [x, scb], dtype=(gl.int32, gl.int32), is_pure=True, pack=1
        )
        return gl.reshape(gl.join(lo, hi), [BN, 64])

    @gluon.jit
    def _ss_words(dst):
        """An int32 view of a [BN, W] bf16 stage (or a column half of one): same bytes, same
        swizzle."""
        w_l: gl.constexpr = gl.NVMMASharedLayout(
            swizzle_byte_width=128, element_bitwidth=32, rank=2
        )
        return dst._reinterpret(gl.int32, [dst.shape[0], dst.shape[1] // 2], w_l)

    @gluon.jit
    def _ss_deq_store(dst, x, sc, g: gl.constexpr):
        """Column group g of a [BN, W] bf16 stage (or a column half of one) from its packed
        e4m3 words and scales (stored as bf16 pairs through `_ss_words`)."""
        y = _ss_deq(x, sc)
        _ss_words(dst).slice(g * 64, 64, dim=1).store(y)

    @gluon.jit
    def _ss_deq_store2(dst, x0, s0, x1, s1):
        """Column groups 0 and 1 of a [BN, 256] bf16 half stage in one store. Two stores into
        column slices of one buffer get a warpgroup barrier between them from Triton's
        shared-memory barrier pass, which cannot tell the slices apart (sm_90 SASS: a BAR.SYNC
        between the 8th and 9th STS.128 of the cluster producer's tile); one store of the
        joined groups is the same 16 STS.128 a thread with none."""
        BN: gl.constexpr = x0.shape[0]
        y = gl.join(_ss_deq(x0, s0), _ss_deq(x1, s1))  # [BN, 64, 2]
        _ss_words(dst).store(gl.reshape(gl.permute(y, (0, 2, 1)), [BN, 128]))

    @gluon.jit
    def ss_release(ready, st, vbuf, valid, TX: gl.constexpr = 0):
        """The tile's validity mask, then its ready arrivals: each thread's (when its
        cp.asyncs land) and one release arrival once every thread has stored its part (TX:
        expecting that many bytes more, the peer CTA's copy)."""
        vbuf.index(st).store(valid.to(gl.int32))
        fence_async_shared()  # generic-proxy stores (mask, dequantized tile) before wgmma reads
        cp.mbarrier_arrive(ready.index(st), increment_count=False)
        gl.thread_barrier()
        if TX:
            mbarrier.expect(ready.index(st), TX)
        else:
            mbarrier.arrive(ready.index(st), count=1)

    @gluon.jit
    def ss_cross_tile(K, K_stride, K_stride_h, K_stride_q, k_lat, k_rope, vbuf, bars, cl, st,
                      rows, valid, e_ph, BN: gl.constexpr,
                      SPLITCP: gl.constexpr = False, TT: gl.constexpr = False,
                      tt=0, DEQ1: gl.constexpr = False,
                      ADDR: gl.constexpr = False):  # fmt: skip
        """V32 in a 2-CTA cluster (head blocks 0 and 1 of one token, the same keys), one tile
        into stage st: this CTA's producer loads and dequantizes column half `rank` (groups
        2 rank, 2 rank + 1) into its own stage once consumer `rank` of this CTA has freed it
        (`empty` [2 st + rank]), then bulk-copies the half (32 KB) into the peer's stage once
        the peer's consumer has (`rempty` [2 st + rank], arrived remotely), completing on the
        peer's `ready`; so each CTA converts half of every tile. The rope slot (P) is refilled
        once this CTA's other consumer has freed its half too. The cache's rows (K: V32
        bytes, its strides in bytes, halves and words), the ring (k_lat, k_rope, vbuf) and
        its barriers (bars) as the producer unpacked them. The rope part (bf16, no
        conversion) is loaded into registers with the e4m3 bytes, before the waits, and
        stored once the stage is free (docs/kernels/gluon_mla_ss.md, "Rope in registers").
        SPLITCP: each 16 KB column group of the half is copied once stored, the second
        converted under the first one's copy (dense V32: `triton_mla_plan`'s SS_SPLITCP); else
        DEQ1: both groups in one store (`_ss_deq_store2`), else one store each. ADDR: the
        rows' int32 numbers and one int64 offset product a row for the words, scales and rope
        (else int64 numbers and a second product for the rope). TT
        (development): `g_tick`s into tt's slots 0-4: before and after the own half's wait,
        once the half is stored, after the peer's wait (its copy issued), after the other
        half's wait."""
        ready, empty, pm, lx, rempty = bars
        off_k, off_ready, off_rempty, rank = cl
        peer = 1 - rank
        HB: gl.constexpr = BN * 512  # bytes of a column half of a stage
        ld_l: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
        sm_l: gl.constexpr = gl.NVMMASharedLayout(
            swizzle_byte_width=128, element_bitwidth=16, rank=2
        )
        halves = k_lat._reinterpret(gl.bfloat16, [4, BN, 256], sm_l)  # [2 st + h]: 32 KB each
        if ADDR:  # row numbers in int32 (the launcher checks that they fit), offsets in int64
            rows = rows.to(gl.int32)
        roff, sp, v8 = _ss_fp8_ptrs(rows, valid, K, K, K_stride, K_stride_q, 0, 4)  # (no SC)
        x0, s0 = _ss_fp8_group(K, roff, sp, v8, 2 * rank, 4)
        x1, s1 = _ss_fp8_group(K, roff, sp, v8, 2 * rank + 1, 4)
        h_off = None
        if ADDR:  # the rope pointers from the words' row offsets (no second row product)
            h_off = gl.convert_layout(roff, gl.SliceLayout(1, ld_l)) * 2
        rp = g_rope_ptrs(rows, K, K_stride, K_stride_h, 4, ld_l, h_off)
        rope = gl.load(rp, mask=valid[:, None], other=0.0)
        if TT:
            g_tick(tt, 0)
        mbarrier.wait(empty.index(2 * st + rank), e_ph)
        if TT:
            g_tick(tt, 1)
        dst = halves.index(2 * st + rank)
        src = off_k + (2 * st + rank) * HB
        CB: gl.constexpr = HB // 2 if SPLITCP else HB  # bytes a copy
        if DEQ1 and not SPLITCP:
            _ss_deq_store2(dst, x0, s0, x1, s1)
        else:
            _ss_deq_store(dst, x0, s0, 0)
            if not SPLITCP:
                _ss_deq_store(dst, x1, s1, 1)
        fence_async_shared()  # the stores, before the copy (async proxy) reads them
        gl.thread_barrier()
        if TT:
            g_tick(tt, 2)
        mbarrier.wait(rempty.index(2 * st + rank), e_ph)
        cl_copy_to_peer(src, off_ready + 8 * st, CB, peer)
        if TT:
            g_tick(tt, 3)
        if SPLITCP:  # the second group, converted under the first one's copy
            _ss_deq_store(dst, x1, s1, 1)
            fence_async_shared()
            gl.thread_barrier()
            cl_copy_to_peer(src + CB, off_ready + 8 * st, CB, peer)
        mbarrier.wait(empty.index(2 * st + peer), e_ph)
        if TT:
            g_tick(tt, 4)
        k_rope.index(st).store(rope)  # (a masked row's rope as zeros; its P is masked)
        ss_release(ready, st, vbuf, valid, HB)

    @gluon.jit
    def _ss_free(empty, i, cl, CROSS: gl.constexpr):
        """A consumer is done with its part of a stage: arrive on empty[i] (CROSS: on the
        peer CTA's rempty[i] too)."""
        mbarrier.arrive(empty.index(i), count=1)
        if CROSS:
            cl_remote_arrive(cl[2] + 8 * i, 1 - cl[3])

    @gluon.jit
    def _ss_producer(args, cl, trp, SPARSE: gl.constexpr, BN: gl.constexpr, FMT: gl.constexpr,
                     HALF: gl.constexpr, CROSS: gl.constexpr, TRACE: gl.constexpr,
                     SPLITCP: gl.constexpr = False, DEQ1: gl.constexpr = False,
                     PS_C: gl.constexpr = 0, ADDR: gl.constexpr = False):  # fmt: skip
        """Four warps: tiles 0 .. 2 * ceil(n_it / 2) - 1 (a last odd tile is all masked) into
        stage j % 2 once both consumers have freed it; the key (look-up-table or index) load
        of tile j + 1 is issued before tile j is filled. BF16: cp.async. V32: the e4m3 bytes
        go through registers (64 a thread hold a tile, as int32 words), loaded before the
        wait for the stage and dequantized into it after. HALF: columns 0..255 are refilled
        once consumer 0 has freed them, 256..511 and the rope slot (P) once consumer 1 has too.
        CROSS: half of each tile, shared with the peer CTA (`ss_cross_tile`). PS_C: the page
        size where it is a compile-time constant (`triton_mla_plan._page_size_constexpr`),
        else 0."""
        _outs, cache, tok, smem = args  # `_mla_decode_sm90_ss`'s
        (K, K_SC, K_LUT, K_IDX, K_stride, K_stride_h, K_stride_q, K_sc_stride, K_lut_stride,
         K_ps, K_psr, K_nenc, K_npages, K_idx_stride) = cache  # fmt: skip
        t, hb, b, i0, q_len, part, cache_len, lo, hi = tok
        q_lat, q_rope, k_lat, k_rope, vbuf, m_buf, l_buf, bars = smem
        ready, empty, pm, lx, rempty = bars
        ld_l: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
        row_l: gl.constexpr = gl.SliceLayout(1, ld_l)
        K_ps = PS_C if PS_C else K_ps
        if CROSS:
            cl_sync()  # the peer's barriers are initialized and its stages zeroed
        n_it = gl.cdiv(gl.maximum(hi - lo, 0), BN)
        n_t = gl.cdiv(n_it, 2) * 2
        key = g_keys(lo, hi, b, t, K_LUT, K_IDX, K_lut_stride, K_ps, K_idx_stride, SPARSE,
                     BN, row_l)  # fmt: skip
        for j in range(n_t):
            st = j % 2
            start = lo + j * BN
            key_next = g_keys(start + BN, hi, b, t, K_LUT, K_IDX, K_lut_stride, K_ps,
                              K_idx_stride, SPARSE, BN, row_l)  # fmt: skip
            rows, valid = g_rows(start, hi, key, K_ps, K_psr, K_nenc, K_npages, SPARSE, BN,
                                 row_l)  # fmt: skip
            if CROSS:
                ss_cross_tile(K, K_stride, K_stride_h, K_stride_q, k_lat, k_rope, vbuf, bars,
                              cl, st, rows, valid, ((j // 2) & 1) ^ 1, BN,
                              SPLITCP, TRACE == 2,
                              g_tile_slots(trp, 10, j) if TRACE == 2 else 0,
                              DEQ1, ADDR)  # fmt: skip
            else:
                if FMT != 0:
                    roff, sp, v8 = _ss_fp8_ptrs(rows, valid, K, K_SC, K_stride, K_stride_q,
                                                K_sc_stride, FMT)  # fmt: skip
                    x0, s0 = _ss_fp8_group(K, roff, sp, v8, 0, FMT)
                    x1, s1 = _ss_fp8_group(K, roff, sp, v8, 1, FMT)
                    x2, s2 = _ss_fp8_group(K, roff, sp, v8, 2, FMT)
                    x3, s3 = _ss_fp8_group(K, roff, sp, v8, 3, FMT)
                e_ph = ((j // 2) & 1) ^ 1  # fresh barriers pass phase 1
                if HALF:
                    mbarrier.wait(empty.index(2 * st), e_ph)
                else:
                    mbarrier.wait(empty.index(st), e_ph)
                if FMT == 0:
                    for h in gl.static_range(2):
                        if HALF and h == 1:
                            mbarrier.wait(empty.index(2 * st + 1), e_ph)
                        g_issue_cols(k_lat.index(st), rows, valid, K, K_stride, h * 256, 256,
                                     ld_l)  # fmt: skip
                else:
                    dst = k_lat.index(st)
                    _ss_deq_store(dst, x0, s0, 0)
                    _ss_deq_store(dst, x1, s1, 1)
                    if HALF:
                        mbarrier.wait(empty.index(2 * st + 1), e_ph)
                    _ss_deq_store(dst, x2, s2, 2)
                    _ss_deq_store(dst, x3, s3, 3)
                g_issue_rope(k_rope.index(st), rows, valid, K, K_stride, K_stride_h, FMT, ld_l)
                ss_release(ready, st, vbuf, valid)
            if TRACE:
                if j == 0:
                    gl.store(trp + 5, g_clock())
            key = key_next
        if CROSS:  # no CTA exits while the other may still signal it
            cl_sync()

    @gluon.jit
    def _ss_s(q_l, q_r, kl, kr, zero_s):
        """S = Q K^T of a tile [64, BN] (latent and rope parts), complete."""
        s = warpgroup_mma(q_l, kl.permute((1, 0)), zero_s, use_acc=False, is_async=True)
        s = warpgroup_mma(q_r, kr.permute((1, 0)), s, is_async=True)
        return warpgroup_mma_wait(num_outstanding=0, deps=(s,))

    @gluon.jit
    def ss_softmax(s, m_prev, m_w, l_w, kr, keep, m_buf, pm, start, kcol, row_lim,
                   W: gl.constexpr, MASK_CAUSAL: gl.constexpr, qk_scale):  # fmt: skip
        """Softmax of the own tile's S against the running max m_prev left by the other
        warpgroup, keys `keep` ([1, BN], the tile's valid ones; causal rows masked here): P
        (bf16) into `kr` (here the tile's rope slot, read by S only, which is done), the new
        max into m_buf[W], then the pm[W] arrival. Returns (P, new max, m_w, l_w)."""
        if MASK_CAUSAL:
            keep = keep & ((start + kcol)[None, :] < row_lim[:, None])
        s = gl.where(keep, s * qk_scale, float("-inf"))
        m_new = gl.maximum(m_prev, gl.max(s, 1))
        m_use = gl.where(m_new == float("-inf"), 0.0, m_new)
        p = gl.exp2(s - m_use[:, None])
        l_w = l_w * gl.exp2(m_w - m_use) + gl.sum(p, 1)
        pb = p.to(gl.bfloat16)
        kr.store(pb)
        m_buf.index(W).store(m_new)
        fence_async_shared()
        gl.thread_barrier()
        mbarrier.arrive(pm.index(W), count=1)
        return pb, m_new, m_new, l_w

    @gluon.jit
    def ss_pv_own(acc, m_o, m_new, pb, kl, W: gl.constexpr, o_l: gl.constexpr):
        """O (this warpgroup's 256 columns) rescaled to max m_new, plus the own P (registers)
        times the tile's V columns; complete."""
        orow: gl.constexpr = gl.SliceLayout(1, o_l)
        m_n = gl.convert_layout(m_new, orow)
        acc = acc * gl.exp2(m_o - gl.where(m_n == float("-inf"), 0.0, m_n))[:, None]
        p_op = gl.convert_layout(pb, gl.DotOperandLayout(operand_index=0, parent=o_l, k_width=2))
        acc = warpgroup_mma(p_op, kl.slice(W * 256, 256, dim=1), acc, is_async=True)
        return warpgroup_mma_wait(num_outstanding=0, deps=(acc,)), m_n

    @gluon.jit
    def ss_other(acc, m_o, m_new, kl, kr, W: gl.constexpr):
        """O rescaled to the other warpgroup's max m_new (orow layout), plus its P (in the
        tile's rope slot) times the tile's V columns; complete."""
        acc = acc * gl.exp2(m_o - gl.where(m_new == float("-inf"), 0.0, m_new))[:, None]
        acc = warpgroup_mma(kr, kl.slice(W * 256, 256, dim=1), acc, is_async=True)
        return warpgroup_mma_wait(num_outstanding=0, deps=(acc,)), m_new

    @gluon.jit
    def _ss_own(s, m_prev, acc, m_o, m_w, l_w, kl, kr, vb, m_buf, pm, start, kcol, row_lim,
                W: gl.constexpr, MASK_CAUSAL: gl.constexpr, qk_scale,
                o_l: gl.constexpr):  # fmt: skip
        """The own tile after its S: softmax and P out, then the own P V."""
        keep = vb.load(kcol.type.layout)[None, :] != 0
        pb, m_new, m_w, l_w = ss_softmax(s, m_prev, m_w, l_w, kr, keep, m_buf, pm, start, kcol,
                                         row_lim, W, MASK_CAUSAL, qk_scale)  # fmt: skip
        acc, m_o = ss_pv_own(acc, m_o, m_new, pb, kl, W, o_l)
        return acc, m_o, m_w, l_w

    @gluon.jit
    def ss_pair(acc, m_o, m_w, l_w, z, ph, j0, lo, q_lat, q_rope, k_lat, k_rope, vbuf, m_buf,
                bars, cl, qf, last, kcol, row_lim, zero_s, qk_scale, CROSS: gl.constexpr,
                W: gl.constexpr, MASK_CAUSAL: gl.constexpr, ORDER: gl.constexpr,
                HALF: gl.constexpr, QF: gl.constexpr, BN: gl.constexpr,
                o_l: gl.constexpr):  # fmt: skip
        """Consumer warpgroup W's part of tiles (j0, j0 + 1) of a key range from lo (ring
        stages 0 and 1, barrier phase ph; j0 = 0: no running max before it), `_ss_consume`'s
        ORDER. z: a zero the compiler cannot fold (buffer indices). QF (persistent kernels):
        arrive on `qf` once this warpgroup's S is done where `last` (q's last reader), and
        start from no running max at j0 = 0 (m_buf holds the previous item's). Returns (acc,
        m_o, m_w, l_w)."""
        ready, empty, pm, lx, rempty = bars
        srow: gl.constexpr = gl.SliceLayout(1, zero_s.type.layout)
        orow: gl.constexpr = gl.SliceLayout(1, o_l)
        OW: gl.constexpr = 1 - W  # the other warpgroup
        q_l = q_lat.index(z)
        q_r = q_rope.index(z)
        if W == 0 or ORDER == 0:
            for k in gl.static_range(2):  # tile j = j0 + k, ring stage k
                kl = k_lat.index(k + z)
                kr = k_rope.index(k + z)
                if k == W:  # own tile: S, softmax, P out, own P V
                    mbarrier.wait(ready.index(k), ph)
                    # the running max after tile j - 1 (the other's; none for j = 0)
                    mbarrier.wait(pm.index(OW), (ph + k + 1) & 1, pred=j0 + k > 0)
                    s = _ss_s(q_l, q_r, kl, kr, zero_s)
                    if QF:
                        if last:  # (a branch: the arrival's warpgroup barrier only here)
                            mbarrier.arrive(qf, count=1)
                    m_prev = m_buf.index(OW).load(srow)
                    if QF and k == 0:  # a new item (the max in m_buf is the last one's)
                        m_prev = gl.where(j0 > 0, m_prev, float("-inf"))
                    acc, m_o, m_w, l_w = _ss_own(
                        s, m_prev, acc, m_o, m_w, l_w, kl, kr, vbuf.index(k), m_buf, pm,
                        lo + (j0 + k) * BN, kcol, row_lim, W, MASK_CAUSAL, qk_scale, o_l,
                    )  # fmt: skip
                else:  # the other's tile: its P V on this warpgroup's columns
                    mbarrier.wait(pm.index(k), ph)  # P_j and m_j are in shared memory
                    acc, m_o = ss_other(acc, m_o, m_buf.index(k).load(orow), kl, kr, W)
                # done with stage k (HALF: with its half of it)
                _ss_free(empty, k * (1 + HALF) + W * HALF, cl, CROSS)
        else:  # warpgroup 1, own S first (it needs no running max), then tile j0's P V
            kl0 = k_lat.index(z)
            kr0 = k_rope.index(z)
            kl1 = k_lat.index(1 + z)
            kr1 = k_rope.index(1 + z)
            mbarrier.wait(ready.index(1), ph)
            s = _ss_s(q_l, q_r, kl1, kr1, zero_s)
            if QF:
                if last:
                    mbarrier.arrive(qf, count=1)
            mbarrier.wait(pm.index(0), ph)  # P and max of tile j0
            m_prev = m_buf.index(0).load(srow)
            if ORDER == 1:  # tile j0's P V, then the own softmax
                acc, m_o = ss_other(acc, m_o, gl.convert_layout(m_prev, orow), kl0, kr0, W)
                _ss_free(empty, W * HALF, cl, CROSS)
                acc, m_o, m_w, l_w = _ss_own(
                    s, m_prev, acc, m_o, m_w, l_w, kl1, kr1, vbuf.index(1), m_buf, pm,
                    lo + (j0 + 1) * BN, kcol, row_lim, W, MASK_CAUSAL, qk_scale, o_l,
                )  # fmt: skip
            else:  # ORDER 2: the own softmax (P out early), then both P V products
                keep = vbuf.index(1).load(kcol.type.layout)[None, :] != 0
                pb, m_new, m_w, l_w = ss_softmax(
                    s, m_prev, m_w, l_w, kr1, keep, m_buf, pm, lo + (j0 + 1) * BN, kcol, row_lim,
                    W, MASK_CAUSAL, qk_scale,
                )  # fmt: skip
                acc, m_o = ss_other(acc, m_o, gl.convert_layout(m_prev, orow), kl0, kr0, W)
                _ss_free(empty, W * HALF, cl, CROSS)
                acc, m_o = ss_pv_own(acc, m_o, m_new, pb, kl1, W, o_l)
            _ss_free(empty, 1 + HALF + W * HALF, cl, CROSS)
        return acc, m_o, m_w, l_w

    @gluon.jit
    def ss_tick_ready(tt, ready, W: gl.constexpr, ph):
        """Tile trace: a pair's start and its own tile's `ready` passed (`g_tick` slots 0, 1;
        the wait is `ss_pair`'s own, which then passes at once)."""
        g_tick(tt, 0)
        mbarrier.wait(ready.index(W), ph)
        g_tick(tt, 1)

    @gluon.jit
    def ss_finish(acc, m_o, m_w, l_w, l_buf, lx, head_s, rows_ok_s, o_stage, OUT, stride_ot,
                  stride_oh, LSE, PO, PL, SINK, t, hb, i0, q_len, part, n_tokens,
                  W: gl.constexpr, H_Q: gl.constexpr, HPT: gl.constexpr, TPT: gl.constexpr,
                  D_V: gl.constexpr, HAS_SINK: gl.constexpr, SPLIT: gl.constexpr,
                  srow: gl.constexpr, o_l: gl.constexpr, lx_ph=0):  # fmt: skip
        """Epilogue of consumer warpgroup W of a seesaw kernel: O (its 256 columns, scaled to
        max m_o) normalized and stored (W = 0: with the LSE), or the split's partials. The
        warpgroups exchange their row sums on barrier lx (count 2), whose phase is lx_ph (a
        kernel that runs several epilogues, `gluon_mla_st`'s runs, alternates it).

        The bf16 O goes through o_stage, ring stage W [BN, 512] (its columns W * 256.. are
        read by warpgroup W only, and no tile lands after the loop), and leaves it in 16-byte
        stores, a warp a row, instead of the accumulator layout's 4-byte ones (H100, st
        kernel: 0.290 against 0.301 ms; docs/kernels/gluon_mla_ss.md). The
        split's float32 partials (twice the bytes; small batches) are stored from the
        accumulator layout."""
        BM: gl.constexpr = 64
        orow: gl.constexpr = gl.SliceLayout(1, o_l)
        # Row sums: own tiles' sums at the final max, exchanged through shared memory.
        m_fin = gl.convert_layout(m_o, srow)
        m_fin_use = gl.where(m_fin == float("-inf"), 0.0, m_fin)
        l_buf.index(W).store(l_w * gl.exp2(m_w - m_fin_use))
        gl.thread_barrier()
        mbarrier.arrive(lx, count=1)
        mbarrier.wait(lx, lx_ph)
        l_i = l_buf.index(0).load(srow) + l_buf.index(1).load(srow)
        m_i = m_fin

        lse, inv = g_normalize(m_i, l_i, SINK, head_s, rows_ok_s, HAS_SINK and not SPLIT)
        ro = gl.arange(0, BM, layout=orow)
        row_ok_o, _tq, tok_o, head_o = g_tile_rows(ro, t, hb, i0, q_len, H_Q, HPT, TPT)
        o = acc * gl.convert_layout(inv, orow)[:, None]
        if not SPLIT:
            st_l: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [4, 1], [1, 0])
            part_w = o_stage.slice(W * 256, 256, dim=1)
            part_w.store(o.to(gl.bfloat16))
            gl.thread_barrier()
            x = part_w.load(st_l)
            rx = gl.arange(0, BM, layout=gl.SliceLayout(1, st_l))
            row_ok_x, _tqx, tok_x, head_x = g_tile_rows(rx, t, hb, i0, q_len, H_Q, HPT, TPT)
            dx = W * 256 + gl.arange(0, 256, layout=gl.SliceLayout(0, st_l))
            xptr = OUT + tok_x[:, None] * stride_ot + head_x[:, None] * stride_oh + dx[None, :]
            gl.store(xptr, x, mask=row_ok_x[:, None] & (dx < D_V)[None, :])
            if W == 0:
                gl.store(LSE + tok_o * H_Q + head_o, gl.convert_layout(lse, orow),
                         mask=row_ok_o)  # fmt: skip
        else:
            do = W * 256 + gl.arange(0, 256, layout=gl.SliceLayout(0, o_l))
            prow = (part * n_tokens + tok_o) * H_Q + head_o
            smask = row_ok_o[:, None] & (do < D_V)[None, :]
            gl.store(PO + prow[:, None] * D_V + do[None, :], o, mask=smask)
            if W == 0:
                gl.store(PL + prow, gl.convert_layout(lse, orow), mask=row_ok_o)

    @gluon.jit
    def _ss_consume(args, cl, trp, CROSS: gl.constexpr, W: gl.constexpr, H_Q: gl.constexpr,
                    HPT: gl.constexpr, TPT: gl.constexpr, CAUSAL: gl.constexpr,
                    HAS_SINK: gl.constexpr,
                    SPLIT: gl.constexpr, SPARSE: gl.constexpr, D_V: gl.constexpr,
                    BN: gl.constexpr, FMT: gl.constexpr, ORDER: gl.constexpr,
                    HALF: gl.constexpr, TRACE: gl.constexpr, qb, QASYNC: gl.constexpr):  # fmt: skip
        """Consumer warpgroup W (see the module docstring); writes its 256 output columns
        (and, W = 0, the LSE). ORDER: warpgroup 1's steps in a pair of tiles (2 i, 2 i + 1):
        0 the P V of tile 2 i, then S, softmax and P V of its own tile; 1 its own S first
        (under warpgroup 0's softmax), then tile 2 i's P V, the own softmax and P V; 2 its own
        S, its softmax (P out early), then both P V products. HALF: each warpgroup frees
        its half of a stage on its own barrier (the producer refills that half first). CROSS
        (a 2-CTA cluster, `ss_cross_tile`): it frees it on the peer's barrier too. QASYNC:
        it waits for q's copies on barrier qb first (`ss_issue_q`)."""
        if CROSS:
            if W == 1:  # (warpgroup 0 arrived at the end of the kernel's prologue)
                cl_arrive()
            cl_wait()
        if QASYNC:  # q's cp.asyncs (`ss_issue_q`) have landed
            mbarrier.wait(qb, 0)
        outs, _cache, tok, smem = args  # `_mla_decode_sm90_ss`'s
        OUT, stride_ot, stride_oh, LSE, PO, PL, SINK, qk_scale, n_tokens = outs
        t, hb, b, i0, q_len, part, cache_len, lo, hi = tok
        q_lat, q_rope, k_lat, k_rope, vbuf, m_buf, l_buf, bars = smem
        ready, empty, pm, lx, rempty = bars
        BM: gl.constexpr = 64
        gl.static_assert(BN == 64, "64-key tiles (SS_S_L)")
        s_l: gl.constexpr = SS_S_L
        o_l: gl.constexpr = SS_O_L
        srow: gl.constexpr = gl.SliceLayout(1, s_l)
        orow: gl.constexpr = gl.SliceLayout(1, o_l)

        rs = gl.arange(0, BM, layout=srow)
        rows_ok_s, tqs, _tok, head_s = g_tile_rows(rs, t, hb, i0, q_len, H_Q, HPT, TPT)
        row_lim = gl.where(rows_ok_s, cache_len + i0 + tqs + 1, 0)
        kcol = gl.arange(0, BN, layout=gl.SliceLayout(0, s_l))
        zero_s = gl.zeros([BM, BN], gl.float32, s_l)

        acc = gl.zeros([BM, 256], gl.float32, o_l)
        m_o = gl.full([BM], float("-inf"), gl.float32, orow)  # running max O is scaled to
        m_w = gl.full([BM], float("-inf"), gl.float32, srow)  # ... l_w is scaled to
        l_w = gl.zeros([BM], gl.float32, srow)  # row sums of this warpgroup's own tiles
        n_it = gl.cdiv(gl.maximum(hi - lo, 0), BN)
        n_pairs = gl.cdiv(n_it, 2)
        for i in range(n_pairs):
            if TRACE == 2:
                tt = g_pair_slots(trp, 10, W, i)
                ss_tick_ready(tt, ready, W, i & 1)
            # z: a zero the compiler cannot fold: with constant buffer indices the wgmma
            # descriptors (64-bit, one a k-step) are hoisted out of the loop and spill.
            acc, m_o, m_w, l_w = ss_pair(
                acc, m_o, m_w, l_w, i // 2147483647, i & 1, 2 * i, lo, q_lat, q_rope, k_lat,
                k_rope, vbuf, m_buf, bars, cl, lx, False, kcol, row_lim, zero_s, qk_scale, CROSS,
                W, CAUSAL and not SPARSE, ORDER, HALF, False, BN, o_l,
            )  # fmt: skip
            if TRACE == 2:
                g_tick(tt, 3)
            if TRACE and W == 0:
                if i == 0:
                    gl.store(trp + 2, g_clock())

        if TRACE and W == 0:
            gl.store(trp + 3, g_clock())
            gl.store(trp + 7, n_it.to(gl.int64))
        ss_finish(acc, m_o, m_w, l_w, l_buf, lx, head_s, rows_ok_s, k_lat.index(W), OUT,
                  stride_ot, stride_oh, LSE, PO, PL, SINK, t, hb, i0, q_len, part, n_tokens, W,
                  H_Q, HPT, TPT, D_V, HAS_SINK, SPLIT, srow, o_l)  # fmt: skip
        if TRACE and W == 0:
            g_trace_close(trp)
        if CROSS:  # no CTA exits while the other may still signal it
            cl_sync()

    @gluon.jit
    def _ss_range(t, part, QOFF, batch, K_CL, K_TOPK, NUM_P, K_idx_len, TPT: gl.constexpr,
                  B_P2: gl.constexpr, SPARSE: gl.constexpr, HAS_TOPK: gl.constexpr,
                  TOPK_TOK: gl.constexpr, CAUSAL: gl.constexpr, BN: gl.constexpr):  # fmt: skip
        """A seesaw program's token t's (b, i0, q_len, cache_len, lo, hi): its request and the
        keys [lo, hi) of partition `part`."""
        one_l: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
        b, live, i0, leader, q_len = g_request(QOFF, batch, t, TPT, B_P2, one_l)
        cache_len, lo, hi = g_key_range(
            K_CL, K_TOPK, b, t, live, leader, i0, q_len, part, NUM_P, K_idx_len,
            SPARSE, HAS_TOPK, TOPK_TOK, CAUSAL, TPT, BN,
        )  # fmt: skip
        return b, i0, q_len, cache_len, lo, hi

    @gluon.jit
    def ss_issue_q(Q, stride_qt, stride_qh, t, hb, q_lat, q_rope, H_Q: gl.constexpr,
                   ld_l: gl.constexpr, MASK: gl.constexpr = True):  # fmt: skip
        """cp.async the heads hb * 64 .. hb * 64 + 63 of token t into q_lat [64, 512] and
        q_rope [64, 64]: no registers hold q and no thread waits for it (the consumers wait on
        its barrier). MASK: rows past h_q are skipped (they keep what the buffer held); without
        it every row is a real head (h_q a multiple of 64)."""
        r = gl.arange(0, 64, layout=gl.SliceLayout(1, ld_l))
        head = hb * 64 + r
        qp = Q + t.to(gl.int64) * stride_qt + head.to(gl.int64) * stride_qh
        dA = gl.arange(0, 512, layout=gl.SliceLayout(0, ld_l))
        dT = gl.arange(0, 64, layout=gl.SliceLayout(0, ld_l))
        ok = None
        if MASK:
            ok = (head < H_Q)[:, None]
        else:
            gl.static_assert(H_Q % 64 == 0, "whole 64-head blocks")
        cp.async_copy_global_to_shared(q_lat.index(0), qp[:, None] + dA[None, :], mask=ok)
        cp.async_copy_global_to_shared(q_rope.index(0), qp[:, None] + 512 + dT[None, :], mask=ok)

    @gluon.jit
    def ss_alloc(BN: gl.constexpr, L_SETS: gl.constexpr):
        """A seesaw kernel's shared memory: (q_lat, q_rope [1, 64, 512 / 64], k_lat, k_rope [2,
        BN, 512 / 64] (the ring), vbuf [2, BN], m_buf [2, 64], l_buf [2 L_SETS, 64], the
        barriers ready [2], empty [4], pm [2], lx, rempty [4]). The cluster kernels look
        k_lat, ready and rempty up by these names (`gluon_cluster.smem_offsets`)."""
        BM: gl.constexpr = 64
        sm_l: gl.constexpr = gl.NVMMASharedLayout(
            swizzle_byte_width=128, element_bitwidth=16, rank=2
        )
        v1_l: gl.constexpr = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[0])
        bar_l: gl.constexpr = mbarrier.MBarrierLayout()
        q_lat = gl.allocate_shared_memory(gl.bfloat16, [1, BM, 512], sm_l)
        q_rope = gl.allocate_shared_memory(gl.bfloat16, [1, BM, 64], sm_l)
        k_lat = gl.allocate_shared_memory(gl.bfloat16, [2, BN, 512], sm_l)
        k_rope = gl.allocate_shared_memory(gl.bfloat16, [2, BN, 64], sm_l)
        vbuf = gl.allocate_shared_memory(gl.int32, [2, BN], v1_l)
        m_buf = gl.allocate_shared_memory(gl.float32, [2, BM], v1_l)
        l_buf = gl.allocate_shared_memory(gl.float32, [2 * L_SETS, BM], v1_l)
        ready = gl.allocate_shared_memory(gl.int64, [2, 1], bar_l)
        empty = gl.allocate_shared_memory(gl.int64, [4, 1], bar_l)
        pm = gl.allocate_shared_memory(gl.int64, [2, 1], bar_l)
        lx = gl.allocate_shared_memory(gl.int64, [1, 1], bar_l).index(0)
        rempty = gl.allocate_shared_memory(gl.int64, [4, 1], bar_l)
        return q_lat, q_rope, k_lat, k_rope, vbuf, m_buf, l_buf, ready, empty, pm, lx, rempty

    @gluon.jit(do_not_specialize=["OFF_K", "OFF_READY", "OFF_REMPTY"])
    def _mla_decode_sm90_ss(
        q_args, out_args, k_args,
        H_Q: gl.constexpr, D_QK: gl.constexpr, D_V: gl.constexpr, HPT: gl.constexpr,
        TPT: gl.constexpr, NHB: gl.constexpr, B_P2: gl.constexpr, CAUSAL: gl.constexpr,
        HAS_SINK: gl.constexpr, SPLIT: gl.constexpr, SPARSE: gl.constexpr,
        HAS_TOPK: gl.constexpr, TOPK_TOK: gl.constexpr, FMT: gl.constexpr,
        BN: gl.constexpr, NBUF: gl.constexpr, CONSUMER_REGS: gl.constexpr,
        PRODUCER_REGS: gl.constexpr, PDL: gl.constexpr = False, SS_ORDER: gl.constexpr = 0,
        SS_HALF: gl.constexpr = False, SS_CROSS: gl.constexpr = False, OFF_K=0, OFF_READY=0,
        OFF_REMPTY=0, TRACE: gl.constexpr = False, TR=None, SS_SPLITCP: gl.constexpr = False,
        SS_DEQ1: gl.constexpr = False, PS_C: gl.constexpr = 0, SS_ADDR: gl.constexpr = False,
        SS_QASYNC: gl.constexpr = False,
    ):  # fmt: skip
        """See the module docstring. BF16 or V32 cache, d_qk 576, BN 64, NBUF 2. TRACE
        (development, `dev/gpu_mla_dev.py`): int64 TR [CTAs, 10] (`g_trace_open`); TRACE 2
        (SS_CROSS) [CTAs, 394] with a tile trace in slots 10 + 8 j + e (producer, tile j < 32,
        `ss_cross_tile`'s ticks) and 266 + 64 W + 4 i + e (consumer W, pair i < 16: its start,
        its own tile's `ready` passed, -, its end), SM cycles. V32 tiles
        are dequantized to bf16 by the producer (loads into registers before it waits for
        the stage; stores after). Launch with num_warps=4 (consumer 0); consumer 1 and the
        producer are worker partitions. SS_CROSS (V32, NHB 2, SS_HALF): launched in clusters
        of two CTAs (head blocks 0 and 1 of a token; `ss_cross_tile`); OFF_*: the shared
        offsets of k_lat, ready and rempty (`gluon_cluster.smem_offsets`). SS_DEQ1 (SS_CROSS
        without SS_SPLITCP): a half's two column groups in one store (`_ss_deq_store2`).
        SS_ADDR (SS_CROSS): `ss_cross_tile`'s ADDR; PS_C: `_ss_producer`'s. SS_QASYNC (one
        token a tile, HPT 64, h_q 64 NHB): q is cp.async'ed (`ss_issue_q`) before the
        request's loads and the consumers wait for it on a barrier of its own, so that no
        warp of the CTA (nor the peer's producer, through the cluster barrier) waits for q's
        loads before the producer's first tile."""
        Q, stride_qt, stride_qh, QOFF, batch, n_tokens = q_args
        OUT, stride_ot, stride_oh, LSE, PO, PL, SINK, qk_scale, NUM_P = out_args
        (K, K_SC, K_LUT, K_CL, K_IDX, K_TOPK, K_stride, K_stride_h, K_stride_q, K_sc_stride,
         K_lut_stride, K_ps, K_psr, K_nenc, K_npages, K_idx_stride, K_idx_len) = k_args  # fmt: skip
        gl.static_assert(
            not SS_QASYNC or (TPT == 1 and HPT == 64 and H_Q == 64 * NHB),
            "SS_QASYNC: one token a tile, whole 64-head blocks",
        )
        gl.static_assert(FMT == 0 or FMT == 4, "BF16 or V32 caches")
        gl.static_assert(D_QK == 576, "the seesaw kernel needs d_qk 576")
        gl.static_assert(NBUF == 2, "two ring stages (one a consumer)")
        gl.static_assert(
            not SS_CROSS or (FMT == 4 and NHB == 2 and SS_HALF),
            "the cluster kernel: V32, two head blocks a token, half stages",
        )
        BM: gl.constexpr = 64
        ld_l: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
        one_l: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])

        # One token a tile: q's loads are issued before `_ss_range`'s (`g_seesaw_start`), and
        # V32 stages are not zeroed (every row of a stage's latent part is written: masked
        # rows as zeros). H100: prologue 3.2-3.4 -> 2.5-2.7 us a CTA
        # (docs/kernels/gluon_mla_ss.md, "Fixed cost a CTA").
        if SS_QASYNC:
            q_lat, q_rope, k_lat, k_rope, vbuf, m_buf, l_buf, ready, empty, pm, lx, rempty = (
                ss_alloc(BN, 1)
            )
            qb = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout()).index(0)
            trp, t, hb, part = g_seesaw_ids(TR, NHB, PDL, TRACE)
            ss_issue_q(Q, stride_qt, stride_qh, t, hb, q_lat, q_rope, H_Q, ld_l, False)
            early = trp
        else:
            trp, t, hb, part, early = g_seesaw_start(Q, stride_qt, stride_qh, TR, H_Q, HPT,
                                                     TPT, NHB, PDL, TRACE, ld_l)  # fmt: skip
        b, i0, q_len, cache_len, lo, hi = _ss_range(
            t, part, QOFF, batch, K_CL, K_TOPK, NUM_P, K_idx_len, TPT, B_P2, SPARSE, HAS_TOPK,
            TOPK_TOK, CAUSAL, BN,
        )  # fmt: skip
        if not SS_QASYNC:
            q_lat, q_rope, k_lat, k_rope, vbuf, m_buf, l_buf, ready, empty, pm, lx, rempty = (
                ss_alloc(BN, 1)
            )  # rempty (SS_CROSS): the peer's consumers' arrivals
            qb = lx  # a placeholder (q is not cp.async'ed)
        for i in gl.static_range(2):
            mbarrier.init(ready.index(i), count=129)  # 128 cp.async arrivals + the release
            if SS_CROSS:  # [stage, half]: consumer `half` of the peer
                mbarrier.init(rempty.index(2 * i), count=1)
                mbarrier.init(rempty.index(2 * i + 1), count=1)
            if SS_HALF:  # [stage, half]: one consumer each
                mbarrier.init(empty.index(2 * i), count=1)
                mbarrier.init(empty.index(2 * i + 1), count=1)
            else:
                mbarrier.init(empty.index(i), count=2)
            mbarrier.init(pm.index(i), count=1)
        mbarrier.init(lx, count=2)
        if SS_QASYNC:
            mbarrier.init(qb, count=128)  # each thread's q copies

        # Never a NaN from an unwritten cache slot in a stage: a masked row's cp.async (BF16
        # latent part, rope part) is skipped, so it keeps what the stage held (these zeros, an
        # earlier finite row, or P values in the rope slot); the V32 producer writes a masked
        # row's latent part as zeros (its bytes and scales load as 0).
        for i in gl.static_range(2):
            if FMT == 0:
                k_lat.index(i).store(gl.zeros([BN, 512], gl.bfloat16, ld_l))
            k_rope.index(i).store(gl.zeros([BN, 64], gl.bfloat16, ld_l))
        m_buf.index(1).store(gl.full([BM], float("-inf"), gl.float32, one_l))

        if SS_QASYNC:
            fence_async_shared()  # the zeroed stages (and the barriers' init) before wgmma
            gl.thread_barrier()  # every barrier initialized before any thread's arrival
            cp.mbarrier_arrive(qb, increment_count=False)
        else:
            g_put_q(early, Q, stride_qt, stride_qh, t, hb, i0, q_len, q_lat.index(0),
                    q_rope.index(0), H_Q, HPT, TPT, ld_l)  # fmt: skip
        if TRACE:
            gl.store(trp + 1, g_clock())
        if SS_CROSS:  # barriers and zeroed stages, before the peer may touch them
            cl_fence_init()
            cl_arrive()
        cl = (OFF_K, OFF_READY, OFF_REMPTY, hb % 2)  # hb: the CTA's rank in its cluster

        # The partitions' arguments, in groups: the outputs (consumers), the cache (producer),
        # the token's request and key range, and the shared memory (both).
        outs = (OUT, stride_ot, stride_oh, LSE, PO, PL, SINK, qk_scale, n_tokens)
        cache = (K, K_SC, K_LUT, K_IDX, K_stride, K_stride_h, K_stride_q, K_sc_stride,
                 K_lut_stride, K_ps, K_psr, K_nenc, K_npages, K_idx_stride)  # fmt: skip
        tok = (t, hb, b, i0, q_len, part, cache_len, lo, hi)
        bars = (ready, empty, pm, lx, rempty)
        args = (outs, cache, tok, (q_lat, q_rope, k_lat, k_rope, vbuf, m_buf, l_buf, bars))
        # fmt: off
        gl.warp_specialize(
            [
                (_ss_consume, (args, cl, trp, SS_CROSS, 0, H_Q, HPT, TPT, CAUSAL, HAS_SINK,
                               SPLIT, SPARSE, D_V, BN, FMT, SS_ORDER, SS_HALF, TRACE, qb,
                               SS_QASYNC)),
                (_ss_consume, (args, cl, trp, SS_CROSS, 1, H_Q, HPT, TPT, CAUSAL, HAS_SINK,
                               SPLIT, SPARSE, D_V, BN, FMT, SS_ORDER, SS_HALF, TRACE, qb,
                               SS_QASYNC)),
                (_ss_producer, (args, cl, trp, SPARSE, BN, FMT, SS_HALF, SS_CROSS, TRACE,
                                SS_SPLITCP, SS_DEQ1, PS_C, SS_ADDR)),
            ],
            [4, 4],
            [CONSUMER_REGS, PRODUCER_REGS],
        )
        # fmt: on

else:  # Triton without Gluon: never launched (`triton_mla._use_sm90_path`)
    _mla_decode_sm90_ss = None
