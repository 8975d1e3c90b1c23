"""Programmatic dependent launch (PDL, sm_90+) between a split-K kernel and its combine.

The combine kernel is launched with `launch_pdl=True` and waits (`griddepcontrol.wait`) for
the partials before reading them; the split kernel signals (`griddepcontrol.launch_dependents`)
once all of its programs have started, so the combine's launch is prepared under the split
kernel instead of after it. Both instructions are no-ops without PDL.

Used when `pdl_enabled`: asked for with `PAGEDATTN_PDL=1` (read through `pagedattn.env`;
docs/env.md), on a CUDA device of sm_90 or newer, with compiled kernels. Off by default: the
gain measured within noise (H100, docs/kernels/pdl.md).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from .. import env
from ..cache.dispatch import cuda_capability
from .gluon_imports import HAS_GLUON, gl, gluon


def pdl_enabled(t: torch.Tensor) -> bool:
    """Whether launches on `t`'s device use PDL: asked for with PAGEDATTN_PDL=1, CUDA sm_90 or
    newer, compiled kernels (not Triton's interpreter)."""
    if not t.is_cuda or env.triton_interpreter():
        return False
    if not env.flag("PDL"):
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
