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


@functools.cache
def nvmma_16b_cols(cols: int):
    """The rank-2 shared layout of 16-bit elements for rows of `cols` columns: swizzled over
    the row's bytes up to 128 (a 32-column row is 64 bytes: a 64-byte swizzle), built once."""
    return gl.NVMMASharedLayout(swizzle_byte_width=min(128, 2 * cols), element_bitwidth=16, rank=2)


__all__ = [
    "GluonTensorDescriptor",
    "nvmma_16b_cols",
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
