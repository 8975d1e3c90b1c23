"""The sampler with top-k / top-p (`engine.sampler.sample`: the keep thresholds, then the fused
draw) against its draw without them and against the sort-based masking it replaced
(`sorted_masking` below, the sampler's path until 2026-12-01: a sort of every row, then torch
passes); the kernel with its span passes for few rows (`keep_threshold.thr_plan`) and as one
program a row. Graph replays
of CALLS calls on fresh random float32 logits [n, V] (each call its own copy), us a call; and
how often the shipped path's draws agree with the old path's. Logits: N(0, 1) * SCALE, peaked
like a model's. The chain's variants: `CHAIN="passes:warps,..."` (span rounds
`THR_CHAIN_PASSES`, the pass kernel's `THR_PASS_WARPS`).

    [CHAIN=5:16,4:8] python dev/topk_topp_probe.py [n ...]   # GPU; default n 1 8 32 64 256
    PROFILE=1 python dev/topk_topp_probe.py [n ...]          # each kernel's device time
    python dev/topk_topp_probe.py --plot RECORD.json         # RECORD.png (any machine)
"""

from __future__ import annotations

import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from devtools import graph_us_per_call  # noqa: E402

import pagedattn.ops.fused as F  # noqa: E402
import pagedattn.ops.fused.keep_threshold as KT  # noqa: E402
from pagedattn.engine.sampler import SamplingTensors, sample  # noqa: E402
from pagedattn.engine.sampling_params import SamplingParams  # noqa: E402
from pagedattn.ops.fused import argmax_rows, sample_rows  # noqa: E402

V = 128256
CALLS = 10
SCALE = 4.0
CONFIGS = {
    "top_k 50": dict(temperature=1.0, top_k=50),
    "top_p 0.9": dict(temperature=1.0, top_p=0.9),
    "top_k 50 + top_p 0.9": dict(temperature=1.0, top_k=50, top_p=0.9),
    "top_p 0.999": dict(temperature=1.0, top_p=0.999),
}


def sorted_masking(logits, st):
    """The sampler's top-k / top-p path before the keep threshold (sort-based)."""
    t = st.temperature
    greedy = argmax_rows(logits)
    scaled = logits / torch.where(t > 0, t, 1.0)[:, None]
    sorted_l, order = scaled.sort(dim=-1, descending=True)
    keep = torch.arange(V, device=logits.device)[None, :] < st.top_k[:, None]
    probs = sorted_l.masked_fill(~keep, float("-inf")).softmax(dim=-1)
    keep &= probs.cumsum(dim=-1) - probs < st.top_p[:, None]
    keep_vocab = torch.empty_like(keep).scatter_(1, order, keep)
    scaled = scaled.masked_fill(~keep_vocab, float("-inf"))
    drawn = sample_rows(scaled, torch.ones_like(t), st.seeds, st.counters)
    return torch.where(t > 0, drawn, greedy)


def variants() -> dict[str, dict]:
    """The chain's variants to time (`CHAIN` in the environment: `passes:warps,...`; default
    the shipped constants)."""
    spec = os.environ.get("CHAIN", f"{KT.THR_CHAIN_PASSES}:{KT.THR_PASS_WARPS}")
    out = {}
    for item in spec.split(","):
        passes, warps = (int(v) for v in item.split(":"))
        out[f"chain P{passes} w{warps}"] = dict(THR_CHAIN_PASSES=passes, THR_PASS_WARPS=warps)
    return out


