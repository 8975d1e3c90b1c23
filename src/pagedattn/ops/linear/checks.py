"""Argument checks of the blockwise-FP8 batched matmul, shared by the public `fp8_bmm`, the
Triton `fp8_bmm_triton` (which callers may use directly) and the MLA branch's weight checks.

Metadata only (no tensor values read, no host sync), except the values of weight scales that
live on the CPU (`check_weight_scale_values`): those are read, so both backends reject a
negative, zero, NaN or infinite scale of a host tensor alike. Scales on a GPU are trusted:
reading them would synchronise the host with the device, so a NaN scale there propagates into
the block's products (a negative one flips their sign), as in the reference. Failures raise
`InvalidArgumentError` naming the argument.
"""

from __future__ import annotations

import torch

from ...errors import Lazy, check
from .._checks import check_granularities
from .._checks import describe as _describe

X_DTYPES = (torch.bfloat16, torch.float16, torch.float32)  # activations and outputs
W_SCALE_DTYPES = (torch.float32, torch.float8_e8m0fnu)  # weight block scales
E8M0_NAN_BYTE = 0xFF  # the one e8m0 encoding that is not a (positive, finite) power of two


def _first_bad_scale(w_scale: torch.Tensor) -> str:
    if w_scale.dtype == torch.float8_e8m0fnu:
        return "a NaN (0xFF) e8m0 scale"
    bad = ~(torch.isfinite(w_scale) & (w_scale > 0))
    i = tuple(torch.nonzero(bad)[0].tolist())
    return f"{float(w_scale[i])} at index {i}"


def check_weight_scale_values(w_scale: torch.Tensor, name: str) -> None:
    """Weight block scales held on the CPU must be finite and > 0 (e8m0: any byte but the
    NaN 0xFF). Scales on another device are not read (no host sync): they are trusted."""
    if w_scale.device.type != "cpu" or torch.compiler.is_compiling():
        return
    if w_scale.dtype == torch.float8_e8m0fnu:
        ok = not bool((w_scale.view(torch.uint8) == E8M0_NAN_BYTE).any())
    else:
        ok = bool((torch.isfinite(w_scale) & (w_scale > 0)).all())
    check(ok, name, "finite block scales > 0", Lazy(lambda: _first_bad_scale(w_scale)))


def check_fp8_bmm_args(
    x: torch.Tensor,
    w: torch.Tensor,
    w_scale: torch.Tensor,
    k_gran: int,
    n_gran: int,
    out_dtype: torch.dtype,
    names: tuple[str, str, str] = ("x", "w", "w_scale"),
) -> None:
    """Shape/dtype/device checks of `fp8_bmm(x, w, w_scale, k_gran=, n_gran=, out_dtype=)`,
    and the values of `w_scale` when it is on the CPU (`check_weight_scale_values`).
    `names` lets a caller report its own argument names."""
    xn, wn, sn = names
    check_granularities(k_gran, n_gran)
    check(
        isinstance(x, torch.Tensor) and x.ndim == 3 and x.dtype in X_DTYPES,
        xn,
        Lazy(lambda: f"a [batch, m, k] tensor with dtype in {X_DTYPES}"),
        Lazy(lambda: _describe(x)),
    )
    check(
        isinstance(w, torch.Tensor) and w.ndim == 3 and w.dtype == torch.float8_e4m3fn,
        wn,
        "a [batch, n, k] torch.float8_e4m3fn tensor",
        Lazy(lambda: _describe(w)),
    )
    batch, _, k = x.shape
    check(
        w.shape[0] == batch and w.shape[2] == k,
        wn,
        Lazy(lambda: f"shape [batch={batch}, n, k={k}] matching {xn}"),
        Lazy(lambda: tuple(w.shape)),
    )
    n = w.shape[1]
    want = (batch, -(-n // n_gran), -(-k // k_gran))
    check(
        isinstance(w_scale, torch.Tensor)
        and w_scale.shape == want
        and w_scale.dtype in W_SCALE_DTYPES,
        sn,
        Lazy(
            lambda: (
                f"a tensor of shape {want} (batch, ceil(n/n_gran), ceil(k/k_gran)) with "
                f"dtype in {W_SCALE_DTYPES}"
            )
        ),
        Lazy(lambda: _describe(w_scale)),
    )
    check(
        w.device == x.device and w_scale.device == x.device,
        Lazy(lambda: f"{wn}/{sn}"),
        Lazy(lambda: f"tensors on {xn}.device={x.device}"),
        Lazy(lambda: f"{w.device}, {w_scale.device}"),
    )
    check(
        isinstance(out_dtype, torch.dtype) and out_dtype in X_DTYPES,
        "out_dtype",
        Lazy(lambda: f"one of {X_DTYPES}"),
        Lazy(lambda: repr(out_dtype)),
    )
    check_weight_scale_values(w_scale, sn)


__all__ = ["W_SCALE_DTYPES", "X_DTYPES", "check_fp8_bmm_args", "check_weight_scale_values"]
