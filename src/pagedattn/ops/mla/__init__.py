"""mla_decode: MLA decode over a latent KV operand, dense or sparse (docs/ops.md, `mla_decode`).

`mla_decode` validates its arguments' types, shapes, dtypes and devices (metadata only, no host
sync, so it stays CUDA-graph safe) and dispatches with `ops.dispatch.choose_backend`: the
Triton kernel (`triton_mla.mla_decode_triton`) on CUDA, `mla_decode_reference` elsewhere. The
reference additionally checks the values that need the host (row offsets, at most
`MAX_Q_PER_REQUEST` queries a request, cache lengths, lookup-table reach); on CUDA those device
values are the kernels' to guard (invalid sparse indices are skipped). Every bad argument, a
call that does not bind included, raises `InvalidArgumentError` naming it.

Host path: a call on the Triton backend is validated and planned once per call signature
(`triton_mla.PreparedMLA`, `ops.prepared`): a later call of the same signature (the same
shapes, strides, dtypes, devices, operand formats and page geometry, d_v, scale, causal, which
optional tensors are given, num_partitions, the environment and the low four bits of each
pointer; any tensors) skips the checks and the plan and launches the frozen kernels with its
own tensors. A call whose signature never validated takes the full path, so bad arguments
raise exactly as without the cache; `triton_mla.mla_decode_triton` is the same op without it.
"""

from __future__ import annotations

import torch

from ...errors import Lazy, check
from ...operands import RowOperand
from .._checks import Described as _Described
from .._checks import (
    check_head_vector,
    check_num_partitions,
    check_out,
    check_scale,
    is_int,
    typed_binding,
)
from .._checks import check_int32 as _check_int32
from ..dispatch import choose_backend
from ..prepared import MISS, UNPREPARED
from .reference import (
    MAX_Q_PER_REQUEST,
    mla_decode_reference,
)

Q_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
# DeepSeek V2/V3 (512 latent + 64 rope), V4 (448 + 64): every cache format; BF16 / FP16 /
# FP32 caches also take any other d_qk <= MAX_D_QK (kv_lora_rank + rope dim of a checkpoint)
D_QK_VALUES = (576, 512)
MAX_D_QK = 576
MAX_D_V = 512  # V is (part of) the latent: the first d_v <= min(512, d_qk) dims of K
_prepared = None  # triton_mla.PREPARED, once a call has taken the Triton backend


def _check_operand(op: object, name: str, q: torch.Tensor) -> None:
    check(
        isinstance(op, RowOperand),
        name,
        "an MHAOperand (e.g. PagedOperand(inputs, params, layer, 'k') of an MLA cache)",
        type(op).__name__,
    )
    check(op.num_heads == 1, name, "one latent KV head", Lazy(lambda: f"{op.num_heads} heads"))
    check(
        op.head_dim == q.shape[-1],
        Lazy(lambda: f"{name}.head_dim"),
        Lazy(lambda: f"d_qk = q.shape[-1] = {q.shape[-1]}"),
        op.head_dim,
    )
    if not op.quantization_enabled:
        check(
            op.dtype == q.dtype,
            Lazy(lambda: f"{name}.dtype"),
            Lazy(lambda: f"q.dtype={q.dtype}"),
            op.dtype,
        )
    else:
        check(
            op.head_dim in D_QK_VALUES,
            Lazy(lambda: f"{name}.head_dim"),
            Lazy(lambda: f"one of {D_QK_VALUES} for an FP8 cache (BF16 caches take any d_qk)"),
            op.head_dim,
        )
    check(
        op.rows.device == q.device and op.cache_lengths.device == q.device,
        Lazy(lambda: f"{name}.device"),
        Lazy(lambda: f"q.device={q.device} (its rows and cache lengths)"),
        Lazy(lambda: f"{op.rows.device}, {op.cache_lengths.device}"),
    )


