"""DeepSeek-V3 (transformers 5.24's DeepseekV3ForCausalLM) on a paged MLA cache.

Multi-head latent attention (`DeepseekMLA`, after DeepseekV3Attention):
- q: `q_proj` (q_lora_rank None) or `q_b_proj(q_a_layernorm(q_a_proj(x)))`, [T, h, nope + rope];
- the latent: `kv_a_proj_with_mqa(x)` = [c (kv_lora_rank, 512) | k_pe (rope, 64)]; c goes through
  `kv_a_layernorm`; k_pe and q's rope dims get RoPE at `positions` (with `rope_interleave` the
  pairs are (2i, 2i + 1) and the result is laid out [even | odd], exactly as transformers'
  `apply_rotary_pos_emb_interleave`; otherwise rotate-half); the YaRN attention scaling rides on
  cos/sin and the softmax scale is `qk_head_dim ** -0.5 * mscale(factor, mscale_all_dim) ** 2`
  (transformers' `yarn_apply_mscale`);
- every step first writes each new token's row `[RMSNorm(c) | RoPE(k_pe)]` (rank + rope) into
  the MLA cache (`store_kv`, one latent head), then attends in one of two forms per request:
  * absorbed (requests with at most `MLA_ABSORBED_MAX_Q` queries this step: decodes, short
    chunks): `q_lat = q_nope @ w_uk` per head, `mla_decode` of [q_lat | q_pe] over the paged
    latent cache (V = the first kv_lora_rank dims), then `@ w_uv` (`split_kv_b_proj`);
  * expanded (longer prefill chunks): the request's cached rows (prefix + this chunk) are read
    back through the cache operand, `kv_b_proj` expands them into per-head K [nope | rope] and
    V [v_head_dim], and `mha` (d_qk = nope + rope, d_v = v_head_dim) attends causally over
    absolute positions (cache_length(b) + i), the keys addressed as a ragged operand whose
    cache length is the request's prefix.
- o_proj on [T, h * v_head_dim].

MoE (`DeepseekMoE`, after DeepseekV3MoE): float32 router logits, sigmoid scores; choice by
score + `e_score_correction_bias` within the top-`topk_group` of `n_group` groups (a group
scores its top-2 sum), top-k of those; weights = the chosen sigmoid scores (normalised with
norm_topk_prob), times routed_scaling_factor; routed experts (SwiGLU, transformers 5's fused
[E, 2I, H] / [E, H, I] layout, read from the checkpoint's per-expert tensors) plus the shared
experts' SwiGLU. Layers below `first_k_dense_replace` have a dense SwiGLU MLP.

FP8 checkpoints (`quantization_config` fp8, `weight_block_size` [n, k], dynamic activations:
DeepSeek's release format): every projection of attention and MLP/experts keeps its e4m3
weight and `weight_scale_inv` blocks in memory and runs through `fp8_bmm`
(`layers.Fp8BlockLinear`, `DeepseekExperts`); the router, norms, embedding and lm_head stay
in the model dtype. A decode step (every request absorbed) then runs the fused FP8 branch
(`ops.mla_branch.mla_decode_branch_fp8`, `DeepseekMLA.takes_branch`) in each layer: q_nope @
w_uk through fp8_bmm, the latent's RMSNorm and RoPE of q_pe / k_pe written into the cache in
place, mla_decode, @ w_uv through fp8_bmm; w_uk / w_uv are e4m3 in 128 x 128 blocks made once
from kv_b_proj (`BRANCH_GRAN`), the RoPE a float32 table of every position (`freqs_cis`, the
rope pairs in the [even | odd] layout the cache holds). Other steps take the absorbed /
expanded forms above, the absorbed products on a dequantized copy of kv_b_proj made once
(h * (nope + v) * kv_lora_rank elements a layer).

Limits: kv_lora_rank <= 512 and kv_lora_rank + qk_rope_head_dim <= 576 (mla_decode's d_qk;
other geometries than DeepSeek's 512 + 64 need a BF16 / FP16 / FP32 cache); no tensor
parallelism; the multi-token-prediction layers of real checkpoints
(`model.layers.{num_layers}...`) are ignored on load. A mixed step reads the queries-per-request
and cache lengths on the host; a pure decode step (`num_decodes` = the batch) does not, and
in bf16 / fp16 on CUDA the routed experts run through `ops.moe` (plan, products and sums on
the device, plain or FP8 weights), so decode steps replay CUDA graphs (`supports_cuda_graphs`),
and mixed steps replay pieces around each layer's attention (`forward(attention_hook=)`: the
pieces end after the latent rows' store, `DeepseekMLA.attend` runs between them with the
step's plan). On the CPU plain weights run as grouped matmuls, FP8 ones loop over the experts
with tokens (their counts read on the host).
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..cache.inputs import KVCacheInputsPerDevice
from ..cache.params import KVCacheParams
from ..errors import InvalidArgumentError, check, check_int
from ..operands import PagedOperand, RowOperand
from ..ops import masks
from ..ops.linear.reference import quantize_weight_blocks
from ..ops.mha import mha
from ..ops.mla import mla_decode
from ..ops.mla.reference import MAX_Q_PER_REQUEST
from ..ops.mla_branch import mla_decode_branch_fp8
from ..ops.store_kv import store_kv
from .config import ModelConfig
from .layers import (
    Fp8BlockLinear,
    RMSNorm,
    SwiGLUMLP,
    apply_rope,
    fused_experts_ok,
    grouped_experts_ok,
    make_linear,
)
from .llama import DecoderForCausalLM
from .moe import SwiGLUExperts, expert_weight_source
from .weights import WeightSource

# A request with at most this many queries in a step attends in the absorbed form (mla_decode
# over the latent cache); longer prefill chunks in the expanded form (kv_b_proj over the
# request's cached latent, then mha). mla_decode takes at most MAX_Q_PER_REQUEST (8) queries a
# request, which caps it. By FLOPs (per head and key: absorbed 2 * 576 + 2 * 512 a query;
# expanded 2 * 512 * (nope + v) once for the decompression plus 2 * (nope + rope + v) a query)
# the absorbed form stays cheaper up to ~100 queries for V3's nope = v = 128; the measured
# crossover on a GPU is not taken yet.
MLA_ABSORBED_MAX_Q = MAX_Q_PER_REQUEST
# The fused branch's weight blocks and activation groups (w_uk / w_uv e4m3 in 128 x 128 blocks,
# q_nope and the latent output quantized in 1 x 128 groups): DeepSeek-V3's FP8 layout.
BRANCH_GRAN = 128


def split_kv_b_proj(
    weight: torch.Tensor, num_heads: int, qk_nope_head_dim: int, v_head_dim: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """kv_b_proj's weight [h * (nope + v), rank] (nn.Linear layout; per head the nope rows of
    K, then the v rows of V) -> the absorbed projections, views without a copy:
    w_uk [h, nope, rank]: `q_lat[t, h] = q_nope[t, h] @ w_uk[h]` ([rank]);
    w_uv [h, rank, v]: `o[t, h] = o_lat[t, h] @ w_uv[h]` ([v])."""
    check(
        isinstance(weight, torch.Tensor)
        and weight.ndim == 2
        and weight.shape[0] == num_heads * (qk_nope_head_dim + v_head_dim),
        "weight",
        f"a [{num_heads} * ({qk_nope_head_dim} + {v_head_dim}), rank] tensor",
        tuple(getattr(weight, "shape", ())),
    )
    w = weight.view(num_heads, qk_nope_head_dim + v_head_dim, weight.shape[1])
    return w[:, :qk_nope_head_dim, :], w[:, qk_nope_head_dim:, :].transpose(1, 2)


def _yarn_get_mscale(scale: float, mscale: float) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def mla_softmax_scale(cfg: ModelConfig) -> float:
    """DeepseekV3Attention.scaling: qk_head_dim ** -0.5, times mscale(factor, mscale_all_dim)
    squared for a non-default RoPE with mscale_all_dim (yarn_apply_mscale)."""
    scale = (cfg.qk_nope_head_dim + cfg.qk_rope_head_dim) ** -0.5
    r = cfg.rope
    if r.rope_type != "default" and r.mscale_all_dim:
        m = _yarn_get_mscale(r.factor, r.mscale_all_dim)
        scale = scale * m * m
    return scale


@dataclass
class MLAStepPlan:
    """How one step's requests split between the two attention forms (host-built once a step,
    shared by every layer). Token indices are int64 rows of the step; offsets int32.

    dec_tokens / pre_tokens: the step's rows of the absorbed / expanded requests (None when
      that group is empty; dec_tokens is also None when every request is absorbed).
    dec_inputs / dec_offsets: the absorbed requests' cache inputs and [bd + 1] query offsets.
    pre_offsets [bp + 1]: the expanded requests' query offsets; pre_cache_lengths [bp] their
      prefixes; ctx_rows [sum(prefix + q_len)]: the physical cache rows of their whole contexts
      (request after request), ctx_offsets [bp + 1] their prefix sums.
    """

    all_absorbed: bool
    dec_tokens: torch.Tensor | None = None
    dec_inputs: KVCacheInputsPerDevice | None = None
    dec_offsets: torch.Tensor | None = None
    pre_tokens: torch.Tensor | None = None
    pre_offsets: torch.Tensor | None = None
    pre_cache_lengths: torch.Tensor | None = None
    ctx_rows: torch.Tensor | None = None
    ctx_offsets: torch.Tensor | None = None

    @staticmethod
    def build(
        inputs: KVCacheInputsPerDevice,
        params: KVCacheParams,
        q_row_offsets: torch.Tensor,
        num_decodes: int | None = None,
        absorbed_max_q: int = MLA_ABSORBED_MAX_Q,
    ) -> MLAStepPlan:
        """The plan of a step; `num_decodes` (the engine's count of leading one-token
        requests) equal to the batch size makes it without reading the device (a pure decode
        step: every request absorbed; CUDA-graph safe). Otherwise the offsets and cache
        lengths are read on the host. A request with at most `absorbed_max_q` queries attends
        absorbed (0: every request expanded, as `bench/bench_mla_forms.py` times them)."""
        if (
            absorbed_max_q >= 1
            and num_decodes is not None
            and num_decodes == q_row_offsets.shape[0] - 1
        ):
            return MLAStepPlan(all_absorbed=True)
        offs = q_row_offsets.tolist()  # host sync (eager only)
        q_lens = [b - a for a, b in zip(offs, offs[1:])]
        dec = [i for i, n in enumerate(q_lens) if n <= absorbed_max_q]
        if len(dec) == len(q_lens):
            return MLAStepPlan(all_absorbed=True)
        dev = q_row_offsets.device
        cls = inputs.cache_lengths.tolist()
        pre = [i for i, n in enumerate(q_lens) if n > absorbed_max_q]

        def rows_of(reqs: list[int]) -> torch.Tensor:
            r = [t for i in reqs for t in range(offs[i], offs[i + 1])]
            return torch.tensor(r, dtype=torch.int64, device=dev)

        def prefix(lens: list[int]) -> torch.Tensor:
            out = [0]
            for n in lens:
                out.append(out[-1] + n)
            return torch.tensor(out, dtype=torch.int32, device=dev)

        plan = MLAStepPlan(all_absorbed=False)
        if dec:
            idx = torch.tensor(dec, dtype=torch.int64, device=dev)
            plan.dec_tokens = rows_of(dec)
            plan.dec_inputs = dataclasses.replace(
                inputs,
                cache_lengths=inputs.cache_lengths[idx].contiguous(),
                lookup_table=inputs.lookup_table[idx].contiguous(),
                attention_dispatch_metadata=None,
                draft_attention_dispatch_metadata=None,
            )
            plan.dec_offsets = prefix([q_lens[i] for i in dec])
        plan.pre_tokens = rows_of(pre)
        plan.pre_offsets = prefix([q_lens[i] for i in pre])
        plan.pre_cache_lengths = torch.tensor([cls[i] for i in pre], dtype=torch.int32, device=dev)
        ctx = [cls[i] + q_lens[i] for i in pre]
        plan.ctx_offsets = prefix(ctx)
        b_idx = torch.tensor([i for i, n in zip(pre, ctx) for _ in range(n)], device=dev)
        pos = torch.cat([torch.arange(n, device=dev) for n in ctx])
        plan.ctx_rows = PagedOperand(inputs, params, 0, "k").physical_rows(b_idx, pos)
        return plan


@dataclass
class MLAStepContext:
    """What every MLA layer of one step reads: the cache inputs and params, the [b + 1] query
    offsets, the step's RoPE cos/sin ([T, rope / 2]) and the request split."""

    kv_inputs: KVCacheInputsPerDevice
    kv_params: KVCacheParams
    q_row_offsets: torch.Tensor
    cos: torch.Tensor
    sin: torch.Tensor
    plan: MLAStepPlan
    # float32 [max_pos, rope] (cos, sin) pairs of every position (the fused branch's RoPE
    # table, `DeepseekV3ForCausalLM.freqs_cis`); None when no layer takes the branch.
    freqs_cis: torch.Tensor | None = None
    # None, or what each layer calls instead of its attention once its latent rows are in the
    # cache: `attend(q [T, h, nope + rope] (q_pe after RoPE), layer_idx, out_dim=v)` returns
    # [T, h, v] (the engine's piecewise graphs, engine/mixed_graphs.py; the plan is then a
    # placeholder, and the engine runs `DeepseekMLA.attend` between the pieces)
    attend: Callable[..., torch.Tensor] | None = None


