"""Routed-expert MLPs with plain SwiGLU experts: the top-k softmax MoE of Mixtral, Qwen2-MoE and
Qwen3-MoE, and the experts DeepSeek's MoE routes to.

- `SwiGLUExperts`: E experts, each `down[e] @ (silu(g) * u)` with (g, u) the halves of
  `gate_up[e] @ x`, in transformers 5's fused layout (gate_up_proj [E, 2I, H], down_proj
  [E, H, I]; `expert_weight_source` stacks them from a checkpoint's per-expert tensors), plain
  or FP8 blocks. On CUDA in bf16 / fp16 they run through `ops.moe` (`layers.fused_experts`),
  on the CPU as two grouped matmuls, elsewhere one matmul pair per expert with tokens; the
  first two make no host sync (CUDA-graph safe).
- `SoftmaxTopKRouter`: logits = x @ W.T, a float32 softmax over all experts, its top k,
  renormalised to sum 1 with `norm_topk_prob` (MixtralTopKRouter always, Qwen2MoeTopKRouter /
  Qwen3MoeTopKRouter per the config); Qwen's weights are then cast to the activations' dtype
  (`weights_in_dtype`), Mixtral's stay float32.
- `SparseMoE`: router, experts and (Qwen2-MoE) a shared SwiGLU expert scaled by
  sigmoid(`shared_expert_gate`(x)); Qwen2MoeSparseMoeBlock / Qwen3MoeSparseMoeBlock /
  MixtralSparseMoeBlock.

Tensor parallelism (models/parallel.py): every rank holds every expert and its 1/tp slice of
each expert's intermediate features (gate and up rows, down columns, sliced before stacking);
the router is replicated; the rank's partial sums (routed and shared) are all-reduced once.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import check
from ..ops.fused import silu_mul
from ..ops.linear import fp8_bmm
from . import parallel
from .config import ModelConfig
from .layers import (
    Linear,
    SwiGLUMLP,
    expert_groups,
    fused_experts,
    fused_experts_ok,
    grouped_experts_ok,
    sort_by_expert,
    sum_in_expert_order,
)
from .weights import WeightSource


class SwiGLUExperts(nn.Module):
    """Routed SwiGLU experts (DeepseekV3Experts, Qwen3MoeExperts, MixtralExperts): per expert e,
    `down_proj[e] @ (silu(g) * u)` with (g, u) the halves of `gate_up_proj[e] @ x`, times the
    token's routing weight, summed over the token's experts in expert order (transformers'
    index_add_ loop). gate_up_proj [E, 2I, H], down_proj [E, H, I] (I: this rank's slice of
    `inter`). With FP8 blocks (n, k) they are e4m3, beside gate_up_proj_scale_inv [E, 2I / n,
    H / k] and down_proj_scale_inv [E, H / n, I / k] (a checkpoint's weight_scale_inv), and each
    expert's products run through `fp8_bmm` (one rank only)."""

    def __init__(
        self,
        num_experts: int,
        hidden: int,
        inter: int,
        dtype=None,
        fp8_block: tuple[int, int] | None = None,
        tp_size: int = 1,
    ) -> None:
        super().__init__()
        check(
            inter % tp_size == 0 and (fp8_block is None or tp_size == 1),
            "expert intermediate size",
            f"a multiple of tensor_parallel_size={tp_size} (FP8 experts: one rank)",
            inter,
        )
        E, H, inter = num_experts, hidden, inter // tp_size
        self.E, self.inter = E, inter
        self.fp8 = fp8 = fp8_block
        wdt = dtype if fp8 is None else torch.float8_e4m3fn
        self.gate_up_proj = nn.Parameter(torch.empty(E, 2 * inter, H, dtype=wdt), False)
        self.down_proj = nn.Parameter(torch.empty(E, H, inter, dtype=wdt), False)
        if fp8 is not None:
            n, k = fp8
            check(inter % n == 0, "config.moe_intermediate_size",
                  f"a multiple of the FP8 weight block {n}", inter)  # fmt: skip
            f32 = torch.float32
            self.gate_up_proj_scale_inv = nn.Parameter(
                torch.empty(E, 2 * inter // n, -(-H // k), dtype=f32), False
            )
            self.down_proj_scale_inv = nn.Parameter(
                torch.empty(E, -(-H // n), -(-inter // k), dtype=f32), False
            )

    def _proj(self, x: torch.Tensor, name: str, e: int) -> torch.Tensor:
        w = getattr(self, name)[e]
        if self.fp8 is None:
            return F.linear(x, w)
        n, k = self.fp8
        s = getattr(self, name + "_scale_inv")[e]
        return fp8_bmm(x[None], w[None], s[None], k_gran=k, n_gran=n, out_dtype=x.dtype)[0]

    def forward(self, x: torch.Tensor, weights: torch.Tensor, experts: torch.Tensor):
        """x [T, H], weights [T, k] (float32, or x's dtype), experts [T, k]: `forward_fused`
        where `fused_experts_ok` (plain or FP8 weights), else `forward_grouped` for plain
        weights where `grouped_experts_ok` (both without a host sync), else `forward_loop`."""
        if fused_experts_ok(x.device, x.dtype):
            return self.forward_fused(x, weights, experts)
        if self.fp8 is None and grouped_experts_ok(x.device, x.dtype):
            return self.forward_grouped(x, weights, experts)
        return self.forward_loop(x, weights, experts)

    def forward_fused(self, x: torch.Tensor, weights: torch.Tensor, experts: torch.Tensor):
        """The loop's math through `ops.moe` (`layers.fused_experts`): silu * up in the gate_up
        product's epilogue, the routing weight and the token's sum in float32; FP8 weights
        dequantized in registers (the activations stay in x's dtype, where the loop's
        `fp8_bmm` quantizes them to e4m3 in 1 x 128 groups)."""
        fp8 = self.fp8 is not None
        return fused_experts(
            x, experts, self.gate_up_proj, self.down_proj, weights=weights,
            gate_up_scale=self.gate_up_proj_scale_inv if fp8 else None,
            down_scale=self.down_proj_scale_inv if fp8 else None,
            w_block=self.fp8 if fp8 else (128, 128),
        )  # fmt: skip

    def forward_grouped(self, x: torch.Tensor, weights: torch.Tensor, experts: torch.Tensor):
        """The loop's math as two grouped matmuls (`layers.sort_by_expert`,
        `torch._grouped_mm`), each token's k outputs summed in expert order in x's dtype
        (`layers.sum_in_expert_order`, as the loop's index_add_)."""
        order, _, offs = sort_by_expert(experts, self.E)
        k = experts.shape[1]
        gu = torch._grouped_mm(x[order // k], self.gate_up_proj.transpose(1, 2), offs=offs)
        h = torch._grouped_mm(silu_mul(gu), self.down_proj.transpose(1, 2), offs=offs)
        return sum_in_expert_order(h * weights.flatten()[order, None], order, experts, x.dtype)

    def forward_loop(self, x: torch.Tensor, weights: torch.Tensor, experts: torch.Tensor):
        """One matmul pair per expert with tokens (reads each expert's count on the host)."""
        out = torch.zeros_like(x)
        for e, t, s in expert_groups(experts, self.E):
            h = self._proj(silu_mul(self._proj(x[t], "gate_up_proj", e)), "down_proj", e)
            out.index_add_(0, t, (h * weights[t, s, None]).to(x.dtype))
        return out


def expert_weight_source(
    base: str,
    param: str,
    num_experts: int,
    names: tuple[str, str, str] = ("gate_proj", "up_proj", "down_proj"),
    suffix: str = "weight",
    tp_rank: int = 0,
    tp_size: int = 1,
) -> WeightSource:
    """The checkpoint tensors of a `SwiGLUExperts` parameter `base`.`param` ("gate_up_proj" or
    "down_proj"): each expert's `{base}.{e}.{gate}.{suffix}` and `{up}` concatenated, or its
    `{down}`, stacked over the experts. names: the checkpoint's (gate, up, down) names
    (Mixtral's w1, w3, w2). tp_size > 1: each tensor's slice of the intermediate features
    (gate / up rows, down columns) is taken before stacking."""
    gate, up, down = names
    shard = {} if tp_size == 1 else dict(shard_rank=tp_rank, shard_size=tp_size)
    if param == "gate_up_proj":
        tensors = tuple(f"{base}.{e}.{p}.{suffix}" for e in range(num_experts) for p in (gate, up))
        return WeightSource(
            tensors,
            lambda ts: torch.stack(
                [torch.cat(ts[2 * e : 2 * e + 2], dim=0) for e in range(len(ts) // 2)]
            ),
            **({} if not shard else dict(shard_dim=0, **shard)),
        )
    check(param == "down_proj", "param", "'gate_up_proj' or 'down_proj'", param)
    tensors = tuple(f"{base}.{e}.{down}.{suffix}" for e in range(num_experts))
    return WeightSource(tensors, torch.stack, **({} if not shard else dict(shard_dim=1, **shard)))


class SoftmaxTopKRouter(nn.Module):
    """MixtralTopKRouter / Qwen2MoeTopKRouter / Qwen3MoeTopKRouter: logits = x @ weight.T
    (weight [E, H], no bias), probabilities = a float32 softmax over all experts, their top k
    (ties: `torch.topk`'s order, as transformers'), divided by their sum when `normalize`.
    Returns (weights [T, k]: float32, or x's dtype with `weights_in_dtype`; expert ids [T, k]
    int64)."""

    def __init__(
        self, hidden: int, num_experts: int, top_k: int, normalize: bool, weights_in_dtype: bool,
        dtype=None,
    ) -> None:  # fmt: skip
        super().__init__()
        self.top_k, self.normalize, self.in_dtype = top_k, normalize, weights_in_dtype
        self.weight = nn.Parameter(torch.empty(num_experts, hidden, dtype=dtype), False)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = F.linear(x, self.weight)
        probs = torch.softmax(logits.float(), dim=-1)
        w, idx = torch.topk(probs, self.top_k, dim=-1)
        if self.normalize:
            w = w / w.sum(dim=-1, keepdim=True)
        return (w.to(logits.dtype) if self.in_dtype else w), idx


class SparseMoE(nn.Module):
    """A top-k softmax MoE block: `experts(x, *gate(x))`, plus (Qwen2-MoE,
    shared_expert_intermediate_size > 0) `sigmoid(shared_expert_gate(x)) * shared_expert(x)`.
    Sub-module names follow transformers' (`gate`, `experts`, `shared_expert`,
    `shared_expert_gate`); the model maps the checkpoint's per-expert tensors onto `experts`
    (`expert_weight_source`)."""

    def __init__(self, cfg: ModelConfig, dtype=None, tp_size: int = 1) -> None:
        super().__init__()
        self.tp_size = tp_size
        H = cfg.hidden_size
        self.gate = SoftmaxTopKRouter(
            H, cfg.num_experts, cfg.num_experts_per_tok, cfg.norm_topk_prob,
            cfg.moe_weights_in_dtype, dtype,
        )  # fmt: skip
        self.experts = SwiGLUExperts(cfg.num_experts, H, cfg.moe_intermediate_size, dtype,
                                     tp_size=tp_size)  # fmt: skip
        n = cfg.shared_expert_intermediate_size
        self.shared_expert = SwiGLUMLP(H, n, False, dtype, tp_size) if n else None
        self.shared_expert_gate = Linear(H, 1, False, dtype) if n else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w, idx = self.gate(x)
        out = self.experts(x, w, idx)
        if self.shared_expert is not None:
            # this rank's partial shared expert (its down_proj shard without the reduce), so
            # one all-reduce below sums both parts
            se = self.shared_expert
            shared = F.linear(silu_mul(se.gate_up_proj(x)), se.down_proj.weight)
            out = out + torch.sigmoid(self.shared_expert_gate(x)) * shared
        return parallel.all_reduce(out, self.tp_size)


__all__ = ["SoftmaxTopKRouter", "SparseMoE", "SwiGLUExperts", "expert_weight_source"]
