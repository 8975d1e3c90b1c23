"""Triton `rope_store_kv`: a layer's RoPE and its K/V cache write in one launch.

One program per (token, block of HB heads) of a fused q|k|v row block [T, (h_q + 2 h_kv) d]
(`heads_a_program`), a [HB, d / 2] tile of each half: a query head gets its (Qwen3 head norm
and) RoPE and is stored into q; a key head the same, stored into its cache row; a value head is
copied into its cache row. A program finds its token's request, position and paged row once,
as `_store_kv_kernel` does (`triton_store.token_position`, the lookup table), and skips its
K/V stores by the same rules (a token outside every request, at a negative position, past the
table's reach or on a page id outside [0, num_pages)). float32 math, one rounding at the end:
q and the cache rows equal bit for bit what `rope_qkv_triton` (`triton_fused.rope_pair`, a
head at a time) then `store_kv_triton` write (a plain cache of the model's dtype; the FP8
caches keep the two launches).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...operands import RowOperand
from .._triton_interpreter import install_interpreter_shim
from ..pdl import pdl_chain_kwargs, pdl_wait
from ..prepared import cached_launch
from ..specialize import request_block
from .triton_store import token_position

install_interpreter_shim()


@triton.jit
def _rope_store_kernel(
    QKV, COS, SIN, QN, KN, Q, sqkv, scos, ssin, H_Q, H_KV, eps,
    KD, skr, skh, VD, svr, svh, Lut, slut, page_stride, reach, limit, cache_lens, q_offsets,
    batch, D: tl.constexpr, NORM: tl.constexpr, PAGE: tl.constexpr, BLOCK_B: tl.constexpr,
    HB: tl.constexpr, PDL: tl.constexpr = False,
):  # fmt: skip
    pdl_wait(PDL)
    t = tl.program_id(0)
    t64 = t.to(tl.int64)
    HALF: tl.constexpr = D // 2
    i = tl.arange(0, HALF)[None, :]
    j = tl.program_id(1) * HB + tl.arange(0, HB)[:, None]  # the program's heads, [HB, 1]
    is_q = j < H_Q
    is_k = (j >= H_Q) & (j < H_Q + H_KV)
    is_v = (j >= H_Q + H_KV) & (j < H_Q + 2 * H_KV)
    live = (j < H_Q + 2 * H_KV) & (i < HALF)
    src = QKV + t64 * sqkv + j * D
    x1 = tl.load(src + i, mask=live, other=0.0).to(tl.float32)
    x2 = tl.load(src + HALF + i, mask=live, other=0.0).to(tl.float32)
    if NORM:  # q rows by q_norm's weight, k rows by k_norm's (v rows: not used)
        rs = 1.0 / tl.sqrt((tl.sum(x1 * x1, axis=1) + tl.sum(x2 * x2, axis=1))[:, None] / D + eps)
        wq = is_q & (i < HALF)
        w1 = tl.where(wq, tl.load(QN + i).to(tl.float32), tl.load(KN + i).to(tl.float32))
        w2 = tl.where(
            wq, tl.load(QN + HALF + i).to(tl.float32), tl.load(KN + HALF + i).to(tl.float32)
        )
        n1 = (w1 * (x1 * rs).to(Q.dtype.element_ty).to(tl.float32)).to(Q.dtype.element_ty)
        n2 = (w2 * (x2 * rs).to(Q.dtype.element_ty).to(tl.float32)).to(Q.dtype.element_ty)
        y1, y2 = n1.to(tl.float32), n2.to(tl.float32)
    else:
        y1, y2 = x1, x2
    c = tl.load(COS + t64 * scos + i).to(tl.float32)
    s = tl.load(SIN + t64 * ssin + i).to(tl.float32)
    r1 = y1 * c - y2 * s
    r2 = y2 * c + y1 * s
    # q heads
    dq = Q + (t64 * H_Q + j) * D
    tl.store(dq + i, r1.to(Q.dtype.element_ty), mask=is_q & live)
    tl.store(dq + HALF + i, r2.to(Q.dtype.element_ty), mask=is_q & live)
    # the token's request, position and cache row (`_store_kv_kernel`'s addressing), once a
    # program; K heads RoPE'd, V heads copied
    b, pos, ok = token_position(q_offsets, cache_lens, batch, t, BLOCK_B)
    ok = ok & (pos < reach)
    page = tl.load(Lut + b * slut + pos // PAGE, mask=ok, other=-1)
    ok = ok & (page >= 0) & (page < limit)
    row = page.to(tl.int64) * page_stride + pos % PAGE
    mk = is_k & live & ok
    dk = KD + row * skr + (j - H_Q) * skh
    tl.store(dk + i, r1.to(KD.dtype.element_ty), mask=mk)
    tl.store(dk + HALF + i, r2.to(KD.dtype.element_ty), mask=mk)
    mv = is_v & live & ok
    dv = VD + row * svr + (j - H_Q - H_KV) * svh
    tl.store(dv + i, x1.to(KD.dtype.element_ty), mask=mv)
    tl.store(dv + HALF + i, x2.to(KD.dtype.element_ty), mask=mv)


def heads_a_program(half: int, heads: int) -> int:
    """HB: the heads one program takes, a [HB, d / 2] tile of about 512 elements (at most the
    next power of two above `heads`). One program a head (before) made a mixed step of 2,048
    tokens 98,304 programs of one warp, each finding its token's request among 256 (61 us a
    layer on the H200, Llama-3.2-1B heads; dev/profile_serve_steps.py)."""
    return max(1, min(512 // half, triton.next_power_of_2(heads)))


def rope_store_kv_triton(
    qkv: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    h_q: int,
    h_kv: int,
    q_norm: torch.Tensor | None,
    k_norm: torch.Tensor | None,
    eps: float,
    k_cache: RowOperand,
    v_cache: RowOperand,
    q_row_offsets: torch.Tensor,
) -> torch.Tensor:
    """q [T, h_q, d] (module docstring); the K/V operands plain paged rows of qkv's dtype.
    `rope_store_kv` validates the arguments."""
    T = qkv.shape[0]
    d = qkv.shape[1] // (h_q + 2 * h_kv)
    q = torch.empty(T, h_q, d, dtype=qkv.dtype, device=qkv.device)
    if T == 0:
        return q
    norm = q_norm is not None
    kr, vr = k_cache.rows, v_cache.rows
    batch = q_row_offsets.shape[0] - 1
    lut = k_cache.lut
    hb = heads_a_program(d // 2, h_q + 2 * h_kv)
    cached_launch(
        _rope_store_kernel, (T, triton.cdiv(h_q + 2 * h_kv, hb)),
        qkv, cos, sin, q_norm if norm else cos, k_norm if norm else cos, q, qkv.stride(0),
        cos.stride(0), sin.stride(0), h_q, h_kv, float(eps),
        kr, kr.stride(0), kr.stride(1), vr, vr.stride(0), vr.stride(1), lut, lut.stride(0),
        k_cache.page_stride_rows, lut.shape[1] * k_cache.page_size,
        k_cache.num_sparse_slots() // k_cache.page_size, k_cache.cache_lengths, q_row_offsets,
        batch, D=d, NORM=norm, PAGE=k_cache.page_size, BLOCK_B=request_block(batch), HB=hb,
        num_warps=4, **pdl_chain_kwargs(qkv),
    )  # fmt: skip
    return q


__all__ = ["rope_store_kv_triton"]
