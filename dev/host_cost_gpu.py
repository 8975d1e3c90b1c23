"""Host cost of one eager decode call on the GPU machine, MHA and MLA: the public op (prepared
calls, `ops.prepared`) against its full path, and FlashInfer's run() on the same shapes.

    . dev/probe_env.sh && python dev/host_cost_gpu.py [--calls 200] [--rounds 5]
        [--op mha|step|fused|mla] [--quick]

MHA (`pagedattn.mha` against `mha_triton`, torch SDPA and FlashInfer's
BatchDecodeWithPagedKVCacheWrapper.run()): the suite's host-cost case (bench/bench_real.py
"host mha"): decode, GQA 32/8 heads, d128, pages of 16, bf16, 1024 keys a request, b in (1, 8,
64). MLA (`pagedattn.mla_decode` against `mla_decode_triton` and FlashInfer's
BatchMLAPagedAttentionWrapper(fa3).run()): bench_real.py's "host mla" cases, h_q 16, d_qk 576 /
d_v 512, pages of 64, bf16, 1024 keys a request, b in (1, 8), and h_q 128 b8 (the TMA-fed
seesaw, whose descriptors a prepared call re-encodes per cache pointer). A row's number is
wall time per call of --calls eager calls and one synchronize, best of --rounds (rows
alternate within a round: the host's speed drifts).

Checks first, on random data: prepared calls (hits: other q, other lengths, other out, out
given and not, an LSE, split-K, sinks) equal the full path's bytes; a prepared call captured in
a CUDA graph and replayed with new q and lengths does too; the output is close to a float32
reference. MLA checks every kernel family an H200 plans (`MLA_CHECKS`: keys-as-M + work-list
combine, split-K, TMA-fed seesaw, seesaw, keys-as-M FP8, 64-row FP8, the 2-CTA cluster seesaw
over sparse V32, the persistent kernel) and that each signature was prepared (not left on the
full path). A mismatch is printed and the script exits 1.

Rows:
- `mha (prepared), out given` / `out=None`, `mla_decode (prepared), ...`: the public op, its
  signature prepared (hits);
- `mha_triton (full path)` / `mla_decode_triton (full path)`: the same op without the cache
  (checks, plan, Triton launches);
- `... args only (no launch)`: the prepared lookup and argument packing with the launcher
  replaced by a no-op (what of the prepared row is Python);
- `torch SDPA (dense K/V)`: scaled_dot_product_attention over K/V gathered once (MHA);
- `FlashInfer run()`: the wrapper planned once (skipped when flashinfer does not import).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(_ROOT, "src"))

import torch  # noqa: E402

from pagedattn import KVCacheParams, KVQuantConfig, PagedOperand, mha, store_kv  # noqa: E402
from pagedattn.ops import prepared as PR  # noqa: E402
from pagedattn.ops.mha import StepPlan  # noqa: E402
from pagedattn.ops.mha import triton_mha as TM  # noqa: E402
from pagedattn.ops.mla import mla_decode  # noqa: E402
from pagedattn.ops.mla import triton_mla as TMLA  # noqa: E402
from pagedattn.testing import make_paged_cache, ragged_offsets  # noqa: E402

H_Q, H_KV, D, PAGE, CTX = 32, 8, 128, 16, 1024
WS_BYTES = 256 * 2**20  # FlashInfer workspace


def wall_us(fn, calls: int) -> float:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / calls * 1e6


def page_lists(lut: torch.Tensor, seq: list[int], page: int):
    """FlashInfer's (indptr, indices, last_page_len) cut from pagedattn's lookup table."""
    dev = lut.device
    n = torch.tensor([-(-s // page) for s in seq], dtype=torch.int32, device=dev)
    indptr = torch.zeros(len(seq) + 1, dtype=torch.int32, device=dev)
    indptr[1:] = torch.cumsum(n, 0)
    cols = torch.arange(lut.shape[1], device=dev)
    indices = lut[cols[None, :] < n[:, None]].contiguous()
    last = torch.tensor([(s - 1) % page + 1 for s in seq], dtype=torch.int32, device=dev)
    return indptr, indices, last


def dense_kv(pool: torch.Tensor, indptr, indices, n: int, b: int):
    """[b, h_kv, n, d] K and V gathered from FlashInfer's page lists (pool [P, 2, page, h, d])."""
    kp = indptr.tolist()
    return (
        torch.stack(
            [pool[indices[kp[r] : kp[r + 1]].long(), j].flatten(0, 1)[:n] for r in range(b)]
        ).transpose(1, 2).contiguous()
        for j in (0, 1)
    )  # fmt: skip


