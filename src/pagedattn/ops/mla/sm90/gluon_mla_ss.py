"""Gluon (sm_90) warp-specialized "seesaw" MLA decode for 64-row tiles, BF16 and V32 caches.

Same contract, arguments and grid as `gluon_mla._mla_decode_sm90` (64 query rows: heads of one
token, or of up to 64 // h_q tokens; one key partition a program), laid out so that the tensor
cores are busy while a warpgroup does its softmax:

- a producer warpgroup gathers BN = 64 keys a tile (any page size, sparse indices) with
  cp.async into a 2-stage ring (Q takes 72 KB and a stage 72 KB of the 227 KB);
- two consumer warpgroups own alternate tiles: warpgroup w computes S = Q K^T for tiles
  j = w, w + 2, ... (an m64n64k16 wgmma chain, twice the N of the key-split kernel, so the
  operand reads per FLOP halve), its softmax against the running max left by the other
  warpgroup's previous tile, and writes P (bf16) into the tile's rope slot (free once S is
  done) and its row max into shared memory;
- O [64, 512] is split by columns: warpgroup w keeps columns [256 w, 256 w + 256) and adds
  P_j V_j for every tile, its own P from registers and the other's from shared memory, after
  rescaling O to that tile's running max.
- In a pair of tiles (2 i, 2 i + 1) warpgroup 1 computes its S first, under warpgroup 0's
  softmax (S needs no running max), then (SS_ORDER 2, BF16) its softmax, so that its P is out
  early, and both P V products, or (SS_ORDER 1, V32) tile 2 i's P V before its softmax. Order
  0 (tile 2 i's P V first, then S) left the tensor cores idle under both softmaxes.
- SS_HALF: each consumer frees the half of a stage that its P V products read on its own
  barrier, and the producer refills that half first (the rope slot, which holds P, once both
  have freed the stage).

V32 (FlashMLA's 656-byte FP8 rows, 4 float32 scales a row) is dequantized by the producer:
the e4m3 bytes of a tile are loaded into registers as int32 words before it waits for the
stage, then converted (e4m3 -> f16 -> f32, times the scale, -> bf16: the reference's rounding)
and stored. Rope-aware FP8 stays on the key-split kernel, which folds its per-token scale into
S and P instead of rounding the scaled tile to bf16.

H100 (bench/gpu_mla_dev.py, 2026-11-22, b 128, page 64, TFLOP/s) against the key-split
`gluon_mla._mla_decode_sm90`: dense bf16 h_q 128 s_k 8192 484 vs 387, s_k 4096 460 vs 360;
sparse s_q 2 top-k 2048 bf16 426 vs 348, V32 322 vs 248. Registers (setmaxnreg): BF16 232 a
consumer thread and 48 for the producer; V32 200 and 112 (the tile in flight; at 208 / 96 the
producer spilled and ran 225), the cluster kernel 200 and 104 (below, "The cluster producer's
tile step"). Loading the next V32 tile group by group while the current one
is stored spilled at any split tried (1.5-7x slower). Two V32 producer warpgroups (column
halves, 16 warps) do not compile: the kernel's .maxnreg becomes 65536 / 512 = 128, and ptxas
rejects the consumers' m64n256k16 wgmma (it asks for 158) although setmaxnreg gives their
region 184-200. Integer-op e4m3 decoding (byte permutes, shifts, masks instead of the
conversion unit) ran 252 TFLOP/s against 322 (2026-11-22). Fewer conversions do not help either:
e4m3 -> f16 and one f16x2 product with the scale (5 instructions for 4 elements against 12;
timing only, the f16 bits read as bf16) took 0.497 ms against 0.469-0.470 from HBM, 0.405-0.406
against 0.385-0.386 with the keys in L2 and 0.352-0.353 against 0.342 with no key loaded (H100
2026-11-22, `bench/gpu_mla_dev.py` graph replays, two alternating runs). So the conversion rate
does not bound the producer, and an f16 stage (exact e4m3 -> f16, scales folded into f16
products) would not lift V32. Its stores do (same method, timing only): converted but not
stored, a tile leaves the kernel at 0.263 ms from HBM (537 TFLOP/s; 0.267 with no key loaded);
stored without conversion (the e4m3 words twice), 0.401 (0.321). The dequantized words meet
2-way bank conflicts in the stage's 128-byte swizzle (`gl.bank_conflicts` 1; none with the
loads laid out 4 threads a row and 8 rows a warp): without them the kernel took 0.321 against
0.341-0.342 ms with no key loaded, but 0.464-0.465 against 0.468 from HBM and 0.389-0.390
against 0.381 with the keys in L2 (two alternating runs), so that layout was not kept (record:
`bench/results/h100_2026-11-22_mla_v32_producer.json`). Nor does dequantizing in the
consumers, with no bf16 stage (timing-only development kernel, H100 2026-11-22, record
`bench/results/h100_2026-11-22_mla_v32_headsplit.json`): a producer cp.asyncs the raw rows
into a 3-stage ring and both consumer warpgroups run every tile with `gluon_mla._t_tile`, each
for 32 of the block's 64 heads, from float16 register operands (e4m3 times its tile scale over
the key's largest scale, exact for V32's power-of-two scales). It matched the reference (cos
2e-7) but took 0.80-0.87 ms from HBM and 0.77-0.82 with no key loaded (16 heads a warpgroup:
1.22-1.26), against 0.459 / 0.338: every tile is converted once per warpgroup, the 32-head
accumulators spill (O^T 128 registers a thread plus two P V register operands in flight), and
each chunk's conversion waits on the product before it. FlashMLA splits the dequantization
between the two CTAs of a cluster and writes each half into both CTAs' shared memory. SS_CROSS
(`_ss_cross_tile`; the default for V32 with two head blocks a token, `triton_mla.TUNING
["ss_cross"]`) does that here. The kernel is compiled as one CTA and launched in clusters of
two. Each producer dequantizes column half `rank` of every tile into its own stage, then
bulk-copies the 32 KB half into the peer's stage (cp.async.bulk shared::cta -> shared::cluster,
completing on the peer's `ready`) once the peer's consumer has freed it. Consumers free a half
on the peer's `rempty` too, with relaxed remote arrivals: release ones cost a MEMBAR.ALL.GPU
each and ran 0.478 ms. H100 graph replays (2026-11-22, record
`bench/results/h100_2026-11-22_mla_v32_cluster.json`), cluster against one CTA in the same run:
0.442-0.446 / 0.464-0.469 ms from HBM, 0.413-0.417 / 0.380-0.381 with the keys in L2,
0.365-0.368 / 0.341-0.343 with no key loaded; dense V32 s_k 8192 0.855 / 0.916 (L2 0.773 /
0.769). The first form waited for the peer before its own stores and copied each 16 KB group
as it was stored: 0.448-0.455 from HBM, 0.417-0.425 in L2, 0.378-0.383 with none loaded. The
CTAs wait on each other every tile, which costs more than half the conversions save except
from HBM. Not kept (same record): st.async of each dequantized 16-byte chunk straight from the
registers into the peer's stage (completing on its `ready`; with the local st.shared from the
same registers) ran 0.538 ms against the bulk copy's 0.498 on the same producer, 0.457 against
0.378 with no key loaded: the stores occupy the producer's issue slots where a bulk copy runs
by itself; loading the next tile's half before the current one is stored spilled (51-62
spill stores, any register split) and ran 0.58-0.93 ms; 208 / 96 registers (consumers /
producer) instead of 200 / 112 did not change the time from HBM; issuing tile j + 1's loads
right after tile j's local stores, before the waits on the peer and on the other consumer,
ran 0.468-0.469 ms against 0.443-0.445 from HBM and 0.390 against 0.363-0.364 with no key
loaded (the producer's path to the copy is the tiles' critical path). Timing-only bounds: half of
each tile converted and all of it stored ran 0.403 ms, half stored 0.344. Loading two column
groups ahead across tiles in one CTA (48 words a thread against 64) spilled (27-53 spill
stores) and ran 0.665-0.951 ms. An L2 prefetch of the next tile's rows by the producer
(cp.async.bulk.prefetch.L2, one a row or a page) made every case slower
(GPU time of graph replays, 2026-11-22): dense bf16 h_q 128 s_k 8192 629 -> 695 us, sparse
V32 449 -> 502, sparse bf16 340 -> 389; so did a per-thread prefetch.global.L2 of tile j + 2
(or j + 3) by the producer (8-16 addresses a row, 2026-11-22): 605 -> 697 us, 480 -> 513,
340 -> 424.

Cache hints on the producer's tile loads do not pay either (H100 2026-11-23, record
`bench/results/h100_2026-11-23_mla_v32_loadhints.json`, graph replays, sparse V32 from HBM, two
leases each; plain ld.global 0.429-0.433 ms). L2-only loads (.cg) of the words, scales and rope
ran 0.448-0.450 ms, L1::evict_first 0.454; of the words and rope only (scales through L1) 0.448
and 0.437. The L1 serves about 12% of the tile loads' sectors (Nsight Compute, one launch: 15.5
of 17.7 M sectors miss it, 16.5 M with .cg): the 656-byte rows straddle sectors, and a row's
scales share one with its rope part. L1::evict_last (Triton adds an L2 evict_last policy) ran
0.424-0.429 against 0.429-0.430 (dense V32 s_k 8192 0.789-0.801 against 0.792-0.803): under 1%,
and it would leave the cache's rows pinned in L2 for the engine's next kernels, so it was not
kept. FlashMLA's hints for its rows (ld.global.nc.L1::evict_last.L2::256B, inline asm; one of a
tile's 8 loads sank past the stage's wait in the sm_90 SASS) ran 0.439 sparse, 0.782-0.783
dense.

Rope in registers (H100 2026-11-23, `bench/gpu_mla_dev.py` graph replays, sparse V32 b 128 h_q
128 s_q 2 top-k 2048; record `bench/results/h100_2026-11-23_mla_v32_rope_regs.json`): the
cluster producer loads a tile's rope part (64 rows x 128 bytes, 16 registers a thread) with its
e4m3 bytes, before its waits, and stores it once the stage is free. It used to cp.async it after
the last wait, so every tile's `ready` waited for a global load issued only once both consumers
had freed the stage. Two leases, against the cp.async form: 0.430 / 0.430 ms against 0.439 /
0.440 from HBM, 0.397 / 0.397 against 0.414 / 0.413 with the keys in L2, 0.366 against 0.367
with none loaded; dense V32 h_q 128 s_k 8192 0.829 against 0.854 ms (L2 0.756 / 0.772); the
persistent kernel 0.468 against 0.485. Its trace (`--trace ss128`, same record): 3.07-3.10 us a
tile against 3.16-3.18, the producer's first tile released 3.7-3.8 us after the prologue against
4.1, the first pair done 10.9-11.0 us after it against 11.2-11.4; prologue 2.5-2.8 us, epilogue
2.7, 1.3 between a SM's CTAs as before. With the rope in registers, 200 / 104 and 192 / 120
registers (consumers / producer) ran 0.432 and order 2 0.456. The one-CTA V32 producer (h_q <=
64; it holds a whole tile's e4m3 words) spills with the rope added (5 spill stores) and ran
slower that way: sparse V32 h_q 64 0.280 against 0.246 ms from HBM, 0.207 against 0.190 in L2,
0.174 against 0.168 with none loaded (run 7), so it keeps the cp.async. A sequential order
(FlashMLA's split: warpgroup 0 every tile's S, softmax and P V on columns 0..255, warpgroup 1
the P V on 256..511 from P in shared memory; commit 23d1625, `ss_order` 3) was the fastest with
no key loaded (0.359 against 0.366) but slower wherever keys load: 0.498 ms from HBM and 0.439
in L2 with the rope in registers (consumer 0 at 232 registers, 27 spill stores; at 192, 50 and
0.659 ms); in the persistent kernel 0.580. Nor does issuing tile j + 1's loads earlier, between
tile j's copy to the peer and its rope store (so two tiles' loads are in flight; one producer
spill): 0.520 against 0.429 ms from HBM, 0.459 against 0.396 in L2, 0.380 against 0.363 with
none loaded, dense V32 0.972 against 0.829 (same record, run 6): the producer's path from a free
stage to its release is the tiles' critical path, and the loads' issue (with `_ss_fp8_ptrs`'s
layout conversion) sits on it. Taking the e4m3 -> bf16 conversion off that path, converting
before the wait, does not survive ptxas: with the conversion's inline asm not pure, the PTX has
all 64 cvt.rn.f16x2.e4m3x2 of a tile ahead of the mbarrier.try_wait, but the sm_90 SASS sinks
the F2FP conversions past the wait loop to their stores, at 112 or 120 producer registers
(offline compile, `bench/gpu_mla_dev.py --compile-only`, 2026-11-23). Copying each 16 KB group
to the peer once it is stored (SPLITCP, the second group converted under the first one's copy)
helps dense V32 and not sparse (runs 9-10, two leases): dense h_q 128 s_k 8192 0.797 against
0.820 ms (L2 0.721-0.731 against 0.752-0.757), sparse 0.435 against 0.428-0.431 (none loaded
0.371 against 0.361); so it is on for dense only.

What limits it (H100, 2026-11-22, b 128 h_q 128 s_q 2 top-k 2048, TFLOP/s of eager calls,
order 0 -> the shipped order): with every index invalid (no key loaded: the consumers'
schedule alone) sparse bf16 runs 446 -> 502 and V32 402 -> 401 (the producer's dequant path); with
every request's keys in L2 (one shared page list) 448 -> 497 and V32 350 -> 359; from HBM
457 -> 441 and V32 287 -> 300. So the consumers' schedule caps BF16 near 500 (the S products
read both operands from shared memory, m64n64k16: 4 KB a k-step, the shared-memory bandwidth
of the tensor cores' peak rate, shared with the producer's copies), and V32 loses a further
quarter to memory latency: the producer holds one tile in registers, so a tile's load latency
is hidden only behind the wait for its stage. With Q (72 KB) resident only two 72 KB stages
fit; FlashMLA's seesaw reports 660 on an H800. Nsight Compute's warp-state samples (H100
2026-11-22, `bench/ncu_sass_hot.py`, dense bf16 h_q 128 s_k 8192) show the cost of the two
stages: the consumers' `ready` waits (a stage is refilled only once both warpgroups' P V of
its tile is done) take 17% of all samples from HBM, a consumer warp's time ~25% (13% / ~19%
with the keys in L2), the `pm` waits ~4%. Sparse V32: the producer waits for a free stage in
22% of all samples and on its own loads (the dequant's operands) in ~14%, the consumers on
each other's P (`pm`) in 14% and hardly on `ready`. Neither of two schedules aimed at the
waits moved the kernel (graph replays, us, against the shipped one in the same run):
starting S on a tile's first 256 columns once they have landed (a second `ready` barrier a
stage) 622 / 620 dense s_k 8192, 333 / 336 s_k 4096, 344 / 346 sparse bf16, 478 / 477 V32
(412 / 397 with V32's keys in L2); S on two accumulator chains (64-column chunks
alternating) 617 / 614, 329 / 327, 345 / 344. Dense h_q 128 s_k 8192 with every key in L2
runs 534-539 us (541-547 TFLOP/s) against 614-620 from HBM in the same runs.

Fixed cost a CTA (H100, 2026-11-23, `bench/mla_v32_waves.py` and `bench/gpu_mla_dev.py --trace
ss128`, record `bench/results/h100_2026-11-23_mla_v32_fixed.json`; sparse V32 b 128 s_q 2 top-k
2048): the 512 CTAs run in whole waves of 66 clusters (b 32 / 33 take 116 us, b 34 225, b 128
444 and b 132 448), and each CTA spends 12-15 us beside its 32 tiles (the top-k sweep's
intercept: ~60 us from HBM and ~53 with no key loaded over ~4 waves). Its trace: 1.3 us between
a SM's CTAs, 3.2-3.4 us of prologue (2.5-2.7 with q's loads issued first and V32 stages not
zeroed, as shipped: graph replays 0.436-0.442 against 0.443-0.445 ms), the first pair done 11.2-
11.4 us after it (the producer's first tile lands after 4.1), then 3.16-3.21 us a tile and 2.6
us of epilogue. A persistent variant (one CTA or cluster a SM or pair looping over the work
items, the ring's phases going on across them, O staged in q's buffer and the next item's q
cp.async'ed in its place; not kept) was correct but slower from HBM: 0.456 against 0.445 ms
(0.418 / 0.416 in L2, 0.361 / 0.368 with no key loaded); its first item took 135 us against a
CTA's 114, with a 6.8 us epilogue, and the next item's first tile landed only as the
consumers ended the previous item's loop (the producer decodes the next item after issuing the
last tile, and the two-stage ring gives it no slack).

The SMs do not run at the H100's 1.98 GHz under it: clock64 over globaltimer across each CTA's
life (trace slots 8-9, `--trace ss128`, H100 2026-11-23) gives medians of 1.79-1.81 GHz (Nsight
Compute 1.79); the TMA-fed dense kernel (`gluon_mla_st`, h_q 128) runs at 1.64 GHz at s_k 4096
and 1.36 at 8192, the memory-bound h_q 16 kernels at 1.73-1.85 (record
`bench/results/h100_2026-11-23_mla_v32_ps_bisect.json`).

FlashMLA's sparse FP8 decode for sm_90 (read 2026-11-23; it reports 410 TFLOP/s on an H800 for
this case) differs from this kernel in its schedule more than in its tile step: one persistent
CTA pair a pair of SMs walks a balanced share of all (token, tile) work (host metadata splits
requests at tile boundaries; a combine kernel merges the split ones), loading the next
request's q while the current one's epilogue runs, so the ~11.4 us a CTA pays here beside its
tiles (1.3 us launch gap, 2.6 prologue, ~4.9 of first-pair fill, 2.6 epilogue; 444 us ~ 3.88
waves x (32 x 3.18 + 11.4)) is paid about once an SM. With this kernel's 3.18 us tiles that
schedule would take ~124 x 3.18 + ~10 us + the combine, ~410 us (~355 TFLOP/s), if the next
request's q and first tile hide behind the current one's last tiles; the persistent variant
above (unbalanced, its next tile late) did not get there. Its tile step splits the warpgroups
unevenly (warpgroup 0: every tile's S, softmax and V columns 0..255; warpgroup 1: only P V on
columns 256..511) and each producer thread dequantizes one key's half-row with 16-byte loads
after its stage is free, writing each 16 bytes locally and to the peer (st.async).

The cluster producer's tile step (H100 2026-11-28, sparse V32 b 128 s_q 2 h_q 128 top-k 2048,
`bench/gpu_mla_dev.py` graph replays, three leases of two passes each; record
`bench/results/h100_2026-11-28_mla_v32_producer.json`). Its tile loop is the tiles' critical
path, and the offline sm_90 SASS showed three costs in it that change no result:
- a warpgroup barrier between the two column groups' stores, put there by Triton's
  shared-memory barrier pass, which takes two stores into column slices of one buffer for a
  hazard (`_ss_deq_store2` stores both in one: the same 16 STS.128, 2 BAR.SYNC a tile against
  3): 0.419-0.424 ms against 0.428-0.434;
- a run-time integer division by the page size for every row of a tile (a reciprocal and ~15
  instructions a row): a power-of-two page size is a compile-time constant (PS_C), 57 fewer
  of the loop's 770 instructions, its first tile load the loop's 41st instruction, not 78th;
- int64 row numbers and a second row product for the rope pointers (ADDR: int32 numbers, one
  int64 offset a row): 711 -> 671 instructions, every load issued by the 187th, not 222nd.
With all three and 200 / 104 registers (every tile loop spill-free; at 200 / 112 consumer 1
spills 8 LDL a pair) it runs 0.415-0.417 ms against 0.428-0.429 for the kernel before, in the
same leases (dense V32 s_k 8192: 0.777-0.778 against 0.795-0.796); the constant page size or
the registers alone moved it by less than the passes' spread (0.419-0.426 ms), 208 / 96 ran
0.435-0.445. The tile trace (`--tile-trace`, medians a tile): the producer's path from one
release to its next tile's loads 1.29 -> 1.07 us, 3.25 -> 3.11-3.14 us a tile. In the benchmark
suite (cold L2 before every call) it took 0.4225 ms, 346 TFLOP/s, against 0.4322 before.

The prologue and the first tiles (H200 2026-11-28, the same case, `bench/gpu_mla_dev.py --cold`,
two leases of two passes; record `bench/results/h200_2026-11-28_mla_v32_prologue.json`). With q
cp.async'ed before the request's loads and a barrier of its own for the consumers (SS_QASYNC;
no warp waits for q, nor the peer's producer through the cluster barrier) sparse V32 takes
0.414-0.415 ms in graph replays against 0.416-0.418, and 0.4168-0.4196 against 0.4186-0.4195
as the benchmark suite times it (L2 evicted before each call); it is on for sparse V32 only
(dense V32 s_k 8192: 0.782-0.787 against 0.776-0.780; sparse bf16 within the spread). Not kept
(same record, each against the kernel of its lease): issuing tile 1's loads once tile 0's own
half is stored, before tile 0's exchange (the ring is empty then; tiles 0 and 1 peeled out of
the producer's loop), 0.422-0.423 ms against 0.416-0.418 (dense 0.814 against 0.776-0.780); a
row's two scales in one 8-byte load (4 fewer loads, 14 fewer instructions a tile) 0.416;
`ready` counting the release alone, no cp.async arrivals, 0.415; both 0.416.

Where the cluster kernel waits (H200 2026-11-28, Nsight Compute warp-stall samples of one launch,
`bench/ncu_ps_diag.sh`, record `bench/results/h200_2026-11-28_mla_v32_ncu.json`): the consumers
wait for the producer (their `ready` and `pm` waits) ~45% of their time, and the producer warps
stall on the first uses of their own loads about a third of theirs and on a free stage about a
sixth: one tile of register lookahead hides a tile's load latency only behind its stage's wait.
More lookahead does not fit in the producer's 104 registers (not kept, same lease, graph replays,
record `bench/results/h200_2026-11-28_mla_v32_pipe.json`; correct on the seesaw checks and 128
V32 GPU tests): with column group 2 rank of tile j + 1 loaded as soon as tile j's is stored (the
other group at the tile's top, as here) and the keys two tiles ahead, the producer's sm_90 code
has 23 spill instructions (about 16 of them in its tile loop, most around its waits) and the
kernel takes 0.515 ms against 0.416 from HBM, 0.458 against 0.390 in L2 and 0.400 against 0.354
with no key loaded; with both groups loaded that way, 80 spill instructions (26 at 120
registers, 15 at 128, where the consumers then spill 58-64) and 0.775 ms. Staging the rope part
through 8 KB of shared memory (cp.async, each thread reading back its own chunks) instead of 16
registers leaves the one-group form at 27 spill instructions (offline sm_90 compile, not timed):
ptxas then spills the other group's words right after their loads are issued, which waits for
them.

Synchronisation is by mbarriers only: `ready` (the producer's cp.async arrivals plus one
release arrival for the validity mask), `empty` (each consumer once its last product that
reads the stage is complete; SS_HALF: a barrier for each consumer's half of a stage), `pm` (a
tile's P and running max are in shared memory) and one for the final row-sum exchange. A
consumer never waits on a barrier with a wgmma in flight (ptxas would complete it at the
branch anyway)."""

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
        _g_clock,
        _g_issue_cols,
        _g_issue_rope,
        _g_key_range,
        _g_keys,
        _g_normalize,
        _g_pair_slots,
        _g_put_q,
        _g_request,
        _g_rope_ptrs,
        _g_rows,
        _g_seesaw_ids,
        _g_seesaw_start,
        _g_tick,
        _g_tile_rows,
        _g_tile_slots,
        _g_trace_close,
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
    def _ss_release(ready, st, vbuf, valid, TX: gl.constexpr = 0):
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
    def _ss_cross_tile(K, K_stride, K_stride_h, K_stride_q, k_lat, k_rope, vbuf, bars, cl, st,
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
        stored once the stage is free (see the module docstring's "rope in registers").
        SPLITCP: each 16 KB column group of the half is copied once stored, the second
        converted under the first one's copy (dense V32: `triton_mla`'s SS_SPLITCP); else
        DEQ1: both groups in one store (`_ss_deq_store2`), else one store each. ADDR: the
        rows' int32 numbers and one int64 offset product a row for the words, scales and rope
        (else int64 numbers and a second product for the rope). TT
        (development): `_g_tick`s into tt's slots 0-4: before and after the own half's wait,
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
        rp = _g_rope_ptrs(rows, K, K_stride, K_stride_h, 4, ld_l, h_off)
        rope = gl.load(rp, mask=valid[:, None], other=0.0)
        if TT:
            _g_tick(tt, 0)
        mbarrier.wait(empty.index(2 * st + rank), e_ph)
        if TT:
            _g_tick(tt, 1)
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
            _g_tick(tt, 2)
        mbarrier.wait(rempty.index(2 * st + rank), e_ph)
        cl_copy_to_peer(src, off_ready + 8 * st, CB, peer)
        if TT:
            _g_tick(tt, 3)
        if SPLITCP:  # the second group, converted under the first one's copy
            _ss_deq_store(dst, x1, s1, 1)
            fence_async_shared()
            gl.thread_barrier()
            cl_copy_to_peer(src + CB, off_ready + 8 * st, CB, peer)
        mbarrier.wait(empty.index(2 * st + peer), e_ph)
        if TT:
            _g_tick(tt, 4)
        k_rope.index(st).store(rope)  # (a masked row's rope as zeros; its P is masked)
        _ss_release(ready, st, vbuf, valid, HB)

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
        CROSS: half of each tile, shared with the peer CTA (`_ss_cross_tile`). PS_C: the page
        size where it is a compile-time constant (`triton_mla._page_size_constexpr`), else 0."""
        (OUT, stride_ot, stride_oh, LSE, PO, PL, SINK, qk_scale, n_tokens,
         K, K_SC, K_LUT, K_IDX, K_stride, K_stride_h, K_stride_q, K_sc_stride, K_lut_stride,
         K_ps, K_psr, K_nenc, K_npages, K_idx_stride,
         t, hb, b, i0, q_len, part, cache_len, lo, hi,
         q_lat, q_rope, k_lat, k_rope, vbuf, m_buf, l_buf, bars) = args  # fmt: skip
        ready, empty, pm, lx, rempty = bars
        ld_l: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
        row_l: gl.constexpr = gl.SliceLayout(1, ld_l)
        K_ps = PS_C if PS_C else K_ps
        if CROSS:
            cl_sync()  # the peer's barriers are initialized and its stages zeroed
        n_it = gl.cdiv(gl.maximum(hi - lo, 0), BN)
        n_t = gl.cdiv(n_it, 2) * 2
        key = _g_keys(lo, hi, b, t, K_LUT, K_IDX, K_lut_stride, K_ps, K_idx_stride, SPARSE,
                      BN, row_l)  # fmt: skip
        for j in range(n_t):
            st = j % 2
            start = lo + j * BN
            key_next = _g_keys(start + BN, hi, b, t, K_LUT, K_IDX, K_lut_stride, K_ps,
                               K_idx_stride, SPARSE, BN, row_l)  # fmt: skip
            rows, valid = _g_rows(start, hi, key, K_ps, K_psr, K_nenc, K_npages, SPARSE, BN,
                                  row_l)  # fmt: skip
            if CROSS:
                _ss_cross_tile(K, K_stride, K_stride_h, K_stride_q, k_lat, k_rope, vbuf, bars,
                               cl, st, rows, valid, ((j // 2) & 1) ^ 1, BN,
                               SPLITCP, TRACE == 2,
                               _g_tile_slots(trp, 10, j) if TRACE == 2 else 0,
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
                        _g_issue_cols(k_lat.index(st), rows, valid, K, K_stride, h * 256, 256,
                                      ld_l)  # fmt: skip
                else:
                    dst = k_lat.index(st)
                    _ss_deq_store(dst, x0, s0, 0)
                    _ss_deq_store(dst, x1, s1, 1)
                    if HALF:
                        mbarrier.wait(empty.index(2 * st + 1), e_ph)
                    _ss_deq_store(dst, x2, s2, 2)
                    _ss_deq_store(dst, x3, s3, 3)
                _g_issue_rope(k_rope.index(st), rows, valid, K, K_stride, K_stride_h, FMT, ld_l)
                _ss_release(ready, st, vbuf, valid)
            if TRACE:
                if j == 0:
                    gl.store(trp + 5, _g_clock())
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
    def _ss_softmax(s, m_prev, m_w, l_w, kr, keep, m_buf, pm, start, kcol, row_lim,
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
    def _ss_pv_own(acc, m_o, m_new, pb, kl, W: gl.constexpr, o_l: gl.constexpr):
        """O (this warpgroup's 256 columns) rescaled to max m_new, plus the own P (registers)
        times the tile's V columns; complete."""
        orow: gl.constexpr = gl.SliceLayout(1, o_l)
        m_n = gl.convert_layout(m_new, orow)
        acc = acc * gl.exp2(m_o - gl.where(m_n == float("-inf"), 0.0, m_n))[:, None]
        p_op = gl.convert_layout(pb, gl.DotOperandLayout(operand_index=0, parent=o_l, k_width=2))
        acc = warpgroup_mma(p_op, kl.slice(W * 256, 256, dim=1), acc, is_async=True)
        return warpgroup_mma_wait(num_outstanding=0, deps=(acc,)), m_n

    @gluon.jit
    def _ss_other(acc, m_o, m_new, kl, kr, W: gl.constexpr):
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
        pb, m_new, m_w, l_w = _ss_softmax(s, m_prev, m_w, l_w, kr, keep, m_buf, pm, start, kcol,
                                          row_lim, W, MASK_CAUSAL, qk_scale)  # fmt: skip
        acc, m_o = _ss_pv_own(acc, m_o, m_new, pb, kl, W, o_l)
        return acc, m_o, m_w, l_w

    @gluon.jit
    def _ss_pair(acc, m_o, m_w, l_w, z, ph, j0, lo, q_lat, q_rope, k_lat, k_rope, vbuf, m_buf,
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
                    acc, m_o = _ss_other(acc, m_o, m_buf.index(k).load(orow), kl, kr, W)
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
                acc, m_o = _ss_other(acc, m_o, gl.convert_layout(m_prev, orow), kl0, kr0, W)
                _ss_free(empty, W * HALF, cl, CROSS)
                acc, m_o, m_w, l_w = _ss_own(
                    s, m_prev, acc, m_o, m_w, l_w, kl1, kr1, vbuf.index(1), m_buf, pm,
                    lo + (j0 + 1) * BN, kcol, row_lim, W, MASK_CAUSAL, qk_scale, o_l,
                )  # fmt: skip
            else:  # ORDER 2: the own softmax (P out early), then both P V products
                keep = vbuf.index(1).load(kcol.type.layout)[None, :] != 0
                pb, m_new, m_w, l_w = _ss_softmax(
                    s, m_prev, m_w, l_w, kr1, keep, m_buf, pm, lo + (j0 + 1) * BN, kcol, row_lim,
                    W, MASK_CAUSAL, qk_scale,
                )  # fmt: skip
                acc, m_o = _ss_other(acc, m_o, gl.convert_layout(m_prev, orow), kl0, kr0, W)
                _ss_free(empty, W * HALF, cl, CROSS)
                acc, m_o = _ss_pv_own(acc, m_o, m_new, pb, kl1, W, o_l)
            _ss_free(empty, 1 + HALF + W * HALF, cl, CROSS)
        return acc, m_o, m_w, l_w

    @gluon.jit
    def _ss_tick_ready(tt, ready, W: gl.constexpr, ph):
        """Tile trace: a pair's start and its own tile's `ready` passed (`_g_tick` slots 0, 1;
        the wait is `_ss_pair`'s own, which then passes at once)."""
        _g_tick(tt, 0)
        mbarrier.wait(ready.index(W), ph)
        _g_tick(tt, 1)

    @gluon.jit
    def _ss_finish(acc, m_o, m_w, l_w, l_buf, lx, head_s, rows_ok_s, o_stage, OUT, stride_ot,
                   stride_oh, LSE, PO, PL, SINK, t, hb, i0, q_len, part, n_tokens,
                   W: gl.constexpr, H_Q: gl.constexpr, HPT: gl.constexpr, TPT: gl.constexpr,
                   D_V: gl.constexpr, HAS_SINK: gl.constexpr, SPLIT: gl.constexpr,
                   srow: gl.constexpr, o_l: gl.constexpr):  # fmt: skip
        """Epilogue of consumer warpgroup W of a seesaw kernel: O (its 256 columns, scaled to
        max m_o) normalized and stored (W = 0: with the LSE), or the split's partials.

        The bf16 O goes through o_stage, ring stage W [BN, 512] (its columns W * 256.. are
        read by warpgroup W only, and no tile lands after the loop), and leaves it in 16-byte
        stores, a warp a row, instead of the accumulator layout's 4-byte ones (8 rows of 16
        bytes a warp store). H100 traces (2026-11-22, `bench/gpu_mla_dev.py --trace`, the st
        kernel, b 128 h_q 128 page 64): loop end to stored 6.6-6.9 -> 2.1-2.2 us a CTA at s_k
        4096 (7.5-7.7 -> 2.7-2.8 at 8192), first CTA start to last end 270-271 -> 262-264 us;
        graph replays 0.290 against 0.301 ms, and the sparse V32 cp.async seesaw (h_q 128
        s_q 2 top-k 2048) 0.468 against 0.477 ms. The split's float32 partials (twice the
        bytes; small batches) are stored from the accumulator layout."""
        BM: gl.constexpr = 64
        orow: gl.constexpr = gl.SliceLayout(1, o_l)
        # Row sums: own tiles' sums at the final max, exchanged through shared memory.
        m_fin = gl.convert_layout(m_o, srow)
        m_fin_use = gl.where(m_fin == float("-inf"), 0.0, m_fin)
        l_buf.index(W).store(l_w * gl.exp2(m_w - m_fin_use))
        gl.thread_barrier()
        mbarrier.arrive(lx, count=1)
        mbarrier.wait(lx, 0)
        l_i = l_buf.index(0).load(srow) + l_buf.index(1).load(srow)
        m_i = m_fin

        lse, inv = _g_normalize(m_i, l_i, SINK, head_s, rows_ok_s, HAS_SINK and not SPLIT)
        ro = gl.arange(0, BM, layout=orow)
        row_ok_o, _tq, tok_o, head_o = _g_tile_rows(ro, t, hb, i0, q_len, H_Q, HPT, TPT)
        o = acc * gl.convert_layout(inv, orow)[:, None]
        if not SPLIT:
            st_l: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [4, 1], [1, 0])
            part_w = o_stage.slice(W * 256, 256, dim=1)
            part_w.store(o.to(gl.bfloat16))
            gl.thread_barrier()
            x = part_w.load(st_l)
            rx = gl.arange(0, BM, layout=gl.SliceLayout(1, st_l))
            row_ok_x, _tqx, tok_x, head_x = _g_tile_rows(rx, t, hb, i0, q_len, H_Q, HPT, TPT)
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
        (a 2-CTA cluster, `_ss_cross_tile`): it frees it on the peer's barrier too. QASYNC:
        it waits for q's copies on barrier qb first (`_ss_issue_q`)."""
        if CROSS:
            if W == 1:  # (warpgroup 0 arrived at the end of the kernel's prologue)
                cl_arrive()
            cl_wait()
        if QASYNC:  # q's cp.asyncs (`_ss_issue_q`) have landed
            mbarrier.wait(qb, 0)
        (OUT, stride_ot, stride_oh, LSE, PO, PL, SINK, qk_scale, n_tokens,
         K, K_SC, K_LUT, K_IDX, K_stride, K_stride_h, K_stride_q, K_sc_stride, K_lut_stride,
         K_ps, K_psr, K_nenc, K_npages, K_idx_stride,
         t, hb, b, i0, q_len, part, cache_len, lo, hi,
         q_lat, q_rope, k_lat, k_rope, vbuf, m_buf, l_buf, bars) = args  # fmt: skip
        ready, empty, pm, lx, rempty = bars
        BM: gl.constexpr = 64
        gl.static_assert(BN == 64, "64-key tiles (SS_S_L)")
        s_l: gl.constexpr = SS_S_L
        o_l: gl.constexpr = SS_O_L
        srow: gl.constexpr = gl.SliceLayout(1, s_l)
        orow: gl.constexpr = gl.SliceLayout(1, o_l)

        rs = gl.arange(0, BM, layout=srow)
        rows_ok_s, tqs, _tok, head_s = _g_tile_rows(rs, t, hb, i0, q_len, H_Q, HPT, TPT)
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
                tt = _g_pair_slots(trp, 10, W, i)
                _ss_tick_ready(tt, ready, W, i & 1)
            # z: a zero the compiler cannot fold: with constant buffer indices the wgmma
            # descriptors (64-bit, one a k-step) are hoisted out of the loop and spill.
            acc, m_o, m_w, l_w = _ss_pair(
                acc, m_o, m_w, l_w, i // 2147483647, i & 1, 2 * i, lo, q_lat, q_rope, k_lat,
                k_rope, vbuf, m_buf, bars, cl, lx, False, kcol, row_lim, zero_s, qk_scale, CROSS,
                W, CAUSAL and not SPARSE, ORDER, HALF, False, BN, o_l,
            )  # fmt: skip
            if TRACE == 2:
                _g_tick(tt, 3)
            if TRACE and W == 0:
                if i == 0:
                    gl.store(trp + 2, _g_clock())

        if TRACE and W == 0:
            gl.store(trp + 3, _g_clock())
            gl.store(trp + 7, n_it.to(gl.int64))
        _ss_finish(acc, m_o, m_w, l_w, l_buf, lx, head_s, rows_ok_s, k_lat.index(W), OUT,
                   stride_ot, stride_oh, LSE, PO, PL, SINK, t, hb, i0, q_len, part, n_tokens, W,
                   H_Q, HPT, TPT, D_V, HAS_SINK, SPLIT, srow, o_l)  # fmt: skip
        if TRACE and W == 0:
            _g_trace_close(trp)
        if CROSS:  # no CTA exits while the other may still signal it
            cl_sync()

    @gluon.jit
    def _ss_range(t, part, QOFF, batch, K_CL, K_TOPK, NUM_P, K_idx_len, TPT: gl.constexpr,
                  B_P2: gl.constexpr, SPARSE: gl.constexpr, HAS_TOPK: gl.constexpr,
                  TOPK_TOK: gl.constexpr, CAUSAL: gl.constexpr, BN: gl.constexpr):  # fmt: skip
        """A seesaw program's token t's (b, i0, q_len, cache_len, lo, hi): its request and the
        keys [lo, hi) of partition `part`."""
        one_l: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
        b, live, i0, leader, q_len = _g_request(QOFF, batch, t, TPT, B_P2, one_l)
        cache_len, lo, hi = _g_key_range(
            K_CL, K_TOPK, b, t, live, leader, i0, q_len, part, NUM_P, K_idx_len,
            SPARSE, HAS_TOPK, TOPK_TOK, CAUSAL, TPT, BN,
        )  # fmt: skip
        return b, i0, q_len, cache_len, lo, hi

    @gluon.jit
    def _ss_issue_q(Q, stride_qt, stride_qh, t, hb, q_lat, q_rope, H_Q: gl.constexpr,
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
    def _ss_alloc(BN: gl.constexpr, L_SETS: gl.constexpr):
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
        Q, stride_qt, stride_qh, QOFF, batch, n_tokens,
        OUT, stride_ot, stride_oh, LSE, PO, PL, SINK, qk_scale, NUM_P,
        K, K_SC, K_LUT, K_CL, K_IDX, K_TOPK, K_stride, K_stride_h, K_stride_q, K_sc_stride,
        K_lut_stride, K_ps, K_psr, K_nenc, K_npages, K_idx_stride, K_idx_len,
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
        (development, `bench/gpu_mla_dev.py`): int64 TR [CTAs, 10] (`_g_trace_open`); TRACE 2
        (SS_CROSS) [CTAs, 394] with a tile trace in slots 10 + 8 j + e (producer, tile j < 32,
        `_ss_cross_tile`'s ticks) and 266 + 64 W + 4 i + e (consumer W, pair i < 16: its start,
        its own tile's `ready` passed, -, its end), SM cycles. V32 tiles
        are dequantized to bf16 by the producer (loads into registers before it waits for
        the stage; stores after). Launch with num_warps=4 (consumer 0); consumer 1 and the
        producer are worker partitions. SS_CROSS (V32, NHB 2, SS_HALF): launched in clusters
        of two CTAs (head blocks 0 and 1 of a token; `_ss_cross_tile`); OFF_*: the shared
        offsets of k_lat, ready and rempty (`gluon_cluster.smem_offsets`). SS_DEQ1 (SS_CROSS
        without SS_SPLITCP): a half's two column groups in one store (`_ss_deq_store2`).
        SS_ADDR (SS_CROSS): `_ss_cross_tile`'s ADDR; PS_C: `_ss_producer`'s. SS_QASYNC (one
        token a tile, HPT 64, h_q 64 NHB): q is cp.async'ed (`_ss_issue_q`) before the
        request's loads and the consumers wait for it on a barrier of its own, so that no
        warp of the CTA (nor the peer's producer, through the cluster barrier) waits for q's
        loads before the producer's first tile."""
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

        # One token a tile: q's loads are issued before `_ss_range`'s (`_g_seesaw_start`), and
        # V32 stages are not zeroed (every row of a stage's latent part is written: masked
        # rows as zeros). H100 traces (2026-11-23, `bench/gpu_mla_dev.py --trace ss128`,
        # sparse V32 h_q 128 s_q 2 top-k 2048): start to prologue end 3.2-3.4 -> 2.5-2.7 us a
        # CTA; graph replays 0.437-0.442 against 0.443-0.445 ms from HBM, 0.363-0.366 against
        # 0.365-0.368 with no key loaded.
        # Loading tile 0's indices here too (sparse, unsplit) did not pay: the producer's first
        # tile was released 3.8-3.9 us after the prologue against 4.1, graph replays 0.4388
        # against 0.4371 ms (same lease; `h100_2026-11-23_mla_v32_fixed.json`, "early_key").
        if SS_QASYNC:
            q_lat, q_rope, k_lat, k_rope, vbuf, m_buf, l_buf, ready, empty, pm, lx, rempty = (
                _ss_alloc(BN, 1)
            )
            qb = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout()).index(0)
            trp, t, hb, part = _g_seesaw_ids(TR, NHB, PDL, TRACE)
            _ss_issue_q(Q, stride_qt, stride_qh, t, hb, q_lat, q_rope, H_Q, ld_l, False)
            early = trp
        else:
            trp, t, hb, part, early = _g_seesaw_start(Q, stride_qt, stride_qh, TR, H_Q, HPT,
                                                      TPT, NHB, PDL, TRACE, ld_l)  # fmt: skip
        b, i0, q_len, cache_len, lo, hi = _ss_range(
            t, part, QOFF, batch, K_CL, K_TOPK, NUM_P, K_idx_len, TPT, B_P2, SPARSE, HAS_TOPK,
            TOPK_TOK, CAUSAL, BN,
        )  # fmt: skip
        if not SS_QASYNC:
            q_lat, q_rope, k_lat, k_rope, vbuf, m_buf, l_buf, ready, empty, pm, lx, rempty = (
                _ss_alloc(BN, 1)
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
            _g_put_q(early, Q, stride_qt, stride_qh, t, hb, i0, q_len, q_lat.index(0),
                     q_rope.index(0), H_Q, HPT, TPT, ld_l)  # fmt: skip
        if TRACE:
            gl.store(trp + 1, _g_clock())
        if SS_CROSS:  # barriers and zeroed stages, before the peer may touch them
            cl_fence_init()
            cl_arrive()
        cl = (OFF_K, OFF_READY, OFF_REMPTY, hb % 2)  # hb: the CTA's rank in its cluster

        args = (
            OUT, stride_ot, stride_oh, LSE, PO, PL, SINK, qk_scale, n_tokens,
            K, K_SC, K_LUT, K_IDX, K_stride, K_stride_h, K_stride_q, K_sc_stride, K_lut_stride,
            K_ps, K_psr, K_nenc, K_npages, K_idx_stride,
            t, hb, b, i0, q_len, part, cache_len, lo, hi,
            q_lat, q_rope, k_lat, k_rope, vbuf, m_buf, l_buf, (ready, empty, pm, lx, rempty),
        )  # fmt: skip
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
