"""Probe: config variants of the supported architectures against transformers.

For each variant: a tiny float32 HF model (hidden 64, 2 layers, vocab 256) with randomize_'s
weights, save_pretrained, models.load_model, then
  (a) one ragged prefill step's logits (every row) vs one HF forward per prompt;
  (b) greedy tokens (12 new) of 3 ragged prompts vs HF generate(do_sample=False), both in one
      ragged prefill (page 16) and under chunked prefill (page 1, 16-token budget);
  (c) optionally (--engine) the LLM engine on the CPU.
Unsupported variants should raise UnsupportedModelError / InvalidArgumentError at load.
HF-REJECTS: transformers refuses the config; HF-FAILS: its own forward or generate raises on it
(nothing to compare; e.g. Mistral with layer_types, gpt-oss with sliding_window None, in
transformers 5.24), where ours loads and runs.

Usage: .venv/bin/python dev/variant_sweep_probe.py [--engine] [name-substring ...]
"""

from __future__ import annotations

import sys
import tempfile
import traceback
import warnings
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
warnings.filterwarnings("ignore")

import transformers  # noqa: E402
from test_models_hf import GreedyDriver, hf_greedy, prefill_step, prompts_of  # noqa: E402
from tiny_llama import randomize_  # noqa: E402

from pagedattn import InvalidArgumentError  # noqa: E402
from pagedattn.models import load_model  # noqa: E402

torch.set_num_threads(1)
NEW = 12
TIE_GAP = 1e-4
COMMON = dict(vocab_size=256, hidden_size=64, num_hidden_layers=2, bos_token_id=None,
              eos_token_id=None, pad_token_id=None)  # fmt: skip

GQA = dict(intermediate_size=96, num_attention_heads=4, num_key_value_heads=2)
MLA = dict(intermediate_size=96, moe_intermediate_size=32, num_attention_heads=4,
           num_key_value_heads=4, kv_lora_rank=128, qk_rope_head_dim=32, qk_nope_head_dim=32,
           v_head_dim=32, q_lora_rank=None, n_routed_experts=8, num_experts_per_tok=3,
           n_shared_experts=1, first_k_dense_replace=1, max_position_embeddings=256,
           num_hidden_layers=3)  # fmt: skip
BASE = {
    "Llama": GQA,
    "Mistral": GQA,
    "Qwen2": GQA,
    "Qwen3": dict(GQA, head_dim=16),
    "Mixtral": dict(GQA, intermediate_size=48, num_local_experts=4, num_experts_per_tok=2),
    "Qwen2Moe": dict(
        GQA,
        num_experts=5,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        shared_expert_intermediate_size=48,
    ),  # fmt: skip
    "Qwen3Moe": dict(
        GQA, head_dim=16, num_experts=6, num_experts_per_tok=3, moe_intermediate_size=32
    ),  # fmt: skip
    "GptOss": dict(
        GQA,
        intermediate_size=32,
        head_dim=16,
        sliding_window=8,
        num_local_experts=4,
        num_experts_per_tok=2,
    ),  # fmt: skip
    "DeepseekV3": dict(MLA, n_group=4, topk_group=2),
    "DeepseekV2": dict(MLA, topk_method="greedy"),
}
SW_PROMPTS = [9, 17, 30]  # prompts longer than the windows of 4


def sliding(family: str) -> list:
    """Qwen2 / Qwen3's sliding-window settings: the window below layer 1, on no layer (mwl 0),
    set but not used, and by `layer_types`."""
    sw = dict(use_sliding_window=True, sliding_window=4)
    name = family.lower()
    return [
        (f"{name}/sw_mwl1", family, dict(sw, max_window_layers=1), SW_PROMPTS),
        (f"{name}/sw_mwl0", family, dict(sw, max_window_layers=0), SW_PROMPTS),
        (f"{name}/sw_not_used", family, dict(sw, use_sliding_window=False, max_window_layers=0),
         SW_PROMPTS),
        (f"{name}/sw_layer_types", family,
         dict(sw, layer_types=["sliding_attention", "full_attention"]), SW_PROMPTS),
    ]  # fmt: skip


