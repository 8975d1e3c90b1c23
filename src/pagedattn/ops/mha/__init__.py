"""mha: MHA/GQA/MQA attention of ragged queries over any K/V operand (docs/ops.md, `mha`).

One call serves prefill, chunked prefill (new tokens over a cached prefix) and decode, over
paged (BF16/FP16/FP32 or FP8 blockwise, per-token, per-tensor), dense, continuous-batching and
ragged operands, with any mask of `ops.masks`, attention sinks, split-K and an optional LSE.

`mha` validates its arguments' types, shapes, dtypes and devices (no host sync, so it stays
CUDA-graph safe) and dispatches with `ops.dispatch.choose_backend`: the Triton kernels on CUDA,
`mha_reference` elsewhere. The reference additionally checks values that need the host
(offsets, cache lengths, lookup-table reach).
"""

from __future__ import annotations

import math

import torch

from ...errors import check
from ...operands import RowOperand
from .._checks import check_head_vector, check_num_partitions, check_out, check_scale
from .._checks import describe as _describe
from ..dispatch import choose_backend
from ..masks import Mask, causal
from .reference import mha_reference

Q_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
MHA_QUANT_FORMATS = (None, "blockwise", "per_tensor")


def _check_operand(op: object, name: str, q: torch.Tensor) -> None:
    check(
        isinstance(op, RowOperand),
        name,
        "an MHAOperand (PagedOperand, DenseOperand, ContinuousBatchingOperand, RaggedOperand)",
        type(op).__name__,
    )
    check(
        op.quant_format in MHA_QUANT_FORMATS,
        f"{name}.quant_format",
        f"one of {MHA_QUANT_FORMATS} (packed MLA formats are for mla_decode)",
        op.quant_format,
    )
    if not op.quantization_enabled:
        check(op.dtype == q.dtype, f"{name}.dtype", f"q.dtype={q.dtype}", op.dtype)
    check(op.rows.device == q.device, f"{name}.device", f"q.device={q.device}", op.rows.device)
    check(
        op.cache_lengths.device == q.device,
        f"{name}.cache_lengths.device",
        f"q.device={q.device}",
        op.cache_lengths.device,
    )


def _validate(
    q: torch.Tensor,
    k: RowOperand,
    v: RowOperand,
    q_row_offsets: torch.Tensor,
    mask: Mask | None,
    scale: float | None,
    sinks: torch.Tensor | None,
    num_partitions: int | None,
    return_lse: bool,
    out: torch.Tensor | None,
) -> Mask:
    """Metadata-only checks of every `mha` argument; returns the resolved mask."""
    check(
        isinstance(q, torch.Tensor) and q.ndim == 3,
        "q",
        "a [total_q, h_q, d_qk] tensor",
        _describe(q),
    )
    check(q.dtype in Q_DTYPES, "q.dtype", f"one of {Q_DTYPES}", q.dtype)
    total_q, h_q, d_qk = q.shape
    _check_operand(k, "k", q)
    _check_operand(v, "v", q)
    h_kv = k.num_heads
    check(v.num_heads == h_kv, "v", f"{h_kv} heads like k", f"{v.num_heads} heads")
    check(k.head_dim == d_qk, "k", f"head_dim d_qk={d_qk} (q.shape[-1])", k.head_dim)
    check(
        h_q >= 1 and h_q % h_kv == 0,
        "q",
        f"a head count h_q that is a positive multiple of the operands' {h_kv} KV heads",
        f"h_q={h_q}",
    )
    batch = k.batch_size
    check(
        v.batch_size == batch,
        "v",
        f"batch size {batch} like k",
        f"batch size {v.batch_size}",
    )
    check(
        isinstance(q_row_offsets, torch.Tensor)
        and q_row_offsets.dtype == torch.int32
        and tuple(q_row_offsets.shape) == (batch + 1,),
        "q_row_offsets",
        f"an int32 tensor of shape ({batch + 1},) (batch + 1 prefix sums)",
        _describe(q_row_offsets),
    )
    check(
        q_row_offsets.device == q.device,
        "q_row_offsets.device",
        f"q.device={q.device}",
        q_row_offsets.device,
    )
    mask = causal() if mask is None else mask
    check(isinstance(mask, Mask), "mask", "a pagedattn.ops.masks.Mask or None", _describe(mask))
    if mask.kind == "tensor":
        t = mask.tensor
        check(
            t.shape[0] == total_q and t.device == q.device,
            "mask.tensor",
            f"a bool [total_q={total_q}, max_keys] tensor on {q.device}",
            _describe(t),
        )
    check_scale(scale)
    check_head_vector(sinks, "sinks", h_q, q.device)
    check_num_partitions(num_partitions)
    check(isinstance(return_lse, bool), "return_lse", "a bool", type(return_lse).__name__)
    check_out(out, (total_q, h_q, v.head_dim), q)
    return mask


def mha(
    q: torch.Tensor,
    k: RowOperand,
    v: RowOperand,
    q_row_offsets: torch.Tensor,
    *,
    mask: Mask | None = None,
    scale: float | None = None,
    sinks: torch.Tensor | None = None,
    num_partitions: int | None = None,
    return_lse: bool = False,
    out: torch.Tensor | None = None,
    backend: str | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Attention of ragged queries over a K/V operand (prefill, chunked prefill, decode).

    q: [total_q, h_q, d_qk] bf16/fp16/fp32; query i of request b sits at absolute position
      `cache_length(b) + i` and request b reads `cache_length(b) + q_len(b)` keys (store the new
      tokens' K/V first, with `store_kv`).
    k, v: MHAOperands with h_kv heads, h_q % h_kv == 0 (query head h reads KV head
      h // (h_q // h_kv)); head dims d_qk and d_v. FP8 operands are dequantized on the fly.
    q_row_offsets: [batch + 1] int32 prefix sums of queries per request.
    mask: a `pagedattn.ops.masks` mask on absolute positions (None = causal).
    scale: softmax scale (None = 1/sqrt(d_qk)).
    sinks: [h_q] float32 logits joining the softmax denominator only (+inf gives output 0).
    num_partitions: split-K: each request's keys in P contiguous chunks, merged by LSE.
    return_lse: also return the float32 [total_q, h_q] natural-log LSE over keys (sink left
      out; -inf for a query that sees no key, whose output is 0).
    out: optional preallocated [total_q, h_q, d_v] buffer in q.dtype, returned filled.
    backend: "triton" or "reference" (default: by device, or $PAGEDATTN_BACKEND).

    Returns out [total_q, h_q, d_v] in q.dtype, or (out, lse).
    """
    mask = _validate(q, k, v, q_row_offsets, mask, scale, sinks, num_partitions, return_lse, out)
    kwargs = dict(
        mask=mask,
        scale=scale,
        sinks=sinks,
        num_partitions=num_partitions,
        return_lse=return_lse,
        out=out,
    )
    if torch.compiler.is_compiling():
        from ..compiled import mha_compiled

        if scale is None:
            kwargs["scale"] = 1.0 / math.sqrt(q.shape[-1])
        return mha_compiled(q, k, v, q_row_offsets, backend=backend, **kwargs)
    if choose_backend(q.device, backend) == "triton":
        from .triton_mha import mha_triton

        return mha_triton(q, k, v, q_row_offsets, **kwargs)
    return mha_reference(q, k, v, q_row_offsets, **kwargs)


__all__ = ["mha", "mha_reference"]