def validate_args(
    q: torch.Tensor,
    kv: RowOperand,
    q_row_offsets: torch.Tensor,
    d_v: int,
    scale: float | None,
    causal: bool,
    indices: torch.Tensor | None,
    topk_lengths: torch.Tensor | None,
    extra_kv: RowOperand | None,
    extra_indices: torch.Tensor | None,
    extra_topk_lengths: torch.Tensor | None,
    attn_sink: torch.Tensor | None,
    num_partitions: int | None,
    out: torch.Tensor | None,
    names: dict[str, str] | None = None,
) -> None:
    """Metadata-only checks of every `mla_decode` argument. `names` renames arguments in the
    error messages for callers with their own names (the MLA branch's `d_indices`, ...)."""
    names = names or {}

    def nm(arg: str) -> str:
        return names.get(arg, arg)

    check(
        isinstance(q, torch.Tensor) and q.ndim == 3,
        "q",
        "a [tokens, h_q, d_qk] tensor",
        _Described(q),
    )
    check(q.dtype in Q_DTYPES, "q.dtype", Lazy(lambda: f"one of {Q_DTYPES}"), q.dtype)
    tokens, h_q, d_qk = q.shape
    check(
        1 <= d_qk <= MAX_D_QK,
        "q",
        Lazy(lambda: f"d_qk = q.shape[-1] in [1, {MAX_D_QK}]"),
        Lazy(lambda: tuple(q.shape)),
    )
    check(h_q >= 1, "q", "at least one query head", Lazy(lambda: tuple(q.shape)))
    check(
        is_int(d_v) and 1 <= d_v <= min(MAX_D_V, d_qk),
        "d_v",
        Lazy(lambda: f"an int in [1, {min(MAX_D_V, d_qk)}] (V is the first d_v dims of K)"),
        Lazy(lambda: repr(d_v)),
    )
    _check_operand(kv, "kv", q)
    batch = q_row_offsets.shape[0] - 1 if isinstance(q_row_offsets, torch.Tensor) else -1
    _check_int32(q_row_offsets, nm("q_row_offsets"), (None,), "[batch + 1] prefix-sum", q.device)
    check(batch >= 0, nm("q_row_offsets"), "at least one element", _Described(q_row_offsets))
    if indices is None:
        check(
            kv.batch_size == batch,
            "kv",
            Lazy(lambda: f"batch size {batch} ({nm('q_row_offsets')} has batch + 1 entries)"),
            Lazy(lambda: f"batch size {kv.batch_size}"),
        )
        check(
            topk_lengths is None,
            nm("topk_lengths"),
            "None unless indices is given (sparse mode)",
            _Described(topk_lengths),
        )
    else:
        _check_int32(indices, nm("indices"), (tokens, None), f"[tokens={tokens}, stride]", q.device)
        if topk_lengths is not None:
            _check_int32(topk_lengths, nm("topk_lengths"), (batch,), f"[batch={batch}]", q.device)
    if extra_kv is None:
        for name, t in (
            (nm("extra_indices"), extra_indices),
            (nm("extra_topk_lengths"), extra_topk_lengths),
        ):
            check(t is None, name, "None unless extra_kv is given", _Described(t))
    else:
        _check_operand(extra_kv, "extra_kv", q)
        check(
            extra_indices is not None,
            nm("extra_indices"),
            "a [tokens, stride] int32 tensor when extra_kv is given",
            None,
        )
        _check_int32(
            extra_indices,
            nm("extra_indices"),
            (tokens, None),
            f"[tokens={tokens}, stride]",
            q.device,
        )
        if extra_topk_lengths is not None:
            _check_int32(
                extra_topk_lengths,
                nm("extra_topk_lengths"),
                (batch,),
                f"[batch={batch}]",
                q.device,
            )
    check_scale(scale)
    check(isinstance(causal, bool), "causal", "a bool", type(causal).__name__)
    check_head_vector(attn_sink, nm("attn_sink"), h_q, q.device)
    check_num_partitions(num_partitions, nm("num_partitions"))
    check_out(out, (tokens, h_q, d_v), q)


