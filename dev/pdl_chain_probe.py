"""The PDL chain on a model's decode step (issue 57): bench_model's case served with graphs
and async scheduling, then the engine's step (median ms over its timed steps) and the captured
decode graph's replay alone (median of REPLAYS), with the first request's greedy tokens hashed
so that two runs (PAGEDATTN_PDL unset / 1, one process each: the variable is read when a graph
is captured) can be checked to give the same tokens.

    PAGEDATTN_PDL=1 python dev/pdl_chain_probe.py [--shape llama3.2-1b,llama3-8b] [--b 64]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))

import bench_model as bm  # noqa: E402

REPLAYS = 200


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="llama3.2-1b,llama3-8b")
    ap.add_argument("--b", type=int, default=64)
    ap.add_argument("--dry-run", action="store_true", help="CPU, tiny sizes (the probe's code)")
    a = ap.parse_args()
    for shape in a.shape.split(","):
        case = next(c for c in bm.CASES if c.shape == shape and c.b == a.b)
        ctx = bm.Ctx([], {}, 0, a.dry_run)
        case = bm.shrink(case) if a.dry_run else case
        cfg = bm.hf_config_dict(shape, a.dry_run)
        model = bm.build_model(cfg, ctx.dev, ctx.dtype, 0)
        toks = bm.prompts(case, cfg["vocab_size"], 0)
        res = bm.serve(ctx, case, model, toks, graphs=True)
        eng = res["engine"]
        ms = sorted(res["ms"])
        rep = [bm.replay_ms(ctx, eng, case.b, 3 if a.dry_run else REPLAYS) for _ in range(3)]
        outs = sorted(eng.step(), key=lambda o: o.request_id)  # every request's tokens so far
        toks_all = [list(o.outputs[0].token_ids) for o in outs]
        digest = hashlib.sha1(json.dumps(toks_all).encode()).hexdigest()[:10]
        row = dict(shape=shape, b=case.b, pdl=os.environ.get("PAGEDATTN_PDL"),
                   step_ms=round(ms[len(ms) // 2], 4), replay_ms=[round(r, 4) for r in rep],
                   tokens=digest, errors=ctx.errors)  # fmt: skip
        print(json.dumps(row))
        del eng, res, model
        if not a.dry_run:
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
