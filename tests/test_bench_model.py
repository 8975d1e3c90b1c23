"""`bench/bench_model.py` (issue 57's whole-model decode benchmark): its CPU dry run serves every
case at toy sizes (float32, reference backend, the decode-graph path emulated) and writes the
JSON record (and plot) the GPU run writes; the record's fields, the byte and FLOP counts, and the
transformers peer's copy of the weights (the same greedy tokens as the engine) are checked."""

from __future__ import annotations

import json
import math
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "bench"))

import bench_model  # noqa: E402

from pagedattn.engine import LLMEngine, SamplingParams  # noqa: E402

transformers = pytest.importorskip("transformers")


def _tiny(shape: str, seed: int = 0):
    cfg = bench_model.hf_config_dict(shape, dry=True)
    return cfg, bench_model.build_model(cfg, "cpu", torch.float32, seed)


def test_build_model_is_seeded_and_shaped():
    cfg, a = _tiny("llama3-8b", seed=3)
    _, b = _tiny("llama3-8b", seed=3)
    _, c = _tiny("llama3-8b", seed=4)
    pa, pb, pc = (dict(m.named_parameters()) for m in (a, b, c))
    assert pa.keys() == pb.keys() and all(torch.equal(pa[k], pb[k]) for k in pa)
    w = "model.layers.0.mlp.down_proj.weight"
    assert not torch.equal(pa[w], pc[w])
    assert torch.all(pa["model.layers.1.input_layernorm.weight"] == 1)
    # linear weights N(0, 1/fan_in): down_proj's fan-in is the intermediate size
    std = pa[w].std().item() * math.sqrt(cfg["intermediate_size"])
    assert 0.9 < std < 1.1
    assert a.config.num_layers == cfg["num_hidden_layers"] and not a.config.tie_word_embeddings
    assert _tiny("llama3.2-1b")[1].lm_head is None  # the 1B shape ties its embeddings


def test_full_shapes_configs():
    """The two shapes' configs parse to the sizes issue 57 names (no model is built)."""
    from pagedattn.models import ModelConfig

    c8 = ModelConfig.from_hf(
        dict(bench_model.hf_config_dict("llama3-8b"), architectures=["LlamaForCausalLM"])
    )
    c1 = ModelConfig.from_hf(
        dict(bench_model.hf_config_dict("llama3.2-1b"), architectures=["LlamaForCausalLM"])
    )
    assert (c8.num_layers, c8.hidden_size, c8.num_heads, c8.num_kv_heads, c8.head_dim) == (
        32, 4096, 32, 8, 128,
    )  # fmt: skip
    assert (c8.intermediate_size, c8.vocab_size, c8.tie_word_embeddings) == (14336, 128256, False)
    assert (c1.num_layers, c1.hidden_size, c1.num_heads, c1.num_kv_heads, c1.head_dim) == (
        16, 2048, 32, 8, 64,
    )  # fmt: skip
    assert (c1.intermediate_size, c1.vocab_size, c1.tie_word_embeddings) == (8192, 128256, True)
    assert c1.rope.rope_type == "llama3" and c8.rope.theta == 500000.0


def test_step_cost_counts_weights_and_kv():
    cfg, m = _tiny("llama3-8b")
    H, V, L, I = (
        cfg["hidden_size"],
        cfg["vocab_size"],
        cfg["num_hidden_layers"],
        cfg["intermediate_size"],
    )  # noqa: E501, E741
    hq, hkv, d = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    per_layer_linear = H * (hq + 2 * hkv) * d + hq * d * H + 2 * I * H + I * H
    linear = L * per_layer_linear + V * H  # + lm_head (untied: the embedding is a gather)
    total = 4 * (linear + V * H + (2 * L + 1) * H)  # float32, + embedding + norms
    b, ctx_sum = 5, 123.0
    cost = bench_model.step_cost(m, b, ctx_sum)
    assert cost["param_bytes"] == total
    assert cost["weight_bytes"] == total - 4 * V * H + 4 * b * H
    assert cost["kv_bytes"] == L * 2 * hkv * d * 4 * ctx_sum
    assert cost["bytes"] == cost["weight_bytes"] + cost["kv_bytes"]
    assert cost["flops"] == 2 * b * linear + 4 * L * hq * d * ctx_sum
    # tied: the embedding is the lm_head's matmul, read in full, counted once
    cfg1, m1 = _tiny("llama3.2-1b")
    c1 = bench_model.step_cost(m1, b, ctx_sum)
    assert c1["weight_bytes"] == c1["param_bytes"] == total - 4 * V * H
    assert c1["flops"] == cost["flops"]


