"""Triton kernels of the fused layer ops (`pagedattn.ops.fused`): one program a row (RMSNorm),
a (token, head) pair (RoPE), a (token, block) pair (silu * up), or a (row, span) pair and a
merge program a row (the greedy argmax and the draw, which skips the tokens below
`keep_threshold`'s top-k / top-p threshold); float32 math, one rounding to the output dtype at
the end. The element-wise order differs from the reference's chain of torch ops (each
rounding to the dtype), so outputs agree within a rounding or two."""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from ...cache.dispatch import DEFAULT_NUM_SMS
from .._triton_interpreter import install_interpreter_shim
from ..pdl import pdl_chain_kwargs, pdl_wait
from ..prepared import cached_launch
from .keep_threshold import _keep_thresholds, _order_key

install_interpreter_shim()


@triton.jit
def _rms_norm_kernel(X, R, W, OUT, ROUT, H, sx, sr, so, sro, eps,
                     HAS_RES: tl.constexpr, WEIGHT_FIRST: tl.constexpr,
                     BLOCK: tl.constexpr, PDL: tl.constexpr = False):  # fmt: skip
    pdl_wait(PDL)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    m = cols < H
    x = tl.load(X + row * sx + cols, mask=m, other=0.0)
    if HAS_RES:
        r = tl.load(R + row * sr + cols, mask=m, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(ROUT.dtype.element_ty)
        tl.store(ROUT + row * sro + cols, x, mask=m)
    h = x.to(tl.float32)
    rs = 1.0 / tl.sqrt(tl.sum(h * h, axis=0) / H + eps)
    w = tl.load(W + cols, mask=m, other=0.0).to(tl.float32)
    if WEIGHT_FIRST:
        y = w * (h * rs)
    else:
        y = w * (h * rs).to(OUT.dtype.element_ty).to(tl.float32)
    tl.store(OUT + row * so + cols, y.to(OUT.dtype.element_ty), mask=m)


def rms_norm_triton(x, weight, eps, residual=None, weight_first=False):
    T, H = x.shape
    out = torch.empty_like(x)
    rout = torch.empty_like(x) if residual is not None else out
    if T == 0:
        return out if residual is None else (out, rout)
    r = residual if residual is not None else x
    block = triton.next_power_of_2(H)
    cached_launch(
        _rms_norm_kernel, (T,),
        x, r, weight, out, rout, H, x.stride(0), r.stride(0), out.stride(0), rout.stride(0),
        float(eps), HAS_RES=residual is not None, WEIGHT_FIRST=weight_first, BLOCK=block,
        num_warps=min(16, max(1, block // 256)), **pdl_chain_kwargs(x),
    )  # fmt: skip
    return out if residual is None else (out, rout)


@triton.jit
def rope_pair(x1, x2, COS, SIN, NW, t, scos, ssin, i, eps, D: tl.constexpr, NORM: tl.constexpr,
              OUT):  # fmt: skip
    """A q or k head's halves (x1, x2 float32, columns i and HALF + i) after Qwen3's RMSNorm of
    the head (NORM; weight NW, `weight * normed.to(dtype)`, OUT's element type) and neox RoPE
    at token t: float32 (o1, o2)."""
    HALF: tl.constexpr = D // 2
    if NORM:
        rs = 1.0 / tl.sqrt((tl.sum(x1 * x1, axis=0) + tl.sum(x2 * x2, axis=0)) / D + eps)
        w1 = tl.load(NW + i).to(tl.float32)
        w2 = tl.load(NW + HALF + i).to(tl.float32)
        x1 = (w1 * (x1 * rs).to(OUT.dtype.element_ty).to(tl.float32)).to(OUT.dtype.element_ty)
        x2 = (w2 * (x2 * rs).to(OUT.dtype.element_ty).to(tl.float32)).to(OUT.dtype.element_ty)
        x1, x2 = x1.to(tl.float32), x2.to(tl.float32)
    c = tl.load(COS + t * scos + i).to(tl.float32)
    s = tl.load(SIN + t * ssin + i).to(tl.float32)
    return x1 * c - x2 * s, x2 * c + x1 * s


@triton.jit
def _rope_qkv_kernel(QKV, COS, SIN, QN, KN, Q, K, V, sqkv, scos, ssin, H_Q, H_KV, eps,
                     D: tl.constexpr, NORM: tl.constexpr, PDL: tl.constexpr = False):  # fmt: skip
    pdl_wait(PDL)
    t = tl.program_id(0).to(tl.int64)
    j = tl.program_id(1)
    HALF: tl.constexpr = D // 2
    i = tl.arange(0, HALF)
    src = QKV + t * sqkv + j * D
    x1 = tl.load(src + i).to(tl.float32)
    x2 = tl.load(src + HALF + i).to(tl.float32)
    if j >= H_Q + H_KV:  # a V head: copied
        dst = V + (t * H_KV + (j - H_Q - H_KV)) * D
        tl.store(dst + i, x1.to(V.dtype.element_ty))
        tl.store(dst + HALF + i, x2.to(V.dtype.element_ty))
    else:
        if j < H_Q:
            o1, o2 = rope_pair(x1, x2, COS, SIN, QN, t, scos, ssin, i, eps, D, NORM, Q)
            dst = Q + (t * H_Q + j) * D
        else:
            o1, o2 = rope_pair(x1, x2, COS, SIN, KN, t, scos, ssin, i, eps, D, NORM, Q)
            dst = K + (t * H_KV + (j - H_Q)) * D
        tl.store(dst + i, o1.to(Q.dtype.element_ty))
        tl.store(dst + HALF + i, o2.to(Q.dtype.element_ty))


def rope_qkv_triton(qkv, cos, sin, h_q, h_kv, q_norm=None, k_norm=None, eps=0.0):
    T = qkv.shape[0]
    d = qkv.shape[1] // (h_q + 2 * h_kv)
    q = torch.empty(T, h_q, d, dtype=qkv.dtype, device=qkv.device)
    k = torch.empty(T, h_kv, d, dtype=qkv.dtype, device=qkv.device)
    v = torch.empty(T, h_kv, d, dtype=qkv.dtype, device=qkv.device)
    if T == 0:
        return q, k, v
    norm = q_norm is not None
    qn = q_norm if norm else cos
    kn = k_norm if norm else cos
    cached_launch(
        _rope_qkv_kernel, (T, h_q + 2 * h_kv),
        qkv, cos, sin, qn, kn, q, k, v, qkv.stride(0), cos.stride(0), sin.stride(0),
        h_q, h_kv, float(eps), D=d, NORM=norm, num_warps=1 if d <= 128 else 2,
        **pdl_chain_kwargs(qkv),
    )  # fmt: skip
    return q, k, v


@triton.jit
def _silu_mul_kernel(GU, OUT, I, sgu, so, BLOCK: tl.constexpr, PDL: tl.constexpr = False):
    pdl_wait(PDL)
    t = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    m = cols < I
    g = tl.load(GU + t * sgu + cols, mask=m, other=0.0).to(tl.float32)
    u = tl.load(GU + t * sgu + I + cols, mask=m, other=0.0).to(tl.float32)
    y = g / (1.0 + tl.exp(-g)) * u
    tl.store(OUT + t * so + cols, y.to(OUT.dtype.element_ty), mask=m)


def silu_mul_triton(gate_up):
    T, two_i = gate_up.shape
    inter = two_i // 2
    out = torch.empty(T, inter, dtype=gate_up.dtype, device=gate_up.device)
    if T == 0:
        return out
    block = min(2048, triton.next_power_of_2(inter))
    cached_launch(
        _silu_mul_kernel, (T, triton.cdiv(inter, block)),
        gate_up, out, inter, gate_up.stride(0), out.stride(0), BLOCK=block,
        num_warps=max(1, min(8, block // 256)), **pdl_chain_kwargs(gate_up),
    )  # fmt: skip
    return out


@triton.jit
def _fmix32(x):
    """murmur3's 32-bit finalizer on uint32 (`reference._fmix32`'s, wrapping products)."""
    x = x ^ (x >> 16)
    x = x * 0x85EBCA6B
    x = x ^ (x >> 13)
    x = x * 0xC2B2AE35
    return x ^ (x >> 16)


@triton.jit
def _row_key(seed, counter):
    """A row's noise key from its int64 seed and counter (`reference.uniform_noise`'s)."""
    lo = (seed & 0xFFFFFFFF).to(tl.uint32)
    hi = ((seed >> 32) & 0xFFFFFFFF).to(tl.uint32)
    key = _fmix32(lo ^ 0x9E3779B9)
    key = _fmix32(key ^ hi)
    return _fmix32(key ^ _fmix32((counter & 0xFFFFFFFF).to(tl.uint32) ^ 0x7F4A7C15))


@triton.jit
def _gumbel_scores(x, cols, t, key, thr=0, FILTER: tl.constexpr = False):
    """x / t + g (g = -log(-log(u)), u the row key's uniform at each column, exactly
    `reference.uniform_noise`'s) where t > 0, else x; IEEE division and logs. FILTER: -inf
    where x / t's `_order_key` is below thr (the row's `_keep_threshold_kernel` key)."""
    bits = _fmix32(_fmix32(key ^ _fmix32(cols.to(tl.uint32))) ^ 0x165667B1)
    u = ((bits >> 9).to(tl.float32) + 0.5) * (1.0 / 8388608.0)
    g = -libdevice.log(-libdevice.log(u))
    s = tl.math.div_rn(x, tl.where(t > 0, t, 1.0))
    score = tl.where(t > 0, s + g, x)
    if FILTER:
        score = tl.where(_order_key(s) >= thr, score, float("-inf"))
    return score


@triton.jit
def _argmax_span(base, lo, hi, V, BLOCK: tl.constexpr, STAGES: tl.constexpr, t=1.0, key=0,
                 NOISE: tl.constexpr = False, thr=0, FILTER: tl.constexpr = False):  # fmt: skip
    """(largest value, index of its first occurrence, first NaN's index or V) of columns
    [lo, hi) of a row (NOISE: of its `_gumbel_scores` with t, key); a span of -inf only gives
    (-inf, lo)."""
    best_v = float("-inf")
    best_i = lo
    nan_i = V
    for start in tl.range(lo, hi, BLOCK, num_stages=STAGES):
        cols = start + tl.arange(0, BLOCK)
        m = cols < hi
        x = tl.load(base + cols, mask=m, other=float("-inf")).to(tl.float32)
        if NOISE:
            x = _gumbel_scores(x, cols, t, key, thr, FILTER)
        isn = x != x
        nan_i = tl.minimum(nan_i, tl.min(tl.where(isn, cols, V), axis=0))
        x = tl.where(isn, float("-inf"), x)
        bmax = tl.max(x, axis=0)
        bidx = tl.min(tl.where((x == bmax) & m, cols, V), axis=0)  # the block's first maximum
        take = bmax > best_v  # strictly: an earlier block keeps a tie
        best_i = tl.where(take, bidx, best_i)
        best_v = tl.where(take, bmax, best_v)
    return best_v, best_i, nan_i


@triton.jit
def _argmax_rows_kernel(X, OUT, V, sx, BLOCK: tl.constexpr, STAGES: tl.constexpr,
                        PDL: tl.constexpr = False):  # fmt: skip
    pdl_wait(PDL)
    row = tl.program_id(0).to(tl.int64)
    best_v, best_i, nan_i = _argmax_span(X + row * sx, 0, V, V, BLOCK, STAGES)
    tl.store(OUT + row, tl.where(nan_i < V, nan_i, best_i).to(tl.int64))


@triton.jit(do_not_specialize=["NB", "S"])  # one binary a vocabulary, whatever the batch
def _argmax_part_kernel(X, PART, V, sx, NB, S, T, SEEDS, CTRS, THR, BLOCK: tl.constexpr,
                        STAGES: tl.constexpr, NOISE: tl.constexpr = False,
                        FILTER: tl.constexpr = False, PDL: tl.constexpr = False):  # fmt: skip
    """Program (row, c): columns [c NB BLOCK, (c + 1) NB BLOCK) of the row (spans of NB
    blocks: their starts stay BLOCK-aligned, unspecialized) -> PART[0, row, c] its
    value (NaN where the span has one), PART[1, row, c] its index (the first NaN's, else the
    first maximum's); PART int64 [2, n, S], the value's float32 bits. NOISE: of the row's
    Gumbel scores (temperature T[row], key of SEEDS[row], CTRS[row]; `sample_rows`); FILTER:
    of the columns whose scaled value's key is at least THR[row] (int32)."""
    pdl_wait(PDL)
    row = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1)
    lo = c * NB * BLOCK
    t = 1.0
    key = 0
    thr = 0
    if NOISE:
        t = tl.load(T + row)
        key = _row_key(tl.load(SEEDS + row), tl.load(CTRS + row))
    if FILTER:
        thr = tl.load(THR + row)
    best_v, best_i, nan_i = _argmax_span(X + row * sx, lo, tl.minimum(lo + NB * BLOCK, V), V,
                                         BLOCK, STAGES, t, key, NOISE, thr, FILTER)  # fmt: skip
    has_nan = nan_i < V
    v = tl.where(has_nan, float("nan"), best_v)
    at = PART + row * S + c
    tl.store(at, v.to(tl.int32, bitcast=True).to(tl.int64))
    tl.store(at + tl.num_programs(0) * S, tl.where(has_nan, nan_i, best_i).to(tl.int64))


@triton.jit(do_not_specialize=["S"])
def _argmax_finish_kernel(PART, OUT, V, S, S_P2: tl.constexpr, PDL: tl.constexpr = False):
    """Program row: the row's answer from its S spans' (`_argmax_part_kernel`): the first
    NaN's index where a span has one, else the first of the spans' equal maxima (spans in
    column order). S_P2 >= S, fixed by V (the most spans a row can have)."""
    pdl_wait(PDL)
    row = tl.program_id(0).to(tl.int64)
    k = tl.arange(0, S_P2)
    m = k < S
    at = PART + row * S + k
    v = tl.load(at, mask=m, other=0).to(tl.int32).to(tl.float32, bitcast=True)
    i = tl.load(at + tl.num_programs(0) * S, mask=m, other=V)
    isn = (v != v) & m
    nan_i = tl.min(tl.where(isn, i, V), axis=0)
    v = tl.where(isn | ~m, float("-inf"), v)
    vmax = tl.max(v, axis=0)
    best = tl.min(tl.where((v == vmax) & m, i, V), axis=0)
    tl.store(OUT + row, tl.where(nan_i < V, nan_i, best).to(tl.int64))


# Programs a SM the split argmax aims at: each streams a span of ~BLOCK-column blocks.
ARGMAX_PROGRAMS_PER_SM = 2


def argmax_plan(n: int, V: int, sms: int) -> tuple[int, int, int]:
    """(BLOCK, spans a row S, columns a span) of `argmax_rows_triton` for x [n, V] on `sms`
    multiprocessors: rows split into spans of whole blocks until the grid holds
    ARGMAX_PROGRAMS_PER_SM programs a SM (one span a row where the rows alone fill that):
    one program a row left most SMs idle on a decode batch's logits (H200, 64 x 128256
    float32, 27.9 us a step in the engine's trace, 0.28 of copy)."""
    block = min(4096, triton.next_power_of_2(V))
    blocks = triton.cdiv(V, block)
    want = triton.cdiv(ARGMAX_PROGRAMS_PER_SM * sms, max(n, 1))
    chunk = triton.cdiv(blocks, max(1, min(blocks, want))) * block
    return block, triton.cdiv(V, chunk), chunk


def argmax_rows_triton(x, sms: int = DEFAULT_NUM_SMS):
    """x [n, V] float (rows contiguous) -> ([n] int64 as `ops.fused.argmax_rows`, the spans'
    partials int64 [2, n, S] or None): one launch where each row is one span
    (`argmax_plan`), else a launch of (row, span) programs and one that merges a row's
    spans. Each of the three kernels compiles once a vocabulary V (the batch is in the grid
    and in unspecialized ints): a new batch size never compiles in the middle of serving
    once `ops.fused.warm_up_sampling` has run both paths."""
    n, V = x.shape
    out = torch.empty(n, dtype=torch.int64, device=x.device)
    if n == 0:
        return out, None
    block, S, chunk = argmax_plan(n, V, sms)
    pdl = pdl_chain_kwargs(x)
    if S == 1:
        cached_launch(
            _argmax_rows_kernel, (n,), x, out, V, x.stride(0),
            BLOCK=block, STAGES=3, num_warps=8, **pdl,
        )  # fmt: skip
        return out, None
    return out, _argmax_in_spans(x, out, (x, x, x), block, S, chunk, False, pdl)


def _argmax_in_spans(x, out, noise, block, S, chunk, NOISE, pdl, thr=None):
    """The (row, span) launch and the merge launch of `argmax_rows_triton` / `sample_rows_
    triton` into `out`; noise: (temperature, seeds, counters), read with NOISE; thr: the rows'
    keep thresholds (int32 [n]) or None. Returns the spans' partials."""
    n, V = x.shape
    part = torch.empty(2, n, S, dtype=torch.int64, device=x.device)
    cached_launch(
        _argmax_part_kernel, (n, S), x, part, V, x.stride(0), chunk // block, S, *noise,
        x if thr is None else thr,
        BLOCK=block, STAGES=3, NOISE=NOISE, FILTER=thr is not None, num_warps=8, **pdl,
    )  # fmt: skip
    cached_launch(
        _argmax_finish_kernel, (n,), part, out, V, S,
        S_P2=triton.next_power_of_2(triton.cdiv(V, block)),
        num_warps=1, **pdl,
    )  # fmt: skip
    return part


def sample_rows_triton(x, temperature, seeds, counters, sms: int = DEFAULT_NUM_SMS,
                       top_k=None, top_p=None):  # fmt: skip
    """x [n, V] float (rows contiguous), temperature [n] float32, seeds / counters [n] int64,
    top_k [n] int64 and top_p [n] float32, or both None -> ([n] int64 as
    `ops.fused.sample_rows`, the spans' partials, the keep thresholds int32 [n] or None, their
    scratch or None, their int32 workspace or None): with them, the keep thresholds first
    (`_keep_thresholds`; one compiled form: sm_90's Triton 3.6 failed to compile the form
    without top_k, a crash in TritonGPUCoalesce); then the spans of `argmax_plan` (one or more
    a row), each scoring its columns as it reads them, and the merge launch."""
    n, V = x.shape
    out = torch.empty(n, dtype=torch.int64, device=x.device)
    if n == 0:
        return out, None, None, None, None
    pdl = pdl_chain_kwargs(x)
    thr = lst = ws = None
    if top_k is not None:
        thr, lst, ws = _keep_thresholds(x, temperature, top_k, top_p, sms, pdl)
    block, S, chunk = argmax_plan(n, V, sms)
    noise = (temperature, seeds, counters)
    part = _argmax_in_spans(x, out, noise, block, S, chunk, True, pdl, thr)
    return out, part, thr, lst, ws