class DeepseekMLA(nn.Module):
    """DeepseekV3Attention on the paged MLA cache (module docstring): parameter names are the
    checkpoint's (q_proj | q_a_proj, q_a_layernorm, q_b_proj; kv_a_proj_with_mqa,
    kv_a_layernorm, kv_b_proj; o_proj)."""

    def __init__(self, cfg: ModelConfig, layer_idx: int, dtype=None) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.h = cfg.num_heads
        self.nope, self.rope, self.v = cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim
        self.rank = cfg.kv_lora_rank
        self.interleave = cfg.rope_interleave
        H, qk = cfg.hidden_size, self.nope + self.rope
        bias = cfg.qkv_bias
        fp8 = cfg.fp8_block

        def lin(i: int, o: int, b: bool) -> nn.Module:
            return make_linear(i, o, b, dtype, fp8)

        if cfg.q_lora_rank is None:
            self.q_proj = lin(H, self.h * qk, False)
            self.q_a_proj = self.q_a_layernorm = self.q_b_proj = None
        else:
            self.q_proj = None
            self.q_a_proj = lin(H, cfg.q_lora_rank, bias)
            self.q_a_layernorm = RMSNorm(cfg.q_lora_rank, 1e-6, dtype)  # HF's default eps
            self.q_b_proj = lin(cfg.q_lora_rank, self.h * qk, False)
        self.kv_a_proj_with_mqa = lin(H, self.rank + self.rope, bias)
        self.kv_a_layernorm = RMSNorm(self.rank, 1e-6, dtype)  # DeepseekV3RMSNorm(kv_lora_rank)
        self.kv_b_proj = lin(self.rank, self.h * (self.nope + self.v), False)
        self.o_proj = lin(self.h * self.v, H, cfg.o_bias)
        self._kv_b_dense: torch.Tensor | None = None  # FP8 kv_b_proj, dequantized once
        self.scale = mla_softmax_scale(cfg)
        self.mask = masks.causal()

    def _rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        if self.interleave:  # pairs (2i, 2i+1), output [even | odd] (HF's interleave variant)
            x = torch.cat((x[..., 0::2], x[..., 1::2]), dim=-1)
        return apply_rope(x, cos, sin)

    @property
    def takes_branch(self) -> bool:
        """Whether decode steps run the fused FP8 branch (`mla_decode_branch_fp8`): kv_b_proj
        holds FP8 blocks (the branch's w_uk / w_uv are e4m3), and the model's dtype is one
        the branch's kernels take on CUDA (bf16, fp16; the CPU reference takes any)."""
        lin = self.kv_b_proj
        if not isinstance(lin, Fp8BlockLinear):
            return False
        return lin.weight.device.type == "cpu" or self.kv_a_layernorm.weight.dtype in (
            torch.bfloat16,
            torch.float16,
        )

    def forward(self, x: torch.Tensor, ctx: MLAStepContext) -> torch.Tensor:
        T = x.shape[0]
        if self.q_proj is not None:
            q = self.q_proj(x)
        else:
            q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x)))
        q = q.view(T, self.h, self.nope + self.rope)
        q_nope, q_pe = q.split([self.nope, self.rope], dim=-1)
        c, k_pe = self.kv_a_proj_with_mqa(x).split([self.rank, self.rope], dim=-1)
        hooked = ctx.attend is not None
        if not hooked and ctx.plan.all_absorbed and ctx.freqs_cis is not None and self.takes_branch:
            o = self._branch(q_nope, q_pe, c, k_pe, ctx)
            return self.o_proj(o.reshape(T, self.h * self.v))
        q_pe = self._rope(q_pe, ctx.cos, ctx.sin)
        c = self.kv_a_layernorm(c)
        k_pe = self._rope(k_pe[:, None, :], ctx.cos, ctx.sin)
        params = ctx.kv_params
        row = torch.cat((c[:, None, :], k_pe), dim=-1).to(params.dtype)  # [T, 1, 576]
        store_kv(row, None, ctx.kv_inputs, params, self.layer_idx, ctx.q_row_offsets)
        if hooked:  # (the engine's piecewise graphs: `attend` runs between the pieces)
            o = ctx.attend(torch.cat((q_nope, q_pe), dim=-1), self.layer_idx, out_dim=self.v)
        else:
            o = self._attend(q_nope, q_pe, ctx)
        return self.o_proj(o.reshape(T, self.h * self.v))

    def attend(self, q: torch.Tensor, ctx: MLAStepContext, out: torch.Tensor | None = None):
        """The attention `forward` runs once the step's latent rows are in the cache: [T, h, v]
        of the step's q [T, h, nope + rope] (q_pe after RoPE) on ctx (its plan made for the
        step), into `out` where given (the engine's piecewise graphs, between the pieces)."""
        q_nope, q_pe = q.split([self.nope, self.rope], dim=-1)
        o = self._attend(q_nope, q_pe, ctx)
        return o if out is None else out.copy_(o)

    def _attend(self, q_nope, q_pe, ctx: MLAStepContext) -> torch.Tensor:
        """[T, h, v]: each request in its form (`MLAStepPlan`)."""
        plan, params = ctx.plan, ctx.kv_params
        if plan.all_absorbed:
            return self._absorbed(q_nope, q_pe, ctx.kv_inputs, ctx.q_row_offsets, params)
        o = q_nope.new_empty(q_nope.shape[0], self.h, self.v)
        if plan.dec_tokens is not None:
            t = plan.dec_tokens
            o[t] = self._absorbed(q_nope[t], q_pe[t], plan.dec_inputs, plan.dec_offsets, params)
        t = plan.pre_tokens
        o[t] = self._expanded(q_nope[t], q_pe[t], ctx)
        return o

    def _pairs(self, x: torch.Tensor) -> torch.Tensor:
        """x's RoPE dims in the layout `_rope` rotates as halves: DeepSeek's interleaved pairs
        (2i, 2i+1) moved to [even | odd], as the cache holds them."""
        return torch.cat((x[..., 0::2], x[..., 1::2]), dim=-1) if self.interleave else x

    def _branch_weights(self):
        """(w_uk [h, rank, nope], its scales, w_uv [h, v, rank], its scales): e4m3 in 128 x
        128 blocks, made once from the FP8 kv_b_proj (dequantized per head, requantized in the
        branch's block layout; where the checkpoint's blocks align with the heads this gives
        back the same e4m3 values and scales)."""
        cached = getattr(self, "_branch_w", None)
        dev = self.kv_b_proj.weight.device
        if cached is not None and cached[0].device == dev:
            return cached
        w_uk, w_uv = split_kv_b_proj(self.kv_b_proj.dequantized(torch.float32), self.h,
                                     self.nope, self.v)  # fmt: skip
        uk = quantize_weight_blocks(w_uk.transpose(1, 2), BRANCH_GRAN, BRANCH_GRAN)
        uv = quantize_weight_blocks(w_uv.transpose(1, 2), BRANCH_GRAN, BRANCH_GRAN)
        self._branch_w = (*uk, *uv)
        return self._branch_w

    def _branch(self, q_nope, q_pe, c, k_pe, ctx: MLAStepContext) -> torch.Tensor:
        """[T, h, v] of a step whose requests all attend absorbed, through the fused branch:
        q_nope @ w_uk, RMSNorm of the latent and RoPE of q_pe / k_pe, the new rows written
        into the cache, mla_decode, @ w_uv. RoPE pairs (i, i + rope/2) of the `_pairs`
        layout, the table `ctx.freqs_cis`."""
        params = ctx.kv_params
        w_uk, s_uk, w_uv, s_uv = self._branch_weights()
        dt = params.dtype
        q = torch.cat((q_nope, self._pairs(q_pe)), dim=-1).to(dt)
        new_kv = torch.cat((c, self._pairs(k_pe)), dim=-1)[:, None, :].to(dt)
        norm = self.kv_a_layernorm
        o = mla_decode_branch_fp8(
            q, ctx.q_row_offsets, ctx.freqs_cis, norm.weight, ctx.kv_inputs, params,
            self.layer_idx, scale=self.scale, epsilon=norm.eps, w_uk=w_uk, w_uk_scale=s_uk,
            w_uv=w_uv, w_uv_scale=s_uv, new_kv=new_kv, k_gran=BRANCH_GRAN, n_gran=BRANCH_GRAN,
            mask="causal", interleaved_rope=False,
        )  # fmt: skip
        return o.to(q_nope.dtype)

    def _kv_b_weight(self, dtype: torch.dtype) -> torch.Tensor:
        """kv_b_proj's weight [h * (nope + v), rank] for the absorbed products: the parameter,
        or with FP8 blocks its dequantized copy, made once (h * (nope + v) * rank elements a
        layer; the expanded form keeps the FP8 weight through `fp8_bmm`)."""
        lin = self.kv_b_proj
        if not isinstance(lin, Fp8BlockLinear):
            return lin.weight
        w = self._kv_b_dense
        if w is None or w.dtype != dtype or w.device != lin.weight.device:
            w = self._kv_b_dense = lin.dequantized(dtype)
        return w

    def _absorbed(self, q_nope, q_pe, inputs, offsets, params) -> torch.Tensor:
        """[n, h, v]: mla_decode of [q_nope @ w_uk | q_pe] over the latent cache, @ w_uv."""
        w_uk, w_uv = split_kv_b_proj(self._kv_b_weight(q_nope.dtype), self.h, self.nope, self.v)
        q_lat = torch.bmm(q_nope.transpose(0, 1), w_uk).transpose(0, 1)  # [n, h, rank]
        q = torch.cat((q_lat, q_pe), dim=-1).to(params.dtype)
        o_lat = mla_decode(
            q,
            PagedOperand(inputs, params, self.layer_idx, "k"),
            offsets,
            d_v=self.rank,
            scale=self.scale,
            return_lse=False,
        )
        o_lat = o_lat.to(q_nope.dtype)
        return torch.bmm(o_lat.transpose(0, 1), w_uv).transpose(0, 1)  # [n, h, v]

    def _expanded(self, q_nope, q_pe, ctx: MLAStepContext) -> torch.Tensor:
        """[n, h, v]: the expanded requests' cached latent through kv_b_proj, then mha."""
        plan, dt = ctx.plan, q_nope.dtype
        op = PagedOperand(ctx.kv_inputs, ctx.kv_params, self.layer_idx, "k")
        lat = op.load_rows(plan.ctx_rows, dt)[:, 0]  # [N, 576], dequantized
        N = lat.shape[0]
        kv = self.kv_b_proj(lat[:, : self.rank]).view(N, self.h, self.nope + self.v)
        k = torch.cat(
            (kv[..., : self.nope], lat[:, None, self.rank :].expand(N, self.h, self.rope)), dim=-1
        )
        v = kv[..., self.nope :].contiguous()
        starts = plan.ctx_offsets[:-1].contiguous()
        k_op = RowOperand(k, plan.pre_cache_lengths, row_offsets=starts)
        v_op = RowOperand(v, plan.pre_cache_lengths, row_offsets=starts)
        q = torch.cat((q_nope, q_pe), dim=-1).contiguous()
        return mha(q, k_op, v_op, plan.pre_offsets, mask=self.mask, scale=self.scale)


