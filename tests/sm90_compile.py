"""Compile, offline for sm_90, every kernel specialization that the GPU tests launch on an H100
(and the MHA decode's and some of the rope-aware FP8 MLA's on an H200).

- dense, sparse: the MLA grid (`test_triton_mla.test_gpu_grid`): every cache format x h_q
  {1, 16, 20, 64, 128} x s_q {1, 2, 4} x page size {1, 16, 64, 128}, with the grid's batch
  (cache lengths 700 and two shorter), sinks, sparse index stride and partition count; and
  rope-aware FP8 at (h_q, page) `H200_MLA_CASES`, s_q 1, as on an H200;
- persistent: `test_triton_mla.test_gpu_v32_persistent_kernel`'s cases (the opt-in persistent
  sparse V32 kernel, `gluon_mla_ps`);
- pages: the V32 cluster kernel (h_q 128, dense and sparse) at page sizes that are not powers
  of two, which its producer takes as a run-time value (`triton_mla_plan._page_size_constexpr`;
  the grid's page sizes are all powers of two);
- balanced: the MLA decode a serving engine gets (no partition count: the balanced work list,
  its contiguous runs and the TMA-fed seesaw's, `test_mla_worklist`'s GPU cases) and its
  combine (the runs', the item list's, split-K's where a kernel keeps a partition count):
  BF16 and rope-aware FP8 pages of 64, h_q {16, 128}, one or two queries a request, skewed
  lengths, with and without sinks, under the shipped tuning, the runs forced, the item list
  forced and the seesaw's runs;
- mha: `test_triton_mha`'s GPU cases: decode over pages {1, 16, 64} for every K/V format and
  head dims {64, 96, 128} (split-K and its combine too; also with an H200's stages and
  split), and the Gluon sm_90 prefills' over paged caches, row offsets and ragged K/V, every
  range mask, sinks and the LSE, with the launch configurations the tests force; and steps
  with a work plan (`StepPlan` from host lengths or the device planner's), decode only and
  mixed (`mha_mixed_triton`), as an engine's eager steps launch them;
- layers: the decoder layers' ops as the models launch them (`ops.fused`: RMSNorm, RoPE,
  silu * up, the greedy argmax and the draw; `ops.store_kv`: store_kv for each K/V format and
  the fused RoPE + store), Llama-3.2-1B and Llama-3-8B head shapes, Qwen3's head norm.

Run without TRITON_INTERPRET (the interpreter does not compile; `test_sm90_compile` runs
this file in a subprocess): `python tests/sm90_compile.py
[dense|sparse|persistent|pages|balanced|mha|layers] [--full] [--every]`. Each
launch is captured as an H100 would make it (`ops.offline.capture`, with
`triton_mla_plan.sm90_serves` for the device check, and PDL on: `ops.pdl.pdl_as_on_sm90`;
before 2026-12-02 the CPU captures had PDL off, variants no GPU launches); each
distinct specialization (with
--every), or a pairwise covering set of each kernel's (`pairwise_cover`, by default), goes
through the front end (`ops.offline.front_end`), or with --full through ptxas too. Prints one JSON
line: {"cases", "kernels": {name: specializations}, "errors": [{case, kernel, error, cause}]}.
"""

from __future__ import annotations

import itertools
import json
import sys
import traceback
from contextlib import nullcontext
from functools import partial
from unittest.mock import patch

import torch
from oracles import PS_CASES  # tests/ (this script's folder) is on sys.path

from pagedattn import (
    ContinuousBatchingOperand,
    KVCacheParams,
    KVQuantConfig,
    PagedOperand,
    RaggedOperand,
)
from pagedattn.cache.dispatch import num_sms
from pagedattn.ops import masks, offline
from pagedattn.ops.mha import triton_combine as MC
from pagedattn.ops.mha import triton_mha as TM
from pagedattn.ops.mha import triton_worklist as WL
from pagedattn.ops.mha import work_plan as WP
from pagedattn.ops.mha.selection import Device, MHATuning
from pagedattn.ops.mha.step_plan import StepPlan
from pagedattn.ops.mla import triton_mla as M
from pagedattn.ops.mla import triton_mla_combine as MLA_C
from pagedattn.ops.mla import tuning as mla_tuning
from pagedattn.ops.mla import worklist as MLA_WL
from pagedattn.ops.pdl import pdl_as_on_sm90
from pagedattn.testing import make_paged_cache, ragged_offsets

