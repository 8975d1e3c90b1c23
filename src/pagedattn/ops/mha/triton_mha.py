"""Triton MHA/GQA attention over any K/V operand: `mha_triton`, the launcher behind
`pagedattn.ops.mha.mha` (same contract, docs/ops.md).

It checks the arguments' shapes, asks `selection.plan` for a frozen launch plan (which kernel,
which configuration, how many split-K partitions) and launches it:
- decode (`triton_decode._mha_decode_kernel`): one program per (query row, split-K partition,
  KV head); it finds each row's request itself, so a ragged batch with total_q == batch is
  correct there too (only slower). P > 1 writes [total_q, h_q, P, d_v] f32 partials and
  [total_q, h_q, P] LSEs to a workspace sized from the static P, which `triton_combine` merges,
  folding the sinks in.
- prefill / chunked prefill (`triton_prefill._mha_prefill_kernel`, or on sm_90 the Gluon
  `gluon_prefill_ws._mha_prefill_ws` / `gluon_prefill._mha_prefill_sm90`): one program per
  (block of query rows of one request, query head); never split along K.
Split-K with `num_partitions=None` follows `cache.dispatch.mha_num_partitions` with the SM count
and a host bound on the cache length (`lut.shape[1] * page_size`, or `rows.shape[0]`).

Numerics: softmax in fp32 (log2 domain, the scale folded into one FMA per score; the scale
must be > 0). MMAs take bf16/fp16 operands with fp32 accumulation (IEEE fp32 dots for fp32
inputs). Decode carries P as a bf16 hi + lo pair through P @ V (free when memory-bound), which
keeps it within DESIGN.md's bf16 bounds; prefill rounds P to bf16 as FlashAttention does (up to
~2^-9 of |v|). FP8 K/V with per-token / per-tensor scales run fp16 MMAs (e4m3 is exact in
fp16, q is scaled by an exact power of two to fit); blockwise G < head_dim K/V are dequantized
to bf16 in registers (exact for e8m0 scales; float32 scales round like a bf16 cache unless the
config sets kv_lo).

Prepared calls (`PreparedMHA`, `PREPARED`; the mechanism is `ops.prepared`): `pagedattn.mha`
validates and plans a call once per signature (any plan: decode and its combine, prefill, a
mixed step's two parts, with a step plan) and then launches the frozen kernels with each
call's tensors (host cost: docs/kernels/launch.md). `mha_triton` and `mha_mixed_triton`
themselves always take the full path.

Tuning: `config=` (`selection.MHATuning`) and `PAGEDATTN_MHA_TUNING` override fields of the
selected configs (development). No host sync and no data-dependent allocation: safe under
CUDA-graph capture. Kernel history: docs/kernels/mha_decode.md, mha_prefill.md, gluon_prefill.md.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch
import triton

from ...cache.dispatch import cuda_capability, fast_hbm, num_sms
from ...errors import check
from ...operands import KernelArgs, RowOperand
from ..constants import LOG2E_F
from ..gluon_imports import GluonTensorDescriptor, nvmma_16b_cols, nvmma_128b
from ..launch import launch, occupancy_shared, recording
from ..masks import MASK_CODES, Mask, causal
from ..pdl import pdl_chain_kwargs
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
    semaphores,
    workspace_layout,
)
from ..specialize import request_block
from . import gluon_prefill, gluon_prefill_ws
from .selection import (  # noqa: F401 - decode_config: kept importable here (test_dispatch_plan)
    DecodeConfig,
    DecodePlan,
    Device,
    MHATuning,
    PrefillPlan,
    Sm90PrefillPlan,
    decode_config,
    fast_flags,
    mma_flags,
    quant_code,
    same_rows,
    storage_delta,
    tuning_from_env,
)
from .selection import plan as launch_plan
from .step_plan import StepPlan
from .triton_combine import combine_triton
from .triton_decode import _mha_decode_kernel
from .triton_prefill import _mha_prefill_kernel
from .triton_tiles import Q_BLOCK, Q_TENSOR, Q_TOKEN
from .triton_worklist import host_item_count, worklist_combine_triton
from .work_plan import _plan_kernel, plan_capacity

# masks whose rows see every key up to their own: the step's plan balances their decode launches
PLANNED_MASKS = (MASK_CODES["null"], MASK_CODES["causal"])

# causal-type masks: each request's heaviest query block runs first
_REVERSE = ("causal", "sliding_window_causal", "chunked_causal")


def device_facts(device: torch.device) -> Device:
    """The facts of `device` that a launch plan depends on (`ops.offline` captures replace this
    function to plan as on an H100 or an H200)."""
    return Device(
        sm90=cuda_capability(device) == (9, 0), sms=num_sms(device), hbm3e=fast_hbm(device)
    )


def _tma_descriptor(r: torch.Tensor, block: list, gluon_layout=None):
    """A tl (gluon_layout None) or Gluon TMA descriptor of `block` boxes over rows [rows,
    heads, D] seen as [rows, heads * D]."""
    view = [r, [r.shape[0], r.shape[1] * r.shape[2]], [r.stride(0), 1]]
    if gluon_layout is None:
        from triton.tools.tensor_descriptor import TensorDescriptor

        return TensorDescriptor(*view, block)
    return GluonTensorDescriptor(*view, block, gluon_layout)


def _kv_launch_args(
    ka: KernelArgs, head_dim: int, tma_block_n: int | None, gluon_layout=None,
    box_cols: int | None = None,
) -> tuple[list, dict]:  # fmt: skip
    """Positional args (base, stride_r, stride_h, lut, stride_lut, row_offsets, page_stride,
    scales, stride_sr, stride_sh) and the constexprs of one operand. With tma_block_n, base is a
    descriptor of [tma_block_n, box_cols (default D)] boxes of the [rows, heads * D] view: a tl
    one, or a Gluon one in `gluon_layout`."""
    r = ka.rows
    check(r.stride(2) == 1, "K/V rows", "a last dim of stride 1", r.stride())
    base = r
    if tma_block_n is not None:
        base = _tma_descriptor(r, [tma_block_n, box_cols or r.shape[2]], gluon_layout)
    paged = ka.page_size > 0
    lut = ka.lut if paged else ka.cache_lengths
    off = ka.row_offsets if not paged else ka.cache_lengths
    check(
        (not paged) or (ka.lut is not None and ka.lut.dtype == torch.int32),
        "lut",
        "an int32 [batch, cols] lookup table",
        None if ka.lut is None else ka.lut.dtype,
    )
    check(
        paged or (ka.row_offsets is not None and ka.row_offsets.dtype == torch.int32),
        "row_offsets",
        "an int32 [batch] tensor",
        None if ka.row_offsets is None else ka.row_offsets.dtype,
    )
    args = [
        base,
        r.stride(0),
        r.stride(1),
        lut,
        lut.stride(0) if paged else 0,
        off,
        ka.page_stride_rows if paged else 0,
    ]
    quant = quant_code(ka, head_dim)
    e8m0 = False
    scales, s_r, s_h = r, 0, 0
    if quant in (Q_TOKEN, Q_BLOCK):
        s = ka.scales
        check(s is not None and s.ndim == 3, "scales", "a [rows, heads, n_scales] view", s)
        check(s.stride(2) == 1, "scales", "a last dim of stride 1", s.stride())
        e8m0 = s.dtype == torch.float8_e8m0fnu
        check(
            e8m0 or s.dtype == torch.float32,
            "scales.dtype",
            "float32 or float8_e8m0fnu",
            s.dtype,
        )
        scales = s.view(torch.uint8) if e8m0 else s
        s_r, s_h = s.stride(0), s.stride(1)
    elif quant == Q_TENSOR:
        check(
            ka.scales is not None and ka.scales.numel() == 1 and ka.scales.dtype == torch.float32,
            "scales",
            "a one-element float32 per-tensor scale",
            ka.scales,
        )
        scales = ka.scales
    g = ka.granularity if quant == Q_BLOCK else head_dim
    cx = dict(PAGE=ka.page_size, QUANT=quant, G=g, E8M0=e8m0, TMA=tma_block_n is not None)
    return args + [scales, s_r, s_h], cx


def _kv_pair_args(ka, va, dk, dv, k_box, v_box, gluon_layout=None) -> tuple[list, dict, dict]:
    """The tl kernels' K/V arguments: K's and V's (base .. page_stride), then K's and V's
    (scales, stride_sr, stride_sh); and the two operands' constexprs."""
    k_args, kcx = _kv_launch_args(ka, dk, k_box, gluon_layout)
    v_args, vcx = _kv_launch_args(va, dv, v_box, gluon_layout)
    return k_args[:7] + v_args[:7] + k_args[7:] + v_args[7:], kcx, vcx


