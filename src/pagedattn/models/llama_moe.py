"""The Llama family's mixture-of-experts decoders on the paged cache: Mixtral, Qwen2-MoE and
Qwen3-MoE (transformers 5.24's MixtralForCausalLM, Qwen2MoeForCausalLM, Qwen3MoeForCausalLM).

Attention and the step are `llama.DecoderForCausalLM`'s (Mixtral: Mistral's, every layer
sliding when `sliding_window` is set; Qwen2-MoE: q/k/v bias from `qkv_bias`, sliding layers
per `layer_types`; Qwen3-MoE: Qwen3's q/k RMSNorm, one sliding window for every layer with
`use_sliding_window`). The MLP of a layer is `moe.SparseMoE` where `config.layer_is_moe(i)`
(softmax top-k routing, SwiGLU experts, Qwen2-MoE's gated shared expert), else the dense
SwiGLU of intermediate_size (Qwen's `mlp_only_layers` / `decoder_sparse_step`).

Checkpoints hold each expert's tensors (`...mlp.experts.{e}.gate_proj.weight`, Mixtral's
`...block_sparse_moe.experts.{e}.w1.weight` with w3 the up and w2 the down projection);
`checkpoint_source` stacks them into the experts' [E, 2I, H] / [E, H, I] parameters (this
rank's slice with tensor parallelism) and maps Mixtral's `block_sparse_moe` onto `mlp`.
"""

from __future__ import annotations

import re

from torch import nn

from .config import ModelConfig
from .layers import fused_experts_ok, grouped_experts_ok
from .llama import DecoderForCausalLM
from .moe import SparseMoE, expert_weight_source
from .weights import WeightSource

_EXPERTS = re.compile(r"^(model\.layers\.\d+)\.mlp\.experts\.(gate_up_proj|down_proj)$")
_MLP = re.compile(r"^(model\.layers\.\d+)\.mlp\.")
_SHARED = re.compile(r"^model\.layers\.\d+\.mlp\.shared_expert(_gate)?\.")


class SoftmaxMoEDecoder(DecoderForCausalLM):
    """A Llama-family decoder whose MoE layers route with `moe.SparseMoE`. Subclasses name the
    checkpoint's MoE block (`moe_block`) and its experts' (gate, up, down) tensors
    (`expert_names`)."""

    moe_block = "mlp"
    expert_names = ("gate_proj", "up_proj", "down_proj")

    @property
    def supports_cuda_graphs(self) -> bool:
        """Capturable where the experts run without a host sync: `ops.moe` (bf16 / fp16 on
        CUDA) or grouped matmuls (`layers.grouped_experts_ok`)."""
        dev = self.model.embed_tokens.weight.device
        return (
            not self.config.is_moe
            or fused_experts_ok(dev, self.dtype)
            or grouped_experts_ok(dev, self.dtype)
        )

    def make_mlp(self, cfg: ModelConfig, layer_idx: int, dtype) -> nn.Module:
        if cfg.layer_is_moe(layer_idx):
            return SparseMoE(cfg, dtype, self.tp_size)
        return super().make_mlp(cfg, layer_idx, dtype)

    def checkpoint_source(self, name: str) -> WeightSource | None:
        """The experts' stacked parameters from the per-expert tensors; with another MoE block
        name (Mixtral's `block_sparse_moe`), its router's weight too."""
        m = _EXPERTS.match(name)
        if m is not None:
            layer, param = m.groups()
            return expert_weight_source(
                f"{layer}.{self.moe_block}.experts", param, self.config.num_experts,
                self.expert_names, tp_rank=self.tp_rank, tp_size=self.tp_size,
            )  # fmt: skip
        m = _MLP.match(name)
        if m is not None and self.moe_block != "mlp":
            layer = int(m.group(1).rsplit(".", 1)[1])
            if self.config.layer_is_moe(layer):
                return WeightSource((f"{m.group(1)}.{self.moe_block}.{name[m.end() :]}",))
        return None

    def ignores_checkpoint_tensor(self, name: str) -> bool:
        """Qwen2-MoE with shared_expert_intermediate_size 0: the shared expert transformers
        still builds and saves (0 intermediate features, so it adds sigmoid(gate) * 0 = 0) and
        its gate."""
        return (
            self.config.model_type == "qwen2_moe"
            and self.config.shared_expert_intermediate_size == 0
            and _SHARED.match(name) is not None
        )


class MixtralForCausalLM(SoftmaxMoEDecoder):
    """Mixtral (transformers' MixtralForCausalLM): Mistral's attention, a top-k MoE in every
    layer (experts of intermediate_size, weights renormalised, float32)."""

    moe_block = "block_sparse_moe"
    expert_names = ("w1", "w3", "w2")


class Qwen2MoeForCausalLM(SoftmaxMoEDecoder):
    """Qwen2-MoE / Qwen1.5-MoE (transformers' Qwen2MoeForCausalLM): q/k/v bias, routed experts
    plus a sigmoid-gated shared expert."""


class Qwen3MoeForCausalLM(SoftmaxMoEDecoder):
    """Qwen3-MoE (transformers' Qwen3MoeForCausalLM): Qwen3's q/k RMSNorm, routed experts."""


__all__ = [
    "MixtralForCausalLM",
    "Qwen2MoeForCausalLM",
    "Qwen3MoeForCausalLM",
    "SoftmaxMoEDecoder",
]
