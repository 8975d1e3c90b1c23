"""L2 prefetch of the next GEMM's weight from the small layer kernel before it.

A decode step's small cuBLAS GEMMs each pay a fixed ~4-5 us a launch, part of it the first
DRAM round trips of their weight: with the weight already in L2 the Llama-3.2-1B shapes at 64
rows took qkv 7.0 -> 5.4, o 6.3 -> 5.4, down 14.5 -> 11.2 us a call (H200,
docs/kernels/streamk_linear.md). Every such GEMM of a decoder layer follows one of the
project's own short kernels (the RMSNorms before qkv_proj and gate_up_proj, silu * up before
down_proj, the final norm before lm_head), which are latency-bound and leave the memory
system idle. So those kernels take an optional `prefetch` tensor: each program asks the L2
to fetch its share of that tensor's bytes (`prefetch.global.L2`, one 128-byte line an
element, at most `MAX_BYTES_A_PROGRAM` a program) before its PDL wait, i.e. during the
previous GEMM's tail, since the weights are never written by a step. A prefetch is a hint: it
returns nothing and changes no result, and a line the GEMM reads before it arrives is read
as usual.

Used where `l2_prefetch_enabled`: compiled kernels on CUDA (not Triton's interpreter).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .. import env

LINE = 128  # bytes an element prefetches (an L2 line)
LINES = 2048  # lines a program prefetches at most: 256 KB
MAX_BYTES_A_PROGRAM = LINE * LINES


def l2_prefetch_enabled(t: torch.Tensor) -> bool:
    """Whether kernels on `t`'s device issue prefetches: CUDA, compiled (not the interpreter)."""
    return t.is_cuda and not env.triton_interpreter()


def prefetch_args(prefetch: torch.Tensor | None, like: torch.Tensor, programs: int) -> tuple:
    """(pointer tensor, bytes, PF constexpr) of a launch of `programs` programs on `like`'s
    device: the bytes of `prefetch` (a contiguous tensor), at most MAX_BYTES_A_PROGRAM a
    program; (like, 0, False) where nothing is prefetched."""
    if prefetch is None or not l2_prefetch_enabled(like) or programs < 1:
        return like, 0, False
    n = min(prefetch.numel() * prefetch.element_size(), programs * MAX_BYTES_A_PROGRAM)
    return prefetch, n, n > 0


@triton.jit
def l2_prefetch(P, nbytes, part, parts, PF: tl.constexpr):
    """Program `part` of `parts` asks the L2 for its slice of the nbytes at P (whole 128-byte
    lines from P, at most LINES of them; no-op unless PF). Issue before the PDL wait: P must be
    memory that no kernel of the step writes (a weight)."""
    if PF:
        per = tl.cdiv(tl.cdiv(nbytes, parts), 128) * 128
        lo = part.to(tl.int64) * per
        off = lo + tl.arange(0, 2048).to(tl.int64) * 128
        live = (off < tl.minimum(lo + per, nbytes)).to(tl.int32)
        tl.inline_asm_elementwise(
            "{ .reg .pred p; setp.ne.s32 p, $2, 0; @p prefetch.global.L2 [$1]; mov.u32 $0, 0; }",
            "=r,l,r",
            [P.to(tl.pointer_type(tl.int8)) + off, live],
            dtype=tl.int32,
            is_pure=False,
            pack=1,
        )


assert LINES == 2048 and LINE == 128  # (l2_prefetch's literals)

__all__ = ["MAX_BYTES_A_PROGRAM", "l2_prefetch", "l2_prefetch_enabled", "prefetch_args"]