def bitwise_equal(a, b) -> bool:
    a = a if isinstance(a, tuple) else (a,)
    b = b if isinstance(b, tuple) else (b,)
    return all(torch.equal(x.isnan(), y.isnan()) and torch.equal(x.nan_to_num(), y.nan_to_num())
               for x, y in zip(a, b))  # fmt: skip


def check_prepared(b: int, k, v, inputs, offs, scale: float) -> list[str]:
    """Prepared hits against the full path on fresh random data; returns the failures."""
    bad = []
    g = torch.Generator(device="cuda").manual_seed(b)
    full_lens = inputs.cache_lengths.clone()
    for step in range(6):
        q = torch.randn(b, H_Q, D, device="cuda", dtype=torch.bfloat16, generator=g)
        lens = torch.randint(0, CTX, (b,), device="cuda", generator=g, dtype=torch.int32)
        inputs.cache_lengths.copy_(torch.minimum(lens, full_lens))
        for kw in (dict(), dict(return_lse=True), dict(num_partitions=3)):
            for out in (None, torch.full((b, H_Q, D), float("nan"), device="cuda",
                                         dtype=torch.bfloat16)):  # fmt: skip
                got = mha(q, k, v, offs, scale=scale, out=out, **kw)
                want = TM.mha_triton(q, k, v, offs, scale=scale, **kw)
                if not bitwise_equal(got, want):
                    bad.append(f"b{b} step {step} {kw} out {'given' if out is not None else None}")
    inputs.cache_lengths.copy_(full_lens)
    return bad


def check_graph(b: int, k, v, inputs, offs, scale: float) -> list[str]:
    """A prepared call captured in a CUDA graph (its partials then come from the graph's pool)
    and replayed with new q and lengths equals the full path; eager hits after it too."""
    bad = []
    g = torch.Generator(device="cuda").manual_seed(100 + b)
    full_lens = inputs.cache_lengths.clone()
    q = torch.randn(b, H_Q, D, device="cuda", dtype=torch.bfloat16, generator=g)
    out = torch.empty_like(q)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm on a side stream, as torch.cuda.graph asks
        for _ in range(3):
            mha(q, k, v, offs, scale=scale, out=out)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        mha(q, k, v, offs, scale=scale, out=out)
    for step in range(4):
        q.copy_(torch.randn(q.shape, device="cuda", generator=g))
        lens = torch.randint(0, CTX, (b,), device="cuda", generator=g, dtype=torch.int32)
        inputs.cache_lengths.copy_(torch.minimum(lens, full_lens))
        graph.replay()
        want = TM.mha_triton(q, k, v, offs, scale=scale)
        if not bitwise_equal(out, want):
            bad.append(f"b{b} graph replay {step}")
        if not bitwise_equal(mha(q, k, v, offs, scale=scale), want):
            bad.append(f"b{b} eager hit after replay {step}")
    inputs.cache_lengths.copy_(full_lens)
    return bad


