"""Programmatic dependent launch (PDL, sm_90+): between a split-K kernel and its combine, and
along a decode step's chain of layer kernels (`pdl_chain_kwargs`).

The combine kernel is launched with `launch_pdl=True` and waits (`griddepcontrol.wait`) for
the partials before reading them; the split kernel signals (`griddepcontrol.launch_dependents`)
once all of its programs have started, so the combine's launch is prepared under the split
kernel instead of after it. Both instructions are no-ops without PDL.

The chain: the layer ops a decode step runs between its GEMMs (`ops.fused`' rms_norm,
rope_qkv, silu_mul, argmax_rows; `ops.store_kv`'s store_kv and rope_store_kv; the MHA/GQA
decode) are launched with `launch_pdl=True` and wait first, so each one's launch and CTA start
overlap the tail of the kernel before it (a cuBLAS GEMM, or another link). H200, the engine's
captured decode step (`dev/pdl_chain_probe.py`, docs/kernels/pdl.md): Llama-3.2-1B b64 1.523
-> 1.461 ms a replay, the same tokens; Llama-3-8B b64 6.083 -> 6.093 ms (its kernels are long
enough that a launch's latency is a small part of them).

Used when `pdl_enabled`: CUDA devices of sm_90 or newer, compiled kernels, unless
`PAGEDATTN_PDL=0` (read through `pagedattn.env`; docs/env.md). Results are the same bit for bit
with and without it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from .. import env
from ..cache.dispatch import cuda_capability
from .gluon_imports import HAS_GLUON, gl, gluon

# Set inside `pdl_as_on_sm90` (the offline captures): PDL as on an sm_90 device, any tensor.
_AS_SM90: ContextVar[bool] = ContextVar("pagedattn_pdl_as_sm90", default=False)


@contextmanager
def pdl_as_on_sm90() -> Iterator[None]:
    """Inside: `pdl_enabled` answers as on an sm_90 device for any tensor, CPU ones included
    (True unless PAGEDATTN_PDL=0), so that launches captured on a CPU (`ops.offline.capture`)
    carry the PDL constexprs and `launch_pdl` that an H100 / H200 launch gets: the
    specializations a GPU compiles (tests/sm90_compile.py)."""
    token = _AS_SM90.set(True)
    try:
        yield
    finally:
        _AS_SM90.reset(token)


def pdl_enabled(t: torch.Tensor) -> bool:
    """Whether launches on `t`'s device use PDL: CUDA sm_90 or newer, compiled kernels (not
    Triton's interpreter), unless PAGEDATTN_PDL=0; inside `pdl_as_on_sm90`, any device."""
    if _AS_SM90.get():
        return env.read("PDL") != "0"
    if not t.is_cuda or env.triton_interpreter():
        return False
    if env.read("PDL") == "0":
        return False
    return (cuda_capability(t.device) or (0, 0))[0] >= 9


def pdl_launch_kwargs(enabled: bool) -> dict:
    """Launch options of a dependent (combine) kernel."""
    return {"launch_pdl": True} if enabled else {}


def pdl_chain_kwargs(t: torch.Tensor, flag: str = "PDL") -> dict:
    """A layer kernel's PDL arguments where `pdl_enabled(t)` ({} otherwise, the plain launch):
    the constexpr `flag` (the kernel's first statement is `pdl_wait(flag)`) and `launch_pdl`. Such a
    kernel is launched while its predecessor on the stream still runs (its CTAs wait at the
    `griddepcontrol.wait`, which returns once every earlier grid has completed and its memory is
    visible), so its launch and CTA start overlap the predecessor's tail instead of following
    it; it reads and writes nothing before the wait."""
    return {flag: True, "launch_pdl": True} if pdl_enabled(t) else {}


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
