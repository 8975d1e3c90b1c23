"""Where an eager decode call's wall time goes on the GPU machine: the suite's host-cost cases
(bench/bench_real.py "host mha" / "host mla", b1 and b8), each timed as the suite times it (a
loop of eager calls and one synchronize) and then traced with torch.profiler over a loop of
the same calls.

    . dev/probe_env.sh && python dev/host_eager_trace.py [--calls 200] [--cases mha1,mla8]

Per case it prints the wall us a call, the prepared-call cache's hits and misses in the loop
(`ops.prepared.PreparedCache.lookup`), the CUDA runtime / driver calls a call makes (by name:
a synchronize or a device-to-host copy makes the host wait for the device), the kernels a
call launches with their mean device time, and the device's busy time a call (kernels only)
against the wall: a wall near the busy time is device-bound, above it host-bound.
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import time

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(_ROOT, "src"))
sys.path.insert(0, os.path.join(_ROOT, "bench"))

import torch  # noqa: E402
from bench_real import D_QK, D_V, D, gqa_cache, mla_cache  # noqa: E402

from pagedattn import PagedOperand, mha, mla_decode  # noqa: E402
from pagedattn.ops import prepared as PR  # noqa: E402
from pagedattn.testing import ragged_offsets  # noqa: E402


def build(kind: str, b: int):
    dev = "cuda"
    torch.manual_seed(0)
    offs = ragged_offsets([1] * b, dev)
    if kind == "mha":
        pc = gqa_cache([1023] * b, [1] * b, 16, 32, dev, 0)
        k = PagedOperand(pc.inputs, pc.params, 0, "k")
        v = PagedOperand(pc.inputs, pc.params, 0, "v")
        q = torch.randn(b, 32, D, device=dev, dtype=torch.bfloat16)
        out = torch.empty_like(q)
        return lambda: mha(q, k, v, offs, scale=D**-0.5, out=out)
    pc = mla_cache([1023] * b, [1] * b, 64, 16, dev, 0)
    op = PagedOperand(pc.inputs, pc.params, 0, "k")
    q = torch.randn(b, 16, D_QK, device=dev, dtype=torch.bfloat16)
    out = torch.empty(b, 16, D_V, device=dev, dtype=torch.bfloat16)
    return lambda: mla_decode(q, op, offs, scale=D_QK**-0.5, out=out, return_lse=False)


def wall_us(fn, n: int) -> float:
    best = float("inf")
    for _ in range(3):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - t0) / n * 1e6)
    return best


def counted(n_calls: int, fn) -> tuple[int, int]:
    """(hits, misses) of the prepared caches over n_calls calls."""
    hits = misses = 0
    orig = PR.PreparedCache.lookup

    def lookup(self, *a, **k):
        nonlocal hits, misses
        r = orig(self, *a, **k)
        if r is PR.MISS:
            misses += 1
        else:
            hits += 1
        return r

    PR.PreparedCache.lookup = lookup
    try:
        for _ in range(n_calls):
            fn()
        torch.cuda.synchronize()
    finally:
        PR.PreparedCache.lookup = orig
    return hits, misses


def trace(fn, n: int) -> None:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
    api = collections.Counter()
    kern = collections.defaultdict(list)
    spans = []
    for e in prof.events():
        dt = getattr(e, "device_type", None)
        name = e.name
        if dt is not None and "CUDA" in str(dt):
            kern[name].append(e.time_range.elapsed_us())
            spans.append((e.time_range.start, e.time_range.end))
        elif name.startswith(("cuda", "cu")):
            api[name] += 1
    print("   runtime / driver calls a call:",
          ", ".join(f"{k} {v / n:.2f}" for k, v in api.most_common()))  # fmt: skip
    busy = 0.0
    for k, v in sorted(kern.items(), key=lambda kv: -sum(kv[1])):
        print(f"   kernel {k[:70]:70s} {len(v) / n:5.2f}/call  {sum(v) / len(v):7.2f} us")
        busy += sum(v)
    if spans:
        spans.sort()
        first, last = spans[0][0], max(e for _, e in spans)
        print(f"   device busy {busy / n:.2f} us a call; first kernel start to last end "
              f"{(last - first) / n:.2f} us a call")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--cases", default="mha1,mha8,mla1,mla8")
    a = ap.parse_args()
    print(torch.cuda.get_device_name(), torch.__version__)
    for c in a.cases.split(","):
        kind, b = c[:3], int(c[3:])
        fn = build(kind, b)
        for _ in range(20):
            fn()
        torch.cuda.synchronize()
        us = wall_us(fn, a.calls)
        h, m = counted(a.calls, fn)
        print(f"{kind} b{b}: {us:.2f} us a call (wall); prepared lookups: {h} hits, {m} misses")
        trace(fn, 50)
    # the host alone: a loop whose device work is a no-op (the same calls into an empty queue
    # after a synchronize each time measure the call's host path without queue back-pressure)
    for c in a.cases.split(","):
        kind, b = c[:3], int(c[3:])
        fn = build(kind, b)
        fn()
        ts = []
        for _ in range(100):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
        ts.sort()
        print(f"{kind} b{b}: one call into an idle queue: p10 {ts[10] * 1e6:.2f} "
              f"p50 {ts[50] * 1e6:.2f} us (host)")  # fmt: skip


if __name__ == "__main__":
    main()
