"""MLA decode in Triton: dense or sparse, BF16 or FP8 caches, extra cache, sinks, split-K.

`mla_decode_triton` has the contract of `pagedattn.ops.mla.mla_decode` (docs/ops.md), which
calls it on CUDA; it checks and packs its arguments (`triton_mla_args.decode_args`), asks
`triton_mla_plan.plan_decode` which kernel serves and how (a frozen `LaunchPlan`), launches it
and, where the keys were split, merges the partials (`triton_mla_combine`). Kernels:
  - Gluon, sm_90 only (`sm90/`), for paged BF16, rope-aware FP8 and V32 caches with d_qk 576
    and no extra cache: the seesaws `gluon_mla_ss` / `gluon_mla_st` / `gluon_mla_ps`, the
    keys-as-M `gluon_mla._mla_decode_sm90_t` / `gluon_mla_tw`, the 64-row `gluon_mla`;
  - the portable `triton_mla_kernel._mla_decode_kernel` everywhere else, Triton's CPU
    interpreter included (how CI runs it).
`triton_mla_plan`'s docstring says which serves when; docs/kernels/triton_mla.md has the
measurements behind each choice.

Launch choices come from `config` (`tuning.MLATuning`, frozen), by default the shipped ones
with `PAGEDATTN_MLA_TUNING`'s overrides (`tuning.from_env`). No host synchronisation: sizes
depend only on shapes. An offline capture (`ops.offline.capture(triton_mla, ...)`) replaces this
module's `launch`, `mla_combine_triton`, `_use_sm90_path` and `fast_hbm` to record the launches
an H100 or H200 would make, on any machine.
"""

from __future__ import annotations

import torch

from ...cache.dispatch import cuda_capability, fast_hbm
from ..gluon_imports import HAS_GLUON
from ..launch import launch
from . import tuning
from .triton_mla_args import OperandArgs, decode_args
from .triton_mla_combine import mla_combine_triton
from .triton_mla_plan import plan_decode, sm90_serves
from .tuning import MLATuning
from .worklist import mla_host_item_count, mla_worklist_combine_triton

__all__ = ["MLATuning", "mla_decode_triton"]


def _use_sm90_path(q: torch.Tensor, K: OperandArgs, has_x: bool, d_qk: int) -> bool:
    """Whether the Gluon sm_90 kernels serve this launch: Gluon, an sm_90 device, and the
    operands they take (`triton_mla_plan.sm90_serves`)."""
    if not HAS_GLUON or not q.is_cuda or cuda_capability(q.device) != (9, 0):
        return False
    return sm90_serves(q, K, has_x, d_qk)


def mla_decode_triton(
    q: torch.Tensor,
    kv,
    q_row_offsets: torch.Tensor,
    *,
    d_v: int = 512,
    scale: float | None = None,
    causal: bool = True,
    indices: torch.Tensor | None = None,
    topk_lengths: torch.Tensor | None = None,
    extra_kv=None,
    extra_indices: torch.Tensor | None = None,
    extra_topk_lengths: torch.Tensor | None = None,
    attn_sink: torch.Tensor | None = None,
    num_partitions: int | None = None,
    out: torch.Tensor | None = None,
    config: MLATuning | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """MLA decode (docs/ops.md `mla_decode`), Triton kernels.

    q: [tokens, h_q, d_qk] bf16 (or fp16), d_qk 576 or 512; kv: an MLA operand (one latent
    head) in bf16 or any FP8 layout; q_row_offsets: [batch + 1] int32; indices: [tokens,
    stride] int32 encoded block*page_size+offset (sparse mode); topk_lengths: [batch] int32;
    extra_kv with extra_indices/extra_topk_lengths: a second sparse operand joined in the same
    softmax; attn_sink: [h_q] f32; config: the launch choices (None: `tuning.from_env()`).
    Returns (out [tokens, h_q, d_v] q.dtype, lse [tokens, h_q] f32, natural log over keys only).
    """
    a = decode_args(q, kv, q_row_offsets, d_v, scale, causal, indices, topk_lengths, extra_kv,
                    extra_indices, extra_topk_lengths, attn_sink, out)  # fmt: skip
    if a.K is None:  # no token or no head
        return a.out, a.lse
    config = tuning.from_env() if config is None else config
    sm90 = config.gluon is not False and _use_sm90_path(q, a.K, a.has_x, a.d_qk)
    plan = plan_decode(a, config, num_partitions, sm90=sm90, hbm3e=sm90 and fast_hbm(q.device))
    dev, tokens, h_q = q.device, a.tokens, a.h_q
    if plan.ps is not None:  # the persistent kernel: partials of the tokens cut at clusters
        g, L, npr = plan.ps
        po = torch.empty(2, g, h_q, a.d_v, dtype=torch.float32, device=dev)
        pl = torch.empty(2, g, h_q, dtype=torch.float32, device=dev)
        cut_t = torch.empty(g, dtype=torch.int32, device=dev)
        args = a.ps_args(po, pl, cut_t, L, npr)
    elif plan.balanced is not None:  # partials at the list's items (`worklist`)
        target, min_blocks = plan.balanced
        tpt, nhb, bn = plan.kwargs["TPT"], plan.kwargs["NHB"], plan.kwargs["BN"]
        items = target + tokens
        if not q.is_cuda:  # host lengths: launch only the list's programs
            n = mla_host_item_count(a.q_row_offsets, a.K.cl, tpt=tpt, bn=bn, target=target,
                                    min_blocks=min_blocks)  # fmt: skip
            plan = plan._replace(grid=(max(n, 1) * nhb,))
        po = torch.empty(items * tpt, h_q, a.d_v, dtype=torch.float32, device=dev)
        pl = torch.empty(items * tpt, h_q, dtype=torch.float32, device=dev)
        args = getattr(a, plan.args)(po, pl, 1)
    else:
        P = plan.partitions
        if P > 1:
            po = torch.empty(P, tokens, h_q, a.d_v, dtype=torch.float32, device=dev)
            pl = torch.empty(P, tokens, h_q, dtype=torch.float32, device=dev)
        else:
            po, pl = a.lse, a.lse  # not written
        args = getattr(a, plan.args)(po, pl, P)
    launch(plan.kernel, plan.grid, *args, cluster=plan.cluster, smem_args=plan.smem_args,
           **plan.kwargs)  # fmt: skip
    if plan.balanced is not None:
        mla_worklist_combine_triton(a.q_row_offsets, a.K.cl, po, pl, a.out, a.lse, a.sink, tpt=tpt,
                                    bn=bn, target=target, min_blocks=min_blocks)  # fmt: skip
    elif plan.ps is not None:
        if L % npr:  # else every cluster boundary falls between tokens: none is cut
            mla_combine_triton(po, pl, a.out, a.lse, a.sink, cut=(L, npr, cut_t))
    elif plan.partitions > 1:
        mla_combine_triton(po, pl, a.out, a.lse, a.sink)
    return a.out, a.lse
