"""The balanced work list of dense MLA decode, and the combine that merges its split tiles.

A dense decode launch's work is a list of items (tile, chunk). Request b has q_len_b query
tokens in tiles of TPT tokens (`tiles_b = cdiv(q_len_b, TPT)`, the leader of tile j is token
`q_row_offsets[b] + j * TPT`); each tile reads at most `n_b = cache_len_b + q_len_b` keys,
`w_b = cdiv(n_b, BN)` blocks of BN keys. Every tile of request b splits into c_b chunks so that
an item holds about `cb` blocks, the same for all requests of the step:

    total = sum_b tiles_b * w_b,   cb = max(MIN_BLOCKS, cdiv(9 total, 8 TARGET)),
    c_b = max(1, cdiv(w_b, cb)),   chunk_b = cdiv(w_b, c_b) * BN keys,
    items_b = tiles_b * c_b.

Items are numbered request by request (a request's tiles, then chunks, consecutive); where one
item a program serves (the item list's own launch, `wl_order` 1, the default), the requests
come by bucket of their chunk, largest first (`ops.list_order.bucket_ends`), so that the
hardware's in-order dispatch of a list longer than a wave starts its longest items first;
`wl_order` 0 and the runs keep request order. `sum_b items_b <= TARGET + sum_b
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
`sm90.gluon_mla.g_list_item` (same arithmetic; `g_work_item` takes the program's item).

Item k of tile (b, j), chunk p sees keys [p chunk_b, (p + 1) chunk_b) of that tile's range (the
kernel clamps it to the causal limit). A tile of one item writes the final output (sinks
folded in) and its LSE; a tile of several writes normalised float32 partials at rows
`s * TPT + i` (i: the token's index in the tile; s: the item's index in request order,
`mla_find_item`'s slot, which is k in request order) of PO [items * TPT, h_q, D_V] / PL [items *
TPT, h_q] (natural-log LSE), and `_mla_worklist_combine_kernel` merges them (sinks, LSE, NaN as
in `ops.combine`), deriving the list in request order whatever order the decode took.

Contiguous runs (`RUNS`: the portable kernel, and `_mla_decode_sm90_t` at 16 query rows).
Items of a SM's whole share leave a partial second wave on skewed lengths; instead each of
RUN_P = TARGET programs (a head block) walks an equal run of the step's concatenated blocks,
as FlashMLA's scheduler does:

    stream:  tile after tile (request-major), each OVH + w_b units (its prologue, its blocks),
    S = max(cdiv(units, RUN_P), MIN_BLOCKS),   piece p = units [p S, min((p + 1) S, units)).

A program walks its piece's segments (a tile's blocks inside it, `mla_run_segment`) one after
the other. A tile inside one piece writes the output; a cut tile writes partials at slot 2 p
(the tile is its piece's first) or 2 p + 1 (its last), rows `slot * TPT + i`; the program
holding a tile's first block writes META[t + i] = (first slot, pieces, i) for its tokens, and
`_mla_runs_combine_kernel` takes the slots 2 (p0 + k) after the first one (p0 = first slot //
2) and merges them (`mla_merge_rows`, `RUNS_MERGE`). Where the item list (TARGET = RUN_P) fits
one wave and no item is longer than 9/8 S (ITEM_WAVES 1), program p takes item p instead (slot
2 p, pieces = its tile's items): a uniform batch keeps whole tiles. The TMA-fed seesaw (one CTA
a SM, 64 heads a tile) also takes the list over ITEM_WAVES 2 waves (program p: items p, p +
RUN_P; slot 2 item) where two of its longest items take at most 9/8 S: h_q 128 uniform b128 x 4k
has 128 whole tiles a head block for 66 programs, which the runs cut nearly all. Every program
decides from the same lengths, so the grid RUN_P x head blocks is host-known.
`mla_host_run_programs` mirrors the choice and the counts on the host, `mla_host_runs` the
segments (tests).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ..launch import launch
from ..list_order import bucket_ends
from ..pdl import pdl_enabled, pdl_launch_kwargs, pdl_wait
from ..triton_constants import LN2, LOG2E


@triton.jit
def mla_requests(QOFF, K_CL, batch, TPT: tl.constexpr, BN: tl.constexpr, B_P2: tl.constexpr):
    """Per request [B_P2] (0 past batch): (r, first token o_lo, query length q_len, tiles of TPT
    tokens, blocks w of BN keys a tile reads)."""
    r = tl.arange(0, B_P2)
    rm = r < batch
    o_lo = tl.load(QOFF + r, mask=rm, other=0)
    o_hi = tl.load(QOFF + r + 1, mask=rm, other=0)
    q_len = tl.maximum(o_hi - o_lo, 0)
    cl = tl.maximum(tl.load(K_CL + r, mask=rm, other=0), 0)
    tiles = tl.where(rm, tl.cdiv(q_len, TPT), 0)
    return r, o_lo, q_len, tiles, tl.cdiv(cl + q_len, BN)


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
    ORDER: tl.constexpr = 0,
):
    """(r [B_P2] request ids, c [B_P2] chunks a tile, n [B_P2] items a request (0 past batch),
    end [B_P2] one past each request's last item (its items are [end - n, end); ORDER 0:
    request order, the inclusive prefix sums of n; 1: `ops.list_order.bucket_ends`), chunk
    [B_P2] keys a chunk, o_lo [B_P2] first token) of the module docstring's list."""
    r, o_lo, q_len, tiles, w = mla_requests(QOFF, K_CL, batch, TPT, BN, B_P2)
    total = tl.sum(tiles.to(tl.int64) * w, 0)
    cb = tl.maximum(tl.cdiv(total * 9, TARGET * 8), MIN_BLOCKS).to(tl.int32)
    c = tl.maximum(tl.cdiv(w, cb), 1)
    n = tiles * c
    chunk = tl.cdiv(w, c) * BN
    if ORDER == 1:
        end = bucket_ends(n, tl.cdiv(w, c), cb)
    else:
        end = tl.cumsum(n, 0)
    return r, c, n, end, chunk, o_lo