def mha_main(a, fi) -> list[str]:
    """The MHA rows and checks; returns the failures."""
    failures, table = [], []
    for b in (1, 8, 64):
        torch.manual_seed(b)
        p = KVCacheParams(torch.bfloat16, 1, H_KV, D, PAGE, num_q_heads=H_Q, devices=["cuda"])
        pc = make_paged_cache(p, [CTX - 1] * b, [1] * b, device="cuda",
                              generator=torch.Generator().manual_seed(b))  # fmt: skip
        pc.inputs.kv_blocks.normal_()
        inp = pc.inputs
        k, v = PagedOperand(inp, p, 0, "k"), PagedOperand(inp, p, 0, "v")
        offs = torch.arange(b + 1, dtype=torch.int32, device="cuda")
        q = torch.randn(b, H_Q, D, device="cuda", dtype=torch.bfloat16)
        out = torch.empty_like(q)
        scale = D**-0.5
        failures += check_prepared(b, k, v, inp, offs, scale)
        failures += check_graph(b, k, v, inp, offs, scale)

        pool = inp.kv_blocks[:, :, 0]
        indptr, indices, last = page_lists(inp.lookup_table, [CTX] * b, PAGE)
        kd, vd = dense_kv(pool, indptr, indices, CTX, b)
        q4 = q.view(b, H_Q, 1, D)
        sdpa = lambda: torch.nn.functional.scaled_dot_product_attention(  # noqa: E731
            q4, kd, vd, scale=scale, enable_gqa=True
        )
        # the float32 reference of this call, over the dense K/V
        ref = torch.nn.functional.scaled_dot_product_attention(
            q4.float(), kd.float(), vd.float(), scale=scale, enable_gqa=True
        ).view(b, H_Q, D)
        got = mha(q, k, v, offs, scale=scale, out=out).float()
        cos = float((got * ref).sum() / (got.norm() * ref.norm()))
        if not cos > 0.99999:
            failures.append(f"b{b}: mha off the float32 reference (cosine {cos:.7f})")

        rows = {
            "mha (prepared), out given": lambda: mha(q, k, v, offs, scale=scale, out=out),
            "mha (prepared), out=None": lambda: mha(q, k, v, offs, scale=scale),
            "mha_triton (full path)": lambda: TM.mha_triton(q, k, v, offs, scale=scale, out=out),
            "torch SDPA (dense K/V)": sdpa,
        }
        if fi is not None:
            try:
                ws = torch.empty(WS_BYTES, dtype=torch.uint8, device="cuda")
                w = fi.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD", use_tensor_cores=True)
                w.plan(indptr, indices, last, H_Q, H_KV, D, PAGE, q_data_type=torch.bfloat16,
                       kv_data_type=torch.bfloat16)  # fmt: skip
                fo = w.run(q, pool)
                fo = fo[0] if isinstance(fo, tuple) else fo
                c = float((fo.float() * ref).sum() / (fo.float().norm() * ref.norm()))
                print(f"b{b} FlashInfer cosine vs reference {c:.7f}")
                rows["FlashInfer run()"] = lambda w=w: w.run(q, pool)
            except Exception as e:  # JIT or API failure: the row is left out
                print(f"b{b} FlashInfer failed: {type(e).__name__}: {e}")
        for fn in rows.values():  # warm: compiles, plans, the prepared entry
            for _ in range(20):
                fn()
        best = dict.fromkeys(rows, math.inf)
        for _ in range(a.rounds):
            for name, fn in rows.items():
                best[name] = min(best[name], wall_us(fn, a.calls))
        # the Python of a prepared call: the launchers replaced by no-ops (nothing runs)
        key, src = TM._signature(q, k, v, offs, None, scale, None, None, False, out, None)
        cands = TM.PREPARED.cache.candidates(key) or [(None, None, None)]
        entry = cands[0][2]
        if entry is None:
            failures.append(f"b{b}: the decode call was not prepared")
            continue
        saved = [(x, x.fast) for x in entry.launches]
        for x, _ in saved:
            x.fast = lambda stream, P, g=None: None
        try:
            py = min(wall_us(lambda: mha(q, k, v, offs, scale=scale, out=out), a.calls)
                     for _ in range(a.rounds))  # fmt: skip
        finally:
            for x, f in saved:
                x.fast = f
        best["mha args only (no launch)"] = py
        best["  of which: torch.empty(out)"] = min(
            wall_us(lambda: torch.empty((b, H_Q, D), dtype=torch.bfloat16, device="cuda"),
                    a.calls) for _ in range(a.rounds)
        )  # fmt: skip
        for name, us in best.items():
            table.append((b, name, us))
            print(f"b{b:<3d} {name:32s} {us:8.1f}", flush=True)
        print(
            f"b{b} launches a prepared call makes: "
            f"{len(entry.launches)}; prepared entries {len(TM.PREPARED.cache)}"
        )
    print("\nhost cost per eager call (us)")
    names = list(dict.fromkeys(n for _, n, _ in table))
    print(f"{'':32s}" + "".join(f"{'b' + str(b):>10s}" for b in (1, 8, 64)))
    for n in names:
        vals = {b: us for b, m, us in table if m == n}
        print(f"{n:32s}" + "".join(f"{vals.get(b, math.nan):10.1f}" for b in (1, 8, 64)))
    PR.release_workspaces()
    return failures


