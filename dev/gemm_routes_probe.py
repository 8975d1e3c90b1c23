"""Probe (GPU): the linears' paths (`models.gemm_routes`) on `bench_model`'s decode cases: each
shape's graph time by path at the decode buckets, then the engine's decode step and the
captured graph's replay with the routes and with every linear on F.linear, alternated.

  python dev/gemm_routes_probe.py [--shapes llama3.2-1b llama3-8b] [--rounds 2] [--out F.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))

import bench_model as bm  # noqa: E402

from pagedattn.engine.cuda_graphs import decode_buckets  # noqa: E402
from pagedattn.engine.llm_engine import LLMEngine  # noqa: E402
from pagedattn.models import gemm_routes as GR  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", nargs="*", default=["llama3.2-1b", "llama3-8b"])
    ap.add_argument("--b", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    ctx = bm.Ctx([], {}, 0, False)
    rec = {}
    for shape in a.shapes:
        case = next(c for c in bm.CASES if c.shape == shape and c.b == a.b)
        cfg = bm.hf_config_dict(shape)
        model = bm.build_model(cfg, ctx.dev, ctx.dtype, 0)
        times: dict = {}
        GR.measure_gemm_routes(model, decode_buckets(a.b), times=times)
        count = {(n, k): len(v) for (n, k, _), v in GR.routable_linears(model).items()}
        rows = {f"{n} x {k} @ {m}": {p: round(t * 1e3 / count[n, k], 2) for p, t in v.items()}
                for (n, k, m), v in times.items() if m in (1, 8, 16, 32, 64)}  # fmt: skip
        print(f"{shape}: us a call (a graph over the shape's weights, over their count)")
        for key, v in rows.items():
            print(f"  {key:28s} {v}")
        toks = bm.prompts(case, cfg["vocab_size"], 0)
        runs = {"routes": [], "linear": []}
        for _ in range(a.rounds):
            for mode in ("routes", "linear"):
                LLMEngine._route_gemms = mode == "routes"
                res = bm.serve(ctx, case, model, toks, graphs=True)
                eng = res.pop("engine")
                rep = bm.replay_ms(ctx, eng, case.b, 20)
                step = sorted(res["ms"])[len(res["ms"]) // 2]
                runs[mode].append(dict(step_ms=round(step, 4), replay_ms=round(rep, 4),
                                       routes=GR.describe_routes(eng.gemm_routes)))  # fmt: skip
                print(
                    f"  {mode:7s} step {step:.4f} ms  replay {rep:.4f} ms  "
                    f"{GR.describe_routes(eng.gemm_routes) if mode == 'routes' else ''}"
                )
                del eng, res
                bm._free(ctx)
        LLMEngine._route_gemms = True
        rec[shape] = dict(path_ms=rows, runs=runs)
        del model
        bm._free(ctx)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(dict(device=torch.cuda.get_device_name(), b=a.b, shapes=rec), f, indent=1)


if __name__ == "__main__":
    main()
