"""The keep threshold of top-k / top-p for `sample_rows_triton` (`ops.fused.sample_rows` with
top_k / top_p): each row's int32 order key tau of s = x / t such that the tokens with key(s) >=
tau are the ones `reference.top_k_top_p_keep` keeps, found without sorting the row, by one
program a row (`_keep_threshold_kernel`) or, for few rows, a chain of (row, span) launches
first (`_keep_thresholds`). The draw kernel (`triton_fused._argmax_part_kernel`) then skips the
tokens below tau, comparing `_order_key`s. Measurements: docs/kernels/keep_threshold.md."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._triton_interpreter import install_interpreter_shim
from ..pdl import pdl_wait
from ..prepared import cached_launch

install_interpreter_shim()

# Programs a SM the chain's span passes aim at (as the split argmax's, `triton_fused`).
THR_PROGRAMS_PER_SM = 2


@triton.jit
def _order_key(s):
    """int32 keys of float32 s, in the order of the values (-0.0 and +0.0 one key; NaN above
    +inf): key(a) >= key(b) iff a >= b for non-NaN a, b."""
    b = s.to(tl.int32, bitcast=True)
    return tl.where(s == 0.0, 0, b ^ ((b >> 31) & 0x7FFFFFFF))


# The keep threshold of top-k / top-p (`sample_rows` with top_k / top_p): a row's search finds
# the smallest int32 key tau of the scaled logits s = x / t such that the tokens with key(s) >=
# tau are the ones `reference.top_k_top_p_keep` keeps, without sorting the row. W(k) = the
# count (top-k) or the mass exp(s - max) (top-p) of the tokens with key >= k is non-increasing,
# and tau + 1 is the smallest key with W < the goal (k, or p times the top-k set's mass). Each
# pass over the row evaluates W at THR_PIVOTS keys of the bracket [lo, hi] (W(lo) >= goal >
# W(hi)) at once and keeps the sub-bracket where W crosses the goal: the first pass at keys
# spread geometrically below the row's max (2**-3 .. 2**6.75 nats), the later ones evenly, until
# hi = lo + 1. Once the bracket holds at most THR_LIST tokens, the next pass copies them to a
# scratch row, and a radix select over that list ends the search (`_list_select`). A program a
# row runs it (`_keep_threshold_kernel`), or, for up to THR_CHAIN_MAX_ROWS rows, a chain of
# launches (below). Measurements: docs/kernels/keep_threshold.md.
THR_PIVOTS = 8
THR_LIST = 4096
THR_BLOCK = 2048  # columns a step: [THR_PIVOTS, THR_BLOCK] per-lane sums, 32 a thread at 16 warps


@triton.jit
def _row_stats(base, V, t, BLOCK: tl.constexpr, STAGES: tl.constexpr):
    """(max of s = x / t, smallest and largest `_order_key`, 1 where s holds a NaN or +inf)."""
    mx = tl.full([BLOCK], float("-inf"), tl.float32)
    kmn = tl.full([BLOCK], 2147483647, tl.int32)
    kmx = tl.full([BLOCK], -2147483648, tl.int32)
    bad = tl.zeros([BLOCK], tl.int32)
    for start in tl.range(0, V, BLOCK, num_stages=STAGES):
        cols = start + tl.arange(0, BLOCK)
        m = cols < V
        s = tl.math.div_rn(tl.load(base + cols, mask=m, other=0.0).to(tl.float32), t)
        bad = bad | (m & ((s != s) | (s == float("inf")))).to(tl.int32)
        k = _order_key(s)
        kmn = tl.where(m, tl.minimum(kmn, k), kmn)
        kmx = tl.where(m, tl.maximum(kmx, k), kmx)
        mx = tl.where(m, tl.maximum(mx, s), mx)
    return tl.max(mx, axis=0), tl.min(kmn, axis=0), tl.max(kmx, axis=0), tl.max(bad, axis=0)


@triton.jit
def _key_value(k):
    """The float32 value of an `_order_key` (the key map is its own inverse on the bits)."""
    return (k ^ ((k >> 31) & 0x7FFFFFFF)).to(tl.float32, bitcast=True)


@triton.jit
def _pivots(lo, hi, passes, mx, NP: tl.constexpr):
    """The NP pivot keys of a pass over the bracket [lo, hi] (slot 0 lo, slot NP - 1 hi): the
    first pass's below the max (keys of mx - u, u from 2 ** 6.75 down to 2 ** -3 nats); then
    odd passes even in value (fast where tokens are dense), even passes even in key (a bracket
    NP - 1 times narrower a pass at least: a search ends within 64 passes)."""
    slot = tl.arange(0, NP)
    if passes == 0:
        u = tl.exp2(9.75 * (NP - 2 - slot).to(tl.float32) / (NP - 3) - 3.0)
        piv = _order_key(mx - u)
    elif passes % 2 == 1:
        v_lo = _key_value(lo)
        v_hi = _key_value(tl.minimum(hi, 0x7F7FFFFF))  # (hi may be +inf's key)
        piv = _order_key(v_lo + (v_hi - v_lo) * (slot.to(tl.float32) / (NP - 1)))
    else:
        span = hi.to(tl.int64) - lo.to(tl.int64)
        piv = (lo.to(tl.int64) + span * slot.to(tl.int64) // (NP - 1)).to(tl.int32)
    piv = tl.minimum(tl.maximum(piv, lo), hi)
    return tl.where(slot == 0, lo, tl.where(slot == NP - 1, hi, piv))


@triton.jit
def _pass_sums(src, n_src, t, mx, piv, MASS: tl.constexpr, BLOCK: tl.constexpr,
               NP: tl.constexpr, STAGES: tl.constexpr):  # fmt: skip
    """(count, mass) of the tokens of src[0, n_src) (x, s = x / t) at or above each pivot key.
    MASS: the masses (else zeros). Per-lane sums, reduced once at the end; pivots first, so
    that a thread holds every pivot of its columns (columns first had the NP threads sharing a
    column each compute its division and key: 16 div.rn a column in the sm_90 PTX). A column
    past n_src gets the key -2**31, below every pivot (a pivot is at least the row's smallest
    key, and a row with a NaN, whose key could be that, takes no search)."""
    cnt2 = tl.zeros([NP, BLOCK], tl.int32)
    w2 = tl.zeros([NP, BLOCK], tl.float32)
    for start in tl.range(0, n_src, BLOCK, num_stages=STAGES):
        cols = start + tl.arange(0, BLOCK)
        m = cols < n_src
        s = tl.math.div_rn(tl.load(src + cols, mask=m, other=0.0).to(tl.float32), t)
        k = tl.where(m, _order_key(s), -2147483648)
        ge = k[None, :] >= piv[:, None]
        cnt2 += ge.to(tl.int32)
        if MASS:
            w2 += tl.where(ge, tl.exp(s - mx)[None, :], 0.0)
    return tl.sum(cnt2, axis=1), tl.sum(w2, axis=1)


@triton.jit
def _copy_bracket(src, n_src, t, lo, hi, LIST, BLOCK: tl.constexpr, STAGES: tl.constexpr):
    """Copy the tokens of src[0, n_src) whose key of s = x / t is in [lo, hi) to LIST, in
    column order; returns how many. A pass of its own, without the pivots' sums: in one loop
    with them (the copy behind a flag) the sm_90 SASS loop of the span pass was 933-1,128
    instructions against 270-358 without the copy, the division and key computed in two
    layouts."""
    written = 0
    for start in tl.range(0, n_src, BLOCK, num_stages=STAGES):
        cols = start + tl.arange(0, BLOCK)
        m = cols < n_src
        xv = tl.load(src + cols, mask=m, other=0.0)
        k = _order_key(tl.math.div_rn(xv.to(tl.float32), t))
        inb = m & (k >= lo) & (k < hi)
        pos = written + tl.cumsum(inb.to(tl.int32), axis=0) - 1
        tl.store(LIST + pos, xv, mask=inb)
        written += tl.sum(inb.to(tl.int32), axis=0)
    return written


@triton.jit
def _narrow(piv, cnt, w, goal, target, passes, mass, NP: tl.constexpr):
    """The bracket a pass's sums leave: (lo, hi, tokens in [lo, hi), target, the slot j of
    lo: [lo, hi) = [piv[j], piv[j + 1])). mass: top-p's step (the target is goal (p) times
    the first pass's W at slot 0, W(lo)), else top-k's (goal k)."""
    slot = tl.arange(0, NP)
    if mass & (passes == 0):
        target = goal.to(tl.float32) * tl.sum(tl.where(slot == 0, w, 0.0), axis=0)
    ok = tl.where(mass, w >= target, cnt >= goal)
    j = tl.minimum(tl.maximum(tl.sum(ok.to(tl.int32), axis=0) - 1, 0), NP - 2)
    inside = tl.sum(tl.where(slot == j, cnt, 0), axis=0) - tl.sum(
        tl.where(slot == j + 1, cnt, 0), axis=0
    )
    lo = tl.sum(tl.where(slot == j, piv, 0), axis=0)
    hi = tl.sum(tl.where(slot == j + 1, piv, 0), axis=0)
    return lo, hi, inside, target, j


@triton.jit
def _list_select(LIST, n, t, mx, lo, hi, goal, above_c, above_w, MASS: tl.constexpr,
                 C: tl.constexpr):  # fmt: skip
    """The largest key tau in [lo, hi) with W(tau) >= goal, where W(k) is the count (MASS: the
    mass) of the tokens with key >= k: the list's n tokens (LIST[0, n), x's dtype, s = x / t;
    every token of the row in [lo, hi), and maybe others of a wider bracket) plus above_c /
    above_w (the tokens at or above hi, or above the wider bracket). A radix select in
    registers over the bits of key - lo, from the highest that [lo, hi) spans: a reduction a
    bit, instead of the passes that would close a bracket of few tokens but a wide key range
    down to one key."""
    i = tl.arange(0, C)
    m = i < n
    s = tl.math.div_rn(tl.load(LIST + i, mask=m, other=0.0).to(tl.float32), t)
    key = _order_key(s)
    if MASS:
        wt = tl.exp(s - mx)
        acc = above_w + tl.sum(tl.where(m & (key >= hi), wt, 0.0), axis=0)
    else:
        wt = tl.full([C], 1, tl.int32)
        acc = above_c + tl.sum(tl.where(m & (key >= hi), wt, 0), axis=0)
    d = key.to(tl.int64) - lo.to(tl.int64)
    inb = m & (key >= lo) & (key < hi)
    span = hi.to(tl.int64) - lo.to(tl.int64)
    b = tl.zeros([], tl.int64)
    while (tl.full([], 1, tl.int64) << (b + 1)) < span:  # 2 ** (b + 1) >= span
        b += 1
    prefix = tl.zeros([], tl.int64)  # tau - lo in [prefix, prefix + 2 ** (b + 1)); acc: W there
    while b >= 0:
        half = prefix + (tl.full([], 1, tl.int64) << b)
        w1 = acc + tl.sum(tl.where(inb & (d >= half) & (d < half + (half - prefix)), wt, 0),
                          axis=0)  # fmt: skip
        up = w1 >= goal
        prefix = tl.where(up, half, prefix)
        acc = tl.where(up, acc, w1)
        b -= 1
    return tl.minimum(lo.to(tl.int64) + prefix, hi.to(tl.int64) - 1).to(tl.int32)


@triton.jit
def _threshold_search(src, n_src, t, mx, lo, hi, goal, LIST, C: tl.constexpr,
                      MASS: tl.constexpr, BLOCK: tl.constexpr, NP: tl.constexpr,
                      STAGES: tl.constexpr, passes=0, inside=-1, target=0.0, above_c=0,
                      above_w=0.0):  # fmt: skip
    """lo at the end of the bracket search (block comment above) over src[0, n_src) (x, s = x /
    t) from [lo, hi] after `passes` passes; goal: k (counts) or p (MASS: the goal is p W(lo)).
    LIST: the row's scratch of C elements (x's dtype); inside: the tokens in [lo, hi) (-1: not
    known, before a first pass); above_c / above_w: W(hi). Once the bracket holds at most C
    tokens, a pass copies them to LIST and `_list_select` ends the search there."""
    slot = tl.arange(0, NP)
    zi = tl.zeros([], tl.int32)  # (the defaults are constexprs: tensors for the loop's state)
    passes = passes + zi
    target = target + tl.zeros([], tl.float32)
    above_c = above_c + zi
    above_w = above_w + tl.zeros([], tl.float32)
    inside = tl.where(inside < 0, C + 1, inside) + zi
    while (hi.to(tl.int64) - lo.to(tl.int64) > 1) & (passes < 64):
        if inside <= C:
            written = _copy_bracket(src, n_src, t, lo, hi, LIST, BLOCK, STAGES)
            g = goal
            if MASS:
                g = target
            lo = _list_select(LIST, written, t, mx, lo, hi, g, above_c, above_w, MASS, C)
            hi = lo + 1
        else:
            piv = _pivots(lo, hi, passes, mx, NP)
            cnt, w = _pass_sums(src, n_src, t, mx, piv, MASS, BLOCK, NP, STAGES)
            lo, hi, inside, target, j = _narrow(piv, cnt, w, goal, target, passes, MASS, NP)
            above_c = tl.sum(tl.where(slot == j + 1, cnt, 0), axis=0)  # W(hi)
            above_w = tl.sum(tl.where(slot == j + 1, w, 0.0), axis=0)
            passes += 1
    return lo


# The chain for few rows (`thr_plan`): the search's passes as THR_CHAIN_PASSES rounds of two
# launches, a (row, span) launch, then a program a row (`_thr_decide_kernel`); then
# `_keep_threshold_kernel` finishes a search still going, from the row's state. A round's
# spans sum the pivots' counts (and masses), and its decide merges them in span order
# (deterministic) and narrows the bracket; once the bracket holds at most THR_LIST tokens, the
# decide writes each span's offset in the row's list (the prefix of the spans' counts in the
# new bracket, which the same pass's sums hold), the next round's spans copy the bracket's
# tokens there (in column order), and its decide ends the search on the list
# (`_list_select`). A top-k search that ends hands over to top-p's (where p < 1), which starts
# over the row. WS (int32): a row's state (_ST words at the `_W_*` offsets), then each (row,
# span)'s stats (4 words: max's bits, smallest and largest key, bad; `_stats_at`), each (row,
# span)'s pass sums (NP counts, NP masses' bits; `_sums_at`), and each (row, span)'s offset
# in the list (`_offset_at`).
# (6 rounds: top_p 0.999 at 32 / 64 rows 227 / 354 us against 244 / 378 with 5, which were
# 1-4 us faster elsewhere; the pass at 16 warps 3-10% faster than at 8. H200, 128256 float32
# logits, dev/topk_topp_probe.py.)
THR_CHAIN_PASSES = 6
THR_PASS_WARPS = 16
_ST = tl.constexpr(14)  # words of state a row
_W_PHASE = tl.constexpr(0)  # 0 top-k's search, 1 top-p's, 2 done (lo is the threshold)
_W_LO = tl.constexpr(1)
_W_HI = tl.constexpr(2)
_W_PASSES = tl.constexpr(3)
_W_INSIDE = tl.constexpr(4)  # tokens in [lo, hi), -1 before a first pass
_W_TARGET = tl.constexpr(5)  # top-p's goal mass (float32 bits)
_W_COPY = tl.constexpr(6)  # 1: the next pass copies [lo, hi) to the list (`_offset_at`)
_W_MAX = tl.constexpr(7)  # the row's max of s (float32 bits)
_W_KMAX = tl.constexpr(8)  # its largest key
_W_K = tl.constexpr(9)  # k (V where top-k is off)
_W_P = tl.constexpr(10)  # p (float32 bits)
_W_ABOVE_C = tl.constexpr(11)  # W(hi): the count of the tokens at or above hi
_W_ABOVE_W = tl.constexpr(12)  # their mass (float32 bits)
_SPAN_WORDS = 4 + 2 * THR_PIVOTS + 1  # a (row, span)'s words: stats, pass sums, list offset


@triton.jit
def _stats_at(WS, row, S):
    """Where (row, span 0)'s stats start in WS (a span's 4 words follow its predecessor's)."""
    return WS + (tl.num_programs(0) * _ST + row * S * 4)


