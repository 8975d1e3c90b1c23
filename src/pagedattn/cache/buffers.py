"""Allocation of the per-device KV buffers."""

from __future__ import annotations

from collections.abc import Sequence
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


def packed_layout(nbytes: Sequence[int]) -> tuple[list[int], int]:
    """The packing of blocks of `nbytes` bytes (ints >= 0) into one buffer: each block's byte
    offset (consecutive, each a multiple of 16: Triton specializes pointers on 16-byte
    alignment, and every offset is then a multiple of any itemsize) and the buffer's size in
    bytes (at least 16)."""
    offs, n = [], 0
    for b in nbytes:
        offs.append(n)
        n += -(-b // 16) * 16
    return offs, max(n, 16)


def _pack_into(packed: np.ndarray, arrays: list[np.ndarray], offs: list[int]) -> None:
    for a, o in zip(arrays, offs):
        packed[o : o + a.nbytes] = a.reshape(-1).view(np.uint8)


def _typed_views(dev: torch.Tensor, arrays: list[np.ndarray], offs: list[int]) -> list:
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


def packed_copy(arrays: list[np.ndarray], copy) -> list[torch.Tensor]:
    """`hosts_to_device`'s packing: the arrays into one uint8 array (`packed_layout`),
    `copy(packed)` -> a uint8 tensor, then a view of it for each array (its dtype, shape)."""
    arrays = [np.ascontiguousarray(a) for a in arrays]
    offs, n = packed_layout([a.nbytes for a in arrays])
    packed = np.zeros(n, np.uint8)
    _pack_into(packed, arrays, offs)
    return _typed_views(copy(packed), arrays, offs)


class StagingRing:
    """Persistent host-to-device staging of packed arrays (`stage`): `depth` slots used in
    turn, each a host buffer (pinned on CUDA), a device buffer of the same size and an event
    recorded after the slot's copy. A stage packs the arrays (`packed_layout`) into the next
    slot's host buffer and copies them into its device buffer with one non_blocking copy:
    no allocation, no pinning, no host sync in the steady state (`hosts_to_device` pins a fresh
    buffer and allocates a device one every call).

    Reuse guard: a slot's host buffer is written again only after its previous copy ran (its
    event, waited for only when it has not completed: with depth 2 an engine that builds step
    n + 1 while step n runs finds step n - 1's copy done). Its device buffer is overwritten by a
    copy queued on the current stream, after whatever the stream already holds: the views a
    stage returns stay valid for the work queued on the same stream before the stage `depth`
    calls later (an engine step's inputs: read by that step's kernels only). Buffers grow to
    the largest stage seen (powers of two from 4 KiB; the caching allocators keep a dropped
    buffer until its queued use is done).

    device: where the arrays go (any device; on the CPU the copy runs at once and there is no
    event). depth: an int >= 1. event: a factory of objects with `record()`, `query()` and
    `synchronize()` (default `torch.cuda.Event` on CUDA, none elsewhere; tests pass fakes)."""

    def __init__(self, device: torch.device | str, depth: int = 2, *, event=None) -> None:
        self.device = torch.device(device)
        self.depth = check_int("depth", depth, 1)
        cuda = self.device.type == "cuda"
        self._event = event if event is not None else (torch.cuda.Event if cuda else None)
        self._pin = cuda
        # per slot: [host uint8 tensor, its numpy view, device uint8 tensor, event or None,
        # whether the event was recorded after the slot's last copy]
        self._slots: list[list] = [[None, None, None, None, False] for _ in range(self.depth)]
        self._next = 0
        self.num_waits = 0  # stages that waited for a slot's previous copy (tests, probes)

    def _buffers(self, slot: list, nbytes: int, device: bool = True) -> None:
        if slot[0] is None or slot[0].numel() < nbytes:
            size = max(4096, 1 << (nbytes - 1).bit_length())
            host = torch.empty(size, dtype=torch.uint8, pin_memory=self._pin)
            slot[0], slot[1], slot[2] = host, host.numpy(), None
        if device and slot[2] is None:
            slot[2] = torch.empty(slot[0].numel(), dtype=torch.uint8, device=self.device)

    def _slot(self) -> list:
        """The next slot, once its previous copy has read its host buffer."""
        slot = self._slots[self._next]
        self._next = (self._next + 1) % self.depth
        if slot[4]:
            if not slot[3].query():
                self.num_waits += 1
                slot[3].synchronize()
            slot[4] = False
        return slot

    def _copied(self, slot: list) -> None:
        """Record the slot's event after the copy just queued."""
        if self._event is None:
            return
        if slot[3] is None:
            slot[3] = self._event()
        if self._pin:  # after the copy, on the stream it was queued on
            slot[3].record(torch.cuda.current_stream(self.device))
        else:
            slot[3].record()
        slot[4] = True

    def stage(self, arrays: Sequence[np.ndarray]) -> list[torch.Tensor]:
        """The arrays (int32 / int64 / float32 / uint8 numpy) on the device, each a view of
        the slot's device buffer with its dtype and shape (class docstring: how long they
        stay valid)."""
        arrays = [np.ascontiguousarray(a) for a in arrays]
        offs, n = packed_layout([a.nbytes for a in arrays])
        slot = self._slot()
        self._buffers(slot, n)
        _pack_into(slot[1], arrays, offs)
        dev = slot[2][:n]
        dev.copy_(slot[0][:n], non_blocking=True)
        self._copied(slot)
        return _typed_views(dev, arrays, offs)

    def copy_into(self, dst: torch.Tensor, nbytes: int, fill) -> None:
        """`fill(host)` writes the first `nbytes` bytes of the next slot's host buffer (a uint8
        numpy array of at least that size); they are then copied, non-blocking, into the
        first `nbytes` bytes of `dst` (a contiguous tensor on this ring's device, of at least
        `nbytes` bytes): a fixed destination, a captured graph's input buffer, instead of the
        slot's own. The same reuse guard as `stage`."""
        slot = self._slot()
        self._buffers(slot, nbytes, device=False)
        fill(slot[1])
        dst.view(-1).view(torch.uint8)[:nbytes].copy_(slot[0][:nbytes], non_blocking=True)
        self._copied(slot)


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