# --------------------------------------------------------------------------------------------
# An engine's layer calls (mha with num_decodes and a step plan)
# --------------------------------------------------------------------------------------------
def step_main(a) -> list[str]:
    """Wall time of an engine layer's `mha(..., num_decodes=D, plan=step plan)` (prepared)
    against its full path (`mha_mixed_triton`): a mixed step (56 decodes, 4 prefill chunks of
    16 over 64 cached) and a decode step (64 requests), 64-160 keys a decode (so that the
    device's work, ~10 us, stays under the host's), the plan made from host lengths once (as
    a step's first layer does); first, hits equal the full path bitwise. Returns the
    failures."""
    failures = []
    for name, nd, chunks in (("mixed step", 56, 4), ("decode step", 64, 0)):
        lens = [63 + 16 * (i % 7) for i in range(nd)] + [64] * chunks
        q_lens = [1] * nd + [16] * chunks
        p = KVCacheParams(torch.bfloat16, 1, H_KV, D, PAGE, num_q_heads=H_Q, devices=["cuda"])
        pc = make_paged_cache(p, lens, q_lens, device="cuda",
                              generator=torch.Generator().manual_seed(nd))  # fmt: skip
        pc.inputs.kv_blocks.normal_()
        k, v = PagedOperand(pc.inputs, p, 0, "k"), PagedOperand(pc.inputs, p, 0, "v")
        offs = ragged_offsets(q_lens, "cuda")
        q = torch.randn(int(offs[-1]), H_Q, D, device="cuda", dtype=torch.bfloat16)
        plan = StepPlan(lens[:nd])
        for _ in range(3):
            got = mha(q, k, v, offs, num_decodes=nd, plan=plan, return_lse=True)
            want = TM.mha_mixed_triton(q, k, v, offs, nd, plan=plan, return_lse=True)
            if not bitwise_equal(got, want):
                failures.append(f"{name}: a prepared call differs from the full path")
        rows = {
            "mha (prepared)": lambda: mha(q, k, v, offs, num_decodes=nd, plan=plan),
            "mha_mixed_triton (full path)": lambda: TM.mha_mixed_triton(q, k, v, offs, nd,
                                                                        plan=plan),
        }  # fmt: skip
        for fn in rows.values():
            for _ in range(20):
                fn()
        best = dict.fromkeys(rows, math.inf)
        for _ in range(a.rounds):
            for n, fn in rows.items():
                best[n] = min(best[n], wall_us(fn, a.calls))
        key, _ = TM._signature(q, k, v, offs, None, None, None, None, False, None, None, nd,
                               plan)  # fmt: skip
        cands = TM.PREPARED.cache.candidates(key) or [(None, None, None)]
        if cands[0][2] is None:
            failures.append(f"{name}: not prepared")
        for n, us in best.items():
            print(f"{name} ({nd} decodes, {chunks} chunks) {n:30s} {us:8.1f}", flush=True)
    PR.release_workspaces()
    return failures


# --------------------------------------------------------------------------------------------
# The small ops a layer calls (their launch is their host path: `prepared.cached_launch`)
# --------------------------------------------------------------------------------------------
def fused_main(a) -> list[str]:
    """Wall time of the public small ops an engine layer calls (Llama-3.2-1B widths, 64
    tokens: rms_norm with and without a residual, rope_qkv, silu_mul, store_kv,
    rope_store_kv, argmax_rows), each as shipped (its prepared call, `ops.prepared.PreparedOp`),
    with the prepared calls off (the full path, through `prepared.cached_launch`) and with
    `ops.launch.launch` instead of that too (the ops' module attributes swapped), rows
    alternating within a round; first, the three give the same bytes. Returns the failures."""
    from pagedattn.ops import launch as L
    from pagedattn.ops import prepared as P
    from pagedattn.ops.fused import argmax_rows, rms_norm, rope_qkv, silu_mul
    from pagedattn.ops.fused import triton_fused as TF
    from pagedattn.ops.store_kv import rope_store_kv
    from pagedattn.ops.store_kv import triton_rope_store as TR
    from pagedattn.ops.store_kv import triton_store as TS

    bf, T, Hd = torch.bfloat16, 64, 2048
    p = KVCacheParams(bf, 2, 8, 64, PAGE, num_q_heads=32, devices=["cuda"])
    pc = make_paged_cache(p, [500] * T, [1] * T, device="cuda",
                          generator=torch.Generator().manual_seed(0))  # fmt: skip
    offs = ragged_offsets([1] * T, "cuda")
    x, r = torch.randn(T, Hd, device="cuda").to(bf), torch.randn(T, Hd, device="cuda").to(bf)
    w = torch.randn(Hd, device="cuda").to(bf)
    qkv = torch.randn(T, 48 * 64, device="cuda").to(bf)
    cs, sn = torch.randn(T, 32, device="cuda").to(bf), torch.randn(T, 32, device="cuda").to(bf)
    gu = torch.randn(T, 2 * 8192, device="cuda").to(bf)
    kn = torch.randn(T, 8, 64, device="cuda").to(bf)
    vn = kn.clone()  # (k and v one tensor: aliasing arguments are never prepared)
    logits = torch.randn(T, 128256, device="cuda")
    ops = {
        "rms_norm": lambda: rms_norm(x, w, 1e-5),
        "rms_norm + residual": lambda: rms_norm(x, w, 1e-5, r),
        "rope_qkv": lambda: rope_qkv(qkv, cs, sn, 32, 8),
        "silu_mul": lambda: silu_mul(gu),
        "store_kv": lambda: store_kv(kn, vn, pc.inputs, p, 1, offs),
        "rope_store_kv": lambda: rope_store_kv(qkv, cs, sn, 32, 8, pc.inputs, p, 1, offs),
        "argmax_rows": lambda: argmax_rows(logits),
    }
    cached, lookup, prepare = TF.cached_launch, P.PreparedOp.lookup, P.PreparedOp.prepare

    def mode(m: str) -> None:
        TF.cached_launch = TS.cached_launch = TR.cached_launch = (
            L.launch if m == "launch" else cached
        )
        on = m == "prepared"
        P.PreparedOp.lookup = lookup if on else (lambda self, key, src, before=None: P.MISS)
        P.PreparedOp.prepare = prepare if on else (lambda self, k, s, g, run, *rest: run())

    modes = ("prepared", "cached", "launch")
    failures = []
    for name, fn in ops.items():
        if name in ("store_kv", "rope_store_kv"):
            continue
        outs = {}
        for m in modes:
            mode(m)
            fn()
            outs[m] = fn()  # (prepared: a hit)
        for m in modes[1:]:
            if not bitwise_equal(outs["prepared"], outs[m]):
                failures.append(f"{name}: the prepared call differs from {m}")
    best = {(n, m): math.inf for n in ops for m in modes}
    for m in modes:
        mode(m)
        for fn in ops.values():
            for _ in range(20):
                fn()
    for _ in range(a.rounds):
        for n, fn in ops.items():
            for m in modes:
                mode(m)
                best[n, m] = min(best[n, m], wall_us(fn, a.calls))
    mode("prepared")
    for n in ops:
        print(f"{n:22s} " + "  ".join(f"{m} {best[n, m]:7.1f}" for m in modes))
    return failures


