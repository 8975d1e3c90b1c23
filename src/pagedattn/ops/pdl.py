"""Programmatic dependent launch (PDL, sm_90+) between a split-K kernel and its combine.

The combine kernel is launched with `launch_pdl=True` and waits (`griddepcontrol.wait`) for
the partials before reading them; the split kernel signals (`griddepcontrol.launch_dependents`)
once all of its programs have started, so the combine's launch is prepared under the split
kernel instead of after it. Both instructions are no-ops without PDL.

Opt-in (`PAGEDATTN_PDL=1`): H100 2026-11-22 (bench/gpu_pdl_dev.py, same process, PDL off / on,
us): MHA b16 ctx16384 at P=4 374.8 / 373.8, MLA h_q 16 bf16 and rope-aware FP8 the same within
0.4; outputs equal bit for bit. The gain is within noise, and the FP8 split runs of the full
suite (bench/run_all.py) that used it had slow rounds (MHA FP8 b16 0.25-0.36 ms against 0.21,
MLA rope-aware s_k 4096 0.18-0.37 ms against 0.15). The MLA ones recurred with it off (0.24
ms), the MHA FP8 ones did not (0.21 ms); with the gain within noise, it stays off by default.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from ..cache.dispatch import cuda_capability
from .gluon_imports import HAS_GLUON, gl, gluon


def pdl_enabled(t: torch.Tensor) -> bool:
    """Whether launches on `t`'s device use PDL: asked for with PAGEDATTN_PDL=1, CUDA sm_90 or
    newer, compiled kernels (not Triton's interpreter)."""
    if not t.is_cuda or os.environ.get("TRITON_INTERPRET") == "1":
        return False
    if os.environ.get("PAGEDATTN_PDL", "0") != "1":
        return False
    return (cuda_capability(t.device) or (0, 0))[0] >= 9


def pdl_launch_kwargs(enabled: bool) -> dict:
    """Launch options of a dependent (combine) kernel."""
    return {"launch_pdl": True} if enabled else {}


@triton.jit
def pdl_signal(PDL: tl.constexpr):
    """In the split kernel: let the dependent launch start (no-op unless PDL)."""
    if PDL:
        gdc_launch_dependents()


@triton.jit
def pdl_wait(PDL: tl.constexpr):
    """In the dependent kernel, before reading the split kernel's output (no-op unless PDL)."""
    if PDL:
        gdc_wait()


if HAS_GLUON:

    @gluon.jit
    def g_pdl_signal(PDL: gl.constexpr):
        """`pdl_signal` for Gluon kernels."""
        if PDL:
            gl.inline_asm_elementwise(
                "griddepcontrol.launch_dependents; // dummy $0",
                "=r",
                [],
                dtype=gl.int32,
                is_pure=False,
                pack=1,
            )
