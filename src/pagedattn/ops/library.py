"""torch.library custom ops, so that the attention ops work under torch.compile.

Registers `pagedattn::mha` and `pagedattn::mla_decode`. Operands are Python objects, so each
op takes its operands flattened into tensors and ints (`operands.flatten_operand`) and runs the
eager implementation (`ops.mha.mha`, `ops.mla.mla_decode`) on them. The public functions reach
these ops through `ops.compiled` while torch.compile traces, and no op imports this module:
the package imports it (`pagedattn/__init__.py`). The ops only write caller-provided outputs,
so their fake implementations allocate nothing.
"""

from __future__ import annotations

import torch

from ..operands import unflatten_operand
from .masks import MASK_CODES, Mask
from .mha import mha
from .mla import mla_decode

_MASK_KINDS = {v: k for k, v in MASK_CODES.items()}


def mask_from_code(code: int, param: int, tensor: torch.Tensor | None) -> Mask:
    kind = _MASK_KINDS[code]
    if kind.startswith("sliding"):
        return Mask(kind, window=param)
    if kind == "chunked_causal":
        return Mask(kind, chunk=param)
    return Mask(kind, tensor=tensor)


@torch.library.custom_op("pagedattn::mha", mutates_args=("out", "lse"))
def mha_op(
    q: torch.Tensor,
    q_row_offsets: torch.Tensor,
    k_tensors: list[torch.Tensor | None],
    k_ints: list[int],
    k_fmt: str,
    v_tensors: list[torch.Tensor | None],
    v_ints: list[int],
    v_fmt: str,
    mask_code: int,
    mask_param: int,
    mask_tensor: torch.Tensor | None,
    scale: float,
    sinks: torch.Tensor | None,
    num_partitions: int,
    out: torch.Tensor,
    lse: torch.Tensor | None,
    backend: str,
) -> None:
    """pagedattn.mha with flattened operands; writes `out` (and `lse` when given)."""
    res = mha(
        q,
        unflatten_operand(k_tensors, k_ints, k_fmt),
        unflatten_operand(v_tensors, v_ints, v_fmt),
        q_row_offsets,
        mask=mask_from_code(mask_code, mask_param, mask_tensor),
        scale=scale,
        sinks=sinks,
        num_partitions=num_partitions or None,
        return_lse=lse is not None,
        out=out,
        backend=backend or None,
    )
    if lse is not None:
        lse.copy_(res[1])


@mha_op.register_fake
def _(*args) -> None:
    return None


@torch.library.custom_op("pagedattn::mla_decode", mutates_args=("out", "lse"))
def mla_decode_op(
    q: torch.Tensor,
    q_row_offsets: torch.Tensor,
    kv_tensors: list[torch.Tensor | None],
    kv_ints: list[int],
    kv_fmt: str,
    d_v: int,
    scale: float,
    causal: bool,
    indices: torch.Tensor | None,
    topk_lengths: torch.Tensor | None,
    extra_tensors: list[torch.Tensor | None],
    extra_ints: list[int],
    extra_fmt: str,
    extra_indices: torch.Tensor | None,
    extra_topk_lengths: torch.Tensor | None,
    attn_sink: torch.Tensor | None,
    num_partitions: int,
    out: torch.Tensor,
    lse: torch.Tensor,
    backend: str,
) -> None:
    """pagedattn.mla_decode with flattened operands; writes `out` and `lse`."""
    extra = unflatten_operand(extra_tensors, extra_ints, extra_fmt) if extra_ints else None
    _, res_lse = mla_decode(
        q,
        unflatten_operand(kv_tensors, kv_ints, kv_fmt),
        q_row_offsets,
        d_v=d_v,
        scale=scale,
        causal=causal,
        indices=indices,
        topk_lengths=topk_lengths,
        extra_kv=extra,
        extra_indices=extra_indices,
        extra_topk_lengths=extra_topk_lengths,
        attn_sink=attn_sink,
        num_partitions=num_partitions or None,
        out=out,
        backend=backend or None,
    )
    lse.copy_(res_lse)


@mla_decode_op.register_fake
def _(*args) -> None:
    return None
