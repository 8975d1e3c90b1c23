"""Where an engine decode step's device time goes outside its graph replay (issue 57).

The engine's timed step (`bench_model`'s "step") is longer than the captured graph's replay
alone ("replay"). This probe serves bench_model's case (random weights, b requests of 512
tokens, graphs, async scheduling), then profiles STEPS engine steps with torch.profiler and
splits the device timeline of the steady steps: kernels and copies inside graph replays, the
ones outside (by name), and the time no kernel ran.

Usage (GPU): python dev/profile_engine_step.py [--shape llama3.2-1b] [--b 64] [--out F.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import defaultdict

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))

from bench_model import CASES, Ctx, build_model, hf_config_dict, prompts, serve  # noqa: E402

STEPS = 12


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="llama3.2-1b")
    ap.add_argument("--b", type=int, default=64)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    case = next(c for c in CASES if c.shape == a.shape and c.b == a.b)
    ctx = Ctx([], {}, 0, False)
    cfg = hf_config_dict(a.shape)
    model = build_model(cfg, ctx.dev, ctx.dtype, 0)
    toks = prompts(case, cfg["vocab_size"], 0)
    res = serve(ctx, case, model, toks, graphs=True)
    eng = res["engine"]
    from torch.profiler import ProfilerActivity, profile  # noqa: PLC0415

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(STEPS):
            eng.step()
        torch.cuda.synchronize()
    dev = [
        e
        for e in prof.events()
        if e.device_type == torch.autograd.DeviceType.CUDA and e.time_range.elapsed_us() >= 0
    ]
    dev.sort(key=lambda e: e.time_range.start)
    # A graph replay's kernels: the profiler gives them the replay's correlation (cudaGraphLaunch);
    # here, kernels whose name is one the model's forward runs are counted by name instead.
    t0, t1 = dev[len(dev) // 4].time_range.start, dev[-1].time_range.end  # the steady part
    window = [e for e in dev if e.time_range.start >= t0]
    busy, by_name, calls = 0.0, defaultdict(float), defaultdict(int)
    last_end = t0
    for e in window:
        s, t = e.time_range.start, e.time_range.end
        busy += max(0.0, t - max(s, last_end))
        last_end = max(last_end, t)
        by_name[e.name] += t - s
        calls[e.name] += 1
    span = t1 - t0
    steps = STEPS * (len(window) / len(dev))
    rows = sorted(by_name, key=by_name.get, reverse=True)
    out = dict(
        shape=a.shape,
        b=a.b,
        step_ms_median=sorted(res["ms"])[len(res["ms"]) // 2],
        span_us=span,
        steps_in_span=steps,
        busy_us_a_step=busy / steps,
        idle_us_a_step=(span - busy) / steps,
        kernels=[
            dict(name=n[:140], us_a_step=by_name[n] / steps, calls_a_step=calls[n] / steps)
            for n in rows[:60]
        ],
    )
    cpu = defaultdict(float)
    for e in prof.key_averages():
        if e.key.startswith(("aten::", "cuda")) or "Graph" in e.key:
            cpu[e.key] = e.cpu_time_total / STEPS
    out["host_us_a_step"] = dict(sorted(cpu.items(), key=lambda kv: -kv[1])[:25])
    print(f"step {out['step_ms_median']:.3f} ms; device busy {out['busy_us_a_step']:.1f} us, "
          f"idle {out['idle_us_a_step']:.1f} us a step")  # fmt: skip
    for r in out["kernels"][:40]:
        print(f"  {r['us_a_step']:8.1f} us {r['calls_a_step']:6.1f}x  {r['name'][:100]}")
    print("host (us a step):")
    for k, v in list(out["host_us_a_step"].items())[:15]:
        print(f"  {v:8.1f}  {k}")
    if a.out:
        with open(a.out, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
