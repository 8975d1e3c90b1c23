"""Building blocks of the decoder models, in plain torch (any device), plus the paged attention
call every model makes.

- `Linear` (and its tensor-parallel shards `ColumnParallelLinear` / `RowParallelLinear`, see
  `models.parallel`), `RMSNorm`, `RotaryEmbedding` / `apply_rope`, `SwiGLUMLP`, `GptOssMoE`:
  the math of transformers 5.24's modules (each cites the class it follows), with fused
  projections (q|k|v, gate|up) whose weights the loader concatenates from the checkpoint's
  separate tensors.
- `rope_inv_freq`: RoPE inverse frequencies and the cos/sin scale for the rope types of
  `config.SUPPORTED_ROPE_TYPES`, computed as transformers' rope init functions do (float32).
- `StepContext` + `attend_cached`: one layer's attention over the paged cache, once the
  step's new K/V are at `cache_length(b) + i` (the decoders write them with their RoPE in one
  op, `ops.store_kv.rope_store_kv`): `mha` of the ragged queries over `cache_length(b) +
  q_len(b)` keys through `PagedOperand`s.

Parameters are created uninitialised (`torch.empty`, usually on the meta device) and filled by
`models.loader`. Nothing here syncs with the host except `GptOssExperts.forward_loop` (it
reads each expert's token count), which runs only where `grouped_experts_ok` is false. On
CUDA the routed experts run through `ops.moe` (`fused_experts_ok`, `fused_experts`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..cache.inputs import KVCacheInputsPerDevice
from ..cache.params import KVCacheParams
from ..errors import InvalidArgumentError, check
from ..operands import PagedOperand
from ..ops.fused import apply_rope_reference, rms_norm, silu_mul
from ..ops.fused.reference import rms_norm_reference
from ..ops.linear import fp8_bmm
from ..ops.masks import Mask
from ..ops.mha import StepPlan, mha
from ..ops.moe import expert_matmul, moe_block_m, moe_plan, moe_sum
from . import parallel
from .config import ModelConfig, RopeConfig


def _param(*shape: int, dtype: torch.dtype | None) -> nn.Parameter:
    return nn.Parameter(torch.empty(*shape, dtype=dtype), requires_grad=False)


class Linear(nn.Module):
    """y = x @ weight.T (+ bias); weight [out, in] as nn.Linear (and HF checkpoints) store it."""

    def __init__(self, in_features: int, out_features: int, bias: bool, dtype=None) -> None:
        super().__init__()
        self.weight = _param(out_features, in_features, dtype=dtype)
        self.bias = _param(out_features, dtype=dtype) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


class Fp8BlockLinear(nn.Module):
    """y = x @ dequant(weight).T of an FP8 block-quantized weight, through `fp8_bmm` (x is
    quantized on the fly in 1 x k groups; the weight stays e4m3 in memory).

    weight [out, in] float8_e4m3fn and weight_scale_inv [cdiv(out, n), cdiv(in, k)] float32,
    as DeepSeek's FP8 checkpoints store them (`weight_block_size` [n, k]): element (i, j) is
    weight[i, j] * weight_scale_inv[i // n, j // k]. No bias."""

    def __init__(self, in_features: int, out_features: int, block: tuple[int, int]) -> None:
        super().__init__()
        self.block = n, k = block
        self.weight = _param(out_features, in_features, dtype=torch.float8_e4m3fn)
        self.weight_scale_inv = _param(
            -(-out_features // n), -(-in_features // k), dtype=torch.float32
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, k = self.block
        x2 = x.reshape(1, -1, x.shape[-1])
        y = fp8_bmm(x2, self.weight[None], self.weight_scale_inv[None], k_gran=k, n_gran=n,
                    out_dtype=x.dtype)  # fmt: skip
        return y.reshape(*x.shape[:-1], self.weight.shape[0])

    def dequantized(self, dtype: torch.dtype) -> torch.Tensor:
        """The weight [out, in] in `dtype` (for the absorbed MLA products)."""
        n, k = self.block
        s = self.weight_scale_inv.repeat_interleave(n, 0).repeat_interleave(k, 1)
        w = self.weight.float() * s[: self.weight.shape[0], : self.weight.shape[1]]
        return w.to(dtype)


def make_linear(in_features: int, out_features: int, bias: bool, dtype=None,
                fp8_block: tuple[int, int] | None = None) -> nn.Module:  # fmt: skip
    """`Linear`, or `Fp8BlockLinear` where the checkpoint's weights are FP8 blocks (no bias)."""
    if fp8_block is None:
        return Linear(in_features, out_features, bias, dtype)
    if bias:
        raise InvalidArgumentError("an FP8 block-quantized linear has no bias")
    return Fp8BlockLinear(in_features, out_features, fp8_block)


class ColumnParallelLinear(Linear):
    """A Linear whose out features are this rank's shard; the loader slices each checkpoint
    tensor (weight and bias) along dim 0 (`tp_shard`)."""

    tp_shard = {"weight": 0, "bias": 0}


class RowParallelLinear(Linear):
    """A Linear whose in features are this rank's shard: `all_reduce(x @ W_r.T) + bias` (the
    bias once, after the sum); the loader slices the weight along dim 1, the bias stays whole."""

    tp_shard = {"weight": 1}

    def __init__(self, in_features, out_features, bias, dtype=None, tp_size: int = 1) -> None:
        super().__init__(in_features, out_features, bias, dtype)
        self.tp_size = tp_size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.tp_size == 1:
            return F.linear(x, self.weight, self.bias)
        y = parallel.all_reduce(F.linear(x, self.weight), self.tp_size)
        return y if self.bias is None else y + self.bias


class RMSNorm(nn.Module):
    """RMSNorm over the last dim, statistics in float32.

    weight_first=False (LlamaRMSNorm, Qwen2/Qwen3RMSNorm): `weight * x_normed.to(x.dtype)`.
    weight_first=True (GptOssRMSNorm, whose weight transformers keeps in float32):
    `(weight * x_normed).to(x.dtype)`.
    `forward(x, residual)` adds the residual first (in x's dtype, as the decoder layers' `residual
    + hidden_states`) and returns (normed, new residual).
    """

    def __init__(self, dim: int, eps: float, dtype=None, weight_first: bool = False) -> None:
        super().__init__()
        self.weight = _param(dim, dtype=dtype)
        self.eps = float(eps)
        self.weight_first = weight_first

    def norm(self, x: torch.Tensor) -> torch.Tensor:
        return self(x)

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        if x.ndim != 2:  # per-head norms (Qwen3's q/k outside `rope_qkv`): the torch ops
            return rms_norm_reference(x, self.weight, self.eps, residual, self.weight_first)
        return rms_norm(x, self.weight, self.eps, residual, weight_first=self.weight_first)


# RoPE ---------------------------------------------------------------------------------------
def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def rope_inv_freq(rope: RopeConfig, head_dim: int) -> tuple[torch.Tensor, float]:
    """(inv_freq [head_dim // 2] float32 on the CPU, attention_scaling) for a RoPE config.

    The same float32 arithmetic as transformers 5.24's `compute_default_rope_parameters` and
    `modeling_rope_utils._compute_{linear_scaling,llama3,yarn}_parameters` (bit-identical)."""
    dim, base = head_dim, rope.theta
    exponents = torch.arange(0, dim, 2, dtype=torch.int64).to(dtype=torch.float) / dim
    inv_freq = 1.0 / (base**exponents)
    t = rope.rope_type
    if t == "default":
        return inv_freq, 1.0
    if t == "linear":
        return inv_freq / rope.factor, 1.0
    if t == "llama3":
        factor, old_ctx = rope.factor, rope.original_max_position_embeddings
        low_wl = old_ctx / rope.low_freq_factor
        high_wl = old_ctx / rope.high_freq_factor
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > low_wl, inv_freq / factor, inv_freq)
        smooth = (old_ctx / wavelen - rope.low_freq_factor) / (
            rope.high_freq_factor - rope.low_freq_factor
        )
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < high_wl) * ~(wavelen > low_wl)
        return torch.where(medium, smoothed, scaled), 1.0
    if t == "yarn":
        orig = rope.original_max_position_embeddings
        factor = rope.factor
        if factor is None:
            factor = rope.max_position_embeddings / orig
        att = rope.attention_factor
        if att is None:
            if rope.mscale and rope.mscale_all_dim:
                att = _yarn_mscale(factor, rope.mscale) / _yarn_mscale(factor, rope.mscale_all_dim)
            else:
                att = _yarn_mscale(factor)
        beta_fast = rope.beta_fast or 32
        beta_slow = rope.beta_slow or 1

        def correction_dim(rotations: float) -> float:
            return (dim * math.log(orig / (rotations * 2 * math.pi))) / (2 * math.log(base))

        low, high = correction_dim(beta_fast), correction_dim(beta_slow)
        if rope.truncate:
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, dim - 1)
        if low == high:
            high += 0.001  # as transformers: no singular ramp
        ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
        pos_freqs = base ** (torch.arange(0, dim, 2).to(dtype=torch.float) / dim)
        extrapolation = 1.0 / pos_freqs
        interpolation = 1.0 / (factor * pos_freqs)
        extra_factor = 1 - ramp
        inv = interpolation * (1 - extra_factor) + extrapolation * extra_factor
        return inv, float(att)
    raise AssertionError(f"rope type {t!r} passed config validation")  # pragma: no cover


