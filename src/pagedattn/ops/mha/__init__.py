"""mha: MHA/GQA/MQA attention of ragged queries over any K/V operand (docs/ops.md, `mha`).

One call serves prefill, chunked prefill (new tokens over a cached prefix) and decode, over
paged (BF16/FP16/FP32 or FP8 blockwise, per-token, per-tensor), dense, continuous-batching and
ragged operands, with any mask of `ops.masks`, attention sinks, split-K and an optional LSE.

`mha` validates its arguments' types, shapes, dtypes and devices (no host sync, so it stays
CUDA-graph safe) and dispatches with `ops.dispatch.choose_backend`: the Triton kernels on CUDA,
`mha_reference` elsewhere. The reference additionally checks values that need the host
(offsets, cache lengths, lookup-table reach); on CUDA those device values are the kernels'
to guard. Every bad argument, a call that does not bind included, raises
`InvalidArgumentError` naming it before anything is written.

Host path: a call on the Triton backend (decode, prefill, a mixed step's two parts, with or
without a step plan) is validated and planned once per call signature
(`triton_mha.PreparedMHA`, `ops.prepared`): a later call of the same signature (the same
shapes, strides, dtypes, devices, operand formats, mask, scale, flags, num_decodes, whether a
plan is given, and environment; any tensors, any step plan) skips the checks and the plan
and launches the frozen kernels with its own tensors (and its step plan's buffer). A call
whose signature never validated takes the full path, so bad arguments raise exactly as
without the cache; `triton_mha.mha_triton` is the same op without it.
"""

from __future__ import annotations

import math

import torch

from ...errors import InvalidArgumentError, Lazy, check
from ...operands import RowOperand
from .._checks import (
    INT32_MAX,
    Described,
    check_head_vector,
    check_num_partitions,
    check_out,
    check_scale,
    typed_binding,
)
from ..dispatch import choose_backend
from ..masks import Mask, causal
from ..prepared import MISS, UNPREPARED
from .reference import mha_reference
from .step_plan import StepPlan

Q_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
MHA_QUANT_FORMATS = (None, "blockwise", "per_tensor")
_CAUSAL = causal()  # the default mask (immutable)
_prepared = None  # triton_mha.PREPARED, once a call has taken the Triton backend


def _check_operand(op: object, name: str, q: torch.Tensor) -> None:
    """k or v: a RowOperand of an MHA format on q's device, in q's dtype unless quantized.
    (Messages are `Lazy`: formatting them cost several us a call.)"""
    check(
        isinstance(op, RowOperand),
        name,
        "an MHAOperand (PagedOperand, DenseOperand, ContinuousBatchingOperand, RaggedOperand)",
        Lazy(lambda: type(op).__name__),
    )
    check(
        op.quant_format in MHA_QUANT_FORMATS,
        Lazy(lambda: f"{name}.quant_format"),
        Lazy(lambda: f"one of {MHA_QUANT_FORMATS} (packed MLA formats are for mla_decode)"),
        Lazy(lambda: repr(op.quant_format)),
    )
    if not op.quantization_enabled:
        check(
            op.dtype == q.dtype,
            Lazy(lambda: f"{name}.dtype"),
            Lazy(lambda: f"q.dtype={q.dtype}"),
            Lazy(lambda: op.dtype),
        )
    check(
        op.rows.device == q.device and op.cache_lengths.device == q.device,
        Lazy(lambda: f"{name}.device"),
        Lazy(lambda: f"q.device={q.device} (its rows and cache lengths)"),
        Lazy(lambda: f"{op.rows.device}, {op.cache_lengths.device}"),
    )
    check(op.num_heads >= 1, name, "at least one KV head", Lazy(lambda: f"{op.num_heads} heads"))


