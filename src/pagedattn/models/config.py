"""`ModelConfig`: the fields of a Hugging Face `config.json` the models use, parsed and frozen.

`ModelConfig.from_hf(src)` accepts a `config.json` dict, a `transformers.PretrainedConfig` (read
through its `to_dict()`; transformers itself is never imported here) or a checkpoint folder (a
path holding `config.json`). Missing optional fields take transformers 5's defaults for the
model type (head_dim: Qwen3 128, others hidden_size // heads; rope theta: gpt-oss 150000,
others 10000; ...). Unknown architectures / model types raise `UnsupportedModelError` listing
the supported ones; a supported model with an unsupported feature (a RoPE type, a hidden
activation, partial rotary, per-layer RoPE) raises it too, naming the feature.

`kv_cache_params(config, dtype=..., page_size=...)` builds the `KVCacheParams` of a model's
paged KV cache: one cache of every layer (sliding-window layers keep every token too; their
mask hides what is out of the window). For DeepSeek-V3 (`is_mla`) it is an MLA cache: one
latent head of kv_lora_rank + qk_rope_head_dim (576 for DeepSeek's) elements, mla_rope_dim the
rope dim.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..cache.params import KVCacheParams, KVQuantConfig
from ..errors import InvalidArgumentError, check
from ..ops.mla import MAX_D_QK, MAX_D_V

# architecture (config.json "architectures"[0]) -> model_type. The registry (models/registry.py)
# maps the same names to classes.
SUPPORTED_ARCHITECTURES: dict[str, str] = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "MixtralForCausalLM": "mixtral",
    "Qwen2MoeForCausalLM": "qwen2_moe",
    "Qwen3MoeForCausalLM": "qwen3_moe",
    "GptOssForCausalLM": "gpt_oss",
    "DeepseekV3ForCausalLM": "deepseek_v3",
    "DeepseekV2ForCausalLM": "deepseek_v2",
}
SUPPORTED_MODEL_TYPES: tuple[str, ...] = tuple(dict.fromkeys(SUPPORTED_ARCHITECTURES.values()))
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "yarn")

# transformers 5.24's defaults for fields a config.json may leave out (configuration_*.py).
_DEFAULT_THETA = {"gpt_oss": 150000.0, "mixtral": 1000000.0}
_DEFAULT_EPS = {"gpt_oss": 1e-5, "mixtral": 1e-5}
_DEFAULT_HEAD_DIM = {"qwen3": 128, "gpt_oss": 64}
_DEFAULT_MAX_POS = {
    "llama": 2048,
    "mistral": 131072,
    "qwen2": 32768,
    "qwen3": 32768,
    "mixtral": 131072,
    "qwen2_moe": 32768,
    "qwen3_moe": 32768,
    "gpt_oss": 131072,
    "deepseek_v3": 4096,
    "deepseek_v2": 2048,
}
# The MLA geometry mla_decode takes (ops/mla): DeepSeek's d_qk 576 = latent 512 + rope 64 in
# every cache format; over a BF16 / FP16 / FP32 cache any latent <= MAX_D_V (V is the latent)
# with rope, d_qk <= MAX_D_QK.
MLA_MAX_LATENT, MLA_MAX_D_QK = MAX_D_V, MAX_D_QK
_GPT_OSS_ROPE = {
    "rope_type": "yarn",
    "factor": 32.0,
    "beta_fast": 32.0,
    "beta_slow": 1.0,
    "truncate": False,
    "original_max_position_embeddings": 4096,
}
_DTYPES = {
    "float32": torch.float32,
    "float": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "half": torch.float16,
}


class UnsupportedModelError(InvalidArgumentError):
    """A checkpoint whose architecture, model type or a feature of it pagedattn's models do not
    implement. The message lists what is supported."""


@dataclass(frozen=True)
class RopeConfig:
    """RoPE of a checkpoint, as transformers 5's `rope_parameters` after `standardize_rope_params`.

    rope_type: "default", "linear", "llama3" or "yarn" (`layers.rope_inv_freq` computes the
    frequencies as transformers' `ROPE_INIT_FUNCTIONS` / `compute_default_rope_parameters` do).
    Fields a type does not use stay None.
    """

    rope_type: str = "default"
    theta: float = 10000.0
    factor: float | None = None
    original_max_position_embeddings: int | None = None
    low_freq_factor: float | None = None  # llama3
    high_freq_factor: float | None = None  # llama3
    beta_fast: float | None = None  # yarn
    beta_slow: float | None = None  # yarn
    truncate: bool = True  # yarn
    attention_factor: float | None = None  # yarn
    mscale: float | None = None  # yarn
    mscale_all_dim: float | None = None  # yarn
    max_position_embeddings: int = 2048  # yarn's factor when `factor` is None


@dataclass(frozen=True)
class ModelConfig:
    """A decoder-only checkpoint's architecture (the fields pagedattn's models read).

    layer_types: per layer "full_attention" or "sliding_attention"; `layer_window(i)` is the
    sliding window W of layer i (a query at position p sees keys in (p - W, p], as transformers'
    `sliding_window_causal_mask_function`) or None.
    num_experts: 0 for a dense MLP; else a top-`num_experts_per_tok` MoE (gpt-oss; Mixtral,
    Qwen2-MoE and Qwen3-MoE: softmax routing over experts of moe_intermediate_size, their top-k
    weights renormalised with norm_topk_prob and, with moe_weights_in_dtype, cast to the
    activations' dtype (Qwen) instead of float32 (Mixtral); a Qwen2-MoE shared expert of
    shared_expert_intermediate_size; `layer_is_moe(i)`: the MoE layers, every
    decoder_sparse_step-th outside mlp_only_layers).

    DeepSeek-V3 (MLA, `is_mla`): kv_lora_rank (the latent, 512), q_lora_rank (None: one q_proj),
    qk_nope_head_dim / qk_rope_head_dim / v_head_dim per head (head_dim is the rope dim, as
    transformers sets it), rope_interleave (rope pairs (2i, 2i+1)); its MoE: num_experts routed
    experts of moe_intermediate_size, n_shared_experts shared ones, sigmoid scores plus
    `e_score_correction_bias`, top-`topk_group` of n_group groups, norm_topk_prob,
    routed_scaling_factor; the first first_k_dense_replace layers are dense (intermediate_size).
    """

    architecture: str
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope: RopeConfig
    max_position_embeddings: int
    tie_word_embeddings: bool = False
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False
    sliding_window: int | None = None
    layer_types: tuple[str, ...] = ()
    attention_sinks: bool = False
    num_experts: int = 0
    num_experts_per_tok: int = 0
    swiglu_alpha: float = 1.702
    swiglu_limit: float = 7.0
    hidden_act: str = "silu"
    kv_lora_rank: int = 0
    q_lora_rank: int | None = None
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    rope_interleave: bool = False
    moe_intermediate_size: int = 0
    n_shared_experts: int = 0
    n_group: int = 1
    topk_group: int = 1
    routed_scaling_factor: float = 1.0
    norm_topk_prob: bool = False
    first_k_dense_replace: int = 0
    decoder_sparse_step: int = 1
    mlp_only_layers: tuple[int, ...] = ()
    shared_expert_intermediate_size: int = 0
    moe_weights_in_dtype: bool = False
    # DeepSeek routing: "noaux_tc" (V3: sigmoid, correction bias, groups by top-2 sums),
    # "greedy" / "group_limited_greedy" (V2: softmax, top-k / groups by their max)
    topk_method: str = "noaux_tc"
    dtype: torch.dtype | None = None
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    quantization: Mapping | None = field(default=None, compare=False, hash=False)

    def __post_init__(self) -> None:
        for name in ("vocab_size", "hidden_size", "num_layers", "num_heads", "num_kv_heads"):
            v = getattr(self, name)
            check(isinstance(v, int) and v >= 1, f"config.{name}", "an int >= 1", v)
        check(
            isinstance(self.head_dim, int) and self.head_dim >= 2 and self.head_dim % 2 == 0,
            "config.head_dim",
            "an even int >= 2",
            self.head_dim,
        )
        check(
            self.num_heads % self.num_kv_heads == 0,
            "config.num_attention_heads",
            f"a multiple of num_key_value_heads={self.num_kv_heads}",
            self.num_heads,
        )
        check(
            len(self.layer_types) == self.num_layers,
            "config.layer_types",
            f"{self.num_layers} entries (one per layer)",
            len(self.layer_types),
        )
        bad = sorted(set(self.layer_types) - {"full_attention", "sliding_attention"})
        if bad:
            raise UnsupportedModelError(
                f"config.layer_types: {bad} not supported (supported: 'full_attention', "
                "'sliding_attention')"
            )
        if self.sliding_window is not None:
            check(
                isinstance(self.sliding_window, int) and self.sliding_window >= 1,
                "config.sliding_window",
                "an int >= 1 or None",
                self.sliding_window,
            )
        check(
            isinstance(self.decoder_sparse_step, int) and self.decoder_sparse_step >= 1,
            "config.decoder_sparse_step",
            "an int >= 1",
            self.decoder_sparse_step,
        )
        if self.num_experts:
            check(
                1 <= self.num_experts_per_tok <= self.num_experts,
                "config.num_experts_per_tok",
                f"in [1, num_experts={self.num_experts}]",
                self.num_experts_per_tok,
            )

    # Derived -------------------------------------------------------------------------------
    def layer_window(self, layer_idx: int) -> int | None:
        """Sliding window of layer `layer_idx`, or None for full causal attention."""
        if self.layer_types[layer_idx] == "sliding_attention":
            return self.sliding_window
        return None

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    def layer_is_moe(self, layer_idx: int) -> bool:
        """Whether layer `layer_idx` has the routed MLP (Qwen2MoeDecoderLayer's rule: experts,
        not in mlp_only_layers, and (i + 1) % decoder_sparse_step == 0; every layer of gpt-oss
        and Mixtral). DeepSeek's dense layers are its own `first_k_dense_replace`."""
        return (
            self.is_moe
            and layer_idx not in self.mlp_only_layers
            and (layer_idx + 1) % self.decoder_sparse_step == 0
        )

    @property
    def is_mla(self) -> bool:
        """Multi-head latent attention (DeepSeek): one latent cache row a token."""
        return self.kv_lora_rank > 0

    @property
    def mla_head_dim(self) -> int:
        """Elements of one MLA cache row: kv_lora_rank + qk_rope_head_dim (576)."""
        return self.kv_lora_rank + self.qk_rope_head_dim

    @property
    def fp8_block(self) -> tuple[int, int] | None:
        """(n, k) of an FP8 block-quantized checkpoint's weight blocks (DeepSeek's
        `quantization_config.weight_block_size`), or None."""
        q = self.quantization or {}
        if q.get("quant_method") != "fp8":
            return None
        n, k = q["weight_block_size"]
        return int(n), int(k)

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    # Parsing -------------------------------------------------------------------------------
    @classmethod
    def from_hf(cls, src: object) -> ModelConfig:
        """Parse a config.json dict, a transformers PretrainedConfig or a checkpoint folder."""
        if isinstance(src, ModelConfig):
            return src
        return _parse(_as_dict(src))


