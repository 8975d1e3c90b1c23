"""Drop-in compatibility layers over pagedattn's ops (docs/compat.md).

- `pagedattn.compat.flashinfer`: FlashInfer's `BatchDecodeWithPagedKVCacheWrapper` and
  `BatchPrefillWithPagedKVCacheWrapper` (FlashInfer 0.6 signatures, NHD/HND caches).
- `pagedattn.compat.flash_mla`: FlashMLA's `get_mla_metadata` / `flash_mla_with_kvcache`
  (dense and sparse MLA decode, BF16 and FP8 V32/MODEL1 caches).

Both build pagedattn operands over the caller's cache memory (no copy where the layout allows)
and dispatch to `pagedattn.ops.mha.mha` / `pagedattn.ops.mla.mla_decode`. Import the submodules
directly: `from pagedattn.compat import flashinfer, flash_mla`.
"""

from __future__ import annotations

from ..errors import InvalidArgumentError


class UnsupportedFeatureError(InvalidArgumentError, NotImplementedError):
    """A feature of the peer library that the compat layer does not implement.

    Derives from `InvalidArgumentError` (and so `PagedAttnError`, `ValueError`) and from
    `NotImplementedError`; the message names the argument and the reason.
    """


__all__ = ["UnsupportedFeatureError"]
