"""`BranchArgs`: the arguments of one `mla_decode_branch_fp8` call, as its backends take them.

The public `mla_decode_branch_fp8` builds one (fields in its signature's order) and validates it
before any backend sees it; `mla_decode_branch_fp8_reference(args)` and
`mla_decode_branch_fp8_triton(args)` take it instead of repeating the seed's 24 parameters.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from ...cache.inputs import KVCacheInputsPerDevice
from ...cache.params import KVCacheParams
from ...operands import PagedOperand, RowOperand
from ..masks import Mask


class BranchArgs(NamedTuple):
    """One branch call's arguments (see `mla_decode_branch_fp8` for each one's contract).

    `mask` is 'causal' / 'null' or a `Mask` of those kinds (`causal` resolves it); the derived
    sizes (`qk_nope_dim`, `kv_lora_rank`, `d_v`, `v_head_dim`) read the weights' shapes.
    Immutable: a NamedTuple, not a frozen dataclass, whose __init__ (one object.__setattr__ a
    field) made the record ~10x dearer to build than the keyword call it replaces.
    """

    q: torch.Tensor
    input_row_offsets: torch.Tensor
    freqs_cis: torch.Tensor
    kv_norm_gamma: torch.Tensor
    kv_inputs: KVCacheInputsPerDevice
    params: KVCacheParams
    layer_idx: int
    scale: float
    epsilon: float
    w_uk: torch.Tensor
    w_uk_scale: torch.Tensor
    w_uv: torch.Tensor
    w_uv_scale: torch.Tensor
    new_kv: torch.Tensor
    k_gran: int
    n_gran: int
    mask: str | Mask
    interleaved_rope: bool
    d_indices: torch.Tensor | None
    topk_lengths: torch.Tensor | None
    attn_sink: torch.Tensor | None
    extra_kv: RowOperand | None
    extra_d_indices: torch.Tensor | None
    extra_topk_lengths: torch.Tensor | None
    num_partitions: int | None
    out: torch.Tensor | None

    @property
    def mask_kind(self) -> object:
        """`mask`'s kind: the string itself, or the `Mask`'s `kind`."""
        return self.mask.kind if isinstance(self.mask, Mask) else self.mask

    @property
    def causal(self) -> bool:
        """The decode's causal flag."""
        return self.mask_kind == "causal"

    @property
    def qk_nope_dim(self) -> int:
        return self.w_uk.shape[2]

    @property
    def kv_lora_rank(self) -> int:
        return self.params.head_dim - self.params.mla_rope_dim

    @property
    def d_v(self) -> int:
        """Value dims of the decode (w_uv's last dim)."""
        return self.w_uv.shape[2]

    @property
    def v_head_dim(self) -> int:
        """Last dim of the branch's output (w_uv's rows)."""
        return self.w_uv.shape[1]

    def cache(self) -> PagedOperand:
        """The layer's K operand of the paged MLA cache (the decode's and the store's)."""
        return PagedOperand(self.kv_inputs, self.params, self.layer_idx, "k")

    def decode_kwargs(self) -> dict[str, object]:
        """Step 4's `mla_decode` keyword arguments under its own names, except `num_partitions`
        (validation takes the given value, the backends `decode_num_partitions()`)."""
        return {
            "d_v": self.d_v,
            "scale": self.scale,
            "causal": self.causal,
            "indices": self.d_indices,
            "topk_lengths": self.topk_lengths,
            "extra_kv": self.extra_kv,
            "extra_indices": self.extra_d_indices,
            "extra_topk_lengths": self.extra_topk_lengths,
            "attn_sink": self.attn_sink,
        }

    def decode_num_partitions(self) -> int | None:
        """Step 4's split-K partitions: `num_partitions`; when None, the first value of
        kv_inputs.mla_num_partitions (a host tensor) if present, else None (the decode's
        default)."""
        if self.num_partitions is None and self.kv_inputs.mla_num_partitions is not None:
            return int(self.kv_inputs.mla_num_partitions.reshape(-1)[0])
        return self.num_partitions


__all__ = ["BranchArgs"]
