"""Host cost of one decode step: alloc + runtime_inputs + step, for 1, 64 and 256 requests.

Usage: python bench/bench_manager.py [--out bench/results/manager_cpu.json]
Target (issue 2): under 0.5 ms a step at 256 requests on a 2-core CPU.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from datetime import date

import torch

from pagedattn import KVCacheParams, PagedKVCacheManager


def bench(batch: int, steps: int = 200, page_size: int = 16) -> dict:
    p = KVCacheParams(torch.bfloat16, 1, 8, 128, page_size, num_q_heads=32)
    m = PagedKVCacheManager(
        p, batch * (400 // page_size + 1) + 64, max_batch_size=batch, max_seq_len=4096
    )
    rids = list(range(batch))
    for r in rids:
        m.claim(r, [r % 97 + i for i in range(100 + 7 * r % 50)])
        m.alloc(r, len(m.tokens(r)) - m.cache_length(r))
    m.runtime_inputs(rids)
    m.step(rids, [[1]] * batch)
    timings = {"alloc": [], "runtime_inputs": [], "step": []}
    for i in range(steps):
        t0 = time.perf_counter()
        for r in rids:
            m.alloc(r, 1)
        t1 = time.perf_counter()
        m.runtime_inputs(rids)
        t2 = time.perf_counter()
        m.step(rids, [[i]] * batch)
        t3 = time.perf_counter()
        timings["alloc"].append(t1 - t0)
        timings["runtime_inputs"].append(t2 - t1)
        timings["step"].append(t3 - t2)

    def med(x):
        return sorted(x)[len(x) // 2] * 1e6

    out = {k: med(v) for k, v in timings.items()}
    out["runtime_inputs+step"] = med(
        [a + b for a, b in zip(timings["runtime_inputs"], timings["step"])]
    )
    return {"batch": batch, **{f"{k}_us": round(v, 1) for k, v in out.items()}}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    rows = [bench(b) for b in (1, 64, 256)]
    print(
        f"{'batch':>6} {'alloc us':>10} {'runtime_inputs us':>18} {'step us':>9} "
        f"{'inputs+step us':>15}"
    )
    for r in rows:
        print(
            f"{r['batch']:>6} {r['alloc_us']:>10} {r['runtime_inputs_us']:>18} {r['step_us']:>9} "
            f"{r['runtime_inputs+step_us']:>15}"
        )
    if args.out:
        meta = {
            "date": str(date.today()),
            "cpu": platform.processor() or platform.machine(),
            "torch": torch.__version__,
            "rows": rows,
        }
        with open(args.out, "w") as f:
            json.dump(meta, f, indent=1)


if __name__ == "__main__":
    main()
