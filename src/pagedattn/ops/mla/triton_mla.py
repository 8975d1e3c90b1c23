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
depend only on shapes.

Prepared calls (`PreparedMLA`, `PREPARED`; the mechanism is `ops.prepared`):
`pagedattn.mla_decode` validates and plans a call once per signature and then launches the
frozen decode kernel and its combine with each call's tensors, the split buffers from a
per-stream workspace (fresh ones under CUDA-graph capture; host cost:
docs/kernels/launch.md). `mla_decode_triton` itself always takes the full path. An offline capture (`ops.offline.capture(triton_mla, ...)`) replaces this
module's `launch`, `mla_combine_triton`, `_use_sm90_path` and `fast_hbm` to record the launches
an H100 or H200 would make, on any machine.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import torch

from ...cache.dispatch import cuda_capability, fast_hbm
from ..gluon_imports import HAS_GLUON
from ..launch import launch, recording
from ..prepared import (
    MISS,
    PreparedCache,
    PreparedLaunch,
    current_device,
    current_stream,
    env_state,
    guard_call,
    hooks_idle,
    place_parts,
    pointer_residues,
    read_pointers,
    workspace_layout,
)
from . import tuning
from .triton_mla_args import DecodeArgs, OperandArgs, decode_args
from .triton_mla_combine import mla_combine_triton
from .triton_mla_plan import LaunchPlan, plan_decode, sm90_serves
from .tuning import MLATuning
from .worklist import (
    ITEMS_MERGE,
    mla_host_item_count,
    mla_host_run_programs,
    mla_runs_combine_triton,
    mla_worklist_combine_triton,
)

__all__ = ["PREPARED", "MLATuning", "PreparedMLA", "mla_decode_triton"]


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

    This is the full path of every call (`pagedattn.mla_decode` keeps prepared calls,
    `PreparedMLA`; this function never reads or fills that cache).
    """
    return _full_path(q, kv, q_row_offsets, d_v, scale, causal, indices, topk_lengths, extra_kv,
                      extra_indices, extra_topk_lengths, attn_sink, num_partitions, out,
                      config)[0]  # fmt: skip


def host_grid(plan: LaunchPlan, q_row_offsets: torch.Tensor, cache_lens: torch.Tensor) -> tuple:
    """The grid of a balanced launch (the list or the runs) cut to the programs that have work,
    from host lengths (Triton's interpreter would otherwise run every program of the bound)."""
    kw = plan.kwargs
    target, min_blocks = plan.balanced
    if plan.runs:
        n = mla_host_run_programs(q_row_offsets, cache_lens, tpt=kw["TPT"], bn=kw["BN"],
                                  ovh=kw["RUN_OVH"], run_p=target, run_min=min_blocks,
                                  item_waves=kw["ITEM_WAVES"])[1]  # fmt: skip
    else:
        n = mla_host_item_count(q_row_offsets, cache_lens, tpt=kw["TPT"], bn=kw["BN"],
                                target=target, min_blocks=min_blocks)  # fmt: skip
    return (max(n, 1) * kw["NHB"],)


class _Ran(NamedTuple):
    """What one full-path call handed its kernels (for `PreparedMLA.prepare`): the plan (None
    where nothing was launched), the checked arguments, the partials (None where not split)
    and whether a combine followed the decode launch."""

    plan: LaunchPlan | None
    a: DecodeArgs
    po: torch.Tensor | None = None
    pl: torch.Tensor | None = None
    cut_t: torch.Tensor | None = None
    combine: bool = False


def _full_path(q, kv, q_row_offsets, d_v, scale, causal, indices, topk_lengths, extra_kv,
               extra_indices, extra_topk_lengths, attn_sink, num_partitions, out,
               config) -> tuple[tuple[torch.Tensor, torch.Tensor], _Ran]:  # fmt: skip
    """`mla_decode_triton`'s body: (its result, what it ran)."""
    a = decode_args(q, kv, q_row_offsets, d_v, scale, causal, indices, topk_lengths, extra_kv,
                    extra_indices, extra_topk_lengths, attn_sink, out)  # fmt: skip
    if a.K is None:  # no token or no head
        return (a.out, a.lse), _Ran(None, a)
    config = tuning.from_env() if config is None else config
    sm90 = config.gluon is not False and _use_sm90_path(q, a.K, a.has_x, a.d_qk)
    plan = plan_decode(a, config, num_partitions, sm90=sm90, hbm3e=sm90 and fast_hbm(q.device))
    dev, tokens, h_q = q.device, a.tokens, a.h_q
    cut_t, meta = None, {}
    if plan.ps is not None:  # the persistent kernel: partials of the tokens cut at clusters
        g, L, npr = plan.ps
        po = torch.empty(2, g, h_q, a.d_v, dtype=torch.float32, device=dev)
        pl = torch.empty(2, g, h_q, dtype=torch.float32, device=dev)
        cut_t = torch.empty(g, dtype=torch.int32, device=dev)
        args = a.ps_args(po, pl, cut_t, L, npr)
    elif plan.balanced is not None:  # partials at the list's items or the runs' slots
        target = plan.balanced[0]
        tpt = plan.kwargs["TPT"]
        # (the runs' partial slots: 2 a program, or 2 an item over ITEM_WAVES waves of them)
        slots_p = target * max(plan.kwargs.get("ITEM_WAVES", 1), 1)
        rows = (2 * slots_p if plan.runs else target + tokens) * tpt
        if not q.is_cuda:  # host lengths: launch only the programs that have work
            plan = plan._replace(grid=host_grid(plan, a.q_row_offsets, a.K.cl))
        po = torch.empty(rows, h_q, a.d_v, dtype=torch.float32, device=dev)
        pl = torch.empty(rows, h_q, dtype=torch.float32, device=dev)
        if plan.runs:  # (slot, pieces, index in the tile) a token, for the combine
            cut_t = torch.empty(tokens, 4, dtype=torch.int32, device=dev)
            meta = {"META": cut_t}
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
           **plan.kwargs, **meta)  # fmt: skip
    combine = True
    if plan.runs:
        mla_runs_combine_triton(a.q_row_offsets, cut_t, po, pl, a.out, a.lse, a.sink, tpt=tpt,
                                run_p=slots_p)  # fmt: skip
    elif plan.balanced is not None:
        wl = config.wl
        merge = dataclasses.replace(ITEMS_MERGE, long_min=wl.wl_long_min,
                                    long_max=wl.wl_long_max, fine=wl.wl_long_fine)  # fmt: skip
        mla_worklist_combine_triton(a.q_row_offsets, a.K.cl, po, pl, a.out, a.lse, a.sink, tpt=tpt,
                                    bn=plan.kwargs["BN"], target=target,
                                    min_blocks=plan.balanced[1], merge=merge)  # fmt: skip
    elif plan.ps is not None and L % npr:  # else no cluster boundary cuts a token
        mla_combine_triton(po, pl, a.out, a.lse, a.sink, cut=(L, npr, cut_t))
    elif plan.ps is None and plan.partitions > 1:
        mla_combine_triton(po, pl, a.out, a.lse, a.sink)
    else:
        combine = False
    split = plan.ps is not None or plan.balanced is not None or plan.partitions > 1
    ran = _Ran(plan, a, po if split else None, pl if split else None, cut_t, combine)
    return (a.out, a.lse), ran