@triton.jit
def _sums_at(WS, row, S, NP: tl.constexpr):
    """Where (row, span 0)'s pass sums start in WS (2 NP words a span)."""
    n = tl.num_programs(0)
    return WS + (n * _ST + n * S * 4 + row * S * (2 * NP))


@triton.jit
def _offset_at(WS, row, S, NP: tl.constexpr):
    """Where (row, span 0)'s offset in the row's list is in WS (a word a span)."""
    n = tl.num_programs(0)
    return WS + (n * _ST + n * S * (4 + 2 * NP) + row * S)


@triton.jit(do_not_specialize=["NB", "S"])
def _thr_stats_kernel(X, WS, V, sx, NB, S, T, BLOCK: tl.constexpr, STAGES: tl.constexpr,
                      PDL: tl.constexpr = False):  # fmt: skip
    """Program (row, span): `_row_stats` of the span's columns -> WS's span words."""
    pdl_wait(PDL)
    row = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1)
    lo = c * NB * BLOCK
    n = tl.minimum(V - lo, NB * BLOCK)
    mx, kmin, kmax, bad = _row_stats(X + row * sx + lo, n, tl.load(T + row), BLOCK, STAGES)
    at = _stats_at(WS, row, S) + c * 4
    tl.store(at, mx.to(tl.int32, bitcast=True))
    tl.store(at + 1, kmin)
    tl.store(at + 2, kmax)
    tl.store(at + 3, bad)


