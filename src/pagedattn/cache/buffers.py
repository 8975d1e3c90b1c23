"""Allocation of the per-device KV buffers."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import check
from .params import KVCacheParams


@dataclass
class DeviceBuffers:
    """The KV buffers of one device: `kv_blocks` and, for scaled FP8 formats, `kv_scales`."""

    kv_blocks: torch.Tensor
    kv_scales: torch.Tensor | None


def allocate_buffers(
    params: KVCacheParams,
    total_num_pages: int | None = None,
    *,
    memory_bytes: int | None = None,
    device: torch.device | str | None = None,
) -> DeviceBuffers:
    """Allocate one device's buffers, sized by a page count or by a memory budget in bytes.

    Blocks are left uninitialised (`torch.empty`): kernels must never read a slot no lookup
    table entry and cache length make valid. Per-tensor scales start at 1.0.
    """
    check(
        (total_num_pages is None) != (memory_bytes is None),
        "total_num_pages/memory_bytes",
        "exactly one of them",
        f"total_num_pages={total_num_pages}, memory_bytes={memory_bytes}",
    )
    if total_num_pages is None:
        total_num_pages = params.pages_for_memory(memory_bytes)
    check(
        isinstance(total_num_pages, int) and total_num_pages >= 1,
        "total_num_pages",
        "an int >= 1",
        total_num_pages,
    )
    device = torch.device(device) if device is not None else params.devices[0]
    blocks = torch.empty(
        params.blocks_shape(total_num_pages), dtype=params.storage_dtype, device=device
    )
    scales = None
    shape = params.scales_shape(total_num_pages)
    if shape is not None:
        if params.quant_format == "per_tensor":
            scales = torch.ones(shape, dtype=torch.float32, device=device)
        else:
            scales = torch.empty(shape, dtype=params.scale_dtype, device=device)
    return DeviceBuffers(blocks, scales)
