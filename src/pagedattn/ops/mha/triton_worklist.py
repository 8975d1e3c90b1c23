"""The balanced work list of MHA/GQA decode, and the combine that merges its split rows.

A decode launch's work is a list of items (row, chunk): row r (one query) sees keys [lo, hi)
(`triton_tiles.visible_range`); its BLOCK_N-aligned tiles split into n_r chunks so that every
item holds about `cb` tiles, the same for all rows of the step:

    total = sum_r tiles_r,   cb = max(MIN_BLOCKS, cdiv(total, TARGET)),
    n_r = max(1, round(tiles_r / cb)),   chunk_r = cdiv(tiles_r, n_r) tiles.

Items are numbered by bucket of their row's chunk, largest first (ORDER 1, `DecodeConfig.
list_order`'s default: `ops.list_order.bucket_ends`, row order within a bucket, a row's chunks
consecutive), or split rows first (ORDER 0: the items of every row of n_r > 1, then the rows
of one item, each in row order). The hardware dispatches a grid's programs in order, so where
the list is longer than a wave (the rows term below) the longest items start first and the
short rows fill the SMs that finish early (list scheduling, longest first; in row order one
request of 32k among 63 of 200 keys had its items after 54 short rows).
sum_r n_r <= TARGET + rows, so a grid
of (TARGET + rows) x KV heads programs covers every step of that batch size: the host knows
both, no length is read on the host, and a captured CUDA graph replays with new lengths (programs
past the list exit). TARGET is one wave of resident CTAs over the KV heads
(`selection.decode_plan`); a long request among short ones gets many items, so every SM shares
it. Rounding n_r keeps an item within 1.5 cb tiles and gives a uniform batch the split it had
from one partition count (b64 x 4k on 132 SMs: one item a row; b16 x 16k: four).

Each program derives the list itself from cache_lens and q_offsets (a [BLOCK_B] vector: a load,
a division and a prefix sum), so a launch needs no planner and no plan buffer; the combine
derives the same list. The list assumes one query per request (q_offsets[r] == r); any other
ragged batch of total_q == batch rows gets one item a row (correct, not balanced).

A row of one item writes the final output (sinks folded in) and its LSE; a row of several writes
normalised partials PO [items, H, DV] / PL [items, H] (natural-log LSE) at its items, and
`_worklist_combine_kernel` merges them (sinks, LSE, NaN as in `ops.combine`).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..launch import launch
from ..list_order import bucket_ends
from ..pdl import pdl_enabled, pdl_launch_kwargs, pdl_wait
from ..triton_constants import LN2, LOG2E
from .triton_tiles import visible_range

# The combine's shape: a program merges COMBINE_DIMS output dims of a (row, KV head), its
# BLOCK_I items x GP heads x dims a step = COMBINE_ELEMS partial elements, loads pipelined
# COMBINE_STAGES deep, 4 warps: the fastest of the shapes swept on the real-workload suite's
# GQA 32/8 d128 steps on an H200 (skewed b64 7.5 us against 9.4 for all 128 dims a program;
# the sweep and its record: docs/kernels/mha_decode.md, "the combine's step").
COMBINE_ELEMS = 1024
COMBINE_DIMS = 32
COMBINE_STAGES = 4


@triton.jit
def work_list(
    cache_lens,
    q_offsets,
    batch,
    mask_param,
    MASK: tl.constexpr,
    BLOCK_N: tl.constexpr,
    TARGET: tl.constexpr,
    MIN_BLOCKS: tl.constexpr,
    BLOCK_B: tl.constexpr,
    ORDER: tl.constexpr = 0,
):
    """(r [BLOCK_B] row ids, n [BLOCK_B] items a row (0 past batch), end [BLOCK_B] one past
    each row's last item (its items are [end - n, end); ORDER 0: split rows first, module
    docstring; 1: `ops.list_order.bucket_ends`), lo_al [BLOCK_B] first tile's key, chunk
    [BLOCK_B] tiles an item)."""
    r = tl.arange(0, BLOCK_B)
    rm = r < batch
    o_lo = tl.load(q_offsets + r, mask=rm, other=0)
    o_hi = tl.load(q_offsets + r + 1, mask=rm, other=0)
    ragged = tl.sum(tl.where(rm & ((o_lo != r) | (o_hi != r + 1)), 1, 0), 0) > 0
    cl = tl.maximum(tl.load(cache_lens + r, mask=rm, other=0), 0)
    lo, hi = visible_range(cl, cl + 1, MASK, mask_param)
    lo_al = (lo // BLOCK_N) * BLOCK_N
    tiles = tl.where(rm, tl.cdiv(tl.maximum(hi - lo_al, 0), BLOCK_N), 0)
    # 9/8: an item may hold 12.5% over the even share, so that a uniform batch keeps whole rows
    cb = tl.maximum(tl.cdiv(tl.sum(tiles, 0) * 9, TARGET * 8), MIN_BLOCKS)
    n = tl.maximum(tl.cdiv(tiles, cb), 1)
    n = tl.where(rm, tl.where(ragged, 1, n), 0)
    chunk = tl.cdiv(tiles, tl.maximum(n, 1))  # (n is 0 past batch)
    if ORDER == 1:
        return r, n, bucket_ends(n, chunk, cb), lo_al, chunk
    return r, n, split_first_ends(n), lo_al, chunk


@triton.jit
def split_first_ends(n):
    """One past the last item of each row when rows of n > 1 come first (row order within each
    class); n: [BLOCK] items a row, 0 past the batch."""
    many = tl.where(n > 1, n, 0)
    ones = tl.where(n == 1, 1, 0)
    return tl.where(n > 1, tl.cumsum(many, 0), tl.sum(many, 0) + tl.cumsum(ones, 0))


def host_item_count(
    cache_lens: torch.Tensor,
    q_offsets: torch.Tensor,
    mask_code: int,
    mask_param: int,
    *,
    block_n: int,
    target: int,
    min_blocks: int,
) -> int:
    """The number of items `work_list` makes, from host tensors (torch arithmetic that mirrors
    the kernel's). The launcher sizes the grid with it where the lengths are already on the host
    (the CPU, where Triton's interpreter would otherwise run every program of the bound)."""
    rows = q_offsets.shape[0] - 1
    offs = q_offsets.to(torch.int64)
    r = torch.arange(rows)
    if not (torch.equal(offs[:-1], r) and torch.equal(offs[1:], r + 1)):
        return rows
    cl = cache_lens.to(torch.int64).clamp(min=0)
    lo, hi, w = torch.zeros_like(cl), cl + 1, mask_param
    if mask_code in (2, 3):  # sliding windows (`triton_tiles.visible_range`)
        lo = (cl - w + 1).clamp(min=0)
    elif mask_code == 4:  # chunked causal
        lo = (cl // w) * w
    tiles = (hi - (lo // block_n) * block_n).clamp(min=0).add(block_n - 1) // block_n
    total = int(tiles.sum())
    cb = max(-(-total * 9 // (target * 8)), min_blocks)
    return int(((tiles + cb - 1) // cb).clamp(min=1).sum())


@triton.jit
def find_item(r, n, end, lo_al, chunk, item):
    """(row, its items, this item's chunk index j, the row's first tile key, tiles a chunk) of
    `item` in the list `work_list` returns (`end`: one past each row's last item)."""
    at = (end - n <= item) & (item < end)
    row = tl.sum(tl.where(at, r, 0), 0)
    n_row = tl.sum(tl.where(at, n, 0), 0)
    j = item - (tl.sum(tl.where(at, end, 0), 0) - n_row)
    return (
        row,
        n_row,
        j,
        tl.sum(tl.where(at, lo_al, 0), 0),
        tl.sum(tl.where(at, chunk, 0), 0),
    )


@triton.jit(do_not_specialize=["batch", "plan_cap"])
def _worklist_combine_kernel(
    cache_lens,
    q_offsets,
    batch,
    mask_param,
    Plan,
    plan_cap,
    PO,
    PL,
    Sinks,
    Out,
    stride_ot,
    stride_oh,
    Lse,
    stride_lt,
    stride_lh,
    H: tl.constexpr,
    GROUP: tl.constexpr,
    GP: tl.constexpr,
    DV: tl.constexpr,
    MASK: tl.constexpr,
    BLOCK_N: tl.constexpr,
    TARGET: tl.constexpr,
    MIN_BLOCKS: tl.constexpr,
    BLOCK_B: tl.constexpr,
    HAS_SINKS: tl.constexpr,
    WRITE_LSE: tl.constexpr,
    BLOCK_I: tl.constexpr,
    DB: tl.constexpr,
    STAGES: tl.constexpr,
    PDL: tl.constexpr = False,
    PLAN: tl.constexpr = False,
    ONE_PASS: tl.constexpr = True,
    LIST_ORDER: tl.constexpr = 0,
):
    """One (row, KV head, DB output dims): merge the partials of the row's items for the KV
    head's GROUP query heads when the row has several (a row of one item was written by the
    decode kernel).

    The merge: `merge_items` (two passes, the steps' loads pipelined STAGES deep). The row's
    items come from the launch's inputs (the lengths, offsets or the plan), which the decode
    kernel does not write: they are read before the PDL wait, while the decode runs."""
    row = tl.program_id(0)
    hkv = tl.program_id(1)
    dc = tl.program_id(2)
    if PLAN:  # the step's plan (`work_plan`): (first item, items) of each request
        at_row = Plan + 8 + 4 * plan_cap + 2 * row
        first = tl.load(at_row).to(tl.int64)
        n_row = tl.load(at_row + 1)
    else:
        r, n, end, lo_al, chunk = work_list(
            cache_lens, q_offsets, batch, mask_param, MASK, BLOCK_N, TARGET, MIN_BLOCKS, BLOCK_B,
            LIST_ORDER,
        )  # fmt: skip
        at = r == row
        n_row = tl.sum(tl.where(at, n, 0), 0)
        first = (tl.sum(tl.where(at, end, 0), 0) - n_row).to(tl.int64)
    pdl_wait(PDL)  # (the partials: the decode kernel's)
    if n_row > 1:
        offs_d = dc * DB + tl.arange(0, DB)
        o, lse2, den, hq, gmask, dmask = merge_items(
            PO, PL, first, n_row, hkv, offs_d, H, GROUP, GP, DV, DB, BLOCK_I, STAGES,
            ONE_PASS=ONE_PASS,
        )  # fmt: skip
        store_merged(o, lse2, den, row, hq, gmask, offs_d, dmask, Sinks, Out, stride_ot,
                     stride_oh, Lse, stride_lt, stride_lh, HAS_SINKS, WRITE_LSE,
                     dc == 0)  # fmt: skip


@triton.jit
def merge_items(
    PO,
    PL,
    first,
    n_row,
    hkv,
    offs_d,
    H: tl.constexpr,
    GROUP: tl.constexpr,
    GP: tl.constexpr,
    DV: tl.constexpr,
    DB: tl.constexpr,
    BLOCK_I: tl.constexpr,
    STAGES: tl.constexpr,
    BLOCK_L: tl.constexpr = 64,
    ONE_PASS: tl.constexpr = True,
):
    """Merge the partials of items [first, first + n_row) of one row for KV head hkv's GROUP
    query heads (GP: GROUP padded to a power of two) over output dims offs_d [DB]: PO [items, H,
    DV] normalised partials, PL [items, H] natural-log LSEs. Returns (o [GP, DB] normalised,
    lse2 [GP] in log2 units, den [GP] the weights' sum (0: no key seen), hq [GP] the heads,
    gmask, dmask).

    Two passes, so that no load waits on the one before: the heads' largest LSE over the
    items (BLOCK_L items a step), then BLOCK_I items a step, each weighted by exp(lse - max),
    into a [BLOCK_I, GP, DB] accumulator summed once after the loop, the steps' loads
    pipelined STAGES deep (docs/kernels/mha_decode.md, "the combine's step"). A row of at
    most BLOCK_I items (ONE_PASS) loads its LSEs and partials at once and takes the max from
    them: one round of loads instead of two, the same arithmetic (bit for bit: one step of
    the second pass, whose max is the same). The loads bypass L1 (`.cg`). An unseen partial
    (LSE -inf) adds nothing; a NaN one makes the row NaN (`ops.combine`). The combine launch
    merges with it; the decode kernel's fused merge with `merge_items_online`."""
    hq, gmask, dmask, first = _row_heads(hkv, offs_d, first, GROUP, GP, DV)
    offs_i = tl.arange(0, BLOCK_I)
    if ONE_PASS and n_row <= BLOCK_I:
        ihm = (offs_i < n_row)[:, None] & gmask[None, :]
        ih = (first + offs_i)[:, None] * H + hq[None, :]  # [BLOCK_I, GP]
        lp = _item_lses(PL, ih, ihm)
        o = _item_partials(PO, ih, ihm, offs_d, dmask, DV)
        m = tl.max(lp, 0)
        m_use = tl.where(m == float("-inf"), 0.0, m)
        seen, w = _item_weights(lp, m_use)
        acc = tl.sum(tl.where(seen[:, :, None], w[:, :, None] * o, 0.0), 0)
        den = tl.sum(w, 0)
    else:
        m = tl.full([GP], float("-inf"), tl.float32)
        offs_l = tl.arange(0, BLOCK_L)
        for i0 in range(0, n_row, BLOCK_L):  # (one step for rows of up to BLOCK_L items)
            it = first + i0 + offs_l
            im = (i0 + offs_l) < n_row
            lp = tl.load(PL + it[:, None] * H + hq[None, :], mask=im[:, None] & gmask[None, :],
                         other=float("-inf"), cache_modifier=".cg")  # fmt: skip
            m = tl.maximum(m, tl.max(lp, 0) * LOG2E)
        m_use = tl.where(m == float("-inf"), 0.0, m)
        den = tl.zeros([GP], tl.float32)
        acc3 = tl.zeros([BLOCK_I, GP, DB], tl.float32)
        for i0 in tl.range(0, n_row, BLOCK_I, num_stages=STAGES):
            it = first + i0 + offs_i
            im = (i0 + offs_i) < n_row
            ih = it[:, None] * H + hq[None, :]  # [BLOCK_I, GP]
            ihm = im[:, None] & gmask[None, :]
            lp = _item_lses(PL, ih, ihm)
            seen, w = _item_weights(lp, m_use)
            o = _item_partials(PO, ih, ihm, offs_d, dmask, DV)
            acc3 += tl.where(seen[:, :, None], w[:, :, None] * o, 0.0)
            den += tl.sum(w, 0)
        acc = tl.sum(acc3, 0)
    o, lse2 = _normalized(acc, den, m_use)
    return o, lse2, den, hq, gmask, dmask


@triton.jit
def merge_items_online(
    PO,
    PL,
    first,
    n_row,
    hkv,
    offs_d,
    H: tl.constexpr,
    GROUP: tl.constexpr,
    GP: tl.constexpr,
    DV: tl.constexpr,
    STAGES: tl.constexpr,
):
    """`merge_items`' contract (the same arguments less the step shape, the same results:
    output dims offs_d [DB]) with the least code: one item's [GP, DB] partials a step, merged
    online (a running max that rescales the sum), the steps' loads pipelined STAGES deep;
    loads bypass L1 (`.cg`: other programs of the launch wrote the partials). The decode
    kernel's fused merge runs it: a split row's last item, once, at the end of the launch, on
    a SM whose instruction cache has not seen this code. merge_items' [items, GP, DB] form
    there was ~1,800 SASS instructions of layout changes whose fetches cost ~11 us a launch,
    this one ~290 (H200, Qwen3-30B-A3B heads 32 / 4 at b64, two items a row:
    docs/kernels/mha_decode.md, "The fused merge's code size"). The same NaN and unseen-item
    rules; its rounding differs from the two passes' by the rescaling only."""
    hq, gmask, dmask, first = _row_heads(hkv, offs_d, first, GROUP, GP, DV)
    m = tl.full([GP], float("-inf"), tl.float32)
    den = tl.zeros([GP], tl.float32)
    acc = tl.zeros([GP, offs_d.shape[0]], tl.float32)
    for i in tl.range(0, n_row, num_stages=STAGES):
        ih = (first + i) * H + hq
        lp = _item_lses(PL, ih, gmask)
        o = tl.load(PO + ih[:, None] * DV + offs_d[None, :],
                    mask=gmask[:, None] & dmask[None, :], other=0.0,
                    cache_modifier=".cg")  # fmt: skip
        m_new = tl.maximum(m, lp)
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.math.exp2(m - m_use)  # 0 while nothing was seen (m -inf)
        seen = lp != float("-inf")
        w = tl.where(seen, tl.math.exp2(lp - m_use), 0.0)
        acc = acc * alpha[:, None] + tl.where(seen[:, None], w[:, None] * o, 0.0)
        den = den * alpha + w
        m = m_new
    m_use = tl.where(m == float("-inf"), 0.0, m)
    o, lse2 = _normalized(acc, den, m_use)
    return o, lse2, den, hq, gmask, dmask


@triton.jit
def _row_heads(hkv, offs_d, first, GROUP: tl.constexpr, GP: tl.constexpr, DV: tl.constexpr):
    """A merge's (hq [GP]: KV head hkv's query heads, their mask, the dims' mask, first as
    int64)."""
    offs_g = tl.arange(0, GP)
    return hkv * GROUP + offs_g, offs_g < GROUP, offs_d < DV, first.to(tl.int64)


@triton.jit
def _normalized(acc, den, m_use):
    """A merged row's (o [GP, DB] = acc / den, lse2 [GP] in log2 units); a head that saw no
    key (den 0) keeps o 0."""
    o = acc / tl.where(den != 0, den, 1.0)[:, None]
    return o, m_use + tl.math.log2(tl.where(den != 0, den, 1.0))


@triton.jit
def _item_lses(PL, ih, ihm):
    """The items' LSEs (ih's shape: [I, GP] or [GP]) in log2 units at rows ih (mask ihm) of
    PL, bypassing L1."""
    return tl.load(PL + ih, mask=ihm, other=float("-inf"), cache_modifier=".cg") * LOG2E


@triton.jit
def _item_partials(PO, ih, ihm, offs_d, dmask, DV: tl.constexpr):
    """The items' partials [I, GP, DB] at rows ih (mask ihm) of PO, dims offs_d, bypassing L1."""
    return tl.load(PO + ih[:, :, None] * DV + offs_d[None, None, :],
                   mask=ihm[:, :, None] & dmask[None, None, :], other=0.0,
                   cache_modifier=".cg")  # fmt: skip


@triton.jit
def _item_weights(lp, m_use):
    """(seen, weights 2^(lse - m_use)) [I, GP]: an unseen item (LSE -inf) weighs 0, a NaN one
    is kept (it makes the row NaN)."""
    seen = lp != float("-inf")
    return seen, tl.where(seen, tl.math.exp2(lp - m_use[None, :]), 0.0)


@triton.jit
def store_merged(
    o,
    lse2,
    den,
    row,
    hq,
    gmask,
    offs_d,
    dmask,
    Sinks,
    Out,
    stride_ot,
    stride_oh,
    Lse,
    stride_lt,
    stride_lh,
    HAS_SINKS: tl.constexpr,
    WRITE_LSE: tl.constexpr,
    lse_here,
):
    """Store a merged row (`merge_items`): the output (sinks folded in) and, with WRITE_LSE
    where lse_here, its natural-log LSE (-inf for a row that saw no key)."""
    if HAS_SINKS:
        sink = tl.load(Sinks + hq, mask=gmask, other=float("-inf")) * LOG2E
        o = o * tl.where(den != 0, 1.0 / (1.0 + tl.math.exp2(sink - lse2)), 0.0)[:, None]
    row64 = row.to(tl.int64)
    hq64 = hq.to(tl.int64)
    tl.store(
        Out + row64 * stride_ot + hq64[:, None] * stride_oh + offs_d[None, :],
        o.to(Out.dtype.element_ty),
        mask=gmask[:, None] & dmask[None, :],
    )
    if WRITE_LSE and lse_here:
        tl.store(
            Lse + row64 * stride_lt + hq64 * stride_lh,
            tl.where(den != 0, lse2 * LN2, float("-inf")),
            mask=gmask,
        )


def worklist_combine_triton(
    cache_lens: torch.Tensor,
    q_offsets: torch.Tensor,
    mask_code: int,
    mask_param: int,
    partial_out: torch.Tensor,
    partial_lse: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor | None,
    sinks: torch.Tensor | None,
    *,
    group: int,
    block_n: int,
    target: int,
    min_blocks: int,
    block_b: int,
    plan: torch.Tensor | None = None,
    elems_a_step: int = COMBINE_ELEMS,
    dims_a_program: int = COMBINE_DIMS,
    stages: int = COMBINE_STAGES,
    num_warps: int = 4,
    one_pass: bool = True,
    list_order: int = 0,
) -> None:
    """Merge the split rows of a balanced decode launch (same list arguments as the launch;
    plan: the step's `work_plan` buffer the launch read its items from, or None; list_order:
    the list's ORDER, `work_list`).

    partial_out [items, H, DV] f32, partial_lse [items, H] f32; out [rows, H, DV] (last dim
    contiguous), lse [rows, H] f32 or None; sinks [H] f32 or None; group: query heads a KV
    head (H % group == 0; a program a (row, KV head, dims_a_program output dims): elems_a_step
    partial elements a step, pipelined `stages` deep; one_pass: rows of one step merged in one
    round of loads, `merge_items`' ONE_PASS). No host sync."""
    rows = q_offsets.shape[0] - 1
    _, H, DV = partial_out.shape
    if rows == 0:
        return
    db = min(dims_a_program, triton.next_power_of_2(DV))
    launch(
        _worklist_combine_kernel,
        (rows, H // group, triton.cdiv(DV, db)),
        cache_lens,
        q_offsets,
        rows,
        mask_param,
        plan if plan is not None else partial_lse,
        (plan.shape[0] - 8 - 2 * rows) // 4 if plan is not None else 0,
        partial_out,
        partial_lse,
        sinks if sinks is not None else partial_lse,
        out,
        out.stride(0),
        out.stride(1),
        lse if lse is not None else partial_lse,
        lse.stride(0) if lse is not None else 0,
        lse.stride(1) if lse is not None else 0,
        H=H,
        GROUP=group,
        GP=triton.next_power_of_2(group),
        DV=DV,
        MASK=mask_code,
        BLOCK_N=block_n,
        TARGET=target,
        MIN_BLOCKS=min_blocks,
        BLOCK_B=block_b,
        HAS_SINKS=sinks is not None,
        WRITE_LSE=lse is not None,
        BLOCK_I=max(2, elems_a_step // (db * triton.next_power_of_2(group))),
        DB=db,
        STAGES=stages,
        PDL=(pdl := pdl_enabled(out)),
        PLAN=plan is not None,
        ONE_PASS=one_pass,
        num_warps=num_warps,
        **pdl_launch_kwargs(pdl),
        **({"LIST_ORDER": list_order} if list_order else {}),
    )
