"""The Llama family of decoders on the paged cache: Llama 3.x, Mistral, Qwen2, Qwen3 (and the
base that gpt-oss extends).

One class, `DecoderForCausalLM`, covers them; the config's flags select the differences, each as
transformers 5.24 implements it:
- Llama (LlamaForCausalLM): q/k/v/o bias from `attention_bias`, MLP bias from `mlp_bias`,
  RoPE default / linear / llama3 / yarn, optional tied embeddings.
- Mistral (MistralForCausalLM): no biases; every layer attends over a sliding window of
  `sliding_window` keys when it is set.
- Qwen2 (Qwen2ForCausalLM): q/k/v bias always (none on o); sliding layers per `layer_types`
  when `use_sliding_window`.
- Qwen3 (Qwen3ForCausalLM): RMSNorm of each head of q and k (`q_norm`/`k_norm`, over head_dim)
  before RoPE; biases from `attention_bias`.

The step contract (`DecoderForCausalLM.forward`, docs/models.md): one step of a ragged batch,
decodes and prefill chunks mixed, over each request's cached prefix.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from ..cache.inputs import KVCacheInputsPerDevice
from ..cache.params import KVCacheParams
from ..errors import InvalidArgumentError, check, check_int
from ..ops import masks
from ..ops.mha import StepPlan
from ..ops.store_kv import rope_store_kv
from . import parallel
from .config import ModelConfig
from .layers import (
    ColumnParallelLinear,
    Linear,
    RMSNorm,
    RotaryEmbedding,
    RowParallelLinear,
    StepContext,
    SwiGLUMLP,
    attend_cached,
)


class DecoderAttention(nn.Module):
    """Self-attention of one layer: fused qkv projection, (q/k RMSNorm), RoPE, paged attention
    (with the layer's mask and, for gpt-oss, its sinks), o projection."""

    tp_shard = {"sinks": 0}  # one sink per query head: this rank's heads' (models/parallel.py)

    def __init__(self, cfg: ModelConfig, layer_idx: int, dtype=None, tp_size: int = 1) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        # This rank's heads (models/parallel.py): h_kv / tp KV heads and their query groups.
        self.h_q, self.h_kv = cfg.num_heads // tp_size, cfg.num_kv_heads // tp_size
        self.d = cfg.head_dim
        self.q_size, self.kv_size = self.h_q * self.d, self.h_kv * self.d
        self.qkv_proj = ColumnParallelLinear(
            cfg.hidden_size, self.q_size + 2 * self.kv_size, cfg.qkv_bias, dtype
        )
        self.o_proj = RowParallelLinear(self.q_size, cfg.hidden_size, cfg.o_bias, dtype, tp_size)
        if cfg.qk_norm:  # Qwen3Attention: Qwen3RMSNorm over head_dim, before RoPE
            self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps, dtype)
            self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps, dtype)
        else:
            self.q_norm = self.k_norm = None
        # GptOssAttention.sinks: one logit per query head, joining the softmax denominator;
        # kept float32 (mha's sinks dtype; a bf16 checkpoint value converts exactly).
        self.sinks = (
            nn.Parameter(torch.empty(self.h_q, dtype=torch.float32), requires_grad=False)
            if cfg.attention_sinks
            else None
        )
        window = cfg.layer_window(layer_idx)
        # transformers' sliding_window_causal_mask_function: key j visible to the query at
        # position p iff p - W < j <= p, which is masks.sliding_window_causal(W) exactly.
        self.mask = masks.causal() if window is None else masks.sliding_window_causal(window)
        self.scale = cfg.head_dim**-0.5  # LlamaAttention.scaling

    def forward(self, x: torch.Tensor, ctx: StepContext) -> torch.Tensor:
        T = x.shape[0]
        qn, kn = self.q_norm, self.k_norm
        # RoPE of q and k, and the step's k / v into the cache (one launch on CUDA)
        q = rope_store_kv(
            self.qkv_proj(x), ctx.cos, ctx.sin, self.h_q, self.h_kv, ctx.kv_inputs,
            ctx.kv_params, self.layer_idx, ctx.q_row_offsets,
            q_norm=None if qn is None else qn.weight, k_norm=None if kn is None else kn.weight,
            eps=0.0 if qn is None else qn.eps,
        )  # fmt: skip
        o = attend_cached(q, self.layer_idx, ctx, mask=self.mask, scale=self.scale,
                          sinks=self.sinks)  # fmt: skip
        return self.o_proj(o.reshape(T, self.q_size))