def _check_mask(mask: object, q: torch.Tensor) -> Mask:
    """The resolved mask (None = causal): a Mask whose window / chunk is an int in
    [1, 2^31 - 1] where its kind takes one, and whose tensor is a bool [total_q, max_keys >= 1]
    tensor on q's device."""
    mask = _CAUSAL if mask is None else mask
    check(isinstance(mask, Mask), "mask", "a pagedattn.ops.masks.Mask or None", Described(mask))
    kind = mask.kind
    if kind == "causal" or kind == "null":
        return mask
    if kind == "tensor":
        t = mask.tensor
        check(
            isinstance(t, torch.Tensor)
            and t.dtype == torch.bool
            and t.ndim == 2
            and t.shape[0] == q.shape[0]
            and t.shape[1] >= 1
            and t.device == q.device,
            "mask.tensor",
            Lazy(lambda: f"a bool [total_q={q.shape[0]}, max_keys >= 1] tensor on {q.device}"),
            Described(t),
        )
        return mask
    field = "chunk" if kind == "chunked_causal" else "window"
    v = getattr(mask, field)
    check(
        isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= INT32_MAX,
        Lazy(lambda: f"mask.{field}"),
        Lazy(lambda: f"an int in [1, {INT32_MAX}]"),
        Lazy(lambda: repr(v)),
    )
    return mask


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
        Described(q),
    )
    check(q.dtype in Q_DTYPES, "q.dtype", Lazy(lambda: f"one of {Q_DTYPES}"), Lazy(lambda: q.dtype))
    total_q, h_q, d_qk = q.shape
    _check_operand(k, "k", q)
    _check_operand(v, "v", q)
    h_kv = k.num_heads
    check(
        v.num_heads == h_kv,
        "v",
        Lazy(lambda: f"{h_kv} heads like k"),
        Lazy(lambda: f"{v.num_heads} heads"),
    )
    check(
        k.head_dim == d_qk,
        "k",
        Lazy(lambda: f"head_dim d_qk={d_qk} (q.shape[-1])"),
        Lazy(lambda: k.head_dim),
    )
    check(
        h_q >= 1 and h_q % h_kv == 0,
        "q",
        Lazy(
            lambda: f"a head count h_q that is a positive multiple of the operands' {h_kv} KV heads"
        ),
        Lazy(lambda: f"h_q={h_q}"),
    )
    batch = k.batch_size
    check(
        v.batch_size == batch,
        "v",
        Lazy(lambda: f"batch size {batch} like k"),
        Lazy(lambda: f"batch size {v.batch_size}"),
    )
    check(
        isinstance(q_row_offsets, torch.Tensor)
        and q_row_offsets.dtype == torch.int32
        and q_row_offsets.shape == (batch + 1,)
        and q_row_offsets.device == q.device,
        "q_row_offsets",
        Lazy(
            lambda: f"an int32 tensor of shape ({batch + 1},) (batch + 1 prefix sums) on {q.device}"
        ),
        Described(q_row_offsets),
    )
    mask = _check_mask(mask, q)
    check_scale(scale)
    check_head_vector(sinks, "sinks", h_q, q.device)
    check_num_partitions(num_partitions)
    check(isinstance(return_lse, bool), "return_lse", "a bool", Lazy(lambda: repr(return_lse)))
    check_out(out, (total_q, h_q, v.head_dim), q)
    return mask


