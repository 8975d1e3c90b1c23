"""Where an engine decode step's device time goes outside its graph replay (issue 57).

The engine's timed step (`bench_model`'s "step") is longer than the captured graph's replay
alone ("replay"). This probe serves bench_model's case (random weights, b requests of 512
tokens, graphs, async scheduling), then times STEPS engine steps (wall, and the host's own
time: the wall less the wait for the step's tokens), and profiles STEPS more with cProfile:
the host's functions by own time (CUDA API calls show as torch's builtins).

Usage (GPU): python dev/profile_engine_step.py [--shape llama3.2-1b] [--b 64] [--out F.json]
             [--trace-dir DIR] [--no-pieces]

--no-pieces: the engine without piecewise graphs of mixed steps (an A/B: with them, the 1B b64
async step measured 50-110 us longer on one lease with the same replay, docs/performance.md).
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))

import bench_model  # noqa: E402
from bench_model import (  # noqa: E402
    CASES,
    Ctx,
    build_model,
    hf_config_dict,
    prompts,
    serve,
)  # fmt: skip

STEPS = 40


def device_timeline(eng, trace_dir: str) -> dict:
    """STEPS engine steps under torch.profiler (CUDA activity): per step, the device's busy
    time in the graph replay's kernels, in work launched outside the graph (copies, sampling,
    the eager ops of the step), and idle; the outside work by name."""
    from torch.profiler import ProfilerActivity, profile  # noqa: PLC0415

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(STEPS):
            eng.step()
        torch.cuda.synchronize()
    os.makedirs(trace_dir, exist_ok=True)
    path = os.path.join(trace_dir, "engine_steps.json")
    prof.export_chrome_trace(path)
    with open(path) as f:
        ev = json.load(f)["traceEvents"]
    graph_corr = {
        e["args"].get("correlation")
        for e in ev
        if e.get("cat") == "cuda_runtime" and "GraphLaunch" in e.get("name", "")
    }
    dev = [
        e
        for e in ev
        if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset") and e.get("ph") == "X"
    ]
    dev.sort(key=lambda e: e["ts"])
    t0, t1 = dev[0]["ts"], max(e["ts"] + e["dur"] for e in dev)
    busy_graph = busy_out = 0.0
    outside: dict[str, list[float]] = {}
    end = t0
    gaps: dict[str, list[float]] = {}  # idle before an event, by (the last one, this one)
    last = "start"
    for e in dev:  # union of intervals (PDL overlaps kernels), attributed to the later one
        s_, d_ = e["ts"], e["dur"]
        name = "graph" if e["args"].get("correlation") in graph_corr else e["name"][:60]
        if s_ > end and end > t0:
            gaps.setdefault(f"{last} -> {name}", []).append(s_ - end)
        if s_ + d_ > end:
            last = name
        add = max(0.0, s_ + d_ - max(s_, end))
        end = max(end, s_ + d_)
        if e["args"].get("correlation") in graph_corr:
            busy_graph += add
        else:
            busy_out += add
            outside.setdefault(e["name"], []).append(d_)
    span = t1 - t0
    api: dict[str, list[float]] = {}  # the host's CUDA runtime / driver calls, by name
    for e in ev:
        if e.get("cat") in ("cuda_runtime", "cuda_driver") and e.get("ph") == "X":
            api.setdefault(e["name"], []).append(e["dur"])
    api_rows = sorted(
        (dict(name=k, us=sum(v) / STEPS, calls=len(v) / STEPS) for k, v in api.items()),
        key=lambda r: -r["us"],
    )
    rows = sorted(
        (dict(name=k, us=sum(v) / STEPS, calls=len(v) / STEPS) for k, v in outside.items()),
        key=lambda r: -r["us"],
    )
    gap_rows = sorted(
        (dict(pair=k, us=sum(v) / STEPS, calls=len(v) / STEPS) for k, v in gaps.items()),
        key=lambda r: -r["us"],
    )[:16]
    summary = dict(
        span_us=span / STEPS,
        graph_busy_us=busy_graph / STEPS,
        outside_busy_us=busy_out / STEPS,
        idle_us=(span - busy_graph - busy_out) / STEPS,
    )
    return dict(
        summary=summary,
        outside_graph=rows,
        idle_gaps=gap_rows,
        host_cuda_calls=api_rows,
        trace=path,
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="llama3.2-1b")
    ap.add_argument("--b", type=int, default=64)
    ap.add_argument("--out", default=None)
    ap.add_argument("--trace-dir", default=None, help="also trace STEPS steps' device timeline")
    ap.add_argument("--no-pieces", action="store_true", help="LLMEngine._piecewise_graphs off")
    a = ap.parse_args()
    if a.no_pieces:
        from pagedattn.engine.llm_engine import LLMEngine  # noqa: PLC0415

        LLMEngine._piecewise_graphs = False
    case = next(c for c in CASES if c.shape == a.shape and c.b == a.b)
    ctx = Ctx([], {}, 0, False)
    cfg = hf_config_dict(a.shape)
    model = build_model(cfg, ctx.dev, ctx.dtype, 0)
    toks = prompts(case, cfg["vocab_size"], 0)
    budget = bench_model.max_new_tokens  # tokens enough for the probe's steps too
    bench_model.max_new_tokens = lambda c: budget(c) + 3 * STEPS
    res = serve(ctx, case, model, toks, graphs=True)
    eng = res["engine"]

    from pagedattn.engine import inflight  # noqa: PLC0415

    # the host's own time a step: the step's wall time less its wait for the tokens
    waits: list[float] = []
    tokens = inflight.InFlightStep.tokens

    def timed_tokens(self):
        t = time.perf_counter()
        out = tokens(self)
        waits.append(time.perf_counter() - t)
        return out

    inflight.InFlightStep.tokens = timed_tokens
    walls = []
    for _ in range(STEPS):
        t = time.perf_counter()
        eng.step()
        walls.append(time.perf_counter() - t)
    inflight.InFlightStep.tokens = tokens
    torch.cuda.synchronize()
    wall = sum(walls) / STEPS * 1e6  # means: a step blocks somewhere now and then
    wait = sum(waits) / STEPS * 1e6
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(STEPS):
        eng.step()
    prof.disable()
    torch.cuda.synchronize()
    trace = device_timeline(eng, a.trace_dir) if a.trace_dir else None
    st = pstats.Stats(prof)
    rows = sorted(st.stats.items(), key=lambda kv: -kv[1][2])[:40]  # by own time
    out = dict(
        shape=a.shape, b=a.b,
        step_ms_median=sorted(res["ms"])[len(res["ms"]) // 2],
        wall_us_a_step=wall, token_wait_us=wait, host_us_a_step=wall - wait,
        host_own_us=[dict(fn=f"{f[0].rsplit('/', 1)[-1]}:{f[1]}({f[2]})", calls=v[1] / STEPS,
                          own_us=v[2] / STEPS * 1e6, cum_us=v[3] / STEPS * 1e6)
                     for f, v in rows],
    )  # fmt: skip
    if trace is not None:
        out["device"] = trace
        print("device timeline a step (us):", json.dumps(trace["summary"]))
        for r in trace["outside_graph"][:20]:
            print(f"  {r['us']:8.1f} us {r['calls']:5.1f}x  {r['name'][:90]}")
        print("idle gaps a step, by (the last work, the next) (us):")
        for r in trace["idle_gaps"]:
            print(f"  {r['us']:8.1f} us {r['calls']:5.1f}x  {r['pair'][:110]}")
        print("host CUDA API calls a step (us):")
        for r in trace["host_cuda_calls"][:15]:
            print(f"  {r['us']:8.1f} us {r['calls']:5.1f}x  {r['name'][:90]}")
    print(f"step {out['step_ms_median']:.3f} ms; an engine.step() call: wall {wall:.0f} us, "
          f"of it waiting for tokens {wait:.0f} us (host {wall - wait:.0f} us)")  # fmt: skip
    print("host, by own time (cProfile, us a step):")
    for r in out["host_own_us"][:30]:
        print(f"  {r['own_us']:8.1f} own {r['cum_us']:8.1f} cum {r['calls']:6.1f}x  {r['fn']}")
    if a.out:
        with open(a.out, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
