"""The host cost of launching an engine's captured decode graph (issue 57: a host-bound 1B step).

Serves bench_model's case (graphs, async scheduling), then times `CUDAGraph.replay()` on the
host alone (each call's wall time, the device queue not drained between calls) and a replay
on the device (CUDA events). Run once per setting, e.g. with PAGEDATTN_PDL=0 in another
process, to compare the PDL chain's graph with the plain one.

  python dev/graph_launch_probe.py [--shape llama3.2-1b] [--b 64] [--out F.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))

import bench_model  # noqa: E402
from bench_model import CASES, Ctx, build_model, graph_of, hf_config_dict, prompts, serve  # noqa: E402

from pagedattn import env  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="llama3.2-1b")
    ap.add_argument("--b", type=int, default=64)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    case = next(c for c in CASES if c.shape == a.shape and c.b == a.b)
    ctx = Ctx([], {}, 0, False)
    cfg = hf_config_dict(a.shape)
    model = build_model(cfg, ctx.dev, ctx.dtype, 0)
    budget = bench_model.max_new_tokens  # tokens enough for the probe's steps too
    bench_model.max_new_tokens = lambda c: budget(c) + 60
    res = serve(ctx, case, model, prompts(case, cfg["vocab_size"], 0), graphs=True)
    eng = res["engine"]
    g = graph_of(eng, a.b)
    in_step = []  # the replay's host time inside engine steps
    replay = g.replay

    def timed_replay() -> None:
        t = time.perf_counter()
        replay()
        in_step.append((time.perf_counter() - t) * 1e6)

    g.replay = timed_replay
    t = time.perf_counter()
    for _ in range(40):
        eng.step()
    step_wall = (time.perf_counter() - t) / 40 * 1e6
    g.replay = replay
    torch.cuda.synchronize()
    in_step.sort()
    host = []
    with torch.inference_mode():
        for _ in range(3):
            g.replay()
        torch.cuda.synchronize()
        for _ in range(5):  # rounds of 8 launches queued back to back, then drained
            for _ in range(8):
                t = time.perf_counter()
                g.replay()
                host.append((time.perf_counter() - t) * 1e6)
            torch.cuda.synchronize()
        ev = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
        dev = []
        for _ in range(10):
            ev[0].record()
            g.replay()
            ev[1].record()
            torch.cuda.synchronize()
            dev.append(ev[0].elapsed_time(ev[1]) * 1e3)
    host.sort()
    dev.sort()
    out = dict(shape=a.shape, b=a.b, pdl=env.read("PDL") != "0",
               launch_host_us_median=host[len(host) // 2], launch_host_us_min=host[0],
               replay_device_us_median=dev[len(dev) // 2],
               in_step_launch_us_median=in_step[len(in_step) // 2], in_step_launch_us=in_step,
               step_wall_us=step_wall,
               step_ms_median=sorted(res["ms"])[len(res["ms"]) // 2])  # fmt: skip
    print(json.dumps({k: v for k, v in out.items() if k != "in_step_launch_us"}))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
