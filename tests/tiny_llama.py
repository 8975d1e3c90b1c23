"""A tiny random Llama checkpoint for the engine tests (written with `save_pretrained`)."""

from __future__ import annotations

import torch
import transformers


def save_tiny_llama(path, seed: int, vocab: int = 256, **config) -> transformers.LlamaForCausalLM:
    """A float32 Llama (hidden 64, 2 layers, 4 q / 2 KV heads; `config` overrides) with large
    random weights, so that greedy tokens rarely sit near ties; saved in `path`, returned."""
    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(
        **dict(
            vocab_size=vocab,
            hidden_size=64,
            intermediate_size=96,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            bos_token_id=None,
            eos_token_id=None,
            pad_token_id=None,
        )
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