def _as_dict(src: object) -> dict:
    if isinstance(src, Mapping):
        return dict(src)
    if isinstance(src, (str, os.PathLike)):
        path = Path(src)
        if path.is_dir():
            path = path / "config.json"
        if not path.is_file():
            raise InvalidArgumentError(f"config: no config.json at {str(path)!r}")
        with open(path) as f:
            return json.load(f)
    to_dict = getattr(src, "to_dict", None)
    if callable(to_dict):  # a transformers PretrainedConfig
        d = to_dict()
        # to_dict() leaves out some attributes set in __post_init__; read them directly.
        for k in ("head_dim", "layer_types", "rope_parameters", "sliding_window"):
            if hasattr(src, k):
                d[k] = getattr(src, k)
        return d
    raise InvalidArgumentError(
        "config: expected a config.json dict, a transformers PretrainedConfig or a checkpoint "
        f"folder, got {type(src).__name__}"
    )


def _unsupported_arch(what: str) -> UnsupportedModelError:
    return UnsupportedModelError(
        f"{what} is not supported; supported architectures: "
        f"{', '.join(SUPPORTED_ARCHITECTURES)} (model types: {', '.join(SUPPORTED_MODEL_TYPES)})"
    )


def _resolve_arch(d: dict) -> tuple[str, str]:
    archs = d.get("architectures") or []
    model_type = d.get("model_type")
    if archs:
        arch = archs[0]
        if arch not in SUPPORTED_ARCHITECTURES:
            raise _unsupported_arch(f"architecture {arch!r}")
        return arch, SUPPORTED_ARCHITECTURES[arch]
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise _unsupported_arch(f"model_type {model_type!r}")
    arch = next(a for a, t in SUPPORTED_ARCHITECTURES.items() if t == model_type)
    return arch, model_type