def llama3_rope(theta: float) -> dict:
    """Llama 3's rope scaling (factor 8 over 16 original positions: the scaling shows at the
    probe's lengths)."""
    return dict(rope_type="llama3", rope_theta=theta, factor=8.0, low_freq_factor=1.0,
                high_freq_factor=4.0, original_max_position_embeddings=16)  # fmt: skip


YARN = dict(rope_type="yarn", rope_theta=10000.0, factor=4.0, original_max_position_embeddings=64)

# (name, family, overrides, prompt lengths)
V = [
    ("llama/base", "Llama", {}, None),
    ("llama/attention_bias", "Llama", dict(attention_bias=True), None),
    ("llama/mlp_bias", "Llama", dict(mlp_bias=True), None),
    ("llama/head_dim32", "Llama", dict(head_dim=32), None),
    ("llama/head_dim8", "Llama", dict(head_dim=8), None),
    ("llama/tie_true", "Llama", dict(tie_word_embeddings=True), None),
    ("llama/tie_false", "Llama", dict(tie_word_embeddings=False), None),
    (
        "llama/rope_dynamic",
        "Llama",
        dict(rope_parameters=dict(rope_type="dynamic", rope_theta=10000.0, factor=2.0)),
        None,
    ),
    (
        "llama/rope_yarn",
        "Llama",
        dict(rope_parameters=dict(YARN), max_position_embeddings=256),
        None,
    ),
    (
        "llama/rope_yarn_attnfactor",
        "Llama",
        dict(
            rope_parameters=dict(YARN, attention_factor=0.8, beta_fast=16.0, beta_slow=2.0),
            max_position_embeddings=256,
        ),
        None,
    ),
    (
        "llama/rope_longrope",
        "Llama",
        dict(
            rope_parameters=dict(
                rope_type="longrope",
                rope_theta=10000.0,
                short_factor=[1.0] * 8,
                long_factor=[2.0] * 8,
                original_max_position_embeddings=64,
            ),
            max_position_embeddings=256,
        ),
        None,
    ),
    (
        "llama/rope_linear",
        "Llama",
        dict(rope_parameters=dict(rope_type="linear", rope_theta=10000.0, factor=3.0)),
        None,
    ),
    (
        "llama/rope_llama3",
        "Llama",
        dict(rope_parameters=llama3_rope(500000.0)),
        None,
    ),
    (
        "llama/theta_500k",
        "Llama",
        dict(rope_parameters=dict(rope_type="default", rope_theta=500000.0)),
        None,
    ),
    ("llama/eps1e-6", "Llama", dict(rms_norm_eps=1e-6), None),
    ("llama/eps1e-2", "Llama", dict(rms_norm_eps=1e-2), None),
    ("llama/mha", "Llama", dict(num_key_value_heads=4), None),
    ("llama/mqa", "Llama", dict(num_key_value_heads=1), None),
    ("llama/kv_heads_none", "Llama", dict(num_key_value_heads=None), None),
    ("llama/gelu", "Llama", dict(hidden_act="gelu"), None),
    ("llama/pretraining_tp2", "Llama", dict(pretraining_tp=2), None),
    ("llama/partial_rotary", "Llama", dict(partial_rotary_factor=0.5), None),
    ("llama/3layers", "Llama", dict(num_hidden_layers=3), None),
    ("mistral/base_sw_none", "Mistral", dict(sliding_window=None), None),
    ("mistral/sw4", "Mistral", dict(sliding_window=4), [9, 17, 30]),
    ("mistral/sw4_head_dim32", "Mistral", dict(sliding_window=4, head_dim=32), [9, 17, 30]),
    ("mistral/head_dim8", "Mistral", dict(head_dim=8, sliding_window=None), None),
    (
        "mistral/sw4_layer_types",
        "Mistral",
        dict(sliding_window=4, layer_types=["full_attention", "sliding_attention"]),
        [9, 17, 30],
    ),
    ("mistral/tie_true", "Mistral", dict(tie_word_embeddings=True, sliding_window=None), None),
    ("qwen2/base", "Qwen2", {}, None),
    ("qwen2/tie_true", "Qwen2", dict(tie_word_embeddings=True), None),
    ("qwen2/tie_false", "Qwen2", dict(tie_word_embeddings=False), None),
    ("qwen2/head_dim32", "Qwen2", dict(head_dim=32), None),
    ("qwen2/attention_bias_false", "Qwen2", dict(attention_bias=False), None),
    ("qwen3/base", "Qwen3", {}, None),
    ("qwen3/attention_bias", "Qwen3", dict(attention_bias=True), None),
    ("qwen3/tie_true", "Qwen3", dict(tie_word_embeddings=True), None),
    ("qwen3/head_dim32", "Qwen3", dict(head_dim=32), None),
    ("qwen3/head_dim_default", "Qwen3", dict(head_dim=None), None),
    ("qwen3/mha", "Qwen3", dict(num_key_value_heads=4), None),
    *sliding("Qwen2"),
    *sliding("Qwen3"),
    ("mixtral/base_sw_none", "Mixtral", dict(sliding_window=None), None),
    ("mixtral/sw4", "Mixtral", dict(sliding_window=4), [9, 17, 30]),
    ("mixtral/top1", "Mixtral", dict(num_experts_per_tok=1), None),
    ("mixtral/head_dim32", "Mixtral", dict(head_dim=32), None),
    ("mixtral/tie_true", "Mixtral", dict(tie_word_embeddings=True), None),
    ("mixtral/router_jitter", "Mixtral", dict(router_jitter_noise=0.1), None),
    ("qwen2moe/base", "Qwen2Moe", {}, None),
    ("qwen2moe/norm_topk_true", "Qwen2Moe", dict(norm_topk_prob=True), None),
    ("qwen2moe/sparse_step2", "Qwen2Moe", dict(decoder_sparse_step=2), None),
    ("qwen2moe/mlp_only0", "Qwen2Moe", dict(mlp_only_layers=[0]), None),
    ("qwen2moe/no_shared", "Qwen2Moe", dict(shared_expert_intermediate_size=0), None),
    ("qwen2moe/qkv_bias_false", "Qwen2Moe", dict(qkv_bias=False), None),
    (
        "qwen2moe/sw",
        "Qwen2Moe",
        dict(use_sliding_window=True, sliding_window=4, max_window_layers=2),
        [9, 17, 30],
    ),
    ("qwen2moe/tie_true", "Qwen2Moe", dict(tie_word_embeddings=True), None),
    ("qwen3moe/base", "Qwen3Moe", {}, None),
    ("qwen3moe/norm_topk_false", "Qwen3Moe", dict(norm_topk_prob=False), None),
    ("qwen3moe/norm_topk_true", "Qwen3Moe", dict(norm_topk_prob=True), None),
    ("qwen3moe/sparse_step2", "Qwen3Moe", dict(decoder_sparse_step=2), None),
    ("qwen3moe/mlp_only1", "Qwen3Moe", dict(mlp_only_layers=[1]), None),
    ("qwen3moe/attention_bias", "Qwen3Moe", dict(attention_bias=True), None),
    ("qwen3moe/sw", "Qwen3Moe", dict(use_sliding_window=True, sliding_window=4), [9, 17, 30]),
    ("qwen3moe/tie_true", "Qwen3Moe", dict(tie_word_embeddings=True), None),
    ("qwen3moe/head_dim32", "Qwen3Moe", dict(head_dim=32), None),
    ("gptoss/base", "GptOss", {}, None),
    ("gptoss/sw4", "GptOss", dict(sliding_window=4), [9, 17, 30]),
    (
        "gptoss/layer_types_full_sliding",
        "GptOss",
        dict(sliding_window=4, layer_types=["full_attention", "sliding_attention"]),
        [9, 17, 30],
    ),
    (
        "gptoss/all_sliding",
        "GptOss",
        dict(sliding_window=4, layer_types=["sliding_attention"] * 2),
        [9, 17, 30],
    ),
    ("gptoss/experts8_top4", "GptOss", dict(num_local_experts=8, num_experts_per_tok=4), None),
    ("gptoss/top1", "GptOss", dict(num_experts_per_tok=1), None),
    ("gptoss/no_attention_bias", "GptOss", dict(attention_bias=False), None),
    ("gptoss/head_dim32", "GptOss", dict(head_dim=32), None),
    ("gptoss/tie_true", "GptOss", dict(tie_word_embeddings=True), None),
    ("gptoss/swiglu_limit3", "GptOss", dict(swiglu_limit=3.0), None),
    (
        "gptoss/rope_default",
        "GptOss",
        dict(rope_parameters=dict(rope_type="default", rope_theta=150000.0)),
        None,
    ),
    ("dsv3/base", "DeepseekV3", {}, None),
    ("dsv3/qlora", "DeepseekV3", dict(q_lora_rank=48), None),
    ("dsv3/ngroup1", "DeepseekV3", dict(n_group=1, topk_group=1), None),
    ("dsv3/first_k0", "DeepseekV3", dict(first_k_dense_replace=0), None),
    ("dsv3/first_k2", "DeepseekV3", dict(first_k_dense_replace=2), None),
    ("dsv3/rsf1", "DeepseekV3", dict(routed_scaling_factor=1.0), None),
    ("dsv3/norm_topk_false", "DeepseekV3", dict(norm_topk_prob=False), None),
    ("dsv3/no_shared", "DeepseekV3", dict(n_shared_experts=0), None),
    ("dsv3/shared2", "DeepseekV3", dict(n_shared_experts=2), None),
    ("dsv3/rope_interleave_false", "DeepseekV3", dict(rope_interleave=False), None),
    (
        "dsv3/yarn_mscale",
        "DeepseekV3",
        dict(
            rope_parameters=dict(
                YARN, mscale=1.0, mscale_all_dim=0.707, beta_fast=32.0, beta_slow=1.0
            )
        ),
        None,
    ),
    (
        "dsv3/yarn_mscale_eq",
        "DeepseekV3",
        dict(rope_parameters=dict(YARN, mscale=1.0, mscale_all_dim=1.0)),
        None,
    ),
    ("dsv3/yarn_no_mscale", "DeepseekV3", dict(rope_parameters=dict(YARN)), None),
    ("dsv3/attention_bias", "DeepseekV3", dict(attention_bias=True), None),
    ("dsv3/tie_true", "DeepseekV3", dict(tie_word_embeddings=True), None),
    ("dsv3/topk_method_greedy", "DeepseekV3", dict(topk_method="greedy"), None),
    ("dsv3/v_ne_nope", "DeepseekV3", dict(v_head_dim=48, qk_nope_head_dim=16), None),
    ("dsv2/greedy", "DeepseekV2", {}, None),
    ("dsv2/greedy_qlora", "DeepseekV2", dict(q_lora_rank=48), None),
    (
        "dsv2/group_limited",
        "DeepseekV2",
        dict(
            topk_method="group_limited_greedy",
            n_group=4,
            topk_group=2,
            q_lora_rank=48,
            routed_scaling_factor=16.0,
        ),
        None,
    ),
    ("dsv2/norm_topk_true", "DeepseekV2", dict(norm_topk_prob=True), None),
    ("dsv2/rsf2", "DeepseekV2", dict(routed_scaling_factor=2.0), None),
    ("dsv2/first_k0", "DeepseekV2", dict(first_k_dense_replace=0), None),
    (
        "dsv2/yarn_mscale",
        "DeepseekV2",
        dict(rope_parameters=dict(YARN, mscale=0.707, mscale_all_dim=0.707)),
        None,
    ),
    ("dsv2/noaux_tc", "DeepseekV2", dict(topk_method="noaux_tc", n_group=4, topk_group=2), None),
    ("dsv2/no_shared", "DeepseekV2", dict(n_shared_experts=None), None),
    ("dsv2/tie_true", "DeepseekV2", dict(tie_word_embeddings=True), None),
    # --- second round
    ("dsv2/rope_interleave_false", "DeepseekV2", dict(rope_interleave=False), None),
    ("dsv2/shared0", "DeepseekV2", dict(n_shared_experts=0), None),
    ("dsv3/shared0", "DeepseekV3", dict(n_shared_experts=0), None),
    ("dsv2/mlp_bias", "DeepseekV2", dict(mlp_bias=True), None),
    ("dsv2/attention_bias", "DeepseekV2", dict(attention_bias=True), None),
    ("dsv3/topk_all_groups", "DeepseekV3", dict(n_group=4, topk_group=4), None),
    ("dsv3/n_group2_top1", "DeepseekV3", dict(n_group=2, topk_group=1), None),
    ("dsv3/k1", "DeepseekV3", dict(num_experts_per_tok=1), None),
    ("dsv3/4layers_first2", "DeepseekV3", dict(num_hidden_layers=4, first_k_dense_replace=2), None),
    (
        "llama/heads6_hd16",
        "Llama",
        dict(num_attention_heads=6, num_key_value_heads=3, head_dim=16),
        None,
    ),
    (
        "llama/mqa_hd32_bias",
        "Llama",
        dict(num_key_value_heads=1, head_dim=32, attention_bias=True, mlp_bias=True),
        None,
    ),
    (
        "llama/yarn_nofactor",
        "Llama",
        dict(
            rope_parameters=dict(
                rope_type="yarn", rope_theta=10000.0, original_max_position_embeddings=64
            ),
            max_position_embeddings=256,
        ),
        None,
    ),
    (
        "llama/yarn_truncate_false",
        "Llama",
        dict(rope_parameters=dict(YARN, truncate=False), max_position_embeddings=256),
        None,
    ),
    ("llama/vocab300", "Llama", dict(vocab_size=300), None),
    (
        "llama/rope_scaling_legacy",
        "Llama",
        dict(rope_scaling=dict(type="linear", factor=2.0), rope_theta=20000.0),
        None,
    ),
    ("mistral/head_dim_none", "Mistral", dict(head_dim=None, sliding_window=4), [9, 17, 30]),
    ("mistral/sw_big", "Mistral", dict(sliding_window=4096), None),
    (
        "qwen2/4layers_mwl2",
        "Qwen2",
        dict(num_hidden_layers=4, use_sliding_window=True, sliding_window=4, max_window_layers=2),
        [9, 17, 30],
    ),
    (
        "qwen2moe/4layers_mwl3",
        "Qwen2Moe",
        dict(num_hidden_layers=4, use_sliding_window=True, sliding_window=4, max_window_layers=3),
        [9, 17, 30],
    ),
    ("qwen2moe/shared0", "Qwen2Moe", dict(shared_expert_intermediate_size=0), None),
    (
        "qwen3moe/4layers_mix",
        "Qwen3Moe",
        dict(num_hidden_layers=4, decoder_sparse_step=2, mlp_only_layers=[3], norm_topk_prob=False),
        None,
    ),
    ("qwen3moe/topk_all", "Qwen3Moe", dict(num_experts_per_tok=6), None),
    ("mixtral/top_all", "Mixtral", dict(num_experts_per_tok=4), None),
    ("mixtral/mha", "Mixtral", dict(num_key_value_heads=4), None),
    ("gptoss/sw_none", "GptOss", dict(sliding_window=None), None),
    ("gptoss/4layers", "GptOss", dict(num_hidden_layers=4, sliding_window=4), [9, 17, 30]),
    (
        "gptoss/yarn_factor8",
        "GptOss",
        dict(
            rope_parameters=dict(
                rope_type="yarn",
                rope_theta=150000.0,
                factor=8.0,
                beta_fast=32.0,
                beta_slow=1.0,
                truncate=False,
                original_max_position_embeddings=64,
            )
        ),
        None,
    ),
    ("gptoss/mqa", "GptOss", dict(num_key_value_heads=1), None),
    ("gptoss/swiglu_alpha1", "GptOss", dict(swiglu_alpha=1.0), None),
    ("dsv3/qlora_bias", "DeepseekV3", dict(q_lora_rank=48, attention_bias=True), None),
    (
        "dsv3/yarn_mscale_all_only",
        "DeepseekV3",
        dict(rope_parameters=dict(YARN, mscale_all_dim=0.707)),
        None,
    ),
    ("dsv3/yarn_mscale_only", "DeepseekV3", dict(rope_parameters=dict(YARN, mscale=0.707)), None),
    (
        "dsv2/yarn_v2_real",
        "DeepseekV2",
        dict(
            q_lora_rank=48,
            rope_parameters=dict(
                YARN, mscale=0.707, mscale_all_dim=0.707, beta_fast=32.0, beta_slow=1.0
            ),
        ),
        None,
    ),
    ("mistral/sw4_short_prompts", "Mistral", dict(sliding_window=4), [1, 2, 3]),
    ("gptoss/sw4_short_prompts", "GptOss", dict(sliding_window=4), [1, 2, 3]),
    (
        "qwen3/sw4_short_prompts",
        "Qwen3",
        dict(use_sliding_window=True, sliding_window=4, max_window_layers=0),
        [1, 2, 3],
    ),
    (
        "qwen2/rope_yarn",
        "Qwen2",
        dict(rope_parameters=dict(YARN), max_position_embeddings=256),
        None,
    ),
    (
        "qwen3/rope_yarn",
        "Qwen3",
        dict(rope_parameters=dict(YARN), max_position_embeddings=256),
        None,
    ),
    (
        "mixtral/rope_llama3",
        "Mixtral",
        dict(rope_parameters=llama3_rope(1e6)),
        None,
    ),
    ("mistral/attention_bias", "Mistral", dict(attention_bias=True, sliding_window=None), None),
    ("mixtral/attention_bias", "Mixtral", dict(attention_bias=True), None),
    ("qwen2moe/head_dim32", "Qwen2Moe", dict(head_dim=32), None),
    ("qwen2moe/attention_bias", "Qwen2Moe", dict(attention_bias=True), None),
    ("qwen2/mlp_bias", "Qwen2", dict(mlp_bias=True), None),
    ("qwen3/mlp_bias", "Qwen3", dict(mlp_bias=True), None),
    ("gptoss/mlp_bias", "GptOss", dict(mlp_bias=True), None),
    ("qwen3moe/qkv_bias", "Qwen3Moe", dict(qkv_bias=True), None),
    ("dsv3/mlp_bias_ignored", "DeepseekV3", dict(mlp_bias=True), None),
    (
        "dsv3/topk_method_group_limited",
        "DeepseekV3",
        dict(topk_method="group_limited_greedy"),
        None,
    ),
]


