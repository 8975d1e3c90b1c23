"""Gluon sm_90 (Hopper) MLA decode kernels with 64-row and keys-as-M tiles, and the Gluon helpers
that the other kernels of this package share.

Both kernels have the contract, arguments and grid of the portable
`triton_mla_kernel._mla_decode_kernel` (grid: tokens x head blocks, key partitions; SPLIT stores
float32 partials that `triton_mla_combine` merges): bf16 q, d_qk 576 (512 latent + 64 rope), a
paged cache (any page size) read densely or through sparse top-k indices, with 16-byte aligned
rows.

- `_mla_decode_sm90`: 64 query rows a tile (the heads of one token, or of up to 64 // h_q
  tokens; padded), 8 warps. S = Q K^T is split by keys between the two warpgroups, P goes
  through shared memory, O [64, 512] is split by columns; BN keys a tile are gathered with
  cp.async into an NBUF-deep ring. BF16, V32 and rope-aware FP8 caches (FP8 tiles dequantized to
  bf16 in shared memory; the rope-aware per-token scale folded into S and P). PIPE (BF16): a
  tile's P V product is waited for behind the next S. The dispatcher takes it on sm_90 for the
  64-row launches the seesaw kernels (`gluon_mla_ss`, `gluon_mla_st`) do not serve: rope-aware
  FP8 with h_q > 16, and any format with the seesaw turned off. Limits: BN 64 with NBUF 2 takes
  ~230 KB of shared memory (one CTA a SM).
- `_mla_decode_sm90_t`: keys are the MMA's M dimension (S^T = K Q^T [BN, NR], O^T += V^T P^T
  [512, NR]), so nothing is padded to 64 rows: NR = 16 or 32 query rows (the heads of a token or
  of TPT tokens; padded), one warpgroup, BN 64, an NBUF-deep cp.async ring. BF16 caches with at
  most 32 rows a tile, rope-aware FP8 with at most 16 (float16 MMAs on register operands read
  straight from the e4m3 stage). The dispatcher takes it for BF16 with h_q <= 32; rope-aware
  FP8 with h_q <= 16 goes to `gluon_mla_tw` unless that is turned off. Limits: a BF16 stage
  takes 73 KB; FP8 NR 16 with NBUF 2 about 100 KB (two CTAs a SM).

Shared helpers (public for the other modules of this package): `g_*` (a program's token, request
and key range, tile addressing and cp.async issue, the LSE normalization, development traces),
`t_*` (the keys-as-M tile step `t_tile`, its loop state, q's load and store, and the epilogue
`t_store`, which `gluon_mla_tw`'s consumers run too).

Design history and measurements: docs/kernels/gluon_mla.md.
"""

from __future__ import annotations

from ...gluon_imports import (
    HAS_GLUON,
    cp,
    fence_async_shared,
    gl,
    gluon,
    warpgroup_mma,
    warpgroup_mma_wait,
)
from ...list_order import FIELD, FIELD_MASK, LIST_BUCKETS, ONES
from ...pdl import g_pdl_signal
from ...triton_constants import LN2, LOG2E

# A development tile trace (TRACE 2 of the V32 cluster seesaws), after a kernel's own trace
# slots in its row: 8 slots a producer tile (32 tiles), then 4 a consumer pair (16 pairs a
# consumer) (`g_tile_slots`, `g_pair_slots`).
TILE_TRACE_SLOTS = 32 * 8 + 2 * 16 * 4
# A development trace of the keys-as-M kernel's runs prologue (TRACE 3): a row of 16 slots, the
# kernel's own 10 and the prologue's steps (`_mla_decode_sm90_t`'s docstring).
RUNS_TRACE_SLOTS = 16

