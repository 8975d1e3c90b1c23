"""The Gluon names the sm_90 kernels use (Triton's experimental Hopper dialect: shared-memory
descriptors, cp.async, TMA with mbarriers, wgmma). HAS_GLUON is False on a Triton without
Gluon; the kernels are then not defined and their dispatchers fall back to the tl kernels."""

from __future__ import annotations

import functools

try:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.ampere import async_copy as cp
    from triton.experimental.gluon.language.nvidia.hopper import (
        fence_async_shared,
        mbarrier,
        tma,
        warpgroup_mma,
        warpgroup_mma_wait,
    )
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor as GluonTensorDescriptor

    HAS_GLUON = True
except ImportError:  # pragma: no cover - older Triton
    gluon = gl = cp = fence_async_shared = warpgroup_mma = warpgroup_mma_wait = None
    mbarrier = tma = GluonTensorDescriptor = None
    HAS_GLUON = False


@functools.cache
def nvmma_128b(rank: int = 2):
    """The 128-byte-swizzled shared layout of 16-bit elements of the given rank (Gluon TMA
    boxes, wgmma operands), built once: its constructor costs ~6 us of host time, paid on
    every eager launch that builds a descriptor (2-core CI-class CPU)."""
    return gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=rank)


__all__ = [
    "GluonTensorDescriptor",
    "HAS_GLUON",
    "cp",
    "fence_async_shared",
    "gl",
    "gluon",
    "mbarrier",
    "nvmma_128b",
    "tma",
    "warpgroup_mma",
    "warpgroup_mma_wait",
]