def build(family: str, over: dict, path: str, seed: int):
    cfg_cls = getattr(transformers, f"{family}Config")
    kw = COMMON | BASE[family] | over
    cfg = cfg_cls(**kw)
    cls = getattr(transformers, f"{family}ForCausalLM")
    extra = {"attn_implementation": "eager"} if family == "GptOss" else {}
    torch.manual_seed(seed)
    hf = cls._from_config(cfg, dtype=torch.float32, **extra).eval()
    with torch.no_grad():
        saved = {n: (p, p.shape) for n, p in hf.named_parameters() if p.numel() == 0}
        for p, _shape in saved.values():  # randomize_ divides by fan-in: skip empty tensors
            p.data = torch.ones(1, 1)
        randomize_(hf)
        for p, shape in saved.values():
            p.data = torch.empty(shape)
        for m in hf.modules():
            if hasattr(m, "e_score_correction_bias"):
                m.e_score_correction_bias.normal_(0, 0.1)
    hf.save_pretrained(path)
    # reload from disk (what a hidden check does) so HF's own config round trip is tested
    hf = cls.from_pretrained(path, dtype=torch.float32, **extra).eval()
    return hf


def first_diff(ours, truth):
    """(#requests equal, description of the first non-tie difference or None, ties)."""
    bad, ties = None, 0
    for i, (got, (want, logits)) in enumerate(zip(ours, truth)):
        for j, (a, b) in enumerate(zip(got, want)):
            if a == b:
                continue
            top2 = logits[j].topk(2).values
            gap = float(top2[0] - top2[1])
            if gap < TIE_GAP:
                ties += 1
            elif bad is None:
                bad = f"req {i} tok {j}: ours {a} HF {b} (gap {gap:.3g})"
            break
    return bad, ties


