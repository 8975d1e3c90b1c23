"""Layer 1: host-side KV cache management (no kernels)."""

from .block_pool import BlockPool, page_hash
from .buffers import DeviceBuffers, allocate_buffers
from .inputs import FIELD_ORDER, KVCacheInputsPerDevice
from .manager import CacheStats, PagedKVCacheManager
from .params import KVCacheParams, KVQuantConfig

__all__ = [
    "BlockPool",
    "CacheStats",
    "DeviceBuffers",
    "FIELD_ORDER",
    "KVCacheInputsPerDevice",
    "KVCacheParams",
    "KVQuantConfig",
    "PagedKVCacheManager",
    "allocate_buffers",
    "page_hash",
]
