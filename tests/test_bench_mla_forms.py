"""`bench/bench_mla_forms.py` (issue 58's absorbed / expanded crossover): its CPU dry run times
both forms of a toy DeepSeek attention layer on the same cache and queries and writes the
record; the two forms give the same output (float32), so the timings compare equal work."""

from __future__ import annotations

import json
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "bench"))

import bench_mla_forms  # noqa: E402

pytest.importorskip("transformers")


def test_dry_run_record(tmp_path):
    out = tmp_path / "forms.json"
    bench_mla_forms.main(["--dry-run", "--out", str(out)])
    d = json.loads(out.read_text())
    assert d["suite"] == "mla_forms" and d["dry_run"] is True
    recs = d["records"]
    assert {r["impl"] for r in recs} == {"absorbed", "expanded"}
    assert len(recs) == 2 * 2 * 2  # 2 prefixes x 2 query counts x 2 forms
    for r in recs:
        e = r["extra"]
        assert e["cos_diff"] < 1e-9 and r["ms"] > 0
        pair = [x["ms"] for x in recs if x["config"] == r["config"]]
        assert e["faster"] == ("absorbed", "expanded")[pair.index(min(pair))]
    assert d["absorbed_wins_every_case"] == all(r["extra"]["faster"] == "absorbed" for r in recs)