class DecoderLayer(nn.Module):
    """Pre-norm block: x + attn(norm(x)), then + mlp(norm(.)). The residual rides alongside
    (`RMSNorm.forward(x, residual)`), the sums equal to transformers' `residual + hidden`."""

    def __init__(
        self, cfg: ModelConfig, layer_idx: int, mlp: nn.Module, dtype, norm_kw: dict, tp_size=1
    ):
        super().__init__()
        self.self_attn = DecoderAttention(cfg, layer_idx, dtype, tp_size)
        self.mlp = mlp
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, **norm_kw)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, **norm_kw)

    def forward(self, h: torch.Tensor, residual: torch.Tensor | None, ctx: StepContext):
        if residual is None:
            residual, x = h, self.input_layernorm(h)
        else:
            x, residual = self.input_layernorm(h, residual)
        x = self.self_attn(x, ctx)
        x, residual = self.post_attention_layernorm(x, residual)
        return self.mlp(x), residual


class DecoderModel(nn.Module):
    """Embedding, layers and final norm (the checkpoint's `model.` prefix)."""

    def __init__(self, cfg: ModelConfig, make_layer, dtype, norm_kw: dict) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size, dtype=dtype)
        self.embed_tokens.weight.requires_grad_(False)
        self.layers = nn.ModuleList(make_layer(i) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, **norm_kw)


