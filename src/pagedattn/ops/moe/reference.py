"""The routed-experts ops in plain torch (`pagedattn.ops.moe` documents the contracts): the
plan by a stable sort, the products in float32 per expert, the token sums in float32."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..fused.reference import silu_mul_reference
from .plan import MoEPlan, plan_capacity


def moe_plan_reference(topk_ids: torch.Tensor, num_experts: int, block_m: int) -> MoEPlan:
    T, k = topk_ids.shape
    n = T * k
    cap = plan_capacity(n, num_experts, block_m)
    dev = topk_ids.device
    flat = topk_ids.flatten().long()
    bucket = torch.where((flat < 0) | (flat >= num_experts), num_experts, flat)
    counts = torch.bincount(bucket, minlength=num_experts + 1)
    blocks = (counts + block_m - 1) // block_m
    rows = torch.full((cap * block_m,), n, dtype=torch.int32, device=dev)
    experts = torch.full((cap,), -1, dtype=torch.int32, device=dev)
    order = torch.argsort(bucket, stable=True)
    start = 0  # block index
    done = 0  # rows of `order` placed
    for e in range(num_experts + 1):
        c, b = int(counts[e]), int(blocks[e])
        if c:
            rows[start * block_m : start * block_m + c] = order[done : done + c].to(torch.int32)
            experts[start : start + b] = e
        start, done = start + b, done + c
    return MoEPlan(rows, experts, n, k, num_experts, block_m)


def _expert_rows(plan: MoEPlan) -> tuple[torch.Tensor, torch.Tensor]:
    """(slot rows [n] int64 in the plan's order, their experts [n] int64), padding dropped."""
    rows = plan.sorted_rows.view(-1, plan.block_m).long()
    e = plan.block_experts.long()[:, None].expand_as(rows)
    keep = rows < plan.num_rows
    return rows[keep], e[keep]


def expert_matmul_reference(
    x: torch.Tensor,
    w: torch.Tensor,
    plan: MoEPlan,
    *,
    w_scale: torch.Tensor | None = None,
    w_block: tuple[int, int] = (128, 128),
    bias: torch.Tensor | None = None,
    row_weights: torch.Tensor | None = None,
    activation: str | None = None,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """Per expert, F.linear in float32 (+ bias); with silu_mul the [rows, 2 n] product is
    rounded to x's dtype and combined as transformers does (silu(gate) * up, op by op)."""
    n = plan.num_rows
    nw = w.shape[1]
    n_out = nw // 2 if activation == "silu_mul" else nw
    out = torch.empty(n, n_out, dtype=out_dtype or x.dtype, device=x.device)
    rows, experts = _expert_rows(plan)
    src = rows // plan.top_k if x.shape[0] != n else rows
    a = x[src].float()
    if w_scale is not None:
        bn, bk = w_block
        s = w_scale.repeat_interleave(bn, 1).repeat_interleave(bk, 2)
    acc = torch.empty(rows.shape[0], n_out, dtype=torch.float32, device=x.device)
    for e in torch.unique(experts).tolist():
        sel = experts == e
        if e >= plan.num_experts:  # routed outside [0, E): NaN rows
            acc[sel] = float("nan")
            continue
        we = w[e].float()
        if w_scale is not None:
            we = we * s[e, : we.shape[0], : we.shape[1]]
        h = F.linear(a[sel], we)
        if bias is not None:
            h = h + bias[e].float()
        if activation == "silu_mul":
            h = silu_mul_reference(h.to(x.dtype)).float()
        acc[sel] = h
    if row_weights is not None:
        acc = acc * row_weights.flatten()[rows].float()[:, None]
    out[rows] = acc.to(out.dtype)
    return out


def moe_sum_reference(y: torch.Tensor, top_k: int, out_dtype: torch.dtype) -> torch.Tensor:
    """Each token's top_k rows of y [T * top_k, N] summed in slot order, in float32."""
    rows = y.reshape(-1, top_k, y.shape[1]).float()
    acc = rows[:, 0].clone()
    for s in range(1, top_k):
        acc = acc + rows[:, s]
    return acc.to(out_dtype)
