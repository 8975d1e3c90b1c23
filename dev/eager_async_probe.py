"""Probe: eager decode steps (`enforce_eager=True`) with and without async scheduling, on the
Llama-3-8B shape at b64 (bench_model's case), alternating engines to expose drift. With
`--profile`: one async eager engine's serve (its prefill and decode steps) under cProfile,
the functions with the most own and cumulative host time (where an eager step's host time
goes).
GPU only: python dev/eager_async_probe.py [--shape llama3-8b] [--b 64] [--profile]"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import replace

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))

import bench_model as bm  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="llama3-8b")
    ap.add_argument("--b", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args()
    case = next(c for c in bm.CASES if c.shape == args.shape)
    case = replace(case, b=args.b, steps=24)
    ctx = bm.Ctx([], {}, 0, False)
    model = bm.build_model(bm.hf_config_dict(args.shape, False), ctx.dev, ctx.dtype, 0)
    toks = bm.prompts(case, model.config.vocab_size, 1)
    if args.profile:
        import cProfile
        import pstats

        bm.serve(ctx, case, model, toks, graphs=False, overlap=True)  # warm: compiles
        bm._free(ctx)
        prof = cProfile.Profile()
        res = prof.runcall(bm.serve, ctx, case, model, toks, graphs=False, overlap=True)
        ms = sorted(res["ms"])
        print(f"eager async (profiled): median step {ms[len(ms) // 2]:.2f} ms", flush=True)
        st = pstats.Stats(prof)
        st.sort_stats("tottime").print_stats(30)
        st.sort_stats("cumulative").print_stats(60)
        return
    for r in range(args.rounds):
        for overlap in (False, True):
            res = bm.serve(ctx, case, model, toks, graphs=False, overlap=overlap)
            del res["engine"]
            bm._free(ctx)
            ms = sorted(res["ms"])
            print(f"round {r} eager async={overlap}: median {ms[len(ms) // 2]:.2f} ms, "
                  f"min {ms[0]:.2f}, max {ms[-1]:.2f}", flush=True)  # fmt: skip
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
