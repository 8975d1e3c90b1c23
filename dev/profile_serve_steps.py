"""Where bench-serve's time goes, by kind of step (issue 57).

bench-serve's workload (`demo.synthetic_workload`: lognormal prompts / outputs, all requests
at once, temperature 1) served by the engine over bench_serve's random checkpoint. Every
engine step is classed by its batch (pure decode, which replays a graph, or mixed: prefill
tokens in it, eager) and timed: the host's wall time a step, and the device time of the
model's call (CUDA events around `ModelRunner.execute`, read at the end). Then a window of
mixed steps under cProfile (the host's functions by own time) and one under torch.profiler
(the device's kernels by total time).

Usage (GPU): python dev/profile_serve_steps.py [--shape llama3.2-1b] [--requests 400]
             [--ckpt DIR] [--out F.json] [--eager | --no-pieces] [--layers N] [--compiles]
(--no-pieces: decode graphs, mixed steps eager; --layers: the shape cut to N layers, a
smaller checkpoint to write; --compiles: the Triton kernels compiled while serving, by step.)
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))

import bench_serve  # noqa: E402

from pagedattn import demo  # noqa: E402
from pagedattn.engine import LLM, SamplingParams  # noqa: E402


def pct(xs, q):
    return float(np.percentile(np.asarray(xs), q)) if xs else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="llama3.2-1b")
    ap.add_argument("--ckpt", default=None)
    ap.add_argument("--requests", type=int, default=400)
    ap.add_argument("--tokens", type=int, default=2048, help="max_num_batched_tokens")
    ap.add_argument("--out", default=None)
    ap.add_argument("--eager", action="store_true", help="enforce_eager")
    ap.add_argument("--no-pieces", action="store_true",
                    help="decode graphs, but mixed steps eager (no piecewise graphs)")  # fmt: skip
    ap.add_argument("--layers", type=int, default=None, help="the shape with this many layers")
    ap.add_argument("--compiles", action="store_true",
                    help="list the Triton kernels compiled while serving, by step")  # fmt: skip
    a = ap.parse_args()
    cuda = torch.cuda.is_available()
    dev = "cuda" if cuda else "cpu"  # (the CPU: the dry shape, to check the probe runs)
    dtype = torch.bfloat16 if cuda else torch.float32
    cfg = bench_serve.checkpoint_config(a.shape, not cuda, dtype)
    if a.layers is not None:
        cfg["num_hidden_layers"] = a.layers
    folder = Path(a.ckpt or tempfile.mkdtemp(prefix=f"pagedattn-{a.shape}-"))
    bench_serve.write_checkpoint(folder, cfg, dev, dtype, 0)
    work_cfg = {} if cuda else dict(prompt_mean=24, output_mean=8)
    bench = demo.BenchConfig(model=folder, device=dev, num_requests=a.requests, **work_cfg)
    from pagedattn.models import ModelConfig

    work = demo.synthetic_workload(bench, ModelConfig.from_hf(folder).vocab_size)
    max_len = max(len(w["prompt_token_ids"]) + w["output_len"] for w in work) + 64

    class Engine(LLM):
        _piecewise_graphs = not a.no_pieces  # (the engine's A/B switch)

    llm = Engine(
        str(folder),
        device=dev,
        dtype=dtype,
        page_size=16,
        max_num_seqs=256,
        max_num_batched_tokens=a.tokens,
        max_model_len=max_len,
        seed=0,
        enforce_eager=a.eager,
    )
    llm.generate([[1] * 64], SamplingParams(max_tokens=8, ignore_eos=True))
    for i, w in enumerate(work):
        sp = SamplingParams(max_tokens=w["output_len"], temperature=1.0, ignore_eos=True, seed=i)
        llm.add_request({"prompt_token_ids": w["prompt_token_ids"]}, sp)

    steps: list[dict] = []
    events: list[tuple] = []
    sched, runner = llm.scheduler, llm.runner
    orig_schedule, orig_execute = sched.schedule, runner.execute

    def schedule():
        b = orig_schedule()
        dec = sum(1 for s in b.seqs if s.is_decode)
        steps.append(
            dict(n=len(b.seqs), decodes=dec, tokens=b.num_batched_tokens, graph=False, wall=0.0)
        )
        return b

    def execute(inputs):
        if steps:
            steps[-1]["graph"] = bool(runner.graphs is not None and runner.graphs.serves(inputs))
        if not cuda:
            return orig_execute(inputs)
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        t = time.perf_counter()
        out = orig_execute(inputs)
        if steps:
            steps[-1]["exec_host_us"] = (time.perf_counter() - t) * 1e6
        e1.record()
        events.append((len(steps) - 1, e0, e1))
        return out

    sched.schedule, runner.execute = schedule, execute
    compiled: list[tuple] = []  # (step, kernel, specialization) of each compile while serving
    if a.compiles:
        from triton import knobs

        prev_hook = knobs.runtime.jit_post_compile_hook

        def on_compile(**kw):
            compiled.append((len(steps), kw["fn"].name, str(kw.get("repr", ""))[:300]))
            if prev_hook is not None:
                prev_hook(**kw)

        knobs.runtime.jit_post_compile_hook = on_compile
    prof = cProfile.Profile()
    tprof = None
    mixed_seen = 0
    t_start = time.perf_counter()
    while llm.has_unfinished_requests():
        k = len(steps)
        t = time.perf_counter()
        last_mixed = bool(steps) and not steps[-1]["graph"]
        profiling = last_mixed and 20 <= mixed_seen < 40
        if profiling:
            prof.enable()
        if cuda and last_mixed and mixed_seen == 50:
            from torch.profiler import ProfilerActivity, profile

            tprof = profile(activities=[ProfilerActivity.CUDA])
            tprof.__enter__()
        llm.step()
        if tprof is not None and mixed_seen == 54:
            torch.cuda.synchronize()
            tprof.__exit__(None, None, None)
            kern = tprof.key_averages()
            tprof = ("done", kern)
        if profiling:
            prof.disable()
        if len(steps) > k:
            steps[-1]["wall"] = (time.perf_counter() - t) * 1e6
            mixed_seen += not steps[-1]["graph"]
    if cuda:
        torch.cuda.synchronize()
    total = time.perf_counter() - t_start
    for i, e0, e1 in events:
        if 0 <= i < len(steps):
            steps[i]["device_us"] = e0.elapsed_time(e1) * 1e3

    def summ(sel):
        return dict(
            steps=len(sel),
            wall_ms_sum=sum(s["wall"] for s in sel) / 1e3,
            wall_us_p50=pct([s["wall"] for s in sel], 50),
            device_us_p50=pct([s.get("device_us", 0) for s in sel], 50),
            exec_host_us_p50=pct([s.get("exec_host_us", 0) for s in sel], 50),
            tokens_p50=pct([s["tokens"] for s in sel], 50),
            n_p50=pct([s["n"] for s in sel], 50),
        )

    dec = [s for s in steps if s["graph"]]
    mix = [s for s in steps if not s["graph"]]
    res = dict(
        shape=a.shape,
        layers=cfg.get("num_hidden_layers"),
        pieces=llm.runner.mixed is not None,
        requests=a.requests,
        total_s=total,
        decode=summ(dec),
        mixed=summ(mix),
        device=torch.cuda.get_device_name() if cuda else "cpu",
    )
    st = pstats.Stats(prof) if mixed_seen > 20 else None  # (a short run profiled none)
    rows = sorted(st.stats.items(), key=lambda kv: -kv[1][2])[:30] if st and st.stats else []
    res["mixed_host_top"] = [
        dict(fn=f"{Path(k[0]).name}:{k[1]}({k[2]})", calls=v[1] / 20, own_us=v[2] / 20 * 1e6,
             cum_us=v[3] / 20 * 1e6)
        for k, v in rows
    ]  # fmt: skip
    if isinstance(tprof, tuple):
        ka = sorted(tprof[1], key=lambda e: -e.self_device_time_total)[:25]
        res["mixed_device_top"] = [
            dict(name=e.key[:90], us_a_step=e.self_device_time_total / 5, calls=e.count / 5)
            for e in ka
        ]
    if a.compiles:
        res["compiles"] = compiled
        print(f"{len(compiled)} compiles while serving ({len(steps)} steps):")
        for step, name, spec in compiled:
            print(f"  step {step:4d}  {name}  {spec[:160]}")
    print(json.dumps({k: v for k, v in res.items() if k not in ("mixed_host_top", "compiles")},
                     indent=1))  # fmt: skip
    for r in res["mixed_host_top"][:20]:
        print(f"{r['own_us']:9.1f} {r['cum_us']:9.1f} {r['calls']:6.1f}  {r['fn']}")
    if a.out:
        Path(a.out).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