class DecoderForCausalLM(nn.Module):
    """A decoder-only LM on pagedattn's paged KV cache (Llama, Mistral, Qwen2, Qwen3).

    Build through `models.load_model(path, ...)` (weights from a checkpoint), or directly
    (uninitialised parameters; `models.loader.load_weights` fills them).
    kv_params: the `KVCacheParams` of the cache the model writes (`config.kv_cache_params`);
    settable later with `attach_kv_cache`.

    Parameter names follow the checkpoint's, except the fused projections
    (`packed_modules`: `qkv_proj` <- q_proj, k_proj, v_proj; `gate_up_proj` <- gate_proj,
    up_proj), which the loader concatenates.

    tp_size / tp_rank: tensor parallelism (models/parallel.py): this rank's shard of the heads
    and of the MLP, an all-reduce after o_proj and down_proj; tp_rank defaults to the rank in
    torch.distributed's default group (which must be initialized with world size tp_size).
    The attached cache then holds this rank's KV heads (`tp_kv_cache_params`).
    """

    packed_modules: dict[str, tuple[str, ...]] = {
        "qkv_proj": ("q_proj", "k_proj", "v_proj"),
        "gate_up_proj": ("gate_proj", "up_proj"),
    }
    # RMSNorm style (see layers.RMSNorm) and whether norm weights stay float32 on load.
    norm_weight_first = False
    # The step makes no host sync and no data-dependent allocation: the engine may capture it
    # in a CUDA graph (engine/cuda_graphs.py).
    supports_cuda_graphs = True
    # The prefill chunks' lengths of the engine's start-up steps (`GraphRunner.warm_up_eager`):
    # 2 tokens make every kernel variant a chunk of any length takes.
    warm_up_chunk_lengths: tuple[int, ...] = (2,)

    @property
    def supports_piecewise_graphs(self) -> bool:
        """Whether the engine may capture steps with prefill chunks in pieces around each
        layer's attention (engine/mixed_graphs.py, `forward(attention_hook=...)`): the
        attention goes through `layers.attend_cached`, and what the step runs without a host
        sync at a decode step's token counts (`supports_cuda_graphs`: the MLP, or the experts
        through `ops.moe` / grouped matmuls) runs without one at any token count."""
        return self.supports_cuda_graphs is True

    def __init__(
        self,
        config: ModelConfig,
        *,
        dtype: torch.dtype | None = None,
        kv_params: KVCacheParams | None = None,
        tp_size: int = 1,
        tp_rank: int | None = None,
    ) -> None:
        super().__init__()
        self.config = cfg = ModelConfig.from_hf(config)
        self.tp_size = check_int("tp_size", tp_size, 1)
        if tp_size > 1:
            parallel.check_divisible(cfg, tp_size)
        self.tp_rank = parallel.check_tp(tp_size, tp_rank)
        self.dtype = dtype or torch.get_default_dtype()
        norm_kw = dict(
            dtype=torch.float32 if self.norm_weight_first else dtype,
            weight_first=self.norm_weight_first,
        )
        self.model = DecoderModel(
            cfg, lambda i: self.make_layer(cfg, i, dtype, norm_kw), dtype, norm_kw
        )
        self.lm_head = (
            None
            if cfg.tie_word_embeddings
            else Linear(cfg.hidden_size, cfg.vocab_size, False, dtype)
        )
        self.rotary_emb = RotaryEmbedding(cfg.rope, cfg.head_dim)
        self.kv_params: KVCacheParams | None = None
        if kv_params is not None:
            self.attach_kv_cache(kv_params)

    def make_layer(self, cfg: ModelConfig, layer_idx: int, dtype, norm_kw: dict) -> nn.Module:
        """Decoder layer `layer_idx` (a subclass's own layer type overrides this)."""
        return DecoderLayer(
            cfg, layer_idx, self.make_mlp(cfg, layer_idx, dtype), dtype, norm_kw, self.tp_size
        )

    def make_mlp(self, cfg: ModelConfig, layer_idx: int, dtype) -> nn.Module:
        return SwiGLUMLP(cfg.hidden_size, cfg.intermediate_size, cfg.mlp_bias, dtype, self.tp_size)

    # Cache ---------------------------------------------------------------------------------
    def attach_kv_cache(self, params: KVCacheParams) -> None:
        """Bind the `KVCacheParams` of the cache the forward writes (checked against the
        config: layers, KV heads, head dim, query heads, not MLA, dtype = the model's; with
        tensor parallelism the heads are this rank's, `tp_kv_cache_params`)."""
        cfg, tp = self.config, self.tp_size
        check(isinstance(params, KVCacheParams), "kv_params", "a KVCacheParams", type(params))
        want = (
            cfg.num_layers,
            cfg.num_kv_heads // tp,
            cfg.head_dim,
            cfg.num_heads // tp,
            False,
            self.dtype,
        )
        got = (
            params.num_layers,
            params.n_kv_heads,
            params.head_dim,
            params.num_q_heads,
            params.is_mla,
            params.dtype,
        )
        check(
            want == got,
            "kv_params",
            "(num_layers, n_kv_heads, head_dim, num_q_heads, is_mla, dtype) = "
            f"{want} (models.kv_cache_params(config, dtype=model.dtype, ...)"
            + (", sharded: models.parallel.tp_kv_cache_params" if tp > 1 else "")
            + ")",
            got,
        )
        self.kv_params = params

    # Step ----------------------------------------------------------------------------------
    @property
    def lm_head_weight(self) -> torch.Tensor:
        return self.model.embed_tokens.weight if self.lm_head is None else self.lm_head.weight

    def _check_step(self, input_ids, positions, kv_inputs, q_row_offsets, logits_rows) -> None:
        if self.kv_params is None:
            raise InvalidArgumentError(
                "kv_params: no KV cache attached; call model.attach_kv_cache(params) first"
            )

        def is_vec(t, dt):
            return isinstance(t, torch.Tensor) and t.ndim == 1 and t.dtype == dt

        check(is_vec(input_ids, torch.int64), "input_ids", "a [T] int64 tensor", _desc(input_ids))
        T = input_ids.shape[0]
        check(
            is_vec(positions, torch.int64) and positions.shape[0] == T,
            "positions",
            f"a [{T}] int64 tensor (absolute position of each input token)",
            _desc(positions),
        )
        check(
            isinstance(kv_inputs, KVCacheInputsPerDevice),
            "kv_inputs",
            "a KVCacheInputsPerDevice",
            type(kv_inputs).__name__,
        )
        b = kv_inputs.cache_lengths.shape[0]
        check(
            is_vec(q_row_offsets, torch.int32) and q_row_offsets.shape[0] == b + 1,
            "q_row_offsets",
            f"a [{b + 1}] int32 tensor (batch + 1 prefix sums of tokens per request)",
            _desc(q_row_offsets),
        )
        check(
            is_vec(logits_rows, torch.int64),
            "logits_rows",
            "a [n] int64 tensor of rows to compute logits for",
            _desc(logits_rows),
        )
        dev = self.model.embed_tokens.weight.device
        for name, t in (
            ("input_ids", input_ids),
            ("positions", positions),
            ("q_row_offsets", q_row_offsets),
            ("logits_rows", logits_rows),
        ):
            check(t.device == dev, f"{name}.device", str(dev), t.device)

    def step_context(self, kv_inputs, q_row_offsets, cos, sin, num_decodes, attention_plan=None,
                     attend=None):  # fmt: skip
        """What every layer of the step reads (`layers.StepContext`; a subclass with its own
        attention builds its own); attend: `forward`'s attention_hook."""
        return StepContext(kv_inputs, self.kv_params, q_row_offsets, cos, sin, num_decodes,
                           attention_plan, attend)  # fmt: skip

    def piece_context(self, kv_inputs, q_row_offsets, num_decodes, attention_plan):
        """The context of `attend_piece` for one step (the engine's piecewise graphs: each
        layer's attention run eagerly between the captured pieces, as the eager step runs it)."""
        return StepContext(kv_inputs, self.kv_params, q_row_offsets, None, None, num_decodes,
                           attention_plan)  # fmt: skip

    def serves_in_pieces(self, q_row_offsets) -> bool:
        """Whether a step of these host query offsets ([b + 1] ints) replays the engine's
        pieces: every step (a model whose eager attention takes another path for some steps
        says which)."""
        return True

    def attend_piece(self, q, layer_idx, ctx, *, out, **call):
        """Layer `layer_idx`'s attention of the step's q (what its hook received, with the
        hook's keyword arguments `call`) into `out`, on `piece_context`'s ctx."""
        return attend_cached(q, layer_idx, ctx, out=out, **call)

    @torch.inference_mode()
    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_inputs: KVCacheInputsPerDevice,
        q_row_offsets: torch.Tensor,
        logits_rows: torch.Tensor,
        num_decodes: int | None = None,
        attention_plan: StepPlan | None = None,
        logits_out: torch.Tensor | None = None,
        attention_hook: Callable[..., torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """One step of a ragged batch (docs/models.md).

        input_ids [T] int64: the step's tokens, request after request (a decode's 1 token or a
          prefill chunk's tokens), in the order of kv_inputs' batch.
        positions [T] int64: each token's absolute position, `cache_length(b) + i` (RoPE; mha
          places query i of request b there too).
        kv_inputs: this device's `KVCacheInputsPerDevice` for the batch (runtime_inputs), with
          pages allocated for the step's tokens; the step's K/V are written at
          `cache_length(b) + i` of every layer.
        q_row_offsets [b + 1] int32: prefix sums of tokens per request.
        logits_rows [n] int64: rows of the step (indices into T) whose logits to compute,
          usually each request's last token when its prompt is complete.
        num_decodes: how many requests lead the batch with one token each (a mixed step's
          decodes first, `StepInputs.num_decodes`): `mha`'s hint, None where not known.
        attention_plan: the step's `StepPlan` (made from its host cache lengths), which every
          layer's `mha` reads; None: the decode kernels derive their work lists.
        logits_out: None, or a float32 [n, vocab] tensor on the model's device that receives
          the logits (the lm_head's output converted in one copy: a decode graph's static
          output, without the float32 temporary and a second copy); it is returned.
        attention_hook: None, or what each layer calls instead of its paged attention, once its
          step's K/V are in the cache (`layers.StepContext.attend`: `hook(q, layer_idx,
          **call)` returns the attention's output, [T, h_q, d] with `call` mask=, scale=,
          sinks=; a model with its own attention passes its own `call`, which its
          `attend_piece` takes; the engine's piecewise graphs of mixed steps,
          engine/mixed_graphs.py).
        Returns logits [n, vocab] float32.
        """
        self._check_step(input_ids, positions, kv_inputs, q_row_offsets, logits_rows)
        if logits_out is not None:
            n, V = logits_rows.shape[0], self.config.vocab_size
            check(
                isinstance(logits_out, torch.Tensor) and logits_out.shape == (n, V)
                and logits_out.dtype == torch.float32 and logits_out.device == input_ids.device,
                "logits_out", f"None or a float32 [{n}, {V}] tensor on {input_ids.device}",
                _desc(logits_out),
            )  # fmt: skip
        if attention_hook is not None:
            check(
                self.supports_piecewise_graphs is True,
                "attention_hook",
                f"None for {type(self).__name__} (its steps are not captured in pieces)",
                "a hook",
            )
        cos, sin = self.rotary_emb(positions, self.dtype)
        ctx = self.step_context(kv_inputs, q_row_offsets, cos, sin, num_decodes, attention_plan,
                                attend=attention_hook)  # fmt: skip
        h = self.model.embed_tokens(input_ids)
        residual = None
        for layer in self.model.layers:
            h, residual = layer(h, residual, ctx)
        h = h[logits_rows] + residual[logits_rows]  # the final norm only on the rows needed
        h = self.model.norm(h)
        logits = torch.nn.functional.linear(h, self.lm_head_weight)
        return logits.float() if logits_out is None else logits_out.copy_(logits)


def _desc(t: object) -> str:
    if isinstance(t, torch.Tensor):
        return f"tensor {tuple(t.shape)} {t.dtype}"
    return type(t).__name__


class LlamaForCausalLM(DecoderForCausalLM):
    """Llama 2/3.x (transformers' LlamaForCausalLM)."""


class MistralForCausalLM(DecoderForCausalLM):
    """Mistral (transformers' MistralForCausalLM): sliding window on every layer."""


class Qwen2ForCausalLM(DecoderForCausalLM):
    """Qwen2 / Qwen2.5 (transformers' Qwen2ForCausalLM): q/k/v bias."""


class Qwen3ForCausalLM(DecoderForCausalLM):
    """Qwen3 dense (transformers' Qwen3ForCausalLM): per-head q/k RMSNorm."""


__all__ = [
    "DecoderAttention",
    "DecoderForCausalLM",
    "DecoderLayer",
    "DecoderModel",
    "LlamaForCausalLM",
    "MistralForCausalLM",
    "Qwen2ForCausalLM",
    "Qwen3ForCausalLM",
]
