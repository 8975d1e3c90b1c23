"""Architecture name (config.json `architectures[0]`) -> model class.

To add an architecture: implement it (usually a `llama.DecoderForCausalLM` subclass that
overrides `make_mlp`, `packed_modules` or the attention), teach `config._parse` its fields and
`config.SUPPORTED_ARCHITECTURES` its name, then register it here (docs/models.md).
"""

from __future__ import annotations

from torch import nn

from .config import SUPPORTED_ARCHITECTURES, ModelConfig, UnsupportedModelError
from .deepseek import DeepseekV2ForCausalLM, DeepseekV3ForCausalLM
from .gpt_oss import GptOssForCausalLM
from .llama import LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM
from .llama_moe import MixtralForCausalLM, Qwen2MoeForCausalLM, Qwen3MoeForCausalLM

MODEL_REGISTRY: dict[str, type[nn.Module]] = {
    "LlamaForCausalLM": LlamaForCausalLM,
    "MistralForCausalLM": MistralForCausalLM,
    "Qwen2ForCausalLM": Qwen2ForCausalLM,
    "Qwen3ForCausalLM": Qwen3ForCausalLM,
    "MixtralForCausalLM": MixtralForCausalLM,
    "Qwen2MoeForCausalLM": Qwen2MoeForCausalLM,
    "Qwen3MoeForCausalLM": Qwen3MoeForCausalLM,
    "GptOssForCausalLM": GptOssForCausalLM,
    "DeepseekV3ForCausalLM": DeepseekV3ForCausalLM,
    "DeepseekV2ForCausalLM": DeepseekV2ForCausalLM,
}
assert set(MODEL_REGISTRY) == set(SUPPORTED_ARCHITECTURES)


def model_class(config: object) -> type[nn.Module]:
    """The class serving a config (a ModelConfig or anything `ModelConfig.from_hf` takes)."""
    cfg = ModelConfig.from_hf(config)
    try:
        return MODEL_REGISTRY[cfg.architecture]
    except KeyError:  # pragma: no cover - from_hf rejects unknown architectures first
        raise UnsupportedModelError(
            f"architecture {cfg.architecture!r} is not supported; supported architectures: "
            f"{', '.join(MODEL_REGISTRY)}"
        ) from None


__all__ = ["MODEL_REGISTRY", "model_class"]