# --------------------------------------------------------------------------------------------
# Prepared calls (`pagedattn.mla_decode`'s host path; the mechanism is `ops.prepared`)
# --------------------------------------------------------------------------------------------
# The call's tensors a prepared launch takes its pointers from ("sources"), by index; the
# extra operand's five are kv's five 7 places on, its indices and lengths kv's too.
SOURCES = (
    "q", "q_row_offsets", "kv.rows", "kv.cache_lengths", "kv.lut", "kv.row_offsets",
    "kv.scales", "indices", "topk_lengths", "extra_kv.rows", "extra_kv.cache_lengths",
    "extra_kv.lut", "extra_kv.row_offsets", "extra_kv.scales", "extra_indices",
    "extra_topk_lengths", "attn_sink", "out", "lse", "partial_out", "partial_lse", "cut_t",
)  # fmt: skip
_KR, _KS, _OUT, _LSE, _PO, _PL, _CUT = 2, 6, 17, 18, 19, 20, 21
_N_SOURCES = len(SOURCES)


def _operand_key(op) -> tuple:
    """What the checks and the plan read of an operand besides its tensors' metadata."""
    return (
        type(op), op.page_size, op.page_stride_rows, op.quant_format,
        op.quantization_granularity, op.quantization_enabled, op.head_dim, op.num_heads,
        op.dtype, op.lut is None, op.row_offsets is None, op.scales is None,
    )  # fmt: skip


