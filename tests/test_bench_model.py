"""`bench/bench_model.py` (issues 57 and 58's whole-model decode benchmark): its CPU dry run
serves every case at toy sizes (float32, reference backend, the decode-graph path emulated; the
FP8 DeepSeek-V3 slice eagerly, as it runs on the GPU) and writes the JSON record (and plot) the
GPU run writes; the record's fields, the byte and FLOP counts (FP8 weights and the FP8
rope-aware cache included), `random_model.py`'s FP8 block weights, and the transformers peer's
copy of the weights (the same greedy tokens as the engine) are checked."""

from __future__ import annotations

import json
import math
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "bench"))

import bench_model  # noqa: E402
import random_model  # noqa: E402

from pagedattn import KVQuantConfig  # noqa: E402
from pagedattn.engine import LLMEngine, SamplingParams  # noqa: E402
from pagedattn.models import ModelConfig, kv_cache_params, model_class  # noqa: E402

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
    q = ModelConfig.from_hf(bench_model.hf_config_dict("qwen3-30b-a3b"))
    assert (q.architecture, q.num_layers, q.hidden_size, q.num_heads, q.num_kv_heads) == (
        "Qwen3MoeForCausalLM", 48, 2048, 32, 4,
    )  # fmt: skip
    assert (q.head_dim, q.qk_norm, q.num_experts, q.num_experts_per_tok) == (128, True, 128, 8)
    assert (q.moe_intermediate_size, q.norm_topk_prob, q.moe_weights_in_dtype) == (768, True, True)
    assert all(q.layer_is_moe(i) for i in range(48)) and q.rope.theta == 1e6


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
    # a token multiplies k of the E routed experts: their elements count k / E
    E, k = c.num_experts, c.num_experts_per_tok
    routed = sum(p.numel() for n, p in m.named_parameters() if ".experts." in n)
    rest = sum(
        p.numel()
        for n, p in m.named_parameters()
        if p.ndim == 2 and ".experts." not in n and "embed_tokens" not in n
    )
    assert linear == rest + routed * k // E and cost["routed_expert_bytes"] == 4 * routed


def _fp8_linear_bytes(out: int, inp: int, block: int = 128) -> int:
    """An FP8 block-quantized [out, in] weight: 1 byte an e4m3 element + a float32 scale a
    block (partial blocks included)."""
    return out * inp + 4 * math.ceil(out / block) * math.ceil(inp / block)


def _v3_param_bytes(cfg: dict, item: int) -> int:
    """Bytes of every parameter of the FP8 DeepSeek-V3 config `cfg` (model dtype `item` bytes
    an element), from its dimensions: each attention / MLP / expert projection FP8 (q_a, q_b,
    kv_a, kv_b, o; gate, up, down), the router float32 (weight and correction bias), norms,
    embedding and lm_head in the model dtype."""
    H, V, L = cfg["hidden_size"], cfg["vocab_size"], cfg["num_hidden_layers"]
    h, nope, rope, v = (cfg[k] for k in ("num_attention_heads", "qk_nope_head_dim",
                                         "qk_rope_head_dim", "v_head_dim"))  # fmt: skip
    rank, qr = cfg["kv_lora_rank"], cfg["q_lora_rank"]
    lin = _fp8_linear_bytes
    attn = (lin(qr, H) + lin(h * (nope + rope), qr) + lin(rank + rope, H)
            + lin(h * (nope + v), rank) + lin(H, h * v) + item * (qr + rank))  # fmt: skip

    def mlp(inter: int) -> int:
        return 2 * lin(inter, H) + lin(H, inter)

    E, mI = cfg["n_routed_experts"], cfg["moe_intermediate_size"]
    moe = E * mlp(mI) + mlp(mI * cfg["n_shared_experts"]) + 4 * (E * H + E)
    dense = mlp(cfg["intermediate_size"])
    k = cfg["first_k_dense_replace"]
    layers = L * (attn + 2 * H * item) + k * dense + (L - k) * moe
    return layers + 2 * V * H * item + H * item  # embedding, lm_head (untied), final norm


