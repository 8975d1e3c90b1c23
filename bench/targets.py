"""Issue 5's MLA decode targets (H100 figures, DESIGN.md section 6) against a suite's results
JSON (`bench/run_all.py`, which prints this table last): one row a target with the measured
value, the goal and whether it is met; a target whose records (or peer) the run lacks is left
out.

    python bench/targets.py bench/results/<run>.json
"""

from __future__ import annotations

import json
import sys

from bench_mla import dense_config, sparse_config

# (label, what is measured, goal): b 128, page 64, as `bench_mla` runs them
GOALS = {
    "copy": 0.96,  # dense bf16 h_q 16: fraction of the copy bandwidth
    "fa3": 1.0,  # ... and at least FlashInfer fa3's speed
    "h128": 560.0,  # dense bf16 h_q 128: TFLOP/s
    "fp8": 1.7,  # rope-aware FP8 h_q 16: times the bf16 speed
    "v32": 350.0,  # sparse V32 s_q 2 h_q 128 top-k 2048: TFLOP/s
}


def target_rows(data: dict) -> list[tuple[str, float, float]]:
    """(label, measured, goal) for each target the results hold."""
    recs = {(r["config"], r["impl"]): r for r in data["records"]}
    copy = data["ceilings"]["copy_gbps"]

    def rec(cfg: str, impl: str = "pagedattn") -> dict | None:
        return recs.get((cfg, impl))

    rows = []
    for s_k in (4096, 8192):
        bf16 = rec(dense_config(None, 128, s_k, 64, 16))
        fa3 = rec(dense_config(None, 128, s_k, 64, 16), "flashinfer-fa3")
        fp8 = rec(dense_config("mla_rope_aware", 128, s_k, 64, 16))
        h128 = rec(dense_config(None, 128, s_k, 64, 128))
        if bf16:
            rows.append((f"bf16 h_q 16 s_k {s_k}: of copy", bf16["gbps"] / copy, GOALS["copy"]))
        if bf16 and fa3:
            rows.append((f"bf16 h_q 16 s_k {s_k}: x FlashInfer fa3", fa3["ms"] / bf16["ms"],
                         GOALS["fa3"]))  # fmt: skip
        if h128:
            rows.append((f"bf16 h_q 128 s_k {s_k}: TFLOP/s", h128["tflops"], GOALS["h128"]))
        if bf16 and fp8:
            rows.append((f"rope-aware FP8 h_q 16 s_k {s_k}: x bf16", bf16["ms"] / fp8["ms"],
                         GOALS["fp8"]))  # fmt: skip
    v32 = rec(sparse_config("flashmla_v32", 128, 2, 128, 2048))
    if v32:
        rows.append(("sparse V32 s_q 2 h_q 128 top-k 2048: TFLOP/s", v32["tflops"], GOALS["v32"]))
    return rows


def target_table(path: str) -> str:
    """The rows of `target_rows` for the results JSON at `path`, with its device."""
    with open(path) as fh:
        data = json.load(fh)
    device = data.get("env", {}).get("device", "?")
    lines = [f"issue 5 targets (H100 figures), measured on {device}:"]
    for label, got, goal in target_rows(data):
        lines.append(
            f"  {label:<46} {got:>8.3f}  goal {goal:>7.3f}  {'met' if got >= goal else 'NOT met'}"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    print(target_table(sys.argv[1]))
