"""Step-varying kernel arguments that the step's kernels do not specialize on.

Triton and Gluon compile a new binary whenever an int argument changes class (1, a multiple of
16, anything else) or a pointer changes its 16-byte alignment. A serving step changes those
from one step to the next: its request count, the lookup table's width (the longest running
request's pages) and, in a mixed step, where the prefill part's views of the cache lengths and
the lookup table start. Each new class is a compile in the middle of a serving stream (seconds
for a Gluon kernel; docs/kernels/jit_specializations.md). These values only bound a loop, mask
lanes or scale the row index of single-element loads, so one binary serves them all:

- `STEP_INTS`: the request count and the lookup tables' row strides;
- `INDEX_VIEWS`: the index tensors read one element at a time (page ids, row offsets, cache
  lengths, the query rows' offsets: a mixed step's prefill part reads q_row_offsets[D:]),
  which may be views at any element offset.
"""

STEP_INTS = ("batch", "stride_klut", "stride_vlut")
STORE_INTS = ("batch", "stride_lut", "stride_lut2")
INDEX_VIEWS = ("K_lut", "V_lut", "K_off", "V_off", "cache_lens", "q_offsets")


def request_block(batch: int) -> int:
    """BLOCK_B of a launch over `batch` requests (the width of the [BLOCK_B] vector a program
    finds its request in): the next power of two above batch, 16 to 1024. A compile-time
    constant, so each class is one binary."""
    return max(16, min(1024, 1 << batch.bit_length()))


def int_class_counts(limit: int) -> tuple[int, ...]:
    """One count in 1..limit for each pair (Triton's class of the int: 1, a multiple of 16 or
    other; next_pow2(n + 1), the width of a [n + 1]-vector's block), ascending: 1; the largest
    of each [2^(k-1), 2^k - 1] (never a multiple of 16); from 16 on, the smallest (a multiple of
    16). Launches at these counts compile every binary that a kernel specializing on a count
    (as an int and through such a vector) can select below `limit` (MLA decode: q_args' batch
    and its B_P2)."""
    counts = {1}
    k = 2
    while (1 << (k - 1)) <= limit:
        counts.add(min((1 << k) - 1, limit))
        if (1 << (k - 1)) >= 16:
            counts.add(1 << (k - 1))
        k += 1
    return tuple(sorted(c for c in counts if c <= limit))
