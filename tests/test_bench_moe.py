"""`bench/bench_moe.py` (the routed experts against torch's grouped matmuls): its CPU dry run
runs every case at toy size through both paths, checks them against the float32 reference and
writes the record the GPU run writes (bytes, FLOPs, the peer beside ours; FP8 without a peer)."""

from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "bench"))

import bench_moe  # noqa: E402


def test_dry_run_records_every_case(tmp_path):
    out = tmp_path / "moe.json"
    bench_moe.main(["--dry-run", "--out", str(out)])
    rec = json.loads(out.read_text())
    assert rec["suite"] == "moe" and rec["errors"] == [] and (tmp_path / "moe.png").exists()
    by = {(r["config"], r["impl"]): r for r in rec["records"]}
    for c in bench_moe.CASES:
        ours = by[(c.name, "pagedattn")]
        assert ours["bytes"] > 0 and ours["flops"] > 0 and ours["ms"] > 0
        assert ours["extra"]["cos_diff"] < bench_moe.MAX_COS_DIFF
        assert ((c.name, "torch-grouped_mm") in by) == (not c.fp8)
    only = bench_moe.run_and_save(str(tmp_path / "one.json"), {}, rec["ceilings"], dry=True,
                                  only="prefill")  # fmt: skip
    assert {r.config for r in only} == {"deepseek-v2-lite prefill 2048"}