def test_mla_step_cost_counts_one_latent_row_a_token():
    cfg, m = _tiny("deepseek-v2-lite")
    c = m.config
    assert c.is_mla and c.is_moe
    b, ctx_sum = 3, 100.0
    cost = bench_model.step_cost(m, b, ctx_sum)
    assert cost["kv_bytes"] == c.num_layers * (c.kv_lora_rank + c.qk_rope_head_dim) * 4 * ctx_sum
    _, _, linear = bench_model.weight_bytes(m, b)
    per_key = 2 * (c.kv_lora_rank + c.qk_rope_head_dim) + 2 * c.kv_lora_rank
    assert cost["flops"] == 2 * b * linear + c.num_layers * c.num_heads * per_key * ctx_sum


def test_max_new_tokens_outlast_the_timed_steps():
    for case in bench_model.CASES:
        for c in (case, bench_model.shrink(case)):
            prefill = math.ceil(c.b * c.prompt / c.prefill_budget)
            assert bench_model.max_new_tokens(c) > prefill + 1 + c.warmup + c.steps
    assert [c.b for c in bench_model.CASES] == [64, 256, 64, 64]
    assert all(c.prompt == 512 for c in bench_model.CASES)


@pytest.mark.parametrize("shape", ["llama3-8b", "llama3.2-1b"])
def test_transformers_copy_gives_the_engines_tokens(shape):
    """hf_model holds the same weights: its greedy generate equals the engine's tokens."""
    cfg, m = _tiny(shape, seed=1)
    with torch.no_grad():  # larger layers than the bench's, so that tokens depend on them all
        g = torch.Generator().manual_seed(2)
        for name, p in m.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.2 * torch.randn(p.shape, generator=g))
            elif "embed_tokens" not in name:
                p.copy_(torch.randn(p.shape, generator=g) * 3 / p.shape[-1] ** 0.5)
    hf = bench_model.hf_model(m, cfg)
    assert hf.config._attn_implementation == "sdpa"
    ours, theirs = dict(m.named_parameters()), dict(hf.named_parameters())
    qkv = ours["model.layers.1.self_attn.qkv_proj.weight"]
    q = theirs["model.layers.1.self_attn.q_proj.weight"]
    v = theirs["model.layers.1.self_attn.v_proj.weight"]
    assert torch.equal(qkv[: q.shape[0]], q) and torch.equal(qkv[-v.shape[0] :], v)
    g = torch.Generator().manual_seed(5)
    prompts = torch.randint(0, cfg["vocab_size"], (3, 11), generator=g)
    eng = LLMEngine(m, page_size=4, num_pages=64, max_num_seqs=4)
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    ids = [eng.add_request({"prompt_token_ids": p.tolist()}, params) for p in prompts]
    got: dict[int, list[int]] = {}
    while eng.has_unfinished_requests():
        for o in eng.step():
            got[o.request_id] = o.outputs[0].token_ids
    with torch.inference_mode():
        ref = hf.generate(input_ids=prompts, attention_mask=torch.ones_like(prompts),
                          max_new_tokens=6, min_new_tokens=6, do_sample=False)  # fmt: skip
    assert [got[i] for i in ids] == ref[:, 11:].tolist()
    assert len(set(ref[:, 11:].flatten().tolist())) > 6  # not one token repeated


