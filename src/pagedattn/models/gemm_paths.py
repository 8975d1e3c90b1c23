"""The kernels a bias-free `layers.Linear` product can run (`PATHS`), and whether each serves
a product (`candidate_paths`); which one each (shape, row count) takes is measured at start-up
(`models.gemm_routes`)."""

from __future__ import annotations

import torch

PATHS = ("linear", "lt", "small_m")


def candidate_paths(w: torch.Tensor, rows: int) -> tuple[str, ...]:
    """The paths a product of `rows` rows by `w` may take: both cuBLAS ones, and "small_m"
    where its kernel serves (rows <= 64, a last-dim stride of 1, PDL enabled on the device)."""
    from ..ops.linear.triton_small_m import MAX_M
    from ..ops.pdl import pdl_enabled

    small = rows <= MAX_M and w.stride(1) == 1 and pdl_enabled(w)
    return PATHS if small else PATHS[:2]


def run_path(path: str, x: torch.Tensor, w: torch.Tensor, zero_bias: torch.Tensor | None):
    """x @ w.T through `path` (zero_bias: the "lt" path's [N] zeros)."""
    if path == "lt":
        return torch.addmm(zero_bias, x, w.t())
    if path == "small_m":
        from ..ops.linear.triton_small_m import linear_small_m_triton

        return linear_small_m_triton(x, w)
    return torch.nn.functional.linear(x, w)


__all__ = ["PATHS", "candidate_paths", "run_path"]
