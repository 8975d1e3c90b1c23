"""Development script for the Triton MHA / store_kv kernels: correctness at real sizes, then
timing of launch variants (one GPU call does everything; a short table is printed last, details
go to $OUT/gpu_mha_dev.json).

    python dev/gpu_mha_dev.py            # on an H100: checks + variant timings (~4 min)
    python dev/gpu_mha_dev.py --fast     # the same, fewer variants, no base checks (~2 min)
    python dev/gpu_mha_dev.py --prefill  # only the prefill variants (~1 min)
    python dev/gpu_mha_dev.py --legacy   # also the rounds 1-3 sweeps (other formats, d96)
    python dev/gpu_mha_dev.py --stages   # only the decode stages / partitions sweep
    python dev/gpu_mha_dev.py --offline  # any machine: compile for sm_90, print resources
                                         # and the hot loop's SASS instruction mix
    python dev/gpu_mha_dev.py --smoke    # CPU: the same code paths at toy sizes (interpreter)
BUDGET_S (default 250) bounds the run: parts that no longer fit are skipped and said so.

Bandwidth = bytes that must move (K/V rows read once, scales, q, out) / time; the copy ceiling
is a 2 GiB device-to-device copy measured in the same run. Times are medians over CUDA-graph
replays (host overhead excluded, as in a serving loop) and, for reference, eager calls. Every
timed cache is > 0.5 GB (larger than L2), filled with fresh random data.

Notes (NVIDIA H200, 132 SMs, copy ceiling 4.27 TB/s; 2026-11-21; three runs):
- floors: decode bf16 b64 x 4097 keys x 8 KV heads d128 moves 1.074 GB -> 251 us at the copy
  rate (its reads alone run a little faster: reads-only beat the read+write copy, so
  fractions can exceed 1.0); causal prefill 8 x 4096, 32 heads, d128 is 1.1 TFLOP.
- bf16 decode, defaults: b64/4096 p16 250 us (1.01 of copy), p64 250 us (1.01), b16/16384
  p64 256 us (0.98), b128/2048 p64 256 us (0.98), p1 256 us (0.98). d96: 228 us (2 warps) ->
  1.22x the d128 time per byte (compute per tile is that of d128: 96 pads to 128).
- round 1 found 3-4 pipeline stages serial (the page-id load -> K/V load chain takes a stage)
  and 64/128-key tiles losing a partial second wave; 32-key tiles, 5 stages won.
- FP8 per-token decode: byte-wide shared loads of V (round 1, 0.39 of copy) -> register upcast
  + ldmatrix.trans (select trick) + fp16 MMAs + 2 warps: 209 us = 1.19x bf16 (target 1.7x);
  e8m0 225 us (after 4-byte word loads), per-tensor 202 us. Still issue/latency-bound: the
  loop body is ~1100 instructions per 128 keys at <= 2-4 resident CTAs per SM.
- prefill (TMA + wgmma, 128 x 128 tiles, 8 warps): 410 TFLOP/s MHA, 432 GQA 32/8, paged p128
  401, p64 344 (64-key TMA tiles), p16 307 (pointer gathers); FP8 per-token 163.
- round 4 (offline sm_90 SASS, H100 numbers of README: FP8 p16 220 us = 1.68x bf16, p64 267 us):
  the default FP8 loop is 1410 instructions a warp per 64 keys, identical for p16 and p64
  (same registers 211, shared 56.8 KB, same P=1 grid), of which ~260 register moves building
  HMMA A operands, ~280 SEL/PRMT of the V select (16-bit selects), ~15 address / predicate
  instructions per token row. FP8_VARIANTS below: `lean` 767, `trans` 652 (2 warps, 64 keys).
"""

from __future__ import annotations

import json
import math
import os
import sys
import time

SMOKE = "--smoke" in sys.argv
OFFLINE = "--offline" in sys.argv
PREFILL_ONLY = "--prefill" in sys.argv  # only the prefill variants (no checks, no decode)
# FAST_RUN: skip the slow parts (base checks, rare variants, diagnostics)
FAST_RUN = "--fast" in sys.argv or PREFILL_ONLY
LEGACY = "--legacy" in sys.argv  # also the rounds 1-3 sweeps (other formats, d96, paged prefill)
STAGES = "--stages" in sys.argv  # only the decode stage / partition sweep (`stage_sweep`)
if SMOKE:
    os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402
import triton  # noqa: E402

import pagedattn.ops.mha.triton_mha as M  # noqa: E402
from pagedattn.cache.buffers import allocate_buffers  # noqa: E402
from pagedattn.cache.dispatch import fast_hbm, num_sms  # noqa: E402
from pagedattn.cache.inputs import KVCacheInputsPerDevice  # noqa: E402
from pagedattn.cache.params import KVCacheParams, KVQuantConfig  # noqa: E402
from pagedattn.fp8 import quantize_blockwise  # noqa: E402
from pagedattn.operands import PagedOperand, RaggedOperand  # noqa: E402
from pagedattn.ops.masks import causal  # noqa: E402
from pagedattn.ops.mha.selection import Device, MHATuning  # noqa: E402
from pagedattn.testing import assert_close  # noqa: E402

DEV = "cpu" if (SMOKE or OFFLINE) else "cuda"
OUT = os.environ.get("OUT", "/tmp/gpu_mha_dev")
os.makedirs(OUT, exist_ok=True)
T0 = time.time()
BUDGET = float(os.environ.get("BUDGET_S", "250"))
LOG: dict = {"checks": [], "decode": [], "prefill": [], "env": {}}
TABLE: list[str] = []


def left() -> float:
    return BUDGET - (time.time() - T0)


def save() -> None:
    with open(os.path.join(OUT, "gpu_mha_dev.json"), "w") as f:
        json.dump(LOG, f, indent=1, default=str)


