"""A step's decode work plan: the balanced work list made once a step, read by every layer's
decode launch (`mha(..., plan=StepPlan(...))`).

Without a plan, every program of a balanced decode launch derives the list itself from the
lengths (`triton_worklist.work_list`), so the list must be one a program can rebuild cheaply:
one wave of items. A plan is made once, on the host (`plan_work_host`, from lengths the host
holds) or by one small launch (`plan_work`, `_plan_kernel`), into an int32 buffer; the decode
programs and the combine read their item from it (a few loads). That lets the plan choose
between lists that a program could not afford to derive:

- the one-wave list (`triton_worklist`'s rule), kept where its items are even (a uniform batch:
  one item a row, b16 x 16k: four) or where a row would split into more than `MAX_SPLIT` items
  at `MAX_WAVES` waves (one long request among short ones: `MAX_SPLIT`'s measurement);
- otherwise `MAX_WAVES` waves of smaller items, which the hardware's in-order dispatch of
  programs balances over the SMs (a skewed batch: measured in docs/kernels/mha_decode.md).

Layout of the buffer (int32; `cap` items, `rows` requests):

    [0] n_items, [1] waves (1 or MAX_WAVES), [2] rows, [3] cap,
    [4] reordered (1: the rows' order is not row order), [5:8] 0
    [8 + 4 i : 8 + 4 i + 4]      item i: (row, k_lo, k_hi, n_row)   i < n_items
    [8 + 4 cap + 2 r : ... + 2]  request r: (first item, items)

Rows come in the order of their items' size, largest chunk first (ties: row order), a request's
items consecutive: the hardware dispatches programs in order, so the longest items start first
and the short ones fill the SMs that finish early (list scheduling, longest first). The
kernels' own list (`triton_worklist`) approximates that order by 8 buckets of size
(`DecodeConfig.list_order` 1; 0: the split rows first); a simulation of the suite's skewed
batches (132 SMs x 4 CTAs, an item's time its tiles plus a prologue) put the exact order 10-35%
shorter than row order, 5-20% shorter than split rows first and 0-5% shorter than the buckets
(docs/kernels/mha_decode.md, "Longest items first"). Item j of a row of n covers keys
[k_lo, k_hi) = [j c, (j + 1) c) with c its chunk (whole BLOCK_N tiles); the row's last item has
k_hi = -1 (up to the row's end). The decode kernel clamps to the row's visible keys, so a plan
made for other lengths of the same batch stays correct (only less balanced): every key of a
row lies in exactly one of its items.

`step_plan.StepPlan` holds the plans of one step, keyed by what the list depends on (rows,
BLOCK_N, target, min chunk), and says which planner makes them (docs/ops.md, "The step's
plan"). Only decode launches over causal or unmasked rows use a plan: windowed, chunked and
tensor masks derive their list in the kernel.
"""

from __future__ import annotations

import numpy as np
import torch
import triton
import triton.language as tl

from .._triton_interpreter import install_interpreter_shim
from ..launch import launch

install_interpreter_shim()

MAX_WAVES = 3
# A row split into more items than this at MAX_WAVES keeps the one-wave list (32k among 63 x 200
# keys, longest items first, fused merge: 61 us on one wave, 73 at 3 waves with the limit at
# 128 or 256; docs/kernels/mha_decode.md, "Longest items first").
MAX_SPLIT = 64
# The one-wave list counts as even when its mean item holds >= EVEN_PCT % of its largest item's
# tiles (uniform batches: 100; the suite's lognormal skew and one-long cases: < 70).
EVEN_PCT = 80
HEADER = 8
_BLOCK_I = 64  # items a planner program writes
_CH = 128  # requests a planner step reads
_SB = 16  # requests a step of the order's rank compares with the step's CH


def plan_capacity(rows: int, target: int) -> int:
    """Items a plan over `rows` requests holds at most: sum_r cdiv(tiles_r, cb) <= total / cb +
    rows with cb >= total / (waves * target)."""
    return MAX_WAVES * target + rows


def plan_numel(rows: int, target: int) -> int:
    cap = plan_capacity(rows, target)
    return HEADER + 4 * cap + 2 * rows


@triton.jit
def _row_tiles(cache_lens, r, rows, BLOCK_N: tl.constexpr):
    rm = r < rows
    cl = tl.maximum(tl.load(cache_lens + r, mask=rm, other=0), 0)
    return tl.where(rm, tl.cdiv(cl + 1, BLOCK_N), 0), rm


