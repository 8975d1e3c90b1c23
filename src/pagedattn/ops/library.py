"""torch.library custom ops, so that the attention ops work under torch.compile.

Operands are Python objects, so each op is registered with its operands flattened into
tensors and ints (`operands.flatten_operand`). The public functions call these custom ops when
`torch.compiler.is_compiling()`; in eager mode they call the implementation directly (the
dispatcher would add host overhead to every decode step for nothing). The ops only write
caller-provided outputs, so their fake implementations allocate nothing.
"""

from __future__ import annotations

import torch

from ..operands import flatten_operand, unflatten_operand
from .masks import MASK_CODES, Mask

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
    from .mha import mha

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
def _(
    q,
    q_row_offsets,
    k_tensors,
    k_ints,
    k_fmt,
    v_tensors,
    v_ints,
    v_fmt,
    mask_code,
    mask_param,
    mask_tensor,
    scale,
    sinks,
    num_partitions,
    out,
    lse,
    backend,
) -> None:
    return None


def mha_compiled(
    q, k, v, q_row_offsets, *, mask, scale, sinks, num_partitions, return_lse, out, backend
):
    """The custom-op route of `pagedattn.mha` (used while torch.compile traces)."""
    if out is None:
        out = q.new_empty(q.shape[0], q.shape[1], v.head_dim)
    lse = q.new_empty(q.shape[0], q.shape[1], dtype=torch.float32) if return_lse else None
    kt, ki, kf = flatten_operand(k)
    vt, vi, vf = flatten_operand(v)
    torch.ops.pagedattn.mha(
        q,
        q_row_offsets,
        kt,
        ki,
        kf,
        vt,
        vi,
        vf,
        mask.code,
        mask.param,
        mask.tensor,
        float(scale),
        sinks,
        int(num_partitions or 0),
        out,
        lse,
        backend or "",
    )
    return (out, lse) if return_lse else out
