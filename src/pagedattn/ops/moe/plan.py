"""`MoEPlan`: a top-k routing's rows grouped by expert, in blocks of `block_m` rows, in
fixed-size device buffers (a CUDA graph replays it with new routings)."""

from __future__ import annotations

from dataclasses import dataclass

import torch


def plan_capacity(num_rows: int, num_experts: int, block_m: int) -> int:
    """Blocks a plan of `num_rows` slot rows can need: each bucket with rows (the experts and
    the out-of-range bucket, at most min(E + 1, rows) of them) wastes at most one partial block,
    so cdiv(rows, block_m) + min(E + 1, rows) bounds every routing."""
    return -(-num_rows // block_m) + min(num_experts + 1, num_rows)


@dataclass(frozen=True)
class MoEPlan:
    """The grouped layout of a top-k routing (`moe_plan`).

    sorted_rows: int32 [capacity * block_m]. The slot rows r = t * top_k + s (token t's s-th
      choice) grouped by expert in increasing expert id, ascending r within an expert, each
      expert's run padded to a multiple of block_m with `num_rows` (no row); then the rows
      routed outside [0, num_experts) the same way; then `num_rows` to the end.
    block_experts: int32 [capacity]: the expert of each block of block_m entries,
      `num_experts` for the out-of-range rows' blocks, -1 for the unused blocks at the end.
    num_rows: T * top_k; top_k; num_experts; block_m (rows a block, a power of two >= 16).
    capacity = `plan_capacity(num_rows, num_experts, block_m)`."""

    sorted_rows: torch.Tensor
    block_experts: torch.Tensor
    num_rows: int
    top_k: int
    num_experts: int
    block_m: int

    @property
    def num_tokens(self) -> int:
        return self.num_rows // self.top_k

    @property
    def capacity(self) -> int:
        return self.block_experts.shape[0]
