"""Gluon (sm_90) warp-specialized keys-as-M MLA decode for rope-aware FP8 caches and few query
rows (h_q <= 16): the memory-bound decode of DeepSeek-style models at small head counts.

Same contract, arguments and grid as `gluon_mla._mla_decode_sm90_t` (whose tile step
`_t_tile` and epilogue `_t_store` it runs), laid out so that one CTA a SM keeps NBUF 40 KB
tiles (3; 4 on an H200: `triton_mla._sm90_t_config`) in a ring while two warpgroups compute:

- the CTA's own warps issue tile 0 right after its page ids arrive, before q's store and
  the partitions' start (PRE = 1); a producer warpgroup gathers the rest, BN = 64 keys a
  tile (any page size, sparse indices), with cp.async into the ring, each stage's arrivals
  on its `ready` barrier. H100 trace (2026-11-22, s_k 4096): tile 0 issued 2.4 us after the
  CTA's start with PRE 1, 3.6-4.0 with PRE 0; graph replays 124 / 125 / 125 / 127 us with
  PRE 1 / 0 / 2 / 3 (more tiles issued at once delay the first one's arrival);
- two consumer warpgroups own alternate tiles (warpgroup w: tiles w, w + 2, ...), each with
  its own softmax state and O^T [512, NR] accumulator (P and the keys' SPEC flags go into the
  warpgroup's own buffers; without SPEC, P goes into the tile's rope rows, free once S is
  done), and free a stage on its `empty` barrier once its tile is done;
- at the end warpgroup 0 leaves its state (O in float32 through the ring stage of its last
  tile, which nothing reads any more) and warpgroup 1, whose last tile lands last, merges
  and stores it.

So a request's keys need no second CTA and no combine pass at batch >= the SM count, where
`_mla_decode_sm90_t` ran two CTAs a SM (P = 2) with one tile in flight each.

What is left at s_k 4096 (H100, 2026-11-22) is the spread of the CTAs' ends (median 118.5,
last 121.6 us; per-SM end times correlate 0.35-0.49 between runs, bf16's `_t` 0.97), not the
prologue: loading the cache length and tile 0's page ids for a guessed request (token t //
the tokens a request) before the offsets' reductions made this prologue 0.5 us longer and
`_t`'s 1.3 us shorter, and neither kernel's graph replays faster (123.7 / 123.5 us FP8,
208.0 / 208.6 bf16); it was not kept.

Tried and dropped (H100 2026-11-22, `bench/gpu_mla_dev.py` graph replays, s_k 4096, from HBM /
with every request reading request 0's pages, L2-resident; this kernel 123 / 91 us): e4m3
upcasts on integer ops (a PRMT, a LOP3 and a shift a pair, 2^-8 folded into S's and P's
scales; beside F2FP) for V, K or both: 134 / 115, 133 / 123, 180 / 147 us; three consumer
warpgroups (tiles j % 3, 160 registers each, some spills; 4 stages): 156 / 122, 148 / 108
without `_t_tile` PF, 249 / 152 with 5 stages. The consumers are not bound by F2FP's rate, and
a third warpgroup costs more than it hides. Nor do the S products wait on their accumulator
chain (36 dependent m64n16k16 steps): the rope product on its own accumulator issued first, and
the latent chunks alternating between two accumulators (`_t_tile` variants, H100 2026-11-22,
graph replays, s_k 4096 from HBM / L2-resident): 123.3 / 91.2 and 123.5 / 91.6 us against
122.8 / 90.4; s_k 8192 233.2 against 232.9 (bf16 `_t` 208.6 against 207.9).

Where a warp's time goes (Nsight Compute warp-state samples by SASS instruction, H100
2026-11-22, `bench/ncu_sass_hot.py`, s_k 4096): from HBM, 23% of all samples sit in the two
consumers' `ready` waits and 14% in the producer's `empty` wait (a consumer warp waits for
its tile about a third of the time: the kernel streams, it does not compute); with every
request's keys in L2 no consumer instruction holds more than 2% of all samples (issue slots
busy ~55% of cycles). Stealing a slow CTA's last tiles cannot pay for itself: a model
of the traced timeline (a thief starts 2-4 us after it claims, runs 1.5 us a tile, and the
owner merges its state in ~1 us) ends the last CTA 0-1 us earlier at best. Nor can the CTAs pace
one another (H100 2026-11-23, record `bench/results/h100_2026-11-23_mla_fp8_pace.json`): with a
device-wide counter of tiles issued (one thread's relaxed atomic add a tile, read back by an L2
load), a CTA more than one tile ahead of the running CTAs' share waited for an earlier tile's
consumer. Its CTAs' ends drew closer (first to last 6.6-7.7 -> 4.5-6.6 us), but every variant
streamed slower, even one that never waits: 1.72 -> 1.92 us a tile (130.5-131.3 us against
122.8-123.9) with the counter touched every tile, 1.85 (127.1-130.2 us) every fourth. Loading
the page ids two tiles ahead instead of one changed nothing (122.9 against 122.9 us).

The CTAs that end last stream slowest all along (H100 2026-11-23, record
`bench/results/h100_2026-11-23_mla_fp8_tail.json`, s_k 4096): a CTA's end correlates 0.97-0.98
with its tile rate (the slowest 1.78-1.79 us a tile against a median of 1.72-1.73) and not with
its start (-0.14 to -0.29) or its first tile. The rate repeats between runs only for the same SM
reading the same pages (correlation 0.33-0.44); the same SM with other pages, or the same pages
on another SM, gives -0.18 to 0.22 (`gpu_mla_dev.roll_summary`). So no fixed assignment of
requests to SMs evens the ends out. An L2 prefetch of each CTA's last tiles (with tile n_t - N
the producer prefetched the rows and scales of tiles n_t - N + 3 .. n_t - 1) slowed the tail
instead: 123.0 / 124.8 / 131.0 us at N 4 / 8 / 16 against 123.0 (s_k 8192 233.9 / 236.0 /
241.6 against 233.9).

Nor does a shorter start, although the start is on the critical path (H100 2026-11-23, record
`bench/results/h100_2026-11-23_mla_fp8_start.json`, graph replays, s_k 4096): every CTA
spinning 2 / 4 us first made the kernel 2.0 / 3.6-3.9 us slower. Tile 0's copies leave 2.1-2.3
us after the CTA's start, 1.0-1.3 us after its key range is known: the fence after the
barriers' init is a MEMBAR (sm_90 SASS of `fence.proxy.async`), which waits for q's loads in
flight. Loading request t's cache length and first page id beside the offsets (a checked
guess, for one token a request), the barriers' init before any load and no fence in the
producer's release ran 122.74 us against 122.99 in the same run; with q's loads after tile 0's
copies these left at 1.34 us, but both partitions then start after q's loads, which queue
behind every CTA's first tile (123.85 us). Splitting requests in two with staggered cut points
(P = 2, the larger second pieces launched first, split kernel alone) ran 126.9-129.2 us
against 122.7 at P = 1: each piece pays a prologue, first tile and epilogue on its SM, and the
last pieces start at 114-121 us.

DRAM bounds it, not its SMs (H100 2026-11-22, `bench/mla_batch_probe.py`, graph replays, s_k
4096): b 120 / 124 / 128 / 132 take 118.0 / 120.8 / 123.1 / 128.3 us, so the four SMs a b 128
launch leaves idle would add nothing. Added keys stream at 3.05 TB/s against bf16's 3.09 on
the same ~12.5 us of fixed time; ~1% of the stream is the per-token scale reads (256 bytes a
tile from the scale buffer, away from the tile's 40 KB): with all of them from one
L2-resident address the kernel takes 122.9 / 233.3 us against 124.0 / 235.1 (s_k 4096 /
8192). Prefetching a tile's scale lines into L2 one or two tiles ahead (prefetch.global.L2
after each issue) made it slower: 125.8 / 125.5 us at s_k 4096, 236.8 / 236.0 at 8192; issuing
a tile's scale copy before its 40 KB changed nothing (another lease: 68.6 / 125.0 / 236.2 us
at s_k 2048 / 4096 / 8192 against 69.3 / 124.5 / 236.6).

Against a reader of the same pages (H100 2026-11-22, `bench/mla_read_floor.py`, record
`bench/results/h100_2026-11-22_mla_read_floor.json`; a Triton kernel XORs every word of a
request's pages and scales, four CTAs a request): 124.6 / 235.3 us against 114.6 / 224.5 at s_k
4096 / 8192 (bf16: 207.9 / 404.7 against 201.3 / 398.0). The added keys stream at the reader's
rate (3.05 against 3.07 TB/s); the fixed time is 13.9 us against its 4.7 (bf16 11.1). One CTA a
request reads slower than this kernel (131.7 us, two pages a step). Consumers made faster for
timing (wrong values; L2-resident 90.6 -> 65.2 us without the P V products, 79.7 with half the
latent S chunks) gain 1.6 / 0.9 us from HBM (122.5 / 123.2 against 124.1), so the consumers'
speed is not what is left either. Trace of the same day: prologue 2.1-2.4 us, first tile 2.1-2.3
us later, 1.72 us a tile, 1.4 us epilogue, CTA ends 113.9-115.5 (first) / 117.5-118.2
(median) / 121.5-122.6 (last) us.

On an H200 (4.8 TB/s against the H100's 3.35, the same SMs) the consumers bound it, not memory
(2026-11-28, `bench/gpu_mla_dev.py --shared L2`, graph replays, b 128 h_q 16 page 64): s_k 4096
0.103 ms from HBM against 0.092 with every request's keys in L2, s_k 8192 0.200 against 0.177;
bf16's `_mla_decode_sm90_t` 0.141 / 0.273, so the suite gave 1.42x / 1.44x bf16 there
(`bench/results/h200_2026-11-28_08e609e.json`). The e4m3 upcasts do not bound them, although a
consumer converts each byte of its tile twice (K for S, V for P V): with every upcast swapped for
one PRMT a byte pair (wrong values, the same instruction count off the conversion unit) the
kernel took 0.0938 ms in L2 against 0.0924 (record `bench/results/h200_2026-11-28_mla_fp8_cvt.json`,
`bench/mla_fp8_cvt_probe.py`), so converting once would not pay for moving the tile between warps.
Fewer instructions in the P V step did pay: V's bytes interleaved before the upcast
(`_g_deq_v`; 64 fewer PRMT a tile and warp) took s_k 4096 to 0.1036 / 0.0898 ms (HBM / L2) from
0.1061 / 0.0931, 8192 to 0.2038 / 0.1719 from 0.2088 / 0.1784, and the suite to 1.45x / 1.47x
bf16. In the same record: consumer 1's loop count made warp-uniform (a REDUX), which moved its
wgmma descriptors to uniform registers (its tile step 1120 -> 971 sm_90 SASS instructions, 144
R2UR fewer), changed nothing (0.1035 / 0.0903 ms without it against 0.1036-0.1037 / 0.0898-0.0904
with), and ring stages 2 / 3 / 4 / 5 took 0.113 / 0.104 / 0.103 / 0.104 ms (s_k 4096, HBM;
8192: 0.220 / 0.203 / 0.203 / 0.202), so three stay.

Where the consumers' time goes on the H200 (Nsight Compute, L2-resident s_k 4096, one launch,
record `bench/results/h200_2026-11-28_mla_fp8_ncu.json`): issue slots busy 53% of cycles, the
tensor pipe 22%, ALU 42%, FMA 13%. Each consumer's tile loop holds 31% of the warp samples, the
producer's 30% (a quarter of them polling `empty`). A consumer warp issues or is ready to in a
third of its samples (selected 20%, not selected 13%) and waits on fixed-latency dependencies
(21%), shared-memory and shuffle results (11%) and its warpgroup barriers (6%); the F2FP upcasts
hold 26% of its samples (pipe throttle 14% of those), HGMMA 7%, the wgmma waits 6%. No single
unit is saturated: the consumers are bound by the latency of their instruction chains, with
three warps a scheduler (two consumers' and the producer's). Of the changes measured, 64 PRMT
fewer in the P V step's upcasts paid (the V interleave); 144 R2UR fewer for the wgmma
descriptors did not (the uniform loop count), and neither did one barrier fewer: the tile's
column maxima with one warpgroup barrier instead of Triton's two (each warp's maxima stored,
every thread reading and reducing the 4 warps' for its columns) took 0.0961 ms in L2 against
0.0897, 0.1087 from HBM against 0.1062 (same record, lease 3).

The producer is on the critical path too (H200 2026-11-28, `bench/gpu_mla_dev.py` graph replays,
b 128 h_q 16 page 64, record `bench/results/h200_2026-11-28_mla_fp8_producer.json`): a
power-of-two page size as a compile-time constant (PS_C: shifts for the page split, not a
run-time division a row) and int32 rows with one int64 byte offset a row for the e4m3 bytes and
the rope part (ADDR) take its tile loop from 330 to 206 sm_90 instructions, and the kernel from
0.0996 / 0.1932 ms to 0.0954 / 0.1861 (s_k 4096 / 8192 from HBM), from 0.0897 / 0.1720 to
0.0848 / 0.1624 in L2; each alone gives about half (s_k 4096, HBM / L2: PS_C 0.0975 / 0.0871,
ADDR 0.0972 / 0.0873). With both, the suite gave 1.51x / 1.55x bf16
(`bench/results/h200_2026-11-28_37f8270.json`).
Measured and not kept (record `bench/results/h200_2026-11-28_mla_fp8_xt.json`): cross-tile
consumers, each issuing its tile i's S beside its tile i - 1's P V (two S chunks a P V chunk;
independent accumulators, each chain's upcasts beside the other's), then tile i's softmax, took
0.1011 / 0.0896 ms at 5 stages against 0.1011 / 0.0898 (s_k 4096, HBM / L2), 0.1127 / 0.0972
at 4 and 0.185 / 0.151 at 3 (each consumer then holds two stages). Their loop body had to peel
the first S and the last P V: a branch on whether a P V runs made ptxas serialize every wgmma
of the kernel ("insufficient register resources" at any register split). Nor did the producer's
release without its proxy fence (a MEMBAR.ALL.CTA) change anything (0.1067 / 0.0893 against
0.1064 / 0.0903), and every request reading its own 4 pages (L2-resident, no two CTAs on one
line) took the 0.0898 ms of every request reading request 0's, so the L2 case is not an L2 hot
spot. A stream of m64n16k16 wgmma with A in registers (`bench/wgmma_probe.py`, record
`bench/results/h200_2026-11-28_wgmma_probe.json`) issues at 13 cycles a step for one warpgroup
and 26 each for two (n32 16, n64 32, n128 64; independent accumulators do not overlap; waiting
for each 4-step group costs 23 a step): a tile's 68 steps take ~880 of the ~2600 cycles a tile
takes in L2, so the tensor cores do not bound it either.

The softmax (H200 2026-11-28, graph replays as above, record
`bench/results/h200_2026-11-28_mla_fp8_fold.json`): one cross-warp reduction a tile, of s +
log2(scale) (FOLD, `gluon_mla._t_tile`; the scale folded into P, no largest-scale rescale and no
division an element) against the pair (max, largest scale) took s_k 8192 / 4096 from 0.186 /
0.097 ms to 0.184 / 0.096 from HBM and from 0.162 / 0.085 to 0.157 / 0.082 in L2; the suite
gave 1.54x / 1.57x bf16 (`bench/results/h200_2026-11-28_e35ba0e.json`). Two timing experiments
with wrong results bound what is left there: with no reduction and no rescale (the reference
max fixed) the kernel took 0.168 / 0.088 from HBM and 0.135 / 0.071 in L2, 10-18% less; with
the reduction issued after the tile's first P V wgmma (its max used from the next tile on, the
rescale kept) it took FOLD's times. So the reduction's wait is not what costs (as one barrier
fewer above showed) but the work on the chain between S and P V. Of that work (H200 2026-11-28,
same graph replays, record `bench/results/h200_2026-11-28_mla_fp8_softmax_variants.json`): P as
the row sums' term 2^(s - m) times the scale, instead of a second exp2 of s + log2(scale) - m (8
MUFU and 8 FADD fewer a tile and thread), took s_k 8192 from 0.193 to 0.191 ms from HBM and
0.157 to 0.156 in L2 (4096: 0.100 -> 0.099, 0.083 -> 0.082) and is the default; the suite gave
1.57x / 1.58x bf16 (`bench/results/h200_2026-11-28_a368133.json`). Skipping O's and the row
sums' rescale on tiles where no column's max moved (a warp-uniform flag, 2 shuffles) gained
nothing (0.193 / 0.159 / 0.100 / 0.084), nor did moving a column's reference only when its max
passed it by 2^8 (0.192 / 0.158 / 0.101 / 0.083). The integer upcasts of half the keys, tried
again here beside F2FP (PRMT with each byte's sign replicated into its float16's high byte, a
shift and a mask: the value times 2^-8, that half's S rows and P columns times 2^8), were
slower, as on the H100: 0.207 / 0.187 / 0.107 / 0.099 ms for 227 more instructions a tile.
What did pay is the tile without its reduction (`_t_tile` SPEC, the default; H200 2026-11-28,
record `bench/results/h200_2026-11-28_mla_fp8_spec.json`): the reference max stays until some
key's s + log2(scale) passes it by more than 2^8, each key's flag goes beside P into the
consumer's own buffers (4 KB, away from the stage, whose rope rows cost a barrier after the S
products) and is read after P's barrier, and only a flagged tile reduces, rescales and writes P
again: one barrier on the way to P V instead of three, the tile step about 780 sm_90
instructions against 906. s_k 8192 0.193 -> 0.185 ms from HBM, 0.156 -> 0.144 in L2 (4096: 0.099
-> 0.095, 0.082 -> 0.076); the suite gave 1.61x / 1.65x bf16
(`bench/results/h200_2026-11-28_cb19c9a.json`).
Measured and not kept (record `bench/results/h200_2026-11-28_mla_fp8_tw_variants.json`): the
producer as the default partition (both consumers workers, so consumer 0 builds its wgmma
descriptors in uniform registers too: 1119 -> 942 instructions a tile) gained 0-1% and leaves
the producer 40 registers, which spills in the sparse kernel; `gl.assume` on the producer's
tile start (206 -> 191 instructions) changed nothing; the TMA-fed producer (branch
`dev/tw-tma`: dense tiles as a [4, 64, 128] e4m3 box and a [64, 64] rope box) was no faster
(s_k 8192 0.1936 against 0.1926 ms from HBM, 0.1669 against 0.1633 in L2) and faulted with
"unspecified launch failure" in `bench/gpu_mla_dev.py` runs while passing its GPU tests, a
bit-identical probe and compute-sanitizer (cause not found).

Under sustained load the H200 is bound by its 700 W board limit, not by this kernel's memory
stream (2026-11-28, `bench/mla_power_probe.py`, record
`bench/results/h200_2026-11-28_mla_fp8_power.json`): the driver lowers the SM clock ("SW power
cap") to 1.54-1.70 GHz at s_k 8192 from HBM, and the kernel takes the same SM cycles a launch
from HBM as from L2 (0.297 / 0.286 M), so it runs 0.175-0.193 ms sustained against 0.161-0.165
after an idle second (1.52x / 1.69x bf16, which streams at the copy bandwidth at any of these
clocks). Per-CTA traces show no tail to balance (CTAs end within 2.5%). Fewer cycles buy less
than their share there: SPEC's 7.8% fewer took 2.6% off the board's energy a launch (keys in
L2) and 3.9% off the sustained time. Four ring stages on an H200 (`triton_mla._sm90_t_config`):
s_k 8192 0.158 against 0.161 ms after an idle second, 0.174 against 0.176 sustained
(alternated runs, same record).

Not taken (2026-11-28, `bench/mla_fp8_mma_model.py`, a CPU model): the latent S product as an
e4m3 x e4m3 wgmma from the stage (no K upcasts; q split exactly into e4m3 hi + lo / 16). With
the 13 truncated fraction bits reported for Hopper's FP8 accumulator the model moves the LSE
by 0.003-0.0045 on the tests' inputs and 0.03-0.04 on the rising-scores test's (bound 2e-3)."""