E8M0 = torch.float8_e8m0fnu
FORMATS = {  # test_triton_mla.FORMATS: name -> (quantization, d_qk values)
    "bf16": (lambda: None, (576, 512)),
    "fp8_g64_f32": (lambda: KVQuantConfig.blockwise(64), (576, 512)),
    "fp8_g64_e8m0": (lambda: KVQuantConfig.blockwise(64, E8M0), (576, 512)),
    "fp8_g128_e8m0": (lambda: KVQuantConfig.blockwise(128, E8M0), (512,)),
    "fp8_g192_f32": (lambda: KVQuantConfig.blockwise(192), (576,)),
    "fp8_token_f32": (lambda: KVQuantConfig.per_token(), (576, 512)),
    "fp8_per_tensor": (lambda: KVQuantConfig.per_tensor(), (576, 512)),
    "rope_aware": (lambda: KVQuantConfig.mla_rope_aware(), (576, 512)),
    "v32": (lambda: KVQuantConfig.flashmla_v32(), (576,)),
    "model1": (lambda: KVQuantConfig.flashmla_model1(), (512,)),
}


# Where the cases' tensors live. "cpu": launches captured as an H100 would make them (the
# dispatchers' device checks left out); "cuda" (test_sm90_compile's GPU test, under
# `torch.device("cuda")`): the device's own dispatch.
DEVICE = "cpu"


# The chip the MHA cases are captured as: False an H100, True an H200 (whose decode takes other
# stages and splits, `cache.dispatch.fast_hbm`); test_sm90_compile's GPU test sets the device's.
CHIP_H200 = False


def as_on_h100(**serves):
    """The capture patches that stand in for the device checks on the CPU (none on a GPU)."""
    return serves if DEVICE == "cpu" else {}


def chip(h200=None):
    """The `fast_hbm` patch of a capture as on an H100, or an H200 (h200 True; None:
    CHIP_H200)."""
    h200 = CHIP_H200 if h200 is None else h200
    return dict(fast_hbm=lambda device: h200)


def mla_operand(fmt, d_qk, h_q, ps, cache_lens, q_lens):
    """A paged MLA cache operand (layer 1 of 2) in format `fmt`, pages of ps."""
    params = KVCacheParams(
        torch.bfloat16, 2, 1, d_qk, ps, is_mla=True, num_q_heads=h_q,
        quantization=FORMATS[fmt][0](), mla_rope_dim=64,
    )  # fmt: skip
    pc = make_paged_cache(params, cache_lens, q_lens, device=DEVICE)
    return PagedOperand(pc.inputs, params, 1, "k")


def capture_mla(q, kv, q_lens, kw, h200=None):
    """The launches of `mla_decode_triton(q, kv, ...)` as an H100 would make them, or as an
    H200 (h200 True; None: CHIP_H200), whose rope-aware FP8 kernel keeps more ring stages."""
    offs = ragged_offsets(q_lens, DEVICE)
    return offline.capture(
        M,
        lambda: M.mla_decode_triton(q, kv, offs, **kw),
        mla_combine_triton=lambda *a, **k: None,
        mla_worklist_combine_triton=lambda *a, **k: None,
        mla_runs_combine_triton=lambda *a, **k: None,
        **as_on_h100(_use_sm90_path=M.sm90_serves, **chip(h200)),
    )


def grid_launches(mode, fmt, d_qk, h_q, s_q, ps, h200=None):
    """The launches of the grid case (`test_triton_mla._gpu_case`'s shapes; values random),
    as on an H100 or H200 (`capture_mla`)."""
    q_lens = [s_q] * 3
    kv = mla_operand(fmt, d_qk, h_q, ps, [700, 399, 17], q_lens)
    q = torch.randn(3 * s_q, h_q, d_qk).to(torch.bfloat16)
    kw = dict(attn_sink=torch.randn(h_q), num_partitions=1 + (h_q + s_q + ps) % 4)
    if mode == "sparse":
        kw.update(
            indices=torch.randint(-1, 700, (3 * s_q, 160), dtype=torch.int32),
            topk_lengths=torch.tensor([160, 100, 0], dtype=torch.int32),
        )
    return capture_mla(q, kv, q_lens, kw, h200)