def _signature(q, kv, q_row_offsets, d_v, scale, causal, indices, topk_lengths, extra_kv,
               extra_indices, extra_topk_lengths, attn_sink, num_partitions, out, backend,
               return_lse=True) -> tuple[tuple, list]:  # fmt: skip
    """(key, sources) of a `pagedattn.mla_decode` call (`ops.prepared`): the key holds every
    non-tensor value the op's checks and plan read; `_guarded(sources)` are the tensors whose
    metadata the guard checks. Raises (AttributeError, TypeError, ...) for arguments it cannot
    read: the caller then takes the full path, which reports them."""
    kr, kc, kl, ko, ks = kv.rows, kv.cache_lengths, kv.lut, kv.row_offsets, kv.scales
    if extra_kv is None:
        xr = xc = xl = xo = xs = x_key = None
    else:
        xr, xc, xl = extra_kv.rows, extra_kv.cache_lengths, extra_kv.lut
        xo, xs = extra_kv.row_offsets, extra_kv.scales
        x_key = (
            _operand_key(extra_kv), xr is kr, xc is kc, xl is kl, xo is ko, xs is ks,
            extra_indices is indices, extra_topk_lengths is topk_lengths,
        )  # fmt: skip
    src = [q, q_row_offsets, kr, kc, kl, ko, ks, indices, topk_lengths, xr, xc, xl, xo, xs,
           extra_indices, extra_topk_lengths, attn_sink, out, None, None, None, None]  # fmt: skip
    key = (
        q.shape, type(kv), kv.page_size, kv.page_stride_rows, kv.quant_format,
        kv.quantization_granularity, kv.quantization_enabled, kv.head_dim, kv.num_heads,
        kv.dtype, kl is None, ko is None, ks is None, indices is None, topk_lengths is None,
        extra_indices is None, extra_topk_lengths is None, attn_sink is None, out is None,
        x_key, type(d_v), d_v, type(scale), scale, type(causal), causal,
        type(num_partitions), num_partitions, backend, type(return_lse), return_lse, env_state(),
        current_device(q),
    )  # fmt: skip
    return key, src


def _guarded(src: list) -> tuple[int, ...]:
    """The indices of the sources a call's guard checks: every tensor argument once (the extra
    operand's that are kv's, which the key records, left out); a function of the key."""
    return tuple(
        i for i in range(_OUT + 1)
        if src[i] is not None and not (9 <= i <= 15 and src[i] is src[i - 7])
    )  # fmt: skip


class _PreparedDecode:
    """A decode call's frozen launches (the decode kernel and, where its keys were split, the
    combine) and what each call allocates (`PreparedMLA`). parts: (source index, shape, dtype,
    offset, numel) of each split buffer in the workspace (4-byte elements), and of the LSE
    where the call does not return it (`return_lse`)."""

    __slots__ = (
        "decode", "combine", "inputs", "aligned", "device", "index", "out_shape", "dtype",
        "lse_shape", "parts", "ws_numel", "host_grid", "return_lse",
    )  # fmt: skip

    def __call__(self, src: list):
        """The call's (out, lse) (out alone where it does not return the LSE), or MISS where a
        pointer's low four bits differ from the prepared call's (Triton specialized on 16-byte
        alignment, the plan on 4-byte)."""
        P = read_pointers(src, self.inputs, self.aligned, _N_SOURCES)
        if P is None:
            return MISS
        dev, index = self.device, self.index
        out = src[_OUT]
        if out is None:
            out = src[_OUT] = torch.empty(self.out_shape, dtype=self.dtype, device=dev)
            P[_OUT] = out.data_ptr()
        if self.return_lse:
            lse = src[_LSE] = torch.empty(self.lse_shape, dtype=torch.float32, device=dev)
            P[_LSE] = lse.data_ptr()
        stream = current_stream(index)
        d, c = self.decode, self.combine
        if self.ws_numel:
            place_parts(self.parts, self.ws_numel, src, P, dev, index, stream, not d.compiled)
        if d.fast is not None and (c is None or c.fast is not None) and hooks_idle():
            d.fast(stream, P)
            if c is not None:
                c.fast(stream, P)
        else:
            grid = None
            if self.host_grid is not None:  # Triton's interpreter: the host's lengths
                grid = host_grid(self.host_grid, src[1], src[3])
            d.run(stream, P, src, grid)
            if c is not None:
                c.run(stream, P, src)
        return (out, lse) if self.return_lse else out


