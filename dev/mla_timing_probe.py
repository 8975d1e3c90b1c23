"""Why eager and CUDA-graph timings of the dense bf16 h_q 128 MLA decode differ (run_all took
eager 0.512 ms against graph 0.555 at s_k 8192, H100 2026-11-22): per-call distributions of
both, CUDA-event times against the profiler's kernel durations, (--ncu) a few launches for
Nsight Compute's DRAM bytes and clock, and (--order) `common.time_ms`'s alternating rounds
started with eager calls, then with graph replays, then with eager calls again.

    python3 bench/mla_timing_probe.py [--ncu | --order] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpu_mla_dev as D  # noqa: E402
from common import _bench, call_times, cold_l2, sm_clock_mhz  # noqa: E402


def kernel_durations(calls, name: str) -> list[float]:
    """The profiler's (CUPTI) durations in ms of the kernels whose name contains `name`."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for fn in calls:
            cold_l2()
            fn()
        torch.cuda.synchronize()
    evs = [e for e in prof.events() if name in e.name and e.device_type.name == "CUDA"]
    return [(e.time_range.end - e.time_range.start) / 1e3 for e in evs]


def summary(xs: list[float]) -> dict:
    q = statistics.quantiles(xs, n=10)
    return dict(n=len(xs), min=min(xs), p10=q[0], median=statistics.median(xs), p90=q[-1],
                max=max(xs))  # fmt: skip


def round_order(fn, g, first: str, rounds: int = 4) -> list[dict]:
    """`common.time_ms`'s alternating rounds with the given kind first ("eager" or "graph"):
    each round's median (ms) and the SM clock after it."""
    calls = {"eager": fn, "graph": g.replay}
    kinds = [first, "graph" if first == "eager" else "eager"] * (rounds // 2)
    out = []
    for kind in kinds:
        out.append(dict(kind=kind, ms=_bench(calls[kind], 25, 100, 1), mhz=sm_clock_mhz()))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ncu", action="store_true", help="only 12 eager calls at s_k 8192")
    ap.add_argument("--order", action="store_true", help="only the round-order test (s_k 8192)")
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp"))
    a = ap.parse_args()
    res = {}
    for s_k in (8192,) if a.ncu else (4096, 8192):
        q, kv, offs, kw, work = D.make_case("dense", "bf16", 576, 128, s_k, 128, 1, 64)
        fn = D._launcher(q, kv, offs, kw, None)
        fn()
        torch.cuda.synchronize()
        if a.ncu:
            for _ in range(12):
                cold_l2()
                fn()
            torch.cuda.synchronize()
            return
        call_times(fn, 20)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            fn()
        g.replay()
        torch.cuda.synchronize()
        if a.order:
            if s_k == 8192:
                res[s_k] = dict(eager_first=round_order(fn, g, "eager"),
                                graph_first=round_order(fn, g, "graph"),
                                eager_first_again=round_order(fn, g, "eager"))  # fmt: skip
                for k, v in res[s_k].items():
                    print(k, [(x["kind"][0], round(x["ms"], 4), x["mhz"]) for x in v])
            del g
            continue
        r = dict(
            eager=summary(call_times(fn, 80)),
            graph=summary(call_times(g.replay, 80)),
            eager_b2b=summary(call_times(fn, 80, flush=False)),
            graph_b2b=summary(call_times(g.replay, 80, flush=False)),
            eager_again=summary(call_times(fn, 80)),
        )
        try:
            ke = kernel_durations([fn] * 40, "mla_decode")
            kg = kernel_durations([g.replay] * 40, "mla_decode")
            r["kernel_eager"], r["kernel_graph"] = summary(ke), summary(kg)
            r["kernel_eager_seq"], r["kernel_graph_seq"] = ke, kg
        except Exception as e:  # noqa: BLE001 - the event timings above still count
            print(f"profiler: {type(e).__name__}: {e}")
        res[s_k] = r
        del g
    if a.order:
        with open(os.path.join(a.out, "mla_timing_order.json"), "w") as f:
            json.dump(res, f, indent=1)
        return
    with open(os.path.join(a.out, "mla_timing_probe.json"), "w") as f:
        json.dump(res, f, indent=1)
    print(f"{'s_k':>5} {'what':>14} {'min':>7} {'p10':>7} {'med':>7} {'p90':>7} {'max':>7}")
    for s_k, r in res.items():
        for k, v in r.items():
            if isinstance(v, dict):
                print(f"{s_k:>5} {k:>14} " + " ".join(f"{v[x]:7.4f}" for x in
                      ("min", "p10", "median", "p90", "max")))  # fmt: skip


if __name__ == "__main__":
    main()