def test_v3_slice_shape_full_size():
    """The DeepSeek-V3 slice parses to the release's dims with 4 layers (1 dense, 3 MoE) and
    128 x 128 FP8 blocks; built on the meta device (no memory), its bytes are the FP8 count:
    1 byte an e4m3 weight element plus the float32 scales (about 38.8 GB), and its FP8
    rope-aware cache 4 x 644 bytes a token."""
    d = bench_model.hf_config_dict("deepseek-v3-slice")
    c = ModelConfig.from_hf(d)
    assert (c.architecture, c.num_layers, c.first_k_dense_replace) == (
        "DeepseekV3ForCausalLM", 4, 1,
    )  # fmt: skip
    assert (c.hidden_size, c.num_heads, c.q_lora_rank, c.kv_lora_rank, c.qk_rope_head_dim,
            c.qk_nope_head_dim, c.v_head_dim) == (7168, 128, 1536, 512, 64, 128, 128)  # fmt: skip
    assert (c.num_experts, c.num_experts_per_tok, c.n_shared_experts, c.n_group, c.topk_group,
            c.topk_method, c.norm_topk_prob, c.routed_scaling_factor) == (
        256, 8, 1, 8, 4, "noaux_tc", True, 2.5,
    )  # fmt: skip
    assert (c.moe_intermediate_size, c.intermediate_size, c.vocab_size) == (2048, 18432, 129280)
    assert c.fp8_block == (128, 128) and c.rope.rope_type == "yarn" and c.rope.factor == 40
    with torch.device("meta"):
        m = model_class(c)(c, dtype=torch.bfloat16)
    assert not m.supports_cuda_graphs  # on the CPU FP8 experts loop (host counts): eager
    assert type(m.model.layers[0].mlp).__name__ == "SwiGLUMLP"
    assert all(type(m.model.layers[i].mlp).__name__ == "DeepseekMoE" for i in (1, 2, 3))
    b = 64
    total, read, _ = bench_model.weight_bytes(m, b)
    assert total == _v3_param_bytes(d, 2)
    assert 38.7e9 < total < 38.9e9  # 35.1 GB of e4m3 weights, 3.7 GB bf16 embedding + lm_head
    V, H = d["vocab_size"], d["hidden_size"]
    assert read == total - 2 * V * H + 2 * b * H  # the embedding's b gathered rows
    params = kv_cache_params(c, dtype=torch.bfloat16, page_size=16,
                             quantization=KVQuantConfig.mla_rope_aware())  # fmt: skip
    assert bench_model.kv_bytes_per_token(m, params) == 4 * (512 + 2 * 64 + 4)
    cost = bench_model.step_cost(m, b, 1000.0, params)
    assert cost["kv_bytes"] == 4 * 644 * 1000.0 and cost["bytes"] == read + cost["kv_bytes"]
    routed = 3 * 256 * 3 * (2048 * 7168 + 4 * 16 * 56)
    assert cost["routed_expert_bytes"] == routed  # e4m3 + scales of the 3 x 256 experts
    # a plain bf16 cache of the same model: 576 bf16 elements a layer
    assert bench_model.kv_bytes_per_token(m) == 4 * 576 * 2


def test_random_fp8_weights_are_the_plain_draw_in_blocks():
    """random_model.py with FP8 blocks: each FP8_LINEARS weight (every attention projection,
    the dense MLP, every routed and shared expert) is the plain model's draw (same seed)
    quantized in 128 x 128 blocks, scale amax / 448 (float64 here), within e4m3 rounding;
    the rest (norms, embedding, lm_head, router, its correction bias) is identical."""
    d = bench_model.hf_config_dict("deepseek-v3-slice", dry=True)
    fp8 = bench_model.build_model(d, "cpu", torch.float32, 5)
    plain_d = {k: v for k, v in d.items() if k != "quantization_config"}
    plain = bench_model.build_model(plain_d, "cpu", torch.float32, 5)
    assert plain.config.fp8_block is None and fp8.config.fp8_block == (128, 128)
    assert fp8.model.layers[0].self_attn.takes_branch and not fp8.supports_cuda_graphs
    q_params, ref = dict(fp8.named_parameters()), dict(plain.named_parameters())
    n_fp8 = 0
    for name, p in q_params.items():
        if name.endswith("_scale_inv"):
            continue
        if p.dtype != torch.float8_e4m3fn:
            assert torch.equal(p, ref[name]), name
            continue
        n_fp8 += 1
        w = ref[name].double()
        s = q_params[name + "_scale_inv"].double()  # X.weight_scale_inv, experts.X_scale_inv
        n, k = w.shape[-2:]
        N, K = math.ceil(n / 128), math.ceil(k / 128)
        pad = torch.zeros(*w.shape[:-2], N * 128, K * 128, dtype=torch.float64)
        pad[..., :n, :k] = w
        amax = pad.view(*w.shape[:-2], N, 128, K, 128).abs().amax(dim=(-3, -1))
        torch.testing.assert_close(s, amax / 448, rtol=1e-6, atol=0)
        rep = s.repeat_interleave(128, -2).repeat_interleave(128, -1)[..., :n, :k]
        err = (p.double() * rep - w).abs()
        # e4m3: 3 mantissa bits (half-ulp 2^-4 relative), subnormal step 2^-9 of the scale
        assert torch.all(err <= w.abs() * 2**-4 + rep * 2**-10 + 1e-12), name
    layers = 4
    assert n_fp8 == layers * 5 + 2 + (layers - 1) * 4  # attn 5; dense 2; experts 2 + shared 2
    bias = q_params["model.layers.1.mlp.gate.e_score_correction_bias"]
    assert bias.dtype == torch.float32 and 0 < bias.abs().max() < 0.2  # N(0, 0.02^2)
    # what the checkpoint holds: an e4m3 tensor + scales for each FP8_LINEARS weight only
    shapes = random_model.checkpoint_shapes(d)
    scales = {n for n in shapes if n.endswith(".weight_scale_inv")}
    assert scales and all(
        n.removesuffix(".weight_scale_inv").rsplit(".", 1)[1] in random_model.FP8_LINEARS
        for n in scales
    )
    assert "model.layers.1.mlp.gate.weight_scale_inv" not in shapes
    assert "lm_head.weight_scale_inv" not in shapes


