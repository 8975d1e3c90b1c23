"""Triton kernels of `pagedattn.ops.moe` (same contracts as `reference.py`).

- `_count_kernel` / `_place_kernel` (`moe_plan_triton`): a program per bucket (each expert, and
  the out-of-range bucket E) counts its rows, then places them: its first block is the sum of
  the lower buckets' blocks, its rows go in ascending order (a prefix sum a chunk). Two
  launches, no atomics, so the plan is the reference's exactly; no host sync.
- `_expert_mm_kernel` (`expert_matmul_triton`): a program per (block of the plan, BLOCK_N
  output columns). It loads the block's expert and rows, gathers their activations (the
  token's row, or the slot's) and streams w[e]'s [BLOCK_N, K] slab through a `tl.dot` loop
  (float32 accumulator; an FP8 weight is converted to x's dtype in registers and each BLOCK_K
  chunk's product is scaled by its block's scale). With `silu_mul` it also streams the up
  rows of its columns into a second accumulator. Epilogue: bias, silu(gate) * up, row weight,
  a store to each slot row. Unused blocks return at once; an out-of-range block writes NaN.
  At decode (a few rows an expert) the launch reads each routed expert's weights once, at the
  memory-bound floor (docs/kernels/moe.md).
- `_moe_sum_kernel` (`moe_sum_triton`): each token's top_k rows summed in float32, in slot
  order, rounded once.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._triton_interpreter import install_interpreter_shim
from ..prepared import cached_launch
from .plan import MoEPlan, plan_capacity
from .tuning import MoETuning

install_interpreter_shim()


@triton.jit
def _bucket(ids, E):
    return tl.where((ids < 0) | (ids >= E), E, ids)


@triton.jit
def _count_kernel(IDS, COUNTS, N, E, BLOCK: tl.constexpr):
    e = tl.program_id(0)
    n = 0
    for start in range(0, N, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        m = offs < N
        b = _bucket(tl.load(IDS + offs, mask=m, other=0), E)
        n += tl.sum((m & (b == e)).to(tl.int32), axis=0)
    tl.store(COUNTS + e, n)


@triton.jit
def _place_kernel(IDS, COUNTS, ROWS, BEXP, N, E, CAP, BM: tl.constexpr, BLOCK: tl.constexpr,
                  E_P2: tl.constexpr):  # fmt: skip
    e = tl.program_id(0)
    ar_e = tl.arange(0, E_P2)
    blocks = (tl.load(COUNTS + ar_e, mask=ar_e <= E, other=0) + BM - 1) // BM
    first = tl.sum(tl.where(ar_e < e, blocks, 0), axis=0)
    mine = tl.sum(tl.where(ar_e == e, blocks, 0), axis=0)
    base = first * BM
    pos = 0
    for start in range(0, N, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        m = offs < N
        hit = m & (_bucket(tl.load(IDS + offs, mask=m, other=0), E) == e)
        h = hit.to(tl.int32)
        tl.store(ROWS + base + pos + tl.cumsum(h, axis=0) - 1, offs, mask=hit)
        pos += tl.sum(h, axis=0)
    ar_m = tl.arange(0, BM)
    tl.store(ROWS + base + pos + ar_m, N, mask=ar_m < mine * BM - pos)  # the last block's pad
    ar = tl.arange(0, BLOCK)
    for j in range(0, mine, BLOCK):
        tl.store(BEXP + first + j + ar, e, mask=j + ar < mine)
    if e == E:  # the last bucket: the unused blocks after it
        used = first + mine
        for j in range(used, CAP, BLOCK):
            blk = j + ar
            tl.store(BEXP + blk, -1, mask=blk < CAP)
            tl.store(ROWS + blk[:, None] * BM + ar_m[None, :], N, mask=(blk < CAP)[:, None])


def moe_plan_triton(topk_ids: torch.Tensor, num_experts: int, block_m: int) -> MoEPlan:
    T, k = topk_ids.shape
    n = T * k
    cap = plan_capacity(n, num_experts, block_m)
    dev = topk_ids.device
    ids = topk_ids.reshape(-1)
    if not ids.is_contiguous():
        ids = ids.contiguous()
    counts = torch.empty(num_experts + 1, dtype=torch.int32, device=dev)
    rows = torch.empty(cap * block_m, dtype=torch.int32, device=dev)
    experts = torch.empty(cap, dtype=torch.int32, device=dev)
    block = 1024 if n > 256 else 256
    cached_launch(_count_kernel, (num_experts + 1,), ids, counts, n, num_experts, BLOCK=block,
                  num_warps=4)  # fmt: skip
    cached_launch(
        _place_kernel, (num_experts + 1,), ids, counts, rows, experts, n, num_experts, cap,
        BM=block_m, BLOCK=block, E_P2=triton.next_power_of_2(num_experts + 1), num_warps=4,
    )  # fmt: skip
    return MoEPlan(rows, experts, n, k, num_experts, block_m)


@triton.jit
def _w_tile(w_ptrs, mk, mn):
    """A [BK, BN] weight tile (rows past N or columns past K: 0)."""
    return tl.load(w_ptrs, mask=mk[:, None] & mn[None, :], other=0.0)


@triton.jit
def _tile_dot(acc, a, b, WS, e, sse, ssn, ssk, rows_n, k0, mn, N_GRAN, K_GRAN,
              HAS_SCALE: tl.constexpr, IEEE: tl.constexpr):  # fmt: skip
    """acc + a @ b, b's columns (weight rows rows_n) scaled by their FP8 block's scale."""
    if HAS_SCALE:
        s = tl.load(WS + e * sse + (rows_n // N_GRAN) * ssn + (k0 // K_GRAN) * ssk, mask=mn,
                    other=0.0)  # fmt: skip
        if IEEE:
            p = tl.dot(a, b.to(a.dtype), input_precision="ieee")
        else:
            p = tl.dot(a, b.to(a.dtype))
        return acc + p * s[None, :]
    elif IEEE:
        return tl.dot(a, b, acc, input_precision="ieee")
    else:
        return tl.dot(a, b, acc)


@triton.jit
def _expert_mm_kernel(
    X, W, WS, BIAS, RW, OUT, ROWS, BEXP,
    N_ROWS, TOP_K, N, K, E,
    sxm, sxk, swe, swn, swk, sse, ssn, ssk, sbe, sbn, som, son,
    N_GRAN, K_GRAN,
    TOKEN_ROWS: tl.constexpr, SILU_MUL: tl.constexpr, HAS_SCALE: tl.constexpr,
    HAS_BIAS: tl.constexpr, HAS_RW: tl.constexpr, IEEE: tl.constexpr,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, STAGES: tl.constexpr,
):  # fmt: skip
    """N output columns of the expert's N weight rows, or of 2 N with SILU_MUL (the gate rows n
    and the up rows N + n of each output column n, combined as silu(gate) * up)."""
    pid_b = tl.program_id(0)
    pid_n = tl.program_id(1)
    e = tl.load(BEXP + pid_b)
    if e < 0:
        return
    rows = tl.load(ROWS + pid_b * BM + tl.arange(0, BM))
    valid = rows < N_ROWS
    offs_n = pid_n * BN + tl.arange(0, BN)
    mn = offs_n < N
    o_ptrs = OUT + rows.to(tl.int64)[:, None] * som + offs_n[None, :] * son
    om = valid[:, None] & mn[None, :]
    if e >= E:  # rows routed outside [0, E)
        tl.store(o_ptrs, tl.full((BM, BN), float("nan"), tl.float32).to(OUT.dtype.element_ty),
                 mask=om)  # fmt: skip
        return
    src = rows // TOP_K if TOKEN_ROWS else rows
    x_rows = X + src.to(tl.int64)[:, None] * sxm
    w_base = W + e.to(tl.int64) * swe + offs_n[None, :].to(tl.int64) * swn
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    acc_u = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in tl.range(0, K, BK, num_stages=STAGES):
        offs_k = k0 + tl.arange(0, BK)
        mk = offs_k < K
        a = tl.load(x_rows + offs_k[None, :] * sxk, mask=valid[:, None] & mk[None, :], other=0.0)
        w_ptrs = w_base + offs_k[:, None] * swk
        b = _w_tile(w_ptrs, mk, mn)
        acc = _tile_dot(acc, a, b, WS, e, sse, ssn, ssk, offs_n, k0, mn, N_GRAN, K_GRAN,
                        HAS_SCALE, IEEE)  # fmt: skip
        if SILU_MUL:  # the up rows, N further
            b = _w_tile(w_ptrs + N * swn, mk, mn)
            acc_u = _tile_dot(acc_u, a, b, WS, e, sse, ssn, ssk, N + offs_n, k0, mn, N_GRAN,
                              K_GRAN, HAS_SCALE, IEEE)  # fmt: skip
    if HAS_BIAS:
        acc += tl.load(BIAS + e * sbe + offs_n * sbn, mask=mn, other=0.0).to(tl.float32)[None, :]
        if SILU_MUL:
            bu = tl.load(BIAS + e * sbe + (N + offs_n) * sbn, mask=mn, other=0.0)
            acc_u += bu.to(tl.float32)[None, :]
    if SILU_MUL:
        acc = acc / (1.0 + tl.exp(-acc)) * acc_u
    if HAS_RW:
        acc *= tl.load(RW + rows, mask=valid, other=0.0).to(tl.float32)[:, None]
    tl.store(o_ptrs, acc.to(OUT.dtype.element_ty), mask=om)


def expert_matmul_triton(x, w, plan: MoEPlan, *, w_scale=None, w_block=(128, 128), bias=None,
                         row_weights=None, activation=None, out_dtype=None,
                         tuning: MoETuning | None = None):  # fmt: skip
    nw, kdim = w.shape[1], w.shape[2]
    silu = activation == "silu_mul"
    n_out = nw // 2 if silu else nw
    out = torch.empty(plan.num_rows, n_out, dtype=out_dtype or x.dtype, device=x.device)
    if plan.num_rows == 0 or n_out == 0:
        return out
    blocks = w_block if w_scale is not None else None
    cfg = (tuning or MoETuning.current()).matmul(plan.block_m, blocks, silu)
    dummy = out
    ws = w_scale if w_scale is not None else dummy
    b = bias if bias is not None else dummy
    rw = row_weights.reshape(-1) if row_weights is not None else dummy
    ss = w_scale.stride() if w_scale is not None else (0, 0, 0)
    sb = bias.stride() if bias is not None else (0, 0)
    cached_launch(
        _expert_mm_kernel, (plan.capacity, triton.cdiv(n_out, cfg.block_n)),
        x, w, ws, b, rw, out, plan.sorted_rows, plan.block_experts,
        plan.num_rows, plan.top_k, n_out, kdim, plan.num_experts,
        x.stride(0), x.stride(1), w.stride(0), w.stride(1), w.stride(2), *ss, *sb,
        out.stride(0), out.stride(1), w_block[0], w_block[1],
        TOKEN_ROWS=x.shape[0] != plan.num_rows, SILU_MUL=silu,
        HAS_SCALE=w_scale is not None, HAS_BIAS=bias is not None,
        HAS_RW=row_weights is not None, IEEE=x.dtype == torch.float32,
        BM=plan.block_m, BN=cfg.block_n, BK=cfg.block_k, STAGES=cfg.stages,
        num_warps=cfg.num_warps,
    )  # fmt: skip
    return out


@triton.jit
def _moe_sum_kernel(Y, OUT, N, TOP_K, sy, so, BLOCK: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    m = cols < N
    acc = tl.load(Y + t * TOP_K * sy + cols, mask=m, other=0.0).to(tl.float32)
    for s in range(1, TOP_K):
        acc += tl.load(Y + (t * TOP_K + s) * sy + cols, mask=m, other=0.0).to(tl.float32)
    tl.store(OUT + t * so + cols, acc.to(OUT.dtype.element_ty), mask=m)


def moe_sum_triton(y: torch.Tensor, top_k: int, out_dtype: torch.dtype) -> torch.Tensor:
    T, N = y.shape[0] // top_k, y.shape[1]
    out = torch.empty(T, N, dtype=out_dtype, device=y.device)
    if T == 0 or N == 0:
        return out
    block = min(1024, triton.next_power_of_2(N))
    cached_launch(_moe_sum_kernel, (T, triton.cdiv(N, block)), y, out, N, top_k, y.stride(0),
                  out.stride(0), BLOCK=block, num_warps=max(1, min(4, block // 256)))  # fmt: skip
    return out