class PreparedMLA:
    """`pagedattn.mla_decode`'s prepared calls (`ops.prepared`), keyed by `_signature`: the
    decode launch (every kernel of `triton_mla_plan`: the TMA-fed seesaw's descriptors are
    re-encoded per cache pointer, the cluster kernels keep their cluster and shared offsets)
    and its combine (the balanced list's or its runs', split-K's, the persistent kernel's cut
    tokens'; the runs' META travels as the `cut_t` source). A call whose launches cannot be
    prepared (an argument the launcher copies: a non-contiguous attn_sink or indices, a
    non-float32 per-tensor scale; two arguments sharing memory), or that launches nothing (no
    token or no head), keeps the full path: its signature is stored as UNPREPARED so that it
    is not prepared again.

    `__call__(...)` (the lookup, `mla_decode`'s arguments): the result of a hit, or MISS /
    UNPREPARED. `prepare(...)`: the full path of a validated call, prepared on the way.
    `cache`: the bounded `PreparedCache` (at most capacity x per_key entries; an entry holds
    generated launch code, shapes and encoded descriptors, no tensor)."""

    def __init__(self, capacity: int = 128, per_key: int = 4) -> None:
        self.cache = PreparedCache(capacity, per_key)

    def __call__(self, q, kv, q_row_offsets, d_v, scale, causal, indices, topk_lengths,
                 extra_kv, extra_indices, extra_topk_lengths, attn_sink, num_partitions, out,
                 backend, return_lse=True):  # fmt: skip
        try:
            key, src = _signature(
                q, kv, q_row_offsets, d_v, scale, causal, indices, topk_lengths, extra_kv,
                extra_indices, extra_topk_lengths, attn_sink, num_partitions, out, backend,
                return_lse,
            )  # fmt: skip
        except Exception:  # arguments the signature cannot read: the full path reports them
            return MISS
        return self.cache.lookup(key, src)

    def prepare(self, q, kv, q_row_offsets, d_v, scale, causal, indices, topk_lengths,
                extra_kv, extra_indices, extra_topk_lengths, attn_sink, num_partitions, out,
                backend, return_lse=True):  # fmt: skip
        """`mla_decode_triton`'s full path for a call `mla_decode` validated (d_v as given: an
        int-like), its launches prepared and stored; (out, lse), or out alone where not
        `return_lse`."""
        rest = (scale, causal, indices, topk_lengths, extra_kv, extra_indices,
                extra_topk_lengths, attn_sink, num_partitions, out)  # fmt: skip
        args = (q, kv, q_row_offsets, int(d_v), *rest)
        try:
            key, src = _signature(q, kv, q_row_offsets, d_v, *rest, backend, return_lse)
            guarded = guard_call(key, src, _guarded(src))
        except Exception:  # (not expected of a validated call) not prepared
            guarded = None
        if guarded is None:
            res = _full_path(*args, None)[0]
            return res if return_lse else res[0]
        guard, pick = guarded
        with recording() as made:
            res, ran = _full_path(*args, None)
        if ran.plan is None:  # nothing launched
            self.cache.store(key, guard, pick, None)
        elif len(made) == 1 + ran.combine:  # (fewer: an offline capture replaced `launch`)
            src[_OUT], src[_LSE] = ran.a.out, ran.a.lse
            src[_PO], src[_PL], src[_CUT] = ran.po, ran.pl, ran.cut_t
            entry = _prepare_decode(made, src, ran, out is not None, return_lse)
            self.cache.store(key, guard, pick, entry)
        return res if return_lse else res[0]


def _prepare_decode(made, src: list, ran: _Ran, out_given: bool,
                    return_lse: bool = True) -> _PreparedDecode | None:  # fmt: skip
    """The `_PreparedDecode` of a call's recorded launches `made` (src: the call's sources, its
    outputs and split buffers included), or None where they cannot be prepared; an LSE the
    call does not return goes into the workspace with the split buffers."""
    launches = [PreparedLaunch.build(m, src, descriptors=True) for m in made]
    if any(p is None for p in launches) or len({p.compiled for p in launches}) != 1:
        return None
    e = _PreparedDecode()
    e.decode = launches[0]
    e.combine = launches[1] if len(launches) > 1 else None
    fresh = {_LSE, _PO, _PL, _CUT} | (set() if out_given else {_OUT})
    read = set().union(*(p.sources for p in launches))
    read |= {i for i in (_KR, _KS) if src[i] is not None}  # the plan reads their alignment
    e.inputs = tuple(sorted(read - fresh))
    e.aligned = pointer_residues(src, e.inputs)
    a = ran.a
    e.device, e.index = a.q.device, current_device(a.q)
    e.out_shape, e.dtype = tuple(a.out.shape), a.out.dtype
    e.lse_shape = tuple(a.lse.shape)
    split = [(i, src[i]) for i in (_PO, _PL, _CUT) if src[i] is not None]
    e.return_lse = return_lse
    if not return_lse:
        split.append((_LSE, src[_LSE]))
    if any(t.element_size() != 4 or not t.is_contiguous() for _, t in split):
        return None
    e.parts, e.ws_numel = workspace_layout([(i, tuple(t.shape), t.dtype) for i, t in split])
    plan = ran.plan
    e.host_grid = plan if plan.balanced is not None and not e.decode.compiled else None
    return e


#: The prepared calls of `pagedattn.mla_decode` (one per process; bounded, see PreparedCache).
PREPARED = PreparedMLA()
