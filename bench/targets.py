"""Targets against a suite's results JSON (`bench/run_all.py` prints them): one row a target
with the measured value, the goal and whether it is met; a target whose records (or peer) the
run lacks is left out.

- Issue 5's MLA decode targets (H100 figures), on the mha/mla suites' JSON (`target_rows`).
- Issue 56's real-workload targets (DESIGN.md section 6), on the real suite's JSON
  (`bench/bench_real.py`, `real_target_rows`): each pagedattn record names its case's group in
  extra["group"]; `REAL_TARGETS` says what each group must reach.

    python bench/targets.py bench/results/<run>.json        # either kind of JSON
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


# Issue 56's targets (H200, DESIGN.md section 6): (metric, goal); every goal is a minimum but
# "host_us", a maximum. Metrics: "copy" GB/s over the run's copy bandwidth, "roofline" the
# roofline time over ours, "tflops", "x_fi" FlashInfer's time over ours, "host_us" wall us per
# eager call. Skewed GQA decode counts from batch 64 up (`REAL_MIN_BATCH`).
REAL_TARGETS = {
    "skew-gqa": [("copy", 0.85), ("x_fi", 1.5)],
    "onelong-gqa": [("copy", 0.7)],
    "onelong-mla": [("copy", 0.7)],
    "skew-mla-h16": [("copy", 0.85), ("x_fi", 1.3)],
    "skew-mla-h128": [("tflops", 500.0), ("x_fi", 1.3)],
    "mixed": [("roofline", 0.7), ("x_fi", 1.5)],
    "host": [("host_us", 20.0)],
}
REAL_MIN_BATCH = {"skew-gqa": 64}
_METRIC_LABEL = {"copy": "of copy", "roofline": "of roofline", "tflops": "TFLOP/s",
                 "x_fi": "x FlashInfer", "host_us": "us per eager call"}  # fmt: skip


def real_target_rows(data: dict) -> list[tuple[str, float, float, bool]]:
    """(label, measured, goal, met) for each issue 56 target the real suite's results hold."""
    copy = data.get("ceilings", {}).get("copy_gbps")
    rows = []
    for r in data["records"]:
        e = r.get("extra", {})
        group = e.get("group")
        if r.get("suite") != "real" or r.get("impl") != "pagedattn" or group not in REAL_TARGETS:
            continue
        if e.get("batch", 0) < REAL_MIN_BATCH.get(group, 0):
            continue
        for metric, goal in REAL_TARGETS[group]:
            got = {
                "copy": r.get("gbps", 0.0) / copy if copy else None,
                "roofline": e.get("frac_roofline"),
                "tflops": r.get("tflops"),
                "x_fi": e.get("x_flashinfer"),
                "host_us": e.get("us_per_call"),
            }[metric]
            if got is None:
                continue
            met = got <= goal if metric == "host_us" else got >= goal
            rows.append((f"{r['config']}: {_METRIC_LABEL[metric]}", got, goal, met))
    return rows


def _row(label: str, got: float, goal: float, met: bool, width: int = 46) -> str:
    return f"  {label:<{width}} {got:>8.3f}  goal {goal:>7.3f}  {'met' if met else 'NOT met'}"


def real_target_table(path: str) -> str:
    """The rows of `real_target_rows` for the results JSON at `path`, with its device."""
    with open(path) as fh:
        data = json.load(fh)
    device = data.get("env", {}).get("device", "?")
    lines = [f"issue 56 targets (real workloads), measured on {device}:"]
    for label, got, goal, met in real_target_rows(data):
        lines.append(_row(label, got, goal, met, 60))
    return "\n".join(lines)


def target_table(path: str) -> str:
    """The rows of `target_rows` for the results JSON at `path`, with its device (and, for a
    real suite's JSON, `real_target_table`'s instead)."""
    with open(path) as fh:
        data = json.load(fh)
    if data.get("suite") == "real":
        return real_target_table(path)
    device = data.get("env", {}).get("device", "?")
    lines = [f"issue 5 targets (H100 figures), measured on {device}:"]
    for label, got, goal in target_rows(data):
        lines.append(_row(label, got, goal, got >= goal))
    return "\n".join(lines)


if __name__ == "__main__":
    print(target_table(sys.argv[1]))
