"""`bench/bench_tp.py` (issue 59's two-GPU benchmark): its CPU dry run (gloo, 2 processes, toy
shapes) runs every phase and writes the record the GPU run writes; the random-weight models
(`bench/random_model.py`) give a tensor-parallel rank exactly the one-process model's slices;
the request dispatcher balances tokens; the near-tie rule accepts only gaps within the noise."""

from __future__ import annotations

import json
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "bench"))

import bench_tp  # noqa: E402
import random_model  # noqa: E402

transformers = pytest.importorskip("transformers")


def test_random_model_shards_are_slices_of_the_whole():
    """Rank r of a 2-way model holds rows/columns r of the one-process model's tensors (the
    same draw per checkpoint tensor name, whatever the order)."""
    from pagedattn.models import parallel

    cfg = bench_tp.model_dict("gpt-oss-20b", dry=True)
    whole = dict(random_model.random_model(cfg, "cpu", torch.float32, 5).named_parameters())
    for r in range(2):
        shard = dict(
            random_model.random_model(
                cfg, "cpu", torch.float32, 5, tp_size=2, tp_rank=r
            ).named_parameters()
        )
        up = "model.layers.0.mlp.experts.gate_up_proj"
        assert torch.equal(shard[up], parallel.shard(whole[up], 2, r, 2))
        down = "model.layers.1.mlp.experts.down_proj"
        assert torch.equal(shard[down], parallel.shard(whole[down], 1, r, 2))
        o = "model.layers.0.self_attn.o_proj.weight"
        assert torch.equal(shard[o], parallel.shard(whole[o], 1, r, 2))
        sinks = "model.layers.1.self_attn.sinks"
        assert torch.equal(shard[sinks], parallel.shard(whole[sinks], 0, r, 2))
        emb = "model.embed_tokens.weight"
        assert torch.equal(shard[emb], whole[emb])


def test_dispatch_balances_tokens():
    reqs = bench_tp.stream(dry=False)
    parts = bench_tp.dispatch(reqs, 2)
    assert sorted(parts[0] + parts[1]) == list(range(len(reqs)))
    load = [sum(len(reqs[i][0]) + reqs[i][1] for i in p) for p in parts]
    assert abs(load[0] - load[1]) <= max(len(p) + n for p, n in reqs)


def test_compare_tokens_near_tie_rule():
    single = dict(tokens=[[1, 2, 3]], top2=[[[1, 9.0, 5.0], [2, 8.0, 7.997], [3, 6.0, 1.0]]])
    tp = dict(tokens=[[1, 5, 3]], top2=[[[1, 9.001, 5.0], [5, 8.0, 7.997], [3, 6.0, 1.0]]])
    got = bench_tp.compare_tokens(single, tp)
    assert got["ok"] and got["equal"] == 0 and got["diverged"][0]["first_diff"] == 1
    tp["top2"][0][0][1] = 9.0  # no noise on the common prefix: a 0.003 gap is not a tie
    assert not bench_tp.compare_tokens(single, tp)["ok"]


def test_dry_run_writes_the_record(tmp_path):
    out = tmp_path / "tp.json"
    bench_tp.main(["--dry-run", "--work", str(tmp_path / "work"), "--out", str(out)])
    d = json.loads(out.read_text())
    s = d["summary"]
    assert s["errors"] == []
    assert s["tp_ranks_same_tokens"] is True
    for m in ("llama3-8b", "gpt-oss-20b"):
        assert s["check"][m]["ok"] and s["check"][m]["kv_heads_per_rank"] == 1
    setups = {(r["config"], r["impl"]) for r in d["records"]}
    assert ("llama3-8b b64", "TP 2") in setups and ("gpt-oss-20b b64", "1 GPU") in setups
    tp = next(r for r in d["records"] if r["impl"] == "TP 2" and "llama" in r["config"])
    assert tp["extra"]["graphs"] and tp["extra"]["x_one_gpu"] > 0
    assert s["dp"]["replicas"] == 2
    assert s["dp"]["generated_tokens"] == s["dp"]["one_replica"]["generated_tokens"]
    assert (tmp_path / "tp.png").exists()