class RotaryEmbedding(nn.Module):
    """cos/sin of absolute positions: `forward(positions [T] int64, dtype) -> (cos, sin)`, each
    [T, head_dim // 2] in `dtype`: float32 `positions * inv_freq`, cos/sin, times the rope's
    attention scaling, cast (LlamaRotaryEmbedding.forward / GptOssRotaryEmbedding.forward)."""

    def __init__(self, rope: RopeConfig, head_dim: int) -> None:
        super().__init__()
        self.rope, self.head_dim = rope, head_dim
        inv_freq, self.attention_scaling = rope_inv_freq(rope, head_dim)
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def reset_buffers(self, device: torch.device | str) -> None:
        """Recompute inv_freq on `device` (after the model left the meta device)."""
        self.inv_freq = rope_inv_freq(self.rope, self.head_dim)[0].to(device)

    def forward(self, positions: torch.Tensor, dtype: torch.dtype):
        freqs = positions[:, None].float() * self.inv_freq[None, :]
        cos = freqs.cos() * self.attention_scaling
        sin = freqs.sin() * self.attention_scaling
        return cos.to(dtype), sin.to(dtype)


#: Neox-style (rotate-half) RoPE: x [T, heads, d], cos/sin [T, d // 2]; the pairs are (i, i + d/2),
#: as HF Llama's `rotate_half` and gpt-oss's `_apply_rotary_emb` (`ops.fused`' reference).
apply_rope = apply_rope_reference


