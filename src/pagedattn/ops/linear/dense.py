"""`linear`: a model's dense projection, y = a(x) @ weight.T (+ bias), for a step's rows.

- x [M, K] (act None) or [M, 2K] (act "silu_mul": the operand is silu(x[:, :K]) * x[:, K:],
  a fused gate|up projection's output, SwiGLU); float16 / bfloat16 / float32, rows with unit
  column stride for the fast path (any strides for the reference).
- weight [N, K], x's dtype; bias [N] x's dtype or None.
- Returns y [M, N] in x's dtype.

Backends (`ops.dispatch`):
- "reference": torch, as the models ran before this op: `F.linear(x, weight, bias)`, with
  "silu_mul" after `ops.fused.silu_mul` (its fused kernel on CUDA, transformers' torch ops on a
  CPU, so a CPU model still equals transformers bit for bit).
- "triton": `triton_streamk.streamk_linear_triton` (every SM the same weight bytes, split tiles
  merged in the launch) where it pays: CUDA (or Triton's interpreter), x and weight float16 or
  bfloat16, M <= `StreamKConfig.max_rows`, K a multiple of 8 (16-byte rows), weight
  contiguous; else the reference's torch path (cuBLAS). The tuning and the measured rule are
  `StreamKConfig` (docs/kernels/streamk_linear.md).

Both accumulate in float32 and round once; they differ by the order of the sums (within a
rounding of the output dtype, plus the float32 accumulation error of K products).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ...errors import Lazy, check
from .._checks import Described, typed_binding
from ..dispatch import choose_backend

FLOATS = (torch.float16, torch.bfloat16, torch.float32)
ACTS = (None, "silu_mul")


@dataclass(frozen=True)
class StreamKConfig:
    """The stream-K linear's launch (`triton_streamk`): block_n output columns and block_k
    inputs a unit, stages (the k loop's pipeline depth), num_warps (doubled at 128 rows),
    ctas_per_sm programs a SM; max_rows: the most rows it takes (more go to cuBLAS)."""

    block_n: int = 64
    block_k: int = 128
    stages: int = 4
    num_warps: int = 4
    ctas_per_sm: int = 1
    max_rows: int = 64


DEFAULT_STREAMK = StreamKConfig()


def _check(x, weight, bias, act) -> int:
    check(act in ACTS, "act", f"one of {ACTS}", repr(act))
    check(
        isinstance(x, torch.Tensor) and x.ndim == 2 and x.dtype in FLOATS,
        "x", "a 2-D float16 / bfloat16 / float32 tensor", Described(x),
    )  # fmt: skip
    K = x.shape[1] // 2 if act == "silu_mul" else x.shape[1]
    if act == "silu_mul":
        check(x.shape[1] % 2 == 0, "x", "[M, 2K] (gate | up) for act 'silu_mul'", Described(x))
    check(
        isinstance(weight, torch.Tensor) and weight.ndim == 2 and weight.shape[1] == K
        and weight.dtype == x.dtype and weight.device == x.device,
        "weight", Lazy(lambda: f"a [N, {K}] {x.dtype} tensor on {x.device}"), Described(weight),
    )  # fmt: skip
    N = weight.shape[0]
    if bias is not None:
        check(
            isinstance(bias, torch.Tensor) and bias.shape == (N,) and bias.dtype == x.dtype
            and bias.device == x.device,
            "bias", Lazy(lambda: f"None or a [{N}] {x.dtype} tensor on {x.device}"),
            Described(bias),
        )  # fmt: skip
    return K


def streamk_applies(x: torch.Tensor, weight: torch.Tensor, cfg: StreamKConfig) -> bool:
    """Whether the stream-K kernel takes this call (module docstring)."""
    return (
        x.dtype in (torch.float16, torch.bfloat16)
        and 0 < x.shape[0] <= cfg.max_rows
        and weight.shape[1] % 8 == 0
        and x.stride(1) == 1
        and x.stride(0) % 8 == 0
        and weight.is_contiguous()
    )


def linear_reference(x, weight, bias=None, *, act=None):
    """torch: `F.linear(x, weight, bias)`, with act "silu_mul" after `ops.fused.silu_mul`."""
    if act == "silu_mul":
        from ..fused import silu_mul  # noqa: PLC0415

        x = silu_mul(x)
    return F.linear(x, weight, bias)


@typed_binding
def linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    act: str | None = None,
    config: StreamKConfig = DEFAULT_STREAMK,
    backend: str | None = None,
) -> torch.Tensor:
    """y = a(x) @ weight.T (+ bias) (module docstring). Raises InvalidArgumentError naming the
    argument."""
    _check(x, weight, bias, act)
    check(isinstance(config, StreamKConfig), "config", "a StreamKConfig", type(config).__name__)
    if choose_backend(x.device, backend) == "triton" and streamk_applies(x, weight, config):
        from ...cache.dispatch import num_sms  # noqa: PLC0415
        from .triton_streamk import streamk_linear_triton  # noqa: PLC0415

        return streamk_linear_triton(x, weight, bias, act == "silu_mul", config,
                                     num_sms(x.device))  # fmt: skip
    return linear_reference(x, weight, bias, act=act)


__all__ = ["DEFAULT_STREAMK", "StreamKConfig", "linear", "linear_reference", "streamk_applies"]