def run_variant(name, family, over, lengths, engine: bool):
    lengths = lengths or [5, 13, 26]
    seed = 1000 + sum(map(ord, name))
    with tempfile.TemporaryDirectory() as d:
        try:
            hf = build(family, over, d, seed)
        except Exception as e:  # HF itself rejects the config
            return dict(status="HF-REJECTS", note=f"{type(e).__name__}: {str(e)[:150]}")
        try:
            model = load_model(d)
        except InvalidArgumentError as e:
            return dict(status="TYPED-ERR", note=f"{type(e).__name__}: {str(e)[:200]}")
        except Exception as e:
            return dict(
                status="UNTYPED-ERR",
                note=f"{type(e).__name__}: {str(e)[:200]}\n" + traceback.format_exc()[-800:],
            )
        res = {}
        try:
            prompts = prompts_of(lengths, seed=7)
            drv = GreedyDriver(model, page_size=4)
            ids, pos, inputs, offs = prefill_step(drv.mgr, prompts)
            logits = model(ids, pos, inputs, offs, torch.arange(len(ids)))
            try:
                with torch.no_grad():
                    ref = torch.cat([hf(torch.tensor([p])).logits[0] for p in prompts])
            except Exception as e:  # transformers' own forward fails on the config
                return dict(status="HF-FAILS", note=f"forward: {type(e).__name__}: {str(e)[:150]}")
            err = float((logits - ref).abs().max())
            scale = float(ref.abs().max())
            res["rel_err"] = err / max(scale, 1.0)
            prompts = prompts_of(lengths, seed=11)
            try:
                truth = [hf_greedy(hf, p, NEW) for p in prompts]
            except Exception as e:  # transformers' own generate fails on the config
                res.update(status="HF-FAILS", note=f"generate: {type(e).__name__}: {str(e)[:150]}")
                res["status"] += "" if res["rel_err"] <= 2e-5 else " (and our logits differ)"
                return res
            ours, _ = GreedyDriver(load_model(d), page_size=16).generate(prompts, NEW)
            bad1, t1 = first_diff(ours, truth)
            ours2, _ = GreedyDriver(load_model(d), page_size=1, token_budget=16).generate(
                prompts, NEW, [0, 1, 2]
            )
            bad2, t2 = first_diff(ours2, truth)
            res["ragged"] = bad1 or "ok"
            res["chunked"] = bad2 or "ok"
            res["ties"] = t1 + t2
            if engine:
                from pagedattn.engine import LLM, SamplingParams

                llm = LLM(d, device="cpu", dtype=torch.float32, page_size=4, num_pages=128,
                          max_num_batched_tokens=16, max_num_seqs=4)  # fmt: skip
                outs = llm.generate([{"prompt_token_ids": p} for p in prompts],
                                    SamplingParams(max_tokens=NEW, temperature=0.0,
                                                   ignore_eos=True))  # fmt: skip
                bad3, _ = first_diff([o.outputs[0].token_ids for o in outs], truth)
                res["engine"] = bad3 or "ok"
        except Exception as e:
            res["exc"] = f"{type(e).__name__}: {str(e)[:200]}\n" + traceback.format_exc()[-600:]
        ok = (res.get("rel_err", 1) <= 2e-5 and res.get("ragged") == "ok"
              and res.get("chunked") == "ok" and res.get("engine", "ok") == "ok"
              and "exc" not in res)  # fmt: skip
        res["status"] = "PASS" if ok else "FAIL"
        return res


def main(argv):
    engine = "--engine" in argv
    filt = [a for a in argv if not a.startswith("--")]
    for name, family, over, lengths in V:
        if filt and not any(f in name for f in filt):
            continue
        r = run_variant(name, family, over, lengths, engine)
        st = r.pop("status")
        extra = ", ".join(
            f"{k}={v:.1e}" if isinstance(v, float) else f"{k}={v}" for k, v in r.items()
        )
        print(f"{st:12s} {name:34s} {extra}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
