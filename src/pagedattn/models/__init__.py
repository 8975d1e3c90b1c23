"""Decoder models on the paged KV cache, loaded from Hugging Face checkpoints (layer 4).

    from pagedattn.models import load_model, kv_cache_params
    model = load_model("path/to/checkpoint", device="cuda", dtype=torch.bfloat16)
    params = kv_cache_params(model.config, dtype=model.dtype, page_size=16, devices=["cuda"])
    model.attach_kv_cache(params)
    logits = model(input_ids, positions, kv_inputs, q_row_offsets, logits_rows)

Supported: Llama 3.x, Mistral (sliding window), Qwen2 (qkv bias), Qwen3 (q/k norm), their MoE
variants Mixtral, Qwen2-MoE (shared expert) and Qwen3-MoE (softmax top-k routing), gpt-oss
(sinks, alternating sliding/full layers, top-k MoE), DeepSeek-V2 / V3 (MLA). The step
contract, what a step is and how to add an architecture: docs/models.md.
"""

from .config import (
    SUPPORTED_ARCHITECTURES,
    SUPPORTED_MODEL_TYPES,
    SUPPORTED_ROPE_TYPES,
    ModelConfig,
    RopeConfig,
    UnsupportedModelError,
    kv_cache_params,
)
from .gpt_oss import GptOssForCausalLM
from .llama import (
    DecoderForCausalLM,
    LlamaForCausalLM,
    MistralForCausalLM,
    Qwen2ForCausalLM,
    Qwen3ForCausalLM,
)
from .llama_moe import MixtralForCausalLM, Qwen2MoeForCausalLM, Qwen3MoeForCausalLM
from .loader import CheckpointError, checkpoint_index, load_model, load_weights
from .registry import MODEL_REGISTRY, model_class

__all__ = [
    "MODEL_REGISTRY",
    "SUPPORTED_ARCHITECTURES",
    "SUPPORTED_MODEL_TYPES",
    "SUPPORTED_ROPE_TYPES",
    "CheckpointError",
    "DecoderForCausalLM",
    "GptOssForCausalLM",
    "LlamaForCausalLM",
    "MistralForCausalLM",
    "MixtralForCausalLM",
    "ModelConfig",
    "Qwen2ForCausalLM",
    "Qwen2MoeForCausalLM",
    "Qwen3ForCausalLM",
    "Qwen3MoeForCausalLM",
    "RopeConfig",
    "UnsupportedModelError",
    "checkpoint_index",
    "kv_cache_params",
    "load_model",
    "load_weights",
    "model_class",
]
