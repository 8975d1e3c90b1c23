"""The balanced work list of dense MLA decode, and the combine that merges its split tiles.

A dense decode launch's work is a list of items (tile, chunk). Request b has q_len_b query
tokens in tiles of TPT tokens (`tiles_b = cdiv(q_len_b, TPT)`, the leader of tile j is token
`q_row_offsets[b] + j * TPT`); each tile reads at most `n_b = cache_len_b + q_len_b` keys,
`w_b = cdiv(n_b, BN)` blocks of BN keys. Every tile of request b splits into c_b chunks so that
an item holds about `cb` blocks, the same for all requests of the step:

    total = sum_b tiles_b * w_b,   cb = max(MIN_BLOCKS, cdiv(9 total, 8 TARGET)),
    c_b = max(1, cdiv(w_b, cb)),   chunk_b = cdiv(w_b, c_b) * BN keys,
    items_b = tiles_b * c_b.

Items are numbered request-major, then tile, then chunk. `sum_b items_b <= TARGET + sum_b
tiles_b <= TARGET + tokens`, so a grid of (TARGET + tokens) x head-block programs covers every
step of that token count: the host knows both, reads no length, and a captured CUDA graph
replays with new lengths (programs past the list exit). TARGET is one wave of the kernel's
resident CTAs over its head blocks (`triton_mla_plan`); a long request among short ones gets
many items, so every SM shares it (the GQA list, `ops.mha.triton_worklist`, does the same for
one query a request). The 9/8 lets an item hold 12.5% over the even share, so a uniform batch
keeps whole tiles; MIN_BLOCKS keeps an item's prologue (its q and first pages, ~5 us on sm_90)
a small part of it.

Each program derives the list itself from q_row_offsets and cache lengths (a [B_P2] vector: two
loads, a division and a prefix sum), so a launch needs no planner and no plan buffer; the
combine derives the same list. The Gluon kernels' form of `mla_find_item` is
`sm90.gluon_mla.g_work_item` (same arithmetic).

Item k of tile (b, j), chunk p sees keys [p chunk_b, (p + 1) chunk_b) of that tile's range (the
kernel clamps it to the causal limit). A tile of one item writes the final output (sinks
folded in) and its LSE; a tile of several writes normalised float32 partials at rows
`k * TPT + i` (i: the token's index in the tile) of PO [items * TPT, h_q, D_V] / PL [items *
TPT, h_q] (natural-log LSE), and `_mla_worklist_combine_kernel` merges them (sinks, LSE, NaN as
in `ops.combine`).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..launch import launch
from ..pdl import pdl_enabled, pdl_launch_kwargs, pdl_wait
from ..triton_constants import LN2, LOG2E


@triton.jit
def mla_work_list(
    QOFF,
    K_CL,
    batch,
    TPT: tl.constexpr,
    BN: tl.constexpr,
    TARGET: tl.constexpr,
    MIN_BLOCKS: tl.constexpr,
    B_P2: tl.constexpr,
):
    """(r [B_P2] request ids, c [B_P2] chunks a tile, n [B_P2] items a request (0 past batch),
    incl [B_P2] inclusive prefix sums of n, chunk [B_P2] keys a chunk, o_lo [B_P2] first
    token) of the module docstring's list."""
    r = tl.arange(0, B_P2)
    rm = r < batch
    o_lo = tl.load(QOFF + r, mask=rm, other=0)
    o_hi = tl.load(QOFF + r + 1, mask=rm, other=0)
    q_len = tl.maximum(o_hi - o_lo, 0)
    cl = tl.maximum(tl.load(K_CL + r, mask=rm, other=0), 0)
    tiles = tl.where(rm, tl.cdiv(q_len, TPT), 0)
    w = tl.cdiv(cl + q_len, BN)
    total = tl.sum(tiles.to(tl.int64) * w, 0)
    cb = tl.maximum(tl.cdiv(total * 9, TARGET * 8), MIN_BLOCKS).to(tl.int32)
    c = tl.maximum(tl.cdiv(w, cb), 1)
    n = tiles * c
    chunk = tl.cdiv(w, c) * BN
    incl = tl.cumsum(n, 0)
    return r, c, n, incl, chunk, o_lo