@triton.jit(do_not_specialize=["S"])
def _thr_decide_kernel(WS, LIST, V, S, T, TOPK, TOPP, C: tl.constexpr, NP: tl.constexpr,
                       S_P2: tl.constexpr, FIRST: tl.constexpr,
                       PDL: tl.constexpr = False):  # fmt: skip
    """Program row: FIRST, the row's state from its spans' stats; else the bracket the last
    pass's sums leave (block comment above: the search ends on the list the pass copied, or
    the list's offsets are written where the bracket holds at most C tokens; a top-k search
    that ends hands over to top-p's where p < 1)."""
    pdl_wait(PDL)
    row = tl.program_id(0).to(tl.int64)
    st = WS + row * _ST
    c = tl.arange(0, S_P2)
    m = c < S
    if FIRST:
        at = _stats_at(WS, row, S) + c * 4
        mx = tl.max(tl.load(at, mask=m, other=0xFF800000).to(tl.float32, bitcast=True), axis=0)
        kmin = tl.min(tl.load(at + 1, mask=m, other=2147483647), axis=0)
        kmax = tl.max(tl.load(at + 2, mask=m, other=-2147483648), axis=0)
        bad = tl.max(tl.load(at + 3, mask=m, other=0), axis=0)
        t = tl.load(T + row)
        k = tl.load(TOPK + row)
        p = tl.load(TOPP + row)
        use_k = (k > 0) & (k < V)
        phase = tl.where((t > 0) & (use_k | (p < 1.0)) & (bad == 0), tl.where(use_k, 0, 1), 2)
        tl.store(st + _W_PHASE, phase)
        tl.store(st + _W_LO, tl.where(phase == 2, -2147483648, kmin))
        tl.store(st + _W_HI, kmax + 1)
        tl.store(st + _W_PASSES, 0)
        tl.store(st + _W_INSIDE, -1)
        tl.store(st + _W_TARGET, 0)
        tl.store(st + _W_COPY, 0)
        tl.store(st + _W_ABOVE_C, 0)
        tl.store(st + _W_ABOVE_W, 0)
        tl.store(st + _W_MAX, mx.to(tl.int32, bitcast=True))
        tl.store(st + _W_KMAX, kmax)
        tl.store(st + _W_K, tl.where(use_k, k, V).to(tl.int32))
        tl.store(st + _W_P, p.to(tl.int32, bitcast=True))
    else:
        phase = tl.load(st + _W_PHASE)
        if phase < 2:
            lo = tl.load(st + _W_LO)
            hi = tl.load(st + _W_HI)
            passes = tl.load(st + _W_PASSES)
            inside = tl.load(st + _W_INSIDE)
            target = tl.load(st + _W_TARGET).to(tl.float32, bitcast=True)
            above_c = tl.load(st + _W_ABOVE_C)
            above_w = tl.load(st + _W_ABOVE_W).to(tl.float32, bitcast=True)
            mx = tl.load(st + _W_MAX).to(tl.float32, bitcast=True)
            k = tl.load(st + _W_K)
            p = tl.load(st + _W_P).to(tl.float32, bitcast=True)
            j = tl.zeros([], tl.int32)
            if tl.load(st + _W_COPY) == 1:  # the pass copied [lo, hi): the search ends there
                t = tl.load(T + row)
                if phase == 1:
                    lo = _list_select(LIST + row * C, inside, t, mx, lo, hi, target, above_c,
                                      above_w, True, C)  # fmt: skip
                else:
                    lo = _list_select(LIST + row * C, inside, t, mx, lo, hi, k, above_c,
                                      above_w, False, C)  # fmt: skip
                hi = lo + 1
            else:
                piv = _pivots(lo, hi, passes, mx, NP)
                base = _sums_at(WS, row, S, NP) + c[:, None] * (2 * NP) + tl.arange(0, NP)[None, :]
                cnt = tl.sum(tl.load(base, mask=m[:, None], other=0), axis=0)
                w = tl.sum(tl.load(base + NP, mask=m[:, None], other=0).to(tl.float32,
                           bitcast=True), axis=0)  # fmt: skip
                goal = tl.where(phase == 1, p, k.to(tl.float32))
                lo, hi, inside, target, j = _narrow(piv, cnt, w, goal, target, passes,
                                                    phase == 1, NP)  # fmt: skip
                slot = tl.arange(0, NP)
                above_c = tl.sum(tl.where(slot == j + 1, cnt, 0), axis=0)  # W(hi)
                above_w = tl.sum(tl.where(slot == j + 1, w, 0.0), axis=0)
                passes += 1
            copy = 0
            if hi.to(tl.int64) - lo.to(tl.int64) <= 1:  # this search ended
                if (phase == 0) & (p < 1.0):  # top-p's from top-k's threshold, on the row
                    phase = 1
                    hi = tl.load(st + _W_KMAX) + 1
                    passes = 0
                    inside = -1
                    above_c = 0
                    above_w = 0.0
                else:
                    phase = 2
            elif inside <= C:  # the next pass copies [lo, hi) to the list (a pass of sums
                # just ran: its spans' counts at the bracket's ends give their offsets)
                at = _sums_at(WS, row, S, NP) + c * (2 * NP) + j
                d = tl.load(at, mask=m, other=0) - tl.load(at + 1, mask=m, other=0)
                tl.store(_offset_at(WS, row, S, NP) + c, tl.cumsum(d, axis=0) - d, mask=m)
                copy = 1
            tl.store(st + _W_PHASE, phase)
            tl.store(st + _W_LO, lo)
            tl.store(st + _W_HI, hi)
            tl.store(st + _W_PASSES, passes)
            tl.store(st + _W_INSIDE, inside)
            tl.store(st + _W_TARGET, target.to(tl.int32, bitcast=True))
            tl.store(st + _W_ABOVE_C, above_c)
            tl.store(st + _W_ABOVE_W, above_w.to(tl.int32, bitcast=True))
            tl.store(st + _W_COPY, copy)