def test_max_new_tokens_outlast_the_timed_steps():
    for case in bench_model.CASES:
        for c in (case, bench_model.shrink(case)):
            prefill = math.ceil(c.b * c.prompt / c.prefill_budget)
            assert bench_model.max_new_tokens(c) > prefill + 1 + c.warmup + c.steps
    assert [c.b for c in bench_model.CASES] == [64, 256, 64, 64, 64, 64]
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
    # no error: among others, every timed step of every engine was a pure decode of b requests
    assert data["suite"] == "model" and data["dry_run"] is True and data["errors"] == []
    assert list(data["case_seconds"]) == [c.name for c in bench_model.CASES]
    assert set(data["model_build_seconds"]) == {c.shape for c in bench_model.CASES}
    recs = {(r["config"], r["impl"]): r for r in data["records"]}
    for case in bench_model.CASES:
        small = bench_model.shrink(case)
        cfg = bench_model.hf_config_dict(case.shape, dry=True)
        r = recs[(case.name, "pagedattn")]
        e = r["extra"]
        graphs = "quantization_config" not in cfg  # FP8 DeepSeek captures no graphs
        assert e["graphs"] is graphs
        assert e["dry_run"] is True and e["batch"] == small.b and e["steps"] == small.steps
        assert len(e["step_ms"]) == small.steps
        assert r["ms"] == pytest.approx(sum(e["step_ms"]) / small.steps, rel=1e-3)
        assert e["tokens_per_s"] == pytest.approx(small.b / r["ms"] * 1e3, abs=0.06)
        assert e["frac_roofline"] == pytest.approx(e["roofline_ms"] / r["ms"], abs=6e-5)
        assert e["bound"] in ("copy", "mm")
        assert e["goal_frac"] == case.goal
        if graphs:
            eager = recs[(case.name, "pagedattn-eager")]
            assert e["graph_replays"] == small.steps  # every timed step replayed the graph
            assert len(eager["extra"]["step_ms"]) == small.steps
            assert e["x_eager"] == pytest.approx(eager["ms"] / r["ms"], abs=6e-4)
            assert e["replay_ms"] > 0 and e["sync_ms"] > 0 and e["model_call_ms"] is None
            assert eager["extra"]["roofline_ms"] == e["roofline_ms"]
        else:  # one eager engine: no replay, sync or second eager numbers
            assert (case.name, "pagedattn-eager") not in recs
            assert e["graph_replays"] == 0 and e["timed"].startswith("eager")
            assert e["replay_ms"] is e["sync_ms"] is e["x_eager"] is e["replay_frac_roofline"]
            assert e["replay_ms"] is None and e["eager_ms"] == pytest.approx(r["ms"], abs=1e-4)
            assert e["model_call_ms"] > 0
        # contexts: each request's prompt plus its tokens so far, over the timed steps
        assert (
            small.prompt + 1 < e["mean_context"] < small.prompt + bench_model.max_new_tokens(small)
        )
        if case.kv_quantization is not None:  # rope-aware: 512 e4m3 + 64 bf16 + a float32
            assert e["kv_cache"] == "mla_rope_aware"
            kv = cfg["num_hidden_layers"] * (512 + 2 * 64 + 4)
        elif "kv_lora_rank" in cfg:  # MLA: one latent row a token
            kv = cfg["num_hidden_layers"] * (cfg["kv_lora_rank"] + cfg["qk_rope_head_dim"]) * 4
        else:
            kv = cfg["num_hidden_layers"] * 2 * cfg["num_key_value_heads"] * cfg["head_dim"] * 4
        assert e["kv_bytes_per_token"] == kv
        assert e["kv_bytes"] == pytest.approx(kv * e["mean_context"] * small.b, rel=1e-3)
        assert r["bytes"] == pytest.approx(e["weight_bytes"] + e["kv_bytes"], rel=1e-6)
        if "quantization_config" in cfg:  # FP8 weights: 1 byte an e4m3 element + scales
            assert e["weights"].startswith("fp8 e4m3, 128x128") and e["fused_fp8_branch"]
            param = _v3_param_bytes(cfg, 4)
            H, V = cfg["hidden_size"], cfg["vocab_size"]
            assert e["param_bytes"] == param
            assert e["weight_bytes"] == param - 4 * V * H + 4 * small.b * H
        else:
            assert e["weights"] == "float32" and not e["fused_fp8_branch"]
        if case.profile:
            p = e["profile"]
            assert p["kernel_us"] > 0 and 1 <= len(p["top"]) <= bench_model.TOP_KERNELS
            shares = [k["share"] for k in p["top"]]
            assert shares == sorted(shares, reverse=True) and 0 < sum(shares) <= 1 + 1e-6
            assert p["source"].startswith("emulated graph replay" if graphs else "eager model")
            # by component, each against its own roofline: they add up to the model call, and
            # their bytes cover the step's (the rest takes what no component holds)
            c = e["components"]
            rows = {k["kind"]: k for k in c["rows"]}
            assert {bench_model.ATTENTION_KIND, bench_model.REST_KIND, "norms"} <= rows.keys()
            if "llama" in case.name:
                assert {"qkv_proj", "o_proj", "gate_up_proj", "down_proj"} <= rows.keys()
                assert rows["qkv_proj"]["calls"] == cfg["num_hidden_layers"]
            assert sum(k["us"] for k in c["rows"]) == pytest.approx(c["model_us"], rel=0.05)
            assert sum(k["bytes"] for k in c["rows"]) >= r["bytes"] * (1 - 1e-6)
            assert all(k["roofline_us"] > 0 for k in c["rows"] if k["bytes"])
        else:
            assert "profile" not in e and "components" not in e
        if case.hf:
            t = recs[(case.name, "transformers")]["extra"]
            assert t["new_tokens"] == small.hf_tokens and t["tokens_per_s"] > 0
            assert e["x_transformers"] == pytest.approx(
                e["tokens_per_s"] / t["tokens_per_s"], abs=6e-3
            )
        else:
            assert (case.name, "transformers") not in recs
        line = printed.splitlines()[-len(bench_model.CASES) + bench_model.CASES.index(case)]
        assert line.startswith(case.name) and line.split()[3] == ("graphs" if graphs else "eager")
        if case.goal is None:
            assert line.split()[7] == "-"  # the goal column (after 3 name words, mode, ms x3)
    if _has_matplotlib():
        assert (tmp_path / "model.png").stat().st_size > 0