# --------------------------------------------------------------------------------------------
# MLA
# --------------------------------------------------------------------------------------------
MLA_D_QK, MLA_D_V, MLA_CTX, MLA_TOPK = 576, 512, 1024, 256
ROPE = KVQuantConfig.mla_rope_aware
V32 = KVQuantConfig.flashmla_v32
# tag -> (batch, h_q, page, quantization, sparse, keyword variants, graph check, tuning env):
# every kernel family an H200 plans (triton_mla_plan), each kernel named as the plan names it
MLA_CHECKS = {
    "h16 bf16 p64 b1 (keys-as-M)": (1, 16, 64, None, False,
                                    [{}, {"num_partitions": 3}, {"attn_sink": True}], True, None),
    "h16 bf16 p64 b8 (keys-as-M)": (8, 16, 64, None, False,
                                    [{}, {"num_partitions": 3}, {"attn_sink": True}], True, None),
    "h128 bf16 p64 b8 (TMA-fed seesaw)": (8, 128, 64, None, False, [{}, {"attn_sink": True}],
                                          True, None),
    "h128 bf16 p16 b8 (seesaw)": (8, 128, 16, None, False, [{}], False, None),
    "h16 rope-aware p64 b8 (keys-as-M FP8)": (8, 16, 64, ROPE, False, [{}], False, None),
    "h64 rope-aware p64 b4 (64-row FP8)": (4, 64, 64, ROPE, False, [{}], False, None),
    "h128 v32 sparse p64 b8 (cluster seesaw)": (8, 128, 64, V32, True,
                                                [{}, {"num_partitions": 1}], True, None),
    "h128 v32 sparse p64 b8 (persistent)": (8, 128, 64, V32, True, [{"num_partitions": 1}],
                                            False, '{"ss_persist": true}'),
}  # fmt: skip


