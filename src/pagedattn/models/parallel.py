"""Tensor parallelism over torch.distributed (SPMD: one process per rank, every rank runs the
same step on the same inputs).

A model built with `tp_size = N > 1` holds rank r's shard of every layer, the heads split as the
paged cache's tensor-parallel layout splits them (rank r: KV heads [r * h_kv / N, (r + 1) * h_kv
/ N), and the query heads of those KV groups):
- column-parallel (`layers.ColumnParallelLinear`): q/k/v and gate/up, the output features
  sharded (weight and bias along dim 0 of each checkpoint tensor);
- row-parallel (`layers.RowParallelLinear`): o_proj and down_proj, the input features sharded
  (weight along dim 1), `dist.all_reduce` of the partial products, then the bias once;
- replicated: embeddings, norms, q/k norms, lm_head.
After each block's all-reduce the hidden states, hence the logits, are the same on every rank.

At `tp_size == 1` every helper is the identity and nothing calls torch.distributed.
"""

from __future__ import annotations

import torch

from ..errors import InvalidArgumentError


def dist_ready() -> bool:
    """Whether torch.distributed is available and its default group initialized."""
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


def world_size() -> int:
    """The default group's world size (1 without torch.distributed)."""
    import torch.distributed as dist

    return dist.get_world_size() if dist_ready() else 1


def rank() -> int:
    """This process's rank in the default group (0 without torch.distributed)."""
    import torch.distributed as dist

    return dist.get_rank() if dist_ready() else 0


def backend() -> str | None:
    """The default group's backend ("nccl", "gloo", ...), None without torch.distributed."""
    import torch.distributed as dist

    return str(dist.get_backend()) if dist_ready() else None


def check_tp(tp_size: int, tp_rank: int | None = None) -> int:
    """The rank for a `tp_size`-way model: `tp_rank` or this process's rank. With tp_size > 1
    and no `tp_rank`, torch.distributed must be initialized with world size tp_size
    (InvalidArgumentError). An explicit `tp_rank` builds that rank's shard without a process
    group (to load or inspect it; its forward's all-reduces need the group)."""
    if tp_size == 1:
        return 0 if tp_rank is None else tp_rank
    if tp_rank is not None:
        if not 0 <= tp_rank < tp_size:
            raise InvalidArgumentError(f"tp_rank: expected in [0, {tp_size}), got {tp_rank}")
        return tp_rank
    if not dist_ready():
        raise InvalidArgumentError(
            f"tensor_parallel_size={tp_size}: torch.distributed is not initialized; start one "
            "process per rank and call torch.distributed.init_process_group (gloo on the CPU, "
            "nccl on CUDA) first"
        )
    ws = world_size()
    if ws != tp_size:
        raise InvalidArgumentError(
            f"tensor_parallel_size={tp_size}: torch.distributed's world size is {ws} (one "
            "process per tensor-parallel rank)"
        )
    return rank()


def check_divisible(cfg, tp_size: int) -> None:
    """num_heads, num_kv_heads and the MLPs' intermediate sizes (dense, routed experts',
    shared expert's) must divide by tp_size."""
    for name, v in (
        ("num_attention_heads", cfg.num_heads),
        ("num_key_value_heads", cfg.num_kv_heads),
        ("intermediate_size", cfg.intermediate_size),
        ("moe_intermediate_size", cfg.moe_intermediate_size),
        ("shared_expert_intermediate_size", cfg.shared_expert_intermediate_size),
    ):
        if v % tp_size:
            raise InvalidArgumentError(
                f"tensor_parallel_size={tp_size}: config.{name}={v} is not divisible by it"
            )


def shard(t: torch.Tensor, dim: int, rank: int, size: int) -> torch.Tensor:
    """Rank `rank`'s contiguous 1/size slice of `t` along `dim` (`size` must divide it)."""
    if size == 1:
        return t
    n = t.shape[dim]
    if n % size:
        raise InvalidArgumentError(
            f"tensor of shape {tuple(t.shape)}: dim {dim} ({n}) does not split {size} ways"
        )
    k = n // size
    return t.narrow(dim, rank * k, k)


def all_reduce(x: torch.Tensor, size: int) -> torch.Tensor:
    """Sum `x` over the default group, in place (a no-op at size 1)."""
    if size > 1:
        import torch.distributed as dist

        dist.all_reduce(x)
    return x


def broadcast(x: torch.Tensor, size: int, src: int = 0) -> torch.Tensor:
    """Rank `src`'s `x` on every rank, in place (a no-op at size 1)."""
    if size > 1:
        import torch.distributed as dist

        with torch.inference_mode(x.is_inference()):
            dist.broadcast(x, src)
    return x


def tp_kv_cache_params(params, tp_size: int):
    """The `KVCacheParams` of one rank's cache: the model's `params` with this rank's KV and
    query heads (n_kv_heads / tp_size, num_q_heads / tp_size); every rank's manager keeps the
    same page ids, each rank's pages hold its KV-head shard."""
    import dataclasses

    if tp_size == 1:
        return params
    return dataclasses.replace(
        params,
        n_kv_heads=params.n_kv_heads // tp_size,
        num_q_heads=params.num_q_heads // tp_size,
    )


__all__ = [
    "all_reduce",
    "backend",
    "broadcast",
    "check_divisible",
    "check_tp",
    "dist_ready",
    "rank",
    "shard",
    "tp_kv_cache_params",
    "world_size",
]
