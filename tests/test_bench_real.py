"""`bench/bench_real.py` (issue 56's real-workload suite): its CPU dry run runs every case at
tiny sizes with the reference backend, checks each output against the float32 torch reference
and writes the JSON record (and plot) the GPU run writes; the record's fields are checked here."""

from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "bench"))

import bench_real  # noqa: E402
from common import device_tag  # noqa: E402
from targets import REAL_TARGETS, real_target_rows  # noqa: E402


def test_lengths_are_seeded_clipped_and_summarised():
    a = bench_real.draw_lengths(("lognormal", 1536), 256, seed=7)
    assert a == bench_real.draw_lengths(("lognormal", 1536), 256, seed=7)
    assert a != bench_real.draw_lengths(("lognormal", 1536), 256, seed=8)
    assert min(a) >= 32 and max(a) <= 32768 and 700 < sorted(a)[128] < 3000
    one = bench_real.draw_lengths(("onelong", 32768, 200), 64, seed=0)
    assert sorted(one) == [200] * 63 + [32768]
    s = bench_real.summary(one)
    assert (s["median"], s["max"], s["sum"]) == (200.0, 32768, 63 * 200 + 32768)
    # decodes see all their keys; a chunk of 512 over 1024 cached sees 1025..1536
    assert bench_real.visible_keys([100, 1536], [1, 512]) == 100 + sum(range(1025, 1537))


def test_device_tag():
    assert device_tag("NVIDIA H200") == "h200"
    assert device_tag("NVIDIA H100 80GB HBM3") == "h100"
    assert device_tag("?") == "gpu"


def test_dry_run_record(tmp_path):
    out = tmp_path / "real.json"
    bench_real.main(["--dry-run", "--out", str(out)])
    data = json.loads(out.read_text())
    assert data["suite"] == "real" and data["dry_run"] is True and data["seed"] == 0
    assert data["errors"] == []
    names = [c.name for c in bench_real.CASES]
    assert list(data["case_seconds"]) == names
    recs = {(r["config"], r["impl"]): r for r in data["records"]}
    for case in bench_real.CASES:
        r = recs[(case.name, "pagedattn")]
        e = r["extra"]
        assert r["suite"] == "real" and r["ms"] > 0 and e["seed"] == 0
        assert e["group"] == case.group and e["dry_run"] is True
        assert {"median", "p99", "max", "sum"} <= set(e["lengths"])
        assert e["cos_vs_ref"] >= bench_real.MIN_COS
        if case.kind.startswith("host"):
            assert e["us_per_call"] > 0
            if case.kind == "host-mha":
                assert recs[(case.name, "torch-sdpa")]["extra"]["cos_vs_ref"] >= 0.999
        else:
            assert r["bytes"] > 0 and r["flops"] > 0
            assert e["roofline_ms"] > 0 and e["frac_roofline"] > 0 and e["bound"] in ("copy", "mm")
            assert (
                abs(e["frac_roofline"] - e["roofline_ms"] / r["ms"])
                < 1e-3 + 1e-3 * e["frac_roofline"]
            )
    if _has_matplotlib():
        assert (tmp_path / "real.png").stat().st_size > 0
    # every targeted group yields its rows (no FlashInfer in a dry run: no "x FlashInfer")
    rows = real_target_rows(data)
    labels = [label for label, *_ in rows]
    assert any(label.endswith("us per eager call") for label in labels)
    assert not any("FlashInfer" in label for label in labels)
    assert {g for g in REAL_TARGETS} <= {c.group for c in bench_real.CASES}
    host = [row for row in rows if row[0].endswith("us per eager call")]
    assert all(met == (got <= goal) for _, got, goal, met in host)


def _has_matplotlib() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True
