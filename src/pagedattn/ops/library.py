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
    from .mla import mla_decode

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
def _(
    q,
    q_row_offsets,
    kv_tensors,
    kv_ints,
    kv_fmt,
    d_v,
    scale,
    causal,
    indices,
    topk_lengths,
    extra_tensors,
    extra_ints,
    extra_fmt,
    extra_indices,
    extra_topk_lengths,
    attn_sink,
    num_partitions,
    out,
    lse,
    backend,
) -> None:
    return None


def mla_decode_compiled(
    q,
    kv,
    q_row_offsets,
    *,
    d_v,
    scale,
    causal,
    indices,
    topk_lengths,
    extra_kv,
    extra_indices,
    extra_topk_lengths,
    attn_sink,
    num_partitions,
    out,
    backend,
):
    """The custom-op route of `pagedattn.mla_decode` (used while torch.compile traces)."""
    if out is None:
        out = q.new_empty(q.shape[0], q.shape[1], d_v)
    lse = q.new_empty(q.shape[0], q.shape[1], dtype=torch.float32)
    if scale is None:
        scale = q.shape[-1] ** -0.5
    kt, ki, kf = flatten_operand(kv)
    et, ei, ef = flatten_operand(extra_kv) if extra_kv is not None else ([], [], "")
    torch.ops.pagedattn.mla_decode(
        q,
        q_row_offsets,
        kt,
        ki,
        kf,
        int(d_v),
        float(scale),
        bool(causal),
        indices,
        topk_lengths,
        et,
        ei,
        ef,
        extra_indices,
        extra_topk_lengths,
        attn_sink,
        int(num_partitions or 0),
        out,
        lse,
        backend or "",
    )
    return out, lse