def _required(d: dict, key: str) -> object:
    if d.get(key) is None:
        raise InvalidArgumentError(f"config.{key}: required, missing from the config")
    return d[key]


def _opt_float(v: object) -> float | None:
    return None if v is None else float(v)


def _parse_rope(d: dict, model_type: str, max_pos: int) -> RopeConfig:
    """transformers 5's `convert_rope_params_to_dict` + `standardize_rope_params`: rope_parameters
    (or the legacy rope_scaling) with rope_theta and original_max_position_embeddings folded in."""
    rp = d.get("rope_parameters") or d.get("rope_scaling")
    if rp is None and model_type == "gpt_oss":
        rp = _GPT_OSS_ROPE
    rp = dict(rp or {})
    layer_types = set(d.get("layer_types") or ())
    if layer_types & set(rp):
        raise UnsupportedModelError(
            f"config.rope_parameters: per-layer-type RoPE ({sorted(layer_types & set(rp))}) is "
            "not supported; one RoPE for every layer is"
        )
    rope_type = rp.get("rope_type", rp.get("type", "default"))
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise UnsupportedModelError(
            f"config.rope_parameters.rope_type: {rope_type!r} is not supported; supported: "
            f"{', '.join(SUPPORTED_ROPE_TYPES)}"
        )
    partial = rp.get("partial_rotary_factor", d.get("partial_rotary_factor"))
    if partial is not None and float(partial) != 1.0:
        raise UnsupportedModelError(
            f"config.partial_rotary_factor: {partial} is not supported (only full rotary, 1.0)"
        )
    theta = rp.get("rope_theta", d.get("rope_theta"))
    theta = float(_DEFAULT_THETA.get(model_type, 10000.0) if theta is None else theta)
    orig = None
    if rope_type in ("llama3", "yarn"):
        # standardize_rope_params: a top-level original_max_position_embeddings wins.
        orig = d.get("original_max_position_embeddings") or rp.get(
            "original_max_position_embeddings", max_pos
        )
        orig = int(orig)
    factor = _opt_float(rp.get("factor"))
    if rope_type in ("linear", "llama3"):
        check(factor is not None, "config.rope_parameters.factor", "a number", None)
    if rope_type == "llama3":
        for k in ("low_freq_factor", "high_freq_factor"):
            check(rp.get(k) is not None, f"config.rope_parameters.{k}", "a number", None)
    return RopeConfig(
        rope_type=rope_type,
        theta=theta,
        factor=factor,
        original_max_position_embeddings=orig,
        low_freq_factor=_opt_float(rp.get("low_freq_factor")),
        high_freq_factor=_opt_float(rp.get("high_freq_factor")),
        beta_fast=_opt_float(rp.get("beta_fast")),
        beta_slow=_opt_float(rp.get("beta_slow")),
        truncate=bool(rp.get("truncate", True)),
        attention_factor=_opt_float(rp.get("attention_factor")),
        mscale=_opt_float(rp.get("mscale")),
        mscale_all_dim=_opt_float(rp.get("mscale_all_dim")),
        max_position_embeddings=max_pos,
    )