@typed_binding
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
    num_decodes: int | None = None,
    plan: StepPlan | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Attention of ragged queries over a K/V operand (prefill, chunked prefill, decode).

    q: [total_q, h_q, d_qk] bf16/fp16/fp32; query i of request b sits at absolute position
      `cache_length(b) + i` and request b reads `cache_length(b) + q_len(b)` keys (store the new
      tokens' K/V first, with `store_kv`).
    k, v: MHAOperands with h_kv heads, h_q % h_kv == 0 (query head h reads KV head
      h // (h_q // h_kv)); head dims d_qk and d_v. FP8 operands are dequantized on the fly.
    q_row_offsets: [batch + 1] int32 prefix sums of queries per request.
    mask: a `pagedattn.ops.masks` mask on absolute positions (None = causal); a window or
      chunk is an int in [1, 2^31 - 1], a tensor mask a bool [total_q, max_keys >= 1] tensor.
    scale: softmax scale, a finite float > 0 (None = 1/sqrt(d_qk)).
    sinks: [h_q] float32 logits joining the softmax denominator only (+inf gives output 0).
    num_partitions: split-K: each request's keys in P contiguous chunks, merged by LSE
      (None or an int in [1, 65535]; None: the dispatcher's choice).
    return_lse: also return the float32 [total_q, h_q] natural-log LSE over keys (sink left
      out; -inf for a query that sees no key, whose output is 0).
    out: optional preallocated [total_q, h_q, d_v] buffer in q.dtype, returned filled.
    backend: "triton" or "reference" (default: by device, or $PAGEDATTN_BACKEND).
    num_decodes: a mixed step's layout, as a serving engine orders it: its first num_decodes
      requests have one query each (q rows 0 .. num_decodes - 1; q_row_offsets[i] == i for
      i <= num_decodes), the others are prefill chunks. An int in [0, min(batch, total_q)] or
      None (no hint). The Triton path then runs the decodes on the decode kernel's balanced
      work list and the chunks on the prefill kernel (two launches over views, no copy);
      without it a mixed step runs every request on the prefill kernel. The result does not
      depend on it. The reference checks it against the host offsets; on CUDA the offsets
      are the caller's to keep true (a device value, not read).
    plan: a `StepPlan` shared by the step's layers, or None. The Triton decode launches over
      causal or unmasked rows then take their balanced work list from a plan made once for
      the step (on the host from its lengths, or by one small launch; docs/ops.md "The step's
      plan") instead of deriving one in every program. The result does not depend on it
      (within rounding, as with num_partitions); a plan made for other lengths of the same
      batch stays correct (only less balanced). The reference and `torch.compile` ignore it.

    Returns out [total_q, h_q, d_v] in q.dtype, or (out, lse).

    Raises InvalidArgumentError naming the argument (a missing or unknown one included) for a
    bad type, dtype, shape, device or host value, before anything is written.
    """
    global _prepared
    compiling = torch.compiler.is_compiling()
    hit = MISS
    if plan is not None and not isinstance(plan, StepPlan):
        raise InvalidArgumentError(f"plan: expected a StepPlan or None, got {type(plan).__name__}")
    if _prepared is not None and not compiling:
        hit = _prepared(
            q, k, v, q_row_offsets, mask, scale, sinks, num_partitions, return_lse, out, backend,
            num_decodes, plan,
        )  # fmt: skip
        if hit is not MISS and hit is not UNPREPARED:
            return hit
    given_mask = mask
    mask = _validate(q, k, v, q_row_offsets, mask, scale, sinks, num_partitions, return_lse, out)
    batch, total_q = q_row_offsets.shape[0] - 1, q.shape[0]
    check(
        num_decodes is None or isinstance(num_decodes, int) and not isinstance(num_decodes, bool)
        and 0 <= num_decodes <= min(batch, total_q),
        "num_decodes",
        Lazy(lambda: f"None or an int in [0, {min(batch, total_q)}] (min(batch, total_q))"),
        Lazy(lambda: repr(num_decodes)),
    )  # fmt: skip
    kwargs = dict(mask=mask, scale=scale, sinks=sinks, num_partitions=num_partitions,
                  return_lse=return_lse, out=out)  # fmt: skip
    if compiling:  # (num_decodes and the plan are for the eager launcher)
        from ..compiled import mha_compiled

        if scale is None:
            kwargs["scale"] = 1.0 / math.sqrt(q.shape[-1])
        return mha_compiled(q, k, v, q_row_offsets, backend=backend, **kwargs)
    if choose_backend(q.device, backend) == "triton":
        from .triton_mha import PREPARED, mha_mixed_triton

        if hit is UNPREPARED:
            return mha_mixed_triton(q, k, v, q_row_offsets, num_decodes or 0, plan=plan, **kwargs)
        _prepared = PREPARED
        return PREPARED.prepare(
            q, k, v, q_row_offsets, given_mask, scale, sinks, num_partitions, return_lse, out,
            backend, mask, num_decodes, plan,
        )  # fmt: skip
    if num_decodes:
        head = q_row_offsets[: num_decodes + 1].tolist()
        check(
            head == list(range(num_decodes + 1)),
            "num_decodes",
            Lazy(lambda: f"the first {num_decodes} requests of one query each "
                         f"(q_row_offsets[:{num_decodes + 1}] == 0 .. {num_decodes})"),
            Lazy(lambda: f"q_row_offsets[:{num_decodes + 1}] = {head}"),
        )  # fmt: skip
    return mha_reference(q, k, v, q_row_offsets, **kwargs)


__all__ = ["StepPlan", "mha", "mha_reference"]
