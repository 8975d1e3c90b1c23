"""`linear_small_m_triton`: y = x @ w.T for a decode step's few rows (M <= 64), launched as a
link of the decode step's PDL chain (`ops.pdl`), its weight fetched into L2 before the wait.

A cuBLAS GEMM in a decode step pays ~4 us that do not scale with its bytes (launch, the first
DRAM round trip, the ramp; H200, docs/kernels/streamk_linear.md: the Llama-3.2-1B o projection
6.3 us for its 2.0 us of bytes, 5.4 us with its weight already in L2). A cuBLAS kernel cannot
start under the kernel before it. This one is launched with programmatic dependent launch: its
CTAs start while the kernel before it drains, and each first prefetches its own rows of the
weight (which no kernel of the step writes) into L2 (`prefetch.global.L2::evict_last`, a line
of 128 bytes a lane), then waits (`griddepcontrol.wait`) for the earlier grids before it reads
x, the previous kernel's output.

Grid: one program per BN output columns (all M rows in one [BM, BN] tile, BM 16 or 64), K in
BK steps (Triton's software pipeline, STAGES deep). BN is chosen so that the
grid covers every SM about twice where N allows (`small_m_config`). The engine routes a shape
and row count here only where start-up timing found it faster (`models.gemm_routes`).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...cache.dispatch import num_sms
from .._triton_interpreter import install_interpreter_shim
from ..launch import launch
from ..pdl import pdl_chain_kwargs, pdl_wait

install_interpreter_shim()

MAX_M = 64  # rows of one tile: the decode buckets up to 64
_LINE = 128  # bytes a prefetch instruction covers (an L2 line)


@triton.jit
def _prefetch_rows(W, n0, N, K, stride_wn, BN: tl.constexpr, PL: tl.constexpr, ELEMS: tl.constexpr):
    """Prefetch rows [n0, n0 + BN) of W [N, K] into L2, PL lines of ELEMS elements a row a
    step (addresses past the rows clamped to their last element)."""
    rn = tl.minimum(n0 + tl.arange(0, BN), N - 1).to(tl.int64)
    for k0 in tl.range(0, K, PL * ELEMS):
        rk = tl.minimum(k0 + tl.arange(0, PL) * ELEMS, K - 1)
        ptrs = W + rn[:, None] * stride_wn + rk[None, :]
        tl.inline_asm_elementwise(
            "prefetch.global.L2::evict_last [$1]; mov.u32 $0, 0;",
            "=r,l",
            [ptrs],
            dtype=tl.int32,
            is_pure=False,
            pack=1,
        )


@triton.jit(do_not_specialize=["M"])
def _linear_small_m_kernel(
    X,  # [M, K], stride (stride_xm, 1)
    W,  # [N, K], stride (stride_wn, 1)
    Y,  # [M, N] contiguous
    M,
    N,
    K,
    stride_xm,
    stride_wn,
    BM: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
    PREFETCH: tl.constexpr,
    PL: tl.constexpr,
    ELEMS: tl.constexpr,
    PDL: tl.constexpr = False,
):
    """One program: Y[:, n0:n0 + BN] = X @ W[n0:n0 + BN].T, fp32 accumulation."""
    n0 = tl.program_id(0) * BN
    if PREFETCH:  # the weight is no earlier kernel's output: fetched before the wait
        _prefetch_rows(W, n0, N, K, stride_wn, BN, PL, ELEMS)
    pdl_wait(PDL)
    rm = tl.arange(0, BM)
    rn = n0 + tl.arange(0, BN)
    mmask, nmask = rm < M, rn < N
    xrow = X + rm.to(tl.int64)[:, None] * stride_xm
    wrow = W + rn.to(tl.int64)[:, None] * stride_wn
    acc = tl.zeros([BM, BN], tl.float32)
    for k0 in tl.range(0, K, BK):
        rk = k0 + tl.arange(0, BK)
        kmask = rk < K
        x = tl.load(xrow + rk[None, :], mask=mmask[:, None] & kmask[None, :], other=0.0)
        w = tl.load(wrow + rk[None, :], mask=nmask[:, None] & kmask[None, :], other=0.0)
        acc = tl.dot(x, tl.trans(w), acc)
    y = Y + rm.to(tl.int64)[:, None] * N + rn[None, :]
    tl.store(y, acc.to(Y.dtype.element_ty), mask=mmask[:, None] & nmask[None, :])


def small_m_config(m: int, n: int, k: int, sms: int) -> dict:
    """The launch shape of an [m, k] x [n, k]^T product: BM 16 for m <= 16 (mma.sync), else 64
    (one warpgroup MMA; the padding rows cost no bytes): two binaries a weight shape, M not
    specialized on; BN the largest of 16..128 whose grid still has 2 programs a SM (16 where N
    has fewer columns); BK 128 (256 where K >= 8192), 4 stages (3 at BK 256)."""
    bm = 16 if m <= 16 else MAX_M
    bn = 16
    while bn < 128 and triton.cdiv(n, bn * 2) >= 2 * sms:
        bn *= 2
    bk = 256 if k >= 8192 else 128
    return dict(BM=bm, BN=bn, BK=bk, num_warps=4, num_stages=3 if bk == 256 else 4)


def linear_small_m_triton(x: torch.Tensor, w: torch.Tensor, out: torch.Tensor | None = None,
                          *, sms: int | None = None) -> torch.Tensor:  # fmt: skip
    """y = x @ w.T (fp32 accumulation, rounded to x's dtype). x [M, K] with M <= MAX_M and a
    last-dim stride of 1; w [N, K] of x's dtype (bf16 / fp16), last-dim stride 1; out None or
    a contiguous [M, N] tensor of x's dtype. Checked by `linear_small_m`. On CUDA sm_90+ the
    launch is a PDL link (`ops.pdl.pdl_chain_kwargs`) with its weight prefetched first; under
    Triton's interpreter (the CPU) a plain launch without the prefetch."""
    m, k = x.shape
    n = w.shape[0]
    if out is None:
        out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m == 0 or n == 0:
        return out
    if k == 0:
        return out.zero_()
    if sms is None:
        sms = num_sms(x.device) if x.is_cuda else 8
    cfg = small_m_config(m, n, k, sms)
    pdl = pdl_chain_kwargs(x)
    elems = _LINE // w.element_size()
    launch(
        _linear_small_m_kernel,
        (triton.cdiv(n, cfg["BN"]),),
        x, w, out, m, n, k, x.stride(0), w.stride(0),
        PREFETCH=bool(pdl), PL=32, ELEMS=elems, **cfg, **pdl,
    )  # fmt: skip
    return out


__all__ = ["MAX_M", "linear_small_m_triton", "small_m_config"]