def _window_and_types(d: dict, model_type: str, num_layers: int) -> tuple[int | None, tuple]:
    """(sliding_window, layer_types) as transformers 5.24's config classes and attention modules
    resolve them."""
    full = ("full_attention",) * num_layers
    if model_type in ("llama", "deepseek_v3", "deepseek_v2"):
        return None, full  # LlamaAttention / DeepseekV3Attention have no sliding window
    if model_type == "mistral":
        # MistralConfig ignores layer_types; every layer slides when sliding_window is set
        # (MistralModel: create_sliding_window_causal_mask iff config.sliding_window).
        w = d.get("sliding_window")
        return (None, full) if w is None else (int(w), ("sliding_attention",) * num_layers)
    if model_type == "mixtral":  # MixtralModel: as Mistral, every layer slides when set
        w = d.get("sliding_window")
        return (None, full) if w is None else (int(w), ("sliding_attention",) * num_layers)
    if model_type == "qwen3_moe":
        # Qwen3MoeConfig: the window only with use_sliding_window; Qwen3MoeModel then builds
        # one sliding-window mask for every layer
        w = d.get("sliding_window") if d.get("use_sliding_window", False) else None
        return (None, full) if w is None else (int(w), ("sliding_attention",) * num_layers)
    if model_type == "qwen2_moe":
        # Qwen2MoeConfig.__post_init__: with use_sliding_window, layer i slides when i is even
        # and i < max_window_layers, unless layer_types is given; each layer takes the mask of
        # its type (Qwen2MoeModel)
        w = d.get("sliding_window") if d.get("use_sliding_window", False) else None
        types = d.get("layer_types")
        if w is None:
            if types is not None and "sliding_attention" in types:
                raise UnsupportedModelError(
                    "config.layer_types: sliding_attention layers without use_sliding_window "
                    "are not supported (transformers gives them a window of 0)"
                )
            return None, full
        if types is None:
            mwl = int(d.get("max_window_layers", 28))
            types = [
                "sliding_attention" if (i + 1) % 2 and i < mwl else "full_attention"
                for i in range(num_layers)
            ]
        return int(w), tuple(types)
    if model_type in ("qwen2", "qwen3"):
        # Qwen2Config/Qwen3Config.__post_init__: the window only with use_sliding_window; layer i
        # slides when i >= max_window_layers unless layer_types is given.
        w = d.get("sliding_window") if d.get("use_sliding_window", False) else None
        w = None if w is None else int(w)
        types = d.get("layer_types")
        if types is None:
            mwl = int(d.get("max_window_layers", 28))
            types = [
                "sliding_attention" if w is not None and i >= mwl else "full_attention"
                for i in range(num_layers)
            ]
        if w is None:  # Qwen2Attention.sliding_window is None whatever the layer type
            types = full
        return w, tuple(types)
    # gpt_oss: GptOssConfig.__post_init__ alternates sliding (even) and full (odd) layers.
    w = d.get("sliding_window", 128)
    types = d.get("layer_types")
    if types is None:
        types = [
            "sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(num_layers)
        ]
    if w is None:
        types = full
    return (None if w is None else int(w)), tuple(types)


