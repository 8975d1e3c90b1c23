"""`bench/targets.py`: issue 5's targets read from a suite's results JSON."""

from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "bench"))

from targets import GOALS, target_rows, target_table  # noqa: E402


def _rec(config: str, impl: str, ms: float, gbps: float = 0.0, tflops: float = 0.0) -> dict:
    return dict(suite="mla", config=config, impl=impl, ms=ms, gbps=gbps, tflops=tflops)


def _results(with_fa3: bool) -> dict:
    recs = [
        _rec("bf16 b128 sk4096 p64 hq16", "pagedattn", 0.150, gbps=3900.0),
        _rec("mla_rope_aware b128 sk4096 p64 hq16", "pagedattn", 0.085),  # 1.765x
        _rec("bf16 b128 sk8192 p64 hq16", "pagedattn", 0.280, gbps=4150.0),
        _rec("mla_rope_aware b128 sk8192 p64 hq16", "pagedattn", 0.170),  # 1.647x
        _rec("bf16 b128 sk4096 p64 hq128", "pagedattn", 0.26, tflops=561.0),
        _rec("bf16 b128 sk8192 p64 hq128", "pagedattn", 0.53, tflops=559.9),
        _rec("sparse flashmla_v32 b128 sq2 hq128 topk2048", "pagedattn", 0.41, tflops=351.0),
    ]
    if with_fa3:
        recs += [
            _rec("bf16 b128 sk4096 p64 hq16", "flashinfer-fa3", 0.1485),
            _rec("bf16 b128 sk8192 p64 hq16", "flashinfer-fa3", 0.30),
        ]
    return dict(env=dict(device="GPU X"), ceilings=dict(copy_gbps=4200.0), records=recs)


def test_each_target_is_measured_and_judged():
    rows = {label: (got, goal) for label, got, goal in target_rows(_results(True))}
    assert len(rows) == 9
    got, goal = rows["bf16 h_q 16 s_k 4096: of copy"]
    assert abs(got - 3900 / 4200) < 1e-12 and goal == GOALS["copy"] and got < goal
    assert rows["bf16 h_q 16 s_k 8192: of copy"][0] > GOALS["copy"]
    assert abs(rows["bf16 h_q 16 s_k 4096: x FlashInfer fa3"][0] - 0.1485 / 0.150) < 1e-12
    assert abs(rows["rope-aware FP8 h_q 16 s_k 4096: x bf16"][0] - 0.150 / 0.085) < 1e-12
    assert rows["bf16 h_q 128 s_k 8192: TFLOP/s"] == (559.9, GOALS["h128"])
    assert rows["sparse V32 s_q 2 h_q 128 top-k 2048: TFLOP/s"] == (351.0, GOALS["v32"])


def test_table_says_which_are_met_and_leaves_out_missing_peers(tmp_path):
    path = tmp_path / "run.json"
    path.write_text(json.dumps(_results(False)))
    lines = target_table(str(path)).splitlines()
    assert "GPU X" in lines[0]
    assert len(lines) == 1 + 7  # no FlashInfer rows
    assert not any("FlashInfer" in line for line in lines)

    def verdict(label: str) -> str:
        (line,) = [line for line in lines if line.strip().startswith(label)]
        return "NOT met" if line.endswith("NOT met") else "met"

    assert verdict("rope-aware FP8 h_q 16 s_k 4096") == "met"
    assert verdict("rope-aware FP8 h_q 16 s_k 8192") == "NOT met"
    assert verdict("bf16 h_q 128 s_k 4096") == "met"
    assert verdict("bf16 h_q 128 s_k 8192") == "NOT met"
    assert verdict("bf16 h_q 16 s_k 4096") == "NOT met"  # 0.929 of copy
