"""Tiny random checkpoints for the engine and model tests (written with `save_pretrained`):
a Llama, a gpt-oss, a Qwen2-MoE and a Mixtral, and the weight randomizer they share with
test_models_hf."""

from __future__ import annotations

import torch
import transformers


@torch.no_grad()
def randomize_(model) -> None:
    """Weights large enough that greedy tokens are rarely near ties and every feature (biases,
    norms, sinks, routing) matters."""
    for name, p in model.named_parameters():
        if name.endswith("norm.weight"):
            p.copy_(1 + 0.2 * torch.randn_like(p))
        elif name.endswith("sinks"):
            p.copy_(torch.randn_like(p))
        elif "router" in name:
            p.normal_(0, 0.5)
        elif "embed_tokens" in name:
            p.normal_(0, 1.0)
        elif p.ndim == 1 or name.endswith("_bias"):
            p.normal_(0, 0.1)
        elif p.numel():  # (an empty shared expert: nothing to draw)
            p.normal_(0, 1.5 / p.shape[-1] ** 0.5 if p.ndim == 2 else 0.15)


def save_tiny_llama(path, seed: int, vocab: int = 256, **config) -> transformers.LlamaForCausalLM:
    """A float32 Llama (hidden 64, 2 layers, 4 q / 2 KV heads; `config` overrides) with large
    random weights, so that greedy tokens rarely sit near ties; saved in `path`, returned."""
    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(
        **tiny_common(vocab)
        | dict(intermediate_size=96, num_attention_heads=4, num_key_value_heads=2)
        | config
    )
    hf = transformers.LlamaForCausalLM._from_config(cfg, dtype=torch.float32).eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.2 * torch.randn_like(p))
            elif "embed_tokens" in name:
                p.normal_(0, 1.0)
            else:
                p.normal_(0, 1.5 / p.shape[-1] ** 0.5)
    hf.save_pretrained(path)
    return hf


def tiny_common(vocab: int) -> dict:
    """The config fields every tiny test model shares: hidden 64, 2 layers, no BOS/EOS/pad."""
    return dict(
        vocab_size=vocab,
        hidden_size=64,
        num_hidden_layers=2,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )


def tiny_gpt_oss_config(**common) -> transformers.GptOssConfig:
    """A gpt-oss config at toy size: 4 q / 2 KV heads of 16, sliding window 8 on alternate
    layers, 4 experts of 32 intermediate features, top-2 (`common`: vocab, hidden, layers...)."""
    return transformers.GptOssConfig(
        **common,
        intermediate_size=32,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        sliding_window=8,
        num_local_experts=4,
        num_experts_per_tok=2,
    )


def tiny_qwen2_moe_config(**common) -> transformers.Qwen2MoeConfig:
    """A Qwen2-MoE config at toy size: 4 q / 2 KV heads of 16 (q/k/v bias), 5 experts of 32
    intermediate features, top-2, a shared expert of 48 behind its sigmoid gate, layer 0
    sliding over 12 keys (`common`: vocab, hidden, layers...)."""
    return transformers.Qwen2MoeConfig(
        **common,
        intermediate_size=96,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_experts=5,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        shared_expert_intermediate_size=48,
        use_sliding_window=True,
        sliding_window=12,
        max_window_layers=1,
    )


def tiny_mixtral_config(**common) -> transformers.MixtralConfig:
    """A Mixtral config at toy size: 4 q / 2 KV heads of 16, every layer sliding over 10 keys,
    4 experts of 48 intermediate features, top-2 (`common`: vocab, hidden, layers...)."""
    return transformers.MixtralConfig(
        **common,
        intermediate_size=48,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_local_experts=4,
        num_experts_per_tok=2,
        sliding_window=10,
    )


def _saver(config, cls, **kw):
    """`save(path, seed, vocab=256)`: a float32 `cls` of `config(**tiny_common(vocab))` (hidden
    64, 2 layers) with `randomize_`'s weights, saved in `path` and returned; `kw` go to
    `cls._from_config`."""

    def save(path, seed: int, vocab: int = 256):
        return _save_randomized(path, seed, cls, config(**tiny_common(vocab)), **kw)

    return save


def _save_randomized(path, seed: int, cls, cfg, **kw):
    """`cls` of `cfg` in float32 with `randomize_`'s weights (seeded by `seed`), saved in
    `path`, returned (eval mode)."""
    torch.manual_seed(seed)
    hf = cls._from_config(cfg, dtype=torch.float32, **kw).eval()
    randomize_(hf)
    hf.save_pretrained(path)
    return hf


save_tiny_gpt_oss = _saver(
    tiny_gpt_oss_config, transformers.GptOssForCausalLM, attn_implementation="eager"
)
save_tiny_qwen2_moe = _saver(tiny_qwen2_moe_config, transformers.Qwen2MoeForCausalLM)
save_tiny_mixtral = _saver(tiny_mixtral_config, transformers.MixtralForCausalLM)


def tiny_deepseek_config(vocab: int = 256) -> transformers.DeepseekV3Config:
    """A DeepSeek-V3 config at toy size: hidden 64, 2 layers (one dense, one MoE of 4 routed
    experts top-2 plus a shared one); MLA with kv_lora_rank 32, rope 16, nope 16, v 16, no
    q_lora."""
    return transformers.DeepseekV3Config(
        **tiny_common(vocab),
        intermediate_size=96,
        moe_intermediate_size=32,
        num_attention_heads=4,
        num_key_value_heads=4,
        kv_lora_rank=32,
        q_lora_rank=None,
        qk_rope_head_dim=16,
        qk_nope_head_dim=16,
        v_head_dim=16,
        n_routed_experts=4,
        num_experts_per_tok=2,
        n_group=1,
        topk_group=1,
        n_shared_experts=1,
        first_k_dense_replace=1,
        max_position_embeddings=256,
    )


def save_tiny_deepseek(path, seed: int, vocab: int = 256) -> transformers.DeepseekV3ForCausalLM:
    """A float32 `tiny_deepseek_config` model with `randomize_`'s weights; saved in `path`,
    returned."""
    return _save_randomized(path, seed, transformers.DeepseekV3ForCausalLM,
                            tiny_deepseek_config(vocab))  # fmt: skip
