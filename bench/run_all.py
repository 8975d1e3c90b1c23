"""The benchmark suite: ceilings, peers and pagedattn in one process, on the same data.

Usage: python bench/run_all.py [--suites mha,mla] [--out bench/results/h100.json]
Writes JSON and a PNG plot beside it, and prints a ratio table last.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))

from common import copy_bandwidth, environment, matmul_tflops, ratio_table, save  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--suites", default="mha,mla")
    ap.add_argument("--out", default="bench/results/latest.json")
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
    records = []
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
        save(args.out, env, ceilings, records)
    from plot import plot

    plot(args.out)
    print(ratio_table(records, ceilings))


if __name__ == "__main__":
    main()