def test_v3_slice_dry_run_decodes_through_the_fused_fp8_branch(tmp_path, monkeypatch):
    """The V3 slice's dry run alone: every decode step (b rows; the warm-up and timed steps,
    the step whose inputs are kept, the model calls timed and profiled) runs
    `mla_decode_branch_fp8` in each of its 4 layers, and the profile is of eager calls."""
    from pagedattn.models import deepseek as ds

    calls: list[int] = []
    real = ds.mla_decode_branch_fp8

    def counting(*a, **k):
        calls.append(a[0].shape[0])
        return real(*a, **k)

    monkeypatch.setattr(ds, "mla_decode_branch_fp8", counting)
    out = tmp_path / "v3.json"
    bench_model.main(["--dry-run", "--only", "v3-slice", "--out", str(out)])
    data = json.loads(out.read_text())
    v3 = next(c for c in bench_model.CASES if c.shape == "deepseek-v3-slice")
    case = bench_model.shrink(v3)
    assert list(data["case_seconds"]) == [v3.name] and data["errors"] == []
    assert [(r["impl"], r["extra"]["graphs"]) for r in data["records"]] == [("pagedattn", False)]
    n_alone = max(3, case.steps // 2) + 1  # model_call_ms: a warm-up call, then the timed ones
    # (the kernel profile and the component profile: a warm-up call, then the profiled ones)
    decode_steps = case.warmup + case.steps + 1 + n_alone + 2 * (1 + bench_model.PROFILE_REPLAYS)
    # (+ decode steps launched while the prefill loop waits for first tokens; a step whose
    # prefill chunk is short enough to attend absorbed takes the branch too)
    assert len(calls) % 4 == 0 and 4 * decode_steps <= calls.count(case.b) <= 4 * decode_steps + 8
    e = data["records"][0]["extra"]
    assert e["profile"]["replays"] == bench_model.PROFILE_REPLAYS


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
