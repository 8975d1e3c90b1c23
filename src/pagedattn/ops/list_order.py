"""The work lists' order by item size (`bucket_ends`), shared by the MHA/GQA decode's own list
(`ops.mha.triton_worklist.work_list`, ORDER 1) and the MLA list (`ops.mla.worklist.
mla_work_list`, ORDER 1; the Gluon kernels' `g_list_item` mirrors it).

A one-item-a-program grid is dispatched in program order, so where its list is longer than a
wave, numbering the largest items first turns the hardware's dispatch into list scheduling,
longest first. An exact order ranks every request against every other in every program; this
one sorts them into LIST_BUCKETS buckets of their chunk (a list-scheduling model of the
real-workload suite's skewed steps put 8 buckets within 0-5% of the exact order:
docs/kernels/mha_decode.md, "Longest items first").

Every program derives the order, so its cost is paid by every program of the grid. The per-
bucket prefix sums are packed: 4 buckets a 64-bit word, 16 bits a bucket, so two scans and two
sums give all eight (one scan and one sum a bucket, the first form, cost the MLA combine 7 us
on a uniform h_q 128 step and the GQA list 7% on one long request among 255: H200,
docs/kernels/mha_decode.md, "Longest items first"). A bucket's count must stay below 2^16
items: the lists hold at most TARGET + rows items (a few thousand)."""

import triton
import triton.language as tl

LIST_BUCKETS = tl.constexpr(8)
FIELD = tl.constexpr(16)  # bits a bucket's count in a packed word
FIELD_MASK = tl.constexpr(0xFFFF)
# x * ONES sums a word's four 16-bit fields into its top field (no field sum overflows 16 bits)
ONES = tl.constexpr(0x0001000100010001)


@triton.jit
def field_sum(x):
    """The sum of the four 16-bit fields of packed int64 words x (each sum < 2^16)."""
    return ((x * ONES) >> 48) & FIELD_MASK


@triton.jit
def bucket_ends(n, chunk, cb):
    """One past the last item of each request [BLOCK] when requests come by bucket of their
    chunk (n: items a request, 0 past the batch; chunk: an item's blocks, at most cb but for a
    ragged batch's whole rows): bucket min(LIST_BUCKETS chunk // (cb + 1), LIST_BUCKETS - 1),
    the largest first, request order within one, a request's items consecutive."""
    key = tl.minimum((LIST_BUCKETS * chunk) // (cb + 1), LIST_BUCKETS - 1)
    hi = key >= 4  # buckets 4-7 in word `up`, 0-3 in word `down`
    shift = ((key % 4) * FIELD).to(tl.int64)
    v = n.to(tl.int64) << shift
    up = tl.where(hi, v, 0)
    down = tl.where(hi, 0, v)
    own = (tl.where(hi, tl.cumsum(up, 0), tl.cumsum(down, 0)) >> shift) & FIELD_MASK
    t_up = tl.sum(up, 0)
    t_down = tl.sum(down, 0)
    # the items of larger buckets: the fields above the request's in its word, and for the
    # lower word all of the upper word's (two shifts: a shift by 64 is undefined)
    above = field_sum((tl.where(hi, t_up, t_down) >> shift) >> FIELD)
    above += tl.where(hi, 0, field_sum(t_up))
    return (above + own).to(n.dtype)


__all__ = ["LIST_BUCKETS", "bucket_ends"]
