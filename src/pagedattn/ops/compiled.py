"""How the public ops reach their torch.library custom ops while torch.compile traces.

`mha` and `mla_decode` call these routes when `torch.compiler.is_compiling()` (in eager mode
they run their implementation directly: the dispatcher would add host overhead to every decode
step for nothing). A route flattens the operands into tensors and ints
(`operands.flatten_operand`), allocates the outputs and calls `torch.ops.pagedattn.<op>`.

The custom ops themselves are registered by `ops.library`, which imports the ops (not the
other way round); the package imports it (`pagedattn/__init__.py`), so they exist whenever an
op can be called.
"""

from __future__ import annotations

import torch

from ..operands import flatten_operand


def mha_compiled(
    q, k, v, q_row_offsets, *, mask, scale, sinks, num_partitions, return_lse, out, backend
):
    """The custom-op route of `pagedattn.mha` (`scale` already resolved)."""
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


def mla_decode_compiled(
    q, kv, q_row_offsets, *, d_v, scale, extra_kv, num_partitions, out, backend, **rest
):
    """The custom-op route of `pagedattn.mla_decode`; `rest`: its `causal`, `indices`,
    `topk_lengths`, `extra_indices`, `extra_topk_lengths` and `attn_sink` arguments."""
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
        bool(rest["causal"]),
        rest["indices"],
        rest["topk_lengths"],
        et,
        ei,
        ef,
        rest["extra_indices"],
        rest["extra_topk_lengths"],
        rest["attn_sink"],
        int(num_partitions or 0),
        out,
        lse,
        backend or "",
    )
    return out, lse
