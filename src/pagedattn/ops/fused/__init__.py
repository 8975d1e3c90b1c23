"""Fused element-wise ops of the decoder layers: one launch each on CUDA where the torch
modules they replace run several kernels a layer (measured on the H200, Llama-3-8B shape,
b64 decode replay: 353 binary element-wise, 192 add, 65 mean-reduce and 67 copy kernels,
2.2 ms of the step's 8.5 ms of kernels; docs/kernels/model_layers.md).

- `rms_norm(x, weight, eps, residual=None, *, weight_first=False)`: x [T, H] (any float
  dtype), weight [H] (x's dtype, or float32 with weight_first). Without a residual returns
  RMSNorm(x); with one returns (RMSNorm(residual + x), residual + x), the sum in x's dtype.
  weight_first=False is LlamaRMSNorm's `weight * normed.to(dtype)`; True is GptOssRMSNorm's
  `(weight * normed).to(dtype)`. Statistics in float32.
- `rope_qkv(qkv, cos, sin, h_q, h_kv, *, q_norm=None, k_norm=None, eps=0.0)`: qkv [T,
  (h_q + 2 h_kv) d] (a fused q|k|v projection, rows contiguous), cos/sin [T, d // 2] in
  qkv's dtype. Returns contiguous q [T, h_q, d], k [T, h_kv, d] with neox (rotate-half) RoPE,
  after a per-head RMSNorm when q_norm / k_norm [d] are given (Qwen3), and v [T, h_kv, d].
  d even.
- `silu_mul(gate_up)`: gate_up [T, 2 I] -> silu(gate) * up [T, I].
- `argmax_rows(x)`: x [n, V] float -> [n] int64, each row's index of its largest value, as
  `torch.argmax(x, -1)`: the first of equal maxima, a row's first NaN where it has one, 0 for a
  row of -inf (the engine's greedy tokens; on the H200 torch's argmax of 64 x 128256 float32
  logits took ~35 us, 0.9 TB/s). On CUDA a row is cut into spans until the grid fills the
  SMs (`triton_fused.argmax_plan`), then a second launch merges each row's spans.
- `sample_rows(x, temperature, seeds, counters)`: x [n, V] float, temperature [n] float32,
  seeds / counters [n] int64 -> [n] int64: where temperature > 0, the argmax of x / t + g
  (float32; g = -log(-log(u)), u the counter-based uniform of (seed, counter, column),
  `reference.uniform_noise`: a Gumbel-max draw from softmax(x / t)); elsewhere argmax_rows'
  answer. The engine's sampler. The Triton path scores each column as it reads it (the same
  integer hash, IEEE division and logs: it equals the reference except where a row's two
  best scores are within a rounding of the logs).
  With `top_k` ([n] int64) and / or `top_p` ([n] float32), the argmax runs over the tokens
  they keep of s = x / t (`reference.top_k_top_p_keep`, by value, so tied tokens are kept or
  dropped together): top-k keeps j iff fewer than k tokens have a larger s (off where k <= 0
  or k >= V); top-p then keeps j iff the mass (exp(s - max), over the tokens top-k kept) of
  the tokens with a larger s is < p times the kept mass (off where p >= 1; the largest value
  always stays); a row holding a NaN or +inf keeps every token. On CUDA, kernels first find
  each row's threshold without sorting it (`keep_threshold`'s bracket search over the values'
  int32 order keys: passes over the row, for up to 64 rows spread over (row, span) programs,
  until the bracket holds at most 4096 tokens, then a radix select over those), and the draw
  skips the tokens below it. Its masses are float32 sums: a token whose larger-mass is within
  a few roundings of p times the kept mass may be kept by one path and not the other.

Backends (`ops.dispatch`): "reference" runs transformers' torch ops one by one (so a CPU
model equals transformers bit for bit); "triton" computes in float32 and rounds once, so it
agrees with the reference within a rounding or two of the dtype.

Host path: a call that takes the Triton kernel is validated once per call signature
(`ops.prepared.PreparedOp`, one per op): a later call of the same signature (the same
dtypes, devices, shapes, strides of its tensors, the same 16-byte alignment of their
pointers, the same non-tensor arguments, backend, environment and CUDA device; any tensors)
skips the checks, the dispatch and Triton's binder, allocates its outputs as the first call
did and launches the frozen kernel. A call whose signature never validated takes the full
path, so bad arguments raise exactly as without the cache.
"""

