"""The benchmark suite: ceilings, peers and pagedattn in one process, on the same data.

Usage: python bench/run_all.py [--suites mha,mla,real,moe,model,serve] [--rounds 2] [--seed 0]
                               [--out bench/results/x.json]
       python bench/run_all.py --suite real        # the real-workload suite alone (~5 min)
Writes JSON and a PNG plot beside it (default name bench/results/<device>_<date>_<commit>.json),
and prints a ratio table and issue 5's MLA targets (`bench/targets.py`). With --rounds N
(default 2) the mha and mla suites run N times (fresh inputs and allocations each round) and
each (config, impl) keeps its fastest round; all rounds' times stay in extra["ms_rounds"]. On
the H100 some configs ran 1.1-1.5x slow for a whole round (a different one each process).

The real-workload suite (`bench/bench_real.py`: skewed and mixed batches, sparse MLA, host
cost) runs once, after the others, with the same ceilings, into its own `<out>_real.json` and
`<out>_real.png`, and prints issue 56's targets and its short table last.

The routed-experts suite (`bench/bench_moe.py`: `ops.moe` against torch's grouped matmuls at
the MoE models' decode and prefill shapes) runs next, into `<out>_moe.json` and `.png`.

The model suite (`bench/bench_model.py`: the engine's decode step on Llama-3-8B / 3.2-1B shapes
with random weights, against the roofline and transformers) is not in the default list; with
`--suite model` it runs last, with the same ceilings, into `<out>_model.json` and `.png`.

bench-serve (`bench/bench_serve.py`: `pagedattn bench-serve`'s workload, 1,000 requests, on a
random Llama-3.2-1B-shaped checkpoint in a temp folder) is not in the default list either; with
`--suite serve` it runs after the others, into `<out>_serve.json` and `.png`.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))

from common import (  # noqa: E402
    copy_bandwidth,
    default_out,
    environment,
    fastest_of,
    matmul_tflops,
    ratio_table,
    save,
)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--suites", "--suite", dest="suites", default="mha,mla,real,moe")
    ap.add_argument("--out", default=None, help="default bench/results/<device>_<date>_<commit>")
    ap.add_argument("--rounds", type=int, default=2, help="rounds of the mha and mla suites")
    ap.add_argument("--seed", type=int, default=0, help="the real suite's length generator")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print(
            "bench/run_all.py needs a CUDA device; the host benchmark is bench/bench_manager.py, "
            "the real suite's CPU dry run `bench/bench_real.py --dry-run`"
        )
        return
    env = environment()
    ceilings = {"copy_gbps": copy_bandwidth(), "mm_tflops": matmul_tflops()}
    print(f"[bench] {env}")
    print(
        f"[bench] copy {ceilings['copy_gbps']:.0f} GB/s, bf16 mm {ceilings['mm_tflops']:.0f} TF/s"
    )
    suites = args.suites.split(",")
    out = args.out or default_out(env)
    kernel_suites = [s for s in suites if s not in ("real", "model", "moe")]
    if kernel_suites:
        run_rounds(args, kernel_suites, out, env, ceilings)
    if "real" in suites:
        import bench_real

        real_out = out.rsplit(".", 1)[0] + "_real.json"
        bench_real.run_and_save(real_out, env, ceilings, seed=args.seed)
    if "moe" in suites:
        import bench_moe

        bench_moe.run_and_save(out.rsplit(".", 1)[0] + "_moe.json", env, ceilings, args.seed)
    if "model" in suites:
        import bench_model

        model_out = out.rsplit(".", 1)[0] + "_model.json"
        bench_model.run_and_save(model_out, env, ceilings, seed=args.seed)
    if "serve" in suites:
        import bench_serve

        bench_serve.main(["--out", out.rsplit(".", 1)[0] + "_serve.json", "--seed", str(args.seed)])


def run_rounds(args, suites: list[str], out: str, env: dict, ceilings: dict) -> None:
    """The mha / mla suites, `args.rounds` times, each (config, impl) its fastest round."""
    rounds: list[list] = []
    for _ in range(max(1, args.rounds)):
        records: list = []
        rounds.append(records)
        for suite in suites:
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
        save(out, env, ceilings, records)
    from plot import plot

    plot(out)
    print(f"[bench] {out}")
    print(ratio_table(records, ceilings))
    if "mla" in suites:
        from targets import target_table

        print(target_table(out))


if __name__ == "__main__":
    main()