if HAS_GLUON:
    TILE_TRACE = gl.constexpr(TILE_TRACE_SLOTS)
    RUNS_TRACE = gl.constexpr(RUNS_TRACE_SLOTS)

    @gluon.constexpr_function
    def t_raw_layout(kswz):
        """Shared layout of the keys-as-M kernels' FP8 stages [NBUF, BN, 512] (bytes): 16-byte
        chunk c of row r sits at chunk c ^ f(r). kswz 0: f(r) = r % 8 (a plain swizzle: the
        S loads (`t_tile`'s kraw_l, rows r and r + 1 in each 8-lane phase, 4 chunks of 64
        bytes) meet 2-way bank conflicts; docs/kernels/gluon_mla.md, "t_raw_layout").
        kswz 1: f = (r0, r1, r0 ^ r2) in bits (0, 1, 2), so rows r and r + 1 land in
        opposite halves of the 128 bytes (S loads conflict-free) and two adjacent chunks of
        rows r, r + 2, r + 4, r + 6 in eight distinct 16-byte bank groups (the P V loads,
        vraw_l, stay conflict-free)."""
        if kswz == 0:
            return gl.SwizzledSharedLayout(vec=16, per_phase=1, max_phase=8, order=[1, 0])
        return gl.SharedLinearLayout(
            offset_bases=[[0, 1], [0, 2], [0, 4], [0, 8], [0, 16], [0, 32], [0, 64], [0, 128],
                          [0, 256], [1, 80], [2, 32], [4, 64], [8, 0], [16, 0], [32, 0]]
        )  # fmt: skip

    @gluon.jit
    def g_keys(start, hi, b, tok, LUT, IDX, lut_stride, ps, idx_stride,
               SPARSE: gl.constexpr, BN: gl.constexpr, row_l: gl.constexpr):  # fmt: skip
        """The global load of a tile's addressing (index or page id), issued ahead."""
        pos = start + gl.arange(0, BN, layout=row_l)
        inb = pos < hi
        if SPARSE:
            key = gl.load(IDX + tok * idx_stride + pos, mask=inb, other=-1)
        else:
            key = gl.load(LUT + b * lut_stride + pos // ps, mask=inb, other=0)
        return key

    @gluon.jit
    def g_rows(start, hi, key, ps, psr, n_enc, n_pages,
               SPARSE: gl.constexpr, BN: gl.constexpr, row_l: gl.constexpr):  # fmt: skip
        """Physical rows (int64, clamped) and validity of key positions [start, start + BN)."""
        pos = start + gl.arange(0, BN, layout=row_l)
        inb = pos < hi
        if SPARSE:
            valid = inb & (key >= 0) & (key < n_enc)
            enc = gl.where(valid, key, 0)
            rows = (enc // ps).to(gl.int64) * psr + enc % ps
        else:
            valid = inb
            blk = gl.minimum(gl.maximum(key, 0), n_pages - 1)
            rows = blk.to(gl.int64) * psr + pos % ps
        return rows, valid

    @gluon.jit
    def g_issue_cols(dst, rows, valid, K, stride, c0: gl.constexpr, NC: gl.constexpr,
                     ld_l: gl.constexpr):  # fmt: skip
        """cp.async bf16 columns [c0, c0 + NC) of a tile's rows into the same columns of
        `dst` (a [BN, 512] stage)."""
        d = c0 + gl.arange(0, NC, layout=gl.SliceLayout(0, ld_l))
        ptr = K + gl.multiple_of(rows * stride, 8)[:, None] + d[None, :]
        if NC == 512:
            cp.async_copy_global_to_shared(dst, ptr, mask=valid[:, None])
        else:
            cp.async_copy_global_to_shared(dst.slice(c0, NC, dim=1), ptr, mask=valid[:, None])

    @gluon.jit
    def g_issue_main(
        k_main,
        k_sc,
        stage,
        rows,
        valid,
        K,
        SC,
        stride,
        stride_q,
        sc_stride,
        FMT: gl.constexpr,
        ld_l: gl.constexpr,
        NW: gl.constexpr = 8,
    ):
        """cp.async dims 0..511 of a tile (bf16 or e4m3 bytes) and its scales into `stage`
        (NW: the kernel's warps)."""
        g_issue_lat(k_main, stage, rows, valid, K, stride, FMT, ld_l, NW)
        if FMT != 0:
            g_issue_scales(k_sc, stage, rows, valid, K, SC, stride_q, sc_stride, FMT, NW)

    @gluon.jit
    def g_issue_lat(k_main, stage, rows, valid, K, stride, FMT: gl.constexpr,
                    ld_l: gl.constexpr, NW: gl.constexpr = 8, roff=None):  # fmt: skip
        """cp.async dims 0..511 of a tile (bf16 or e4m3 bytes) into `stage`. roff (FP8): the
        rows' byte offsets (rows * stride, int64, layout of rows), where a caller shares them
        with `g_issue_rope` (one row product)."""
        if FMT == 0:
            g_issue_cols(k_main.index(stage), rows, valid, K, stride, 0, 512, ld_l)
        else:
            # 16 e4m3 (16 B) a thread and copy.
            ld8_l: gl.constexpr = gl.BlockedLayout([1, 16], [4, 8], [NW, 1], [1, 0])
            if roff is None:
                r8 = gl.convert_layout(rows, gl.SliceLayout(1, ld8_l))
                ro8 = gl.multiple_of(r8 * stride, 16)
            else:
                ro8 = gl.convert_layout(roff, gl.SliceLayout(1, ld8_l))
            v8 = gl.convert_layout(valid, gl.SliceLayout(1, ld8_l))
            d8 = gl.arange(0, 512, layout=gl.SliceLayout(0, ld8_l))
            k8 = K.to(gl.pointer_type(gl.float8e4nv))
            ptr = k8 + ro8[:, None] + d8[None, :]
            cp.async_copy_global_to_shared(k_main.index(stage), ptr, mask=v8[:, None])

    @gluon.jit
    def g_issue_scales(k_sc, stage, rows, valid, K, SC, stride_q, sc_stride,
                       FMT: gl.constexpr, NW: gl.constexpr = 8):  # fmt: skip
        """cp.async an FP8 tile's scales into `stage` of k_sc: V32's 4 f32 at byte 512 of the
        row, rope-aware's one f32 a token from the scale buffer (into a [NBUF, BN] ring: rows
        as they are)."""
        if FMT == 4:  # V32: 4 f32 scales at byte 512 of the row
            s4_l: gl.constexpr = gl.BlockedLayout([1, 1], [8, 4], [NW, 1], [1, 0])
            rs = gl.convert_layout(rows, gl.SliceLayout(1, s4_l))
            vs = gl.convert_layout(valid, gl.SliceLayout(1, s4_l))
            c4 = gl.arange(0, 4, layout=gl.SliceLayout(0, s4_l))
            k32 = K.to(gl.pointer_type(gl.float32))
            ptr = k32 + (gl.multiple_of(rs * stride_q, 4) + 128)[:, None] + c4[None, :]
            cp.async_copy_global_to_shared(k_sc.index(stage), ptr, mask=vs[:, None])
        elif len(k_sc.shape) == 2:  # rope-aware into a [NBUF, BN] ring: rows as they are
            ptr = SC + rows * sc_stride
            cp.async_copy_global_to_shared(k_sc.index(stage), ptr, mask=valid)
        else:  # rope-aware: one f32 scale per token in the scale buffer
            s1_l: gl.constexpr = gl.BlockedLayout([1, 1], [32, 1], [2, NW // 2], [1, 0])
            rs = gl.convert_layout(rows, gl.SliceLayout(1, s1_l))
            vs = gl.convert_layout(valid, gl.SliceLayout(1, s1_l))
            c1 = gl.arange(0, 1, layout=gl.SliceLayout(0, s1_l))
            ptr = SC + (rs * sc_stride)[:, None] + c1[None, :]
            cp.async_copy_global_to_shared(k_sc.index(stage), ptr, mask=vs[:, None])

    @gluon.jit
    def g_clock():
        """The global nanosecond timer (int64), for development traces."""
        return gl.inline_asm_elementwise(
            "mov.u64 $0, %globaltimer;", "=l", [], dtype=gl.int64, is_pure=False, pack=1
        )

    @gluon.jit
    def g_cycles():
        """The SM's cycle counter (int64), for development traces (clock rate)."""
        return gl.inline_asm_elementwise(
            "mov.u64 $0, %clock64;", "=l", [], dtype=gl.int64, is_pure=False, pack=1
        )

    @gluon.jit
    def g_smid():
        """The SM the CTA runs on (int64), for development traces."""
        x = gl.inline_asm_elementwise(
            "mov.u32 $0, %smid;", "=r", [], dtype=gl.int32, is_pure=False, pack=1
        )
        return x.to(gl.int64)

    @gluon.jit
    def g_trace_open(TR, RW: gl.constexpr = 10):
        """A traced CTA's row of int64 TR [CTAs, RW] (grid: program, partition), with the
        CTA's start time in slot 0, its SM in slot 6 and the SM's cycle counter in slot 8;
        returns the row's pointer (`g_trace_close` ends it). RW > 10: a tile trace's row
        (`g_tick` from slot 10)."""
        trp = TR + (gl.program_id(1) * gl.num_programs(0) + gl.program_id(0)) * RW
        gl.store(trp, g_clock())
        gl.store(trp + 6, g_smid())
        gl.store(trp + 8, g_cycles())
        return trp

    @gluon.jit
    def g_tick(tt, e: gl.constexpr):
        """Development tile trace: the SM's cycle counter into slot e of tt = (pointer,
        whether this step is traced)."""
        gl.store(tt[0] + e, g_cycles(), mask=tt[1])

    @gluon.jit
    def g_tile_slots(trp, B: gl.constexpr, j):
        """`g_tick`'s (pointer, traced) for producer tile j of a tile trace at slot B."""
        return trp + B + 8 * j, j < 32

    @gluon.jit
    def g_pair_slots(trp, B: gl.constexpr, W: gl.constexpr, i):
        """`g_tick`'s (pointer, traced) for consumer W's pair i of a tile trace at slot B."""
        return trp + (B + 256 + 64 * W) + 4 * i, i < 16  # (the constant folded)

    @gluon.jit
    def g_trace_close(trp):
        """A traced CTA's end: its time in slot 4 and the SM's cycle counter in slot 9 (with
        slot 8's: the SM clock over the CTA's life)."""
        gl.store(trp + 4, g_clock())
        gl.store(trp + 9, g_cycles())

    @gluon.constexpr_function
    def one_l_t():
        """The layout of a [B_P2] request vector in a one-warpgroup kernel."""
        return gl.BlockedLayout([1], [32], [4], [0])

    @gluon.jit
    def g_program(NHB: gl.constexpr, PDL: gl.constexpr):
        """A decode program's (t, hb, part) (grid: token x head block, partition), the
        dependent launch signalled first where PDL (the combine may launch: it waits for this
        grid)."""
        g_pdl_signal(PDL)
        pid = gl.program_id(0)
        part = gl.program_id(1)
        return pid // NHB, pid % NHB, part

    @gluon.jit
    def _g_add(a, b):
        return a + b

    @gluon.jit
    def g_work_item(
        QOFF, K_CL, batch, NHB: gl.constexpr, TPT: gl.constexpr, BN: gl.constexpr,
        TARGET: gl.constexpr, MIN_BLOCKS: gl.constexpr, B_P2: gl.constexpr, PDL: gl.constexpr,
        one_l: gl.constexpr, ORDER: gl.constexpr = 0,
    ):  # fmt: skip
        """A balanced program's work (grid: items of the list x head blocks; `ops.mla.worklist`,
        whose `mla_work_list` / `mla_find_item` this mirrors, ORDER its list's order): (ok, t,
        hb, lo, hi, split, pbase). ok: the program has an item (else it exits); t: its tile's
        leader token; [lo, hi): its chunk of the tile's keys (before the causal clamp); split:
        the tile has several items (partials); pbase: the `part` that puts the tile's token
        t + i at partial row slot * TPT + i with n_tokens 1 (slot: the item's place in request
        order, `worklist.mla_find_item`'s slot). The dependent launch is signalled first where
        PDL."""
        g_pdl_signal(PDL)
        pid = gl.program_id(0)
        item = pid // NHB
        _n, ok, t, lo, hi, c_b, _m, slot = g_list_item(
            QOFF, K_CL, batch, item, TPT, BN, TARGET, MIN_BLOCKS, B_P2, one_l, ORDER
        )
        return ok, t, pid % NHB, lo, hi, c_b > 1, slot * TPT - t

    @gluon.jit
    def g_request_loads(QOFF, K_CL, batch, B_P2: gl.constexpr, one_l: gl.constexpr):
        """The loads of `g_requests`: per request [B_P2] (offsets[r], offsets[r + 1], cache
        length), 0 past the batch; issued apart so that their latency can overlap other work
        (the ring's zeroing in `_mla_decode_sm90_t`: H200, a CTA's start to its runs derived
        2.7 -> 2.1 us; docs/kernels/triton_mla.md, "The runs' prologue")."""
        r = gl.arange(0, B_P2, layout=one_l)
        rm = r < batch
        o_lo = gl.load(QOFF + r, mask=rm, other=0)
        o_hi = gl.load(QOFF + r + 1, mask=rm, other=0)
        return o_lo, o_hi, gl.load(K_CL + r, mask=rm, other=0)

    @gluon.jit
    def g_requests(
        QOFF, K_CL, batch, TPT: gl.constexpr, BN: gl.constexpr, B_P2: gl.constexpr,
        one_l: gl.constexpr, raw=None,
    ):  # fmt: skip
        """`worklist.mla_requests` (same arithmetic): per request [B_P2] (r, o_lo, q_len,
        tiles, w). raw: `g_request_loads`' result where already issued."""
        r = gl.arange(0, B_P2, layout=one_l)
        rm = r < batch
        if raw is None:
            raw = g_request_loads(QOFF, K_CL, batch, B_P2, one_l)
        o_lo, o_hi, cl = raw
        q_len = gl.maximum(o_hi - o_lo, 0)
        cl = gl.maximum(cl, 0)
        tiles = gl.where(rm, gl.cdiv(q_len, TPT), 0)
        return r, o_lo, q_len, tiles, gl.cdiv(cl + q_len, BN)

    @gluon.jit
    def g_list_item(
        QOFF, K_CL, batch, item, TPT: gl.constexpr, BN: gl.constexpr, TARGET: gl.constexpr,
        MIN_BLOCKS: gl.constexpr, B_P2: gl.constexpr, one_l: gl.constexpr,
        ORDER: gl.constexpr = 0, raw=None,
    ):  # fmt: skip
        """Item `item` of the balanced list (`worklist.mla_work_list` / `mla_find_item`, same
        arithmetic and ORDER): (the list's items, ok: item is one, t: its tile's leader token,
        [lo, hi): its chunk of the tile's keys before the causal clamp, c_b: the tile's items,
        the longest item's keys, slot: its partial slot, its place in request order, as
        `mla_find_item`'s). raw: `g_request_loads`' result where already issued."""
        r, o_lo, q_len, tiles, w = g_requests(QOFF, K_CL, batch, TPT, BN, B_P2, one_l, raw)
        total = gl.sum(tiles.to(gl.int64) * w, 0)
        cb = gl.maximum(gl.cdiv(total * 9, TARGET * 8), MIN_BLOCKS).to(gl.int32)
        c = gl.maximum(gl.cdiv(w, cb), 1)
        n = tiles * c
        chunk = gl.cdiv(w, c) * BN
        if ORDER == 1:  # (`ops.list_order.bucket_ends`)
            key = gl.minimum((LIST_BUCKETS * gl.cdiv(w, c)) // (cb + 1), LIST_BUCKETS - 1)
            hi = key >= 4  # (the packed words of `bucket_ends`: 16 bits a bucket)
            shift = ((key % 4) * FIELD).to(gl.int64)
            v = n.to(gl.int64) << shift
            up = gl.where(hi, v, 0)
            down = gl.where(hi, 0, v)
            scan = gl.where(hi, gl.associative_scan(up, 0, _g_add),
                            gl.associative_scan(down, 0, _g_add))  # fmt: skip
            t_up = gl.sum(up, 0)
            t_down = gl.sum(down, 0)
            above = (((gl.where(hi, t_up, t_down) >> shift) >> FIELD) * ONES >> 48) & FIELD_MASK
            above += gl.where(hi, 0, ((t_up * ONES) >> 48) & FIELD_MASK)
            end = (above + ((scan >> shift) & FIELD_MASK)).to(n.dtype)
        else:
            end = gl.associative_scan(n, 0, _g_add)
        n_items = gl.sum(n, 0)
        ok = item < n_items
        if ORDER == 1:
            at = (end - n <= item) & (item < end)
            rm_end = gl.associative_scan(n, 0, _g_add)
            slot = item + gl.sum(gl.where(at, rm_end - end, 0), 0)
        else:
            b = gl.sum(gl.where(end <= item, 1, 0), 0)
            at = r == b
            slot = item
        n_b = gl.sum(gl.where(at, n, 0), 0)
        c_b = gl.maximum(gl.sum(gl.where(at, c, 0), 0), 1)
        chunk_b = gl.sum(gl.where(at, chunk, 0), 0)
        local = item - (gl.sum(gl.where(at, end, 0), 0) - n_b)
        t = gl.sum(gl.where(at, o_lo, 0), 0) + (local // c_b) * TPT
        lo = (local % c_b) * chunk_b
        return n_items, ok, t, lo, lo + chunk_b, c_b, gl.max(gl.where(n > 0, chunk, 0), 0), slot

    @gluon.jit
    def g_run_stream(
        QOFF, K_CL, batch, TPT: gl.constexpr, BN: gl.constexpr, OVH: gl.constexpr,
        B_P2: gl.constexpr, one_l: gl.constexpr, raw=None,
    ):  # fmt: skip
        """`worklist.mla_run_stream` (same arithmetic): per request [B_P2] (r, o_lo, q_len, w,
        span, incl) of the contiguous runs' stream. raw: `g_request_loads`' result where
        already issued."""
        r, o_lo, q_len, tiles, w = g_requests(QOFF, K_CL, batch, TPT, BN, B_P2, one_l, raw)
        span = tiles.to(gl.int64) * (w + OVH)
        incl = gl.associative_scan(span, 0, _g_add)
        return r, o_lo, q_len, w, span, incl

    @gluon.jit
    def g_run_segment(r, o_lo, q_len, w, span, incl, pos, end, begin, p, TPT: gl.constexpr,
                      OVH: gl.constexpr):  # fmt: skip
        """`worklist.mla_run_segment` (same arithmetic): (t, n_tok, lo, hi, w_b, b0, b1,
        slot) of the segment of piece p's run [begin, end) that starts at pos."""
        b = gl.sum(gl.where(incl <= pos, 1, 0), 0)
        at = r == b
        start = gl.sum(gl.where(at, incl - span, 0), 0)
        w_b = gl.sum(gl.where(at, w, 0), 0)
        j = (pos - start) // (w_b + OVH)
        row = start + j * (w_b + OVH)
        b0 = row + OVH
        b1 = b0 + w_b
        lo = gl.maximum(pos, b0) - b0
        hi = gl.minimum(end, b1) - b0
        o_b = gl.sum(gl.where(at, o_lo, 0), 0)
        t = o_b + (j * TPT).to(gl.int32)
        n_tok = gl.minimum(o_b + gl.sum(gl.where(at, q_len, 0), 0) - t, TPT)
        slot = 2 * p + (row > begin).to(gl.int32)
        return t, n_tok, lo.to(gl.int32), hi.to(gl.int32), w_b, b0, b1, slot

    @gluon.jit
    def g_run_choice(
        QOFF, K_CL, batch, NHB: gl.constexpr, TPT: gl.constexpr, BN: gl.constexpr,
        OVH: gl.constexpr, RUN_P: gl.constexpr, MIN_BLOCKS: gl.constexpr,
        ITEM_WAVES: gl.constexpr, B_P2: gl.constexpr, PDL: gl.constexpr, one_l: gl.constexpr,
        raw=None,
    ):  # fmt: skip
        """A `RUNS` program's start (grid RUN_P x NHB; the dependent launch signalled first
        where PDL): (p, hb, stream, total, size, n_items, item, use_items). stream: the
        `g_run_stream` vectors, total their units, size a piece's units; n_items: the list's
        items (TARGET = RUN_P), item = (ok, t_i, lo_i, hi_i, c_i) of item p (`g_list_item`);
        use_items: the list serves, where its items fit ITEM_WAVES waves of RUN_P and that
        many of its longest take at most 9/8 of a run (the list's own slack, so that a
        uniform batch whose tiles are a block longer than a run keeps them whole), else the
        runs. (One code path for both in the kernels: a second copy of the tile's code cost
        the runs 3-14%, H200 bench_real; ITEM_WAVES scales the bound, as a constant `&
        False` broke the sm_90 lowering.) raw: `g_request_loads`' result where already issued
        (else loaded here); the stream and the list share it."""
        g_pdl_signal(PDL)
        pid = gl.program_id(0)
        hb = pid % NHB
        p = pid // NHB
        if raw is None:
            raw = g_request_loads(QOFF, K_CL, batch, B_P2, one_l)
        stream = g_run_stream(QOFF, K_CL, batch, TPT, BN, OVH, B_P2, one_l, raw)
        total = gl.max(stream[5], 0)
        size = gl.maximum(gl.cdiv(total, RUN_P), MIN_BLOCKS)
        n_items, ok, t_i, lo_i, hi_i, c_i, max_chunk, _slot = g_list_item(
            QOFF, K_CL, batch, p, TPT, BN, RUN_P, MIN_BLOCKS, B_P2, one_l, 0, raw
        )
        if ITEM_WAVES > 1:  # (one wave: the bound of one item)
            long_items = max_chunk * 8 * gl.cdiv(n_items, RUN_P)
        else:
            long_items = max_chunk * 8
        use_items = (n_items <= RUN_P * ITEM_WAVES) & (long_items <= size * (9 * BN))
        return p, hb, stream, total, size, n_items, (ok, t_i, lo_i, hi_i, c_i), use_items

    @gluon.jit
    def g_run_step(stream, use_items, item, p, pos, begin, end, size, QOFF, batch,
                   TPT: gl.constexpr, BN: gl.constexpr, OVH: gl.constexpr, B_P2: gl.constexpr,
                   RUN_P: gl.constexpr):  # fmt: skip
        """The segment a `RUNS` program walks at position pos: (t, n_tok, lo, hi, slot,
        n_pieces, first, nxt). Where `use_items`, item pos of the list (`item` = (t_i, lo_i,
        hi_i, c_i) of `g_list_item` for it; partial slot 2 pos, pieces = its tile's items;
        the next position pos + RUN_P); else the segment of piece p's run [begin,
        end) that starts at stream position pos (`g_run_segment` on `stream`, the
        `g_run_stream` vectors; pieces: those of the run's tiling of size units that hold
        the tile's blocks). t: the tile's leader token, n_tok its tokens, [lo, hi) its keys
        (empty where the piece ends in the tile's prologue units), first: the segment holds
        the tile's first block (its META is written there), nxt: the next segment's
        position."""
        t_i, lo_i, hi_i, c_i = item
        if use_items:
            _b, _lv, i0, _ld, q_len = g_request(QOFF, batch, t_i, TPT, B_P2, one_l_t())
            t, n_tok, lo, hi, slot, n_pieces, first, nxt = (
                t_i, q_len - i0, lo_i, hi_i, 2 * pos.to(gl.int32), c_i, lo_i == 0, pos + RUN_P,
            )  # fmt: skip
        else:
            rr, ro, rq, rw, rspan, rincl = stream
            t, n_tok, lo_b, hi_b, w_b, b0, b1, slot = g_run_segment(
                rr, ro, rq, rw, rspan, rincl, pos, end, begin, p, TPT, OVH
            )
            lo = lo_b * BN
            hi = gl.where(lo_b < hi_b, hi_b * BN, lo)
            n_pieces = ((b1 - 1) // size - b0 // size + 1).to(gl.int32)
            first = lo_b == 0
            nxt = b1
        return t, n_tok, lo, hi, slot, n_pieces, first, nxt

    @gluon.jit
    def g_run_meta(META, t, n_tok, slot, n_pieces, TPT: gl.constexpr):
        """The combine's META (slot, pieces, index in the tile) of a tile's tokens."""
        for i in gl.static_range(TPT):
            mp = META + (t + i).to(gl.int64) * 4
            gl.store(mp, slot, mask=i < n_tok)
            gl.store(mp + 1, n_pieces, mask=i < n_tok)
            gl.store(mp + 2, slot * 0 + i, mask=i < n_tok)

    @gluon.jit
    def g_rope_ptrs(rows, K, stride, stride_h, FMT: gl.constexpr, ld_l: gl.constexpr,
                    h_off=None):  # fmt: skip
        """Pointers [BN, 64] (bf16, layout ld_l) to dims 512..575 of a tile's rows: BF16 at
        element 512, rope-aware FP8 at byte 512, V32 at byte 528 (after its 4 scales). h_off
        (FP8): the rows' offsets in bf16 elements (rows * stride_h), where a caller has them
        from its other pointers (no second row product)."""
        dT = gl.arange(0, 64, layout=gl.SliceLayout(0, ld_l))
        if FMT == 0:
            ptr = K + (gl.multiple_of(rows * stride, 8) + 512)[:, None] + dT[None, :]
        else:
            k16 = K.to(gl.pointer_type(gl.bfloat16))
            off = 256 if FMT == 3 else 264
            if h_off is None:
                h_off = gl.multiple_of(rows * stride_h, 8)
            ptr = k16 + (h_off + off)[:, None] + dT[None, :]
        return ptr

    @gluon.jit
    def g_issue_rope(
        k_rope, rows, valid, K, stride, stride_h, FMT: gl.constexpr, ld_l: gl.constexpr,
        h_off=None,
    ):  # fmt: skip
        """cp.async dims 512..575 (bf16) of a tile into `k_rope` (a [BN, 64] buffer); h_off:
        `g_rope_ptrs`'."""
        ptr = g_rope_ptrs(rows, K, stride, stride_h, FMT, ld_l, h_off)
        cp.async_copy_global_to_shared(k_rope, ptr, mask=valid[:, None])

    @gluon.jit
    def g_tile_rows(r, t, hb, i0, q_len, H_Q: gl.constexpr, HPT: gl.constexpr,
                    TPT: gl.constexpr):  # fmt: skip
        """Query rows r of a tile (token-major: token r // HPT of the tile, head block hb):
        (ok, tq, tok int64, head int64); padding rows get ok False and token t, head 0."""
        tq = r // HPT
        head = hb * HPT + r % HPT
        if TPT == 1:
            # i0 < q_len for every token (`g_request`), so q's loads need not wait for the
            # request offsets (H100: tile 0 issued 2.1-2.2 us after the CTA's start
            # against 2.6-3.0; docs/kernels/gluon_mla_tw.md).
            ok = (tq < 1) & (head < H_Q)
        else:
            ok = (tq < TPT) & (i0 + tq < q_len) & (head < H_Q)
        tok = gl.where(ok, t + tq, t).to(gl.int64)
        return ok, tq, tok, gl.where(ok, head, 0).to(gl.int64)

    @gluon.jit
    def _g_load_q(Q, stride_qt, stride_qh, t, hb, i0, q_len, H_Q: gl.constexpr,
                  HPT: gl.constexpr, TPT: gl.constexpr, ld_l: gl.constexpr):  # fmt: skip
        """A 64-row query tile (`g_tile_rows`; 0 in padded rows) into registers of the
        calling warps' blocked layout ld_l: (dims 0..511 [64, 512], the rope dims [64, 64])."""
        rq = gl.arange(0, 64, layout=gl.SliceLayout(1, ld_l))
        row_ok, _tq, q_tok, q_head = g_tile_rows(rq, t, hb, i0, q_len, H_Q, HPT, TPT)
        qp = Q + q_tok * stride_qt + q_head * stride_qh
        dA = gl.arange(0, 512, layout=gl.SliceLayout(0, ld_l))
        dT = gl.arange(0, 64, layout=gl.SliceLayout(0, ld_l))
        qa = gl.load(qp[:, None] + dA[None, :], mask=row_ok[:, None], other=0.0)
        qr = gl.load(qp[:, None] + 512 + dT[None, :], mask=row_ok[:, None], other=0.0)
        return qa, qr

    @gluon.jit
    def _g_store_q(Q, stride_qt, stride_qh, t, hb, i0, q_len, q_lat, q_rope, H_Q: gl.constexpr,
                   HPT: gl.constexpr, TPT: gl.constexpr, ld_l: gl.constexpr):  # fmt: skip
        """`_g_load_q`'s tile into shared memory: dims 0..511 into q_lat [64, 512], the rope
        dims into q_rope [64, 64] (generic stores)."""
        qa, qr = _g_load_q(Q, stride_qt, stride_qh, t, hb, i0, q_len, H_Q, HPT, TPT, ld_l)
        q_lat.store(qa)
        q_rope.store(qr)

    @gluon.jit
    def g_put_q(early, Q, stride_qt, stride_qh, t, hb, i0, q_len, q_lat, q_rope,
                H_Q: gl.constexpr, HPT: gl.constexpr, TPT: gl.constexpr,
                ld_l: gl.constexpr):  # fmt: skip
        """The query tile into q_lat [64, 512] and q_rope [64, 64], visible to wgmma: `early`
        (the registers of a `_g_load_q` issued before the request's loads; one token a tile)
        or, TPT > 1 (early a placeholder), `_g_store_q`'s."""
        if TPT == 1:
            q_lat.store(early[0])
            q_rope.store(early[1])
        else:
            _g_store_q(Q, stride_qt, stride_qh, t, hb, i0, q_len, q_lat, q_rope, H_Q, HPT, TPT,
                       ld_l)  # fmt: skip
        fence_async_shared()
        gl.thread_barrier()

    @gluon.jit
    def g_seesaw_ids(TR, NHB: gl.constexpr, PDL: gl.constexpr, TRACE: gl.constexpr):
        """A seesaw CTA's trace row and program ids: (trp, t, hb, part); see
        `g_seesaw_start`."""
        trp = gl.program_id(0)
        if TRACE:  # TRACE 2: `gluon_mla_ss`'s tile trace too
            trp = g_trace_open(TR, 10 + TILE_TRACE if TRACE == 2 else 10)
        t, hb, part = g_program(NHB, PDL)
        return trp, t, hb, part

    @gluon.jit
    def g_seesaw_start(Q, stride_qt, stride_qh, TR, H_Q: gl.constexpr, HPT: gl.constexpr,
                       TPT: gl.constexpr, NHB: gl.constexpr, PDL: gl.constexpr,
                       TRACE: gl.constexpr, ld_l: gl.constexpr):  # fmt: skip
        """A seesaw CTA's first steps: (trp, t, hb, part, early). trp: its trace row
        (`g_trace_open`; without TRACE a placeholder, as warp_specialize arguments cannot be
        None); (t, hb, part): `g_program`; early: where a tile holds one token, q's loads
        (`_g_load_q`, for `g_put_q`), issued before any load of the request's, as its rows
        need no request offsets; else `trp` as a placeholder (a jit function cannot return
        None)."""
        trp, t, hb, part = g_seesaw_ids(TR, NHB, PDL, TRACE)
        early = g_early_q(trp, Q, stride_qt, stride_qh, t, hb, H_Q, HPT, TPT, ld_l)
        return trp, t, hb, part, early

    @gluon.jit
    def g_early_q(trp, Q, stride_qt, stride_qh, t, hb, H_Q: gl.constexpr, HPT: gl.constexpr,
                  TPT: gl.constexpr, ld_l: gl.constexpr):  # fmt: skip
        """Where a tile holds one token, q's loads (`_g_load_q`, for `g_put_q`); else `trp`
        as a placeholder (`g_seesaw_start`)."""
        early = trp
        if TPT == 1:
            early = _g_load_q(Q, stride_qt, stride_qh, t, hb, 0, 1, H_Q, HPT, TPT, ld_l)
        return early

    @gluon.jit
    def g_request(QOFF, batch, t, TPT: gl.constexpr, B_P2: gl.constexpr, one_l: gl.constexpr):
        """Token t's request b (live: b < batch), t's index i0 in it, whether t leads a tile
        of TPT tokens, and the request's query length (0 unless t leads)."""
        ob = gl.arange(0, B_P2, layout=one_l)
        offs = gl.load(QOFF + ob, mask=ob <= batch, other=2147483647)
        b = gl.sum((offs <= t).to(gl.int32), 0) - 1
        live = b < batch
        # offsets are non-decreasing: offs[b] and offs[b + 1] from the same load (no second,
        # dependent load before the cache length's)
        q_start = gl.max(gl.where(offs <= t, offs, -1), 0)
        q_end = gl.min(gl.where(offs > t, offs, 2147483647), 0)
        q_start = gl.where(live, q_start, t)
        q_end = gl.where(live, q_end, t + 1)
        i0 = t - q_start
        leader = (i0 % TPT) == 0
        q_len = gl.where(leader, q_end - q_start, 0)
        return b, live, i0, leader, q_len

    @gluon.jit
    def g_key_range(
        K_CL, K_TOPK, b, t, live, leader, i0, q_len, part, NUM_P, K_idx_len,
        SPARSE: gl.constexpr, HAS_TOPK: gl.constexpr, TOPK_TOK: gl.constexpr,
        CAUSAL: gl.constexpr, TPT: gl.constexpr, BN: gl.constexpr, ITEM=None,
    ):  # fmt: skip
        """(cache_len, lo, hi): the keys [lo, hi) of split-K partition `part` (chunks rounded
        to BN; causal tiles stop after their last token's keys; empty unless t leads); with
        ITEM, a balanced item's (lo, hi) (`g_work_item`), that chunk of the tile's keys."""
        cache_len = gl.load(K_CL + b, mask=live, other=0)
        if SPARSE:
            n_main = K_idx_len
            if HAS_TOPK:
                if TOPK_TOK:
                    n_main = gl.load(K_TOPK + t)
                else:
                    n_main = gl.load(K_TOPK + b, mask=live, other=0)
                n_main = gl.minimum(gl.maximum(n_main, 0), K_idx_len)
            main_lim = n_main
        else:
            n_main = cache_len + q_len
            if CAUSAL:
                main_lim = gl.minimum(cache_len + i0 + TPT, n_main)
            else:
                main_lim = n_main
        n_main = gl.where(live, n_main, 0)
        main_lim = gl.where(live & leader, main_lim, 0)
        if ITEM is None:
            chunk = gl.cdiv(gl.cdiv(n_main, NUM_P), BN) * BN
            lo = part * chunk
            hi = gl.minimum(gl.minimum(lo + chunk, n_main), main_lim)
        else:
            lo = ITEM[0]
            hi = gl.minimum(gl.minimum(ITEM[1], n_main), main_lim)
        return cache_len, lo, hi

    @gluon.jit
    def _g_issue_tile(
        k_main, k_sc, k_rope, vbuf, stage, start, hi, key, K, K_SC, K_stride, K_stride_h,
        K_stride_q, K_sc_stride, K_ps, K_psr, K_nenc, K_npages, SPARSE: gl.constexpr,
        BN: gl.constexpr, FMT: gl.constexpr, ld_l: gl.constexpr, NW: gl.constexpr,
    ):  # fmt: skip
        """cp.async the tile of key positions [start, start + BN) (its `key`s loaded) into ring
        stage `stage`: dims 0..511 and scales, the rope dims, the validity mask; one group."""
        rows, valid = g_rows(
            start, hi, key, K_ps, K_psr, K_nenc, K_npages, SPARSE, BN, gl.SliceLayout(1, ld_l)
        )
        g_issue_main(k_main, k_sc, stage, rows, valid, K, K_SC, K_stride, K_stride_q,
                     K_sc_stride, FMT, ld_l, NW)  # fmt: skip
        g_issue_rope(k_rope.index(stage), rows, valid, K, K_stride, K_stride_h, FMT, ld_l)
        vbuf.index(stage).store(valid.to(gl.int32))
        cp.commit_group()

    @gluon.jit
    def _g_issue_next(
        key, start, hi, b, t, k_main, k_sc, k_rope, vbuf, ist, K, K_SC, K_LUT, K_IDX,
        K_lut_stride, K_idx_stride, K_stride, K_stride_h, K_stride_q, K_sc_stride, K_ps, K_psr,
        K_nenc, K_npages, SPARSE: gl.constexpr, BN: gl.constexpr, FMT: gl.constexpr,
        NBUF: gl.constexpr, ld_l: gl.constexpr, row_l: gl.constexpr, NW: gl.constexpr,
    ):  # fmt: skip
        """In the loop iteration of tile `start`: issue the copies of tile start + (NBUF - 1) BN
        into stage `ist` with its already loaded `key`s; return the keys of tile
        start + NBUF BN (the look-up-table load runs one iteration ahead of its copies)."""
        key_next = g_keys(
            start + NBUF * BN, hi, b, t, K_LUT, K_IDX, K_lut_stride, K_ps, K_idx_stride, SPARSE,
            BN, row_l,
        )  # fmt: skip
        _g_issue_tile(
            k_main, k_sc, k_rope, vbuf, ist, start + (NBUF - 1) * BN, hi, key, K, K_SC,
            K_stride, K_stride_h, K_stride_q, K_sc_stride, K_ps, K_psr, K_nenc, K_npages,
            SPARSE, BN, FMT, ld_l, NW,
        )  # fmt: skip
        return key_next

    @gluon.jit
    def _g_ring_fill(
        lo, hi, b, t, k_main, k_sc, k_rope, vbuf, K, K_SC, K_LUT, K_IDX, K_lut_stride,
        K_idx_stride, K_stride, K_stride_h, K_stride_q, K_sc_stride, K_ps, K_psr, K_nenc,
        K_npages, SPARSE: gl.constexpr, BN: gl.constexpr, FMT: gl.constexpr,
        NBUF: gl.constexpr, ld_l: gl.constexpr, row_l: gl.constexpr, NW: gl.constexpr,
    ):  # fmt: skip
        """Before the loop: tiles 0 .. NBUF - 2 in flight (the loop's issue step for tiles
        -NBUF + 1 .. -1); returns the keys of tile NBUF - 1, loaded."""
        key = g_keys(
            lo, hi, b, t, K_LUT, K_IDX, K_lut_stride, K_ps, K_idx_stride, SPARSE, BN, row_l
        )
        for i in gl.static_range(NBUF - 1):
            key = _g_issue_next(
                key, lo + (i + 1 - NBUF) * BN, hi, b, t, k_main, k_sc, k_rope, vbuf, i, K, K_SC,
                K_LUT, K_IDX, K_lut_stride, K_idx_stride, K_stride, K_stride_h, K_stride_q,
                K_sc_stride, K_ps, K_psr, K_nenc, K_npages, SPARSE, BN, FMT, NBUF, ld_l, row_l, NW,
            )  # fmt: skip
        return key

    @gluon.jit
    def g_normalize(m_i, l_i, SINK, head, rows_ok, USE_SINK: gl.constexpr):
        """(lse, inv) of rows with running max m_i (log2 units) and row sum l_i: lse the
        natural-log LSE over keys (-inf where no key was seen), inv the output's factor: 1 / l,
        or 1 / (l + exp(sink - max)) with the sink logit [h_q] (loaded at `head`) joining the
        denominator only; 0 where no key was seen."""
        seen = l_i != 0.0  # not > 0: a NaN row sum (a NaN or +inf score) keeps its NaN
        l_safe = gl.where(seen, l_i, 1.0)
        lse = gl.where(seen, (m_i + gl.log2(l_safe)) * LN2, float("-inf"))
        if USE_SINK:
            sink = gl.load(SINK + head, mask=rows_ok, other=0.0)
            m_sk = gl.where(seen, m_i, 0.0)
            inv = gl.where(seen, 1.0 / (l_safe + gl.exp2(sink * LOG2E - m_sk)), 0.0)
        else:
            inv = gl.where(seen, 1.0 / l_safe, 0.0)
        return lse, inv

    @gluon.jit
    def _g_max2(a, b, c, d):
        return gl.maximum(a, c), gl.maximum(b, d)

    @gluon.jit
    def _g_perm_s(d):
        """Cache column of logical column d of the register-A S product. In each 64-column
        chunk, logical 16 kb + 8 h + 2 q + e (wgmma A fragment: k-block kb, half h, lane
        q % 4, pair element e) is cache column 16 q + 4 kb + 2 h + e, so that a thread's 16
        fragment values are 16 contiguous bytes."""
        kb = (d // 16) % 4
        h = (d // 8) % 2
        q = (d // 2) % 4
        return (d // 64) * 64 + q * 16 + kb * 4 + h * 2 + d % 2

    @gluon.jit
    def _g_deq_k(raw, dot_l: gl.constexpr):
        """[64 keys, 64] e4m3 stage columns (loaded in `t_tile`'s kraw_l) -> float16 register
        A operand in `_g_perm_s` order (the reshape/permute only relabels registers: no data
        moves between threads)."""
        x = raw.to(gl.float16)
        x = gl.permute(gl.reshape(x, [64, 4, 4, 2, 2]), (0, 2, 3, 1, 4))
        return gl.convert_layout(gl.reshape(x, [64, 64]), dot_l)

    @gluon.jit
    def _g_deq_v(raw, dot_l: gl.constexpr):
        """[16 keys, 512] e4m3 stage rows -> float16 register A operand V^T [512, 16] with
        permuted rows: logical row 64 mb + 16 w + 8 h + g (M block mb, warp w, half h, lane
        g = lane // 4) holds cache column 128 w + 16 g + 2 mb + h, so that a thread's values
        are 16 contiguous bytes (the kernel's epilogue undoes the permutation); raw is loaded
        in `t_tile`'s vraw_l. Keys k and k + 1 (a register bit of vraw_l) have their bytes
        interleaved first (one PRMT a 4 bytes), so that each two-element upcast gives an A
        operand pair (k, k + 1) of one dim (upcast in cache order, the float16 pairs took two
        PRMT a 4 elements: H200, tw s_k 4096 0.1036 against 0.1061 ms from HBM,
        docs/kernels/gluon_mla.md)."""
        a, b = gl.split(
            gl.permute(gl.reshape(raw.to(gl.int8, bitcast=True), [8, 2, 512]), (0, 2, 1))
        )
        lo, hi = gl.inline_asm_elementwise(
            "prmt.b32 $0, $2, $3, 0x5140;\n\tprmt.b32 $1, $2, $3, 0x7362;",
            "=r,=r,r,r",
            [a, b],
            dtype=(gl.int8, gl.int8),
            is_pure=True,
            pack=4,
        )
        # pack 4: a thread's dims 4 m .. 4 m + 3 of one key (vraw_l's first register bits) are
        # one word; byte j of lo's (kp, dim 4 m + j) holds key 2 kp + j % 2, dim 4 m + j // 2
        # (hi: + 2)
        x = gl.reshape(gl.join(lo, hi), [8, 128, 2, 2, 2])  # kp, m, j // 2, j % 2, lo/hi
        x = gl.reshape(gl.permute(x, (0, 3, 1, 4, 2)), [16, 512])
        x = gl.permute(x.to(gl.float8e4nv, bitcast=True).to(gl.float16), (1, 0))
        x = gl.permute(gl.reshape(x, [4, 8, 8, 2, 16]), (2, 0, 3, 1, 4))
        return gl.convert_layout(gl.reshape(x, [512, 16]), dot_l)

    @gluon.jit
    def _mla_decode_sm90(
        q_args, out_args, k_args,
        H_Q: gl.constexpr, D_QK: gl.constexpr, D_V: gl.constexpr, HPT: gl.constexpr,
        TPT: gl.constexpr, NHB: gl.constexpr, B_P2: gl.constexpr, CAUSAL: gl.constexpr,
        HAS_SINK: gl.constexpr, SPLIT: gl.constexpr, SPARSE: gl.constexpr,
        HAS_TOPK: gl.constexpr, TOPK_TOK: gl.constexpr, FMT: gl.constexpr,
        BN: gl.constexpr, NBUF: gl.constexpr, PIPE: gl.constexpr, PDL: gl.constexpr = False,
    ):  # fmt: skip
        """64 query rows (heads of a token, or of up to 64 // h_q tokens; padded) x one key
        partition, 8 warps = 2 warpgroups. S = Q K^T is split by keys between the warpgroups
        (BN / 2 each, no duplicated work); P goes through shared memory; O [64, 512] is split by
        columns (256 each). K tiles of BN keys are gathered with cp.async into an NBUF-deep ring
        (NBUF - 1 tiles in flight while one is computed); the lookup-table / index load of a tile
        is issued one iteration before its copies. FP8 tiles are staged raw and dequantized to
        bf16 in shared memory (per-token scales are folded into S and P instead)."""
        Q, stride_qt, stride_qh, QOFF, batch, n_tokens = q_args
        OUT, stride_ot, stride_oh, LSE, PO, PL, SINK, qk_scale, NUM_P = out_args
        (K, K_SC, K_LUT, K_CL, K_IDX, K_TOPK, K_stride, K_stride_h, K_stride_q, K_sc_stride,
         K_lut_stride, K_ps, K_psr, K_nenc, K_npages, K_idx_stride, K_idx_len) = k_args  # fmt: skip
        BM: gl.constexpr = 64
        gl.static_assert(not PIPE or FMT == 0, "PIPE needs a BF16 cache (no dequant buffer)")
        s_l: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[4, 2], instr_shape=[16, BN // 2, 16]
        )
        o_l: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[4, 2], instr_shape=[16, 256, 16]
        )
        ld_l: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [8, 1], [1, 0])
        cv_l: gl.constexpr = gl.BlockedLayout([1, 16], [4, 8], [8, 1], [1, 0])
        sm_l: gl.constexpr = gl.NVMMASharedLayout(
            swizzle_byte_width=128, element_bitwidth=16, rank=2
        )
        raw_l: gl.constexpr = gl.SwizzledSharedLayout(
            vec=16, per_phase=1, max_phase=8, order=[1, 0]
        )
        pl_l: gl.constexpr = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[1, 0])
        one_l: gl.constexpr = gl.BlockedLayout([1], [32], [8], [0])
        row_l: gl.constexpr = gl.SliceLayout(1, ld_l)
        NSC: gl.constexpr = 4 if FMT == 4 else 1

        t, hb, part = g_program(NHB, PDL)
        b, live, i0, leader, q_len = g_request(QOFF, batch, t, TPT, B_P2, one_l)

        # Shared memory: Q, the K ring (+ its validity masks), P.
        q_lat = gl.allocate_shared_memory(gl.bfloat16, [BM, 512], sm_l)
        q_rope = gl.allocate_shared_memory(gl.bfloat16, [BM, 64], sm_l)
        p_l: gl.constexpr = gl.NVMMASharedLayout(
            swizzle_byte_width=min(128, 2 * BN), element_bitwidth=16, rank=2
        )
        p_smem = gl.allocate_shared_memory(gl.bfloat16, [BM, BN], p_l)
        k_rope = gl.allocate_shared_memory(gl.bfloat16, [NBUF, BN, 64], sm_l)
        v1_l: gl.constexpr = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[0])
        vbuf = gl.allocate_shared_memory(gl.int32, [NBUF, BN], v1_l)
        if FMT == 0:
            k_main = gl.allocate_shared_memory(gl.bfloat16, [NBUF, BN, 512], sm_l)
            k_sc = p_smem  # unused
            k_bf = p_smem  # unused
        else:
            k_main = gl.allocate_shared_memory(gl.float8e4nv, [NBUF, BN, 512], raw_l)
            k_sc = gl.allocate_shared_memory(gl.float32, [NBUF, BN, NSC], pl_l)
            k_bf = gl.allocate_shared_memory(gl.bfloat16, [BN, 512], sm_l)
        # Zero the ring once: a masked (not copied) lane can never leave NaN behind.
        for i in gl.static_range(NBUF):
            if FMT == 0:
                k_main.index(i).store(gl.zeros([BN, 512], gl.bfloat16, ld_l))
            else:
                k_main.index(i).store(gl.zeros([BN, 512], gl.float8e4nv, cv_l))
            k_rope.index(i).store(gl.zeros([BN, 64], gl.bfloat16, ld_l))

        _g_store_q(Q, stride_qt, stride_qh, t, hb, i0, q_len, q_lat, q_rope, H_Q, HPT, TPT, ld_l)

        # Key range of this partition.
        cache_len, lo, hi = g_key_range(
            K_CL, K_TOPK, b, t, live, leader, i0, q_len, part, NUM_P, K_idx_len,
            SPARSE, HAS_TOPK, TOPK_TOK, CAUSAL, TPT, BN,
        )  # fmt: skip

        rs = gl.arange(0, BM, layout=gl.SliceLayout(1, s_l))
        rows_ok_s, tqs, _tok, head_s = g_tile_rows(rs, t, hb, i0, q_len, H_Q, HPT, TPT)
        row_lim = gl.where(rows_ok_s, cache_len + i0 + tqs + 1, 0)
        kcol = gl.arange(0, BN, layout=gl.SliceLayout(0, s_l))

        acc = gl.zeros([BM, 512], gl.float32, o_l)
        m_i = gl.full([BM], float("-inf"), gl.float32, gl.SliceLayout(1, s_l))
        l_i = gl.zeros([BM], gl.float32, gl.SliceLayout(1, s_l))
        zero_s = gl.zeros([BM, BN], gl.float32, s_l)

        key = _g_ring_fill(
            lo, hi, b, t, k_main, k_sc, k_rope, vbuf, K, K_SC, K_LUT, K_IDX, K_lut_stride,
            K_idx_stride, K_stride, K_stride_h, K_stride_q, K_sc_stride, K_ps, K_psr, K_nenc,
            K_npages, SPARSE, BN, FMT, NBUF, ld_l, row_l, 8,
        )  # fmt: skip

        n_it = gl.cdiv(gl.maximum(hi - lo, 0), BN)
        for it in range(n_it):
            st = it % NBUF
            ist = (it + NBUF - 1) % NBUF
            start = lo + it * BN
            if not PIPE:
                # Issue tile it + NBUF - 1 (its keys arrived during the previous iteration) and
                # load the keys of tile it + NBUF.
                key = _g_issue_next(
                    key, start, hi, b, t, k_main, k_sc, k_rope, vbuf, ist, K, K_SC, K_LUT,
                    K_IDX, K_lut_stride, K_idx_stride, K_stride, K_stride_h, K_stride_q,
                    K_sc_stride, K_ps, K_psr, K_nenc, K_npages, SPARSE, BN, FMT, NBUF, ld_l,
                    row_l, 8,
                )  # fmt: skip
                cp.wait_group(NBUF - 1)  # tile it has landed
            else:
                cp.wait_group(NBUF - 2)  # tile it has landed (tile it + NBUF - 1 not issued)
            fence_async_shared()
            gl.thread_barrier()
            if FMT == 0:
                kl = k_main.index(st)
            else:
                x = k_main.index(st).load(cv_l)
                if FMT == 4:
                    xf = gl.reshape(x.to(gl.float32), [BN, 4, 128])
                    sc = k_sc.index(st).load(gl.SliceLayout(2, xf.type.layout))
                    xb = gl.reshape((xf * sc[:, :, None]).to(gl.bfloat16), [BN, 512])
                else:
                    xb = x.to(gl.bfloat16)
                k_bf.store(xb)
                fence_async_shared()
                gl.thread_barrier()
                kl = k_bf
            s = warpgroup_mma(q_lat, kl.permute((1, 0)), zero_s, use_acc=False, is_async=True)
            if FMT == 3:  # per-token scale folded into the latent part of S (and into P)
                s = warpgroup_mma_wait(num_outstanding=0, deps=(s,))
                s_tok = k_sc.index(st).load(gl.BlockedLayout([1, 1], [32, 1], [2, 4], [1, 0]))
                s_tok = gl.convert_layout(gl.reshape(s_tok, [BN]), gl.SliceLayout(0, s_l))
                s = s * s_tok[None, :]
            s = warpgroup_mma(q_rope, k_rope.index(st).permute((1, 0)), s, is_async=True)
            if PIPE:
                # The P V product of tile it - 1 completes here too (groups retire in order).
                # Waiting for it alone (wait_group 2) before S would let the copies below run
                # under the S product, but ptxas then serializes every wgmma (C7514: it does
                # not track the group across the loop's back edge).
                s, acc = warpgroup_mma_wait(num_outstanding=0, deps=(s, acc))
                gl.thread_barrier()  # every warpgroup is done with tile it - 1's stage and P
                key = _g_issue_next(
                    key, start, hi, b, t, k_main, k_sc, k_rope, vbuf, ist, K, K_SC, K_LUT,
                    K_IDX, K_lut_stride, K_idx_stride, K_stride, K_stride_h, K_stride_q,
                    K_sc_stride, K_ps, K_psr, K_nenc, K_npages, SPARSE, BN, FMT, NBUF, ld_l,
                    row_l, 8,
                )  # fmt: skip
            else:
                s = warpgroup_mma_wait(num_outstanding=0, deps=(s,))
            keep = vbuf.index(st).load(gl.SliceLayout(0, s_l))[None, :] != 0
            if CAUSAL and not SPARSE:
                keep = keep & ((start + kcol)[None, :] < row_lim[:, None])
            s = gl.where(keep, s * qk_scale, float("-inf"))
            m_new = gl.maximum(m_i, gl.max(s, 1))
            m_use = gl.where(m_new == float("-inf"), 0.0, m_new)
            alpha = gl.exp2(m_i - m_use)
            p = gl.exp2(s - m_use[:, None])
            l_i = l_i * alpha + gl.sum(p, 1)
            m_i = m_new
            if FMT == 3:
                p = p * s_tok[None, :]
            acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, o_l))[:, None]
            p_smem.store(p.to(gl.bfloat16))
            fence_async_shared()
            gl.thread_barrier()
            acc = warpgroup_mma(p_smem, kl, acc, is_async=True)
            if PIPE:  # left in flight (waited for behind the next S product)
                acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc,))
            else:
                acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
                gl.thread_barrier()  # the stage and P may be overwritten from here on
        if PIPE:
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        cp.wait_group(0)

        lse, inv = g_normalize(m_i, l_i, SINK, head_s, rows_ok_s, HAS_SINK and not SPLIT)
        ro = gl.arange(0, BM, layout=gl.SliceLayout(1, o_l))
        row_ok_o, _tq, tok_o, head_o = g_tile_rows(ro, t, hb, i0, q_len, H_Q, HPT, TPT)
        do = gl.arange(0, 512, layout=gl.SliceLayout(0, o_l))
        smask = row_ok_o[:, None] & (do < D_V)[None, :]
        if not SPLIT:
            o = acc * gl.convert_layout(inv, gl.SliceLayout(1, o_l))[:, None]
            optr = OUT + tok_o[:, None] * stride_ot + head_o[:, None] * stride_oh + do[None, :]
            gl.store(optr, o.to(gl.bfloat16), mask=smask)
            gl.store(
                LSE + tok_o * H_Q + head_o,
                gl.convert_layout(lse, gl.SliceLayout(1, o_l)),
                mask=row_ok_o,
            )
        else:
            o = acc * gl.convert_layout(inv, gl.SliceLayout(1, o_l))[:, None]
            prow = (part * n_tokens + tok_o) * H_Q + head_o
            gl.store(PO + prow[:, None] * D_V + do[None, :], o, mask=smask)
            gl.store(PL + prow, gl.convert_layout(lse, gl.SliceLayout(1, o_l)), mask=row_ok_o)

    @gluon.jit
    def t_q_load(Q, stride_qt, stride_qh, t, hb, i0, q_len, H_Q: gl.constexpr,
                 HPT: gl.constexpr, TPT: gl.constexpr, NR: gl.constexpr, FMT: gl.constexpr,
                 ld_l: gl.constexpr):  # fmt: skip
        """The loads of a keys-as-M tile's NR query rows (layout ld_l): q's latent part (FP8:
        its columns in `_g_perm_s` order) and its rope part; padding rows load 0."""
        rq = gl.arange(0, NR, layout=gl.SliceLayout(1, ld_l))
        row_ok, _tq, q_tok, q_head = g_tile_rows(rq, t, hb, i0, q_len, H_Q, HPT, TPT)
        qp = Q + q_tok * stride_qt + q_head * stride_qh
        dA = gl.arange(0, 512, layout=gl.SliceLayout(0, ld_l))
        dT = gl.arange(0, 64, layout=gl.SliceLayout(0, ld_l))
        if FMT != 0:
            dA = _g_perm_s(dA)
        qa = gl.load(qp[:, None] + dA[None, :], mask=row_ok[:, None], other=0.0)
        qr = gl.load(qp[:, None] + 512 + dT[None, :], mask=row_ok[:, None], other=0.0)
        return qa, qr

    @gluon.jit
    def t_state(t, hb, i0, q_len, cache_len, H_Q: gl.constexpr, HPT: gl.constexpr,
                TPT: gl.constexpr, NR: gl.constexpr, BN: gl.constexpr):  # fmt: skip
        """The loop state of a keys-as-M consumer (`t_tile`'s arguments): (row_lim, kpos,
        acc, m_i, l_acc, tau, zero_s). Row sums are kept per key slot (l_acc [BN, NR]) and
        reduced once after the loop (one cross-warp reduction a tile fewer); O's units tau
        are per column (FP8)."""
        mma_l: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, NR, 16]
        )
        col_l: gl.constexpr = gl.SliceLayout(0, mma_l)
        rc = gl.arange(0, NR, layout=col_l)
        rows_ok_c, tqc, _tok, _head = g_tile_rows(rc, t, hb, i0, q_len, H_Q, HPT, TPT)
        row_lim = gl.where(rows_ok_c, cache_len + i0 + tqc + 1, 0)
        kpos = gl.arange(0, BN, layout=gl.SliceLayout(1, mma_l))
        acc = gl.zeros([512, NR], gl.float32, mma_l)
        m_i = gl.full([NR], float("-inf"), gl.float32, col_l)
        l_acc = gl.zeros([BN, NR], gl.float32, mma_l)
        tau = gl.full([NR], 1.0, gl.float32, col_l)
        zero_s = gl.zeros([BN, NR], gl.float32, mma_l)
        return row_lim, kpos, acc, m_i, l_acc, tau, zero_s

    @gluon.jit
    def t_q_store(q_lat, q_rope, qa, qr, FMT: gl.constexpr):
        """q's latent part qa and rope part qr into shared memory; returns the factor of the
        latent logits: 1 (BF16), or 2^e for FP8, whose float16 latent part is 2^-e q with
        max |q| < 2^15 (an exact power-of-two scaling). The maximum is over finite elements:
        an inf (or NaN) in one query row stays in that row (it must not scale the other rows
        of the tile down to 0)."""
        lat_scale = 1.0
        if FMT == 0:
            q_lat.store(qa)
        else:
            qf = qa.to(gl.float32)
            qabs = gl.abs(qf)
            qmax = gl.max(gl.max(gl.where(qabs < float("inf"), qabs, 0.0), 1), 0)
            e = gl.minimum(gl.maximum(gl.ceil(gl.log2(qmax)) - 14.0, 0.0), 120.0).to(gl.int32)
            down = ((127 - e) << 23).to(gl.float32, bitcast=True)
            lat_scale = ((127 + e) << 23).to(gl.float32, bitcast=True)
            q_lat.store((qf * down).to(gl.float16))
        q_rope.store(qr)
        return lat_scale

    @gluon.jit
    def _t_ref(m_i, s_max):
        """The online softmax's new reference m (columns; -inf where no key yet), the value
        the row sums' terms 2^(s - m_use) take it as (0 where -inf) and O's and the row sums'
        factor 2^(m_i - m_use)."""
        m_new = gl.maximum(m_i, s_max)
        m_use = gl.where(m_new == float("-inf"), 0.0, m_new)
        return m_new, m_use, gl.exp2(m_i - m_use)

    @gluon.jit
    def _t_p_store(p_smem, p):
        """P [BN, NR] (keys as rows) into p_smem as P^T [NR, BN] in its dtype."""
        p_smem.store(gl.permute(p.to(p_smem.dtype), (1, 0)))

    @gluon.jit
    def t_tile(kl, kr, ksc, vb, q_lat, q_rope, p_smem, start, kpos, row_lim, acc, m_i, l_acc,
               tau, zero_s, lat_scale, qk_scale, FMT: gl.constexpr,
               MASK_CAUSAL: gl.constexpr, PF: gl.constexpr = True,
               FOLD: gl.constexpr = False, SPEC: gl.constexpr = False,
               TH: gl.constexpr = 8.0, f_smem=None):  # fmt: skip
        """One keys-as-M tile (`_mla_decode_sm90_t`): S^T = K Q^T [BN, NR] from stage views kl
        (dims 0..511), kr (rope), ksc (FP8 per-token scales) and vb (validity), the online
        softmax, O^T += V^T P^T (P through p_smem). Returns (acc, m_i, l_acc, tau); every MMA
        is complete, but other threads may still read the stage or P (the caller syncs).
        PF (FP8): each chunk's e4m3 bytes are loaded from shared memory one chunk ahead (the
        first V chunk's before the softmax), so a load's latency is not waited for right
        before its upcast.
        FOLD (FP8): one cross-warp reduction a tile, of s + log2(scale) (the per-token scale,
        floored at 2^-20 there): that maximum is the reference m, so P = 2^(s - m) * scale
        <= 1 (the row sums' term 2^(s - m) <= 2^20, times the scale: a multiply, not a second
        exp2) carries the scale (O in the units of m alone: tau is returned unchanged).
        Without it, the reduction is of the pair (s, scale) and P is rescaled by the tile's
        largest scale (tau, a division an element).
        SPEC (FOLD): no cross-warp reduction on the way to P V unless a key needs it: m stays
        the reference while no key's s + log2(scale) passes it by more than TH (P <= 2^TH in
        float16); each key's flag goes through f_smem (int8 [BN]) beside P (the P barrier
        serves both) and only a tile with a flagged key reduces, rescales O and the row sums
        and writes P again (every tile before any key is seen). P and f_smem must not alias
        the stage (a write there waits for the S products' reads: a barrier)."""
        key_l: gl.constexpr = gl.SliceLayout(1, zero_s.type.layout)
        BN: gl.constexpr = zero_s.shape[0]
        dot_l: gl.constexpr = gl.DotOperandLayout(
            operand_index=0, parent=zero_s.type.layout, k_width=2
        )
        # K [64 keys, 64 d] of one S chunk: 16 contiguous bytes a thread (d bits 0-3), rows
        # g and g + 8 (g = lane // 4), 16-byte column q = lane % 4, warps 16 rows each.
        kraw_l: gl.constexpr = gl.DistributedLinearLayout(
            reg_bases=[[0, 1], [0, 2], [0, 4], [0, 8], [8, 0]],
            lane_bases=[[0, 16], [0, 32], [1, 0], [2, 0], [4, 0]],
            warp_bases=[[16, 0], [32, 0]],
            block_bases=[],
            shape=[64, 64],
        )
        # V [16 keys, 512 d] of one P V chunk: 16 contiguous bytes a thread (d bits 0-3) of
        # keys 2q + {0, 1, 8, 9}, 16-byte column 8 w + g.
        vraw_l: gl.constexpr = gl.DistributedLinearLayout(
            reg_bases=[[0, 1], [0, 2], [0, 4], [0, 8], [1, 0], [8, 0]],
            lane_bases=[[2, 0], [4, 0], [0, 16], [0, 32], [0, 64]],
            warp_bases=[[0, 128], [0, 256]],
            block_bases=[],
            shape=[16, 512],
        )
        ok = vb.load(key_l) != 0
        if FMT != 0:
            s = zero_s
            xk = kl.slice(0, 64, dim=1).load(kraw_l)
            for j in gl.static_range(8):
                if PF:
                    if j < 7:
                        xn = kl.slice((j + 1) * 64, 64, dim=1).load(kraw_l)
                    else:  # the first V chunk's bytes (read by the P V loop below)
                        xn = kl.slice(0, 16, dim=0).load(vraw_l)
                else:
                    xk = kl.slice(j * 64, 64, dim=1).load(kraw_l)
                a = _g_deq_k(xk, dot_l)
                s = warpgroup_mma(
                    a, q_lat.slice(j * 64, 64, dim=1).permute((1, 0)), s, use_acc=j > 0,
                    is_async=True,
                )  # fmt: skip
                s, a = warpgroup_mma_wait(num_outstanding=1, deps=(s, a))
                if PF:
                    xk = xn
        else:
            s = warpgroup_mma(kl, q_lat.permute((1, 0)), zero_s, use_acc=False, is_async=True)
        if FMT != 0:  # the per-token scale of the latent part (rows of S^T)
            s = warpgroup_mma_wait(num_outstanding=0, deps=(s,))
            s_tok = ksc.load(key_l)
            s_tok = gl.where(ok, s_tok, 0.0)
            s = s * (s_tok * lat_scale)[:, None]
        s = warpgroup_mma(kr, q_rope.permute((1, 0)), s, is_async=True)
        s = warpgroup_mma_wait(num_outstanding=0, deps=(s,))
        keep = ok[:, None]
        if MASK_CAUSAL:
            keep = keep & ((start + kpos)[:, None] < row_lim[None, :])
        s = gl.where(keep, s * qk_scale, float("-inf"))
        if SPEC:
            gl.static_assert(FOLD and FMT != 0, "SPEC needs the FOLD softmax")
            gl.static_assert(TH <= 15.0, "P <= 2^TH must fit float16")
            v = s + gl.maximum(gl.log2(s_tok), -20.0)[:, None]  # FOLD's reduced values
            # P against the kept reference (overwritten below if a key passed it by > TH)
            m_use = gl.where(m_i == float("-inf"), 0.0, m_i)
            p = gl.exp2(s - m_use[None, :])
            _t_p_store(p_smem, p * s_tok[:, None])
            over = (v > (m_i + TH)[None, :]).to(gl.int32)
            f_smem.store(gl.max(over, 1).to(gl.int8))  # a key's flag (a within-warp max)
            fence_async_shared()
            gl.thread_barrier()
            # every thread reads all BN flags (BN / 4 words): the branch is warpgroup-uniform
            rep_l: gl.constexpr = gl.BlockedLayout([BN // 4], [32], [4], [0])
            words = f_smem._reinterpret(gl.int32, [BN // 4], f_smem.type.layout).load(rep_l)
            if gl.max(words, 0) != 0:  # FOLD's reduction and rescale, and P again
                m_new, m_use, alpha = _t_ref(m_i, gl.max(v, 0))
                acc = acc * alpha[None, :]
                l_acc = l_acc * alpha[None, :]
                p = gl.exp2(s - m_use[None, :])
                _t_p_store(p_smem, p * s_tok[:, None])
                m_i = m_new
                fence_async_shared()
                gl.thread_barrier()
            l_acc = l_acc + p
        elif FOLD and FMT != 0:
            lt = gl.log2(s_tok)  # -inf for invalid keys (scale 0)
            s_max = gl.max(s + gl.maximum(lt, -20.0)[:, None], 0)
        elif FMT != 0:  # the tile's largest key scale, in the same reduction as the max
            s_b = gl.zeros_like(s) + s_tok[:, None]
            s_max, sig = gl.reduce((s, s_b), 0, _g_max2)
        else:
            s_max = gl.max(s, 0)
        if not SPEC:
            m_new, m_use, alpha = _t_ref(m_i, s_max)
            p = gl.exp2(s - m_use[None, :])
            l_acc = l_acc * alpha[None, :] + p
            m_i = m_new
            if FOLD and FMT != 0:  # P with the scale folded in (<= 1)
                p = p * s_tok[:, None]
            elif FMT != 0:
                sig = gl.where(sig > 0.0, sig, tau)
                p = p * s_tok[:, None] / sig[None, :]
                alpha = alpha * (tau / sig)
                tau = sig
            acc = acc * alpha[None, :]
            _t_p_store(p_smem, p)
            fence_async_shared()
            gl.thread_barrier()
        if FMT != 0:
            xv = xk  # PF: the first V chunk's bytes, loaded in the last S step
            for c in gl.static_range(BN // 16):
                if PF:
                    if c < BN // 16 - 1:
                        xn = kl.slice((c + 1) * 16, 16, dim=0).load(vraw_l)
                else:
                    xv = kl.slice(c * 16, 16, dim=0).load(vraw_l)
                va = _g_deq_v(xv, dot_l)
                acc = warpgroup_mma(
                    va, p_smem.slice(c * 16, 16, dim=1).permute((1, 0)), acc, is_async=True
                )
                acc, va = warpgroup_mma_wait(num_outstanding=1, deps=(acc, va))
                if PF:
                    xv = xn
        else:
            acc = warpgroup_mma(kl.permute((1, 0)), p_smem.permute((1, 0)), acc, is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        return acc, m_i, l_acc, tau

    @gluon.constexpr_function
    def _g_rows_first(layout):
        """`layout` (a DistributedLinearLayout of a 2-D tensor) with the register bases along
        dim 0 first, in increasing order: the same threads hold the same elements, but a
        thread's consecutive rows are consecutive registers (vector stores along dim 0)."""
        rows = sorted(b for b in layout.reg_bases if b[1] == 0)
        rest = [b for b in layout.reg_bases if b[1] != 0]
        return gl.DistributedLinearLayout(
            reg_bases=rows + rest,
            lane_bases=layout.lane_bases,
            warp_bases=layout.warp_bases,
            block_bases=layout.block_bases,
            shape=layout.shape,
        )

    @gluon.jit
    def t_store(acc, m_i, l_i, tau, t, hb, i0, q_len, part, n_tokens, OUT, stride_ot,
                stride_oh, LSE, PO, PL, SINK, H_Q: gl.constexpr, HPT: gl.constexpr,
                TPT: gl.constexpr, D_V: gl.constexpr, HAS_SINK: gl.constexpr,
                SPLIT: gl.constexpr, FMT: gl.constexpr):  # fmt: skip
        """Epilogue of the keys-as-M kernels: O^T [512, NR] (acc in units tau, rows permuted
        for FP8) and the LSE of row max m_i (log2 units) and row sum l_i, normalized and stored
        (SPLIT: into this partition's float32 slots)."""
        NR: gl.constexpr = acc.shape[1]
        col_l: gl.constexpr = gl.SliceLayout(0, acc.type.layout)
        cv_l: gl.constexpr = gl.BlockedLayout([4, 1], [32, 1], [1, 4], [0, 1])
        rc = gl.arange(0, NR, layout=col_l)
        rows_ok_c, _tq, _tok, head_c = g_tile_rows(rc, t, hb, i0, q_len, H_Q, HPT, TPT)
        lse, inv = g_normalize(m_i, l_i, SINK, head_c, rows_ok_c, HAS_SINK and not SPLIT)
        o = acc * (inv * tau)[None, :]
        if not SPLIT:  # bf16 before any layout conversion (half the shared-memory bytes)
            o = o.to(gl.bfloat16)
        if FMT != 0:
            # Rows back to cache-column order (`_g_deq_v`): a thread's 16 rows of a column are
            # then 16 contiguous output dims, made consecutive registers (no data moves
            # between threads) and stored as they are (H100, tw s_k 4096: 122.9 us
            # against 123.4 through shared memory; docs/kernels/gluon_mla.md).
            o = gl.reshape(gl.permute(gl.reshape(o, [8, 4, 2, 8, NR]), (1, 3, 0, 2, 4)), [512, NR])
            lin_l: gl.constexpr = gl.to_linear_layout(o.type.layout, [512, NR])
            o = gl.convert_layout(o, _g_rows_first(lin_l))
        else:
            o = gl.convert_layout(o, cv_l)
        out_l: gl.constexpr = o.type.layout
        ro = gl.arange(0, NR, layout=gl.SliceLayout(0, out_l))
        row_ok_o, _tq, tok_o, head_o = g_tile_rows(ro, t, hb, i0, q_len, H_Q, HPT, TPT)
        do = gl.arange(0, 512, layout=gl.SliceLayout(1, out_l))
        smask = row_ok_o[None, :] & (do < D_V)[:, None]
        lse_o = gl.convert_layout(lse, gl.SliceLayout(0, out_l))
        if not SPLIT:
            optr = OUT + tok_o[None, :] * stride_ot + head_o[None, :] * stride_oh + do[:, None]
            gl.store(optr, o, mask=smask)
            gl.store(LSE + tok_o * H_Q + head_o, lse_o, mask=row_ok_o)
        else:
            prow = (part * n_tokens + tok_o) * H_Q + head_o
            gl.store(PO + prow[None, :] * D_V + do[:, None], o, mask=smask)
            gl.store(PL + prow, lse_o, mask=row_ok_o)

    @gluon.jit
    def _mla_decode_sm90_t(
        q_args, out_args, k_args,
        H_Q: gl.constexpr, D_QK: gl.constexpr, D_V: gl.constexpr, HPT: gl.constexpr,
        TPT: gl.constexpr, NHB: gl.constexpr, B_P2: gl.constexpr, CAUSAL: gl.constexpr,
        HAS_SINK: gl.constexpr, SPLIT: gl.constexpr, SPARSE: gl.constexpr,
        HAS_TOPK: gl.constexpr, TOPK_TOK: gl.constexpr, FMT: gl.constexpr,
        BN: gl.constexpr, NBUF: gl.constexpr, NR: gl.constexpr, PF: gl.constexpr = True,
        KSWZ: gl.constexpr = 1, PDL: gl.constexpr = False, TRACE: gl.constexpr = False, TR=None,
        BALANCED: gl.constexpr = False, TARGET: gl.constexpr = 1, MIN_BLOCKS: gl.constexpr = 1,
        RUNS: gl.constexpr = False, RUN_P: gl.constexpr = 1, RUN_OVH: gl.constexpr = 0,
        ITEM_WAVES: gl.constexpr = 1, META=None, LIST_ORDER: gl.constexpr = 0,
        RUN_XSEG: gl.constexpr = False,
    ):  # fmt: skip
        """Few query rows (NR = 16 or 32: heads of a token, or of TPT tokens; padded): keys are
        the M dimension of both products, S^T = K Q^T [BN, NR] and O^T += V^T P^T [512, NR],
        so no MMA work is padded to 64 rows. One warpgroup (4 warps), BN = 64 keys a tile in an
        NBUF-deep cp.async ring, as `_mla_decode_sm90`. BF16 or rope-aware FP8 caches; FP8 runs
        float16 MMAs: e4m3 -> f16 is one native cvt per pair (bf16 would take three), q's latent
        part is scaled by 2^-e (exact) into f16 range, the per-token scale multiplies S's rows,
        and P's rows are scaled by s_tok / max(s_tok of the tile) so they stay in [0, 1] (the
        running factor `tau` keeps O in those units).

        FP8: both products take the dequantized tile from registers (wgmma's register A
        operand), read straight from the cp.async stage with 16-byte loads, so no float16 copy
        of the tile is written to shared memory (about 100 KB a CTA with NBUF 2: two CTAs a
        SM). The 16 bytes a thread loads are a fixed permutation of the columns its A fragment
        holds: of d for S (the same permutation is applied to q's latent part when it is
        stored, so S is unchanged: `_g_perm_s`) and of the output rows for P V (`_g_deq_v`;
        undone on O in registers, whose 16 contiguous output dims a thread are stored as
        vectors straight from them: `t_store`).
        The per-token scales go through a [NBUF, BN] ring read in S's row layout.

        BALANCED: one item of the balanced list a program (`g_work_item`). RUNS: program p of
        RUN_P (grid RUN_P x NHB) takes item p of the list where its items fit one wave
        (ITEM_WAVES 1; 0: never), else piece p of the contiguous runs (`worklist`,
        "Contiguous runs"): the tiles of its run one after the other (`_t_tile` each: q, the
        ring's fill, the key loop, the store; RUN_XSEG, NBUF 2: `_t_runs_x`, one ring across
        the segments); a tile cut into several items or pieces to partials at rows slot * TPT
        + i, a whole tile to the output; the program holding a tile's first block writes its
        META.

        TRACE (development, `dev/gpu_mla_dev.py --trace`, `dev/trace_mla_runs.py`): int64 TR
        [CTAs, 10] gets the globaltimer at the CTA's start, before its (last) tile's loop, when
        that tile's first block has landed, after its loop and at the CTA's end (slots 0-4),
        where RUNS once the runs are derived (5), its SM (6), tile count (7) and the SM's cycle
        counter at the start and end (8, 9); TRACE 3 (TR [CTAs, RUNS_TRACE_SLOTS]) also the
        times after the last tile's key range (10) and ring fill (11), before and after its
        `_t_tile` (13, 14) and after the ring's zeroing (15)."""
        Q, stride_qt, stride_qh, QOFF, batch, n_tokens = q_args
        OUT, stride_ot, stride_oh, LSE, PO, PL, SINK, qk_scale, NUM_P = out_args
        (K, K_SC, K_LUT, K_CL, K_IDX, K_TOPK, K_stride, K_stride_h, K_stride_q, K_sc_stride,
         K_lut_stride, K_ps, K_psr, K_nenc, K_npages, K_idx_stride, K_idx_len) = k_args  # fmt: skip
        ld_l: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
        cv_l: gl.constexpr = gl.BlockedLayout([1, 16], [4, 8], [4, 1], [1, 0])
        sm_l: gl.constexpr = gl.NVMMASharedLayout(
            swizzle_byte_width=128, element_bitwidth=16, rank=2
        )
        raw_l: gl.constexpr = t_raw_layout(KSWZ)
        one_l: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
        if FMT == 0:
            QT: gl.constexpr = gl.bfloat16
        else:
            QT: gl.constexpr = gl.float16

        if TRACE:  # TRACE 3: the runs' prologue, 16 slots a row
            trp = g_trace_open(TR, RUNS_TRACE if TRACE == 3 else 10)
        else:
            trp = TR
        if RUNS:  # the runs' loads first: their latency under the ring's zeroing below
            raw = g_request_loads(QOFF, K_CL, batch, B_P2, one_l)
        q_lat_buf = gl.allocate_shared_memory(QT, [1, NR, 512], sm_l)
        q_rope_buf = gl.allocate_shared_memory(gl.bfloat16, [1, NR, 64], sm_l)
        p_smem = gl.allocate_shared_memory(QT, [NR, BN], sm_l)
        k_rope = gl.allocate_shared_memory(gl.bfloat16, [NBUF, BN, 64], sm_l)
        v1_l: gl.constexpr = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[0])
        vbuf = gl.allocate_shared_memory(gl.int32, [NBUF, BN], v1_l)
        if FMT == 0:
            k_main = gl.allocate_shared_memory(gl.bfloat16, [NBUF, BN, 512], sm_l)
            k_sc = vbuf  # unused
        else:
            k_main = gl.allocate_shared_memory(gl.float8e4nv, [NBUF, BN, 512], raw_l)
            # one scale a key, read back in the S row layout (no layout conversion)
            k_sc = gl.allocate_shared_memory(gl.float32, [NBUF, BN], v1_l)
        for i in gl.static_range(NBUF):
            if FMT == 0:
                k_main.index(i).store(gl.zeros([BN, 512], gl.bfloat16, ld_l))
            else:
                k_main.index(i).store(gl.zeros([BN, 512], gl.float8e4nv, cv_l))
                k_sc.index(i).store(gl.zeros([BN], gl.float32, one_l))
            k_rope.index(i).store(gl.zeros([BN, 64], gl.bfloat16, ld_l))
        if TRACE == 3:
            gl.store(trp + 15, g_clock())

        if RUNS:
            gl.static_assert(ITEM_WAVES <= 1, "one item a program")
            p, hb, stream, total, size, n_items, item, use_items = g_run_choice(
                QOFF, K_CL, batch, NHB, TPT, BN, RUN_OVH, RUN_P, MIN_BLOCKS, ITEM_WAVES, B_P2,
                PDL, one_l, raw,
            )  # fmt: skip
            if TRACE:  # the runs' and the list's derivation done
                gl.store(trp + 5, g_clock())
            rr, ro, rq, rw, rspan, rincl = stream
            ok, t_i, lo_i, hi_i, c_i = item
            _t_runs(
                q_args, out_args, k_args, META, p, hb, rr, ro, rq, rw, rspan, rincl, size, total,
                use_items, ok, t_i, lo_i, hi_i, c_i, q_lat_buf, q_rope_buf, p_smem, k_rope, vbuf,
                k_main, k_sc, trp, H_Q, D_V, HPT, TPT, B_P2, CAUSAL, HAS_SINK, SPARSE, HAS_TOPK,
                TOPK_TOK, FMT, BN, NBUF, NR, PF, TRACE, RUN_OVH, RUN_P, RUN_XSEG,
            )  # fmt: skip
        else:
            if BALANCED:  # one item of the balanced list (`g_work_item`)
                ok, t, hb, w_lo, w_hi, split, part = g_work_item(
                    QOFF, K_CL, batch, NHB, TPT, BN, TARGET, MIN_BLOCKS, B_P2, PDL, one_l,
                    LIST_ORDER,
                )  # fmt: skip
                if ok:
                    _t_tile(
                        q_args, out_args, k_args, t, hb, part, split, (w_lo, w_hi), q_lat_buf,
                        q_rope_buf, p_smem, k_rope, vbuf, k_main, k_sc, trp, H_Q, D_V, HPT,
                        TPT, B_P2, CAUSAL, HAS_SINK, SPARSE, HAS_TOPK, TOPK_TOK, FMT, BN, NBUF,
                        NR, PF, TRACE, False, True,
                    )  # fmt: skip
            else:
                t, hb, part = g_program(NHB, PDL)
                _t_tile(
                    q_args, out_args, k_args, t, hb, part, False, None, q_lat_buf, q_rope_buf,
                    p_smem, k_rope, vbuf, k_main, k_sc, trp, H_Q, D_V, HPT, TPT, B_P2, CAUSAL,
                    HAS_SINK, SPARSE, HAS_TOPK, TOPK_TOK, FMT, BN, NBUF, NR, PF, TRACE, SPLIT,
                    False,
                )  # fmt: skip
        if TRACE:
            gl.thread_barrier()
            g_trace_close(trp)

    @gluon.jit
    def _t_runs(
        q_args, out_args, k_args, META, p, hb, rr, ro, rq, rw, rspan, rincl, size, total,
        use_items, ok, t_i, lo_i, hi_i, c_i, q_lat_buf, q_rope_buf, p_smem, k_rope, vbuf, k_main,
        k_sc, trp, H_Q: gl.constexpr, D_V: gl.constexpr, HPT: gl.constexpr, TPT: gl.constexpr,
        B_P2: gl.constexpr, CAUSAL: gl.constexpr, HAS_SINK: gl.constexpr, SPARSE: gl.constexpr,
        HAS_TOPK: gl.constexpr, TOPK_TOK: gl.constexpr, FMT: gl.constexpr, BN: gl.constexpr,
        NBUF: gl.constexpr, NR: gl.constexpr, PF: gl.constexpr, TRACE: gl.constexpr,
        RUN_OVH: gl.constexpr, RUN_P: gl.constexpr, XSEG: gl.constexpr = False,
    ):  # fmt: skip
        """Program p's tiles one after the other (`_t_tile` each), the META of the tiles it
        starts: where `use_items`, its item of the list (ok: it has one; t_i, [lo_i, hi_i)
        keys, c_i items in its tile; partial slot 2 p), else piece p of the contiguous runs
        (`g_run_stream`: size units a piece). XSEG: `_t_runs_x` (one ring across the
        segments) instead."""
        if XSEG:
            _t_runs_x(
                q_args, out_args, k_args, META, p, hb, (rr, ro, rq, rw, rspan, rincl), size,
                total, use_items, ok, (t_i, lo_i, hi_i, c_i), (q_lat_buf, q_rope_buf, p_smem),
                (k_rope, vbuf, k_main, k_sc), trp, H_Q, D_V, HPT, TPT, B_P2, CAUSAL, HAS_SINK,
                SPARSE, HAS_TOPK, TOPK_TOK, FMT, BN, NBUF, NR, PF, TRACE, RUN_OVH, RUN_P,
            )  # fmt: skip
            return
        QOFF = q_args[3]
        batch = q_args[4]
        # (items: p < the list's items where ok, one item a program)
        begin = gl.where(use_items, p.to(gl.int64), p.to(gl.int64) * size)
        end = gl.where(use_items, (p + ok.to(gl.int32)).to(gl.int64),
                       gl.minimum(begin + size, total))  # fmt: skip
        pos = begin
        while pos < end:
            t, n_tok, lo, hi, slot, n_pieces, first, nxt = g_run_step(
                (rr, ro, rq, rw, rspan, rincl), use_items, (t_i, lo_i, hi_i, c_i), p, pos, begin,
                end, size, QOFF, batch, TPT, BN, RUN_OVH, B_P2, RUN_P,
            )  # fmt: skip
            if lo < hi:
                if first & (hb == 0):  # the tile's first item or piece: the combine's META
                    g_run_meta(META, t, n_tok, slot, n_pieces, TPT)
                if TRACE == 3:
                    gl.store(trp + 13, g_clock())
                _t_tile(
                    q_args, out_args, k_args, t, hb, slot * TPT - t, n_pieces > 1, (lo, hi),
                    q_lat_buf, q_rope_buf, p_smem, k_rope, vbuf, k_main, k_sc, trp, H_Q, D_V,
                    HPT, TPT, B_P2, CAUSAL, HAS_SINK, SPARSE, HAS_TOPK, TOPK_TOK, FMT, BN, NBUF,
                    NR, PF, TRACE, False, True,
                )  # fmt: skip
                gl.thread_barrier()  # q and the ring are the next tile's from here on
                if TRACE == 3:
                    gl.store(trp + 14, g_clock())
            pos = nxt

    @gluon.jit
    def _x_seg(
        stream, use_items, item, p, pos, begin, end, size, QOFF, batch, K_CL, K_TOPK, K_idx_len,
        TPT: gl.constexpr, BN: gl.constexpr, OVH: gl.constexpr, B_P2: gl.constexpr,
        RUN_P: gl.constexpr, CAUSAL: gl.constexpr, SPARSE: gl.constexpr,
        HAS_TOPK: gl.constexpr, TOPK_TOK: gl.constexpr,
    ):  # fmt: skip
        """`_t_runs_x`'s segment at stream position pos (`g_run_step`), with its request and
        key range: (ok, t, n_tok, lo, hi, slot, n_pieces, first, nxt, b, i0, q_len,
        cache_len, n_it). ok: pos < end and the segment holds keys before the causal clamp
        (a segment clamped to none still stores its empty partial); [lo, hi) its keys after
        the clamp, n_it their blocks (0 where not ok). Safe past the run's end (masked
        loads)."""
        one_l: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
        t, n_tok, lo, hi, slot, n_pieces, first, nxt = g_run_step(
            stream, use_items, item, p, pos, begin, end, size, QOFF, batch, TPT, BN, OVH, B_P2,
            RUN_P,
        )  # fmt: skip
        ok = (pos < end) & (lo < hi)
        b, live, i0, leader, q_len = g_request(QOFF, batch, t, TPT, B_P2, one_l)
        live = live & ok  # (past the run's end t is no token: no cache length load)
        b = gl.where(ok, b, 0)
        cache_len, lo, hi = g_key_range(
            K_CL, K_TOPK, b, t, live, leader, i0, q_len, 0, 1, K_idx_len, SPARSE, HAS_TOPK,
            TOPK_TOK, CAUSAL, TPT, BN, (lo, hi),
        )  # fmt: skip
        n_it = gl.where(ok, gl.cdiv(gl.maximum(hi - lo, 0), BN), 0)
        return ok, t, n_tok, lo, hi, slot, n_pieces, first, nxt, b, i0, q_len, cache_len, n_it

    @gluon.jit
    def _x_blk(j, n_it, lo, hi, b, t, n_nx, lo_nx, hi_nx, b_nx, t_nx, BN: gl.constexpr):
        """(start, hi, request, token) of block j of a segment of n_it blocks from lo, past
        its end the next segment's (n_nx blocks from lo_nx; 0 where there is none), past
        both an empty range."""
        here = j < n_it
        there = (j >= n_it) & (j - n_it < n_nx)
        start = gl.where(here, lo + j * BN, gl.where(there, lo_nx + (j - n_it) * BN, 0))
        h = gl.where(here, hi, gl.where(there, hi_nx, 0))
        return start, h, gl.where(here, b, b_nx), gl.where(here, t, t_nx)

    @gluon.jit
    def _x_issue(
        key, start, hi, k_main, k_sc, k_rope, vbuf, stage, K, K_SC, K_stride, K_stride_h,
        K_stride_q, K_sc_stride, K_ps, K_psr, K_nenc, K_npages, SPARSE: gl.constexpr,
        BN: gl.constexpr, FMT: gl.constexpr, ld_l: gl.constexpr,
    ):  # fmt: skip
        """`_g_issue_tile` of keys [start, start + BN) where the range holds any, else an
        empty group (one group either way: the ring's wait counts groups)."""
        if start < hi:
            _g_issue_tile(
                k_main, k_sc, k_rope, vbuf, stage, start, hi, key, K, K_SC, K_stride,
                K_stride_h, K_stride_q, K_sc_stride, K_ps, K_psr, K_nenc, K_npages, SPARSE, BN,
                FMT, ld_l, 4,
            )  # fmt: skip
        else:
            cp.commit_group()

    @gluon.jit
    def _t_runs_x(
        q_args, out_args, k_args, META, p, hb, stream, size, total, use_items, ok_i, itm, smem,
        ring, trp, H_Q: gl.constexpr, D_V: gl.constexpr, HPT: gl.constexpr,
        TPT: gl.constexpr, B_P2: gl.constexpr, CAUSAL: gl.constexpr, HAS_SINK: gl.constexpr,
        SPARSE: gl.constexpr, HAS_TOPK: gl.constexpr, TOPK_TOK: gl.constexpr,
        FMT: gl.constexpr, BN: gl.constexpr, NBUF: gl.constexpr, NR: gl.constexpr,
        PF: gl.constexpr, TRACE: gl.constexpr, RUN_OVH: gl.constexpr, RUN_P: gl.constexpr,
    ):  # fmt: skip
        """`_t_runs` with one ring across the run's segments (RUN_XSEG): the last block of a
        segment is computed while the next segment's first block lands, so a segment does not
        drain the ring and refill it (each segment's request and key range are derived, their
        loads issued, while the segment before it runs). Per segment: META where it holds the
        tile's first block, q, the loop, the store (the output, or partials where the tile
        was cut), as `_t_tile`. Two ring stages (NBUF 2): the loop's issue step takes block
        it + 1 of the segment, past its end the next segment's first block; a segment whose
        first block is not in flight (the run's first, or after a segment of no block) fills
        the ring itself."""
        gl.static_assert(NBUF == 2, "the segments' shared ring has two stages")
        Q, stride_qt, stride_qh, QOFF, batch, n_tokens = q_args
        OUT, stride_ot, stride_oh, LSE, PO, PL, SINK, qk_scale, NUM_P = out_args
        (K, K_SC, K_LUT, K_CL, K_IDX, K_TOPK, K_stride, K_stride_h, K_stride_q, K_sc_stride,
         K_lut_stride, K_ps, K_psr, K_nenc, K_npages, K_idx_stride, K_idx_len) = k_args  # fmt: skip
        ld_l: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
        row_l: gl.constexpr = gl.SliceLayout(1, ld_l)
        q_lat_buf, q_rope_buf, p_smem = smem
        k_rope, vbuf, k_main, k_sc = ring
        begin = gl.where(use_items, p.to(gl.int64), p.to(gl.int64) * size)
        end = gl.where(use_items, (p + ok_i.to(gl.int32)).to(gl.int64),
                       gl.minimum(begin + size, total))  # fmt: skip
        ok, t, n_tok, lo, hi, slot, n_pieces, first, nxt, b, i0, q_len, cache_len, n_it = _x_seg(
            stream, use_items, itm, p, begin, begin, end, size, QOFF, batch, K_CL, K_TOPK,
            K_idx_len, TPT, BN, RUN_OVH, B_P2, RUN_P, CAUSAL, SPARSE, HAS_TOPK, TOPK_TOK,
        )  # fmt: skip
        issued = p * 0  # 1 where the segment's first block is in flight (not yet)
        gi = p * 0  # blocks this program has computed: the ring's stage of the next one
        key = g_keys(lo, lo, b, t, K_LUT, K_IDX, K_lut_stride, K_ps, K_idx_stride, SPARSE, BN,
                     row_l)  # (no lane loads: the loop-carried page ids' type)  # fmt: skip
        while ok:
            # the next segment's key range (its loads in flight under this one; what the loop
            # does not need is derived again after it, from cached lines)
            ok_n, t_n, _n, lo_n, hi_n, _s, _p, _f, _x, b_n, _i, _q, _c, n_it_n = _x_seg(
                stream, use_items, itm, p, nxt, begin, end, size, QOFF, batch, K_CL, K_TOPK,
                K_idx_len, TPT, BN, RUN_OVH, B_P2, RUN_P, CAUSAL, SPARSE, HAS_TOPK, TOPK_TOK,
            )  # fmt: skip
            n_nx = gl.where(ok_n, n_it_n, 0)
            if first & (hb == 0):  # the tile's first item or piece: the combine's META
                g_run_meta(META, t, n_tok, slot, n_pieces, TPT)
            if TRACE == 3:
                gl.store(trp + 13, g_clock())
            qa, qr = t_q_load(Q, stride_qt, stride_qh, t, hb, i0, q_len, H_Q, HPT, TPT, NR,
                              FMT, ld_l)  # fmt: skip
            row_lim, kpos, acc, m_i, l_acc, tau, zero_s = t_state(
                t, hb, i0, q_len, cache_len, H_Q, HPT, TPT, NR, BN
            )
            if issued == 0:  # the ring's fill: block 0 (older groups are empty or landed)
                cp.wait_group(0)
                key0 = g_keys(lo, hi, b, t, K_LUT, K_IDX, K_lut_stride, K_ps, K_idx_stride,
                              SPARSE, BN, row_l)  # fmt: skip
                _x_issue(key0, lo, hi, k_main, k_sc, k_rope, vbuf, gi % 2, K, K_SC, K_stride,
                         K_stride_h, K_stride_q, K_sc_stride, K_ps, K_psr, K_nenc, K_npages,
                         SPARSE, BN, FMT, ld_l)  # fmt: skip
            if (issued == 0) | (n_it < 2):  # block 1's page ids (else the loop's, carried)
                s1, h1, b1, t1 = _x_blk(1, n_it, lo, hi, b, t, n_nx, lo_n, hi_n, b_n, t_n, BN)
                key = g_keys(s1, h1, b1, t1, K_LUT, K_IDX, K_lut_stride, K_ps, K_idx_stride,
                             SPARSE, BN, row_l)  # fmt: skip
            lat_scale = t_q_store(q_lat_buf.index(0), q_rope_buf.index(0), qa, qr, FMT)
            for it in range(n_it):
                st = (gi + it) % 2
                if it + 2 < n_it:  # blocks it + 1 and it + 2 in this segment: the plain step
                    key_next = _g_issue_next(
                        key, lo + it * BN, hi, b, t, k_main, k_sc, k_rope, vbuf, 1 - st, K, K_SC,
                        K_LUT, K_IDX, K_lut_stride, K_idx_stride, K_stride, K_stride_h,
                        K_stride_q, K_sc_stride, K_ps, K_psr, K_nenc, K_npages, SPARSE, BN, FMT,
                        NBUF, ld_l, row_l, 4,
                    )  # fmt: skip
                else:  # the segment's last two blocks: the next segment's first ones ahead
                    s1, h1, b1, t1 = _x_blk(it + 1, n_it, lo, hi, b, t, n_nx, lo_n, hi_n, b_n,
                                            t_n, BN)  # fmt: skip
                    s2, h2, b2, t2 = _x_blk(it + 2, n_it, lo, hi, b, t, n_nx, lo_n, hi_n, b_n,
                                            t_n, BN)  # fmt: skip
                    key_next = g_keys(s2, h2, b2, t2, K_LUT, K_IDX, K_lut_stride, K_ps,
                                      K_idx_stride, SPARSE, BN, row_l)  # fmt: skip
                    _x_issue(key, s1, h1, k_main, k_sc, k_rope, vbuf, 1 - st, K, K_SC, K_stride,
                             K_stride_h, K_stride_q, K_sc_stride, K_ps, K_psr, K_nenc, K_npages,
                             SPARSE, BN, FMT, ld_l)  # fmt: skip
                key = key_next
                cp.wait_group(1)  # block it has landed
                fence_async_shared()
                gl.thread_barrier()
                # (an index the compiler cannot fold: `_t_tile`'s loop says why)
                zero = it // 2147483647
                acc, m_i, l_acc, tau = t_tile(
                    k_main.index(st), k_rope.index(st), k_sc.index(st), vbuf.index(st),
                    q_lat_buf.index(zero), q_rope_buf.index(zero), p_smem, lo + it * BN, kpos,
                    row_lim, acc, m_i, l_acc, tau, zero_s, lat_scale, qk_scale, FMT,
                    CAUSAL and not SPARSE, PF,
                )  # fmt: skip
                gl.thread_barrier()  # the stage and P may be overwritten from here on
            gi += n_it
            issued = ((n_it > 0) & (n_nx > 0)).to(gl.int32)
            l_i = gl.sum(l_acc, 0)
            if n_pieces > 1:  # partial rows slot * TPT + i
                t_store(acc, m_i, l_i, tau, t, hb, i0, q_len, slot * TPT - t, 1, OUT, stride_ot,
                        stride_oh, LSE, PO, PL, SINK, H_Q, HPT, TPT, D_V, HAS_SINK, True,
                        FMT)  # fmt: skip
            else:
                t_store(acc, m_i, l_i, tau, t, hb, i0, q_len, slot * TPT - t, 1, OUT, stride_ot,
                        stride_oh, LSE, PO, PL, SINK, H_Q, HPT, TPT, D_V, HAS_SINK, False,
                        FMT)  # fmt: skip
            gl.thread_barrier()  # q's buffers are the next segment's from here on
            if TRACE == 3:
                gl.store(trp + 14, g_clock())
            (ok, t, n_tok, lo, hi, slot, n_pieces, first, nxt, b, i0, q_len, cache_len,
             n_it) = _x_seg(
                stream, use_items, itm, p, nxt, begin, end, size, QOFF, batch, K_CL, K_TOPK,
                K_idx_len, TPT, BN, RUN_OVH, B_P2, RUN_P, CAUSAL, SPARSE, HAS_TOPK, TOPK_TOK,
            )  # fmt: skip
        cp.wait_group(0)

    @gluon.jit
    def _t_tile(
        q_args, out_args, k_args, t, hb, part, split, item, q_lat_buf, q_rope_buf, p_smem,
        k_rope, vbuf, k_main, k_sc, trp, H_Q: gl.constexpr, D_V: gl.constexpr,
        HPT: gl.constexpr, TPT: gl.constexpr, B_P2: gl.constexpr, CAUSAL: gl.constexpr,
        HAS_SINK: gl.constexpr, SPARSE: gl.constexpr, HAS_TOPK: gl.constexpr,
        TOPK_TOK: gl.constexpr, FMT: gl.constexpr, BN: gl.constexpr, NBUF: gl.constexpr,
        NR: gl.constexpr, PF: gl.constexpr, TRACE: gl.constexpr, SPLIT: gl.constexpr,
        ITEM: gl.constexpr,
    ):  # fmt: skip
        """One tile of `_mla_decode_sm90_t` (head block hb of the tile led by token t) over
        one key range. ITEM: `item` (lo, hi) of its keys (an item of the list or a run's
        segment); the output (sinks folded), or where `split` (run time) partials at rows
        part + t + i. Else partition `part` of NUM_P: the output, or where SPLIT partials at
        rows part * n_tokens + t + i."""
        Q, stride_qt, stride_qh, QOFF, batch, n_tokens = q_args
        OUT, stride_ot, stride_oh, LSE, PO, PL, SINK, qk_scale, NUM_P = out_args
        (K, K_SC, K_LUT, K_CL, K_IDX, K_TOPK, K_stride, K_stride_h, K_stride_q, K_sc_stride,
         K_lut_stride, K_ps, K_psr, K_nenc, K_npages, K_idx_stride, K_idx_len) = k_args  # fmt: skip
        ld_l: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
        one_l: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
        row_l: gl.constexpr = gl.SliceLayout(1, ld_l)
        b, live, i0, leader, q_len = g_request(QOFF, batch, t, TPT, B_P2, one_l)
        q_lat = q_lat_buf.index(0)
        q_rope = q_rope_buf.index(0)

        # q's loads are issued first and used after the ring fill, so that their latency
        # overlaps the dependent loads of the key range and the first tiles' page ids.
        qa, qr = t_q_load(Q, stride_qt, stride_qh, t, hb, i0, q_len, H_Q, HPT, TPT, NR, FMT, ld_l)

        cache_len, lo, hi = g_key_range(
            K_CL, K_TOPK, b, t, live, leader, i0, q_len, part, NUM_P, K_idx_len,
            SPARSE, HAS_TOPK, TOPK_TOK, CAUSAL, TPT, BN, item,
        )  # fmt: skip
        if TRACE == 3:
            gl.store(trp + 10, g_clock())

        row_lim, kpos, acc, m_i, l_acc, tau, zero_s = t_state(
            t, hb, i0, q_len, cache_len, H_Q, HPT, TPT, NR, BN
        )

        key = _g_ring_fill(
            lo, hi, b, t, k_main, k_sc, k_rope, vbuf, K, K_SC, K_LUT, K_IDX, K_lut_stride,
            K_idx_stride, K_stride, K_stride_h, K_stride_q, K_sc_stride, K_ps, K_psr, K_nenc,
            K_npages, SPARSE, BN, FMT, NBUF, ld_l, row_l, 4,
        )  # fmt: skip
        if TRACE == 3:
            gl.store(trp + 11, g_clock())

        lat_scale = t_q_store(q_lat, q_rope, qa, qr, FMT)

        n_it = gl.cdiv(gl.maximum(hi - lo, 0), BN)
        if TRACE:
            gl.store(trp + 1, g_clock())
            gl.store(trp + 7, n_it.to(gl.int64))
        for it in range(n_it):
            st = it % NBUF
            ist = (it + NBUF - 1) % NBUF
            start = lo + it * BN
            key = _g_issue_next(
                key, start, hi, b, t, k_main, k_sc, k_rope, vbuf, ist, K, K_SC, K_LUT, K_IDX,
                K_lut_stride, K_idx_stride, K_stride, K_stride_h, K_stride_q, K_sc_stride, K_ps,
                K_psr, K_nenc, K_npages, SPARSE, BN, FMT, NBUF, ld_l, row_l, 4,
            )  # fmt: skip
            cp.wait_group(NBUF - 1)  # tile it has landed
            fence_async_shared()
            gl.thread_barrier()
            if TRACE:
                if it == 0:
                    gl.store(trp + 2, g_clock())
            # An index the compiler cannot fold to 0: the wgmma descriptors of fixed buffers
            # would be hoisted out of the loop (64-bit values that spill with NR = 32).
            zero = it // 2147483647
            q_lat = q_lat_buf.index(zero)
            q_rope = q_rope_buf.index(zero)
            acc, m_i, l_acc, tau = t_tile(
                k_main.index(st), k_rope.index(st), k_sc.index(st), vbuf.index(st), q_lat, q_rope,
                p_smem, start, kpos, row_lim, acc, m_i, l_acc, tau, zero_s, lat_scale, qk_scale,
                FMT, CAUSAL and not SPARSE, PF,
            )  # fmt: skip
            gl.thread_barrier()  # the stage and P may be overwritten from here on
        cp.wait_group(0)
        if TRACE:
            gl.store(trp + 3, g_clock())

        l_i = gl.sum(l_acc, 0)
        if ITEM:  # partial rows part + t + i where the tile was split
            if split:
                t_store(acc, m_i, l_i, tau, t, hb, i0, q_len, part, 1, OUT, stride_ot, stride_oh,
                        LSE, PO, PL, SINK, H_Q, HPT, TPT, D_V, HAS_SINK, True, FMT)  # fmt: skip
            else:
                t_store(acc, m_i, l_i, tau, t, hb, i0, q_len, part, 1, OUT, stride_ot, stride_oh,
                        LSE, PO, PL, SINK, H_Q, HPT, TPT, D_V, HAS_SINK, False, FMT)  # fmt: skip
        else:
            t_store(acc, m_i, l_i, tau, t, hb, i0, q_len, part, n_tokens, OUT, stride_ot,
                    stride_oh, LSE, PO, PL, SINK, H_Q, HPT, TPT, D_V, HAS_SINK, SPLIT,
                    FMT)  # fmt: skip

else:  # Triton without Gluon: the sm_90 paths are never taken (`triton_mla._use_sm90_path`)
    _mla_decode_sm90 = _mla_decode_sm90_t = None