class DeepseekRouter(nn.Module):
    """DeepseekV3TopkRouter (noaux_tc): weight [E, H] and e_score_correction_bias [E], both
    float32 (transformers' `_keep_in_fp32_modules_strict`); or DeepseekV2TopkRouter (greedy /
    group_limited_greedy: softmax scores, top-k over all experts or within the top topk_group
    groups by their best score, times routed_scaling_factor, no bias). Returns (weights [T, k]
    float32, expert ids [T, k] int64)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        E = cfg.num_experts
        self.E, self.k = E, cfg.num_experts_per_tok
        self.n_group, self.topk_group = cfg.n_group, cfg.topk_group
        self.norm, self.scaling = cfg.norm_topk_prob, cfg.routed_scaling_factor
        self.method = cfg.topk_method
        f32 = torch.float32
        self.weight = nn.Parameter(torch.empty(E, cfg.hidden_size, dtype=f32), requires_grad=False)
        if self.method == "noaux_tc":
            self.e_score_correction_bias = nn.Parameter(
                torch.empty(E, dtype=f32), requires_grad=False
            )

    def _v2(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        scores = logits.softmax(dim=-1)
        if self.method == "group_limited_greedy":
            per = self.E // self.n_group
            group_scores = scores.view(-1, self.n_group, per).max(dim=-1).values
            group_idx = torch.topk(group_scores, k=self.topk_group, dim=-1, sorted=False)[1]
            group_mask = torch.zeros_like(group_scores).scatter_(1, group_idx, 1)
            keep = group_mask.unsqueeze(-1).expand(-1, self.n_group, per).reshape(-1, self.E)
            scores = scores.masked_fill(~keep.bool(), 0.0)
        w, idx = torch.topk(scores, k=self.k, dim=-1, sorted=False)
        return w * self.scaling, idx

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = F.linear(x.float(), self.weight.float())
        if self.method != "noaux_tc":
            return self._v2(logits)
        scores = logits.sigmoid()
        choice = scores + self.e_score_correction_bias
        per = self.E // self.n_group
        group_scores = choice.view(-1, self.n_group, per).topk(2, dim=-1)[0].sum(dim=-1)
        group_idx = torch.topk(group_scores, k=self.topk_group, dim=-1, sorted=False)[1]
        group_mask = torch.zeros_like(group_scores).scatter_(1, group_idx, 1)
        score_mask = group_mask.unsqueeze(-1).expand(-1, self.n_group, per).reshape(-1, self.E)
        choice = choice.masked_fill(~score_mask.bool(), float("-inf"))
        idx = torch.topk(choice, k=self.k, dim=-1, sorted=False)[1]
        w = scores.gather(1, idx)
        if self.norm:
            w = w / (w.sum(dim=-1, keepdim=True) + 1e-20)
        return w * self.scaling, idx


class DeepseekExperts(SwiGLUExperts):
    """DeepseekV3Experts: `moe.SwiGLUExperts` of the config's num_experts x
    moe_intermediate_size, FP8 blocks where the checkpoint has them (one rank)."""

    def __init__(self, cfg: ModelConfig, dtype=None) -> None:
        super().__init__(cfg.num_experts, cfg.hidden_size, cfg.moe_intermediate_size, dtype,
                         cfg.fp8_block)  # fmt: skip


class DeepseekMoE(nn.Module):
    """DeepseekV3MoE: routed experts plus the shared experts' SwiGLU (intermediate
    moe_intermediate_size * n_shared_experts)."""

    def __init__(self, cfg: ModelConfig, dtype=None) -> None:
        super().__init__()
        self.experts = DeepseekExperts(cfg, dtype)
        self.gate = DeepseekRouter(cfg)
        n = cfg.n_shared_experts
        inter = cfg.moe_intermediate_size * n
        self.shared_experts = (
            SwiGLUMLP(cfg.hidden_size, inter, False, dtype, fp8_block=cfg.fp8_block) if n else None
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w, idx = self.gate(x)
        out = self.experts(x, w, idx)
        return out if self.shared_experts is None else out + self.shared_experts(x)


class DeepseekDecoderLayer(nn.Module):
    """DeepseekV3DecoderLayer: pre-norm MLA, then pre-norm MLP (dense below
    first_k_dense_replace, else the MoE); the residual rides alongside as in llama.py."""

    def __init__(self, cfg: ModelConfig, layer_idx: int, dtype=None) -> None:
        super().__init__()
        self.self_attn = DeepseekMLA(cfg, layer_idx, dtype)
        if cfg.is_moe and layer_idx >= cfg.first_k_dense_replace:
            self.mlp = DeepseekMoE(cfg, dtype)
        else:
            self.mlp = SwiGLUMLP(
                cfg.hidden_size, cfg.intermediate_size, False, dtype, fp8_block=cfg.fp8_block
            )
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype)

    def forward(self, h, residual, ctx: MLAStepContext):
        if residual is None:
            residual, x = h, self.input_layernorm(h)
        else:
            x, residual = self.input_layernorm(h, residual)
        x = self.self_attn(x, ctx)
        x, residual = self.post_attention_layernorm(x, residual)
        return self.mlp(x), residual


_EXPERT_PARAM = re.compile(r"^(.*\.mlp\.experts)\.(gate_up_proj|down_proj)(_scale_inv)?$")
_LAYER_OF = re.compile(r"^model\.layers\.(\d+)\.")


class DeepseekV3ForCausalLM(DecoderForCausalLM):
    """DeepSeek-V3 layout (transformers' DeepseekV3ForCausalLM) on a paged MLA cache; the step
    contract is `DecoderForCausalLM.forward`'s (docs/models.md). kv_params: an MLA
    `KVCacheParams` (`kv_cache_params(config, ...)`: is_mla, one head of 576, mla_rope_dim 64)."""

    packed_modules = {"gate_up_proj": ("gate_proj", "up_proj")}
    # The start-up steps' chunk lengths (`GraphRunner.warm_up_eager`): chunks of 2 attend
    # absorbed with the step's decodes (mla_decode of several tokens a request); chunks of
    # MLA_ABSORBED_MAX_Q + 1 are expanded, so the decodes beside them attend as a batch of
    # their own (one token a request, the step's table width): H200, bench-serve's workload on
    # DeepSeek-V2-Lite (8 layers) compiled `_mla_decode_sm90_t` 4 times in its first 41 steps
    # with chunks of 2 alone (~1.4 s each; docs/kernels/jit_specializations.md).
    warm_up_chunk_lengths = (2, MLA_ABSORBED_MAX_Q + 1)
    # The absorbed batches' row counts that are multiples of 16 (`cuda_graphs.
    # aligned_row_steps`): mla_decode specializes on the row count's class, and the steps above
    # make few such counts (24 decodes beside a chunk of 8 are 32 rows; offline, 4 of 120 such
    # layouts met a binary no start-up step made, docs/kernels/jit_specializations.md).
    warm_up_absorbed_max_q = MLA_ABSORBED_MAX_Q

    @property
    def supports_cuda_graphs(self) -> bool:
        """Decode steps can be captured where nothing syncs the host: the step plan comes from
        `num_decodes` (a pure decode step) and the routed experts run without reading their
        token counts: `ops.moe` on CUDA in bf16 / fp16 (`layers.fused_experts_ok`, plain or
        FP8 weights), or grouped matmuls for plain weights (`layers.grouped_experts_ok`). FP8
        checkpoints decode through the fused branch, captured like the absorbed mla_decode."""
        cfg = self.config
        dev = self.model.embed_tokens.weight.device
        if not cfg.is_moe or fused_experts_ok(dev, self.dtype):
            return True
        return cfg.fp8_block is None and grouped_experts_ok(dev, self.dtype)

    def __init__(
        self,
        config: ModelConfig,
        *,
        dtype: torch.dtype | None = None,
        kv_params: KVCacheParams | None = None,
        tp_size: int = 1,
        tp_rank: int | None = None,
    ) -> None:
        cfg = ModelConfig.from_hf(config)
        check(cfg.is_mla, "config", "a DeepSeek (MLA) config", cfg.architecture)
        check_int("tp_size", tp_size, 1, 1)  # not sharded yet
        # (cfg.head_dim is the rope dim: the rotary embedding's)
        super().__init__(cfg, dtype=dtype, kv_params=kv_params)

    def make_layer(self, cfg: ModelConfig, layer_idx: int, dtype, norm_kw: dict) -> nn.Module:
        return DeepseekDecoderLayer(cfg, layer_idx, dtype)

    # Loading -------------------------------------------------------------------------------
    def checkpoint_source(self, name: str) -> WeightSource | None:
        """The routed experts' stacked parameters <- the checkpoint's per-expert tensors
        (`...experts.{e}.gate_proj.weight` / `up_proj` / `down_proj`)."""
        m = _EXPERT_PARAM.match(name)
        if m is None:
            return None
        base, which, scale = m.groups()
        suffix = "weight_scale_inv" if scale else "weight"
        return expert_weight_source(base, which, self.config.num_experts, suffix=suffix)

    def ignores_checkpoint_tensor(self, name: str) -> bool:
        """The multi-token-prediction layers (`model.layers.{i}.` with i >= num_layers); with
        n_shared_experts 0, the empty shared experts transformers still saves (an MLP of 0
        intermediate features: it adds zero)."""
        m = _LAYER_OF.match(name)
        if m is not None and int(m.group(1)) >= self.config.num_layers:
            return True
        return self.config.n_shared_experts == 0 and ".mlp.shared_experts." in name

    # Cache ---------------------------------------------------------------------------------
    def attach_kv_cache(self, params: KVCacheParams) -> None:
        """Bind the MLA `KVCacheParams` the forward writes (checked: layers, is_mla, one head
        of kv_lora_rank + rope, the rope dim, the query heads, dtype = the model's)."""
        cfg = self.config
        check(isinstance(params, KVCacheParams), "kv_params", "a KVCacheParams", type(params))
        want = (cfg.num_layers, True, 1, cfg.mla_head_dim, cfg.qk_rope_head_dim, cfg.num_heads)
        got = (
            params.num_layers,
            params.is_mla,
            params.n_kv_heads,
            params.head_dim,
            params.mla_rope_dim,
            params.num_q_heads,
        )
        check(
            want == got and params.dtype == self.dtype,
            "kv_params",
            "(num_layers, is_mla, n_kv_heads, head_dim, mla_rope_dim, num_q_heads) = "
            f"{want}, dtype {self.dtype} (models.kv_cache_params(config, dtype=model.dtype))",
            f"{got}, dtype {params.dtype}",
        )
        self.kv_params = params

    # Step ----------------------------------------------------------------------------------
    def _branch_layers(self) -> bool:
        """Whether the attention layers decode through the fused FP8 branch (FP8 kv_b_proj)."""
        return self.model.layers[0].self_attn.takes_branch

    def freqs_cis(self) -> torch.Tensor:
        """The fused branch's RoPE table: float32 [max_position_embeddings, rope] with (cos,
        sin) of frequency i at columns (2i, 2i + 1) for every position, the rope scaling's
        attention factor included (the same values `rotary_emb` gives each step, before its
        cast to the model's dtype); made once per device."""
        dev = self.model.embed_tokens.weight.device
        t = getattr(self, "_freqs_cis", None)
        if t is None or t.device != dev:
            pos = torch.arange(self.config.max_position_embeddings, device=dev)
            cos, sin = self.rotary_emb(pos, torch.float32)
            t = self._freqs_cis = torch.stack((cos, sin), dim=-1).flatten(1)
        return t

    def step_context(
        self, kv_inputs, q_row_offsets, cos, sin, num_decodes, attention_plan=None, attend=None
    ) -> MLAStepContext:
        """The MLA layers' step context: the request split (`MLAStepPlan`; num_decodes equal to
        the batch size, a pure decode step, builds it without a host sync, otherwise the query
        counts are read on the host) and, for the fused branch, the RoPE table. attention_plan
        (the MHA layers' `StepPlan`) is not read: the MLA layers plan the step themselves.
        attend (`forward`'s attention_hook): no plan is made (no layer attends here: the
        engine's pieces are captured without a host read) and no layer takes the branch."""
        if q_row_offsets.shape[0] < 2:
            raise InvalidArgumentError("q_row_offsets: a step needs at least one request")
        if attend is not None:
            return MLAStepContext(kv_inputs, self.kv_params, q_row_offsets, cos, sin,
                                  MLAStepPlan(all_absorbed=False), attend=attend)  # fmt: skip
        plan = MLAStepPlan.build(kv_inputs, self.kv_params, q_row_offsets, num_decodes)
        freqs = self.freqs_cis() if plan.all_absorbed and self._branch_layers() else None
        return MLAStepContext(kv_inputs, self.kv_params, q_row_offsets, cos, sin, plan, freqs)

    def piece_context(self, kv_inputs, q_row_offsets, num_decodes, attention_plan):
        """The context of `attend_piece` for one step of the engine's piecewise graphs: the
        step's `MLAStepPlan` (the query counts read on the host where not a pure decode step,
        as the eager step reads them); no RoPE (the pieces applied it)."""
        plan = MLAStepPlan.build(kv_inputs, self.kv_params, q_row_offsets, num_decodes)
        return MLAStepContext(kv_inputs, self.kv_params, q_row_offsets, None, None, plan)

    def serves_in_pieces(self, q_row_offsets) -> bool:
        """Where the layers take the fused FP8 branch, a step whose every request attends
        absorbed (at most MLA_ABSORBED_MAX_Q queries) stays eager, as it takes the branch there:
        the pieces run the plain attention, whose products round otherwise (FP8 w_uk / w_uv
        against the dequantized kv_b_proj). Any other step replays the pieces."""
        if not self._branch_layers():
            return True
        offs = [int(v) for v in q_row_offsets]
        return any(b - a > MLA_ABSORBED_MAX_Q for a, b in zip(offs, offs[1:]))

    def attend_piece(self, q, layer_idx, ctx, *, out, out_dim):
        """Layer `layer_idx`'s attention (`DeepseekMLA.attend`) of the q its hook received, into
        `out` ([T, h, out_dim]), on `piece_context`'s ctx."""
        return self.model.layers[layer_idx].self_attn.attend(q, ctx, out=out)


class DeepseekV2ForCausalLM(DeepseekV3ForCausalLM):
    """DeepSeek-V2 / V2-Lite (transformers' DeepseekV2ForCausalLM): the V3 layout with the V2
    router (`DeepseekRouter` greedy / group_limited_greedy). Its RoPE rotates the pairs (2i,
    2i + 1) in place; the cache keeps them as [even | odd] like V3's interleave variant (q and
    k permuted alike: the same scores)."""


__all__ = [
    "MLA_ABSORBED_MAX_Q",
    "DeepseekExperts",
    "DeepseekMLA",
    "DeepseekMoE",
    "DeepseekRouter",
    "DeepseekV2ForCausalLM",
    "DeepseekV3ForCausalLM",
    "MLAStepPlan",
    "split_kv_b_proj",
]
