"""`KVCacheInputsPerDevice`: the tensors one device's kernels read for one step.

Mirrors MAX's class of the same name (seed `kv_cache_inputs_per_device.txt`): nine fields in a
fixed order, the last five optional. `flatten()` emits them in that order and skips each None.
Two inverses consume an iterator in lock-step with it, so that the two round-trip (for example
through CUDA-graph static buffers):

- `template.unflatten(it)`, the seed's form: an instance method, where the instance is the
  template that says which optional fields are present; it returns a new instance with a value
  from `it` in each field the template has (and None elsewhere).
- `KVCacheInputsPerDevice.from_flat(it, params)`: the same, with the present fields taken from
  the `KVCacheParams` a manager was built from (`present_fields(params)`).

Both raise `InvalidArgumentError` if `it` is not an iterator, runs out, or yields a value that is
not a tensor. `copy_` refreshes static buffers in place and checks every field before copying any.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch

from ..errors import InvalidArgumentError, check
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
        check(isinstance(params, KVCacheParams), "params", "a KVCacheParams", type(params).__name__)
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
    def _consume(cls, it: Iterator[torch.Tensor], names: tuple[str, ...], where: str):
        check(isinstance(it, Iterator), "it", "an iterator (e.g. iter(flat))", type(it).__name__)
        kwargs = {}
        for name in names:
            try:
                v = next(it)
            except StopIteration:
                raise InvalidArgumentError(
                    f"it: iterator ran out before field {name!r} ({where})"
                ) from None
            if not isinstance(v, torch.Tensor):
                raise InvalidArgumentError(
                    f"it: expected a tensor for field {name!r} ({where}), got {type(v).__name__}"
                )
            kwargs[name] = v
        return cls(**kwargs)

    def unflatten(self, it: Iterator[torch.Tensor]) -> KVCacheInputsPerDevice:
        """Inverse of `flatten()`, MAX's form: `template.unflatten(it)` consumes next(it) once
        for each field present (not None) on the template `self`, in FIELD_ORDER, and returns a
        new instance with those values and None elsewhere. `self` is not changed.

        Raises InvalidArgumentError if `it` is not an iterator, runs out, or yields a value that
        is not a tensor. (Called on the class, `KVCacheInputsPerDevice.unflatten(it, params)`,
        it says to use `from_flat`.)
        """
        if not isinstance(self, KVCacheInputsPerDevice):
            raise InvalidArgumentError(
                "unflatten: an instance method (template.unflatten(it)); to unflatten by params "
                "call KVCacheInputsPerDevice.from_flat(it, params)"
            )
        names = tuple(n for n in FIELD_ORDER if getattr(self, n) is not None)
        return self._consume(it, names, "template.unflatten")

    @classmethod
    def from_flat(cls, it: Iterator[torch.Tensor], params: KVCacheParams) -> KVCacheInputsPerDevice:
        """Inverse of `flatten()` by params: consumes next(it) once per field that
        `present_fields(params)` names. Raises InvalidArgumentError like `unflatten`, and for a
        `params` that is not a KVCacheParams."""
        return cls._consume(it, cls.present_fields(params), "from_flat")

    @property
    def batch_size(self) -> int:
        return self.cache_lengths.shape[0]

    def copy_(self, other: KVCacheInputsPerDevice) -> None:
        """Copy `other` into these (static) buffers in place, for CUDA-graph replay.

        Every field of `other` must be None exactly where this one's is, a tensor of this
        field's dtype, and of its shape, except the lookup table, which may be narrower (same
        rows) and is sentinel-padded. Devices may differ. Every field is checked before any
        is copied: a mismatch raises InvalidArgumentError naming the field and copies nothing.
        """
        check(
            isinstance(other, KVCacheInputsPerDevice),
            "other",
            "a KVCacheInputsPerDevice",
            type(other).__name__,
        )
        todo = []
        for name in FIELD_ORDER:
            dst, src = getattr(self, name), getattr(other, name)
            if (dst is None) != (src is None):
                raise InvalidArgumentError(f"other.{name}: None on one side only")
            if dst is None or dst is src:
                continue
            # (each message formatted only on failure: this runs for every graph replay)
            if not isinstance(src, torch.Tensor):
                check(False, f"other.{name}", "a tensor", type(src).__name__)
            if src.dtype != dst.dtype:
                check(False, f"other.{name}", f"dtype {dst.dtype}", src.dtype)
            if (
                name == "lookup_table"
                and src.ndim == 2
                and dst.ndim == 2
                and src.shape[0] == dst.shape[0]
                and src.shape[1] < dst.shape[1]
            ):
                todo.append((dst, src, True))
                continue
            if src.shape != dst.shape:
                check(
                    False,
                    f"other.{name}",
                    f"shape {tuple(dst.shape)}"
                    + (" (or narrower)" if name == "lookup_table" else ""),
                    tuple(src.shape),
                )
            todo.append((dst, src, False))
        # -- checked; copy --
        for dst, src, narrower in todo:
            if narrower:
                dst[:, : src.shape[1]].copy_(src)
                dst[:, src.shape[1] :].fill_(self.kv_blocks.shape[0])
            else:
                dst.copy_(src)
