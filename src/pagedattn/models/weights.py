"""`WeightSource`: the checkpoint tensors one model parameter is made of (a module below the
loader and the models, so a model's `checkpoint_source` hook can build them without importing
the loader)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from .parallel import shard


@dataclass(frozen=True)
class WeightSource:
    """The checkpoint tensors one parameter is made of, and how: `combine(tensors)` (None: the
    one tensor as is)."""

    names: tuple[str, ...]
    combine: Callable[[list[torch.Tensor]], torch.Tensor] | None = None
    # Tensor parallelism: each checkpoint tensor's slice `shard_rank` of `shard_size` along
    # `shard_dim` (None: whole), taken before `combine` (models/parallel.py).
    shard_dim: int | None = None
    shard_rank: int = 0
    shard_size: int = 1

    def read(self, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        if self.shard_dim is None or self.shard_size == 1:
            return tensors
        return [shard(t, self.shard_dim, self.shard_rank, self.shard_size) for t in tensors]


__all__ = ["WeightSource"]
