"""The work lists' order by item size (`bucket_ends`), shared by the MHA/GQA decode's own list
(`ops.mha.triton_worklist.work_list`, ORDER 1) and the MLA list (`ops.mla.worklist.
mla_work_list`, ORDER 1; the Gluon kernels' `g_list_item` mirrors it).

A one-item-a-program grid is dispatched in program order, so where its list is longer than a
wave, numbering the largest items first turns the hardware's dispatch into list scheduling,
longest first. An exact order ranks every request against every other in every program; this
one sorts them into LIST_BUCKETS buckets of their chunk with one prefix sum a bucket over the
vector every program already holds (a list-scheduling model of the real-workload suite's skewed
steps put 8 buckets within 0-5% of the exact order: docs/kernels/mha_decode.md, "Longest items
first")."""

import triton
import triton.language as tl

LIST_BUCKETS = tl.constexpr(8)


@triton.jit
def bucket_ends(n, chunk, cb):
    """One past the last item of each request [BLOCK] when requests come by bucket of their
    chunk (n: items a request, 0 past the batch; chunk: an item's blocks, at most cb but for a
    ragged batch's whole rows): bucket min(LIST_BUCKETS chunk // (cb + 1), LIST_BUCKETS - 1),
    the largest first, request order within one, a request's items consecutive."""
    key = tl.minimum((LIST_BUCKETS * chunk) // (cb + 1), LIST_BUCKETS - 1)
    end = tl.zeros_like(n)
    base = 0
    for i in tl.static_range(LIST_BUCKETS):
        at = key == LIST_BUCKETS - 1 - i
        n_k = tl.where(at, n, 0)
        end = tl.where(at, base + tl.cumsum(n_k, 0), end)
        base += tl.sum(n_k, 0)
    return end


__all__ = ["LIST_BUCKETS", "bucket_ends"]