class MLACase:
    """A written MLA cache (random latent rows stored through `store_kv`, quantized to the
    format), its operand, q_row_offsets and, when sparse, top-k rows of in-context positions."""

    def __init__(self, b: int, h_q: int, page: int, quant, sparse: bool, seed: int) -> None:
        self.b, self.h_q, self.sparse = b, h_q, sparse
        fmt = None if quant is None else quant()
        p = KVCacheParams(torch.bfloat16, 1, 1, MLA_D_QK, page, is_mla=True, num_q_heads=h_q,
                          quantization=fmt, devices=["cuda"])  # fmt: skip
        g = torch.Generator().manual_seed(seed)
        lens = [MLA_CTX - 1] * b
        pc = make_paged_cache(p, lens, [1] * b, generator=g, device="cuda")
        inp = pc.inputs
        x = torch.randn(b * MLA_CTX, 1, MLA_D_QK, generator=g).to(torch.bfloat16).cuda()
        zero = torch.zeros(b, dtype=torch.int32, device="cuda")
        full = inp.cache_lengths.clone()
        inp.cache_lengths.copy_(zero)
        store_kv(x, None, inp, p, 0, ragged_offsets([MLA_CTX] * b, "cuda"))
        inp.cache_lengths.copy_(full)
        self.params, self.inputs, self.full_lens = p, inp, full
        self.kv = PagedOperand(inp, p, 0, "k")
        self.offs = ragged_offsets([1] * b, "cuda")
        self.lut = inp.lookup_table.cpu().long()
        self.page = page

    def indices(self, g: torch.Generator, lens: list[int]):
        """(indices [b, MLA_TOPK] of distinct in-context positions, -1 past each request's
        top-k, topk_lengths [b]) for contexts `lens` (keys a request, its new token included)."""
        idx = torch.full((self.b, MLA_TOPK), -1, dtype=torch.int32)
        tl = [min(n, MLA_TOPK) for n in lens]
        for r, n in enumerate(lens):
            pos = torch.randperm(max(n, 1), generator=g)[: tl[r]]
            idx[r, : tl[r]] = (self.lut[r, pos // self.page] * self.page + pos % self.page).int()
        return idx.cuda(), torch.tensor(tl, dtype=torch.int32, device="cuda")

    def call_kwargs(self, kw: dict, g: torch.Generator, lens: list[int]) -> dict:
        kw = dict(kw)
        if kw.pop("attn_sink", False):
            kw["attn_sink"] = torch.randn(self.h_q, generator=g).cuda()
        if self.sparse:
            kw["indices"], kw["topk_lengths"] = self.indices(g, lens)
        return kw

    def new_lengths(self, g: torch.Generator) -> list[int]:
        """Random cache lengths (<= the written ones) set on the cache; returns keys a request."""
        lens = torch.randint(0, MLA_CTX - 1, (self.b,), generator=g, dtype=torch.int32)
        self.inputs.cache_lengths.copy_(lens.cuda())
        return [int(n) + 1 for n in lens]


def _entry(c: MLACase, q, out, kw) -> object:
    """The prepared entry of a call (None: stored as not preparable; MISS: not stored)."""
    args = (q, c.kv, c.offs, MLA_D_V, kw.get("scale"), True, kw.get("indices"),
            kw.get("topk_lengths"), None, None, None, kw.get("attn_sink"),
            kw.get("num_partitions"), out)  # fmt: skip
    key, src = TMLA._signature(*args, None)
    for guard, pick, entry in TMLA.PREPARED.cache.candidates(key) or []:
        if guard.check(*pick(src)):
            return entry
    return PR.MISS


def _describe(entry) -> str:
    if entry is None or entry is PR.MISS:
        return "NOT PREPARED" if entry is None else "NOT STORED"
    names = [x.kernel.fn.__name__ for x in (entry.decode, entry.combine) if x is not None]
    descs = [v for v in entry.decode.run.__globals__.values() if isinstance(v, PR._Descriptors)]
    extra = ""
    if descs:
        how = "C launch, cached" if descs[0].meta is not None else "per call"
        extra = f", {len(descs)} descriptors ({how}: {sum(len(d.cache) for d in descs)} kept)"
    return " + ".join(names) + extra


def check_mla(tag: str, spec: tuple) -> list[str]:
    """Prepared hits equal the full path bitwise (eager, and replayed in a CUDA graph where the
    spec asks), each signature prepared; returns the failures."""
    b, h_q, page, quant, sparse, variants, graph, env = spec
    bad = []
    saved_env = os.environ.get("PAGEDATTN_MLA_TUNING")
    if env is not None:
        os.environ["PAGEDATTN_MLA_TUNING"] = env
    try:
        c = MLACase(b, h_q, page, quant, sparse, seed=b + h_q)
        g = torch.Generator().manual_seed(7 * b + h_q)
        for step in range(4):
            q = torch.randn(b, h_q, MLA_D_QK, generator=g).to(torch.bfloat16).cuda()
            lens = c.new_lengths(g)
            for kw in variants:
                ckw = c.call_kwargs(kw, g, lens)
                for out in (None, torch.full((b, h_q, MLA_D_V), float("nan"), device="cuda",
                                             dtype=torch.bfloat16)):  # fmt: skip
                    got = mla_decode(q, c.kv, c.offs, out=out, **ckw)
                    want = TMLA.mla_decode_triton(q, c.kv, c.offs, **ckw)
                    if not bitwise_equal(got, want):
                        bad.append(f"{tag} step {step} {kw} out {out is not None}")
                    alone = mla_decode(q, c.kv, c.offs, out=out, return_lse=False, **ckw)
                    if not bitwise_equal((alone, want[1]), want):  # (its LSE in the workspace)
                        bad.append(f"{tag} step {step} {kw} out {out is not None}, no LSE")
                    if step == 0:
                        entry = _entry(c, q, out, ckw)
                        if entry is None or entry is PR.MISS:
                            bad.append(f"{tag} {kw} out {out is not None}: {_describe(entry)}")
                        elif out is None:
                            print(f"  {tag} {kw}: {_describe(entry)}", flush=True)
        if graph:
            bad += check_mla_graph(tag, c, variants[0])
        c.inputs.cache_lengths.copy_(c.full_lens)
    except Exception as e:  # a launch or compile failure: reported, the other cases still run
        bad.append(f"{tag}: {type(e).__name__}: {e}")
    finally:
        if env is not None:
            if saved_env is None:
                os.environ.pop("PAGEDATTN_MLA_TUNING", None)
            else:
                os.environ["PAGEDATTN_MLA_TUNING"] = saved_env
    return bad


def check_mla_graph(tag: str, c: MLACase, kw: dict) -> list[str]:
    """A prepared call captured in a CUDA graph (its split buffers from the graph's pool) and
    replayed with new q, lengths (and indices) equals the full path; eager hits after it too."""
    bad = []
    g = torch.Generator().manual_seed(100 + c.b)
    lens = c.new_lengths(g)
    ckw = c.call_kwargs(kw, g, lens)
    q = torch.randn(c.b, c.h_q, MLA_D_QK, generator=g).to(torch.bfloat16).cuda()
    out = torch.empty(c.b, c.h_q, MLA_D_V, device="cuda", dtype=torch.bfloat16)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm on a side stream, as torch.cuda.graph asks
        for _ in range(3):
            mla_decode(q, c.kv, c.offs, out=out, **ckw)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        _, lse = mla_decode(q, c.kv, c.offs, out=out, **ckw)
    for step in range(4):
        q.copy_(torch.randn(q.shape, generator=g).to(torch.bfloat16))
        lens = c.new_lengths(g)
        if c.sparse:
            idx, tl = c.indices(g, lens)
            ckw["indices"].copy_(idx)
            ckw["topk_lengths"].copy_(tl)
        graph.replay()
        want = TMLA.mla_decode_triton(q, c.kv, c.offs, **ckw)
        if not bitwise_equal((out, lse), want):
            bad.append(f"{tag} graph replay {step}")
        if not bitwise_equal(mla_decode(q, c.kv, c.offs, **ckw), want):
            bad.append(f"{tag} eager hit after replay {step}")
    return bad


def mla_reference(c: MLACase, q: torch.Tensor, scale: float) -> torch.Tensor:
    """float32 attention of each request's one query over its keys (dense, BF16 cache)."""
    lens, lut = (c.inputs.cache_lengths.cpu() + 1).tolist(), c.lut
    rows = c.inputs.kv_blocks[:, 0, 0, :, 0]  # [pages, page, 576]
    out = torch.empty(c.b, c.h_q, MLA_D_V, dtype=torch.float32, device="cuda")
    for r, n in enumerate(lens):
        pages = lut[r, : -(-n // c.page)].cuda()
        kv = rows[pages].flatten(0, 1)[:n].float()
        s = torch.einsum("hd,ld->hl", q[r].float(), kv) * scale
        out[r] = s.softmax(-1) @ kv[:, :MLA_D_V]
    return out


def flashinfer_mla(fi, c: MLACase, q: torch.Tensor, scale: float):
    """FlashInfer's BatchMLAPagedAttentionWrapper (fa3) planned once over the same pages (as
    bench/bench_real.py's MLA peer), or None where it fails."""
    lens = (c.inputs.cache_lengths.cpu() + 1).tolist()
    indptr, indices, _ = page_lists(c.inputs.lookup_table, lens, c.page)
    kv_len = torch.tensor(lens, dtype=torch.int32, device="cuda")
    rows = c.inputs.kv_blocks[:, 0, 0, :, 0]
    ws = torch.empty(WS_BYTES, dtype=torch.uint8, device="cuda")
    w = fi.mla.BatchMLAPagedAttentionWrapper(ws, backend="fa3")
    w.plan(c.offs, indptr, indices, kv_len, c.h_q, MLA_D_V, MLA_D_QK - MLA_D_V, c.page, False,
           scale, torch.bfloat16, torch.bfloat16)  # fmt: skip
    ckv, kpe = rows[..., :MLA_D_V].contiguous(), rows[..., MLA_D_V:].contiguous()
    qn, qp = q[..., :MLA_D_V].contiguous(), q[..., MLA_D_V:].contiguous()
    return lambda: w.run(qn, qp, ckv, kpe)


MLA_TIMED = [(16, 1), (16, 8), (128, 8)]  # (h_q, b), pages of 64, 1024 keys a request


def mla_main(a, fi) -> list[str]:
    """The MLA checks and rows; returns the failures."""
    failures, table = [], []
    print("\nMLA checks (prepared vs full path, bitwise):", flush=True)
    checks = list(MLA_CHECKS.items())[: 2 if a.quick else None]
    for tag, spec in checks:
        bad = check_mla(tag, spec)
        print(f"  {tag}: {'ok' if not bad else f'{len(bad)} FAILED'}", flush=True)
        failures += bad
    for h_q, b in MLA_TIMED:
        col = f"h{h_q} b{b}"
        c = MLACase(b, h_q, 64, None, False, seed=b)
        c.inputs.cache_lengths.copy_(c.full_lens)
        q = torch.randn(b, h_q, MLA_D_QK, device="cuda", dtype=torch.bfloat16)
        out = torch.empty(b, h_q, MLA_D_V, device="cuda", dtype=torch.bfloat16)
        scale = MLA_D_QK**-0.5
        kv, offs = c.kv, c.offs
        ref = mla_reference(c, q, scale)
        got = mla_decode(q, kv, offs, scale=scale, out=out)[0].float()
        cos = float((got * ref).sum() / (got.norm() * ref.norm()))
        if not cos > 0.99999:
            failures.append(f"mla {col}: off the float32 reference (cosine {cos:.7f})")
        rows = {
            "mla_decode (prepared), out given": lambda: mla_decode(q, kv, offs, scale=scale,
                                                                   out=out),
            "mla_decode (prepared), out=None": lambda: mla_decode(q, kv, offs, scale=scale),
            "mla_decode (prepared), out, no LSE": lambda: mla_decode(
                q, kv, offs, scale=scale, out=out, return_lse=False
            ),
            "mla_decode_triton (full path)": lambda: TMLA.mla_decode_triton(
                q, kv, offs, scale=scale, out=out
            ),
        }  # fmt: skip
        if fi is not None:
            try:
                run = flashinfer_mla(fi, c, q, scale)
                fo = run()
                fo = (fo[0] if isinstance(fo, (tuple, list)) else fo).float()
                cf = float((fo * ref).sum() / (fo.norm() * ref.norm()))
                print(f"mla {col} FlashInfer cosine vs reference {cf:.7f}")
                rows["FlashInfer MLA run()"] = run
            except Exception as e:  # JIT or API failure: the row is left out
                print(f"mla {col} FlashInfer failed: {type(e).__name__}: {e}")
        for fn in rows.values():  # warm: compiles, plans, the prepared entry
            for _ in range(20):
                fn()
        best = dict.fromkeys(rows, math.inf)
        for _ in range(a.rounds):
            for name, fn in rows.items():
                best[name] = min(best[name], wall_us(fn, a.calls))
        entry = _entry(c, q, out, dict(scale=scale))
        if entry is None or entry is PR.MISS:
            failures.append(f"mla {col}: the decode call was {_describe(entry)}")
            continue
        saved = [(x, x.fast) for x in (entry.decode, entry.combine) if x is not None]
        for x, _ in saved:
            x.fast = lambda stream, P: None
        try:
            best["mla args only (no launch)"] = min(
                wall_us(lambda: mla_decode(q, kv, offs, scale=scale, out=out), a.calls)
                for _ in range(a.rounds)
            )  # fmt: skip
        finally:
            for x, f in saved:
                x.fast = f
        for name, us in best.items():
            table.append((col, name, us))
            print(f"mla {col:8s} {name:34s} {us:8.1f}", flush=True)
        print(f"mla {col} prepared: {_describe(entry)}")
    cols = [f"h{h} b{b}" for h, b in MLA_TIMED]
    print("\nMLA host cost per eager call (us)")
    print(f"{'':34s}" + "".join(f"{c:>10s}" for c in cols))
    for n in dict.fromkeys(n for _, n, _ in table):
        vals = {c: us for c, m, us in table if m == n}
        print(f"{n:34s}" + "".join(f"{vals.get(c, math.nan):10.1f}" for c in cols))
    PR.release_workspaces()
    return failures


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--op", choices=("mha", "step", "fused", "mla", "all"), default="all")
    quick = "MLA: check the h_q 16 BF16 cases only (fewer kernels to compile)"
    ap.add_argument("--quick", action="store_true", help=quick)
    a = ap.parse_args()
    try:
        import flashinfer as fi
    except Exception as e:  # missing wheel, CUDA_HOME, JIT failure
        print(f"FlashInfer unavailable: {type(e).__name__}: {e}")
        fi = None
    dev = torch.cuda.get_device_name()
    print(f"{dev}; torch {torch.__version__}; us per eager call ({a.calls} calls + one "
          f"synchronize, best of {a.rounds})", flush=True)  # fmt: skip
    failures = []
    if a.op in ("mha", "all"):
        failures += mha_main(a, fi)
    if a.op in ("step", "all"):
        failures += step_main(a)
    if a.op in ("fused", "all"):
        failures += fused_main(a)
    if a.op in ("mla", "all"):
        failures += mla_main(a, fi)
    if failures:
        print("\nFAILED checks:\n  " + "\n  ".join(failures))
        sys.exit(1)
    print("\nchecks: prepared calls equal the full path bitwise; outputs match the reference")


if __name__ == "__main__":
    main()