@triton.jit(do_not_specialize=["NB", "S"])
def _thr_pass_kernel(X, WS, LIST, V, sx, NB, S, T, C: tl.constexpr, BLOCK: tl.constexpr,
                     NP: tl.constexpr, STAGES: tl.constexpr,
                     PDL: tl.constexpr = False):  # fmt: skip
    """Program (row, span): the span's pass sums at the row state's pivots -> WS's sums
    region; or, where the state says so, the span's tokens in [lo, hi) -> the row's list
    (LIST [n, C]) from the span's offset, in column order (`_copy_bracket`)."""
    pdl_wait(PDL)
    row = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1)
    st = WS + row * _ST
    phase = tl.load(st + _W_PHASE)
    if phase < 2:
        lo = tl.load(st + _W_LO)
        hi = tl.load(st + _W_HI)
        start = c * NB * BLOCK
        n = tl.minimum(V - start, NB * BLOCK)
        src = X + row * sx + start
        t = tl.load(T + row)
        if tl.load(st + _W_COPY) == 1:
            dest = LIST + row * C + tl.load(_offset_at(WS, row, S, NP) + c)
            _copy_bracket(src, n, t, lo, hi, dest, BLOCK, STAGES)
        else:
            mx = tl.load(st + _W_MAX).to(tl.float32, bitcast=True)
            piv = _pivots(lo, hi, tl.load(st + _W_PASSES), mx, NP)
            if phase == 1:  # (two forms: top-k's passes skip the masses)
                cnt, w = _pass_sums(src, n, t, mx, piv, True, BLOCK, NP, STAGES)
            else:
                cnt, w = _pass_sums(src, n, t, mx, piv, False, BLOCK, NP, STAGES)
            slot = tl.arange(0, NP)
            at = _sums_at(WS, row, S, NP) + c * (2 * NP)
            tl.store(at + slot, cnt)
            tl.store(at + NP + slot, w.to(tl.int32, bitcast=True))