from __future__ import annotations

import torch

from ...cache.dispatch import num_sms
from ...errors import InvalidArgumentError, Lazy, check
from .._checks import Described, describe
from ..dispatch import choose_backend
from ..prepared import MISS, UNPREPARED, PreparedOp, current_device, env_state
from .reference import (
    apply_rope_reference,
    argmax_rows_reference,
    rms_norm_reference,
    rope_qkv_reference,
    sample_rows_reference,
    silu_mul_reference,
)

FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _float_matrix(name: str, t: object) -> torch.Tensor:
    if not (isinstance(t, torch.Tensor) and t.ndim == 2 and t.dtype in FLOATS):
        raise InvalidArgumentError(f"{name}: expected a 2-D float tensor, got {describe(t)}")
    return t


def _vector(name: str, t: object, n: int, dtypes, device) -> None:
    check(
        isinstance(t, torch.Tensor)
        and t.shape == (n,)
        and t.dtype in dtypes
        and t.device == device,
        name,
        Lazy(lambda: f"a [{n}] tensor of {[str(d) for d in dtypes]} on {device}"),
        Described(t),
    )


def _triton(backend: str, t: torch.Tensor) -> bool:
    return choose_backend(t.device, backend) == "triton" and t.dtype != torch.float64


# The ops' prepared calls (per process, bounded: `ops.prepared.PreparedOp`).
PREPARED_RMS_NORM = PreparedOp()
PREPARED_ROPE_QKV = PreparedOp()
PREPARED_SILU_MUL = PreparedOp()
PREPARED_ARGMAX_ROWS = PreparedOp()
PREPARED_SAMPLE_ROWS = PreparedOp()


def _hit(prep: PreparedOp, signature, *args):
    """A prepared call's result, or MISS (no entry, arguments the signature cannot read,
    torch.compile tracing) / UNPREPARED."""
    if not prep.active or torch.compiler.is_compiling():
        return MISS
    try:
        key, src, _ = signature(*args)
    except Exception:  # arguments the signature cannot read: the full path reports them
        return MISS
    return prep.lookup(key, src)


def _rms_signature(x, weight, eps, residual, weight_first, backend):
    """(key, sources, guarded) of an rms_norm call: every non-tensor value its checks and
    launch read; sources x, weight, residual, out, residual out."""
    key = (type(eps), eps, type(weight_first), weight_first, residual is None, backend,
           env_state(), current_device(x))  # fmt: skip
    return key, [x, weight, residual, None, None], (0, 1) if residual is None else (0, 1, 2)


def rms_norm(x, weight, eps: float, residual=None, *, weight_first: bool = False,
             backend: str | None = None):  # fmt: skip
    """RMSNorm of x's rows, after adding `residual` (module docstring)."""
    hit = _hit(PREPARED_RMS_NORM, _rms_signature, x, weight, eps, residual, weight_first, backend)
    if hit is not MISS and hit is not UNPREPARED:
        return hit
    x = _float_matrix("x", x)
    H = x.shape[1]
    _vector("weight", weight, H, (torch.float32,) if weight_first else (x.dtype,), x.device)
    check(isinstance(eps, float) and eps >= 0, "eps", "a float >= 0", eps)
    if residual is not None:
        check(
            isinstance(residual, torch.Tensor) and residual.shape == x.shape
            and residual.dtype == x.dtype and residual.device == x.device,
            "residual", Lazy(lambda: f"None or a tensor like x {tuple(x.shape)} {x.dtype}"),
            Described(residual),
        )  # fmt: skip
    if _triton(backend, x) and x.stride(1) == 1 and (residual is None or residual.stride(1) == 1):
        from .triton_fused import rms_norm_triton  # noqa: PLC0415 - triton imported lazily

        def run():
            return rms_norm_triton(x, weight, eps, residual, weight_first)

        if x.shape[0] == 0 or torch.compiler.is_compiling():
            return run()
        key, src, guarded = _rms_signature(x, weight, eps, residual, weight_first, backend)
        return PREPARED_RMS_NORM.prepare(key, src, guarded, run, (3,) if residual is None
                                         else (3, 4))  # fmt: skip
    return rms_norm_reference(x, weight, eps, residual, weight_first)


