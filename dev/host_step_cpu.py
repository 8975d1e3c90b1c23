"""The engine's host time a decode step, on the CPU: a one-layer toy Llama behind the
emulated decode-graph path (`LLMEngine._emulate_cuda_graphs`), the replay stubbed out, so what
is timed is scheduling, the step's inputs, the static-buffer copies, sampling and outputs.
With `--profile`, the top functions by own time.

  python dev/host_step_cpu.py [--batch 64] [--steps 50] [--profile] [--async-scheduling]

(2026-11-29, the 2-core CPU of the dev machine: b64 1.40 -> 0.83 ms and b256 5.7 -> 3.2 ms
with `PagedKVCacheManager.alloc_decodes`; 2026-11-30, async scheduling: b64 0.43 -> 0.35 ms and
b256 1.38 -> 1.00 ms with the manager's per-slot arrays and the engine's batched bookkeeping;
2026-12-01, async scheduling: b64 0.38 -> 0.33 ms and b256 1.03 -> 0.83 ms with the scheduler's
and outputs' per-request calls inlined (docs/performance.md); single runs vary by ~+-30% under
load.)
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))

import bench_model as bm  # noqa: E402

from pagedattn.engine import LLMEngine, SamplingParams  # noqa: E402


class _Emulated(LLMEngine):
    _emulate_cuda_graphs = True


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--async-scheduling", action="store_true", help="the CUDA default")
    a = ap.parse_args()
    torch.set_num_threads(1)
    cfg = dict(bm.hf_config_dict("llama3-8b", dry=True), num_hidden_layers=1, vocab_size=256,
               hidden_size=16, intermediate_size=16, num_attention_heads=2,
               num_key_value_heads=1, head_dim=8)  # fmt: skip
    model = bm.build_model(cfg, "cpu", torch.float32, 0)
    b = a.batch
    eng = _Emulated(model, page_size=16, num_pages=b * 40 + 8, max_num_seqs=b,
                    max_num_batched_tokens=16384, max_model_len=600,
                    async_scheduling=a.async_scheduling)  # fmt: skip
    params = SamplingParams(max_tokens=a.steps * 2 + 40, temperature=0.0, ignore_eos=True)
    g = torch.Generator().manual_seed(0)
    for _ in range(b):
        eng.add_request({"prompt_token_ids": torch.randint(0, 256, (400,), generator=g).tolist()},
                        params)  # fmt: skip
    for _ in range(20):  # prefill, then a few decode steps
        eng.step()
    for graph in eng.runner.graphs.graphs.values():
        graph.fn = lambda: None  # the replay stubbed: host work only
    t0 = time.perf_counter()
    for _ in range(a.steps):
        eng.step()
    print(f"batch {b}: host {(time.perf_counter() - t0) / a.steps * 1e3:.3f} ms a decode step")
    if a.profile:
        pr = cProfile.Profile()
        pr.enable()
        for _ in range(a.steps // 2):
            eng.step()
        pr.disable()
        pstats.Stats(pr).sort_stats("tottime").print_stats(40)


if __name__ == "__main__":
    main()