@triton.jit(do_not_specialize=["S"])
def _keep_threshold_kernel(X, THR, LIST, V, sx, T, TOPK, TOPP, WS, S, C: tl.constexpr,
                           BLOCK: tl.constexpr, NP: tl.constexpr, STAGES: tl.constexpr,
                           CHAIN: tl.constexpr = False, PDL: tl.constexpr = False):  # fmt: skip
    """Program row: THR[row] (int32) = the smallest `_order_key` of the tokens top-k (TOPK[row]
    int64, on where 0 < k < V) and then top-p (TOPP[row] float32, on where p < 1) keep of
    x / T[row]; -2**31 (every token) where T[row] <= 0, neither is on, or the row holds a
    NaN or +inf. LIST: the rows' scratch, [n, C] of x's dtype. CHAIN: go on from the row's
    state in WS (the chain's launches, block comment above)."""
    pdl_wait(PDL)
    row = tl.program_id(0).to(tl.int64)
    t = tl.load(T + row)
    k = tl.load(TOPK + row)
    p = tl.load(TOPP + row)
    use_k = (k > 0) & (k < V)
    use_p = p < 1.0
    base = X + row * sx
    lst = LIST + row * C
    thr = -2147483648
    if CHAIN:
        st = WS + row * _ST
        phase = tl.load(st + _W_PHASE)
        lo = tl.load(st + _W_LO)
        thr = lo
        if phase < 2:
            hi = tl.load(st + _W_HI)
            passes = tl.load(st + _W_PASSES)
            inside = tl.load(st + _W_INSIDE)
            target = tl.load(st + _W_TARGET).to(tl.float32, bitcast=True)
            mx = tl.load(st + _W_MAX).to(tl.float32, bitcast=True)
            above_c = tl.load(st + _W_ABOVE_C)
            above_w = tl.load(st + _W_ABOVE_W).to(tl.float32, bitcast=True)
            if phase == 0:
                thr = _threshold_search(base, V, t, mx, lo, hi, k, lst, C, False, BLOCK, NP,
                                        STAGES, passes, inside, target, above_c,
                                        above_w)  # fmt: skip
                if use_p:
                    thr = _threshold_search(base, V, t, mx, thr, tl.load(st + _W_KMAX) + 1, p,
                                            lst, C, True, BLOCK, NP, STAGES)  # fmt: skip
            else:
                thr = _threshold_search(base, V, t, mx, lo, hi, p, lst, C, True, BLOCK, NP,
                                        STAGES, passes, inside, target, above_c,
                                        above_w)  # fmt: skip
    elif (t > 0) & (use_k | use_p):
        mx, kmin, kmax, bad = _row_stats(base, V, t, BLOCK, STAGES)
        if bad == 0:
            thr = kmin
            if use_k:
                thr = _threshold_search(base, V, t, mx, kmin, kmax + 1, k, lst, C, False, BLOCK,
                                        NP, STAGES)  # fmt: skip
            if use_p:
                thr = _threshold_search(base, V, t, mx, thr, kmax + 1, p, lst, C, True, BLOCK,
                                        NP, STAGES)  # fmt: skip
    tl.store(THR + row, thr)