def _parse(d: dict) -> ModelConfig:
    arch, mt = _resolve_arch(d)
    hidden = int(_required(d, "hidden_size"))
    heads = int(_required(d, "num_attention_heads"))
    layers = int(_required(d, "num_hidden_layers"))
    kv_heads = d.get("num_key_value_heads")
    kv_heads = heads if kv_heads is None else int(kv_heads)
    # A missing head_dim takes the config class's default (Qwen3 128, gpt-oss 64); a null one
    # (or a class without the field) is hidden_size // num_attention_heads.
    head_dim = d["head_dim"] if "head_dim" in d else _DEFAULT_HEAD_DIM.get(mt)
    head_dim = hidden // heads if head_dim is None else head_dim
    max_pos = int(d.get("max_position_embeddings") or _DEFAULT_MAX_POS[mt])
    act = d.get("hidden_act", "silu")
    if act != "silu":
        raise UnsupportedModelError(f"config.hidden_act: {act!r} is not supported (only 'silu')")
    window, types = _window_and_types(d, mt, layers)
    eos = d.get("eos_token_id")
    eos = (
        ()
        if eos is None
        else (tuple(int(e) for e in eos) if isinstance(eos, Sequence) else (int(eos),))
    )
    dtype = d.get("dtype", d.get("torch_dtype"))
    if isinstance(dtype, str):
        dtype = _DTYPES.get(dtype.removeprefix("torch."))
    elif not isinstance(dtype, torch.dtype):
        dtype = None
    attn_bias = bool(d.get("attention_bias", mt == "gpt_oss"))
    quant = d.get("quantization_config")
    if quant is not None:
        method = quant.get("quant_method") if isinstance(quant, Mapping) else None
        fp8 = mt in ("deepseek_v3", "deepseek_v2") and method == "fp8"
        if not ((mt == "gpt_oss" and method == "mxfp4") or fp8):
            raise UnsupportedModelError(
                f"config.quantization_config: quant_method {method!r} is not supported for "
                f"{mt!r} (supported: gpt_oss 'mxfp4', dequantized at load time; deepseek_v3 "
                "'fp8' with weight_block_size and dynamic activations, run through fp8_bmm)"
            )
        quant = dict(quant)
        if fp8:
            block = quant.get("weight_block_size")
            ok = (
                isinstance(block, Sequence) and len(block) == 2
                and all(isinstance(b, int) and b >= 1 for b in block)
                and quant.get("activation_scheme", "dynamic") == "dynamic"
            )  # fmt: skip
            if not ok:
                raise UnsupportedModelError(
                    "config.quantization_config: fp8 needs weight_block_size [n, k] (ints >= 1) "
                    f"and activation_scheme 'dynamic', got {quant!r}"
                )
    moe = mt in ("gpt_oss", "mixtral", "qwen2_moe", "qwen3_moe")
    qwen_moe = mt in ("qwen2_moe", "qwen3_moe")
    if mt == "gpt_oss":
        E, k = int(d.get("num_local_experts", 128)), int(d.get("num_experts_per_tok", 4))
    elif mt == "mixtral":
        E, k = int(d.get("num_local_experts", 8)), int(d.get("num_experts_per_tok", 2))
    elif qwen_moe:
        # Qwen3MoeConfig saves num_experts as num_local_experts (its attribute_map); the
        # released checkpoints' config.json say num_experts
        E = d.get("num_experts", d.get("num_local_experts"))
        E = int((60 if mt == "qwen2_moe" else 128) if E is None else E)
        k = int(d.get("num_experts_per_tok", 4 if mt == "qwen2_moe" else 8)) if E else 0
    else:
        E = k = 0
    if mt == "mixtral":  # MixtralExperts: intermediate_size a expert
        moe_inter = int(_required(d, "intermediate_size"))
    elif qwen_moe:
        moe_inter = int(d.get("moe_intermediate_size", 1408 if mt == "qwen2_moe" else 768))
    else:
        moe_inter = 0
    shared = int(d.get("shared_expert_intermediate_size", 5632) or 0) if mt == "qwen2_moe" else 0
    # Qwen2Attention hard-codes bias=True on q/k/v and none on o_proj, Qwen2MoeAttention reads
    # qkv_bias (default True) for them, Mistral / MixtralAttention have no bias at all; Llama /
    # Qwen3 / Qwen3-MoE / gpt-oss read attention_bias for q, k, v and o.
    qkv_bias = attn_bias
    if mt == "qwen2":
        qkv_bias = True
    elif mt == "qwen2_moe":
        qkv_bias = bool(d.get("qkv_bias", True))
    elif mt in ("mistral", "mixtral"):
        qkv_bias = False
    if mt in ("deepseek_v3", "deepseek_v2"):
        return dataclasses.replace(
            _parse_deepseek(d, arch, mt, hidden, heads, layers, max_pos, act, dtype, eos),
            quantization=quant,
        )
    return ModelConfig(
        architecture=arch,
        model_type=mt,
        vocab_size=int(_required(d, "vocab_size")),
        hidden_size=hidden,
        intermediate_size=int(_required(d, "intermediate_size")),
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=int(head_dim),
        rms_norm_eps=float(d.get("rms_norm_eps") or _DEFAULT_EPS.get(mt, 1e-6)),
        rope=_parse_rope(d, mt, max_pos),
        max_position_embeddings=max_pos,
        tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
        qkv_bias=qkv_bias,
        o_bias=attn_bias if mt in ("llama", "qwen3", "qwen3_moe", "gpt_oss") else False,
        mlp_bias=bool(d.get("mlp_bias", False)) if mt == "llama" else False,
        qk_norm=mt in ("qwen3", "qwen3_moe"),
        sliding_window=window,
        layer_types=types,
        attention_sinks=mt == "gpt_oss",
        num_experts=E if moe else 0,
        num_experts_per_tok=k if moe else 0,
        moe_intermediate_size=moe_inter,
        norm_topk_prob=True if mt == "mixtral" else bool(d.get("norm_topk_prob", False)),
        decoder_sparse_step=int(d.get("decoder_sparse_step", 1) or 1) if qwen_moe else 1,
        mlp_only_layers=tuple(int(i) for i in d.get("mlp_only_layers") or ()) if qwen_moe else (),
        shared_expert_intermediate_size=shared,
        moe_weights_in_dtype=qwen_moe,
        swiglu_alpha=float(d.get("swiglu_alpha", 1.702)),
        swiglu_limit=float(d.get("swiglu_limit", 7.0)),
        hidden_act=act,
        dtype=dtype,
        bos_token_id=d.get("bos_token_id"),
        eos_token_ids=eos,
        quantization=quant,
    )


