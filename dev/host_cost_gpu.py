"""Host cost of one eager MHA decode call on the GPU machine: `pagedattn.mha` (prepared calls,
`ops.prepared`) against its full path (`mha_triton`), torch SDPA and FlashInfer's
BatchDecodeWithPagedKVCacheWrapper.run() on the same shapes.

    . dev/probe_env.sh && python dev/host_cost_gpu.py [--calls 200] [--rounds 5]

Shapes: the suite's host-cost case (bench/bench_real.py "host mha"): decode, GQA 32/8 heads,
d128, pages of 16, bf16, 1024 keys a request, b in (1, 8, 64). A row's number is wall time
per call of --calls eager calls and one synchronize, best of --rounds (rows alternate within
a round: the host's speed drifts). Each case first checks, on random data, that prepared calls
(hits: other q, other lengths, other out, out given and not, an LSE, split-K) equal the full
path's bytes, that a prepared call captured in a CUDA graph and replayed with new q and lengths
does too, and that the output is close to a float32 reference; a mismatch is printed and the
script exits 1.

Rows:
- `mha (prepared), out given` / `out=None`: the public op, its signature prepared (hits);
- `mha_triton (full path)`: the same op without the cache (checks, plan, Triton launches);
- `mha args only (no launch)`: the prepared lookup and argument packing with the launcher
  replaced by a no-op (what of the prepared row is Python);
- `torch SDPA (dense K/V)`: scaled_dot_product_attention over K/V gathered once;
- `FlashInfer run()`: the decode wrapper planned once (skipped when flashinfer does not
  import).
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

from pagedattn import KVCacheParams, PagedOperand, mha  # noqa: E402
from pagedattn.ops import prepared as PR  # noqa: E402
from pagedattn.ops.mha import triton_mha as TM  # noqa: E402
from pagedattn.testing import make_paged_cache  # noqa: E402

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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    try:
        import flashinfer as fi
    except Exception as e:  # missing wheel, CUDA_HOME, JIT failure
        print(f"FlashInfer unavailable: {type(e).__name__}: {e}")
        fi = None
    dev = torch.cuda.get_device_name()
    print(f"{dev}; torch {torch.__version__}; us per eager call ({a.calls} calls + one "
          f"synchronize, best of {a.rounds})", flush=True)  # fmt: skip
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
        saved = [(x, x.fast) for x in (entry.decode, entry.combine) if x is not None]
        for x, _ in saved:
            x.fast = lambda stream, P: None
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
            f"{1 + (entry.combine is not None)}; prepared entries {len(TM.PREPARED.cache)}"
        )
    print("\nhost cost per eager call (us)")
    names = list(dict.fromkeys(n for _, n, _ in table))
    print(f"{'':32s}" + "".join(f"{'b' + str(b):>10s}" for b in (1, 8, 64)))
    for n in names:
        vals = {b: us for b, m, us in table if m == n}
        print(f"{n:32s}" + "".join(f"{vals.get(b, math.nan):10.1f}" for b in (1, 8, 64)))
    PR.release_workspaces()
    if failures:
        print("\nFAILED checks:\n  " + "\n  ".join(failures))
        sys.exit(1)
    print("\nchecks: prepared calls equal the full path bitwise; outputs match the reference")


if __name__ == "__main__":
    main()