# Rows at most this many take the chain of span passes (`thr_plan`), more the one program a row
# (H200, 128256 float32 logits, dev/topk_topp_probe.py, us a call, chain / a program a row,
# top_k 50, top_p 0.9, both, top_p 0.999: 64 rows 227 / 277, 303 / 391, 362 / 466, 354 / 474;
# 128 rows 370 / 336, 490 / 441, 588 / 522, 582 / 536).
THR_CHAIN_MAX_ROWS = 64


def thr_plan(n: int, V: int, sms: int) -> tuple[int, int]:
    """(spans a row S, THR_BLOCK blocks a span) of the keep threshold's span passes for x [n,
    V] on `sms` multiprocessors: spans of whole blocks until the grid holds
    THR_PROGRAMS_PER_SM programs a SM; S 1 (no chain: a program a row) where the rows fill
    that, or over THR_CHAIN_MAX_ROWS rows."""
    blocks = triton.cdiv(V, THR_BLOCK)
    want = triton.cdiv(THR_PROGRAMS_PER_SM * sms, max(n, 1))
    nb = triton.cdiv(blocks, max(1, min(blocks, want)))
    S = triton.cdiv(blocks, nb)
    return (1, blocks) if n > THR_CHAIN_MAX_ROWS else (S, nb)


