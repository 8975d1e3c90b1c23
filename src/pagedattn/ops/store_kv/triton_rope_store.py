"""Triton `rope_store_kv`: a layer's RoPE and its K/V cache write in one launch.

One program per (token, head) of a fused q|k|v row block [T, (h_q + 2 h_kv) d], as
`ops.fused`'s `_rope_qkv_kernel`: a query head gets its (Qwen3 head norm and) RoPE and is stored
into q; a key head the same, stored into its cache row; a value head is copied into its cache
row. A K/V program finds its token's request, position and paged row as `_store_kv_kernel`
does (`triton_store.token_position`, the lookup table), and skips its store by the same rules
(a token outside every request, at a negative position, past the table's reach or on a page
id outside [0, num_pages)). float32 math, one rounding at the end: q and the cache rows equal
bit for bit what `rope_qkv_triton` then `store_kv_triton` write (a plain cache of the model's
dtype; the FP8 caches keep the two launches).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...operands import RowOperand
from .._triton_interpreter import install_interpreter_shim
from ..fused.triton_fused import rope_pair
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
    PDL: tl.constexpr = False,
):  # fmt: skip
    pdl_wait(PDL)
    t = tl.program_id(0)
    j = tl.program_id(1)
    t64 = t.to(tl.int64)
    HALF: tl.constexpr = D // 2
    i = tl.arange(0, HALF)
    src = QKV + t64 * sqkv + j * D
    x1 = tl.load(src + i).to(tl.float32)
    x2 = tl.load(src + HALF + i).to(tl.float32)
    if j < H_Q:
        o1, o2 = rope_pair(x1, x2, COS, SIN, QN, t64, scos, ssin, i, eps, D, NORM, Q)
        dst = Q + (t64 * H_Q + j) * D
        tl.store(dst + i, o1.to(Q.dtype.element_ty))
        tl.store(dst + HALF + i, o2.to(Q.dtype.element_ty))
    else:
        # the token's request, position and cache row (`_store_kv_kernel`'s addressing)
        b, pos, ok = token_position(q_offsets, cache_lens, batch, t, BLOCK_B)
        ok = ok & (pos < reach)
        page = tl.load(Lut + b * slut + pos // PAGE, mask=ok, other=-1)
        ok = ok & (page >= 0) & (page < limit)
        row = page.to(tl.int64) * page_stride + pos % PAGE
        if j < H_Q + H_KV:
            o1, o2 = rope_pair(x1, x2, COS, SIN, KN, t64, scos, ssin, i, eps, D, NORM, KD)
            dst = KD + row * skr + (j - H_Q) * skh
        else:
            o1, o2 = x1, x2
            dst = VD + row * svr + (j - H_Q - H_KV) * svh
        tl.store(dst + i, o1.to(KD.dtype.element_ty), mask=ok)
        tl.store(dst + HALF + i, o2.to(KD.dtype.element_ty), mask=ok)


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
    cached_launch(
        _rope_store_kernel, (T, h_q + 2 * h_kv),
        qkv, cos, sin, q_norm if norm else cos, k_norm if norm else cos, q, qkv.stride(0),
        cos.stride(0), sin.stride(0), h_q, h_kv, float(eps),
        kr, kr.stride(0), kr.stride(1), vr, vr.stride(0), vr.stride(1), lut, lut.stride(0),
        k_cache.page_stride_rows, lut.shape[1] * k_cache.page_size,
        k_cache.num_sparse_slots() // k_cache.page_size, k_cache.cache_lengths, q_row_offsets,
        batch, D=d, NORM=norm, PAGE=k_cache.page_size, BLOCK_B=request_block(batch),
        num_warps=1 if d <= 128 else 2, **pdl_chain_kwargs(qkv),
    )  # fmt: skip
    return q


__all__ = ["rope_store_kv_triton"]
