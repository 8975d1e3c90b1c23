"""`KVCacheInputsPerDevice`: the tensors one device's kernels read for one step.

Mirrors MAX's class of the same name (seed `kv_cache_inputs_per_device.txt`): nine fields in a
fixed order, the last five optional. `flatten()` emits them in that order and skips each None;
`unflatten(it, params)` consumes an iterator in lock-step, knowing from the params which optional
fields exist, so that the two round-trip (for example through CUDA-graph static buffers).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, fields

import torch

from ..errors import InvalidArgumentError
from .params import KVCacheParams

FIELD_ORDER = (
    "kv_blocks",
    "cache_lengths",
    "lookup_table",
    "max_lengths",
    "kv_scales",
    "attention_dispatch_metadata",
    "draft_attention_dispatch_metadata",
    "mla_num_partitions",
    "draft_mla_num_partitions",
)
OPTIONAL_FIELDS = FIELD_ORDER[4:]


@dataclass
class KVCacheInputsPerDevice:
    """One device's paged KV cache inputs.

    kv_blocks: [total_num_pages, kv_dim, num_layers, page_size, n_kv_heads_per_device, row_elems]
    cache_lengths: [batch] int32, tokens cached before this step (device).
    lookup_table: [batch, padded_cols] int32 physical page ids; unused entries hold
      `total_num_pages` (device).
    max_lengths: [num_steps, 2] int32 (max_prompt_length, max_cache_length) per step (host).
    kv_scales: FP8 scales matching kv_blocks with `head_dim // G` as last dim, or None.
    attention_dispatch_metadata: MHA [batch, max_prompt_len, num_partitions, max_cache_valid_len]
      or MLA [batch, q_max_seq_len, num_partitions], int64 (device), or None.
    draft_attention_dispatch_metadata: the same for a draft model's step, or None.
    mla_num_partitions / draft_mla_num_partitions: [1] int64 on the host, or None.
    """

    kv_blocks: torch.Tensor
    cache_lengths: torch.Tensor
    lookup_table: torch.Tensor
    max_lengths: torch.Tensor
    kv_scales: torch.Tensor | None = None
    attention_dispatch_metadata: torch.Tensor | None = None
    draft_attention_dispatch_metadata: torch.Tensor | None = None
    mla_num_partitions: torch.Tensor | None = None
    draft_mla_num_partitions: torch.Tensor | None = None

    def flatten(self) -> list[torch.Tensor]:
        """Fields in FIELD_ORDER, skipping each None."""
        return [v for v in (getattr(self, n) for n in FIELD_ORDER) if v is not None]

    def flatten_without_attention_dispatch_metadata(self) -> list[torch.Tensor]:
        skip = ("attention_dispatch_metadata", "draft_attention_dispatch_metadata")
        return [
            getattr(self, n) for n in FIELD_ORDER if n not in skip and getattr(self, n) is not None
        ]

    @staticmethod
    def present_fields(params: KVCacheParams) -> tuple[str, ...]:
        """Names of the fields a manager built from `params` fills, in flatten order."""
        present = {
            "kv_scales": params.has_scale_buffer,
            "attention_dispatch_metadata": params.enable_dispatch_metadata,
            "draft_attention_dispatch_metadata": params.enable_dispatch_metadata
            and params.enable_speculative,
            "mla_num_partitions": params.is_mla and params.enable_dispatch_metadata,
            "draft_mla_num_partitions": params.is_mla
            and params.enable_dispatch_metadata
            and params.enable_speculative,
        }
        return tuple(n for n in FIELD_ORDER if present.get(n, True))

    @classmethod
    def unflatten(cls, it: Iterator[torch.Tensor], params: KVCacheParams) -> KVCacheInputsPerDevice:
        """Inverse of `flatten()`: consumes next(it) once per field that `params` makes present."""
        kwargs = {}
        for name in cls.present_fields(params):
            try:
                kwargs[name] = next(it)
            except StopIteration:
                raise InvalidArgumentError(
                    f"unflatten: iterator ran out before field {name!r}"
                ) from None
        return cls(**kwargs)

    @property
    def batch_size(self) -> int:
        return self.cache_lengths.shape[0]

    def copy_(self, other: KVCacheInputsPerDevice) -> None:
        """Copy `other` into these (static) buffers in place, for CUDA-graph replay.

        Shapes must match; the lookup table may be narrower and is sentinel-padded.
        """
        for f in fields(self):
            dst, src = getattr(self, f.name), getattr(other, f.name)
            if (dst is None) != (src is None):
                raise InvalidArgumentError(f"copy_: field {f.name} is None on one side only")
            if dst is None or dst is src:
                continue
            if f.name == "lookup_table" and src.shape[1] < dst.shape[1]:
                dst[:, : src.shape[1]].copy_(src)
                dst[:, src.shape[1] :].fill_(self.kv_blocks.shape[0])
                continue
            if dst.shape != src.shape:
                raise InvalidArgumentError(
                    f"copy_: field {f.name} has shape {tuple(src.shape)}, "
                    f"expected {tuple(dst.shape)}"
                )
            dst.copy_(src)