# MLPs ---------------------------------------------------------------------------------------
class SwiGLUMLP(nn.Module):
    """down(silu(gate(x)) * up(x)) (LlamaMLP, MistralMLP, Qwen2MLP, Qwen3MLP); gate and up are one
    fused projection `gate_up_proj` [2 * inter, hidden] (the checkpoint's gate_proj; up_proj)."""

    def __init__(self, hidden: int, inter: int, bias: bool, dtype=None, tp_size: int = 1,
                 fp8_block: tuple[int, int] | None = None) -> None:  # fmt: skip
        super().__init__()
        self.inter = inter = inter // tp_size  # this rank's shard (models/parallel.py)
        if fp8_block is not None:  # FP8 blocks (DeepSeek): gate's and up's scales concatenated
            check(
                inter % fp8_block[0] == 0 and tp_size == 1,
                "intermediate size",
                f"a multiple of the FP8 weight block {fp8_block[0]} (one rank)",
                (inter, tp_size),
            )
            self.gate_up_proj = Fp8BlockLinear(hidden, 2 * inter, fp8_block)
            self.down_proj = Fp8BlockLinear(inter, hidden, fp8_block)
            return
        self.gate_up_proj = ColumnParallelLinear(hidden, 2 * inter, bias, dtype)
        self.down_proj = RowParallelLinear(inter, hidden, bias, dtype, tp_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(silu_mul(self.gate_up_proj(x)))


class GptOssRouter(nn.Module):
    """GptOssTopKRouter: logits = x @ W.T + b; top-k of the logits; softmax over the k values
    (in the logits' dtype). Returns (scores [T, k], expert ids [T, k])."""

    def __init__(self, hidden: int, num_experts: int, top_k: int, dtype=None) -> None:
        super().__init__()
        self.top_k = top_k
        self.weight = _param(num_experts, hidden, dtype=dtype)
        self.bias = _param(num_experts, dtype=dtype)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = F.linear(x, self.weight, self.bias)
        top_v, top_i = torch.topk(logits, self.top_k, dim=-1)
        return torch.softmax(top_v, dim=1, dtype=top_v.dtype), top_i


def grouped_experts_ok(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether `torch._grouped_mm` runs the experts without a host sync: on the CPU (any
    dtype), and on CUDA in bf16 (its CUTLASS path; other CUDA dtypes fall back to a loop
    that reads the group sizes on the host)."""
    if not hasattr(torch, "_grouped_mm"):
        return False
    return torch.device(device).type == "cpu" or (
        torch.device(device).type == "cuda" and dtype == torch.bfloat16
    )


def fused_experts_ok(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether the routed experts run through `ops.moe`'s kernels (`fused_experts`): on CUDA
    in bf16 / fp16. Elsewhere the models keep transformers' op order (the CPU equals it bit
    for bit)."""
    return torch.device(device).type == "cuda" and dtype in (torch.bfloat16, torch.float16)


def fused_experts(
    x, experts, gate_up, down, *, weights=None, gate=None, gate_up_bias=None, down_bias=None,
    gate_up_scale=None, down_scale=None, w_block=(128, 128),
):  # fmt: skip
    """A top-k MoE's routed experts through `ops.moe`: x [T, H], experts [T, k] -> [T, H] in
    x's dtype. gate_up [E, 2I, H] and down [E, H, I] (any strides: an [E, in, out] layout passes
    its transpose), optionally FP8 with their block scales (`w_block`); biases [E, 2I] / [E, H];
    weights [T, k] (the routing weights, applied to each expert's output). `gate`: the
    activation of the gate|up product (a callable [rows, 2I] -> [rows, I]); None is
    silu(gate) * up, fused into the gate_up product's epilogue."""
    E, k = gate_up.shape[0], experts.shape[1]
    plan = moe_plan(experts, E, block_m=moe_block_m(experts.numel(), E))
    kw = dict(w_block=w_block)
    if gate is None:  # silu(gate) * up in the gate_up product's epilogue
        h = expert_matmul(x, gate_up, plan, w_scale=gate_up_scale, bias=gate_up_bias,
                          activation="silu_mul", **kw)  # fmt: skip
    else:
        h = gate(expert_matmul(x, gate_up, plan, w_scale=gate_up_scale, bias=gate_up_bias, **kw))
    y = expert_matmul(h, down, plan, w_scale=down_scale, bias=down_bias,
                      row_weights=None if weights is None else weights.float(),
                      out_dtype=torch.float32, **kw)  # fmt: skip
    return moe_sum(y, k, out_dtype=x.dtype)


def sort_by_expert(
    experts: torch.Tensor, num_experts: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The grouped-matmul layout of a top-k routing, on the device (no host sync): experts
    [T, k] -> (order [T * k]: the (token, slot) rows `t * k + s` sorted by expert, stable;
    their experts [T * k]; offs [num_experts] int32: each expert's group end in that order,
    `torch._grouped_mm`'s offsets)."""
    flat = experts.flatten()
    order = torch.argsort(flat, stable=True)
    e_sorted = flat[order]
    ends = torch.arange(1, num_experts + 1, device=flat.device, dtype=e_sorted.dtype)
    return order, e_sorted, torch.searchsorted(e_sorted, ends).to(torch.int32)


def sum_in_expert_order(
    y: torch.Tensor, order: torch.Tensor, experts: torch.Tensor, dtype: torch.dtype
) -> torch.Tensor:
    """[T, H]: each token's k expert outputs summed in increasing expert id, in `dtype` (the
    rounding of a per-expert loop's `index_add_`). y [T * k, H]: the weighted outputs of the
    rows in `order` (`sort_by_expert`); experts [T, k]."""
    T, k = experts.shape
    rows = torch.empty(y.shape, dtype=dtype, device=y.device)
    rows[order] = y.to(dtype)  # back to (token, slot) rows
    rows = rows.view(T, k, -1)
    by_expert = torch.argsort(experts, dim=1, stable=True)  # each token's slots, expert order
    tokens = torch.arange(T, device=y.device)
    out = torch.zeros(T, y.shape[-1], dtype=dtype, device=y.device)
    for j in range(k):
        out = out + rows[tokens, by_expert[:, j]]
    return out


def expert_groups(experts: torch.Tensor, num_experts: int):
    """The tokens of each expert a top-k routing chose: yields (expert e, token rows t, top-k
    slots s) for every expert with a token, experts [T, k] int64 (eager: reads the per-expert
    counts on the host)."""
    k = experts.shape[1]
    flat = experts.flatten()
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=num_experts).tolist()  # host sync
    tokens, slots = order // k, order % k
    start = 0
    for e, n in enumerate(counts):
        if n:
            yield e, tokens[start : start + n], slots[start : start + n]
            start += n


class GptOssExperts(nn.Module):
    """GptOssExperts: per expert e, gate_up = x @ gate_up_proj[e] + gate_up_proj_bias[e] with
    gate/up interleaved (columns ::2 / 1::2), the clamped SwiGLU `_apply_gate` (gate clamped
    above at `limit`, up to [-limit, limit], (up + 1) * gate * sigmoid(alpha * gate)), then
    @ down_proj[e] + down_proj_bias[e], weighted by the routing score and summed over the
    token's experts (in expert order, as transformers' index_add_ loop).

    Weights keep the checkpoint's layout: gate_up_proj [E, hidden, 2 * inter], down_proj
    [E, inter, hidden].

    Tensor parallelism (tp_size > 1, models/parallel.py): every rank holds every expert and
    its slice [r * inter / N, (r + 1) * inter / N) of the intermediate features (gate_up_proj's
    columns, an even count, so the gate/up pairs stay whole; down_proj's rows); the output is
    this rank's partial sum, rank 0's with down_proj_bias (the caller all-reduces)."""

    # The loader's slices of the checkpoint tensors (models/loader.weight_sources).
    tp_shard = {"gate_up_proj": 2, "gate_up_proj_bias": 1, "down_proj": 1}

    def __init__(self, cfg: ModelConfig, dtype=None, tp_size: int = 1, tp_rank: int = 0) -> None:
        super().__init__()
        E, H = cfg.num_experts, cfg.hidden_size
        inter = cfg.intermediate_size // tp_size
        self.num_experts = E
        self.with_bias = tp_rank == 0  # down_proj_bias once, before the all-reduce
        self.alpha, self.limit = cfg.swiglu_alpha, cfg.swiglu_limit
        self.gate_up_proj = _param(E, H, 2 * inter, dtype=dtype)
        self.gate_up_proj_bias = _param(E, 2 * inter, dtype=dtype)
        self.down_proj = _param(E, inter, H, dtype=dtype)
        self.down_proj_bias = _param(E, H, dtype=dtype)

    def _gate(self, gate_up: torch.Tensor) -> torch.Tensor:
        gate = gate_up[..., ::2].clamp(max=self.limit)
        up = gate_up[..., 1::2].clamp(min=-self.limit, max=self.limit)
        return (up + 1) * (gate * torch.sigmoid(gate * self.alpha))

    def forward(self, x: torch.Tensor, scores: torch.Tensor, experts: torch.Tensor):
        """x [T, hidden], scores / experts [T, k] (the router's). `forward_fused` where
        `fused_experts_ok`, else `forward_grouped` where `grouped_experts_ok` (both without a
        host sync: CUDA-graph safe), else `forward_loop`."""
        if fused_experts_ok(x.device, x.dtype):
            return self.forward_fused(x, scores, experts)
        if grouped_experts_ok(x.device, x.dtype):
            return self.forward_grouped(x, scores, experts)
        return self.forward_loop(x, scores, experts)

    def forward_loop(self, x: torch.Tensor, scores: torch.Tensor, experts: torch.Tensor):
        """One matmul pair per expert with tokens (reads each expert's count on the host)."""
        out = torch.zeros_like(x)
        for e, t, s in expert_groups(experts, self.num_experts):
            h = x[t] @ self.gate_up_proj[e] + self.gate_up_proj_bias[e]
            h = self._gate(h) @ self.down_proj[e]
            if self.with_bias:
                h = h + self.down_proj_bias[e]
            out.index_add_(0, t, (h * scores[t, s, None]).to(x.dtype))
        return out

    def forward_fused(self, x: torch.Tensor, scores: torch.Tensor, experts: torch.Tensor):
        """The same math through `ops.moe` (`fused_experts`): biases, the routing score and the
        token's sum in float32, one rounding each product and at the end."""
        return fused_experts(
            x, experts, self.gate_up_proj.transpose(1, 2), self.down_proj.transpose(1, 2),
            weights=scores, gate=self._gate, gate_up_bias=self.gate_up_proj_bias,
            down_bias=self.down_proj_bias if self.with_bias else None,
        )  # fmt: skip

    def forward_grouped(self, x: torch.Tensor, scores: torch.Tensor, experts: torch.Tensor):
        """The same math with two grouped matmuls (`sort_by_expert`, `torch._grouped_mm`): no
        host sync, no data-dependent shape; each token's k outputs summed in expert order in
        x's dtype (`sum_in_expert_order`), as `forward_loop`'s index_add_ does."""
        order, e_sorted, offs = sort_by_expert(experts, self.num_experts)
        k = experts.shape[1]
        h = torch._grouped_mm(x[order // k], self.gate_up_proj, offs=offs)
        h = torch._grouped_mm(self._gate(h + self.gate_up_proj_bias[e_sorted]), self.down_proj,
                              offs=offs)  # fmt: skip
        if self.with_bias:
            h = h + self.down_proj_bias[e_sorted]
        return sum_in_expert_order(h * scores.flatten()[order, None], order, experts, x.dtype)


class GptOssMoE(nn.Module):
    """GptOssMLP: router then experts. With tp_size > 1 the router is replicated (every rank
    routes the same), the experts sharded (`GptOssExperts`), their partial sums all-reduced."""

    def __init__(self, cfg: ModelConfig, dtype=None, tp_size: int = 1, tp_rank: int = 0) -> None:
        super().__init__()
        self.tp_size = tp_size
        self.router = GptOssRouter(cfg.hidden_size, cfg.num_experts, cfg.num_experts_per_tok, dtype)
        self.experts = GptOssExperts(cfg, dtype, tp_size, tp_rank)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scores, experts = self.router(x)
        return parallel.all_reduce(self.experts(x, scores, experts), self.tp_size)


# Attention over the paged cache ---------------------------------------------------------------
@dataclass
class StepContext:
    """What every layer of one step reads: the device's cache inputs, the cache's params, the
    [b + 1] int32 query offsets, the step's RoPE cos/sin ([T, head_dim // 2]), how many
    requests lead it with one token each (None: not known) and the step's decode work plans
    (a `StepPlan` of the step's host lengths, or None: the kernels derive their lists)."""

    kv_inputs: KVCacheInputsPerDevice
    kv_params: KVCacheParams
    q_row_offsets: torch.Tensor
    cos: torch.Tensor
    sin: torch.Tensor
    num_decodes: int | None = None  # the step's leading one-token requests (`mha`'s hint)
    # the step's decode work plans (`mha`'s plan): made by its first layer, read by the others
    plan: StepPlan | None = None
    # None, or what each layer's attention calls instead of `mha` (`attend_cached`'s
    # arguments; returns [T, h_q, d]): the engine's piecewise graphs of mixed steps end a
    # captured piece there (engine/mixed_graphs.py)
    attend: Callable[..., torch.Tensor] | None = None


def attend_cached(
    q: torch.Tensor,
    layer_idx: int,
    ctx: StepContext,
    *,
    mask: Mask,
    scale: float,
    sinks: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """`mha` of the step's queries q [T, h_q, d] over each request's `cache_length(b) +
    q_len(b)` keys of layer `layer_idx` (the step's K/V already in the cache). [T, h_q, d]
    (into `out` where given, `mha`'s). With `ctx.attend` set, that call's result instead."""
    if ctx.attend is not None:
        return ctx.attend(q, layer_idx, mask=mask, scale=scale, sinks=sinks)
    inputs, params = ctx.kv_inputs, ctx.kv_params
    return mha(
        q,
        PagedOperand(inputs, params, layer_idx, "k"),
        PagedOperand(inputs, params, layer_idx, "v"),
        ctx.q_row_offsets,
        mask=mask,
        scale=scale,
        sinks=sinks,
        num_decodes=ctx.num_decodes,
        plan=ctx.plan,
        out=out,
    )


__all__ = [
    "ColumnParallelLinear",
    "GptOssExperts",
    "GptOssMoE",
    "GptOssRouter",
    "grouped_experts_ok",
    "sort_by_expert",
    "sum_in_expert_order",
    "Linear",
    "RMSNorm",
    "RotaryEmbedding",
    "RowParallelLinear",
    "StepContext",
    "SwiGLUMLP",
    "apply_rope",
    "attend_cached",
    "rope_inv_freq",
]