def test_dry_run_record(tmp_path, capsys):
    out = tmp_path / "model.json"
    bench_model.main(["--dry-run", "--out", str(out)])
    printed = capsys.readouterr().out
    data = json.loads(out.read_text())
    assert data["suite"] == "model" and data["dry_run"] is True and data["errors"] == []
    assert list(data["case_seconds"]) == [c.name for c in bench_model.CASES]
    assert set(data["model_build_seconds"]) == {c.shape for c in bench_model.CASES}
    recs = {(r["config"], r["impl"]): r for r in data["records"]}
    for case in bench_model.CASES:
        small = bench_model.shrink(case)
        cfg = bench_model.hf_config_dict(case.shape, dry=True)
        r, eager = recs[(case.name, "pagedattn")], recs[(case.name, "pagedattn-eager")]
        e = r["extra"]
        assert e["dry_run"] is True and e["batch"] == small.b and e["steps"] == small.steps
        assert e["graph_replays"] == small.steps  # every timed step replayed the decode graph
        assert len(e["step_ms"]) == small.steps and len(eager["extra"]["step_ms"]) == small.steps
        assert r["ms"] == pytest.approx(sum(e["step_ms"]) / small.steps, rel=1e-3)
        assert e["tokens_per_s"] == pytest.approx(small.b / r["ms"] * 1e3, abs=0.06)
        assert e["frac_roofline"] == pytest.approx(e["roofline_ms"] / r["ms"], abs=6e-5)
        assert e["x_eager"] == pytest.approx(eager["ms"] / r["ms"], abs=6e-4)
        assert e["replay_ms"] > 0 and e["bound"] in ("copy", "mm")
        assert e["goal_frac"] == case.goal
        # contexts: each request's prompt plus its tokens so far, over the timed steps
        assert (
            small.prompt + 1 < e["mean_context"] < small.prompt + bench_model.max_new_tokens(small)
        )
        if "kv_lora_rank" in cfg:  # MLA: one latent row a token
            kv = cfg["num_hidden_layers"] * (cfg["kv_lora_rank"] + cfg["qk_rope_head_dim"]) * 4
        else:
            kv = cfg["num_hidden_layers"] * 2 * cfg["num_key_value_heads"] * cfg["head_dim"] * 4
        assert e["kv_bytes"] == pytest.approx(kv * e["mean_context"] * small.b, rel=1e-3)
        assert r["bytes"] == pytest.approx(e["weight_bytes"] + e["kv_bytes"], rel=1e-6)
        assert eager["extra"]["roofline_ms"] == e["roofline_ms"]
        if case.profile:
            p = e["profile"]
            assert p["kernel_us"] > 0 and 1 <= len(p["top"]) <= bench_model.TOP_KERNELS
            shares = [k["share"] for k in p["top"]]
            assert shares == sorted(shares, reverse=True) and 0 < sum(shares) <= 1 + 1e-6
        else:
            assert "profile" not in e
        if case.hf:
            t = recs[(case.name, "transformers")]["extra"]
            assert t["new_tokens"] == small.hf_tokens and t["tokens_per_s"] > 0
            assert e["x_transformers"] == pytest.approx(
                e["tokens_per_s"] / t["tokens_per_s"], abs=6e-3
            )
        else:
            assert (case.name, "transformers") not in recs
        assert (
            case.name
            in printed.splitlines()[-len(bench_model.CASES) + bench_model.CASES.index(case)]
        )
    if _has_matplotlib():
        assert (tmp_path / "model.png").stat().st_size > 0


def test_only_selects_cases(tmp_path):
    out = tmp_path / "m.json"
    bench_model.main(["--dry-run", "--only", "1b", "--out", str(out)])
    data = json.loads(out.read_text())
    assert list(data["case_seconds"]) == ["llama3.2-1b b64 p512"] and data["errors"] == []
    assert {r["impl"] for r in data["records"]} == {"pagedattn", "pagedattn-eager", "transformers"}


def _has_matplotlib() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True