def check_rope_qkv(qkv, cos, sin, h_q, h_kv, q_norm, k_norm) -> int:
    """`rope_qkv`'s argument checks (metadata only); returns the head dim d."""
    qkv = _float_matrix("qkv", qkv)
    check(isinstance(h_q, int) and h_q >= 1, "h_q", "an int >= 1", h_q)
    check(isinstance(h_kv, int) and h_kv >= 1, "h_kv", "an int >= 1", h_kv)
    T, width = qkv.shape
    heads = h_q + 2 * h_kv
    d = width // heads
    check(width == heads * d and d % 2 == 0, "qkv",
          Lazy(lambda: f"[T, (h_q + 2 h_kv) * d] with d even (h_q={h_q}, h_kv={h_kv})"),
          Described(qkv))  # fmt: skip
    for name, t in (("cos", cos), ("sin", sin)):
        check(
            isinstance(t, torch.Tensor) and t.shape == (T, d // 2) and t.dtype == qkv.dtype
            and t.device == qkv.device,
            name, Lazy(lambda: f"a [{T}, {d // 2}] {qkv.dtype} tensor on {qkv.device}"),
            Described(t),
        )  # fmt: skip
    check(
        (q_norm is None) == (k_norm is None), "q_norm/k_norm", "both or neither", Described(q_norm)
    )
    if q_norm is not None:
        _vector("q_norm", q_norm, d, (qkv.dtype,), qkv.device)
        _vector("k_norm", k_norm, d, (qkv.dtype,), qkv.device)
    return d


def rope_triton_ok(backend, qkv, cos, sin, d: int) -> bool:
    """Whether the Triton RoPE kernels take these (checked) arguments."""
    rows_ok = qkv.stride(1) == 1 and cos.stride(1) == 1 and sin.stride(1) == 1
    return _triton(backend, qkv) and rows_ok and d & (d - 1) == 0


def _rope_signature(qkv, cos, sin, h_q, h_kv, q_norm, k_norm, eps, backend):
    """(key, sources, guarded) of a rope_qkv call; sources qkv, cos, sin, q_norm, k_norm, q,
    k, v."""
    key = (type(h_q), h_q, type(h_kv), h_kv, type(eps), eps, q_norm is None, k_norm is None,
           backend, env_state(), current_device(qkv))  # fmt: skip
    src = [qkv, cos, sin, q_norm, k_norm, None, None, None]
    return key, src, (0, 1, 2) if q_norm is None else (0, 1, 2, 3, 4)


def rope_qkv(qkv, cos, sin, h_q: int, h_kv: int, *, q_norm=None, k_norm=None,
             eps: float = 0.0, backend: str | None = None):  # fmt: skip
    """q, k (RoPE, optional per-head RMSNorm) and v of a fused q|k|v row block."""
    hit = _hit(PREPARED_ROPE_QKV, _rope_signature, qkv, cos, sin, h_q, h_kv, q_norm, k_norm, eps,
               backend)  # fmt: skip
    if hit is not MISS and hit is not UNPREPARED:
        return hit
    d = check_rope_qkv(qkv, cos, sin, h_q, h_kv, q_norm, k_norm)
    if rope_triton_ok(backend, qkv, cos, sin, d):
        from .triton_fused import rope_qkv_triton  # noqa: PLC0415

        def run():
            return rope_qkv_triton(qkv, cos, sin, h_q, h_kv, q_norm, k_norm, eps)

        if qkv.shape[0] == 0 or torch.compiler.is_compiling():
            return run()
        key, src, guarded = _rope_signature(qkv, cos, sin, h_q, h_kv, q_norm, k_norm, eps,
                                            backend)  # fmt: skip
        return PREPARED_ROPE_QKV.prepare(key, src, guarded, run, (5, 6, 7))
    return rope_qkv_reference(qkv, cos, sin, h_q, h_kv, q_norm, k_norm, eps)


def _unary_signature(x, backend):
    """(key, sources, guarded) of a silu_mul call; sources x, out."""
    return (backend, env_state(), current_device(x)), [x, None], (0,)


def silu_mul(gate_up, *, backend: str | None = None) -> torch.Tensor:
    """silu(gate) * up of a fused gate|up projection [T, 2 I]."""
    hit = _hit(PREPARED_SILU_MUL, _unary_signature, gate_up, backend)
    if hit is not MISS and hit is not UNPREPARED:
        return hit
    gate_up = _float_matrix("gate_up", gate_up)
    check(gate_up.shape[1] % 2 == 0, "gate_up", "[T, 2 I] (an even width)", Described(gate_up))
    if _triton(backend, gate_up) and gate_up.stride(1) == 1:
        from .triton_fused import silu_mul_triton  # noqa: PLC0415

        if gate_up.shape[0] == 0 or torch.compiler.is_compiling():
            return silu_mul_triton(gate_up)
        key, src, guarded = _unary_signature(gate_up, backend)
        return PREPARED_SILU_MUL.prepare(key, src, guarded, lambda: silu_mul_triton(gate_up), (1,))
    return silu_mul_reference(gate_up)


def _argmax_signature(x, backend):
    """(key, sources, guarded) of an argmax_rows call; sources x, out, the spans' partials."""
    return (backend, env_state(), current_device(x)), [x, None, None], (0,)


def argmax_rows(x, *, backend: str | None = None) -> torch.Tensor:
    """Each row's index of its largest value (module docstring); x [n, V] float."""
    hit = _hit(PREPARED_ARGMAX_ROWS, _argmax_signature, x, backend)
    if hit is not MISS and hit is not UNPREPARED:
        return hit[0]
    x = _float_matrix("x", x)
    check(x.shape[1] >= 1, "x", "[n, V] with V >= 1", Described(x))
    check(x.shape[1] < 2**31 - 1, "x", "fewer than 2**31 - 1 columns", Described(x))
    if _triton(backend, x) and x.stride(1) == 1:
        from .triton_fused import argmax_plan, argmax_rows_triton  # noqa: PLC0415

        sms = num_sms(x.device)
        if x.shape[0] == 0 or torch.compiler.is_compiling():
            return argmax_rows_triton(x, sms)[0]
        launches = 2 if argmax_plan(*x.shape, sms)[1] > 1 else 1  # (spans, then their merge)
        key, src, guarded = _argmax_signature(x, backend)
        run = lambda: argmax_rows_triton(x, sms)  # noqa: E731
        return PREPARED_ARGMAX_ROWS.prepare(key, src, guarded, run, (1, 2), launches)[0]
    return argmax_rows_reference(x)


def warm_up_sampling(vocab: int, device: str | torch.device) -> None:
    """Run `argmax_rows` and `sample_rows` on logits of `vocab` columns on `device` so that
    every kernel they launch for float32 [n, vocab] logits at any n compiles now (the n are in
    grids and unspecialized ints): on CUDA the argmax of one row (spans and their merge) and of
    as many rows as fill the SMs (one span a row, `triton_fused.argmax_plan`), one draw, and one
    with top_k and top_p both given (the engine's sampler passes both or neither)."""
    argmax_rows(torch.randn(1, vocab, device=device))
    zeros = torch.zeros(1, dtype=torch.int64, device=device)
    x, t = torch.randn(1, vocab, device=device), torch.ones(1, device=device)
    sample_rows(x, t, zeros, zeros)
    # the keep-threshold kernels: the chain of span passes, and one program a row
    from .keep_threshold import THR_CHAIN_MAX_ROWS  # noqa: PLC0415

    for rows in (1, THR_CHAIN_MAX_ROWS + 1):
        z = torch.zeros(rows, dtype=torch.int64, device=device)
        sample_rows(torch.randn(rows, vocab, device=device), torch.ones(rows, device=device), z,
                    z, top_k=z + 1, top_p=torch.full((rows,), 0.5, device=device))  # fmt: skip
    if torch.device(device).type == "cuda":
        from .triton_fused import ARGMAX_PROGRAMS_PER_SM  # noqa: PLC0415

        rows = ARGMAX_PROGRAMS_PER_SM * num_sms(device)
        argmax_rows(torch.randn(rows, vocab, device=device))


def _sample_signature(x, temperature, seeds, counters, top_k, top_p, backend):
    """(key, sources, guarded) of a sample_rows call; sources x, temperature, seeds, counters,
    top_k, top_p, out, the spans' partials, the keep thresholds, their scratch, workspace."""
    key = (backend, env_state(), current_device(x), top_k is None, top_p is None)
    guarded = (0, 1, 2, 3) + ((4,) if top_k is not None else ()) + ((5,) if top_p is not None
                                                                     else ())  # fmt: skip
    src = [x, temperature, seeds, counters, top_k, top_p, None, None, None, None, None]
    return key, src, guarded


def sample_rows(x, temperature, seeds, counters, *, top_k=None, top_p=None,
                backend: str | None = None):  # fmt: skip
    """One draw a row (module docstring); x [n, V] float; top_k [n] int64 / top_p [n] float32
    or None (one of them alone: the other is made, off, for every row)."""
    made_k = False  # (checked after the given one, so that an error names what was given)
    if (top_k is None) != (top_p is None):  # the kernels' one form takes both
        given = top_k if top_p is None else top_p
        if isinstance(given, torch.Tensor) and given.ndim == 1:
            if top_k is None:
                top_k, made_k = torch.zeros(given.shape, dtype=torch.int64,
                                            device=given.device), True  # fmt: skip
            else:
                top_p = torch.full(given.shape, float("inf"), device=given.device)
    hit = _hit(PREPARED_SAMPLE_ROWS, _sample_signature, x, temperature, seeds, counters, top_k,
               top_p, backend)  # fmt: skip
    if hit is not MISS and hit is not UNPREPARED:
        return hit[0]
    x = _float_matrix("x", x)
    n, V = x.shape
    check(V >= 1, "x", "[n, V] with V >= 1", Described(x))
    check(V < 2**31 - 1, "x", "fewer than 2**31 - 1 columns", Described(x))
    _vector("temperature", temperature, n, (torch.float32,), x.device)
    _vector("seeds", seeds, n, (torch.int64,), x.device)
    _vector("counters", counters, n, (torch.int64,), x.device)
    filters = [("top_k", top_k, torch.int64), ("top_p", top_p, torch.float32)]
    for name, v, dt in filters[::-1] if made_k else filters:
        if v is not None:
            _vector(name, v, n, (dt,), x.device)
    check(
        (top_k is None) == (top_p is None),
        "top_k/top_p",
        "[n] tensors (either may be None)",
        Described(top_k if top_p is None else top_p),
    )
    if _triton(backend, x) and x.stride(1) == 1:
        from .keep_threshold import keep_threshold_launches  # noqa: PLC0415
        from .triton_fused import sample_rows_triton  # noqa: PLC0415

        def c(t):
            return None if t is None else t.contiguous()

        args = (x, c(temperature), c(seeds), c(counters), c(top_k), c(top_p))
        sms = num_sms(x.device)
        run = lambda: sample_rows_triton(*args[:4], sms, *args[4:])  # noqa: E731
        if n == 0 or torch.compiler.is_compiling():
            return run()[0]
        key, src, guarded = _sample_signature(*args, backend)
        launches = 2 + (0 if top_k is None else keep_threshold_launches(n, V, sms))
        return PREPARED_SAMPLE_ROWS.prepare(key, src, guarded, run, (6, 7, 8, 9, 10),
                                            launches)[0]  # fmt: skip
    return sample_rows_reference(x, temperature, seeds, counters, top_k, top_p)


__all__ = [
    "apply_rope_reference",
    "argmax_rows",
    "rms_norm",
    "rope_qkv",
    "sample_rows",
    "silu_mul",
    "warm_up_sampling",
]