def _parse_deepseek(d, arch, mt, hidden, heads, layers, max_pos, act, dtype, eos) -> ModelConfig:
    """DeepseekV3Config's / DeepseekV2Config's fields (transformers 5.24 defaults for the
    missing ones)."""
    rank = int(d.get("kv_lora_rank", 512))
    rope_dim = int(d.get("qk_rope_head_dim", 64))
    if not (1 <= rank <= MLA_MAX_LATENT and rope_dim >= 2 and rope_dim % 2 == 0
            and rank + rope_dim <= MLA_MAX_D_QK):  # fmt: skip
        raise UnsupportedModelError(
            f"config.kv_lora_rank / qk_rope_head_dim: ({rank}, {rope_dim}) is not supported; "
            f"mla_decode takes a latent of at most {MLA_MAX_LATENT} and an even rope dim with "
            f"kv_lora_rank + qk_rope_head_dim <= {MLA_MAX_D_QK} (DeepSeek's: 512 + 64)"
        )
    v2 = mt == "deepseek_v2"
    # DeepseekV3Config has neither topk_method nor mlp_bias: DeepseekV3TopkRouter always routes
    # noaux_tc and DeepseekV3MLP has no biases, whatever a config.json says (V2 reads both).
    method = str(d.get("topk_method") or "greedy") if v2 else "noaux_tc"
    allowed = ("greedy", "group_limited_greedy") if v2 else ("noaux_tc",)
    if method not in allowed:
        raise UnsupportedModelError(
            f"config.topk_method: {method!r} is not supported for {mt!r} (supported: {allowed})"
        )
    if v2 and d.get("mlp_bias"):
        raise UnsupportedModelError("config.mlp_bias: MLP biases are not supported for DeepSeek-V2")
    q_lora = d.get("q_lora_rank", 1536)
    E = int(d.get("n_routed_experts", d.get("num_local_experts", 64 if v2 else 256)) or 0)
    n_group = int(d.get("n_group") or 1)
    topk_group = int(d.get("topk_group") or 1)
    k = int(d.get("num_experts_per_tok") or 8)
    if E:
        check(
            E % n_group == 0 and E // n_group >= 2,
            "config.n_group",
            f"a divisor of n_routed_experts={E} leaving >= 2 experts a group",
            n_group,
        )
        check(1 <= topk_group <= n_group, "config.topk_group", f"in [1, {n_group}]", topk_group)
        check(
            k <= topk_group * (E // n_group),
            "config.num_experts_per_tok",
            f"<= topk_group * experts per group = {topk_group * (E // n_group)}",
            k,
        )
    attn_bias = bool(d.get("attention_bias", False))
    return ModelConfig(
        architecture=arch,
        model_type=mt,
        vocab_size=int(_required(d, "vocab_size")),
        hidden_size=hidden,
        intermediate_size=int(d.get("intermediate_size") or 18432),
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=heads,  # MLA: every query head reads the one latent
        head_dim=rope_dim,  # DeepseekV3Config.head_dim: the rope dim (RotaryEmbedding's)
        rms_norm_eps=float(d.get("rms_norm_eps") or 1e-6),
        rope=_parse_rope(d, mt, max_pos),
        max_position_embeddings=max_pos,
        tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
        qkv_bias=attn_bias,  # q_a_proj and kv_a_proj_with_mqa
        o_bias=attn_bias,
        layer_types=("full_attention",) * layers,
        num_experts=E,
        num_experts_per_tok=k if E else 0,
        hidden_act=act,
        kv_lora_rank=rank,
        q_lora_rank=None if q_lora is None else int(q_lora),
        qk_nope_head_dim=int(d.get("qk_nope_head_dim", 128)),
        qk_rope_head_dim=rope_dim,
        v_head_dim=int(d.get("v_head_dim") or 128),
        # DeepseekV2Config has no rope_interleave: its RoPE always rotates pairs (2i, 2i + 1)
        # (apply_rotary_emb over complex pairs), whatever a config.json may say
        rope_interleave=True if v2 else bool(d.get("rope_interleave", True)),
        moe_intermediate_size=int(d.get("moe_intermediate_size") or 2048),
        n_shared_experts=int(d.get("n_shared_experts") or 0),
        n_group=n_group,
        topk_group=topk_group,
        routed_scaling_factor=float(d.get("routed_scaling_factor", 1.0 if v2 else 2.5)),
        norm_topk_prob=bool(d.get("norm_topk_prob", not v2)),
        first_k_dense_replace=int(d.get("first_k_dense_replace", 0 if v2 else 3) or 0),
        topk_method=method,
        dtype=dtype,
        bos_token_id=d.get("bos_token_id"),
        eos_token_ids=eos,
    )


def kv_cache_params(
    config: object,
    *,
    dtype: torch.dtype,
    page_size: int,
    devices: Sequence[str | torch.device] | str | torch.device = ("cpu",),
    quantization: KVQuantConfig | None = None,
    data_parallel_degree: int = 1,
    enable_prefix_caching: bool = True,
    enable_dispatch_metadata: bool = True,
    enable_speculative: bool = False,
) -> KVCacheParams:
    """`KVCacheParams` of a model's paged KV cache (every layer, K and V, all KV heads; MLA:
    one latent row of `kv_lora_rank + qk_rope_head_dim` (576) a token, `is_mla`, one head).

    config: a `ModelConfig` or anything `ModelConfig.from_hf` accepts. dtype: the model's
    compute dtype (the K/V the layers write); with `quantization` the storage is FP8.
    """
    cfg = ModelConfig.from_hf(config)
    common = dict(
        dtype=dtype,
        num_layers=cfg.num_layers,
        page_size=page_size,
        num_q_heads=cfg.num_heads,
        devices=devices,
        data_parallel_degree=data_parallel_degree,
        enable_prefix_caching=enable_prefix_caching,
        quantization=quantization,
        enable_dispatch_metadata=enable_dispatch_metadata,
        enable_speculative=enable_speculative,
    )
    if cfg.is_mla:  # one latent head a token: [c | k_pe]
        return KVCacheParams(
            **common,
            n_kv_heads=1,
            head_dim=cfg.mla_head_dim,
            is_mla=True,
            mla_rope_dim=cfg.qk_rope_head_dim,
        )
    return KVCacheParams(**common, n_kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim)


__all__ = [
    "SUPPORTED_ARCHITECTURES",
    "SUPPORTED_MODEL_TYPES",
    "SUPPORTED_ROPE_TYPES",
    "ModelConfig",
    "RopeConfig",
    "UnsupportedModelError",
    "kv_cache_params",
]