def profile(ns: list[int]) -> None:
    """Device us a call of each kernel of the shipped path (torch.profiler, 5 eager calls after
    a warm-up), for each n and filter."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as tprofile

    for n in ns:
        x = torch.randn(n, V, device="cuda") * SCALE
        for name, kw in CONFIGS.items():
            st = SamplingTensors.build(
                [SamplingParams(max_tokens=1, **kw)] * n, range(n), [0] * n, V, "cuda"
            )
            sample(x, st)
            torch.cuda.synchronize()
            with tprofile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(5):
                    sample(x, st)
                torch.cuda.synchronize()
            rows = {}
            for e in prof.key_averages():
                if e.device_type.name == "CUDA" and e.count:
                    rows[e.key] = (e.self_device_time_total / 5, e.count // 5)
            tot = sum(us for us, _ in rows.values())
            print(f"n {n} {name}: {tot:.1f} us of kernels: " + ", ".join(
                f"{k[:24]} {us:.1f} ({c})" for k, (us, c) in sorted(rows.items(),
                                                                  key=lambda r: -r[1][0])),
                  flush=True)  # fmt: skip


def plot(record: str) -> None:
    """RECORD.png beside a record of this probe (`rows`, `shipped`): us a call against rows,
    the shipped path of each setting (the chain up to THR_CHAIN_MAX_ROWS rows), the path
    before, and the draw alone."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rec = json.load(open(record))
    rows = rec["rows"]
    n = [r["n"] for r in rows]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name in CONFIGS:
        chain = f"{name} (chain P{KT.THR_CHAIN_PASSES} w{KT.THR_PASS_WARPS})"
        one = f"{name} (kernel, a program a row)"
        ys = [r[chain] if r["n"] <= KT.THR_CHAIN_MAX_ROWS else r[one] for r in rows]
        ax.plot(n, ys, marker="o", label=f"{name}: keep threshold + draw")
    before = [max(r[k + " (sort, before)"] for k in CONFIGS) for r in rows]
    ax.plot(n, before, "k--", marker="x", label="any of them: sort path before")
    ax.plot(n, [r["temperature 1"] for r in rows], "k:", label="temperature alone (the draw)")
    ax.set(xscale="log", yscale="log", xlabel="rows (128256 float32 logits)", ylabel="us a call",
           title=f"top-k / top-p sampling, {rec['device']}, {rec['date']}")  # fmt: skip
    ax.legend(fontsize=8)
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(record.removesuffix(".json") + ".png", dpi=120)


def main() -> None:
    if sys.argv[1:2] == ["--plot"]:
        plot(sys.argv[2])
        return
    ns = [int(a) for a in sys.argv[1:]] or [1, 8, 32, 64, 256]
    if os.environ.get("PROFILE"):
        profile(ns)
        return
    shipped = {k: getattr(KT, k) for k in ("THR_CHAIN_PASSES", "THR_PASS_WARPS")}
    for n in ns:
        xs = [torch.randn(n, V, device="cuda") * SCALE for _ in range(CALLS)]
        st = SamplingTensors.build([SamplingParams(temperature=1.0)] * n, range(n), [0] * n, V,
                                   "cuda")  # fmt: skip
        row = {"temperature 1": graph_us_per_call(lambda x, st=st: sample(x, st), xs)}
        for name, kw in CONFIGS.items():
            st = SamplingTensors.build(
                [SamplingParams(max_tokens=1, **kw)] * n, range(n), [0] * n, V, "cuda"
            )
            F.PREPARED_SAMPLE_ROWS.cache.clear()
            saved, KT.THR_CHAIN_MAX_ROWS = KT.THR_CHAIN_MAX_ROWS, 0
            row[name + " (kernel, a program a row)"] = graph_us_per_call(
                lambda x, st=st: sample(x, st), xs)  # fmt: skip
            KT.THR_CHAIN_MAX_ROWS = 2**31
            for vname, patch in variants().items():
                F.PREPARED_SAMPLE_ROWS.cache.clear()
                for k, v in patch.items():
                    setattr(KT, k, v)
                row[f"{name} ({vname})"] = graph_us_per_call(lambda x, st=st: sample(x, st), xs)
                for k, v in shipped.items():
                    setattr(KT, k, v)
            KT.THR_CHAIN_MAX_ROWS = saved
            F.PREPARED_SAMPLE_ROWS.cache.clear()
            same = sum(int((sample(x, st) == sorted_masking(x, st)).sum()) for x in xs)
            row[name + " (sort, before)"] = graph_us_per_call(
                lambda x, st=st: sorted_masking(x, st), xs)  # fmt: skip
            print(f"  n {n} {name}: {same} of {n * CALLS} draws equal the sort path's")
        print(f"n {n:4d} x {V}: " + ", ".join(f"{k} {v:7.1f} us" for k, v in row.items()),
              flush=True)  # fmt: skip
        if os.environ.get("OUT"):  # a JSON line a batch size, for the record
            with open(os.path.join(os.environ["OUT"], "topk_topp.jsonl"), "a") as fh:
                fh.write(json.dumps({"n": n, "V": V, "us": row}) + "\n")


if __name__ == "__main__":
    main()
