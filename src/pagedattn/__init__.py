"""pagedattn: paged KV cache and fast attention (MHA/GQA, MLA, FP8) for LLM inference.

Layers (each imports only those below it; tests/test_layers.py checks it):
  0. `errors`, `env`, `fp8`   - typed errors, the PAGEDATTN_* variables, FP8 formats (bytes <->
                                tensors)
  1. `cache`                  - KVCacheParams, page pool, PagedKVCacheManager, inputs per device,
                                the host-side split-K plan, FlashMLA cache interop
  2. `operands`               - the MHAOperand protocol and its implementations
  3. `ops`                    - reference + Triton ops behind one dispatcher
  4. `compat`, `demo`, `cli`, `testing` - integration: FlashInfer / FlashMLA drop-in layers, the
                                demo and its command line, test utilities over the cache
This module (the package's namespace, in layer 4) re-exports the public names of layers 0-3.
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
from .ops import library as _library  # noqa: F401 - registers the ops' torch.library custom ops
from .ops import masks
from .ops.store_kv import gather_kv, store_kv

_LAZY = {
    "mha": "pagedattn.ops.mha",
    "StepPlan": "pagedattn.ops.mha",
    "mla_decode": "pagedattn.ops.mla",
    "fp8_bmm": "pagedattn.ops.linear",
    "mla_decode_branch_fp8": "pagedattn.ops.mla_branch",
}


def __getattr__(name: str):
    """The ops import on first use (`mha` and `mla_decode` are already loaded by `ops.library`)."""
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