@triton.jit(do_not_specialize=["rows", "cap"])
def _plan_kernel(
    cache_lens,
    rows,
    Plan,
    cap,
    BLOCK_N: tl.constexpr,
    TARGET: tl.constexpr,
    MIN_BLOCKS: tl.constexpr,
    WAVES: tl.constexpr,
    SPLIT_MAX: tl.constexpr,
    EVEN: tl.constexpr,
    CH: tl.constexpr,
    BLOCK_I: tl.constexpr,
    SB: tl.constexpr,
):
    """Program p writes items [p BLOCK_I, (p + 1) BLOCK_I) of the list (program 0 also the
    header and the per-request table); every program derives the list's sizes itself."""
    pid = tl.program_id(0)
    offs = tl.arange(0, CH)
    total = 0
    for c0 in range(0, rows, CH):
        tiles, _ = _row_tiles(cache_lens, c0 + offs, rows, BLOCK_N)
        total += tl.sum(tiles, 0)
    # the one-wave list of `triton_worklist.work_list`, and the WAVES-wave one
    t9 = total.to(tl.int64) * 9
    cb1 = tl.maximum(tl.cdiv(t9, TARGET * 8), MIN_BLOCKS).to(tl.int32)
    cbw = tl.maximum(tl.cdiv(t9, WAVES * TARGET * 8), MIN_BLOCKS).to(tl.int32)
    items1 = 0
    big1 = 0
    splitw = 0
    for c0 in range(0, rows, CH):
        tiles, rm = _row_tiles(cache_lens, c0 + offs, rows, BLOCK_N)
        n1 = tl.where(rm, tl.maximum(tl.cdiv(tiles, cb1), 1), 0)
        items1 += tl.sum(n1, 0)
        big1 = tl.maximum(big1, tl.max(tl.cdiv(tiles, tl.maximum(n1, 1)), 0))
        splitw = tl.maximum(splitw, tl.max(tl.cdiv(tiles, cbw), 0))
    uneven = total.to(tl.int64) * 100 < EVEN * items1.to(tl.int64) * big1
    many = uneven & (splitw <= SPLIT_MAX)
    cb = tl.where(many, cbw, cb1)

    roff = 8 + 4 * cap
    it = pid * BLOCK_I + tl.arange(0, BLOCK_I)
    i_row = tl.zeros([BLOCK_I], tl.int32)
    i_j = tl.zeros([BLOCK_I], tl.int32)
    i_n = tl.zeros([BLOCK_I], tl.int32)
    i_c = tl.zeros([BLOCK_I], tl.int32)
    n_items = 0
    moved = 0
    for c0 in range(0, rows, CH):
        r = c0 + offs
        tiles, rm = _row_tiles(cache_lens, r, rows, BLOCK_N)
        n = tl.where(rm, tl.maximum(tl.cdiv(tiles, cb), 1), 0)
        chunk = tl.cdiv(tiles, tl.maximum(n, 1))
        # the row's first item: the items of every row before it in the order (larger chunk,
        # or the same chunk and a lower row)
        first = tl.zeros([CH], tl.int32)
        for s0 in range(0, rows, SB):  # (its cost: docs/kernels/mha_decode.md, "Longest items")
            s = s0 + tl.arange(0, SB)
            t_s, sm = _row_tiles(cache_lens, s, rows, BLOCK_N)
            n_s = tl.where(sm, tl.maximum(tl.cdiv(t_s, cb), 1), 0)
            c_s = tl.cdiv(t_s, tl.maximum(n_s, 1))
            before = (c_s[None, :] > chunk[:, None]) | (
                (c_s[None, :] == chunk[:, None]) & (s[None, :] < r[:, None])
            )
            first += tl.sum(tl.where(before, n_s[None, :], 0), 1)
        end = first + n
        moved += tl.sum(tl.where(rm & (first != n_items + tl.cumsum(n, 0) - n), 1, 0), 0)
        if pid == 0:
            tl.store(Plan + roff + 2 * r, first, mask=rm)
            tl.store(Plan + roff + 2 * r + 1, n, mask=rm)
        hit = (it[:, None] >= first[None, :]) & (it[:, None] < end[None, :])
        i_row += tl.sum(tl.where(hit, r[None, :], 0), 1)
        i_j += tl.sum(tl.where(hit, it[:, None] - first[None, :], 0), 1)
        i_n += tl.sum(tl.where(hit, n[None, :], 0), 1)
        i_c += tl.sum(tl.where(hit, chunk[None, :], 0), 1)
        n_items += tl.sum(n, 0)
    ok = it < n_items
    k_lo = i_j * i_c * BLOCK_N
    k_hi = tl.where(i_j == i_n - 1, -1, k_lo + i_c * BLOCK_N)
    at = Plan + 8 + 4 * it
    tl.store(at, i_row, mask=ok)
    tl.store(at + 1, k_lo, mask=ok)
    tl.store(at + 2, k_hi, mask=ok)
    tl.store(at + 3, i_n, mask=ok)
    if pid == 0:
        tl.store(Plan, n_items)
        tl.store(Plan + 1, tl.where(many, WAVES, 1))
        tl.store(Plan + 2, rows)
        tl.store(Plan + 3, cap)
        tl.store(Plan + 4, (moved > 0).to(tl.int32))
        tl.store(Plan + 5 + tl.arange(0, 4), tl.zeros([4], tl.int32), mask=tl.arange(0, 4) < 3)


