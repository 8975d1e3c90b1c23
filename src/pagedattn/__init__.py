"""pagedattn: paged KV cache and fast attention (MHA/GQA, MLA, FP8) for LLM inference.

Layers (each imports only those below it):
  0. `errors`, `fp8`          - typed errors, FP8 formats
  1. `cache`                  - KVCacheParams, page pool, PagedKVCacheManager, inputs per device
  2. `operands`               - the MHAOperand protocol and its implementations
  3. `ops`                    - reference + Triton ops behind one dispatcher
  4. `models`, `engine`, `cli`, `compat` - integration
"""

from importlib import import_module

from .cache import (
    CacheStats,
    KVCacheInputsPerDevice,
    KVCacheParams,
    KVQuantConfig,
    PagedKVCacheManager,
)
from .errors import (
    CapacityError,
    DuplicateRequestError,
    InvalidArgumentError,
    MaxLengthExceededError,
    OutOfPagesError,
    PagedAttnError,
    UnknownRequestError,
)
from .operands import (
    ContinuousBatchingOperand,
    DenseOperand,
    MHAOperand,
    PagedOperand,
    RaggedOperand,
    ScalesOperand,
)
from .ops import masks
from .ops.store_kv import gather_kv, store_kv

_LAZY = {
    "mha": "pagedattn.ops.mha",
    "mla_decode": "pagedattn.ops.mla",
    "fp8_bmm": "pagedattn.ops.linear",
    "mla_decode_branch_fp8": "pagedattn.ops.mla_branch",
}


def __getattr__(name: str):
    """The attention ops import lazily, so the cache layer stays light to import."""
    if name in _LAZY:
        return getattr(import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'pagedattn' has no attribute {name!r}")


__all__ = [
    "CacheStats",
    "CapacityError",
    "ContinuousBatchingOperand",
    "DenseOperand",
    "DuplicateRequestError",
    "InvalidArgumentError",
    "KVCacheInputsPerDevice",
    "KVCacheParams",
    "KVQuantConfig",
    "MHAOperand",
    "MaxLengthExceededError",
    "OutOfPagesError",
    "PagedAttnError",
    "PagedKVCacheManager",
    "PagedOperand",
    "RaggedOperand",
    "ScalesOperand",
    "UnknownRequestError",
    "gather_kv",
    "masks",
    "store_kv",
    *_LAZY,
]
__version__ = "0.1.0"