@triton.jit
def mla_find_item(r, c, n, end, chunk, o_lo, k, TPT: tl.constexpr, ORDER: tl.constexpr = 0):
    """(valid, t, lo, hi, c_b, slot) of item k of the list `mla_work_list` returns: whether k
    is an item, its tile's leader token t, its chunk's keys [lo, hi) (before the causal clamp),
    the chunks of its tile, and its partial slot (rows slot * TPT + i): its place in request
    order, k itself in ORDER 0, so that in any order the partials of every tile lie where
    request order puts them and the combine derives no order (one more prefix sum in each
    decode program instead of the buckets in every combine program). end: one past each
    request's last item (ORDER 0: the inclusive prefix sums of n)."""
    valid = k < tl.sum(n, 0)
    if ORDER == 0:
        b = tl.sum(tl.where(end <= k, 1, 0), 0)
        at = r == b
        slot = k
    else:
        at = (end - n <= k) & (k < end)
        slot = k + tl.sum(tl.where(at, tl.cumsum(n, 0) - end, 0), 0)
    n_b = tl.sum(tl.where(at, n, 0), 0)
    c_b = tl.maximum(tl.sum(tl.where(at, c, 0), 0), 1)
    local = k - (tl.sum(tl.where(at, end, 0), 0) - n_b)
    j = local // c_b
    lo = (local % c_b) * tl.sum(tl.where(at, chunk, 0), 0)
    t = tl.sum(tl.where(at, o_lo, 0), 0) + j * TPT
    return valid, t, lo, lo + tl.sum(tl.where(at, chunk, 0), 0), c_b, slot


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
    tiles, w, _ = _host_tiles(q_row_offsets, cache_lens, tpt, bn)
    return int((tiles * _host_chunks(tiles, w, target, min_blocks)).sum())


def mla_host_long_tokens(
    q_row_offsets: torch.Tensor,
    cache_lens: torch.Tensor,
    *,
    tpt: int,
    bn: int,
    target: int,
    min_blocks: int,
    long_min: int,
) -> int:
    """The tokens whose tile the list cuts into >= long_min items (the item list's combine's
    long chains), from host tensors."""
    tiles, w, q_len = _host_tiles(q_row_offsets, cache_lens, tpt, bn)
    return int(q_len[_host_chunks(tiles, w, target, min_blocks) >= long_min].sum())


def _host_tiles(q_row_offsets, cache_lens, tpt: int, bn: int):
    """Per request (tiles of tpt tokens, blocks of bn keys a tile reads, query tokens), int64
    (host mirror of `mla_requests`)."""
    offs = q_row_offsets.to(torch.int64)
    q_len = (offs[1:] - offs[:-1]).clamp(min=0)
    cl = cache_lens.to(torch.int64).clamp(min=0)
    return (q_len + tpt - 1) // tpt, (cl + q_len + bn - 1) // bn, q_len