def plan_work(
    cache_lens: torch.Tensor, rows: int, *, block_n: int, target: int, min_blocks: int
) -> torch.Tensor:
    """The plan (module docstring) of a decode launch over requests [0, rows) of `cache_lens`
    ([>= rows] int32, tokens before the step; each request one query): one launch, no sync."""
    cap = plan_capacity(rows, target)
    buf = torch.empty(plan_numel(rows, target), dtype=torch.int32, device=cache_lens.device)
    launch(
        _plan_kernel, (triton.cdiv(cap, _BLOCK_I),), cache_lens, rows, buf, cap,
        BLOCK_N=block_n, TARGET=target, MIN_BLOCKS=min_blocks, WAVES=MAX_WAVES,
        SPLIT_MAX=MAX_SPLIT, EVEN=EVEN_PCT, CH=_CH, BLOCK_I=_BLOCK_I, SB=_SB, num_warps=4,
    )  # fmt: skip
    return buf


def plan_work_host(
    cache_lens, rows: int, *, block_n: int, target: int, min_blocks: int
) -> torch.Tensor:
    """`plan_work` on the host, in numpy (the same buffer as a CPU int32 tensor; entries past
    n_items and the unused header words 0). cache_lens: [>= rows] ints (a numpy array, a CPU
    tensor or a sequence). The engine's eager steps plan here (tens of us at b256); the tests
    check the planner kernel against it."""
    cl = np.maximum(np.asarray(cache_lens, dtype=np.int64)[:rows], 0)
    tiles = (cl + block_n) // block_n

    def cdiv(a, b):
        return -(-a // b)

    total = int(tiles.sum())
    cb1 = max(cdiv(total * 9, target * 8), min_blocks)
    cbw = max(cdiv(total * 9, MAX_WAVES * target * 8), min_blocks)
    n1 = np.maximum(cdiv(tiles, cb1), 1)
    items1 = int(n1.sum())
    big1 = int(cdiv(tiles, n1).max()) if rows else 0
    splitw = int(cdiv(tiles, cbw).max()) if rows else 0
    waves = total * 100 < EVEN_PCT * items1 * big1 and splitw <= MAX_SPLIT
    cb = cbw if waves else cb1
    n = np.maximum(cdiv(tiles, cb), 1)
    chunk = cdiv(tiles, n)
    cap = plan_capacity(rows, target)
    out = np.zeros(plan_numel(rows, target), dtype=np.int32)
    order = np.argsort(-chunk, kind="stable")  # larger chunks first, ties in row order
    first = np.empty_like(n)
    first[order] = np.cumsum(n[order]) - n[order]
    n_items = int(n.sum())
    moved = bool((first != np.cumsum(n) - n).any())
    out[:5] = (n_items, MAX_WAVES if waves else 1, rows, cap, int(moved))
    row = np.repeat(order, n[order])
    j = np.arange(n_items) - first[row]
    k_lo = j * chunk[row] * block_n
    k_hi = np.where(j == n[row] - 1, -1, k_lo + chunk[row] * block_n)
    items = out[HEADER : HEADER + 4 * n_items].reshape(n_items, 4)
    items[:, 0], items[:, 1], items[:, 2], items[:, 3] = row, k_lo, k_hi, n[row]
    roff = HEADER + 4 * cap
    table = out[roff : roff + 2 * rows].reshape(rows, 2)
    table[:, 0], table[:, 1] = first, n
    return torch.from_numpy(out)


__all__ = ["MAX_SPLIT", "MAX_WAVES", "plan_capacity", "plan_work", "plan_work_host"]