from __future__ import annotations

from ...gluon_imports import HAS_GLUON, fence_async_shared, gl, gluon, mbarrier

if HAS_GLUON:
    from .gluon_mla import (
        _g_clock,
        _g_issue_lat,
        _g_issue_main,
        _g_issue_rope,
        _g_issue_scales,
        _g_key_range,
        _g_keys,
        _g_program,
        _g_request,
        _g_rows,
        _g_trace_close,
        _g_trace_open,
        _t_q_load,
        _t_q_store,
        _t_raw_layout,
        _t_state,
        _t_store,
        _t_tile,
    )
    from .gluon_mla_ss import _ss_release

    @gluon.jit
    def _tw_n_pairs(lo, hi, BN: gl.constexpr):
        """The key range's tile pairs: the consumers take turns, so the tile count is rounded
        up to even (a last odd tile is all masked) and consumer 1 owns the last tile."""
        return gl.cdiv(gl.cdiv(gl.maximum(hi - lo, 0), BN), 2)

    @gluon.jit
    def _tw_issue(k_main, k_sc, k_rope, vbuf, ready, st, rows, valid, K, K_SC, K_stride,
                  K_stride_h, K_stride_q, K_sc_stride, FMT: gl.constexpr,
                  ld_l: gl.constexpr, ADDR: gl.constexpr):  # fmt: skip
        """cp.async a tile's rows (`_g_rows`) into stage st: dims 0..511 and scales, the rope
        dims; then its validity and the ready arrivals (`_ss_release`). Four warps. ADDR: row
        numbers in int32 (the launcher checks that they fit) and one int64 byte offset a row
        for both the e4m3 bytes and the rope part."""
        if ADDR:  # (in the order measured: e4m3 bytes, rope part, scales)
            rows = rows.to(gl.int32).to(gl.int64)
            roff = gl.multiple_of(rows * K_stride, 16)  # bytes
            _g_issue_lat(k_main, st, rows, valid, K, K_stride, FMT, ld_l, 4, roff)
            _g_issue_rope(k_rope.index(st), rows, valid, K, K_stride, K_stride_h, FMT, ld_l,
                          roff >> 1)  # fmt: skip
            _g_issue_scales(k_sc, st, rows, valid, K, K_SC, K_stride_q, K_sc_stride, FMT, 4)
        else:
            _g_issue_main(k_main, k_sc, st, rows, valid, K, K_SC, K_stride, K_stride_q,
                          K_sc_stride, FMT, ld_l, 4)  # fmt: skip
            _g_issue_rope(k_rope.index(st), rows, valid, K, K_stride, K_stride_h, FMT, ld_l)
        _ss_release(ready, st, vbuf, valid)

    @gluon.jit
    def _tw_producer(args, SPARSE: gl.constexpr, BN: gl.constexpr, FMT: gl.constexpr,
                     NBUF: gl.constexpr, PRE: gl.constexpr, PS_C: gl.constexpr,
                     ADDR: gl.constexpr, TRACE: gl.constexpr):  # fmt: skip
        """Four warps: tiles min(PRE, n_t) .. n_t - 1 (n_t = 2 `_tw_n_pairs`; the first PRE
        were issued before the partitions started) into stage j % NBUF once its previous
        tile's consumer has freed it; the key (look-up-table or index) load of tile j + 1 is
        issued before tile j is filled."""
        (OUT, stride_ot, stride_oh, LSE, PO, PL, SINK, qk_scale, n_tokens,
         K, K_SC, K_LUT, K_IDX, K_stride, K_stride_h, K_stride_q, K_sc_stride, K_lut_stride,
         K_ps, K_psr, K_nenc, K_npages, K_idx_stride,
         t, hb, b, i0, q_len, part, cache_len, lo, hi, lat_scale, trp,
         q_lat, q_rope, k_main, k_sc, k_rope, vbuf, x_buf, bars) = args  # fmt: skip
        ready, empty, xb = bars
        K_ps = PS_C if PS_C else K_ps  # a power-of-two page size: shifts, not divisions
        ld_l: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
        row_l: gl.constexpr = gl.SliceLayout(1, ld_l)
        n_t = _tw_n_pairs(lo, hi, BN) * 2
        j0 = gl.minimum(n_t, PRE)
        key = _g_keys(lo + j0 * BN, hi, b, t, K_LUT, K_IDX, K_lut_stride, K_ps, K_idx_stride,
                      SPARSE, BN, row_l)  # fmt: skip
        for j in range(j0, n_t):
            st = j % NBUF
            start = lo + j * BN
            key_next = _g_keys(start + BN, hi, b, t, K_LUT, K_IDX, K_lut_stride, K_ps,
                               K_idx_stride, SPARSE, BN, row_l)  # fmt: skip
            rows, valid = _g_rows(start, hi, key, K_ps, K_psr, K_nenc, K_npages, SPARSE, BN,
                                  row_l)  # fmt: skip
            mbarrier.wait(empty.index(st), ((j // NBUF) & 1) ^ 1)  # fresh barriers pass phase 1
            _tw_issue(k_main, k_sc, k_rope, vbuf, ready, st, rows, valid, K, K_SC, K_stride,
                      K_stride_h, K_stride_q, K_sc_stride, FMT, ld_l, ADDR)  # fmt: skip
            key = key_next
            if TRACE:
                if j == 0:
                    gl.store(trp + 1, _g_clock())
        if TRACE:
            gl.store(trp + 5, _g_clock())
            gl.store(trp + 7, n_t.to(gl.int64))

    @gluon.jit
    def _tw_consume(args, W: gl.constexpr, H_Q: gl.constexpr, HPT: gl.constexpr,
                    TPT: gl.constexpr, CAUSAL: gl.constexpr, HAS_SINK: gl.constexpr,
                    SPLIT: gl.constexpr, SPARSE: gl.constexpr, D_V: gl.constexpr,
                    BN: gl.constexpr, FMT: gl.constexpr, NBUF: gl.constexpr,
                    NR: gl.constexpr, PF: gl.constexpr, FOLD: gl.constexpr,
                    TRACE: gl.constexpr, SPEC: gl.constexpr = False):  # fmt: skip
        """Consumer warpgroup W: tiles W, W + 2, ... of the key range; warpgroup 0 hands its
        state to warpgroup 1 (whose last tile lands last), which merges and stores the output
        (and the LSE)."""
        (OUT, stride_ot, stride_oh, LSE, PO, PL, SINK, qk_scale, n_tokens,
         K, K_SC, K_LUT, K_IDX, K_stride, K_stride_h, K_stride_q, K_sc_stride, K_lut_stride,
         K_ps, K_psr, K_nenc, K_npages, K_idx_stride,
         t, hb, b, i0, q_len, part, cache_len, lo, hi, lat_scale, trp,
         q_lat_buf, q_rope_buf, k_main, k_sc, k_rope, vbuf, x_buf, bars, p_buf,
         f_buf) = args  # fmt: skip
        ready, empty, xb = bars
        mma_l: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, NR, 16]
        )
        col_l: gl.constexpr = gl.SliceLayout(0, mma_l)  # per query row (columns)
        x_l: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=64, element_bitwidth=32, rank=2)
        sm_l: gl.constexpr = gl.NVMMASharedLayout(
            swizzle_byte_width=128, element_bitwidth=16, rank=2
        )

        row_lim, kpos, acc, m_i, l_acc, tau, zero_s = _t_state(
            t, hb, i0, q_len, cache_len, H_Q, HPT, TPT, NR, BN
        )

        n_own = _tw_n_pairs(lo, hi, BN)
        for i in range(n_own):
            j = 2 * i + W
            st = j % NBUF
            mbarrier.wait(ready.index(st), (j // NBUF) & 1)
            if TRACE and W == 0:
                if i == 0:
                    gl.store(trp + 2, _g_clock())
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
            # full tile step there sat on the CTA's critical path, after its last keys; H100
            # trace 2026-11-22, s_k 4096 + 1: last loop to store 2.4 -> 1.5 us)
            if lo + j * BN < hi:
                acc, m_i, l_acc, tau = _t_tile(
                    k_main.index(st), kr, k_sc.index(st), vbuf.index(st),
                    q_lat_buf.index(zero), q_rope_buf.index(zero), p_smem, lo + j * BN, kpos,
                    row_lim, acc, m_i, l_acc, tau, zero_s, lat_scale, qk_scale, FMT,
                    CAUSAL and not SPARSE, PF, FOLD, SPEC, f_smem=f_smem,
                )  # fmt: skip
            gl.thread_barrier()  # every thread is done with the stage
            mbarrier.arrive(empty.index(st), count=1)

        if TRACE and W == 0:
            gl.store(trp + 3, _g_clock())
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
            _t_store(
                acc, m, l_i * a_own + l_x * a_x, gl.full([NR], 1.0, gl.float32, col_l), t, hb, i0,
                q_len, part, n_tokens, OUT, stride_ot, stride_oh, LSE, PO, PL, SINK, H_Q, HPT,
                TPT, D_V, HAS_SINK, SPLIT, FMT,
            )  # fmt: skip
            if TRACE:
                gl.thread_barrier()
                _g_trace_close(trp)

    @gluon.jit
    def _mla_decode_sm90_tw(
        Q, stride_qt, stride_qh, QOFF, batch, n_tokens,
        OUT, stride_ot, stride_oh, LSE, PO, PL, SINK, qk_scale, NUM_P,
        K, K_SC, K_LUT, K_CL, K_IDX, K_TOPK, K_stride, K_stride_h, K_stride_q, K_sc_stride,
        K_lut_stride, K_ps, K_psr, K_nenc, K_npages, K_idx_stride, K_idx_len,
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
    ):  # fmt: skip
        """See the module docstring. Rope-aware FP8 cache, d_qk 576, BN 64, NR 16. Launch with
        num_warps=4 (consumer 0); consumer 1 and the producer are worker partitions. PS_C: the
        page size if a power of two, else 0 (run-time K_ps); ADDR: `_tw_issue`'s; FOLD: `_t_tile`'s
        (the softmax's one reduction a tile); SPEC (with FOLD): `_t_tile`'s (that reduction
        only on tiles with a key past the reference max by 2^8; 4 KB more shared memory).

        TRACE (development, `bench/gpu_mla_dev.py --trace`): int64 TR [CTAs, 10] gets the
        globaltimer at the CTA's start (slot 0), when the producer has issued its first tile
        (1), when consumer 0's first tile has landed (2), after its loop (3), after consumer
        1's store (4) and when the producer has issued its last tile (5), the SM (6), the
        tile count (7) and the SM's cycle counter at the start and end (8, 9)."""
        gl.static_assert(FMT == 3, "rope-aware FP8 caches")
        gl.static_assert(D_QK == 576, "d_qk 576")
        gl.static_assert(BN == 64, "64 keys a tile")
        ld_l: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
        one_l: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
        row_l: gl.constexpr = gl.SliceLayout(1, ld_l)
        sm_l: gl.constexpr = gl.NVMMASharedLayout(
            swizzle_byte_width=128, element_bitwidth=16, rank=2
        )
        raw_l: gl.constexpr = _t_raw_layout(KSWZ)
        v1_l: gl.constexpr = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[0])
        bar_l: gl.constexpr = mbarrier.MBarrierLayout()

        t, hb, part = _g_program(NHB, PDL)
        trp = part  # a placeholder (warp_specialize arguments cannot be None)
        if TRACE:
            trp = _g_trace_open(TR)
        b, live, i0, leader, q_len = _g_request(QOFF, batch, t, TPT, B_P2, one_l)
        # q's loads are issued before the dependent loads of the key range
        qa, qr = _t_q_load(Q, stride_qt, stride_qh, t, hb, i0, q_len, H_Q, HPT, TPT, NR, FMT, ld_l)
        cache_len, lo, hi = _g_key_range(
            K_CL, K_TOPK, b, t, live, leader, i0, q_len, part, NUM_P, K_idx_len,
            SPARSE, HAS_TOPK, TOPK_TOK, CAUSAL, TPT, BN,
        )  # fmt: skip

        q_lat = gl.allocate_shared_memory(gl.float16, [1, NR, 512], sm_l)
        q_rope = gl.allocate_shared_memory(gl.bfloat16, [1, NR, 64], sm_l)
        k_main = gl.allocate_shared_memory(gl.float8e4nv, [NBUF, BN, 512], raw_l)
        k_rope = gl.allocate_shared_memory(gl.bfloat16, [NBUF, BN, 64], sm_l)
        k_sc = gl.allocate_shared_memory(gl.float32, [NBUF, BN], v1_l)
        vbuf = gl.allocate_shared_memory(gl.int32, [NBUF, BN], v1_l)
        x_buf = gl.allocate_shared_memory(gl.float32, [2, NR], v1_l)
        if SPEC:  # each consumer's own P^T and key flags (`_t_tile` SPEC)
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
            key = _g_keys(lo, hi, b, t, K_LUT, K_IDX, K_lut_stride, ps, K_idx_stride, SPARSE,
                          BN, row_l)  # fmt: skip
            for j in gl.static_range(PRE):
                start = lo + j * BN
                if j + 1 < PRE:
                    key_next = _g_keys(start + BN, hi, b, t, K_LUT, K_IDX, K_lut_stride, ps,
                                       K_idx_stride, SPARSE, BN, row_l)  # fmt: skip
                if j < n_t:
                    rows, valid = _g_rows(start, hi, key, ps, K_psr, K_nenc, K_npages, SPARSE,
                                          BN, row_l)  # fmt: skip
                    _tw_issue(k_main, k_sc, k_rope, vbuf, ready, j, rows, valid, K, K_SC,
                              K_stride, K_stride_h, K_stride_q, K_sc_stride, FMT, ld_l,
                              ADDR)  # fmt: skip
                    if TRACE:
                        if j == 0:
                            gl.store(trp + 1, _g_clock())
                if j + 1 < PRE:
                    key = key_next
        lat_scale = _t_q_store(q_lat.index(0), q_rope.index(0), qa, qr, FMT)
        fence_async_shared()  # q before the consumers' wgmma reads
        gl.thread_barrier()

        args = (
            OUT, stride_ot, stride_oh, LSE, PO, PL, SINK, qk_scale, n_tokens,
            K, K_SC, K_LUT, K_IDX, K_stride, K_stride_h, K_stride_q, K_sc_stride, K_lut_stride,
            K_ps, K_psr, K_nenc, K_npages, K_idx_stride,
            t, hb, b, i0, q_len, part, cache_len, lo, hi, lat_scale, trp,
            q_lat, q_rope, k_main, k_sc, k_rope, vbuf, x_buf, (ready, empty, xb), p_buf, f_buf,
        )  # fmt: skip
        # fmt: off
        gl.warp_specialize(
            [
                (_tw_consume, (args, 0, H_Q, HPT, TPT, CAUSAL, HAS_SINK, SPLIT, SPARSE, D_V, BN,
                               FMT, NBUF, NR, PF, FOLD, TRACE, SPEC)),
                (_tw_consume, (args, 1, H_Q, HPT, TPT, CAUSAL, HAS_SINK, SPLIT, SPARSE, D_V, BN,
                               FMT, NBUF, NR, PF, FOLD, TRACE, SPEC)),
                (_tw_producer, (args, SPARSE, BN, FMT, NBUF, PRE, PS_C, ADDR, TRACE)),
            ],
            [4, 4],
            [CONSUMER_REGS, PRODUCER_REGS],
        )
        # fmt: on

else:  # Triton without Gluon: never launched (`triton_mla._use_sm90_path`)
    _mla_decode_sm90_tw = None
