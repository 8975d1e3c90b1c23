"""Constants shared by the MLA decode kernels (tl and Gluon)."""

from __future__ import annotations

import triton.language as tl

LOG2E = tl.constexpr(1.4426950408889634)
LN2 = tl.constexpr(0.6931471805599453)