def _keep_thresholds(x, temperature, top_k, top_p, sms, pdl):
    """The rows' keep thresholds (int32 [n]) and the scratch they used (LIST of x's dtype, WS
    int32 or None): the chain where `thr_plan` gives spans, else one launch."""
    n, V = x.shape
    S, nb = thr_plan(n, V, sms)
    thr = torch.empty(n, dtype=torch.int32, device=x.device)
    lst = torch.empty(n, THR_LIST, dtype=x.dtype, device=x.device)
    common = dict(C=THR_LIST, BLOCK=THR_BLOCK, NP=THR_PIVOTS, STAGES=3, num_warps=16, **pdl)
    if S == 1:
        cached_launch(
            _keep_threshold_kernel, (n,), x, thr, lst, V, x.stride(0), temperature, top_k, top_p,
            x, 1, **common,
        )  # fmt: skip
        return thr, lst, None
    ws = torch.empty(n * (_ST.value + S * _SPAN_WORDS), dtype=torch.int32, device=x.device)
    decide = dict(C=THR_LIST, NP=THR_PIVOTS, S_P2=triton.next_power_of_2(triton.cdiv(V, THR_BLOCK)),
                  num_warps=16, **pdl)  # fmt: skip
    cached_launch(
        _thr_stats_kernel, (n, S), x, ws, V, x.stride(0), nb, S, temperature, BLOCK=THR_BLOCK,
        STAGES=3, num_warps=8, **pdl,
    )  # fmt: skip
    cached_launch(_thr_decide_kernel, (n,), ws, lst, V, S, temperature, top_k, top_p,
                  FIRST=True, **decide)  # fmt: skip
    for _ in range(THR_CHAIN_PASSES):
        cached_launch(
            _thr_pass_kernel, (n, S), x, ws, lst, V, x.stride(0), nb, S, temperature, C=THR_LIST,
            BLOCK=THR_BLOCK, NP=THR_PIVOTS, STAGES=3, num_warps=THR_PASS_WARPS, **pdl,
        )  # fmt: skip
        cached_launch(_thr_decide_kernel, (n,), ws, lst, V, S, temperature, top_k, top_p,
                      FIRST=False, **decide)  # fmt: skip
    cached_launch(
        _keep_threshold_kernel, (n,), x, thr, lst, V, x.stride(0), temperature, top_k, top_p, ws,
        S, CHAIN=True, **common,
    )  # fmt: skip
    return thr, lst, ws


def keep_threshold_launches(n: int, V: int, sms: int) -> int:
    """How many launches `_keep_thresholds` makes for x [n, V]."""
    return 1 if thr_plan(n, V, sms)[0] == 1 else 3 + 2 * THR_CHAIN_PASSES
