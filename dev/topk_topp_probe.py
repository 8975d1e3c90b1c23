"""The sampler with top-k / top-p (`engine.sampler.sample`: the keep thresholds, then the fused
draw) against its draw without them and against the sort-based masking it replaced
(`sorted_masking` below, the sampler's path until 2026-12-01: a sort of every row, then torch
passes); the kernel with its span passes for few rows (`keep_threshold.thr_plan`) and as one
program a row; the sort with the value threshold (`ops.fused._sample_sorted`). Graph replays
of CALLS calls on fresh random float32 logits [n, V] (each call its own copy), us a call; and
how often the draws agree. Logits: N(0, 1) * SCALE, peaked like a model's.

    python dev/topk_topp_probe.py [n ...]      # GPU; default 1 8 32 64 256 at V = 128256
"""

from __future__ import annotations

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


def main() -> None:
    ns = [int(a) for a in sys.argv[1:]] or [1, 8, 32, 64, 256]
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
            F.FILTER_MIN_ROWS = 2**31
            row[name + " (sort, value ties)"] = graph_us_per_call(lambda x, st=st: sample(x, st),
                                                                 xs)  # fmt: skip
            F.PREPARED_SAMPLE_ROWS.cache.clear()
            F.FILTER_MIN_ROWS = 0
            KT.THR_CHAIN_MAX_ROWS = 0
            row[name + " (kernel, a program a row)"] = graph_us_per_call(
                lambda x, st=st: sample(x, st), xs)  # fmt: skip
            F.PREPARED_SAMPLE_ROWS.cache.clear()
            KT.THR_CHAIN_MAX_ROWS = 2**31
            row[name + " (kernel)"] = graph_us_per_call(lambda x, st=st: sample(x, st), xs)
            same = sum(int((sample(x, st) == sorted_masking(x, st)).sum()) for x in xs)
            row[name + " (sort, before)"] = graph_us_per_call(
                lambda x, st=st: sorted_masking(x, st), xs)  # fmt: skip
            print(f"  n {n} {name}: {same} of {n * CALLS} draws equal the sort path's")
        print(f"n {n:4d} x {V}: " + ", ".join(f"{k} {v:7.1f} us" for k, v in row.items()),
              flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
