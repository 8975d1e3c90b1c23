"""Allocation of the per-device KV buffers."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..errors import INT32_MAX, InvalidArgumentError, check, check_int
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

    total_num_pages: an int in [1, 2**31 - 1] (the lookup table's int32 sentinel is
    `total_num_pages`); memory_bytes: an int >= one page's bytes; device: a torch.device or a
    str that parses as one (default params.devices[0]). Bad values raise InvalidArgumentError.
    """
    check(isinstance(params, KVCacheParams), "params", "a KVCacheParams", type(params).__name__)
    check(
        (total_num_pages is None) != (memory_bytes is None),
        "total_num_pages/memory_bytes",
        "exactly one of them",
        f"total_num_pages={total_num_pages!r}, memory_bytes={memory_bytes!r}",
    )
    if total_num_pages is None:
        total_num_pages = min(params.pages_for_memory(memory_bytes), INT32_MAX)
    total_num_pages = check_int("total_num_pages", total_num_pages, 1, INT32_MAX)
    if device is None:
        device = params.devices[0]
    elif not isinstance(device, torch.device):
        check(isinstance(device, str), "device", "a torch.device or str", repr(device))
        try:
            device = torch.device(device)
        except (RuntimeError, ValueError) as e:
            raise InvalidArgumentError(f"device: {device!r} is not a device ({e})") from None
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


def hosts_to_device(arrays: list[np.ndarray], device: torch.device) -> list[torch.Tensor]:
    """`host_to_device` of several arrays in one copy: on CUDA they are packed into one byte
    buffer (each at a 16-byte aligned offset, as Triton specializes pointers), staged and
    copied once, and each comes back as
    a view of its dtype and shape (a step's index arrays: one pinned staging and one copy in
    place of one per array, each ~30 us of an H200 host's time a step). Elsewhere: each array
    as a tensor, as `host_to_device`."""
    if device.type != "cuda":
        return [host_to_device(a, device) for a in arrays]
    return packed_copy(arrays, lambda packed: host_to_device(packed, device))


def packed_copy(arrays: list[np.ndarray], copy) -> list[torch.Tensor]:
    """`hosts_to_device`'s packing: the arrays into one uint8 array (16-byte aligned offsets),
    `copy(packed)` -> a uint8 tensor, then a view of it for each array (its dtype, shape)."""
    arrays = [np.ascontiguousarray(a) for a in arrays]
    offs, n = [], 0
    for a in arrays:
        offs.append(n)
        n += -(-a.nbytes // 16) * 16
    packed = np.zeros(max(n, 16), np.uint8)
    for a, o in zip(arrays, offs):
        packed[o : o + a.nbytes] = a.reshape(-1).view(np.uint8)
    dev = copy(packed)
    # The buffer viewed once per dtype (every offset is a multiple of 16 bytes, so of each
    # itemsize), each array a slice of its dtype's view: fewer tensor ops than a byte slice
    # and two views per array.
    typed: dict[str, torch.Tensor] = {}
    out = []
    for a, o in zip(arrays, offs):
        t = typed.get(a.dtype.str)
        if t is None:
            t = typed[a.dtype.str] = dev.view(_TORCH_DTYPE[a.dtype.str])
        start = o // a.itemsize
        v = t[start : start + a.size]
        out.append(v if a.ndim == 1 else v.view(a.shape))
    return out


_TORCH_DTYPE = {"<i8": torch.int64, "<i4": torch.int32, "<f4": torch.float32, "|u1": torch.uint8}


def host_to_device(a: np.ndarray, device: torch.device) -> torch.Tensor:
    """A host array on `device` without syncing the host: on CUDA it is staged in pinned
    memory (PyTorch's caching host allocator keeps the block until the copy ran) and copied
    with non_blocking, so the copy queues behind the work already on the stream while the host
    goes on (an engine that schedules step n+1 while step n runs needs that); a pageable source
    may make the copy wait for the stream. Elsewhere: the array as a tensor (shared memory)."""
    a = np.ascontiguousarray(a)
    if device.type != "cuda":
        return torch.from_numpy(a)
    staged = torch.from_numpy(a).pin_memory()
    return staged.to(device, non_blocking=True)
