"""The kernels' compile-time copies of `ops.constants` (Triton `constexpr`s)."""

import triton.language as tl

from .constants import LN2_F, LOG2E_F

LOG2E = tl.constexpr(LOG2E_F)
LN2 = tl.constexpr(LN2_F)
