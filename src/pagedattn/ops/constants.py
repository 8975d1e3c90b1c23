"""Numeric constants of the attention math, defined once (host floats; the kernels' compile-time
copies are in `triton_constants`)."""

import math

LOG2E_F = 1.0 / math.log(2.0)  # 1.4426950408889634: exp(x) == exp2(x * LOG2E)
LN2_F = math.log(2.0)  # 0.6931471805599453: log(x) == log2(x) * LN2
