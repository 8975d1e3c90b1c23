"""`unpack_step_rows`'s kernel: one program a row of the step's bucket."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _unpack_step_rows_kernel(
    S,
    CL,
    LUT,
    stride_lut,
    IDS,
    POS,
    TOKENS,
    META,
    PADCL,
    PADROW,
    sentinel,
    M: tl.constexpr,
    C: tl.constexpr,
    K: tl.constexpr,
    HEADER: tl.constexpr,
    KEEP: tl.constexpr,
    BLOCK_C: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    r = tl.program_id(0)
    n = tl.load(S)
    if n >= 0:
        w = tl.load(S + 1)
        real = r < n
        at = S + HEADER + r
        cl = tl.load(at, mask=real, other=0)
        cl = tl.where(real, cl, tl.load(PADCL).to(tl.int64))
        tl.store(CL + r, cl.to(tl.int32))
        tok = tl.load(at + M, mask=real, other=0)
        # a negative id: KEEP leaves the row's id (the engine's feed wrote it), any other
        # -1 - j takes TOKENS[j] (the previous step's sample j)
        src = tl.where((tok < 0) & (tok != KEEP), -1 - tok, 0)
        fed = tl.load(TOKENS + src, mask=(tok < 0) & (tok != KEEP), other=0)
        tl.store(IDS + r, tl.where(tok < 0, fed, tok), mask=tok != KEEP)
        tl.store(POS + r, tl.load(at + 2 * M, mask=real, other=0))
        lut = S + (HEADER + 3 * M + K + 2 * M) + r.to(tl.int64) * w
        dst = LUT + r.to(tl.int64) * stride_lut
        for c0 in tl.range(0, C, BLOCK_C):
            cols = c0 + tl.arange(0, BLOCK_C)
            inside = cols < C
            staged = tl.load(lut + cols, mask=real & (cols < w), other=sentinel)
            pad = tl.load(PADROW + cols, mask=inside & (r >= n), other=0)
            tl.store(dst + cols, tl.where(real, staged, pad).to(tl.int32), mask=inside)
        if K > 0:
            if r == 0:
                ks = tl.arange(0, BLOCK_K)
                words = tl.load(S + HEADER + 3 * M + ks, mask=ks < K, other=0)
                tl.store(META + ks, words, mask=ks < K)