def persistent_launches(batch, s_q, stride, h_q, order):
    """The launches of `test_gpu_v32_persistent_kernel`'s case (values random): V32 pages of
    64, per-request top-k lengths (the width, a third of it, 0), a sink; the kernel forced
    (`MLATuning` ss_persist) with work order `order` (ps_order)."""
    q_lens = [s_q or 1 + b % 3 for b in range(batch)]
    kv = mla_operand("v32", 576, h_q, 64, [(700 + 37 * b) % 1500 for b in range(batch)], q_lens)
    n = sum(q_lens)
    q = torch.randn(n, h_q, 576).to(torch.bfloat16)
    topk = [(stride, stride // 3, 0)[b % 3] for b in range(batch)]
    kw = dict(
        attn_sink=torch.randn(h_q), num_partitions=1,
        indices=torch.randint(-1, 700, (n, stride), dtype=torch.int32),
        topk_lengths=torch.tensor(topk, dtype=torch.int32),
        config=mla_tuning.from_env().replace(ss_persist=True, ps_order=order),
    )  # fmt: skip
    return capture_mla(q, kv, q_lens, kw)


PAGES_NOT_POW2 = (3, 48, 200)  # the "pages" suite's page sizes
H200_MLA_CASES = ((1, 1), (16, 64))  # (h_q, page) of the grid's rope-aware cases as on an H200


BALANCED_TUNINGS = {  # name -> `MLATuning` knobs of the "balanced" suite
    "shipped": {}, "runs": {"wl_one_wave": False}, "items": {"wl_runs": False},
    "st-runs": {"wl_st_runs": True}, "xseg": {"wl_one_wave": False, "wl_xseg": True},
}  # fmt: skip


def balanced_launches(fmt, h_q, s_q, tune, sink):
    """The launches of a balanced decode step (no partition count) of six requests of skewed
    lengths, pages of 64, as on an H100, its combine included (the runs' or the item list's,
    `worklist`; split-K's where the kernel keeps a partition count; `capture_mla` leaves the
    combines out)."""
    q_lens = [s_q] * 6
    kv = mla_operand(fmt, 576, h_q, 64, [3000, 50, 700, 9000, 1, 20000], q_lens)
    q = torch.randn(6 * s_q, h_q, 576).to(torch.bfloat16)
    kw = dict(config=mla_tuning.from_env().replace(**BALANCED_TUNINGS[tune]))
    if sink:
        kw["attn_sink"] = torch.randn(h_q)
    offs = ragged_offsets(q_lens, DEVICE)
    # the item list's combine sizes its grid as for lengths on the device (on the CPU it
    # reads them: `worklist._lengths_on_host`)
    on_gpu = patch.object(MLA_WL, "_lengths_on_host", lambda t: False)
    with on_gpu if DEVICE == "cpu" else nullcontext():
        return offline.capture(
            (M, MLA_WL, MLA_C), lambda: M.mla_decode_triton(q, kv, offs, **kw),
            **as_on_h100(_use_sm90_path=M.sm90_serves, **chip()),
        )  # fmt: skip


def mla_cases(mode):
    """(name, launches thunk) of the MLA grid's cases in `mode` (or the persistent kernel's,
    or the balanced decode's)."""
    if mode == "balanced":
        for fmt in ("bf16", "rope_aware"):
            for h_q in (16, 128):
                for s_q in (1, 2):
                    for i, tune in enumerate(BALANCED_TUNINGS):
                        sink = (i + s_q) % 2 == 0
                        yield (
                            f"balanced-{fmt} h_q {h_q} s_q {s_q} {tune} sink {sink}",
                            partial(balanced_launches, fmt, h_q, s_q, tune, sink),
                        )
        return
    if mode == "persistent":
        for batch, s_q, stride in PS_CASES:
            for h_q in (100, 128):
                for order in (1, 0):
                    yield (
                        f"persistent b {batch} s_q {s_q} width {stride} h_q {h_q} order {order}",
                        partial(persistent_launches, batch, s_q, stride, h_q, order),
                    )
        return
    if mode == "pages":
        for m in ("dense", "sparse"):
            for ps in PAGES_NOT_POW2:
                for s_q in (1, 2):
                    yield (
                        f"{m}-v32-576 h_q 128 s_q {s_q} page {ps}",
                        partial(grid_launches, m, "v32", 576, 128, s_q, ps),
                    )
        return
    for fmt, (_, dims) in FORMATS.items():
        for d_qk in dims:
            for h_q in (1, 16, 20, 64, 128):
                for s_q in (1, 2, 4):
                    for ps in (1, 16, 64, 128):
                        yield (
                            f"{mode}-{fmt}-{d_qk} h_q {h_q} s_q {s_q} page {ps}",
                            partial(grid_launches, mode, fmt, d_qk, h_q, s_q, ps),
                        )
    # on an H200: the rope-aware FP8 kernel's other ring stages (`triton_mla_plan._sm90_t_config`)
    for h_q, ps in H200_MLA_CASES:
        yield (
            f"{mode}-rope_aware-576 h_q {h_q} s_q 1 page {ps} H200",
            partial(grid_launches, mode, "rope_aware", 576, h_q, 1, ps, True),
        )


def mha_launches(k, v, q_lens, h_q, d, over=None, h200=None, decode=None, num_decodes=None,
                 **kw):  # fmt: skip
    """The launches of `mha_triton` over operands k, v (the split-K combine's, the work list's
    combine and a step plan's planner too), with the prefill tuning overrides `over` and the
    decode ones `decode` (`selection.MHATuning`) and the Gluon sm_90 prefill as on an H100, or
    as on an H200 (h200 True; None: CHIP_H200); a mixed step's (`mha_mixed_triton`) where
    `num_decodes` is given."""
    offs = ragged_offsets(q_lens, DEVICE)
    q = torch.randn(int(offs[-1]), h_q, d).to(torch.bfloat16)
    tuning = MHATuning(decode=decode or {}, prefill=over or {})
    hbm3e = CHIP_H200 if h200 is None else h200

    def call():
        if num_decodes is None:
            TM.mha_triton(q, k, v, offs, config=tuning, **kw)
        else:
            TM.mha_mixed_triton(q, k, v, offs, num_decodes, config=tuning, **kw)

    return offline.capture(
        (TM, WL, MC, WP), call,
        **as_on_h100(device_facts=lambda device: Device(True, num_sms(device), hbm3e)),
    )  # fmt: skip


def paged(page, h_kv, d, cache_lens, q_lens, quant=None):
    params = KVCacheParams(
        torch.bfloat16, 2, h_kv, d, page, quantization=quant
    )  # fmt: skip
    inputs = make_paged_cache(params, cache_lens, q_lens, device=DEVICE).inputs
    return PagedOperand(inputs, params, 1, "k"), PagedOperand(inputs, params, 1, "v")


MASKS = {
    "null": masks.null(), "causal": masks.causal(), "swc70": masks.sliding_window_causal(70),
    "swn33": masks.sliding_window_noncausal(33), "chunk128": masks.chunked_causal(128),
}  # fmt: skip
# test_triton_mha's forced Gluon prefill configurations
PREFILL_CONFIGS = [
    {}, dict(g_ws=False), dict(g_ws=False, g_BLOCK_N=128, g_NBUF=3),
    dict(g_ws=False, g_num_warps=4, g_BLOCK_N=64, g_NBUF=3), dict(g_ws=False, g_tma=False),
    dict(g_ws=False, g_num_warps=4, g_NBUF=3), dict(g_BLOCK_N=128, g_NBUF=3),
    dict(g_BLOCK_N=64, g_NBUF=4), dict(g_ws=True, g_BLOCK_N=64, g_NBUF=4),
    dict(g_ws=True, g_BLOCK_N=128, g_NBUF=2),
]  # fmt: skip


def planned_launches(host: bool, decodes: int, chunks: int):
    """The launches of a step with a work plan (`StepPlan`: from host lengths, else the
    device planner's launch too) as the chip CHIP_H200 names makes them: `decodes` skewed
    decode rows, then `chunks` prefill chunks of 40 queries (`mha_mixed_triton`) where
    chunks > 0."""
    cl = [3000, 17, 900, 64, 20000, 5, 1200, 300][:decodes] + [200] * chunks
    ql = [1] * decodes + [40] * chunks
    return mha_launches(
        *paged(16, 8, 128, cl, ql), ql, 32, 128, num_decodes=decodes if chunks else None,
        plan=StepPlan(cl if host else None),
    )  # fmt: skip


def decode_launches(page, h_q, h_kv, d, quant, P, h200=None, decode=None):
    """A decode step of three requests (cache lengths 4096, 5, 700) at P partitions (None:
    the split the device's heuristic picks), as on an H100 or (h200) an H200."""
    k, v = paged(page, h_kv, d, [4096, 5, 700], [1, 1, 1], quant)
    return mha_launches(k, v, [1, 1, 1], h_q, d, h200=h200, decode=decode, num_partitions=P)


def prefill_case(page, h_q, h_kv, d, mask_name, over, lse):
    """(name, launches thunk) of a paged chunked prefill (test_triton_mha's
    `_paged_prefill_case` batch) with sinks; `over` forces a Gluon configuration unless it is
    the tl kernel's (gluon False) or empty (the served choice)."""
    forced = dict(gluon=True, **over) if over and "gluon" not in over else over
    return (
        f"mha prefill page {page} {h_q}/{h_kv} d {d} {mask_name} {over} lse {lse}",
        lambda: mha_launches(
            *paged(page, h_kv, d, [0, 300, 23, 5, 129], [277, 6, 1, 0, 140]),
            [277, 6, 1, 0, 140], h_q, d, forced, mask=MASKS[mask_name],
            sinks=torch.randn(h_q), return_lse=lse,
        ),
    )  # fmt: skip


def mha_cases():
    """(name, launches thunk) of test_triton_mha's GPU cases (see the module docstring)."""
    quants = {
        "bf16": None, "token": KVQuantConfig.per_token(), "g32": KVQuantConfig.blockwise(32),
        "tensor": KVQuantConfig.per_tensor(),
    }  # fmt: skip
    for page in (1, 16, 64):
        for d in (64, 96, 128):
            for qn, quant in quants.items():
                for h_q, h_kv in ((32, 8), (8, 1), (4, 4)):
                    for P in (1, 3):
                        yield (
                            f"mha decode {qn} page {page} d {d} {h_q}/{h_kv} P {P}",
                            partial(decode_launches, page, h_q, h_kv, d, quant, P),
                        )
                    # on an H200: other pipeline stages (the heuristic's split)
                    yield (
                        f"mha decode {qn} page {page} d {d} {h_q}/{h_kv} H200",
                        partial(decode_launches, page, h_q, h_kv, d, quant, None, True),
                    )
    # a step's work plan (host lengths, or the device planner), decode only and mixed, as an
    # engine's eager steps pass it (`mha(plan=StepPlan(...))`)
    for host in (True, False):
        for decodes, chunks in ((8, 0), (6, 2)):
            yield (
                f"mha planned {'host' if host else 'device'} {decodes} decodes {chunks} chunks",
                partial(planned_launches, host, decodes, chunks),
            )
    # the balanced decode with the combine launch instead of its fused merge (the shipped
    # form is the H200 cases above)
    yield (
        "mha decode bf16 page 16 d 128 32/8 H200 combine launch",
        partial(decode_launches, 16, 32, 8, 128, None, None, True, {"fused_merge": False}),
    )
    shapes = [(16, 8, 2, 64), (1, 4, 4, 128), (64, 8, 1, 128), (128, 8, 2, 64), (8, 4, 1, 64),
              (32, 8, 8, 128), (128, 4, 4, 128), (16, 8, 2, 128)]  # fmt: skip
    tl, ws = dict(gluon=False), PREFILL_CONFIGS[-2:]  # the tl kernel; warp-specialized ones
    forced_shapes = ((16, 8, 2, 128), (64, 8, 1, 128))  # also the other forced configurations
    for page, h_q, h_kv, d in shapes:
        for mn in MASKS:
            for over in ({}, tl, *ws):  # the served choice, the tl kernel, forced ws configs
                yield prefill_case(page, h_q, h_kv, d, mn, over, True)
            if (page, h_q, h_kv, d) in forced_shapes and mn in ("null", "causal"):
                for over in PREFILL_CONFIGS[1:-2]:  # the other forced configurations
                    for lse in (False, True):
                        yield prefill_case(page, h_q, h_kv, d, mn, over, lse)
    rows = torch.full((5, 640, 2, 128), float("nan")).to(torch.bfloat16)
    slots, cl = torch.tensor([3, 0, 4, 1, 2], dtype=torch.int32), torch.tensor([0, 300, 23, 129, 5])
    cb = ContinuousBatchingOperand(rows, slots, cl.to(torch.int32))
    for mn, mask in MASKS.items():
        for i, over in enumerate(PREFILL_CONFIGS):
            yield (
                f"mha prefill row offsets {mn} config {i}",
                partial(mha_launches, cb, cb, [277, 6, 1, 140, 0], 8, 128,
                        dict(gluon=True, **over), mask=mask, sinks=torch.randn(8)),
            )  # fmt: skip
        for h_q, h_kv, d in ((32, 8, 128), (8, 8, 64)):
            kv = RaggedOperand(
                torch.randn(2 * 640, h_kv, d).to(torch.bfloat16), ragged_offsets([640, 640], DEVICE)
            )
            yield (
                f"mha prefill ragged {mn} {h_q}/{h_kv} d {d}",
                partial(mha_launches, kv, kv, [640, 640], h_q, d, mask=mask),
            )
        for d, dr in ((128, 64), (64, 32), (64, 16)) if mn == "causal" else ():
            # test_triton_mha's wider K (d_qk = d_v + dr), one mask: the CI's compile time
            xk = torch.full((5, 640, 2, d + dr), float("nan")).to(torch.bfloat16)
            k = ContinuousBatchingOperand(xk, slots, cl.to(torch.int32))
            v = ContinuousBatchingOperand(rows[..., :d].contiguous(), slots, cl.to(torch.int32))
            yield (
                f"mha prefill wider k {mn} d {d + dr}/{d}",
                partial(mha_launches, k, v, [277, 6, 1, 140, 0], 8, d + dr, dict(gluon=True),
                        mask=mask, sinks=torch.randn(8)),
            )  # fmt: skip


def layer_launches(call):
    """The launches of `call()` (ops through `cached_launch`: its fast path off, so each call
    goes through `ops.launch.launch`, which `offline.capture` records)."""
    from pagedattn.ops import prepared  # noqa: PLC0415

    return offline.capture(prepared, call, _fast_path=lambda kernel, grid: False)


def layer_cases():
    """(name, launches thunk) of the decoder layers' ops (module docstring): their Triton entry
    points, as the public ops call them on CUDA."""
    from pagedattn.ops.fused import triton_fused as F  # noqa: PLC0415
    from pagedattn.ops.moe import moe_block_m  # noqa: PLC0415
    from pagedattn.ops.moe import triton_moe as MOE  # noqa: PLC0415
    from pagedattn.ops.store_kv.triton_rope_store import rope_store_kv_triton  # noqa: PLC0415
    from pagedattn.ops.store_kv.triton_store import store_kv_triton  # noqa: PLC0415

    bf = torch.bfloat16
    for T, H in ((64, 2048), (5, 4096)):
        x, w = torch.randn(T, H).to(bf), torch.ones(H).to(bf)
        yield (
            f"rms_norm {T} x {H}",
            partial(layer_launches, lambda x=x, w=w: F.rms_norm_triton(x, w, 1e-5, x)),
        )
        gu = torch.randn(T, 2 * H).to(bf)
        yield f"silu_mul {T} x {H}", partial(layer_launches, lambda gu=gu: F.silu_mul_triton(gu))
    for n, V in ((64, 128256), (3, 1000)):  # spans and their merge; one program a row
        lg = torch.randn(n, V)
        yield (
            f"argmax_rows {n} x {V}",
            partial(layer_launches, lambda lg=lg: F.argmax_rows_triton(lg)),
        )
        t, sd = torch.rand(n), torch.zeros(n, dtype=torch.int64)
        yield (
            f"sample_rows {n} x {V}",
            partial(layer_launches, lambda lg=lg, t=t, sd=sd: F.sample_rows_triton(lg, t, sd, sd)),
        )
    # top-k / top-p: the keep threshold's chain of span passes (32-64 rows) and one program a
    # row (more rows; or a row of one span), as the engine's sampler calls them on an H200
    for n, V in ((1, 128256), (64, 128256), (300, 128256), (3, 1000)):
        lg, t = torch.randn(n, V), torch.rand(n)
        sd, k, p = torch.zeros(n, dtype=torch.int64), torch.full((n,), 50), torch.full((n,), 0.9)
        yield (
            f"sample_rows top_k top_p {n} x {V}",
            partial(layer_launches, lambda lg=lg, t=t, sd=sd, k=k, p=p:
                    F.sample_rows_triton(lg, t, sd, sd, 132, k, p)),
        )  # fmt: skip
    # routed experts (`ops.moe`): V2-Lite / V3 / gpt-oss decode, prefill chunks (64 / 128 rows)
    for T, k, E, H, inter, fp8 in ((64, 6, 64, 2048, 1408, False), (64, 8, 256, 7168, 2048, True),
                                   (512, 4, 32, 2880, 2880, False),
                                   (2048, 6, 64, 2048, 1408, False)):  # fmt: skip
        ids = torch.randint(0, E, (T, k))
        x = torch.randn(T, H).to(bf)
        wdt = torch.float8_e4m3fn if fp8 else bf
        wgu = torch.empty(1, 2 * inter, H, dtype=wdt).expand(E, -1, -1)  # one expert's memory
        wd = torch.empty(1, H, inter, dtype=wdt).expand(E, -1, -1)
        sgu = torch.ones(E, -(-2 * inter // 128), -(-H // 128)) if fp8 else None
        sd = torch.ones(E, -(-H // 128), -(-inter // 128)) if fp8 else None
        rw = torch.rand(T, k)

        def moe(ids=ids, x=x, wgu=wgu, wd=wd, sgu=sgu, sd=sd, rw=rw, E=E, k=k):
            plan = MOE.moe_plan_triton(ids, E, moe_block_m(ids.numel(), E))
            h = MOE.expert_matmul_triton(x, wgu, plan, w_scale=sgu, activation="silu_mul")
            y = MOE.expert_matmul_triton(h, wd, plan, w_scale=sd, row_weights=rw,
                                         out_dtype=torch.float32)  # fmt: skip
            MOE.moe_sum_triton(y, k, bf)

        yield (
            f"moe {T} x top-{k} of {E}, {H} / {inter}{' fp8' if fp8 else ''}",
            partial(layer_launches, moe),
        )
    # the decode graphs' first kernel (`engine.cuda_graphs.StepStaging`): with and without
    # the dispatch metadata words, tables of one block of columns and of several
    import pagedattn.ops.step_rows as SR  # noqa: PLC0415

    for rows, C, K in ((256, 64, 4), (8, 4100, 0)):
        L = SR.StagedRows(rows, C, K)
        i32, i64 = torch.int32, torch.int64
        bufs = (torch.zeros(rows, dtype=i32), torch.zeros(rows, C, dtype=i32),
                torch.zeros(rows, dtype=i64), torch.zeros(rows, dtype=i64),
                torch.zeros(rows, dtype=i64), torch.zeros(K, dtype=i64) if K else None,
                torch.zeros((), dtype=i32), torch.zeros(C, dtype=i32))  # fmt: skip
        stage = torch.zeros(L.size, dtype=i64)
        yield (
            f"unpack_step_rows {rows} x {C}, {K} meta words",
            partial(offline.capture, SR,
                    lambda L=L, bufs=bufs, stage=stage: SR.unpack_step_rows(stage, L, 4, *bufs, 9),
                    choose_backend=lambda device, backend=None: "triton"),
        )  # fmt: skip
    quants = {"bf16": None, "token": KVQuantConfig.per_token(), "g32": KVQuantConfig.blockwise(32)}
    for (h_q, h, d), page, norm in itertools.product(
        ((32, 8, 64), (32, 8, 128), (4, 1, 32)), (16, 5), (False, True)
    ):
        for qn, quant in quants.items():
            params = KVCacheParams(bf, 2, h, d, page, quantization=quant)
            inp = make_paged_cache(params, [40, 0, 17], [1, 1, 3]).inputs
            ops = (PagedOperand(inp, params, 1, "k"), PagedOperand(inp, params, 1, "v"))
            offs = ragged_offsets([1, 1, 3])
            qkv = torch.randn(5, (h_q + 2 * h) * d).to(bf)
            cs = torch.randn(5, d // 2).to(bf)
            nw = (torch.ones(d).to(bf), torch.ones(d).to(bf)) if norm else (None, None)
            tag = f"{h_q}/{h} d {d} page {page} {qn}{' qk_norm' if norm else ''}"

            def two(ops=ops, offs=offs, qkv=qkv, cs=cs, nw=nw, h_q=h_q, h=h):
                _, k, v = F.rope_qkv_triton(qkv, cs, cs, h_q, h, *nw, 1e-6)
                store_kv_triton(k, v, *ops, offs)

            yield f"rope_qkv + store_kv {tag}", partial(layer_launches, two)
            if quant is None:  # the fused launch serves plain caches
                yield (
                    f"rope_store_kv {tag}",
                    partial(
                        layer_launches,
                        lambda ops=ops, offs=offs, qkv=qkv, cs=cs, nw=nw, h_q=h_q, h=h: (
                            rope_store_kv_triton(qkv, cs, cs, h_q, h, *nw, 1e-6, *ops, offs)
                        ),
                    ),
                )


def features(src, opts: dict) -> set:
    """What a specialization (`offline.specialize`'s source and options) is made of, as (kind,
    name, value) items: its
    constexprs (ints equal to 1 included), its pointers' element types and its launch options.
    (Integer argument widths and alignment attributes are left out: they change no
    Python-level path of the front end; with them the covering sets were 15-25% larger.)"""
    f = {("c", str(k), repr(v)) for k, v in src.constants.items()}
    f |= {("s", str(k), str(v)) for k, v in src.signature.items() if str(v).startswith("*")}
    f |= {("o", k, repr(opts[k])) for k in ("num_warps", "num_stages", "num_ctas", "maxnreg")
          if k in opts}  # fmt: skip
    return f


def pairwise_cover(specs: list[set]) -> list[int]:
    """Indices of a subset of `specs` (each a set of features) holding every feature and every
    pair of features that some spec holds (greedy: the spec with the most uncovered items
    first, the earliest of equals): a strength-2 covering set."""
    items = [f | {(a, b) for a in f for b in f if a < b} for f in specs]
    need = set().union(*items) if items else set()
    chosen = []
    while need:
        best = max(range(len(items)), key=lambda i: (len(items[i] & need), -i))
        chosen.append(best)
        need -= items[best]
    return sorted(chosen)


def main(suites: list[str], full: bool, every: bool) -> None:
    """Compile the suites' distinct specializations: all of them with `every`, else a pairwise
    covering set of each kernel's (`pairwise_cover` of `features`: every value of every
    constexpr, pointer type and option, and every pair of them, that some specialization has;
    2026-12-02: the five MLA modes together 149 of 756, mha 158 of 546, layers 56 of 68)."""
    seen, by_kernel, cases = {}, {}, 0
    for suite in suites:
        cases_of = {"mha": mha_cases, "layers": layer_cases}.get(suite)
        for case, launches in cases_of() if cases_of else mla_cases(suite):
            cases += 1
            with pdl_as_on_sm90():
                made = launches()
            for launch in made:
                src, opts = offline.specialize(launch)
                key = (launch.name, src.hash(), json.dumps(opts, default=str))
                if key not in seen:
                    seen[key] = (case, launch, features(src, opts))
                    by_kernel.setdefault(launch.name, []).append(key)
    kernels, errors, compiled = {}, [], 0
    for name, keys in by_kernel.items():
        kernels[name] = len(keys)
        if not every:
            keys = [keys[i] for i in pairwise_cover([seen[k][2] for k in keys])]
        for key in keys:
            case, launch, _ = seen[key]
            compiled += 1
            try:
                (offline.compile_sm90 if full else offline.front_end)(launch)
            except Exception as e:  # noqa: BLE001 - collected, reported
                cause = e
                while cause.__cause__ is not None:
                    cause = cause.__cause__
                errors.append(dict(
                    case=case, kernel=launch.name,
                    error="".join(traceback.format_exception_only(e))[-1500:],
                    cause=str(cause)[-500:],
                ))  # fmt: skip
    print(json.dumps(dict(cases=cases, kernels=kernels, compiled=compiled, errors=errors)))


if __name__ == "__main__":
    args = sys.argv[1:]
    names = ("dense", "sparse", "persistent", "pages", "balanced", "mha", "layers")
    suites = [m for m in names if m in args]
    main(suites or list(names), "--full" in args, "--every" in args)
