"""`bench/bench_serve.py` (issue 57's bench-serve on a model shape): its CPU dry run writes the
shape's random checkpoint (toy sizes), serves the synthetic workload through the engine and
writes the record the GPU run writes; the checkpoint loads as the model the model benchmarks
build from the same seed, and a folder that holds it is reused."""

from __future__ import annotations

import json
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "bench"))

import bench_model  # noqa: E402
import bench_serve  # noqa: E402

from pagedattn.models import load_model  # noqa: E402

pytest.importorskip("transformers")


def test_dry_run_serves_every_request(tmp_path):
    out = tmp_path / "serve.json"
    ckpt = tmp_path / "ckpt"
    res = bench_serve.main(["--dry-run", "--ckpt", str(ckpt), "--out", str(out)])
    rec = json.loads(out.read_text())
    assert (tmp_path / "serve.png").exists()
    s = rec["summary"]
    assert s["requests"] == len(rec["requests"]) == 12 and res["summary"] == s
    assert s["output_tokens"] == sum(r["output_len"] for r in rec["requests"]) > 0
    assert s["prompt_tokens"] == sum(r["prompt_len"] for r in rec["requests"]) > 0
    assert all(r["ttft_s"] > 0 and r["e2e_s"] >= r["ttft_s"] for r in rec["requests"])
    assert s["ttft_p99_ms"] >= s["ttft_p50_ms"] > 0 and s["total_tokens_per_s"] > 0
    # the checkpoint is the model the model benchmarks build (same seed), and is reused
    cfg = bench_serve.checkpoint_config("llama3.2-1b", True, torch.float32)
    assert not bench_serve.write_checkpoint(ckpt, cfg, "cpu", torch.float32, 0)
    loaded = dict(load_model(ckpt, device="cpu", dtype=torch.float32).named_parameters())
    built = bench_model.build_model(bench_model.hf_config_dict("llama3.2-1b", True), "cpu",
                                    torch.float32, 0)  # fmt: skip
    built = dict(built.named_parameters())
    assert loaded.keys() == built.keys()
    assert all(torch.equal(loaded[k], built[k]) for k in built)
