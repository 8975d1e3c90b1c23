"""Triton stream-K linear for few rows: y = a(x) @ w.T (+ bias), every SM the same weight bytes.

A decode step's linears have few rows (its batch) and a weight of megabytes: they read the
weight once, so their floor is its bytes over the copy bandwidth. cuBLAS tiles the output, and
with 32-50 output tiles of 64 columns (a 2048-4096-wide layer) the GPU's 132 SMs are not all
busy, or are split-K'd with a second reduce launch (docs/kernels/streamk_linear.md).

The work is the weight's (column tile, k-block) units, column tile after column tile, k
fastest: `units = cdiv(N, BN) * cdiv(K, BK)`. Program p of P walks units
[p * units // P, (p + 1) * units // P): each walks the same bytes (within one unit). A tile
whose k-blocks one program covers whole is finished there (bias, rounding, store). A tile cut
between programs: each writes its float32 partial [BM, BN] to a workspace slot (slot 0 for the
first segment of its run, 1 for its last: a run's middle tiles are whole), counts itself on the
tile's counter (a CTA barrier, then one acq_rel atomic at GPU scope), and the program that
counts last sums every partial of the tile in program order (loads that bypass L1), adds the
bias, stores the tile and sets the counter back to 0. The sum's order is fixed by the plan, not
by arrival: a launch's output is the same bit for bit every time.

`SILU_MUL`: x is [M, 2K] (a fused gate|up projection's output) and the operand is
silu(gate) * up computed in float32 and rounded once to the weight's dtype, as
`ops.fused.silu_mul`'s kernel rounds it: the MLP's activation and down projection in one launch.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._triton_interpreter import install_interpreter_shim
from ..prepared import cached_launch, current_device, current_stream, semaphores

install_interpreter_shim()


@triton.jit
def _owner(u, units, P):
    """The program whose run holds unit u: the largest p with p * units // P <= u."""
    return (((u + 1).to(tl.int64) * P - 1) // units).to(tl.int32)


@triton.jit
def _store_tile(acc, Bias, Y, rm, n, mmask, nmask, sym, HAS_BIAS: tl.constexpr):
    if HAS_BIAS:
        acc += tl.load(Bias + n, mask=nmask, other=0.0).to(tl.float32)[None, :]
    tl.store(
        Y + rm[:, None].to(tl.int64) * sym + n[None, :],
        acc.to(Y.dtype.element_ty),
        mask=mmask[:, None] & nmask[None, :],
    )


@triton.jit
def _streamk_linear_kernel(
    X, W, Bias, Y, WS, Sem, M, N, K, sxm, swn, sym, units, KB, P,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, EVEN_K: tl.constexpr,
    SILU_MUL: tl.constexpr, HAS_BIAS: tl.constexpr, STAGES: tl.constexpr,
):  # fmt: skip
    p = tl.program_id(0)
    u0 = (p.to(tl.int64) * units // P).to(tl.int32)
    u1 = ((p.to(tl.int64) + 1) * units // P).to(tl.int32)
    rm = tl.arange(0, BM)
    rn = tl.arange(0, BN)
    rk = tl.arange(0, BK)
    mmask = rm < M
    xrow = X + rm[:, None].to(tl.int64) * sxm
    u = u0
    while u < u1:
        tile = u // KB
        kb0 = u - tile * KB
        kb1 = tl.minimum(KB, kb0 + (u1 - u))
        n = tile * BN + rn
        nmask = n < N
        wrow = W + n[:, None].to(tl.int64) * swn
        acc = tl.zeros((BM, BN), tl.float32)
        for kb in tl.range(kb0, kb1, num_stages=STAGES):
            k = kb * BK + rk
            if EVEN_K:
                xm = mmask[:, None]
                wm = nmask[:, None]
            else:
                xm = mmask[:, None] & (k < K)[None, :]
                wm = nmask[:, None] & (k < K)[None, :]
            if SILU_MUL:
                g = tl.load(xrow + k[None, :], mask=xm, other=0.0).to(tl.float32)
                v = tl.load(xrow + K + k[None, :], mask=xm, other=0.0).to(tl.float32)
                a = (g / (1.0 + tl.exp(-g)) * v).to(W.dtype.element_ty)
            else:
                a = tl.load(xrow + k[None, :], mask=xm, other=0.0)
            w = tl.load(wrow + k[None, :], mask=wm, other=0.0)
            acc = tl.dot(a, tl.trans(w), acc)
        if (kb0 == 0) & (kb1 == KB):
            _store_tile(acc, Bias, Y, rm, n, mmask, nmask, sym, HAS_BIAS)
        else:
            tile_elems: tl.constexpr = BM * BN
            offs = rm[:, None] * BN + rn[None, :]
            slot = tl.where(u == u0, 0, 1)
            tl.store(WS + (p * 2 + slot).to(tl.int64) * tile_elems + offs, acc)
            first = _owner(tile * KB, units, P)
            last = _owner(tile * KB + KB - 1, units, P)
            # every thread's partial stores precede the count; the last program's loads
            # follow it and bypass L1 (the fused decode merge's pattern, ops/mha)
            tl.debug_barrier()
            at_sem = Sem + tile
            if tl.atomic_add(at_sem, 1, sem="acq_rel", scope="gpu") == last - first:
                tl.store(at_sem, 0)
                # the first contributor's run may start before the tile (then the tile is its
                # last segment, slot 1); every later one's run starts inside it (slot 0)
                slot_first = tl.where(first.to(tl.int64) * units // P == tile * KB, 0, 1)
                tot = tl.zeros((BM, BN), tl.float32)
                for q in range(first, last + 1):
                    slot_q = tl.where(q == first, slot_first, 0)
                    part = WS + (q * 2 + slot_q).to(tl.int64) * tile_elems + offs
                    tot += tl.load(part, cache_modifier=".cg")
                _store_tile(tot, Bias, Y, rm, n, mmask, nmask, sym, HAS_BIAS)
        u += kb1 - kb0


def streamk_linear_triton(x, weight, bias, silu_mul: bool, cfg, num_sms: int) -> torch.Tensor:
    """y [M, N] in x's dtype = a(x) @ weight.T (+ bias) (module docstring). x [M, K] (or
    [M, 2K] with silu_mul), rows with unit column stride; weight [N, K] contiguous, x's
    dtype; bias [N] or None; M <= cfg.max_rows. cfg: a `StreamKConfig`."""
    M = x.shape[0]
    N, K = weight.shape
    y = torch.empty(M, N, dtype=x.dtype, device=x.device)
    if M == 0:
        return y
    BM = max(16, triton.next_power_of_2(M))
    BN, BK = cfg.block_n, cfg.block_k
    tiles, KB = triton.cdiv(N, BN), triton.cdiv(K, BK)
    units = tiles * KB
    P = min(units, cfg.ctas_per_sm * num_sms)
    dev = x.device
    ws = torch.empty(P * 2 * BM * BN, dtype=torch.float32, device=dev)
    sem = semaphores(dev, current_stream(current_device(x)), tiles)
    cached_launch(
        _streamk_linear_kernel, (P,),
        x, weight, bias if bias is not None else y, y, ws, sem, M, N, K, x.stride(0),
        weight.stride(0), y.stride(0), units, KB, P,
        BM=BM, BN=BN, BK=BK, EVEN_K=K % BK == 0, SILU_MUL=silu_mul, HAS_BIAS=bias is not None,
        STAGES=cfg.stages, num_warps=cfg.num_warps if BM <= 64 else 2 * cfg.num_warps,
    )  # fmt: skip
    return y