# ---------------------------------------------------------------------------------------------
# Inputs
# ---------------------------------------------------------------------------------------------
def paged_cache(b, ctx, page, h_kv, d, quant=None, h_q=None, nan_pool=True):
    """b requests of ctx cached tokens (+1 new token written, decode), random shuffled pages;
    unused pages and the tail of each last page hold NaN, lut padding holds the sentinel."""
    p = KVCacheParams(
        torch.bfloat16, 1, h_kv, d, page, num_q_heads=h_q or h_kv, devices=[DEV], quantization=quant
    )
    seq = ctx + 1
    pages_per = math.ceil(seq / page)
    total = b * pages_per + 3
    buf = allocate_buffers(p, total)
    blocks = buf.kv_blocks
    chunk = max(1, (1 << 27) // (2 * page * h_kv * d))
    for s in range(0, total, chunk):
        x = torch.randn((min(chunk, total - s), *blocks.shape[1:]), device=DEV).bfloat16()
        if quant is None:
            blocks[s : s + x.shape[0]] = x
        elif quant.format == "per_tensor":
            buf.kv_scales.fill_(0.02)
            blocks[s : s + x.shape[0]] = (x.float() / 0.02).clamp(-448, 448).to(blocks.dtype)
        else:
            q8, sc = quantize_blockwise(x, quant.granularity or d, quant.scale_dtype)
            blocks[s : s + x.shape[0]] = q8
            if sc.element_size() == 1:  # e8m0: write the exponent bytes
                buf.kv_scales.view(torch.uint8)[s : s + x.shape[0]] = sc.view(torch.uint8)
            else:
                buf.kv_scales[s : s + x.shape[0]] = sc
    perm = torch.randperm(total, device=DEV).int()
    lut = torch.full((b, pages_per + 2), total, dtype=torch.int32, device=DEV)
    lut[:, :pages_per] = perm[: b * pages_per].view(b, pages_per)
    if nan_pool:
        bad = perm[b * pages_per :].long()
        blocks.view(torch.uint8)[bad] = 0xFF  # NaN in bf16, e4m3 and e8m0
        if quant is not None and quant.format == "blockwise":
            buf.kv_scales.view(torch.uint8)[bad] = 0xFF
        tail = seq % page
        if tail:
            last = lut[:, pages_per - 1].long()
            blocks.view(torch.uint8)[last, :, :, tail:] = 0xFF
    inp = KVCacheInputsPerDevice(
        kv_blocks=blocks,
        cache_lengths=torch.full((b,), ctx, dtype=torch.int32, device=DEV),
        lookup_table=lut,
        max_lengths=torch.tensor([[1, ctx]], dtype=torch.int32),
        kv_scales=buf.kv_scales,
    )
    return p, inp


def reference(q, k_op, v_op, offs, rows_of_req, scale, sinks=None, mask=None):
    """float64 attention for the query rows of the listed requests: {request: out [n, h, d]}."""
    mask = mask or causal()
    res = {}
    cl = k_op.cache_lengths.tolist()
    off = offs.tolist()
    h_q = q.shape[1]
    for b in rows_of_req:
        s0, s1 = off[b], off[b + 1]
        kv = cl[b] + (s1 - s0)
        K = k_op.gather(b, kv, torch.float32)
        V = v_op.gather(b, kv, torch.float32)
        g = h_q // K.shape[1]
        outs = []
        for c in range(s0, s1, 256):
            e = min(c + 256, s1)
            qq = q[c:e].double()
            pos = cl[b] + torch.arange(c - s0, e - s0, device=q.device)
            allowed = mask.allowed(pos[:, None], torch.arange(kv, device=q.device)[None, :])
            o = torch.empty(e - c, h_q, V.shape[-1], dtype=torch.float64, device=q.device)
            for h in range(h_q):
                s = (qq[:, h] @ K[:, h // g].double().T) * scale
                s = s.masked_fill(~allowed, float("-inf"))
                m = s.amax(-1, keepdim=True)
                w = torch.exp(s - m)
                den = w.sum(-1, keepdim=True)
                if sinks is not None:
                    den = den + torch.exp(sinks[h].double() - m)
                o[:, h] = (w @ V[:, h // g].double()) / den
            outs.append(o)
        res[b] = torch.cat(outs)
    return res


def check(name, out, refs, offs, tol=None):
    """Compare rows of `out` with float64 references; failures are recorded, not raised, so
    that one bad case does not cost the timings of the run."""
    tol = tol or {}
    off = offs.tolist()
    worst = 0.0
    try:
        for b, r in refs.items():
            o = out[off[b] : off[b + 1]].double()
            worst = max(worst, float((o - r).abs().max()))
            assert_close(o, r, name=f"{name} req {b}", **tol)
    except AssertionError as e:
        LOG["checks"].append(dict(name=name, ok=False, error=str(e)))
        TABLE.append(f"CHECK FAILED {name}: {str(e)[:150]}")
        print(f"[check] {name}: FAILED {e}", flush=True)
        return
    LOG["checks"].append(dict(name=name, ok=True, max_abs_err=worst))
    print(f"[check] {name}: ok (max abs err {worst:.2e})", flush=True)


# ---------------------------------------------------------------------------------------------
# Timing
# ---------------------------------------------------------------------------------------------
def time_fn(fn, graph=True):
    """(graph-replay median ms, eager median ms)."""
    from triton.testing import do_bench, do_bench_cudagraph

    fn()
    if SMOKE:
        return 1.0, 1.0
    torch.cuda.synchronize()
    g = None
    if graph:
        try:
            g = float(do_bench_cudagraph(fn, rep=60, return_mode="median"))
        except Exception as e:  # capture failure is a finding too
            print(f"[warn] graph timing failed: {type(e).__name__}: {e}")
    e = float(do_bench(fn, warmup=10, rep=60, return_mode="median"))
    return g, e


def copy_gbps():
    if SMOKE:
        return 1.0
    from triton.testing import do_bench

    n = (2 << 30) // 4
    a = torch.randn(n, device="cuda")
    bb = torch.empty_like(a)
    ms = do_bench(lambda: bb.copy_(a), warmup=10, rep=50, return_mode="median")
    return 2 * n * 4 / ms / 1e6


def decode_bytes(b, ctx, h_q, h_kv, d, quant):
    elem = 1 if quant is not None else 2
    n = 2 * b * (ctx + 1) * h_kv * d * elem + 2 * b * h_q * d * 2
    if quant is not None and quant.format == "blockwise":
        g = quant.granularity or d
        n += 2 * b * (ctx + 1) * h_kv * (d // g) * quant.scale_dtype.itemsize
    return n


def run_decode(tag, b, ctx, page, h_q, h_kv, d, quant=None, variants=({},), parts=(None,)):
    """Time variants x partition counts of one decode config; returns the best record."""
    if left() < 20:
        print(f"[skip] {tag}: out of time budget")
        return None
    p, inp = paged_cache(b, ctx, page, h_kv, d, quant, h_q=h_q, nan_pool=False)
    k_op, v_op = PagedOperand(inp, p, 0, "k"), PagedOperand(inp, p, 0, "v")
    q = torch.randn(b, h_q, d, device=DEV).bfloat16()
    offs = torch.arange(b + 1, dtype=torch.int32, device=DEV)
    out = torch.empty_like(q)
    nbytes = decode_bytes(b, ctx, h_q, h_kv, d, quant)
    best = None
    for var in variants:
        for P in parts:
            if left() < 10:
                break
            tuning = MHATuning(decode=var)
            try:
                g, e = time_fn(
                    lambda P=P: M.mha_triton(
                        q, k_op, v_op, offs, out=out, num_partitions=P, config=tuning
                    )
                )
            except Exception as ex:
                print(f"[fail] {tag} {var} P={P}: {type(ex).__name__}: {str(ex)[:300]}")
                LOG["decode"].append(dict(tag=tag, var=var, P=P, error=str(ex)[:500]))
                continue
            ms = g if g is not None else e
            rec = dict(
                tag=tag, var=dict(var), P=P, graph_ms=g, eager_ms=e, gbps=nbytes / ms / 1e6,
                bytes=nbytes,
            )  # fmt: skip
            rec["frac_copy"] = rec["gbps"] / LOG["env"]["copy_gbps"]
            LOG["decode"].append(rec)
            print(
                f"[decode] {tag:28s} {str(var):60s} P={P}: {ms * 1e3:8.1f} us "
                f"{rec['gbps']:7.0f} GB/s ({rec['frac_copy']:.3f} of copy) eager {e * 1e3:.1f} us",
                flush=True,
            )
            if best is None or ms < best["graph_ms" if g is not None else "eager_ms"]:
                best = rec
    save()
    if not SMOKE:
        torch.cuda.empty_cache()
    if best is not None:
        TABLE.append(
            f"{tag:30s} {min(x for x in (best['graph_ms'], best['eager_ms']) if x) * 1e3:9.1f} us"
            f" {best['gbps']:7.0f} GB/s {best['frac_copy']:.3f}  {best['var']} P={best['P']}"
        )
    return best


def run_prefill(tag, nseq, n, h_q, h_kv, d, page=0, variants=({},), quant=None):
    if left() < 25:
        print(f"[skip] {tag}: out of time budget")
        return None
    q = torch.randn(nseq * n, h_q, d, device=DEV).bfloat16()
    offs = torch.arange(nseq + 1, dtype=torch.int32, device=DEV) * n
    if page == 0:
        k = torch.randn(nseq * n, h_kv, d, device=DEV).bfloat16()
        v = torch.randn_like(k)
        k_op, v_op = RaggedOperand(k, offs), RaggedOperand(v, offs)
    else:
        p, inp = paged_cache(nseq, n - 1, page, h_kv, d, quant, h_q=h_q, nan_pool=False)
        inp.cache_lengths.zero_()
        k_op, v_op = PagedOperand(inp, p, 0, "k"), PagedOperand(inp, p, 0, "v")
    out = torch.empty_like(q)
    flops = 4 * nseq * h_q * d * n * (n + 1) / 2
    best = None
    for var in variants:
        if left() < 15:
            break
        tuning = MHATuning(prefill=var)
        try:
            g, e = time_fn(lambda: M.mha_triton(q, k_op, v_op, offs, out=out, config=tuning))
        except Exception as ex:
            print(f"[fail] {tag} {var}: {type(ex).__name__}: {str(ex)[:300]}")
            LOG["prefill"].append(dict(tag=tag, var=var, error=str(ex)[:500]))
            continue
        ms = g if g is not None else e
        rec = dict(tag=tag, var=dict(var), graph_ms=g, eager_ms=e, tflops=flops / ms / 1e9)
        LOG["prefill"].append(rec)
        print(
            f"[prefill] {tag:24s} {str(var):70s}: {ms:8.3f} ms {rec['tflops']:6.1f} TFLOP/s",
            flush=True,
        )
        if best is None or rec["tflops"] > best["tflops"]:
            best = rec
    save()
    if best is not None:
        TABLE.append(f"{tag:30s} {best['tflops']:7.1f} TFLOP/s  {best['var']}")
    return best


# ---------------------------------------------------------------------------------------------
# Correctness at real sizes
# ---------------------------------------------------------------------------------------------
def correctness(small):
    b, ctx = (3, 50) if small else (64, 4096)
    subset = [0, b // 2, b - 1]
    for page, d, quant, name in (
        (16, 128, None, "bf16 p16 d128"),
        (1, 96, None, "bf16 p1 d96"),
        (64, 128, KVQuantConfig.per_token(), "fp8 per-token p64"),
        (16, 128, KVQuantConfig.blockwise(32, torch.float8_e8m0fnu), "fp8 G32 e8m0 p16"),
    ):
        p, inp = paged_cache(b, ctx, page, 8, d, quant, h_q=32)
        k_op, v_op = PagedOperand(inp, p, 0, "k"), PagedOperand(inp, p, 0, "v")
        q = torch.randn(b, 32, d, device=DEV).bfloat16()
        offs = torch.arange(b + 1, dtype=torch.int32, device=DEV)
        sinks = torch.randn(32, device=DEV)
        refs = reference(q, k_op, v_op, offs, subset, d**-0.5, sinks)
        for P in (None, 4):
            out = torch.full_like(q, float("nan"))
            M.mha_triton(q, k_op, v_op, offs, out=out, sinks=sinks, num_partitions=P)
            check(f"decode {name} P={P}", out, refs, offs)
        del inp, k_op, v_op
    # chunked prefill over a paged prefix, causal, GQA
    nseq, n, cached = (2, 40, 17) if small else (2, 1024, 3000)
    p, inp = paged_cache(nseq, cached + n - 1, 16, 8, 128, h_q=32)
    inp.cache_lengths.fill_(cached)
    k_op, v_op = PagedOperand(inp, p, 0, "k"), PagedOperand(inp, p, 0, "v")
    q = torch.randn(nseq * n, 32, 128, device=DEV).bfloat16()
    offs = torch.arange(nseq + 1, dtype=torch.int32, device=DEV) * n
    refs = reference(q, k_op, v_op, offs, [1], 128**-0.5)
    out = torch.full_like(q, float("nan"))
    M.mha_triton(q, k_op, v_op, offs, out=out)
    check("chunked prefill p16 (bf16 P)", out, refs, offs, dict(abs_tol=4e-3, cos_tol=2e-5))
    M.mha_triton(q, k_op, v_op, offs, out=out, config=MHATuning(prefill=dict(hi_lo=True)))
    check("chunked prefill p16 (hi/lo P)", out, refs, offs)
    del inp, k_op, v_op
    graph_replay(small)


def graph_replay(small):
    """Capture a decode step once, then replay it with refreshed lengths and page tables."""
    if SMOKE:
        return
    b, ctx = 16, 2048
    p, inp = paged_cache(b, ctx, 16, 8, 128, h_q=32)
    k_op, v_op = PagedOperand(inp, p, 0, "k"), PagedOperand(inp, p, 0, "v")
    q = torch.randn(b, 32, 128, device=DEV).bfloat16()
    offs = torch.arange(b + 1, dtype=torch.int32, device=DEV)
    out = torch.empty_like(q)
    M.mha_triton(q, k_op, v_op, offs, out=out, num_partitions=4)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        M.mha_triton(q, k_op, v_op, offs, out=out, num_partitions=4)
    for step in range(3):
        lens = torch.randint(1, ctx, (b,), device=DEV, dtype=torch.int32)
        inp.cache_lengths.copy_(lens)
        inp.lookup_table[:, : inp.lookup_table.shape[1] - 2] = inp.lookup_table[
            torch.randperm(b, device=DEV), : inp.lookup_table.shape[1] - 2
        ]
        q.copy_(torch.randn_like(q))
        out.fill_(float("nan"))
        g.replay()
        refs = reference(q, k_op, v_op, offs, [0, 7, 15], 128**-0.5)
        check(f"graph replay step {step}", out, refs, offs)


# ---------------------------------------------------------------------------------------------
# Launch variants under test (round 4): FP8 per-token decode and bf16 causal prefill
# ---------------------------------------------------------------------------------------------
# "lean": the FP8 fast loop (triton_decode._fp8_fast_loop) with every cut that the offline
# sm_90 SASS showed (python dev/gpu_mha_dev.py --offline): 1410 -> 767 instructions a warp per
# 64 keys, 211 -> 154 registers, 56.8 -> 35.3 KB shared; "trans" also transposes both products
# (keys as the MMA's M, the 4 query heads of a KV head as its N): 652 instructions, half the
# HMMAs, 127 registers. "_P" (not a launch key): num_partitions for the call (None: auto, 1 for
# b64; P=2 doubles the CTAs, ~4 -> ~8 resident a SM).
LEAN = dict(fast=True, addr=2, clamp=True, v_delta=True, v_sel=False, v_perm=True, gp_min=4,
            v_cvt="asm")  # fmt: skip
TRANS = dict(LEAN, trans=True)
FP8_VARIANTS = {  # name -> MHATuning(decode=...) over decode_config(..., "fp8_cols")
    # (round 4 made trans_st4 with Triton's cast the default: the variants below override it)
    "default": {},
    "old_loop": dict(fast=False, num_stages=5),
    "fast": dict(fast=True),
    "lean": LEAN,
    "trans": TRANS,
    "trans_st4": dict(TRANS, num_stages=4),
    "trans_st4_P2": dict(TRANS, num_stages=4, _P=2),
    "trans_w1_st4": dict(TRANS, num_warps=1, num_stages=4),
    "trans_w1_st4_P2": dict(TRANS, num_warps=1, num_stages=4, _P=2),
    "trans_w1_st4_P4": dict(TRANS, num_warps=1, num_stages=4, _P=4),
    "trans_w1_P2": dict(TRANS, num_warps=1, _P=2),
    "trans_w4_st4": dict(TRANS, num_warps=4, num_stages=4),
    "trans_bn128_st4": dict(TRANS, BLOCK_N=128, num_stages=4),
    "trans_bn32": dict(TRANS, BLOCK_N=32),
    "trans_cvt_tl": dict(TRANS, v_cvt="tl"),
    "trans_cvt_int": dict(TRANS, v_cvt="int", k_cvt="int"),
    "trans_gp16": dict(TRANS, gp_min=16),
}
FP8_FAST_SET = ("default", "lean", "trans", "trans_st4_P2", "trans_w1_st4", "trans_w1_st4_P2",
                "trans_cvt_tl")  # fmt: skip
# (tag, batch, keys per request, page): the README's decode configs (32 q / 8 kv heads, d128)
DECODE_CONFIGS = (
    ("b64/4096/p16", 64, 4096, 16),
    ("b64/4096/p64", 64, 4096, 64),
    ("b16/16384/p64", 16, 16384, 64),
    ("b128/2048/p64", 128, 2048, 64),
)
PREFILL_VARIANTS = {  # name -> MHATuning(prefill=...) over prefill_config / SM90_PREFILL*
    # "tl": the tl kernel (offline sm_90: 255 registers, 225 KB shared; 128 x 128 TMA tiles,
    # 8 warps, 3 stages). "default": the library's choice. g_ws=False: the Gluon sm_90 kernel
    # (gluon_prefill) with g_BLOCK_N keys a tile and a g_NBUF-deep ring, filled by TMA boxes
    # where the K/V rows allow (ragged, pages that are multiples of g_BLOCK_N), by cp.async
    # otherwise ("cp": always cp.async).
    "default": {},
    "tl": dict(gluon=False),
    "g128n3": dict(gluon=True, g_ws=False, g_BLOCK_N=128, g_NBUF=3),
    "g64n4": dict(gluon=True, g_ws=False, g_BLOCK_N=64, g_NBUF=4),
    "g64n5": dict(gluon=True, g_ws=False, g_BLOCK_N=64, g_NBUF=5),
    "g64n6": dict(gluon=True, g_ws=False, g_BLOCK_N=64, g_NBUF=6),
    "g64n4cp": dict(gluon=True, g_ws=False, g_BLOCK_N=64, g_NBUF=4, g_tma=False),
    "g128n3cp": dict(gluon=True, g_ws=False, g_BLOCK_N=128, g_NBUF=3, g_tma=False),
    # one warpgroup, 64 query rows a CTA, 112 KB shared: two CTAs a SM
    "w4b64n3": dict(gluon=True, g_ws=False, g_num_warps=4, g_BLOCK_N=64, g_NBUF=3),
    "w4b128n3": dict(gluon=True, g_ws=False, g_num_warps=4, g_BLOCK_N=128, g_NBUF=3),
    "w4b64n4": dict(gluon=True, g_ws=False, g_num_warps=4, g_BLOCK_N=64, g_NBUF=4),
    # warp-specialized (gluon_prefill_ws): TMA producer warp + two consumer warpgroups
    "ws128n2": dict(gluon=True, g_ws=True, g_BLOCK_N=128, g_NBUF=2),
    "ws128n3": dict(gluon=True, g_ws=True, g_BLOCK_N=128, g_NBUF=3),
    "ws64n4": dict(gluon=True, g_ws=True, g_BLOCK_N=64, g_NBUF=4),
    "ws64n6": dict(gluon=True, g_ws=True, g_BLOCK_N=64, g_NBUF=6),
}
PREFILL_FAST_SET = tuple(PREFILL_VARIANTS)
PAGED_PREFILL_SET = ("tl", "g128n3", "g64n4", "g64n5", "g64n4cp", "ws128n2", "ws64n4")
if os.environ.get("PREFILL_SET"):  # e.g. PREFILL_SET=tl,ws128n2: only these variants
    PREFILL_FAST_SET = tuple(os.environ["PREFILL_SET"].split(","))
    PAGED_PREFILL_SET = tuple(n for n in PAGED_PREFILL_SET if n in PREFILL_FAST_SET)
RESULTS: dict = {"decode": {}, "prefill": {}}  # summary inputs: (config, variant) -> record


def decode_suite(tag, b, keys, page, quant, names, parts=None, check_all=True):
    """One cache of `b` requests x `keys` keys (the new token included), NaN in unused pages and
    page tails, random data. Per variant: a run into a NaN-poisoned output checked against
    float64 references of 3 requests (on these very bytes, so no extra compile), then graph /
    eager timing. Results go to RESULTS["decode"][(tag, kind, name)]."""
    kind = "bf16" if quant is None else "fp8"
    if left() < 20:
        print(f"[skip] {kind} {tag}: out of time budget")
        return
    p, inp = paged_cache(b, keys - 1, page, 8, 128, quant, h_q=32)
    k_op, v_op = PagedOperand(inp, p, 0, "k"), PagedOperand(inp, p, 0, "v")
    q = torch.randn(b, 32, 128, device=DEV).bfloat16()
    offs = torch.arange(b + 1, dtype=torch.int32, device=DEV)
    out = torch.empty_like(q)
    nbytes = decode_bytes(b, keys - 1, 32, 8, 128, quant)
    refs = reference(q, k_op, v_op, offs, sorted({0, b // 2, b - 1}), 128**-0.5)
    for name in names:
        if left() < 12:
            print(f"[skip] {kind} {tag} {name}: out of time budget")
            break
        var = dict(FP8_VARIANTS[name]) if quant is not None else {}
        P = var.pop("_P", parts)
        tuning = MHATuning(decode=var)
        key = (tag, kind, name)
        try:
            if check_all:
                out.fill_(float("nan"))
                M.mha_triton(q, k_op, v_op, offs, out=out, num_partitions=P, config=tuning)
                check(f"decode {kind} {tag} {name}", out, refs, offs)
            g, e = time_fn(
                lambda: M.mha_triton(q, k_op, v_op, offs, out=out, num_partitions=P, config=tuning)
            )
        except Exception as ex:
            print(f"[fail] {kind} {tag} {name}: {type(ex).__name__}: {str(ex)[:300]}")
            RESULTS["decode"][key] = dict(error=f"{type(ex).__name__}: {str(ex)[:200]}")
            LOG["decode"].append(dict(tag=tag, kind=kind, name=name, error=str(ex)[:500]))
            continue
        ms = g if g is not None else e
        rec = dict(tag=tag, kind=kind, name=name, var=dict(var), P=P, graph_ms=g, eager_ms=e,
                   gbps=nbytes / ms / 1e6, bytes=nbytes)  # fmt: skip
        rec["frac_copy"] = rec["gbps"] / LOG["env"]["copy_gbps"]
        RESULTS["decode"][key] = rec
        LOG["decode"].append(rec)
        print(
            f"[decode] {kind} {tag:14s} {name:15s}: {ms * 1e3:8.1f} us {rec['gbps']:6.0f} GB/s "
            f"({rec['frac_copy']:.3f} of copy) eager {e * 1e3:.1f} us",
            flush=True,
        )
    save()


def variant_checks(small):
    """Variants on the paths the timed configs do not take: split-K + combine with sinks, a
    sliding window, and the e8m0 / per-tensor scale formats (each a fresh compile)."""
    from pagedattn.ops.masks import sliding_window_causal

    b, keys = (3, 70) if small else (16, 2048)
    names = ("trans",) if small else ("trans", "lean", "trans_w1_st4", "trans_bn32")
    for quant, qname in ((KVQuantConfig.per_token(), "f32"),
                         (KVQuantConfig.per_token(torch.float8_e8m0fnu), "e8m0"),
                         (KVQuantConfig.per_tensor(), "tensor")):  # fmt: skip
        if left() < 30:
            print("[skip] variant checks: out of time budget")
            return
        p, inp = paged_cache(b, keys - 1, 64 if not small else 16, 8, 128, quant, h_q=32)
        k_op, v_op = PagedOperand(inp, p, 0, "k"), PagedOperand(inp, p, 0, "v")
        q = torch.randn(b, 32, 128, device=DEV).bfloat16()
        offs = torch.arange(b + 1, dtype=torch.int32, device=DEV)
        sinks = torch.randn(32, device=DEV)
        rows = sorted({0, b // 2, b - 1})
        refs = reference(q, k_op, v_op, offs, rows, 128**-0.5, sinks)
        win = sliding_window_causal(300 if not small else 20)
        refs_w = reference(q, k_op, v_op, offs, rows, 128**-0.5, mask=win)
        for name in names if qname == "f32" else names[:1]:
            tuning = MHATuning(decode={k: v for k, v in FP8_VARIANTS[name].items() if k != "_P"})
            try:
                out = torch.full_like(q, float("nan"))
                M.mha_triton(
                    q, k_op, v_op, offs, out=out, sinks=sinks, num_partitions=4, config=tuning
                )
                check(f"decode fp8-{qname} {name} P=4 sinks", out, refs, offs)
                out = torch.full_like(q, float("nan"))
                M.mha_triton(q, k_op, v_op, offs, out=out, mask=win, config=tuning)
                check(f"decode fp8-{qname} {name} window", out, refs_w, offs)
            except Exception as ex:
                TABLE.append(f"CHECK CRASHED {qname} {name}: {type(ex).__name__}: {str(ex)[:150]}")
                print(f"[fail] checks {qname} {name}: {type(ex).__name__}: {str(ex)[:300]}")
        del inp, k_op, v_op


def prefill_suite(names, small):
    """Causal bf16 prefill, 32 heads d128, ragged K/V: per variant a check on 2 x 1024 tokens
    (same compile as the timed shape) against float64, then timing of 8 x 4096."""
    nseq, n = (1, 200) if small else (8, 4096)
    cn = 40 if small else 1024
    qc = torch.randn(2 * cn, 32, 128, device=DEV).bfloat16()
    oc = torch.arange(3, dtype=torch.int32, device=DEV) * cn
    kc, vc = torch.randn_like(qc), torch.randn_like(qc)
    kco, vco = RaggedOperand(kc, oc), RaggedOperand(vc, oc)
    refs = reference(qc, kco, vco, oc, [1], 128**-0.5)
    q = torch.randn(nseq * n, 32, 128, device=DEV).bfloat16()
    offs = torch.arange(nseq + 1, dtype=torch.int32, device=DEV) * n
    k, v = torch.randn_like(q), torch.randn_like(q)
    k_op, v_op = RaggedOperand(k, offs), RaggedOperand(v, offs)
    out = torch.empty_like(q)
    flops = 4 * nseq * 32 * 128 * n * (n + 1) / 2
    for name in names:
        if left() < 15:
            print(f"[skip] prefill {name}: out of time budget")
            break
        tuning = MHATuning(prefill=PREFILL_VARIANTS[name])
        try:
            oc_out = torch.full_like(qc, float("nan"))
            M.mha_triton(qc, kco, vco, oc, out=oc_out, config=tuning)
            check(f"prefill {name}", oc_out, refs, oc, dict(abs_tol=4e-3, cos_tol=2e-5))
            g, e = time_fn(lambda: M.mha_triton(q, k_op, v_op, offs, out=out, config=tuning))
        except Exception as ex:
            print(f"[fail] prefill {name}: {type(ex).__name__}: {str(ex)[:300]}")
            RESULTS["prefill"][name] = dict(error=f"{type(ex).__name__}: {str(ex)[:200]}")
            continue
        ms = g if g is not None else e
        rec = dict(name=name, var=dict(PREFILL_VARIANTS[name]), graph_ms=g, eager_ms=e,
                   tflops=flops / ms / 1e9)  # fmt: skip
        RESULTS["prefill"][name] = rec
        LOG["prefill"].append(rec)
        print(f"[prefill] {name:10s}: {ms:8.3f} ms {rec['tflops']:6.1f} TFLOP/s", flush=True)
    save()


def page_order_diagnostic():
    """FP8 default at b64/4096: p16 vs p64 (same code, same grid) with shuffled and with
    in-order pages, timed back to back (is the p64 gap a memory-layout effect or drift?)."""
    for page in (16, 64):
        if left() < 15:
            return
        p, inp = paged_cache(64, 4095, page, 8, 128, KVQuantConfig.per_token(), h_q=32,
                             nan_pool=False)  # fmt: skip
        k_op, v_op = PagedOperand(inp, p, 0, "k"), PagedOperand(inp, p, 0, "v")
        q = torch.randn(64, 32, 128, device=DEV).bfloat16()
        offs = torch.arange(65, dtype=torch.int32, device=DEV)
        out = torch.empty_like(q)
        lut = inp.lookup_table
        n = 4096 // page
        for order in ("shuffled", "in-order", "shuffled again"):
            if order == "in-order":
                lut[:, :n] = torch.arange(64 * n, device=DEV, dtype=torch.int32).view(64, n)
            elif order == "shuffled again":
                lut[:, :n] = torch.randperm(64 * n, device=DEV).int().view(64, n)
            for name in ("default", "trans"):
                tuning = MHATuning(decode=FP8_VARIANTS[name])
                g, e = time_fn(
                    lambda k=k_op, v=v_op: M.mha_triton(q, k, v, offs, out=out, config=tuning)
                )
                line = f"fp8 p{page} {order:15s} {name:8s}: graph {g * 1e3:7.1f} us"
                line += f" eager {e * 1e3:7.1f} us"
                LOG.setdefault("page_order", []).append(line)
                print(f"[diag] {line}", flush=True)
        del inp, k_op, v_op
        if not SMOKE:
            torch.cuda.empty_cache()


def summary():
    """The tables printed last: FP8 decode time and speed vs bf16 per config and variant;
    prefill TFLOP/s per variant; failed checks."""
    lines = []
    dec = RESULTS["decode"]
    tags = [t for t, *_ in DECODE_CONFIGS]
    best = lambda r: min(x for x in (r["graph_ms"], r["eager_ms"]) if x)  # noqa: E731
    hdr = f"{'variant':15s}" + "".join(f"{t:>22s}" for t in tags) + "   min ratio"
    lines += ["==== FP8 per-token decode: us (speed vs bf16; target >= 1.70) ====", hdr]
    bf = {t: dec.get((t, "bf16", "default")) for t in tags}
    row = f"{'bf16 default':15s}"
    for t in tags:
        r = bf[t]
        row += f"{(f'{best(r) * 1e3:.1f}' if r and 'error' not in r else '-'):>22s}"
    lines.append(row)
    for name in FP8_VARIANTS:
        cells, ratios = [], []
        for t in tags:
            r = dec.get((t, "fp8", name))
            if r is None:
                cells.append("-")
            elif "error" in r:
                cells.append("ERROR")
            else:
                b = bf[t]
                ratio = best(b) / best(r) if b and "error" not in b else float("nan")
                ratios.append(ratio)
                cells.append(f"{best(r) * 1e3:.1f} ({ratio:.2f})")
        if all(c == "-" for c in cells):
            continue
        mr = f"{min(ratios):.2f}" if ratios else "-"
        lines.append(f"{name:15s}" + "".join(f"{c:>22s}" for c in cells) + f"   {mr}")
    lines += ["==== causal prefill 8 x 4096, 32 heads, d128, bf16 (target 450 TFLOP/s) ===="]
    for name, r in RESULTS["prefill"].items():
        if "error" in r:
            lines.append(f"{name:15s} ERROR {r['error'][:100]}")
        else:
            lines.append(f"{name:15s} {best(r):8.3f} ms {r['tflops']:7.1f} TFLOP/s  {r['var']}")
    bad = [c for c in LOG["checks"] if not c["ok"]]
    lines.append(f"checks: {len(LOG['checks']) - len(bad)} ok, {len(bad)} failed")
    lines += [f"  FAILED {c['name']}: {c['error'][:160]}" for c in bad]
    return lines


# ---------------------------------------------------------------------------------------------
# Offline sm_90 compile report
# ---------------------------------------------------------------------------------------------
def _sass_loop_stats(cubin) -> dict:
    """Instruction mix of the hot loop (the backward branch whose body holds the most MMAs) of
    a cubin, from cuobjdump -sass (Triton's bundled copy); {} when unavailable."""
    import re
    import subprocess
    import tempfile

    tool = os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin/cuobjdump")
    if not cubin or not os.path.exists(tool):
        return {}
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        sass = subprocess.run([tool, "-sass", f.name], capture_output=True, text=True).stdout
    ins = []
    for line in sass.splitlines():
        m = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(@!?U?P\w+\s+)?([A-Z0-9_.]+)(.*?);", line)
        if m:
            ins.append((int(m.group(1), 16), m.group(3), m.group(4)))
    best = None
    for a, op, rest in ins:
        t = re.search(r"0x([0-9a-f]+)", rest) if op.startswith("BRA") else None
        if t and int(t.group(1), 16) < a:
            lo = int(t.group(1), 16)
            body = [o for x, o, _ in ins if lo <= x <= a]
            n = sum(o.startswith(("HMMA", "HGMMA")) for o in body)
            if best is None or n > best[0]:
                best = (n, body)
    if not best:
        return {}
    body = best[1]
    cls = {"mma": ("HMMA", "HGMMA"), "mov": ("IMAD.MOV", "MOV"), "f2fp": ("F2FP",),
           "prmt_sel": ("PRMT", "SEL"), "lds": ("LDS", "LDSM"), "sts": ("STS",),
           "ldgsts": ("LDGSTS",), "mufu": ("MUFU",), "bar": ("BAR",)}  # fmt: skip
    out = {"loop": len(body)}
    for k, pre in cls.items():
        out[k] = sum(o.startswith(pre) for o in body)
    return out


def offline():
    """Offline sm_90 compiles (any machine) of the kernels `mha_triton` launches for the cases
    below, with the Gluon sm_90 prefill taken where an H100 takes it: one row of resources
    (ptxas -v, PTX and SASS counts) a launch."""
    import re
    import subprocess
    import tempfile

    from pagedattn.ops import offline

    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin/ptxas")

    def compiled(call):
        rows = []
        h100 = dict(device_facts=lambda d: Device(True, num_sms(d), fast_hbm(d)))  # sm_90
        for launch in offline.capture(M, call, **h100):
            ck = offline.compile_sm90(launch)
            ptx = ck.asm["ptx"]
            with tempfile.TemporaryDirectory() as t:
                f = os.path.join(t, "k.ptx")
                open(f, "w").write(ptx)
                r = subprocess.run([ptxas, "-arch=sm_90a", "-v", f, "-o", f + ".o"],
                                   capture_output=True, text=True)  # fmt: skip
            info = r.stderr
            loop = _sass_loop_stats(ck.asm.get("cubin"))
            regs = re.search(r"Used (\d+) registers", info)
            spills = re.search(r"(\d+) bytes spill stores", info)
            rows.append(dict(
                kernel=launch.name, shared=ck.metadata.shared,
                regs=int(regs.group(1)) if regs else None,
                spill_stores=int(spills.group(1)) if spills else None,
                ptxas_warnings=re.findall(r"warning.*", info),
                wgmma=len(re.findall(r"wgmma.mma_async", ptx)),
                mma_sync=len(re.findall(r"\bmma.sync", ptx)),
                cp_async=len(re.findall(r"cp.async.c[ag]", ptx)),
                tma=len(re.findall(r"cp.async.bulk.tensor", ptx)),
                **loop,
            ))  # fmt: skip
        return rows

    pt = KVQuantConfig.per_token()
    cases = [
        ("decode bf16 p16", dict(page=16, qlen=1, quant=None)),
        ("decode bf16 p64 tma", dict(page=64, qlen=1, quant=None, over=dict(tma=True))),
        ("decode fp8 per-token", dict(page=16, qlen=1, quant=KVQuantConfig.per_token())),
        ("decode fp8 G32", dict(page=16, qlen=1, quant=KVQuantConfig.blockwise(32))),
        *[
            (f"decode fp8 p{pg} {n}", dict(page=pg, qlen=1, quant=pt, over=FP8_VARIANTS[n]))
            for pg in (16, 64)
            for n in ("fast", "lean", "trans", "trans_st4", "trans_w1_st4", "trans_cvt_tl")
        ],
        ("prefill sm90 p64 BN128", dict(page=64, qlen=512, quant=None)),
        (
            "prefill sm90 p16 BN64",
            dict(page=16, qlen=512, quant=None, over=dict(g_ws=False, g_BLOCK_N=64, g_NBUF=5)),
        ),  # fmt: skip
        (
            "prefill sm90 w4 p16 sinks lse",
            dict(
                page=16,
                qlen=512,
                quant=None,
                over=PREFILL_VARIANTS["w4b64n3"],
                kw=dict(sinks=True, return_lse=True),
            ),
        ),
        ("prefill bf16 p64 (tma)", dict(page=64, qlen=512, quant=None, over=dict(gluon=False))),
        ("prefill ragged", dict(page=0, qlen=512, quant=None, over=dict(gluon=False))),
        ("prefill ragged gluon tma", dict(page=0, qlen=512, quant=None)),
        ("prefill sm90 p64 tma", dict(page=64, qlen=512, quant=None)),
        ("prefill sm90 ws p16 (a box a page)", dict(page=16, qlen=512, quant=None)),
    ]
    for name, c in cases:
        b, d = 2, 128
        if c["page"] == 0:  # ragged K/V
            q = torch.empty(b * c["qlen"], 32, d, dtype=torch.bfloat16)
            kv = torch.empty(b * c["qlen"], 8, d, dtype=torch.bfloat16)
            offs = torch.arange(b + 1, dtype=torch.int32) * c["qlen"]
            tuning = MHATuning(prefill=c.get("over", {}))
            rows = compiled(
                lambda: M.mha_triton(
                    q, RaggedOperand(kv, offs), RaggedOperand(kv, offs), offs, config=tuning
                )
            )
            for f in rows:
                print(f"{name:26s} {f}")
            continue
        p = KVCacheParams(torch.bfloat16, 1, 8, d, c["page"], num_q_heads=32,
                          quantization=c["quant"])  # fmt: skip
        cols = math.ceil((4096 + c["qlen"]) / c["page"])
        buf = allocate_buffers(p, b * cols + 1)
        inp = KVCacheInputsPerDevice(
            buf.kv_blocks, torch.full((b,), 4096, dtype=torch.int32),
            torch.zeros(b, cols, dtype=torch.int32), torch.zeros(1, 2, dtype=torch.int32),
            buf.kv_scales,
        )  # fmt: skip
        q = torch.empty(b * c["qlen"], 32, d, dtype=torch.bfloat16)
        offs = torch.arange(b + 1, dtype=torch.int32) * c["qlen"]
        over = c.get("over", {})
        tuning = MHATuning(decode=over) if c["qlen"] == 1 else MHATuning(prefill=over)
        kw = dict(c.get("kw", {}))
        if kw.pop("sinks", False):
            kw["sinks"] = torch.zeros(32)
        rows = compiled(
            lambda: M.mha_triton(
                q,
                PagedOperand(inp, p, 0, "k"),
                PagedOperand(inp, p, 0, "v"),
                offs,
                num_partitions=1,
                config=tuning,
                **kw,
            )  # fmt: skip
        )
        for f in rows:
            print(f"{name:26s} {f}")


# ---------------------------------------------------------------------------------------------
def stage_sweep():
    """bf16 and FP8 per-token decode at the README shapes (and page 1): pipeline stages 3-5
    and, where the grid is under 3 CTAs a SM, the partition count around the heuristic's."""
    pt = KVQuantConfig.per_token()
    shapes = [(t, b, k, p) for t, b, k, p in DECODE_CONFIGS] + [("b64 ctx4096 p1", 64, 4096, 1)]
    for tag, b, keys, page in shapes:
        parts = (None, 1, 3, 4) if b <= 16 else (None,)
        for quant, stages in ((None, (4, 5)), (pt, (3, 4, 5))):
            if quant is not None and page == 1:
                continue
            name = f"{tag} {'fp8' if quant is not None else 'bf16'}"
            run_decode(name, b, keys, page, 32, 8, 128, quant,
                       [dict(num_stages=n) for n in stages], parts)  # fmt: skip
    save()
    for line in TABLE:
        print(line)


def main():
    if OFFLINE:
        offline()
        return
    if STAGES:
        LOG["env"]["copy_gbps"] = copy_gbps()
        stage_sweep()
        return
    if not SMOKE:
        props = torch.cuda.get_device_properties(0)
        LOG["env"].update(
            device=props.name, sms=props.multi_processor_count, torch=torch.__version__,
            triton=triton.__version__,
        )  # fmt: skip
    LOG["env"]["copy_gbps"] = copy_gbps()
    print(f"[env] {LOG['env']} fast={FAST_RUN} budget={BUDGET:.0f} s", flush=True)
    TABLE.append(f"copy ceiling {LOG['env']['copy_gbps']:.0f} GB/s")
    if not FAST_RUN:
        try:
            correctness(SMOKE)
        except Exception as e:
            import traceback

            traceback.print_exc()
            TABLE.append(f"CORRECTNESS CRASHED: {type(e).__name__}: {str(e)[:200]}")
        print(f"[time] correctness done at {time.time() - T0:.0f} s", flush=True)
        save()
    sm = SMOKE
    # Round 4 (H100): FP8 per-token decode variants at the four README configs (each variant
    # checked on the timed bytes first), bf16 baselines for the speed ratio, then prefill.
    configs = [
        (tag, (2, 300, page) if sm else (b, keys, page)) for tag, b, keys, page in DECODE_CONFIGS
    ]
    if sm:
        configs = configs[:2]
    pt = KVQuantConfig.per_token()
    names = FP8_FAST_SET if FAST_RUN else tuple(FP8_VARIANTS)
    if sm:
        names = tuple(n for n in names if n not in ("trans_bn128_st4", "trans_w4_st4"))
    for i, (tag, (b, keys, page)) in enumerate([] if PREFILL_ONLY else configs):
        decode_suite(tag, b, keys, page, None, ("default",))
        if not sm:
            torch.cuda.empty_cache()
        if i < 2:
            run = names
        else:  # the default and the four fastest variants of the first two configs
            score = {}
            for n in names:
                rs = [RESULTS["decode"].get((t, "fp8", n)) for t, _ in configs[:2]]
                if n != "default" and all(r and "error" not in r for r in rs):
                    score[n] = math.prod(r["graph_ms"] or r["eager_ms"] for r in rs)
            run = ("default", *sorted(score, key=score.get)[:4])
        decode_suite(tag, b, keys, page, pt, run)
        if not sm:
            torch.cuda.empty_cache()
        print(f"[time] {tag} done at {time.time() - T0:.0f} s", flush=True)
    prefill_suite(PREFILL_FAST_SET if FAST_RUN else tuple(PREFILL_VARIANTS), sm)
    if PREFILL_ONLY:  # the same causal prefill over a paged cache (GQA 32/8), per page size
        for page in (16, 64, 128):
            vs = [PREFILL_VARIANTS[n] for n in PAGED_PREFILL_SET]
            n = 200 if sm else 4096
            run_prefill(f"paged p{page} 32/8", 1 if sm else 8, n, 32, 8, 128, page, vs)
    print(f"[time] prefill done at {time.time() - T0:.0f} s", flush=True)
    try:
        if not PREFILL_ONLY:
            variant_checks(sm)
    except Exception as e:
        import traceback

        traceback.print_exc()
        TABLE.append(f"VARIANT CHECKS CRASHED: {type(e).__name__}: {str(e)[:200]}")
    if not FAST_RUN and not sm:
        page_order_diagnostic()
    if LEGACY:
        legacy_sweeps(sm)
    save()
    print("\n==== summary (graph-replay medians; details in $OUT/gpu_mha_dev.json) ====")
    for line in TABLE:
        print(line)
    for line in LOG.get("page_order", []):
        print(line)
    for line in summary():
        print(line)
    print(f"total {time.time() - T0:.0f} s")


def legacy_sweeps(sm):
    """Rounds 1-3 (H200): the other formats, d96 and paged prefill (with --legacy only)."""
    b, ctx = (2, 300) if sm else (64, 4096)
    e8, g64 = KVQuantConfig.per_token(torch.float8_e8m0fnu), KVQuantConfig.blockwise(64)
    fv = FP8_VARIANTS["trans"]
    run_decode("bf16 b64 ctx4096 p1", b, ctx, 1, 32, 8, 128, variants=({},))
    run_decode("bf16 b64 ctx4096 p64 d96", b, ctx, 64, 32, 8, 96,
               variants=({}, dict(BLOCK_N=64), dict(BLOCK_N=32, num_warps=2)),
               parts=(None, 2))  # fmt: skip
    run_decode("fp8 tok-e8m0 b64 ctx4096 p64", b, ctx, 64, 32, 8, 128, e8, variants=({}, fv))
    run_decode("fp8 per-tensor b64 ctx4096 p64", b, ctx, 64, 32, 8, 128,
               KVQuantConfig.per_tensor(), variants=({}, fv))  # fmt: skip
    run_decode("fp8 G64-f32 b64 ctx4096 p64", b, ctx, 64, 32, 8, 128, g64,
               variants=({}, dict(hi_lo=False)))  # fmt: skip
    nseq, n = (1, 200) if sm else (8, 4096)
    run_prefill("prefill GQA 32/8 8x4096", nseq, n, 32, 8, 128, variants=({},))
    run_prefill("prefill paged p128 32/8", nseq, n, 32, 8, 128, page=128, variants=({},))
    run_prefill("prefill paged p64 32/8", nseq, n, 32, 8, 128, page=64, variants=({},))
    run_prefill("prefill paged p16 32/8", nseq, n, 32, 8, 128, page=16, variants=({},))
    run_prefill("prefill fp8 tok p128 32/8", nseq, n, 32, 8, 128, page=128,
                quant=KVQuantConfig.per_token(),
                variants=({}, dict(BLOCK_M=64, BLOCK_N=64, num_warps=4)))  # fmt: skip


if __name__ == "__main__":
    main()