@triton.jit
def mla_find_item(r, c, n, incl, chunk, o_lo, k, TPT: tl.constexpr):
    """(valid, t, lo, hi, c_b) of item k of the list `mla_work_list` returns: whether k is an
    item, its tile's leader token t, its chunk's keys [lo, hi) (before the causal clamp) and
    the chunks of its tile."""
    valid = k < tl.sum(n, 0)
    b = tl.sum(tl.where(incl <= k, 1, 0), 0)
    at = r == b
    n_b = tl.sum(tl.where(at, n, 0), 0)
    c_b = tl.maximum(tl.sum(tl.where(at, c, 0), 0), 1)
    local = k - (tl.sum(tl.where(at, incl, 0), 0) - n_b)
    j = local // c_b
    lo = (local % c_b) * tl.sum(tl.where(at, chunk, 0), 0)
    t = tl.sum(tl.where(at, o_lo, 0), 0) + j * TPT
    return valid, t, lo, lo + tl.sum(tl.where(at, chunk, 0), 0), c_b


def mla_host_item_count(
    q_row_offsets: torch.Tensor,
    cache_lens: torch.Tensor,
    *,
    tpt: int,
    bn: int,
    target: int,
    min_blocks: int,
) -> int:
    """The number of items `mla_work_list` makes, from host tensors (torch arithmetic that
    mirrors the kernel's). The launcher sizes the grid with it where the lengths are already on
    the host (the CPU, where Triton's interpreter would otherwise run every program of the
    bound)."""
    offs = q_row_offsets.to(torch.int64)
    q_len = (offs[1:] - offs[:-1]).clamp(min=0)
    cl = cache_lens.to(torch.int64).clamp(min=0)
    tiles = (q_len + tpt - 1) // tpt
    w = (cl + q_len + bn - 1) // bn
    total = int((tiles * w).sum())
    cb = max(-(-total * 9 // (target * 8)), min_blocks)
    c = ((w + cb - 1) // cb).clamp(min=1)
    return int((tiles * c).sum())


@triton.jit
def _mla_worklist_combine_kernel(
    QOFF,
    K_CL,
    batch,
    PO,  # [items * TPT, H_Q, D_V] f32
    PL,  # [items * TPT, H_Q] f32
    SINK,
    OUT,
    stride_ot,
    stride_oh,
    LSE,  # [tokens, H_Q] f32 contiguous
    H_Q: tl.constexpr,
    BH: tl.constexpr,
    D_V: tl.constexpr,
    D_PAD: tl.constexpr,
    TPT: tl.constexpr,
    BN: tl.constexpr,
    TARGET: tl.constexpr,
    MIN_BLOCKS: tl.constexpr,
    B_P2: tl.constexpr,
    HAS_SINK: tl.constexpr,
    PDL: tl.constexpr = False,
):
    """One (token, block of BH heads): merge the partials of its tile's items when the tile
    has several (a tile of one item was written by the decode kernel), one item a step; a
    token of no request (past q_row_offsets[batch]) gets output 0 and LSE -inf."""
    pdl_wait(PDL)
    t = tl.program_id(0)
    hb = tl.program_id(1)
    r, c, n, incl, chunk, o_lo = mla_work_list(QOFF, K_CL, batch, TPT, BN, TARGET, MIN_BLOCKS, B_P2)
    b = tl.sum(tl.where((o_lo <= t) & (r < batch), 1, 0), 0) - 1
    at = r == b
    c_b = tl.maximum(tl.sum(tl.where(at, c, 0), 0), 1)
    n_b = tl.sum(tl.where(at, n, 0), 0)
    i0 = t - tl.sum(tl.where(at, o_lo, 0), 0)
    t64 = t.to(tl.int64)
    offs_h = hb * BH + tl.arange(0, BH)
    offs_d = tl.arange(0, D_PAD)
    hmask = offs_h < H_Q
    dmask = offs_d < D_V
    omask = hmask[:, None] & dmask[None, :]
    optr = OUT + t64 * stride_ot + offs_h[:, None] * stride_oh + offs_d[None, :]
    if (b < 0) | (i0 // TPT >= n_b // c_b):  # a token past the requests' (no item has it)
        tl.store(optr, tl.zeros([BH, D_PAD], OUT.dtype.element_ty), mask=omask)
        tl.store(LSE + t64 * H_Q + offs_h, tl.full([BH], float("-inf"), tl.float32), mask=hmask)
    elif c_b > 1:
        first = tl.sum(tl.where(at, incl, 0), 0) - n_b + (i0 // TPT) * c_b
        m = tl.full([BH], float("-inf"), tl.float32)
        den = tl.zeros([BH], tl.float32)
        acc = tl.zeros([BH, D_PAD], tl.float32)
        for p in range(0, c_b):
            prow = ((first + p).to(tl.int64) * TPT + i0 % TPT) * H_Q + offs_h
            lp = tl.load(PL + prow, mask=hmask, other=float("-inf")) * LOG2E
            m_new = tl.maximum(m, lp)
            m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
            alpha = tl.math.exp2(m - m_use)
            w = tl.math.exp2(lp - m_use)
            o = tl.load(PO + prow[:, None] * D_V + offs_d[None, :], mask=omask, other=0.0)
            # an unseen partial (lse -inf, w 0) adds nothing; a NaN one makes the row NaN
            acc = acc * alpha[:, None] + tl.where(
                (lp != float("-inf"))[:, None], w[:, None] * o, 0.0
            )
            den = den * alpha + w
            m = m_new
        has = den != 0.0
        m_use = tl.where(m == float("-inf"), 0.0, m)
        inv = tl.where(has, 1.0 / tl.where(has, den, 1.0), 0.0)
        if HAS_SINK:
            sink = tl.load(SINK + offs_h, mask=hmask, other=0.0)
            # 1 / (den + exp(sink - m)) in the max-shifted frame; sink=+inf -> 0
            inv = tl.where(has, 1.0 / (den + tl.math.exp2(sink * LOG2E - m_use)), 0.0)
        tl.store(optr, (acc * inv[:, None]).to(OUT.dtype.element_ty), mask=omask)
        lse = tl.where(has, (m_use + tl.math.log2(tl.where(has, den, 1.0))) * LN2, float("-inf"))
        tl.store(LSE + t64 * H_Q + offs_h, lse, mask=hmask)


def mla_worklist_combine_triton(
    q_row_offsets: torch.Tensor,
    cache_lens: torch.Tensor,
    partial_out: torch.Tensor,
    partial_lse: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    sinks: torch.Tensor | None,
    *,
    tpt: int,
    bn: int,
    target: int,
    min_blocks: int,
) -> None:
    """Merge the split tiles of a balanced MLA decode launch (same list arguments as the
    launch). partial_out [items * TPT, h_q, d_v] f32, partial_lse [items * TPT, h_q] f32; out
    [tokens, h_q, d_v] (last dim contiguous), lse [tokens, h_q] f32 contiguous; sinks [h_q] f32
    or None. No host sync."""
    tokens, h_q, d_v = out.shape
    batch = q_row_offsets.shape[0] - 1
    if tokens == 0 or batch == 0:
        return
    bh = min(16, triton.next_power_of_2(h_q))
    launch(
        _mla_worklist_combine_kernel,
        (tokens, triton.cdiv(h_q, bh)),
        q_row_offsets,
        cache_lens,
        batch,
        partial_out,
        partial_lse,
        sinks if sinks is not None else partial_lse,
        out,
        out.stride(0),
        out.stride(1),
        lse,
        H_Q=h_q,
        BH=bh,
        D_V=d_v,
        D_PAD=triton.next_power_of_2(d_v),
        TPT=tpt,
        BN=bn,
        TARGET=target,
        MIN_BLOCKS=min_blocks,
        B_P2=triton.next_power_of_2(batch + 1),
        HAS_SINK=sinks is not None,
        PDL=(pdl := pdl_enabled(out)),
        num_warps=4,
        **pdl_launch_kwargs(pdl),
    )


__all__ = ["mla_host_item_count", "mla_worklist_combine_triton"]
