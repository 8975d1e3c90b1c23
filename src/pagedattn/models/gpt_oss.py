"""gpt-oss (transformers 5.24's GptOssForCausalLM) on the paged cache.

What differs from the Llama family (`llama.DecoderForCausalLM`, whose step it shares):
- attention sinks: a learned logit per query head (`self_attn.sinks`) that joins the softmax
  denominator only (GptOss `eager_attention_forward`: the sink column is dropped after the
  softmax), passed to `mha(sinks=...)` in float32;
- alternating layers per `layer_types`: "sliding_attention" layers see the last
  `sliding_window` keys (p - W < j <= p), "full_attention" layers are causal;
- q/k/v/o biases (`attention_bias`, default True), YaRN RoPE (default factor 32) whose
  attention scaling multiplies cos and sin;
- a top-k MoE MLP (`layers.GptOssMoE`): router with bias, softmax over the top-k logits,
  experts with biases and the clamped SwiGLU (alpha 1.702, limit 7.0), run without a host
  sync through `ops.moe` on CUDA in bf16 / fp16 and as two grouped matmuls on the CPU, so
  decode steps can replay CUDA graphs;
- RMSNorm as GptOssRMSNorm, `(weight * x_normed).to(dtype)` with its weight kept float32
  (transformers' `_keep_in_fp32_modules`).
MXFP4 checkpoints (`quantization_config.quant_method == "mxfp4"`: `*_blocks` / `*_scales`
expert tensors) are dequantized to the model's dtype at load time (`loader.dequantize_mxfp4`).
"""

from __future__ import annotations

from torch import nn

from .config import ModelConfig
from .layers import GptOssMoE, fused_experts_ok, grouped_experts_ok
from .llama import DecoderForCausalLM


class GptOssForCausalLM(DecoderForCausalLM):
    """gpt-oss-20b / 120b layout."""

    packed_modules = {"qkv_proj": ("q_proj", "k_proj", "v_proj")}
    norm_weight_first = True

    @property
    def supports_cuda_graphs(self) -> bool:
        """Capturable where the experts run without a host sync: through `ops.moe` (bf16 /
        fp16 on CUDA, `layers.fused_experts_ok`) or as grouped matmuls
        (`layers.grouped_experts_ok`); otherwise their loop reads counts on the host."""
        dev = self.model.embed_tokens.weight.device
        return fused_experts_ok(dev, self.dtype) or grouped_experts_ok(dev, self.dtype)

    def make_mlp(self, cfg: ModelConfig, layer_idx: int, dtype) -> nn.Module:
        return GptOssMoE(cfg, dtype, self.tp_size, self.tp_rank)


__all__ = ["GptOssForCausalLM"]