@typed_binding
def mla_decode(
    q: torch.Tensor,
    kv: RowOperand,
    q_row_offsets: torch.Tensor,
    *,
    d_v: int = 512,
    scale: float | None = None,
    causal: bool = True,
    indices: torch.Tensor | None = None,
    topk_lengths: torch.Tensor | None = None,
    extra_kv: RowOperand | None = None,
    extra_indices: torch.Tensor | None = None,
    extra_topk_lengths: torch.Tensor | None = None,
    attn_sink: torch.Tensor | None = None,
    num_partitions: int | None = None,
    out: torch.Tensor | None = None,
    backend: str | None = None,
    return_lse: bool = True,
) -> tuple[torch.Tensor, torch.Tensor] | torch.Tensor:
    """MLA decode (FlashMLA's `flash_mla_with_kvcache` semantics) over a latent cache.

    q: [tokens, h_q, d_qk] bf16 or fp16 (fp32 runs the reference on any device), d_qk 576
      (V2/V3) or 512 (V4) for
      every cache format, any d_qk in [1, 576] over a BF16 / FP16 / FP32 cache;
      query i of request b sits at absolute position `cache_length(b) + i`, at most
      MAX_Q_PER_REQUEST = 8 queries a request.
    kv: operand of the latent cache, one head of head_dim d_qk (BF16 or any FP8 layout:
      blockwise, per-tensor, rope-aware, FlashMLA V32, MODEL1). V is its first d_v dims.
    q_row_offsets: [batch + 1] int32 prefix sums of query tokens per request.
    d_v: value dims, an int in [1, min(512, d_qk)] (default 512). scale: softmax scale, a
      finite float > 0 (None = 1/sqrt(d_qk)).
    causal: dense mode only; query i sees keys `< cache_length(b) + i + 1`, otherwise all
      `cache_length(b) + q_len(b)` keys.
    indices: sparse mode, [tokens, stride] int32 encoded `block * page_size + offset`
      (`kv.get_tma_row`); entry valid iff its position is `< topk_lengths[b]` and
      `0 <= encoded < num_pages * page_size`; invalid entries (-1, -2^31, one past the end,
      huge) are skipped. No causal mask in sparse mode.
    topk_lengths: [batch] int32 valid entries of each request's index rows (None = all).
    extra_kv / extra_indices / extra_topk_lengths: a second cache (own operand, so its own
      format and scales) attended through its own sparse indices, in the same softmax.
    attn_sink: [h_q] float32 logits joining the denominator only (+inf gives output 0).
    num_partitions: split-K partitions of each request's keys (result does not depend on it):
      None (the dispatcher's choice) or an int in [1, 65535].
    out: optional preallocated [tokens, h_q, d_v] buffer in q.dtype, returned filled.
    backend: "triton" or "reference" (default: by device, or $PAGEDATTN_BACKEND).
    return_lse: a bool; False returns out alone (a prepared Triton call then writes the LSE
      into the stream's workspace instead of allocating it: one `torch.empty` less a call).

    Returns (out [tokens, h_q, d_v] q.dtype, lse [tokens, h_q] float32, natural log over keys
    only; a query that sees no key gets out 0 and lse -inf), or out alone (return_lse False).

    Raises InvalidArgumentError naming the argument (a missing or unknown one included) for a
    bad type, dtype, shape, device or host value, before anything is written.
    """
    global _prepared
    compiling = torch.compiler.is_compiling()
    hit = MISS
    if _prepared is not None and not compiling:
        hit = _prepared(
            q, kv, q_row_offsets, d_v, scale, causal, indices, topk_lengths, extra_kv,
            extra_indices, extra_topk_lengths, attn_sink, num_partitions, out, backend,
            return_lse,
        )  # fmt: skip
        if hit is not MISS and hit is not UNPREPARED:
            return hit
    kwargs = dict(
        d_v=d_v,
        scale=scale,
        causal=causal,
        indices=indices,
        topk_lengths=topk_lengths,
        extra_kv=extra_kv,
        extra_indices=extra_indices,
        extra_topk_lengths=extra_topk_lengths,
        attn_sink=attn_sink,
        num_partitions=num_partitions,
        out=out,
    )
    validate_args(q, kv, q_row_offsets, **kwargs)
    check(isinstance(return_lse, bool), "return_lse", "a bool", Lazy(lambda: repr(return_lse)))
    kwargs["d_v"] = int(d_v)
    if compiling:
        from ..compiled import mla_decode_compiled

        res = mla_decode_compiled(q, kv, q_row_offsets, backend=backend, **kwargs)
    # float32 queries take the reference on every device (the kernels' MMAs are 16-bit)
    elif choose_backend(q.device, backend) == "triton" and q.dtype != torch.float32:
        from .triton_mla import PREPARED, mla_decode_triton

        if hit is UNPREPARED:
            res = mla_decode_triton(q, kv, q_row_offsets, **kwargs)
        else:
            _prepared = PREPARED
            return PREPARED.prepare(
                q, kv, q_row_offsets, d_v, scale, causal, indices, topk_lengths, extra_kv,
                extra_indices, extra_topk_lengths, attn_sink, num_partitions, out, backend,
                return_lse,
            )  # fmt: skip
    else:
        res = mla_decode_reference(q, kv, q_row_offsets, **kwargs)
    return res if return_lse else res[0]


__all__ = [
    "MAX_D_QK",
    "MAX_D_V",
    "MAX_Q_PER_REQUEST",
    "mla_decode",
    "mla_decode_reference",
]
