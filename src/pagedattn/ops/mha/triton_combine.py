"""Triton split-K combine: merge per-partition attention partials by their LSEs.

Same math as `ops.combine.combine_partials` (the reference):
    lse = logsumexp_p(lse_p),  o = sum_p exp(lse_p - lse) * o_p,  o *= 1 / (1 + exp(sink - lse)).
A query no partition saw gets o = 0 and lse = -inf; the returned LSE leaves the sink out. A
partial LSE of NaN (a NaN or +inf score) makes o and lse NaN (docs/ops.md, "NaN and inf").
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..launch import launch
from ..pdl import pdl_enabled, pdl_launch_kwargs, pdl_wait
from ..triton_constants import LN2, LOG2E


@triton.jit
def _combine_kernel(
    PO,
    PL,
    Sinks,
    Out,
    stride_ot,
    stride_oh,
    Lse,
    stride_lt,
    stride_lh,
    num_partitions,
    H: tl.constexpr,
    DV: tl.constexpr,
    DVP: tl.constexpr,
    PP: tl.constexpr,
    HAS_SINKS: tl.constexpr,
    WRITE_LSE: tl.constexpr,
    PDL: tl.constexpr = False,
):
    """One (query row, head). PO [rows, H, P, DV] f32, PL [rows, H, P] f32 (natural-log LSEs)."""
    pdl_wait(PDL)
    pid = tl.program_id(0)
    row = (pid // H).to(tl.int64)
    h = pid % H
    offs_p = tl.arange(0, PP)
    offs_d = tl.arange(0, DVP)
    pmask = offs_p < num_partitions
    base = (row * H + h) * num_partitions
    lse_p = tl.load(PL + base + offs_p, mask=pmask, other=float("-inf")) * LOG2E
    m = tl.max(lse_p, 0)
    m_use = tl.where(m == float("-inf"), 0.0, m)
    w = tl.math.exp2(lse_p - m_use)
    den = tl.sum(w, 0)
    dmask = offs_d < DV
    o_p = tl.load(
        PO + (base + offs_p)[:, None] * DV + offs_d[None, :],
        mask=pmask[:, None] & dmask[None, :],
        other=0.0,
    )
    # den != 0 (not > 0): a NaN partial LSE makes den, the output and the LSE NaN
    o = tl.sum(w[:, None] * o_p, 0) / tl.where(den != 0, den, 1.0)
    lse2 = m_use + tl.math.log2(tl.where(den != 0, den, 1.0))  # log2 units
    if HAS_SINKS:
        sink = tl.load(Sinks + h) * LOG2E
        factor = 1.0 / (1.0 + tl.math.exp2(sink - lse2))
        o = o * tl.where(den != 0, factor, 0.0)
    tl.store(Out + row * stride_ot + h * stride_oh + offs_d, o.to(Out.dtype.element_ty), mask=dmask)
    if WRITE_LSE:
        tl.store(
            Lse + row * stride_lt + h * stride_lh, tl.where(den != 0, lse2 * LN2, float("-inf"))
        )


def combine_triton(
    partial_out: torch.Tensor,
    partial_lse: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor | None = None,
    sinks: torch.Tensor | None = None,
) -> None:
    """partial_out [rows, H, P, DV] f32 contiguous, partial_lse [rows, H, P] f32 ->
    out [rows, H, DV] (any float dtype, last dim contiguous), lse [rows, H] f32 (optional);
    sinks [H] f32 or None. No host sync."""
    rows, H, P, DV = partial_out.shape
    if rows == 0:
        return
    launch(
        _combine_kernel,
        (rows * H,),
        partial_out,
        partial_lse,
        sinks if sinks is not None else partial_lse,
        out,
        out.stride(0),
        out.stride(1),
        lse if lse is not None else partial_lse,
        lse.stride(0) if lse is not None else 0,
        lse.stride(1) if lse is not None else 0,
        P,
        H=H,
        DV=DV,
        DVP=triton.next_power_of_2(DV),
        PP=max(triton.next_power_of_2(P), 2),
        HAS_SINKS=sinks is not None,
        WRITE_LSE=lse is not None,
        PDL=(pdl := pdl_enabled(out)),
        num_warps=4 if DV >= 256 else 2,
        **pdl_launch_kwargs(pdl),
    )