def mha_triton(
    q: torch.Tensor,
    k: RowOperand,
    v: RowOperand,
    q_row_offsets: torch.Tensor,
    *,
    mask: Mask | None = None,
    scale: float | None = None,
    sinks: torch.Tensor | None = None,
    num_partitions: int | torch.Tensor | None = None,
    return_lse: bool = False,
    out: torch.Tensor | None = None,
    max_q_len: int | None = None,
    config: MHATuning | None = None,
    plan: StepPlan | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Attention of ragged queries over K/V operands (docs/ops.md `mha`).

    q: [total_q, h_q, d_qk] bf16/fp16/fp32; q_row_offsets: [batch + 1] int32 (device).
    k, v: operands with h_kv heads (h_q % h_kv == 0), head dims d_qk and d_v <= 256.
    mask: None means causal(). scale: None means 1/sqrt(d_qk). sinks: [h_q] float32 logits.
    num_partitions: split-K partitions of the decode path (int or a one-element host tensor).
    max_q_len: optional host-known bound on q_len (e.g. max_lengths[step, 0]); 1 selects the
      decode path. Without it, decode is taken iff q.shape[0] == batch.
    config: development overrides of the launch configs (`selection.MHATuning`), applied over
      $PAGEDATTN_MHA_TUNING's.
    plan: the step's `step_plan.StepPlan`: a balanced decode launch over a causal or unmasked
      row reads its work list from the step's plan (made at the first such launch) instead of
      deriving one wave of items in every program.
    Returns out [total_q, h_q, d_v] in q.dtype, and LSE [total_q, h_q] f32 if return_lse.

    This is the full path of every call (`pagedattn.mha` keeps prepared calls, `PreparedMHA`;
    this function never reads or fills that cache).
    """
    return _full_path(
        q, k, v, q_row_offsets, mask=mask, scale=scale, sinks=sinks,
        num_partitions=num_partitions, return_lse=return_lse, out=out, max_q_len=max_q_len,
        config=config, plan=plan,
    )[0]  # fmt: skip


def mha_mixed_triton(
    q: torch.Tensor,
    k: RowOperand,
    v: RowOperand,
    q_row_offsets: torch.Tensor,
    num_decodes: int,
    *,
    mask: Mask | None = None,
    return_lse: bool = False,
    out: torch.Tensor | None = None,
    **kwargs,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """A mixed step whose first `num_decodes` requests have one query each (`mha`'s
    num_decodes): those on the decode kernel (its balanced work list: q rows 0 .. D - 1 over
    requests 0 .. D - 1, `max_q_len` 1), the rest on the prefill kernel (requests D.., whose
    offsets q_row_offsets[D:] address q, out and the LSE from row 0: the prefill kernels map
    their blocks from the offsets' differences), both writing one `out` / LSE. A batch of
    only decodes or only chunks is one launch as `mha_triton`. Other arguments:
    `mha_triton`'s."""
    return _mixed_path(q, k, v, q_row_offsets, num_decodes, mask=mask, return_lse=return_lse,
                       out=out, **kwargs)[0]  # fmt: skip


def _mixed_path(q, k, v, q_row_offsets, num_decodes, *, mask, return_lse, out, **kwargs):
    """`mha_mixed_triton`'s body: (its result, what each launch part ran)."""
    batch, total_q = q_row_offsets.shape[0] - 1, q.shape[0]
    d = int(num_decodes)
    if d == 0 or d >= batch:
        res, ran = _full_path(q, k, v, q_row_offsets, mask=mask, return_lse=return_lse, out=out,
                              max_q_len=1 if d >= batch else None, **kwargs)  # fmt: skip
        return res, [ran]
    mask = causal() if mask is None else mask
    if out is None:
        out = torch.empty((total_q, q.shape[1], v.head_dim), dtype=q.dtype, device=q.device)
    lse = (
        torch.empty((total_q, q.shape[1]), dtype=torch.float32, device=q.device)
        if return_lse
        else None
    )
    ks, vs = _select_pair(k, v, 0, d)
    m = dataclasses.replace(mask, tensor=mask.tensor[:d]) if mask.kind == "tensor" else mask
    _, dec = _full_path(
        q[:d], ks, vs, q_row_offsets[: d + 1], mask=m, return_lse=return_lse, out=out[:d],
        lse_out=None if lse is None else lse[:d], max_q_len=1, **kwargs,
    )  # fmt: skip
    ks, vs = _select_pair(k, v, d, batch)
    _, pre = _full_path(
        q, ks, vs, q_row_offsets[d:], mask=mask, return_lse=return_lse, out=out, lse_out=lse,
        rows=total_q - d, **kwargs,
    )  # fmt: skip
    return ((out, lse) if return_lse else out), [dec, pre]


def _select_pair(k: RowOperand, v: RowOperand, start: int, stop: int):
    """K's and V's operands over requests [start, stop), V's sharing K's views of the tensors
    K and V share (the lookup table, cache lengths, row offsets). The kernels test identity:
    shared rows read one page-table gather a tile (V_SAME_ROWS), and the mixed step's decode
    part then runs the binary the graph replays compiled (docs/kernels/jit_specializations.md,
    fix 3)."""
    ks, vs = k.select_requests(start, stop), v.select_requests(start, stop)
    for name in ("cache_lengths", "lut", "row_offsets"):
        mine = getattr(k, name)
        if mine is not None and mine is getattr(v, name):
            setattr(vs, name, getattr(ks, name))
    return ks, vs


@dataclass
class _Ran:
    """What one full-path launch part handed its kernels (for `PreparedMHA.prepare`): the plan
    (None where nothing was launched), the outputs and the split-K partials (None unless
    split), the requests it covered, and for a balanced decode launch that asked the step's
    plan: the `StepPlan.get` arguments (rows, block_n, target, min_blocks) and the buffer it
    got (None: the kernels' own list)."""

    how: DecodePlan | PrefillPlan | Sm90PrefillPlan | None
    out: torch.Tensor
    lse: torch.Tensor | None
    po: torch.Tensor | None = None
    pl: torch.Tensor | None = None
    rows: int = 0
    plan_key: tuple[int, int, int, int] | None = None
    plan_buf: torch.Tensor | None = None
    sem: torch.Tensor | None = None


def _merge_flags(cfg: DecodeConfig, group: int) -> dict:
    """The decode kernel's fused-merge constexprs (`triton_decode`, FUSED): the KV head's query
    heads padded to MERGE_GP, one item's partials a step, loads `cfg.merge_stages` deep."""
    return dict(FUSED=True, MERGE_GP=triton.next_power_of_2(group),
                MERGE_STAGES=cfg.merge_stages)  # fmt: skip


def _full_path(
    q: torch.Tensor,
    k: RowOperand,
    v: RowOperand,
    q_row_offsets: torch.Tensor,
    *,
    mask: Mask | None = None,
    scale: float | None = None,
    sinks: torch.Tensor | None = None,
    num_partitions: int | torch.Tensor | None = None,
    return_lse: bool = False,
    out: torch.Tensor | None = None,
    max_q_len: int | None = None,
    config: MHATuning | None = None,
    plan: StepPlan | None = None,
    lse_out: torch.Tensor | None = None,
    rows: int | None = None,
) -> tuple[torch.Tensor | tuple[torch.Tensor, torch.Tensor], _Ran]:
    """`mha_triton`'s body: (its result, what it ran). For `_mixed_path`: lse_out, the LSE to
    write (return_lse) instead of a new one; rows, the q rows the requests cover where fewer
    than q's (a prefill launch over requests whose offsets start past row 0: the grid's
    bound)."""
    mask = causal() if mask is None else mask
    check(q.ndim == 3, "q", "a [total_q, h_q, d] tensor", tuple(q.shape))
    check(
        q.dtype in (torch.bfloat16, torch.float16, torch.float32),
        "q.dtype",
        "bfloat16, float16 or float32",
        q.dtype,
    )
    check(
        q_row_offsets.ndim == 1 and q_row_offsets.dtype == torch.int32,
        "q_row_offsets",
        "a [batch + 1] int32 tensor",
        f"{tuple(q_row_offsets.shape)} {q_row_offsets.dtype}",
    )
    ka, va = k.kernel_args(), v.kernel_args()
    total_q, h_q, dk = q.shape
    batch = q_row_offsets.shape[0] - 1
    h_kv = ka.rows.shape[1]
    dv = v.head_dim
    check(k.head_dim == dk, "k.head_dim", f"q's head dim {dk}", k.head_dim)
    check(va.rows.shape[1] == h_kv, "v heads", f"{h_kv} (K's heads)", va.rows.shape[1])
    check(h_q % h_kv == 0, "q heads", f"a multiple of the KV heads {h_kv}", h_q)
    check(dk <= 256 and dv <= 256, "head dims", "<= 256", (dk, dv))
    check(
        ka.cache_lengths.shape[0] == batch,
        "cache_lengths",
        f"[{batch}] (batch from q_row_offsets)",
        tuple(ka.cache_lengths.shape),
    )
    tuning = tuning_from_env().over(config)
    group = h_q // h_kv
    if q.stride(2) != 1:
        q = q.contiguous()
    if out is None:
        out = torch.empty((total_q, h_q, dv), dtype=q.dtype, device=q.device)
    else:
        check(
            out.shape == (total_q, h_q, dv) and out.dtype == q.dtype and out.stride(2) == 1,
            "out",
            f"a [{total_q}, {h_q}, {dv}] {q.dtype} tensor with a contiguous last dim",
            f"{tuple(out.shape)} {out.dtype}",
        )
    lse = lse_out
    if return_lse and lse is None:
        lse = torch.empty((total_q, h_q), dtype=torch.float32, device=q.device)
    ran = _Ran(None, out, lse, rows=batch)
    q_rows = total_q if rows is None else rows
    if q_rows == 0 or batch == 0:
        return ((out, lse) if return_lse else out), ran

    if sinks is not None:
        check(sinks.numel() == h_q, "sinks", f"[{h_q}] float32 logits", tuple(sinks.shape))
        sinks = sinks.reshape(h_q).float().contiguous()
    mask_t, stride_mt, mask_cols = q, 0, 0
    if mask.kind == "tensor":
        mask_t = mask.tensor
        check(
            mask_t.shape[0] == total_q and mask_t.device == q.device,
            "mask.tensor",
            f"a bool [{total_q}, max_keys] tensor on {q.device}",
            tuple(mask_t.shape),
        )
        if mask_t.stride(1) != 1:
            mask_t = mask_t.contiguous()
        stride_mt, mask_cols = mask_t.stride(0), mask_t.shape[1]

    sm_scale = (1.0 / math.sqrt(dk)) if scale is None else float(scale)
    check(sm_scale > 0 and math.isfinite(sm_scale), "scale", "a finite float > 0", scale)
    dkp = max(16, triton.next_power_of_2(dk))
    dvp = max(16, triton.next_power_of_2(dv))
    block_b = request_block(batch)
    prec = "ieee" if q.dtype == torch.float32 else "tf32"
    how = ran.how = launch_plan(
        q, ka, va, dk, dv, batch, mask, max_q_len, num_partitions, tuning, device_facts(q.device)
    )
    q_head = [q, q.stride(0), q.stride(1)]
    common_tail = [
        ka.cache_lengths, q_row_offsets, batch, sinks if sinks is not None else q,
        mask_t, stride_mt, mask_cols, mask.param,
    ]  # fmt: skip
    out_tail = [
        out, out.stride(0), out.stride(1), lse if lse is not None else out,
        lse.stride(0) if lse is not None else 0, lse.stride(1) if lse is not None else 0,
    ]  # fmt: skip

    if isinstance(how, DecodePlan):
        cfg, parts, k_tma, v_tma = how.config, how.num_partitions, how.k_tma, how.v_tma
        bn = cfg.BLOCK_N
        kv_args, kcx, vcx = _kv_pair_args(
            ka, va, dk, dv, bn if k_tma else None, bn if v_tma else None
        )
        balanced = how.target > 0
        split = parts > 1 or balanced
        mma = mma_flags(cfg, prec, kcx, vcx)
        # the fused merge's counters (`ops.prepared.semaphores`)
        sem = ran.sem = (
            semaphores(q.device, current_stream(current_device(q)), total_q * h_kv)
            if balanced and how.fused
            else None
        )
        buf = None
        if balanced and plan is not None and mask.code in PLANNED_MASKS:
            ran.plan_key = (batch, bn, how.target, how.min_blocks)
            buf, n_items = plan.get(ka.cache_lengths, batch, block_n=bn, target=how.target,
                                    min_blocks=how.min_blocks)  # fmt: skip
            ran.plan_buf = buf
        if buf is not None:  # the step's plan: its items, or its capacity where not known
            # (on the CPU too: the interpreter runs the same exits as the GPU)
            items = bound = plan_capacity(batch, how.target) if n_items is None else n_items
            po = torch.empty((bound, h_q, dv), dtype=torch.float32, device=q.device)
            pl = torch.empty((bound, h_q), dtype=torch.float32, device=q.device)
        elif balanced:  # partials at the work items: at most target + batch of them
            items = bound = how.target + batch
            if q.device.type == "cpu":  # host lengths: launch only the list's programs
                items = host_item_count(
                    ka.cache_lengths, q_row_offsets, mask.code, mask.param,
                    block_n=cfg.BLOCK_N, target=how.target, min_blocks=how.min_blocks,
                )  # fmt: skip
            po = torch.empty((bound, h_q, dv), dtype=torch.float32, device=q.device)
            pl = torch.empty((bound, h_q), dtype=torch.float32, device=q.device)
        elif split:
            items = total_q * parts
            po = torch.empty((total_q, h_q, parts, dv), dtype=torch.float32, device=q.device)
            pl = torch.empty((total_q, h_q, parts), dtype=torch.float32, device=q.device)
        else:
            items = total_q
            po = pl = out
        if split:
            ran.po, ran.pl = po, pl
        chain = pdl_chain_kwargs(q, "PDL_WAIT")  # (a link of the chain; the combine's signal)
        launch(_mha_decode_kernel, (items * h_kv,),
            *q_head, *kv_args, *common_tail, *out_tail, po, pl, parts, sm_scale * LOG2E_F,
            buf if buf is not None else q,  # the step's plan (read only where PLAN)
            sem if sem is not None else q,  # the fused merge's counters (read only where FUSED)
            H_KV=h_kv, GROUP=group, GP=max(cfg.gp_min, triton.next_power_of_2(group)),
            **fast_flags(cfg, ka, va, dk, dv, kcx, vcx, k_tma or v_tma, mma["MMA_F16"]),
            DK=dk, DKP=dkp, DV=dv, DVP=dvp, BLOCK_N=bn,
            K_PAGE=kcx["PAGE"], V_PAGE=vcx["PAGE"], V_SAME_ROWS=same_rows(ka, va, k_tma, v_tma),
            K_QUANT=kcx["QUANT"], V_QUANT=vcx["QUANT"], KG=kcx["G"], VG=vcx["G"],
            K_E8M0=kcx["E8M0"], V_E8M0=vcx["E8M0"], MASK=mask.code,
            HAS_SINKS=sinks is not None and (balanced or not split),
            SPLIT=split and not balanced,
            WRITE_LSE=lse is not None and (balanced or not split),
            K_TMA=k_tma, V_TMA=v_tma, DOT_PREC=prec, **mma,
            BLOCK_B=block_b, PDL=split and sem is None and bool(chain),
            NUM_STAGES=cfg.num_stages, num_warps=cfg.num_warps, **chain,
            min_shared=occupancy_shared(cfg.max_ctas_per_sm) if cfg.max_ctas_per_sm > 0 else 0,
            **(dict(BALANCED=True, TARGET=how.target, MIN_BLOCKS=how.min_blocks,
                    **({"PLAN": True} if buf is not None else {}),
                    **({"LIST_ORDER": cfg.list_order} if cfg.list_order else {}),
                    **(_merge_flags(cfg, group) if sem is not None else {}))
               if balanced else {}),
        )  # fmt: skip
        if balanced:
            if sem is None:
                worklist_combine_triton(
                    ka.cache_lengths, q_row_offsets, mask.code, mask.param, po, pl, out, lse,
                    sinks, group=group, block_n=bn, target=how.target,
                    min_blocks=how.min_blocks, block_b=block_b, plan=buf,
                    list_order=cfg.list_order,
                )  # fmt: skip
        elif split:
            combine_triton(po, pl, out, lse, sinks)
    elif isinstance(how, Sm90PrefillPlan):
        _prefill_sm90(how, q, q_rows, q_row_offsets, ka, va, dk, dv, h_q, group, block_b, mask,
                      sinks, out, lse, sm_scale)  # fmt: skip
    else:
        assert isinstance(how, PrefillPlan)
        cfg, k_tma, v_tma = how.config, how.k_tma, how.v_tma
        bm, bn = cfg.BLOCK_M, cfg.BLOCK_N
        kv_args, kcx, vcx = _kv_pair_args(
            ka, va, dk, dv, bn if k_tma else None, bn if v_tma else None
        )
        n_tiles = min(triton.cdiv(q_rows, bm) + batch, q_rows)
        launch(_mha_prefill_kernel, (n_tiles * h_q,),
            *q_head, *kv_args, *common_tail, *out_tail, sm_scale * LOG2E_F,
            H_Q=h_q, GROUP=group, DK=dk, DKP=dkp, DV=dv, DVP=dvp, BLOCK_M=bm, BLOCK_N=bn,
            K_PAGE=kcx["PAGE"], V_PAGE=vcx["PAGE"], V_SAME_ROWS=same_rows(ka, va, k_tma, v_tma),
            K_QUANT=kcx["QUANT"], V_QUANT=vcx["QUANT"], KG=kcx["G"], VG=vcx["G"],
            K_E8M0=kcx["E8M0"], V_E8M0=vcx["E8M0"], MASK=mask.code,
            HAS_SINKS=sinks is not None, WRITE_LSE=lse is not None,
            REVERSE=mask.kind in _REVERSE,
            K_TMA=k_tma, V_TMA=v_tma, DOT_PREC=prec, **mma_flags(cfg, prec, kcx, vcx),
            BLOCK_B=block_b, BLOCKS_FASTEST=bool(cfg.blocks_fastest),
            NUM_STAGES=cfg.num_stages, num_warps=cfg.num_warps,
        )  # fmt: skip
    return ((out, lse) if return_lse else out), ran


def _prefill_sm90(how: Sm90PrefillPlan, q, total_q, q_row_offsets, ka, va, dk, dv, h_q, group,
                  block_b, mask, sinks, out, lse, sm_scale) -> None:  # fmt: skip
    """Launch `gluon_prefill_ws._mha_prefill_ws` or `gluon_prefill._mha_prefill_sm90` (the
    grid and block order of the tl kernel) as `how` says, over the total_q rows the requests
    cover. d_qk > d_v (the warp-specialized kernel only, `selection.sm90_prefill_serves`): K's
    columns past d_v are a second descriptor's boxes (KR, DR = d_qk - d_v)."""
    cfg, ws, use_tma = how.config, how.ws, how.tma
    batch = q_row_offsets.shape[0] - 1
    bn = cfg.BLOCK_N
    d, dr = dv, dk - dv
    layout = nvmma_128b(2)
    box_k, box_v = (how.k_box, how.v_box) if ws else ((bn, bn) if use_tma else (None, None))
    k_args, kcx = _kv_launch_args(ka, dk, box_k, layout, box_cols=d)  # the kernel's layout
    v_args, vcx = _kv_launch_args(va, d, box_v, layout)
    extra = dict(DR=dr, KR=_tma_descriptor(ka.rows, [box_k, dr], nvmma_16b_cols(dr))) if dr else {}
    tail = [
        ka.cache_lengths, q_row_offsets, batch, sinks if sinks is not None else q, mask.param,
        out, out.stride(0), out.stride(1), lse if lse is not None else out,
        lse.stride(0) if lse is not None else 0, lse.stride(1) if lse is not None else 0,
        sm_scale * LOG2E_F,
    ]  # fmt: skip
    cx = dict(
        H_Q=h_q, GROUP=group, D=d, BLOCK_N=bn, K_PAGE=kcx["PAGE"], V_PAGE=vcx["PAGE"],
        MASK=mask.code, HAS_SINKS=sinks is not None, WRITE_LSE=lse is not None,
        REVERSE=mask.kind in _REVERSE, BLOCKS_FASTEST=True, BLOCK_B=block_b, NBUF=cfg.NBUF,
    )  # fmt: skip
    rows = 128 if ws else 16 * cfg.num_warps
    grid = (min(triton.cdiv(total_q, rows) + batch, total_q) * h_q,)
    if ws:  # TMA descriptors, lookup tables, row offsets, page strides
        launch(gluon_prefill_ws._mha_prefill_ws, grid,
            q, q.stride(0), q.stride(1), k_args[0], *k_args[3:7], v_args[0], *v_args[3:7],
            *tail, K_BOX=box_k, V_BOX=box_v, CONSUMER_REGS=cfg.consumer_regs, num_warps=4,
            maxnreg=cfg.maxnreg, **cx, **extra,
        )  # fmt: skip
    else:
        launch(gluon_prefill._mha_prefill_sm90, grid,
            q, q.stride(0), q.stride(1), *k_args[:7], *v_args[:7], *tail,
            V_SAME_ROWS=same_rows(ka, va, use_tma, use_tma), TMA=use_tma,
            num_warps=cfg.num_warps, **cx,
        )  # fmt: skip


# --------------------------------------------------------------------------------------------
# Prepared calls (`pagedattn.mha`'s host path; the mechanism is `ops.prepared`)
# --------------------------------------------------------------------------------------------
# The call's tensors a prepared launch takes its pointers from ("sources"), by index
SOURCES = (
    "q", "q_row_offsets", "k.rows", "k.cache_lengths", "k.lut", "k.row_offsets", "k.scales",
    "v.rows", "v.cache_lengths", "v.lut", "v.row_offsets", "v.scales", "sinks", "mask.tensor",
    "out", "lse", "partial_out", "partial_lse", "step plan", "semaphores",
)  # fmt: skip
_OUT, _LSE, _PO, _PL, _PLAN, _SEM = 14, 15, 16, 17, 18, 19


def _signature(q, k, v, q_row_offsets, mask, scale, sinks, num_partitions, return_lse, out,
               backend, num_decodes=None, plan=None) -> tuple[tuple, list]:  # fmt: skip
    """(key, sources) of a `pagedattn.mha` call (`ops.prepared`): the key holds every
    non-tensor value the op's checks and plan read (the step plan's presence; its buffers
    are the call's, `_PreparedCall`); `_guarded(sources)` are the tensors whose metadata the
    guard checks. Raises (AttributeError, TypeError, ...) for arguments it cannot read: the
    caller then takes the full path, which reports them."""
    kr, kc, kl, ko, ks = k.rows, k.cache_lengths, k.lut, k.row_offsets, k.scales
    vr, vc, vl, vo, vs = v.rows, v.cache_lengths, v.lut, v.row_offsets, v.scales
    if mask is None:
        mk = mt = None
    else:
        mt = mask.tensor
        mk = (type(mask), mask.kind, mask.window, mask.chunk)
    src = [q, q_row_offsets, kr, kc, kl, ko, ks, vr, vc, vl, vo, vs, sinks, mt, out,
           None, None, None, None, None]  # fmt: skip
    key = (
        q.shape, type(k), k.page_size, k.page_stride_rows, k.quant_format,
        k.quantization_granularity, k.quantization_enabled, k.head_dim, k.num_heads, k.dtype,
        type(v), v.page_size, v.page_stride_rows, v.quant_format,
        v.quantization_granularity, v.quantization_enabled, v.head_dim, v.num_heads, v.dtype,
        kl is None, ko is None, ks is None, vl is None, vo is None, vs is None,
        vr is kr, vc is kc, vl is kl, vo is ko, vs is ks,
        mk, mt is None, sinks is None, out is None, type(scale), scale,
        type(num_partitions), num_partitions, type(return_lse), return_lse, backend,
        type(num_decodes), num_decodes, plan is None, env_state(), current_device(q),
    )  # fmt: skip
    if k.quant_format is not None or v.quant_format is not None:
        # the FP8 decode loop addresses V (and its scales) from K's when one storage holds both
        key += (storage_delta(kr, vr), None if ks is None or vs is None else
                storage_delta(ks, vs))  # fmt: skip
    return key, src


def _guarded(src: list) -> tuple[int, ...]:
    """The indices of the sources a call's guard checks: every tensor argument once (v's that
    are k's, which the key records, left out); a function of the key."""
    return tuple(
        i for i in range(_OUT + 1)
        if src[i] is not None and not (7 <= i <= 11 and src[i] is src[i - 5])
    )  # fmt: skip


class _PreparedCall:
    """A call's frozen launches (in order: a decode part's kernel and its combine where split,
    a prefill part's kernel) and what each call allocates or asks (`PreparedMHA`).

    `grid_at`: the index of the balanced decode launch whose grid is the call's (-1: every grid
    fixed): with a step plan whose buffer the launch reads (`plan_get`: `StepPlan.get`'s
    arguments, `plan_buf`), the plan's item count (or its capacity, `cap`, where only the
    device knows it) times `h_kv`; in Triton's interpreter without one (`host_grid`), the item
    count of the host's lengths. `sem_numel`: the counters the decode launch's fused merge
    takes from the call's stream (`ops.prepared.semaphores`; 0: none)."""

    __slots__ = (
        "launches", "inputs", "aligned", "device", "index", "out_shape", "dtype", "lse_shape",
        "return_lse", "parts", "ws_numel", "grid_at", "plan_get", "plan_buf", "cap", "h_kv",
        "host_grid", "fast", "sem_numel",
    )  # fmt: skip

    def __call__(self, src: list, plan: StepPlan | None = None):
        """The call's result, or MISS where a pointer's 16-byte residue differs from the
        prepared call's (Triton specialized on it) or the step plan's answer is of the other
        kind (a buffer, or the kernels' own list) than the prepared launch's."""
        grid = None
        if self.plan_get is not None:
            rows, bn, target, min_blocks = self.plan_get
            buf, n = plan.get(src[3], rows, block_n=bn, target=target, min_blocks=min_blocks)
            if (buf is not None) != self.plan_buf:
                return MISS
            if buf is not None:
                src[_PLAN] = buf
                grid = ((self.cap if n is None else n) * self.h_kv, 1, 1)
        P = read_pointers(src, self.inputs, self.aligned, len(SOURCES))
        if P is None:
            return MISS
        dev, index = self.device, self.index
        stream = current_stream(index)
        if self.sem_numel:
            sem = src[_SEM] = semaphores(dev, stream, self.sem_numel)
            P[_SEM] = sem.data_ptr()
        out = src[_OUT]
        if out is None:
            out = src[_OUT] = torch.empty(self.out_shape, dtype=self.dtype, device=dev)
            P[_OUT] = out.data_ptr()
        lse = None
        if self.return_lse:
            lse = src[_LSE] = torch.empty(self.lse_shape, dtype=torch.float32, device=dev)
            P[_LSE] = lse.data_ptr()
        if self.ws_numel:
            place_parts(self.parts, self.ws_numel, src, P, dev, index, stream, not self.fast)
        at = self.grid_at
        if self.fast and hooks_idle():
            for j, x in enumerate(self.launches):
                if j == at and grid is not None:
                    x.fast(stream, P, grid)
                else:
                    x.fast(stream, P)
        else:
            if at >= 0 and grid is None and self.host_grid is not None:
                # Triton's interpreter: the host's lengths
                h_kv, rows, mask_code, mask_param, block_n, target, min_blocks = self.host_grid
                items = host_item_count(
                    src[3][:rows], src[1][: rows + 1], mask_code, mask_param, block_n=block_n,
                    target=target, min_blocks=min_blocks,
                )  # fmt: skip
                grid = (items * h_kv,)
            for j, x in enumerate(self.launches):
                x.run(stream, P, src, grid if j == at else None)
        return (out, lse) if self.return_lse else out


class PreparedMHA:
    """`pagedattn.mha`'s prepared calls (`ops.prepared`): every plan (decode with its split-K
    or balanced combine, prefill and chunked prefill, a mixed step's two parts, with or
    without a step plan), keyed by `_signature`. A call whose launches cannot be prepared (an
    argument the launcher copies: a q, mask tensor or sinks that is not contiguous; two
    arguments sharing memory) keeps the full path: its signature is stored as UNPREPARED so
    that it is not prepared again.

    `__call__(...)` (the lookup, `mha`'s arguments): the result of a hit, or MISS /
    UNPREPARED. `prepare(...)`: the full path of a validated call, prepared on the way.
    `cache`: the bounded `PreparedCache` (at most capacity x per_key entries, 512 by default;
    an entry holds generated launch code and shapes, no tensor)."""

    def __init__(self, capacity: int = 128, per_key: int = 4) -> None:
        self.cache = PreparedCache(capacity, per_key)

    def __call__(self, q, k, v, q_row_offsets, mask, scale, sinks, num_partitions, return_lse,
                 out, backend, num_decodes=None, plan=None):  # fmt: skip
        try:
            key, src = _signature(
                q, k, v, q_row_offsets, mask, scale, sinks, num_partitions, return_lse, out,
                backend, num_decodes, plan,
            )  # fmt: skip
        except Exception:  # arguments the signature cannot read: the full path reports them
            return MISS
        return self.cache.lookup(key, src, plan)

    def prepare(self, q, k, v, q_row_offsets, mask, scale, sinks, num_partitions, return_lse,
                out, backend, resolved_mask: Mask, num_decodes=None, plan=None):  # fmt: skip
        """The Triton full path (`mha_triton`, or `mha_mixed_triton` with num_decodes) of a
        call `mha` validated (mask: as the caller gave it, resolved_mask: None resolved to
        causal), its launches prepared and stored."""
        kwargs = dict(
            mask=resolved_mask, scale=scale, sinks=sinks, num_partitions=num_partitions,
            return_lse=return_lse, out=out, plan=plan,
        )  # fmt: skip
        try:
            key, src = _signature(
                q, k, v, q_row_offsets, mask, scale, sinks, num_partitions, return_lse, out,
                backend, num_decodes, plan,
            )  # fmt: skip
            guarded = guard_call(key, src, _guarded(src))
        except Exception:  # (not expected of a validated call) not prepared
            guarded = None
        nd = 0 if num_decodes is None else num_decodes
        if guarded is None:
            return _mixed_path(q, k, v, q_row_offsets, nd, **kwargs)[0]
        guard, pick = guarded
        with recording() as made:
            res, rans = _mixed_path(q, k, v, q_row_offsets, nd, **kwargs)
        made = [m for m in made if m.kernel is not _plan_kernel]  # (the step plan's own)
        expected = sum(_expected_launches(r) for r in rans)
        if expected == 0:  # nothing launched (an empty batch)
            self.cache.store(key, guard, pick, None)
        elif len(made) == expected:  # (fewer: an offline capture replaced `launch`)
            outs = res if return_lse else (res, None)
            entry = _prepare_call(made, src, rans, outs, out is not None, resolved_mask)
            self.cache.store(key, guard, pick, entry)
        return res


def _expected_launches(ran: _Ran) -> int:
    """The launches a full-path part makes through `ops.launch.launch`."""
    how = ran.how
    if how is None:
        return 0
    if isinstance(how, DecodePlan):
        if how.target > 0:
            return 1 if ran.sem is not None else 2
        return 2 if how.num_partitions > 1 else 1
    return 1


def _prepare_call(made, src: list, rans: list, outs: tuple, out_given: bool, mask: Mask):
    """The `_PreparedCall` of a call's recorded launches `made` (src: the call's sources;
    rans: what each part ran; outs: the call's (out, LSE or None)), or None where they cannot
    be prepared."""
    out, lse = outs
    src[_OUT], src[_LSE] = out, lse
    dec = next((r for r in rans if isinstance(r.how, DecodePlan)), None)
    if dec is not None and dec.po is not None:
        src[_PO], src[_PL] = dec.po, dec.pl
    if dec is not None and dec.sem is not None:
        src[_SEM] = dec.sem
    plan_buf = dec is not None and dec.plan_buf is not None
    if plan_buf:  # the buffer the full path's launch read
        src[_PLAN] = dec.plan_buf
    launches = [PreparedLaunch.build(m, src, descriptors=True) for m in made]
    if any(p is None for p in launches) or len({p.compiled for p in launches}) != 1:
        return None
    e = _PreparedCall()
    e.launches = tuple(launches)
    e.fast = all(p.fast is not None for p in launches)
    fresh = {_LSE, _PO, _PL, _SEM} | (set() if out_given else {_OUT})
    e.inputs = tuple(sorted(set().union(*(p.sources for p in launches)) - fresh))
    e.aligned = pointer_residues(src, e.inputs)
    q = src[0]
    e.device, e.index = q.device, current_device(q)
    e.out_shape, e.dtype = tuple(out.shape), out.dtype
    e.return_lse = lse is not None
    e.lse_shape = tuple(lse.shape) if lse is not None else None
    e.parts, e.ws_numel = (), 0
    e.grid_at, e.plan_get, e.plan_buf, e.cap, e.host_grid = -1, None, False, 0, None
    e.h_kv = src[2].shape[1]
    e.sem_numel = 0 if dec is None or dec.sem is None else dec.rows * e.h_kv
    if dec is None:
        return e
    how = dec.how
    if plan_buf:  # the plan's capacity: its item count varies with the lengths
        e.cap = plan_capacity(dec.rows, how.target)
    if dec.po is not None:  # (with a plan's buffer: room for its capacity of items)
        rows = (e.cap,) if plan_buf else ()
        e.parts, e.ws_numel = workspace_layout([
            (i, rows + tuple(t.shape[len(rows):]), torch.float32)
            for i, t in ((_PO, dec.po), (_PL, dec.pl))
        ])  # fmt: skip
    if how.target > 0:
        e.grid_at = 0  # the decode part launches first
        e.plan_get, e.plan_buf = dec.plan_key, plan_buf
        if not plan_buf and not launches[0].compiled:
            e.host_grid = (e.h_kv, dec.rows, mask.code, mask.param, how.config.BLOCK_N,
                           how.target, how.min_blocks)  # fmt: skip
    return e


#: The prepared calls of `pagedattn.mha` (one per process; bounded, see PreparedCache).
PREPARED = PreparedMHA()