def _host_chunks(tiles, w, target: int, min_blocks: int):
    """Per request the chunks a tile splits into on the list (host mirror of `mla_work_list`)."""
    cb = max(-(-int((tiles * w).sum()) * 9 // (target * 8)), min_blocks)
    return ((w + cb - 1) // cb).clamp(min=1)


# --------------------------------------------------------------------------------------------
# Contiguous runs (the keys-as-M BF16 kernel and the portable kernel)
# --------------------------------------------------------------------------------------------
@triton.jit
def mla_run_stream(QOFF, K_CL, batch, TPT: tl.constexpr, BN: tl.constexpr, OVH: tl.constexpr,
                   B_P2: tl.constexpr):  # fmt: skip
    """The step's stream of units (`RUNS` in the module docstring): per request [B_P2] its id r,
    first token o_lo, query length q_len, blocks a tile w, stream span (tiles * (w + OVH),
    int64) and inclusive prefix sums incl of the spans (0 past batch)."""
    r, o_lo, q_len, tiles, w = mla_requests(QOFF, K_CL, batch, TPT, BN, B_P2)
    span = tiles.to(tl.int64) * (w + OVH)
    incl = tl.cumsum(span, 0)
    return r, o_lo, q_len, w, span, incl


@triton.jit
def mla_run_piece(incl, RUN_P: tl.constexpr, RUN_MIN: tl.constexpr):
    """(S, total): the units a piece holds and the stream's length."""
    total = tl.max(incl, 0)
    return tl.maximum(tl.cdiv(total, RUN_P), RUN_MIN), total


@triton.jit
def mla_run_segment(r, o_lo, q_len, w, span, incl, pos, end, begin, p, TPT: tl.constexpr,
                    OVH: tl.constexpr):  # fmt: skip
    """The segment of the run [begin, end) of piece p that starts at stream position pos:
    (t, n_tok, lo, hi, w_b, b0, b1, slot). t: its tile's leader token and n_tok its tokens;
    [lo, hi): its blocks of the tile (empty where the piece ends in the tile's prologue
    units); w_b: the tile's blocks; [b0, b1): the tile's blocks in the stream (the next
    segment starts at b1); slot: its partial slot, 2 p for the piece's first tile and 2 p + 1
    for its last."""
    b = tl.sum(tl.where(incl <= pos, 1, 0), 0)
    at = r == b
    start = tl.sum(tl.where(at, incl - span, 0), 0)
    w_b = tl.sum(tl.where(at, w, 0), 0)
    j = (pos - start) // (w_b + OVH)
    row = start + j * (w_b + OVH)
    b0 = row + OVH
    b1 = b0 + w_b
    lo = tl.maximum(pos, b0) - b0
    hi = tl.minimum(end, b1) - b0
    o_b = tl.sum(tl.where(at, o_lo, 0), 0)
    t = o_b + (j * TPT).to(tl.int32)
    n_tok = tl.minimum(o_b + tl.sum(tl.where(at, q_len, 0), 0) - t, TPT)
    slot = 2 * p + (row > begin).to(tl.int32)
    return t, n_tok, lo.to(tl.int32), hi.to(tl.int32), w_b, b0, b1, slot


@triton.jit
def mla_run_meta(META, t, n_tok, slot, n_pieces, TPT: tl.constexpr):
    """The combine's META (slot, pieces, index in the tile) of the n_tok tokens of the tile led
    by token t."""
    for i in tl.static_range(TPT):
        mp = META + (t + i).to(tl.int64) * 4
        tl.store(mp, slot, mask=i < n_tok)
        tl.store(mp + 1, n_pieces, mask=i < n_tok)
        tl.store(mp + 2, slot * 0 + i, mask=i < n_tok)


@triton.jit
def mla_tile_tokens(QOFF, batch, t, TPT: tl.constexpr, B_P2: tl.constexpr):
    """The tokens of the tile led by token t: min(TPT, the end of t's request - t)."""
    ob = tl.arange(0, B_P2)
    offs = tl.load(QOFF + ob, mask=ob <= batch, other=2147483647)
    return tl.minimum(tl.min(tl.where(offs > t, offs, 2147483647), 0) - t, TPT)


def mla_host_run_programs(q_row_offsets: torch.Tensor, cache_lens: torch.Tensor, *, tpt: int,
                          bn: int, ovh: int, run_p: int, run_min: int,
                          item_waves: int) -> tuple[bool, int]:  # fmt: skip
    """(items, programs with work) of a `RUNS` launch, from host tensors (torch arithmetic
    mirroring the kernels' choice): the list's items (TARGET = run_p) where they fit
    `item_waves` waves of run_p and that many of its longest items take at most 9/8 of a run's
    S units (one wave: no item longer than 9/8 S; program p takes items p, p + run_p, ...),
    else the pieces of the runs that hold units."""
    tiles, w, _ = _host_tiles(q_row_offsets, cache_lens, tpt, bn)
    total = int((tiles * (w + ovh)).sum())
    size = max(-(-total // run_p), run_min)
    if item_waves > 0:
        c = _host_chunks(tiles, w, run_p, run_min)
        n_items = int((tiles * c).sum())
        chunk = torch.where(tiles > 0, (w + c - 1) // c, 0)
        longest = int(chunk.max()) if chunk.numel() else 0
        waves = -(-n_items // run_p)
        if n_items <= run_p * item_waves and longest * 8 * waves <= size * 9:
            return True, min(n_items, run_p)
    return False, -(-total // size)


def mla_host_runs(q_row_offsets, cache_lens, *, tpt: int, bn: int, ovh: int, run_p: int,
                  run_min: int) -> list[list[tuple[int, int, int, int, int]]]:  # fmt: skip
    """The segments each piece of `RUNS` walks, from host lengths (Python arithmetic mirroring
    `mla_run_stream` / `mla_run_segment`): per piece a list of (t, lo, hi, slot, pieces of the
    tile), for the tests of the cover."""
    offs = [int(x) for x in q_row_offsets.tolist()]
    cls = [max(int(x), 0) for x in cache_lens.tolist()]
    tiles_w = []
    for b in range(len(offs) - 1):
        q_len = max(offs[b + 1] - offs[b], 0)
        tiles_w.append((offs[b], -(-q_len // tpt), -(-(cls[b] + q_len) // bn)))
    total = sum(n * (w + ovh) for _, n, w in tiles_w)
    size = max(-(-total // run_p), run_min)
    rows, pos = [], 0
    for o_lo, n, w in tiles_w:
        for j in range(n):
            rows.append((pos, o_lo + j * tpt, w))
            pos += w + ovh
    runs = []
    for p in range(run_p):
        begin, end = p * size, min((p + 1) * size, total)
        segs = []
        for row, t, w in rows:
            b0, b1 = row + ovh, row + ovh + w
            lo, hi = max(begin, b0) - b0, min(end, b1) - b0
            if lo < hi:
                n_pieces = (b1 - 1) // size - b0 // size + 1
                segs.append((t, lo, hi, 2 * p + int(row > begin), n_pieces))
        runs.append(segs)
    return runs


@dataclass(frozen=True)
class MergeShape:
    """A combine's launch shape (`mla_merge_rows`): a program merges 16 heads (fewer where h_q
    is) by `db` output dims, `ns` partials a step, the step's loads pipelined `stages` deep,
    with `num_warps` warps."""

    ns: int
    db: int
    stages: int
    num_warps: int = 4
    # the item list's combine only (the runs' keeps one program a chain): the first
    # `long_max` tokens (in token order) whose tile was cut into >= `long_min` items are
    # merged by `fine` programs a (head block, db dims), each db / fine dims, instead of one
    # (their chains are long: one long request among short ones, docs/kernels/triton_mla.md,
    # "The long chains' merge"); long_max 0: none
    long_min: int = 0
    long_max: int = 0
    fine: int = 1

    def blocks(self, h_q: int, d_v: int) -> tuple[int, int]:
        """(heads, output dims) a program."""
        return min(16, triton.next_power_of_2(h_q)), min(self.db, triton.next_power_of_2(d_v))


#: The shipped shapes: the fastest of the sweep on the real-workload suite's MLA steps on an
#: H200 (runs' combine, h_q 16, skewed b64: 5.5 us against 18.9 for the unpipelined form; the
#: item list's, h_q 128, whose 64-head partial rows make it move bytes, favours wider
#: programs: 256 dims). The sweep and its record: docs/kernels/triton_mla.md, "The combines".
RUNS_MERGE = MergeShape(ns=2, db=64, stages=3)
ITEMS_MERGE = MergeShape(ns=1, db=256, stages=3)


@triton.jit
def mla_merge_out(acc, den, m, SINK, offs_h, hmask, HAS_SINK: tl.constexpr):
    """The output [BH, DB] f32 of an LSE merge (both combines) from the running acc [BH, DB],
    denominator den [BH] and max m [BH] (log2 units): 0 for a head that saw no key; the sink
    [h_q] joins the denominator only (+inf gives 0)."""
    has = den != 0.0
    inv = tl.where(has, 1.0 / tl.where(has, den, 1.0), 0.0)
    if HAS_SINK:
        sink = tl.load(SINK + offs_h, mask=hmask, other=0.0)
        m_use = tl.where(m == float("-inf"), 0.0, m)
        # 1 / (den + exp(sink - m)) in the max-shifted frame; sink=+inf -> 0
        inv = tl.where(has, 1.0 / (den + tl.math.exp2(sink * LOG2E - m_use)), 0.0)
    return acc * inv[:, None]


@triton.jit
def mla_merge_lse(den, m):
    """The natural-log LSE [BH] of an LSE merge (`mla_merge_out`'s den and m): -inf for a head
    that saw no key."""
    has = den != 0.0
    m_use = tl.where(m == float("-inf"), 0.0, m)
    return tl.where(has, (m_use + tl.math.log2(tl.where(has, den, 1.0))) * LN2, float("-inf"))


@triton.jit
def mla_merge_rows(PL, PO, n, r0, base, step, offs_h, hmask, offs_d, dmask, H_Q: tl.constexpr,
                   D_V: tl.constexpr, NS: tl.constexpr, STAGES: tl.constexpr):  # fmt: skip
    """(acc [BH, DB], den [BH], m [BH]) of the LSE merge of n >= 1 partials (both combines):
    partial k at row r0 (k = 0) or base + step k (k >= 1) of PL [rows, H_Q] (natural-log LSE)
    and PO [rows, H_Q, D_V], acc = sum_k 2^(lse_k - m) o_k and den = sum_k 2^(lse_k - m) with m
    the max LSE (log2 units), for `mla_merge_out` / `mla_merge_lse`.

    NS partials a step, online (the running max rescales den and an [NS, BH, DB] accumulator
    that is summed over its NS rows once, after the loop); the step's loads are software-
    pipelined STAGES deep (cp.async), so a step does not wait for its own loads' latency. An
    unseen partial (LSE -inf) adds nothing; a NaN one makes the row NaN."""
    m = tl.full([offs_h.shape[0]], float("-inf"), tl.float32)
    den = tl.zeros([offs_h.shape[0]], tl.float32)
    acc = tl.zeros([NS, offs_h.shape[0], offs_d.shape[0]], tl.float32)
    for kc in tl.range(0, n, NS, num_stages=STAGES):
        k = kc + tl.arange(0, NS)
        row = tl.where(k == 0, r0, base + step * k.to(tl.int64))
        prow = row[:, None] * H_Q + offs_h[None, :]
        pm = (k < n)[:, None] & hmask[None, :]
        lp = tl.load(PL + prow, mask=pm, other=float("-inf")) * LOG2E
        o = tl.load(PO + prow[:, :, None] * D_V + offs_d[None, None, :],
                    mask=pm[:, :, None] & dmask[None, None, :], other=0.0)  # fmt: skip
        m_new = tl.maximum(m, tl.max(lp, 0))
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.math.exp2(m - m_use)
        w = tl.math.exp2(lp - m_use[None, :])
        den = den * alpha + tl.sum(w, 0)
        part = tl.where((lp != float("-inf"))[:, :, None], w[:, :, None] * o, 0.0)
        acc = acc * alpha[None, :, None] + part
        m = m_new
    return tl.sum(acc, 0), den, m


@triton.jit
def mla_merge_token(t, covered, n, r0, base, step, PL, PO, SINK, OUT, stride_ot, stride_oh,
                    LSE, d0, H_Q: tl.constexpr, BH: tl.constexpr, D_V: tl.constexpr,
                    DB: tl.constexpr, NS: tl.constexpr, STAGES: tl.constexpr,
                    HAS_SINK: tl.constexpr):  # fmt: skip
    """Both combines' program (token t; heads from program id 1, output dims [d0, d0 + DB)): a
    token outside the requests (not `covered`) gets output 0 and LSE -inf; a covered one whose
    tile was cut into n > 1 partials (rows as `mla_merge_rows` takes them) gets their merge
    (sinks folded in); one of a single partial was written by the decode kernel. The program
    of dims from 0 writes the LSE."""
    hb = tl.program_id(1)
    dc = d0
    t64 = t.to(tl.int64)
    offs_h = hb * BH + tl.arange(0, BH)
    offs_d = d0 + tl.arange(0, DB)
    hmask = offs_h < H_Q
    dmask = offs_d < D_V
    omask = hmask[:, None] & dmask[None, :]
    optr = OUT + t64 * stride_ot + offs_h[:, None] * stride_oh + offs_d[None, :]
    if not covered:
        tl.store(optr, tl.zeros([BH, DB], OUT.dtype.element_ty), mask=omask)
        if dc == 0:
            tl.store(LSE + t64 * H_Q + offs_h, tl.full([BH], float("-inf"), tl.float32),
                     mask=hmask)  # fmt: skip
    elif n > 1:
        acc, den, m = mla_merge_rows(PL, PO, n, r0, base, step, offs_h, hmask, offs_d, dmask,
                                     H_Q, D_V, NS, STAGES)  # fmt: skip
        o = mla_merge_out(acc, den, m, SINK, offs_h, hmask, HAS_SINK)
        tl.store(optr, o.to(OUT.dtype.element_ty), mask=omask)
        if dc == 0:
            tl.store(LSE + t64 * H_Q + offs_h, mla_merge_lse(den, m), mask=hmask)


@triton.jit
def _mla_runs_combine_kernel(
    QOFF,
    batch,
    META,  # [tokens, 4] int32: first slot, pieces, index in the tile (written by the decode)
    PO,  # [2 RUN_P * TPT, H_Q, D_V] f32
    PL,  # [2 RUN_P * TPT, H_Q] f32
    SINK,
    OUT,
    stride_ot,
    stride_oh,
    LSE,  # [tokens, H_Q] f32 contiguous
    H_Q: tl.constexpr,
    BH: tl.constexpr,
    D_V: tl.constexpr,
    DB: tl.constexpr,
    NS: tl.constexpr,
    STAGES: tl.constexpr,
    TPT: tl.constexpr,
    RUN_P: tl.constexpr,
    HAS_SINK: tl.constexpr,
    PDL: tl.constexpr = False,
):
    """One (token, block of BH heads, DB output dims): merge the partials of its tile when
    the tile was cut into several pieces (a tile of one piece was written by the decode
    kernel), `mla_merge_rows`; a token of no request (outside [q_row_offsets[0],
    q_row_offsets[batch])) gets output 0 and LSE -inf. META's values are clamped to the partial
    buffers (no access outside them whatever the offsets). The offsets are the launch's inputs,
    read before the PDL wait; META is the decode kernel's, read after it. (Its long chains
    stay in one program: finer programs for them, as the item list's combine has, measured a
    wash here: docs/kernels/triton_mla.md, "The long chains' merge".)"""
    t = tl.program_id(0)
    t64 = t.to(tl.int64)
    covered = (t >= tl.load(QOFF)) & (t < tl.load(QOFF + batch))
    pdl_wait(PDL)
    # a token outside the requests has whatever its META entry holds, unused
    s0 = tl.minimum(tl.maximum(tl.load(META + t64 * 4), 0), 2 * RUN_P - 1)
    n = tl.minimum(tl.maximum(tl.load(META + t64 * 4 + 1), 1), RUN_P)
    i = tl.minimum(tl.maximum(tl.load(META + t64 * 4 + 2), 0), TPT - 1)
    # piece k >= 1 is slot 2 (s0 // 2 + k) (its piece's first tile); n clamped so that the
    # last row is 2 RUN_P - 1 (n <= RUN_P - s0 // 2 for a list the decode wrote)
    mla_merge_token(t, covered, tl.minimum(n, RUN_P - s0 // 2), s0.to(tl.int64) * TPT + i,
                    (2 * (s0 // 2)).to(tl.int64) * TPT + i, 2 * TPT, PL, PO, SINK, OUT,
                    stride_ot, stride_oh, LSE, tl.program_id(2) * DB, H_Q, BH, D_V, DB, NS,
                    STAGES, HAS_SINK)  # fmt: skip


def mla_runs_combine_triton(
    q_row_offsets: torch.Tensor,
    meta: torch.Tensor,
    partial_out: torch.Tensor,
    partial_lse: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    sinks: torch.Tensor | None,
    *,
    tpt: int,
    run_p: int,
    merge: MergeShape | None = None,
) -> None:
    """Merge the cut tiles of a `RUNS` decode launch. meta [tokens, 4] int32 (the decode's);
    partial_out [2 run_p * tpt, h_q, d_v] f32, partial_lse [2 run_p * tpt, h_q] f32 (run_p:
    the launch's partial slots over 2); out [tokens, h_q, d_v] (last dim contiguous), lse
    [tokens, h_q] f32 contiguous; sinks [h_q] f32 or None. No host sync. A program per (token,
    16 heads, merge.db dims), `mla_merge_rows`; merge None: `RUNS_MERGE` at 16 heads or
    fewer, `ITEMS_MERGE` above (the seesaw's 64-head partial rows: the combines' sweep,
    docs/kernels/triton_mla.md, h_q 128 skew b64 / b128 9.1 / 10.8 us at 1 x 256 dims against
    14.2 / 20.4 at 2 x 64)."""
    tokens, h_q, d_v = out.shape
    batch = q_row_offsets.shape[0] - 1
    if tokens == 0 or batch == 0:
        return
    if merge is None:
        merge = RUNS_MERGE if h_q <= 16 else ITEMS_MERGE
    _launch_merge(_mla_runs_combine_kernel, (q_row_offsets, batch, meta), partial_out,
                  partial_lse, out, lse, sinks, merge, TPT=tpt, RUN_P=run_p)  # fmt: skip


def _lengths_on_host(t: torch.Tensor) -> bool:
    """Whether a launch's lengths are host memory (the CPU: Triton's interpreter runs every
    program, so the item list's combine sizes its grid for the long tokens there are); an
    offline capture for sm_90 (`tests/sm90_compile.py`) replaces it with False, as on CUDA."""
    return not t.is_cuda


def _long_chains(
    merge: MergeShape, h_q: int, d_v: int, present: int | None = None
) -> tuple[int, int, int]:
    """(LONG_MAX, FINE, the grid's extra programs along its token axis) of a combine of
    `merge`'s shape: none where its long chains are off or its dims do not split in FINE.
    present: the long tokens there are, where the host knows them (slots for those only)."""
    db = merge.blocks(h_q, d_v)[1]
    long_max = merge.long_max if present is None else min(merge.long_max, present)
    if long_max <= 0 or merge.fine <= 1 or db % merge.fine:
        return 0, 1, 0
    return long_max, merge.fine, long_max * (merge.fine - 1)


@triton.jit(do_not_specialize=["n_tok"])  # (the grid's tokens: no variant of its own)
def _mla_worklist_combine_kernel(
    QOFF,
    K_CL,
    batch,
    n_tok,
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
    DB: tl.constexpr,
    NS: tl.constexpr,
    STAGES: tl.constexpr,
    TPT: tl.constexpr,
    BN: tl.constexpr,
    TARGET: tl.constexpr,
    MIN_BLOCKS: tl.constexpr,
    B_P2: tl.constexpr,
    HAS_SINK: tl.constexpr,
    PDL: tl.constexpr = False,
    LONG_MIN: tl.constexpr = 0,
    LONG_MAX: tl.constexpr = 0,
    FINE: tl.constexpr = 1,
):
    """One (token, block of BH heads, DB output dims): merge the partials of its tile's items
    when the tile has several (a tile of one item was written by the decode kernel),
    `mla_merge_rows`; a token of no request (past q_row_offsets[batch]) gets output 0 and LSE
    -inf. The partials lie in request order whatever the decode's list order
    (`mla_find_item`'s slot), so the list is derived in request order. It comes from the launch's
    inputs, which the decode kernel does not write: it is derived before the PDL wait, while
    the decode runs.

    Long chains (LONG_MAX > 0): a token whose tile has c_b >= LONG_MIN items and which is
    among the first LONG_MAX such tokens (token order) is merged in FINE programs of DB / FINE
    dims each: its own program takes the first, and the grid's programs past n_tok along axis
    0 ((FINE - 1) for each of the LONG_MAX slots) the others; a slot without a long token exits
    before the wait."""
    t = tl.program_id(0)
    r, c, n, end, chunk, o_lo = mla_work_list(QOFF, K_CL, batch, TPT, BN, TARGET, MIN_BLOCKS, B_P2)
    sub = t * 0
    if LONG_MAX > 0:
        # the long tokens, ranked in token order: request b's tokens hold ranks [lend - nl, lend)
        q_len = tl.where(r < batch, tl.load(QOFF + r + 1, mask=r < batch, other=0) - o_lo, 0)
        nl = tl.where((r < batch) & (c >= LONG_MIN), tl.maximum(q_len, 0), 0)
        lend = tl.cumsum(nl, 0)
        if t >= n_tok:  # a slot's sub-block: the long token of rank k, its dims' part `sub`
            k = (t - n_tok) // (FINE - 1)
            sub = (t - n_tok) % (FINE - 1) + 1
            at_l = (lend - nl <= k) & (k < lend)
            if tl.sum(at_l.to(tl.int32), 0) == 0:
                return
            t = tl.sum(tl.where(at_l, o_lo + k - (lend - nl), 0), 0)
    b = tl.sum(tl.where((o_lo <= t) & (r < batch), 1, 0), 0) - 1
    at = r == b
    c_b = tl.maximum(tl.sum(tl.where(at, c, 0), 0), 1)
    n_b = tl.sum(tl.where(at, n, 0), 0)
    i0 = t - tl.sum(tl.where(at, o_lo, 0), 0)
    covered = (b >= 0) & (i0 // TPT < n_b // c_b)  # (else no item has the token)
    first = tl.sum(tl.where(at, end, 0), 0) - n_b + (i0 // TPT) * c_b
    r0 = first.to(tl.int64) * TPT + i0 % TPT
    if LONG_MAX > 0:
        rank = tl.sum(tl.where(at, lend - nl, 0), 0) + i0
        pdl_wait(PDL)  # (the partials: the decode kernel's)
        if covered & (c_b >= LONG_MIN) & (rank < LONG_MAX):
            mla_merge_token(t, covered, c_b, r0, r0, TPT, PL, PO, SINK, OUT, stride_ot,
                            stride_oh, LSE, tl.program_id(2) * DB + sub * (DB // FINE), H_Q,
                            BH, D_V, DB // FINE, NS, STAGES, HAS_SINK)  # fmt: skip
        else:
            mla_merge_token(t, covered, c_b, r0, r0, TPT, PL, PO, SINK, OUT, stride_ot,
                            stride_oh, LSE, tl.program_id(2) * DB, H_Q, BH, D_V, DB, NS, STAGES,
                            HAS_SINK)  # fmt: skip
    else:
        pdl_wait(PDL)  # (the partials: the decode kernel's)
        mla_merge_token(t, covered, c_b, r0, r0, TPT, PL, PO, SINK, OUT, stride_ot, stride_oh,
                        LSE, tl.program_id(2) * DB, H_Q, BH, D_V, DB, NS, STAGES,
                        HAS_SINK)  # fmt: skip


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
    merge: MergeShape = ITEMS_MERGE,
) -> None:
    """Merge the split tiles of a balanced MLA decode launch (same list arguments as the
    launch, whatever its list's order); a program per (token, 16 heads, merge.db dims),
    `mla_merge_rows`. partial_out [items * TPT, h_q, d_v] f32, partial_lse [items * TPT, h_q]
    f32; out [tokens, h_q, d_v] (last dim contiguous), lse [tokens, h_q] f32 contiguous; sinks
    [h_q] f32 or None. No host sync."""
    tokens, h_q, d_v = out.shape
    batch = q_row_offsets.shape[0] - 1
    if tokens == 0 or batch == 0:
        return
    long_min, present = max(merge.long_min, 2), None
    if _lengths_on_host(out) and _long_chains(merge, h_q, d_v)[0]:  # their long tokens
        present = mla_host_long_tokens(q_row_offsets, cache_lens, tpt=tpt, bn=bn, target=target,
                                       min_blocks=min_blocks, long_min=long_min)  # fmt: skip
    long_max, fine, extra = _long_chains(merge, h_q, d_v, present)
    _launch_merge(_mla_worklist_combine_kernel, (q_row_offsets, cache_lens, batch, tokens),
                  partial_out, partial_lse, out, lse, sinks, merge, extra=extra, TPT=tpt,
                  BN=bn, TARGET=target,
                  MIN_BLOCKS=min_blocks, B_P2=triton.next_power_of_2(batch + 1),
                  LONG_MIN=long_min, LONG_MAX=long_max, FINE=fine)  # fmt: skip


def _launch_merge(kernel, lead: tuple, partial_out, partial_lse, out, lse, sinks,
                  merge: MergeShape, extra: int = 0, **constexprs) -> None:  # fmt: skip
    """Launch a combine (`mla_merge_token`'s grid: tokens (+ `extra`) x head blocks x dim
    blocks of `merge`): its own leading arguments `lead` and constexprs, then the partials,
    sinks, output and LSE that both take."""
    tokens, h_q, d_v = out.shape
    bh, db = merge.blocks(h_q, d_v)
    launch(
        kernel,
        (tokens + extra, triton.cdiv(h_q, bh), triton.cdiv(d_v, db)),
        *lead,
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
        DB=db,
        NS=merge.ns,
        STAGES=merge.stages,
        HAS_SINK=sinks is not None,
        PDL=(pdl := pdl_enabled(out)),
        num_warps=merge.num_warps,
        **constexprs,
        **pdl_launch_kwargs(pdl),
    )


__all__ = [
    "mla_host_item_count",
    "mla_host_long_tokens",
    "mla_host_run_programs",
    "mla_host_runs",
    "mla_runs_combine_triton",
    "mla_worklist_combine_triton",
]
