"""A/B of decode launch knobs (`DecodeConfig` fields through PAGEDATTN_MHA_TUNING) on a
model's captured decode step, in one process.

Serves bench_model's case (random weights, b requests of 512 tokens, the engine's graphs),
then captures the model's decode step on the decode graph's static inputs once per variant
(`--variants`: a JSON list of {"decode": {...}} overrides; {} is the default), checks every
capture's logits equal the first's bit for bit, and times the captures' replays alternated in
rounds (median of each round's mean): the step's device time with only the knob changed. Also
each variant's kernels of a replay by name (torch.profiler, us a replay).

Usage (GPU): python dev/decode_variants_probe.py [--shape llama3.2-1b] [--b 64]
             [--variants '[{}, {"decode": {"num_stages": 4}}]'] [--rounds 7] [--out F.json]

(First used for the decode's work item before its PDL wait, tried and reverted: commit
0bdb019, docs/kernels/pdl.md.)
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))

import bench_model  # noqa: E402
from bench_model import CASES, Ctx, build_model, hf_config_dict, kernel_table, prompts, serve  # noqa: E402

REPLAYS = 50  # a round's replays of one capture


def capture(model, bufs, b: int, variant: dict):
    """(graph, its logits) of the model's step on bucket b's static inputs under `variant`."""
    os.environ["PAGEDATTN_MHA_TUNING"] = json.dumps(variant)

    def call():
        return model(bufs.input_ids[:b], bufs.positions[:b], bufs.kv_rows(b),
                     bufs.q_row_offsets[: b + 1], bufs.logits_rows[:b])  # fmt: skip

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s), torch.inference_mode():
        call()  # (compiles and prepares outside the capture)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=s):
            out = call()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    os.environ.pop("PAGEDATTN_MHA_TUNING")
    return g, out


def per_replay_ms(g) -> float:
    a, z = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(REPLAYS):
        g.replay()
    z.record()
    z.synchronize()
    return a.elapsed_time(z) / REPLAYS


def kernels(g, n: int = 20) -> list[dict]:
    from torch.profiler import ProfilerActivity, profile  # noqa: PLC0415

    g.replay()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            g.replay()
        torch.cuda.synchronize()
    total, rows = kernel_table(prof, n, True)
    return [dict(total_us=round(total, 1))] + rows[:12]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="llama3.2-1b")
    ap.add_argument("--b", type=int, default=64)
    ap.add_argument("--variants", default='[{}, {"decode": {"num_stages": 4}}]')
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    variants = json.loads(a.variants)
    case = next(c for c in CASES if c.shape == a.shape and c.b == a.b)
    case = bench_model.replace(case, steps=5, warmup=2)
    ctx = Ctx([], {}, 0, False)
    cfg = hf_config_dict(a.shape)
    model = build_model(cfg, ctx.dev, ctx.dtype, 0)
    toks = prompts(case, cfg["vocab_size"], 0)
    eng = serve(ctx, case, model, toks, graphs=True)["engine"]
    bufs = eng.runner.graphs.buffers
    caps = [capture(model, bufs, a.b, v) for v in variants]
    same = [bool(torch.equal(c[1], caps[0][1])) for c in caps]
    for g, _ in caps:
        per_replay_ms(g)
    rounds: list[list[float]] = [[] for _ in variants]
    for _ in range(a.rounds):
        for i, (g, _) in enumerate(caps):
            rounds[i].append(per_replay_ms(g))
    med = [sorted(r)[len(r) // 2] for r in rounds]
    prof = [kernels(g) for g, _ in caps]
    out = dict(shape=a.shape, b=a.b, variants=variants, replay_ms_median=med,
               replay_ms_rounds=rounds, logits_equal_to_first=same, kernels=prof,
               device=torch.cuda.get_device_name())  # fmt: skip
    for v, m, r, e in zip(variants, med, rounds, same):
        rng = f"rounds {min(r):.4f}-{max(r):.4f}; {m / med[0]:.4f} of the first"
        print(f"{a.shape} b{a.b} {json.dumps(v):40s} replay {m:.4f} ms ({rng}) equal={e}")
    for v, rows in zip(variants, prof):
        print(f"kernels, {json.dumps(v)} (us a replay): total {rows[0]['total_us']}")
        for r in rows[1:7]:
            print(f"  {r['us']:8.1f} {r['calls']:5.0f}x {r['name'][:80]}")
    if a.out:
        with open(a.out, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
