"""Split-K combine for MLA decode (Triton).

Each partition p of a query row's keys left `o_p` (normalised over its keys, float32) and
`lse_p` (natural log, -inf when it saw no key). This kernel merges them:

    lse = logsumexp_p(lse_p),   o = sum_p exp(lse_p - lse) * o_p,

and folds the sink logit in: o *= 1 / (1 + exp(sink - lse)) (sink = +inf gives 0). A row no
partition saw gets o = 0 and lse = -inf; a partial LSE of NaN (a NaN or +inf score) makes o
and lse NaN (docs/ops.md, "NaN and inf"). Same math as `pagedattn.ops.combine.combine_partials`.

With `cut` (the persistent decode, `gluon_mla_ps`) the partials are those of the tokens that a
cluster boundary cuts in two: row slot s of [2, G, h_q] holds the token (CUT_T[s]) at pair
(s + 1) L of the work order (NPR pairs a token) where that boundary falls inside it; every
other row is left alone.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..launch import launch
from ..pdl import pdl_enabled, pdl_launch_kwargs, pdl_wait
from ..triton_constants import LN2, LOG2E


@triton.jit
def _mla_combine_kernel(
    PO,  # [P, rows, D_V] f32 partial outputs (rows = tokens * h_q, contiguous)
    PL,  # [P, rows] f32 partial LSEs
    SINK,  # [h_q] f32 (read only when HAS_SINK)
    OUT,  # [tokens, h_q, >= D_V] q.dtype, strides (stride_ot, stride_oh, 1)
    LSE,  # [rows] f32
    n_rows,
    stride_ot,
    stride_oh,
    P: tl.constexpr,
    H_Q: tl.constexpr,
    D_V: tl.constexpr,
    D_PAD: tl.constexpr,
    BR: tl.constexpr,
    HAS_SINK: tl.constexpr,
    PDL: tl.constexpr = False,
    CUT: tl.constexpr = False,
    CUT_L=0,
    CUT_NPR=1,
    CUT_T=None,
    CUT_N=0,
):
    """One program merges BR query rows over P partitions (CUT: see the module docstring)."""
    pdl_wait(PDL)
    r = tl.program_id(0) * BR + tl.arange(0, BR)
    rmask = r < n_rows
    r64 = r.to(tl.int64)
    h64 = r64 % H_Q
    if CUT:  # slot r // H_Q: the token holding boundary (slot + 1) L, where it cuts one
        pos = (r64 // H_Q + 1) * CUT_L
        rmask = rmask & (pos % CUT_NPR != 0) & (pos < CUT_N * CUT_NPR)
        t = tl.load(CUT_T + r64 // H_Q, mask=rmask, other=0).to(tl.int64)
    else:
        t = r64 // H_Q
    d = tl.arange(0, D_PAD)
    dmask = d < D_V

    # Pass 1: the largest partition LSE (log2 units).
    m = tl.full([BR], float("-inf"), tl.float32)
    for p in tl.static_range(P):
        lp = tl.load(PL + p * n_rows + r64, mask=rmask, other=float("-inf"))
        m = tl.maximum(m, lp * LOG2E)
    m_safe = tl.where(m == float("-inf"), 0.0, m)

    # Pass 2: weighted sum. Partitions with lse = -inf get weight 0 and their values are
    # dropped (the loads do not wait for the LSEs: the partial outputs stream in at once).
    acc = tl.zeros([BR, D_PAD], tl.float32)
    den = tl.zeros([BR], tl.float32)
    for p in tl.static_range(P):
        lp = tl.load(PL + p * n_rows + r64, mask=rmask, other=float("-inf"))
        w = tl.exp2(lp * LOG2E - m_safe)
        seen = lp != float("-inf")  # a NaN partial LSE is kept: it makes the row NaN
        o = tl.load(
            PO + (p * n_rows + r64)[:, None] * D_V + d[None, :],
            mask=rmask[:, None] & dmask[None, :],
            other=0.0,
        )
        acc += tl.where(seen[:, None], w[:, None] * o, 0.0)
        den += w
    lse2 = m_safe + tl.log2(den)  # log2 of sum_p exp(lse_p)
    has = den != 0.0  # NaN too
    inv = tl.where(has, 1.0 / tl.where(has, den, 1.0), 0.0)
    if HAS_SINK:
        sink = tl.load(SINK + h64, mask=rmask, other=0.0)
        # 1 / (den + exp(sink - m)) in the max-shifted frame; sink=+inf -> 0.
        extra = tl.exp2(sink * LOG2E - m_safe)
        inv = tl.where(has, 1.0 / (den + extra), 0.0)
    out = acc * inv[:, None]
    lse = tl.where(has, lse2 * LN2, float("-inf"))
    optr = OUT + t[:, None] * stride_ot + h64[:, None] * stride_oh + d[None, :]
    tl.store(optr, out.to(OUT.dtype.element_ty), mask=rmask[:, None] & dmask[None, :])
    tl.store(LSE + t * H_Q + h64, lse, mask=rmask)


def mla_combine_triton(
    partial_out: torch.Tensor,
    partial_lse: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    sinks: torch.Tensor | None = None,
    cut: tuple[int, int, torch.Tensor] | None = None,
) -> None:
    """Merge split-K partials into `out` and `lse` in place.

    partial_out: [P, tokens, h_q, d_v] float32 contiguous; partial_lse: [P, tokens, h_q] f32;
    out: [tokens, h_q, d_v] (last-dim stride 1); lse: [tokens, h_q] float32 contiguous;
    sinks: [h_q] float32 logits or None. cut (L, NPR, CUT_T): the partials are [2, G, h_q,
    ...] of the tokens cut at cluster boundaries, CUT_T [G] int32 their tokens (module
    docstring).
    """
    P, rows, h_q, d_v = partial_out.shape
    n_rows = rows * h_q
    if n_rows == 0:
        return
    BR = 8
    grid = (triton.cdiv(n_rows, BR),)
    launch(
        _mla_combine_kernel,
        grid,
        partial_out,
        partial_lse,
        sinks if sinks is not None else partial_lse,
        out,
        lse,
        n_rows,
        out.stride(0),
        out.stride(1),
        P=P,
        H_Q=h_q,
        D_V=d_v,
        D_PAD=triton.next_power_of_2(d_v),
        BR=BR,
        HAS_SINK=sinks is not None,
        PDL=(pdl := pdl_enabled(out)),
        CUT=cut is not None,
        CUT_L=cut[0] if cut else 0,
        CUT_NPR=cut[1] if cut else 1,
        CUT_T=cut[2] if cut else partial_lse,
        CUT_N=out.shape[0],
        num_warps=4,
        **pdl_launch_kwargs(pdl),
    )
