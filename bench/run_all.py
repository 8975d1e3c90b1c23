"""The benchmark suite: ceilings, peers and pagedattn in one process, on the same data.

Usage: python bench/run_all.py [--suites mha,mla] [--rounds 2] [--out bench/results/x.json]
Writes JSON and a PNG plot beside it, and prints a ratio table and issue 5's MLA targets
(`bench/targets.py`) last. With --rounds N (default 2) every suite runs N times (fresh inputs
and allocations each round) and each (config, impl) keeps its fastest round; all rounds' times
stay in extra["ms_rounds"]. On the H100 some configs ran 1.1-1.5x slow for a whole round (a
different one each process).
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))

from common import (  # noqa: E402
    copy_bandwidth,
    environment,
    fastest_of,
    matmul_tflops,
    ratio_table,
    save,
)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--suites", default="mha,mla")
    ap.add_argument("--out", default="bench/results/latest.json")
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("bench/run_all.py needs a CUDA device; the host benchmark is bench/bench_manager.py")
        return
    env = environment()
    ceilings = {"copy_gbps": copy_bandwidth(), "mm_tflops": matmul_tflops()}
    print(f"[bench] {env}")
    print(
        f"[bench] copy {ceilings['copy_gbps']:.0f} GB/s, bf16 mm {ceilings['mm_tflops']:.0f} TF/s"
    )
    rounds: list[list] = []
    for _ in range(max(1, args.rounds)):
        records: list = []
        rounds.append(records)
        for suite in args.suites.split(","):
            try:
                if suite == "mha":
                    import bench_mha

                    bench_mha.run(records)
                elif suite == "mla":
                    import bench_mla

                    bench_mla.run(records)
            except Exception as e:  # keep the other suites' numbers
                import traceback

                traceback.print_exc()
                print(f"[bench] suite {suite} failed: {e}")
        records = fastest_of(rounds)
        save(args.out, env, ceilings, records)
    from plot import plot

    plot(args.out)
    print(ratio_table(records, ceilings))
    if "mla" in args.suites.split(","):
        from targets import target_table

        print(target_table(args.out))


if __name__ == "__main__":
    main()
