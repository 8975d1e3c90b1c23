"""Triton MHA/GQA attention over any K/V operand: `mha_triton` (same contract as
`pagedattn.ops.mha.mha`, docs/ops.md).

Paths (chosen on the host from shapes only, never from device data):
- decode: every request has one query. Taken when `max_q_len == 1` or, with no hint, when
  `q.shape[0] == batch`. The decode kernel (`triton_decode`) runs one program per (query row,
  split-K partition, KV head) and finds each row's request itself, so it is also correct for a
  ragged batch that happens to have total_q == batch (it is only slower there).
- prefill / chunked prefill: everything else (`triton_prefill`), one program per (block of
  BLOCK_M query rows of one request, query head); never split along K. On sm_90, BF16/FP16
  K/V that cannot be read as 128-key TMA tiles (pages < 128) take the Gluon kernel of
  `gluon_prefill` instead (same grid and contract; `_use_sm90_prefill`).

Split-K (decode only): `num_partitions=None` uses `cache.dispatch.mha_num_partitions` with the
device's SM count and a host-side upper bound on the cache length that needs no device sync:
`lut.shape[1] * page_size` for paged operands, `rows.shape[0]` otherwise. P > 1 writes
[total_q, h_q, P, d_v] f32 partials + [total_q, h_q, P] LSEs to a workspace (sized from the
static P) that `triton_combine` merges, folding the sinks in.

Numerics: softmax in fp32 (log2 domain, the scale folded into one FMA per score; the scale
must be > 0). MMAs take bf16/fp16 operands with fp32 accumulation (IEEE fp32 dots for fp32
inputs). Decode carries P as a bf16 hi + lo pair through P @ V (free when memory-bound), which
keeps it within DESIGN.md's bf16 bounds; prefill rounds P to bf16 as FlashAttention does (up to
~2^-9 of |v|). FP8 K/V with per-token / per-tensor scales run fp16 MMAs (e4m3 is exact in
fp16, q is scaled by an exact power of two to fit); blockwise G < head_dim K/V are dequantized
to bf16 in registers (exact for e8m0 scales; float32 scales round like a bf16 cache unless the
config sets kv_lo). Launch configs: `decode_config` / `prefill_config` (H200 measurements).

No host sync and no data-dependent allocation: safe under CUDA-graph capture.
"""

from __future__ import annotations

import math
import os

import torch
import triton

from ...cache.dispatch import cuda_capability, fast_hbm, mha_num_partitions, num_sms
from ...errors import InvalidArgumentError, check
from ...operands import KernelArgs, RowOperand
from ..gluon_imports import GluonTensorDescriptor, nvmma_128b
from ..launch import launch
from ..masks import Mask, causal
from ..pdl import pdl_enabled
from . import gluon_prefill, gluon_prefill_ws
from .triton_combine import combine_triton
from .triton_decode import LOG2E_F, Q_BLOCK, Q_NONE, Q_TENSOR, Q_TOKEN, _mha_decode_kernel
from .triton_prefill import _mha_prefill_kernel

# Launch configurations, overridable (benchmarks and tests set these dicts; keys as returned by
# decode_config / prefill_config).
DECODE_OVERRIDE: dict = {}
PREFILL_OVERRIDE: dict = {}


def _pow2_floor(x: int) -> int:
    return 1 << (max(int(x), 1).bit_length() - 1)


# The FP8 per-token / per-tensor decode loop's default knobs (see `_fast_flags`; measured in
# `decode_config`). The e4m3 upcast is Triton's cast: inline PTX measured the same (0.5%).
FP8_FAST_LOOP = dict(fast=True, addr=2, clamp=True, v_delta=True, v_sel=False, v_perm=True,
                     gp_min=4, trans=True, k_cvt="tl", v_cvt="tl")  # fmt: skip


def decode_config(
    dk: int,
    dv: int,
    kv_bytes: int,
    kv_kind: str = "plain",
    ctas_per_sm: float = 0.0,
    page_size: int = 0,
    hbm3e: bool = False,
) -> dict:
    """Decode launch for K/V of `kv_kind`: "plain" (bf16/fp16/fp32), "fp8_cols" (FP8 with
    per-token or per-tensor scales: fp16 MMAs) or "fp8_block" (FP8 with G < head_dim scales).
    ctas_per_sm: the launch's programs over the SM count; page_size: the K cache's (0: rows);
    hbm3e: an H200-class device (`cache.dispatch.fast_hbm`).

    Stages on an H200 (2026-11-28, bench/gpu_mha_dev.py --stages, graph replays, 32/8 heads
    d128, record bench/results/h200_2026-11-28_mha_decode.json), 4 / 5: plain b64 ctx4096 p16
    269.2 / 250.2 us, p64 269.7 / 249.5, b128 ctx2048 276.9 / 256.1, b64 p1 276.9 / 256.8, b16
    ctx16384 (P 4) 277.6 / 257.0, so plain takes 5 there, whatever the grid (the H100's 4 at a
    full grid cost it 7-8%); fp8_cols 3 / 4 / 5: b64 p16 160.2 / 160.3 / 145.1, p64 158.8 /
    158.9 / 145.0, b16 (P 4) 168.7 / 168.8 / 149.7, b128 145.1 / 144.7 / 163.7, so 5 where
    the grid holds at most 4 CTAs a SM (3.9 there; 7.8 at b128).

    H200 measurements (bench/gpu_mha_dev.py, b64 x 4096 keys, 32/8 heads):
    - plain: BLOCK_N = ~16 KB of K+V per stage (32 keys at d128), 4 warps, 5 stages (the
      page-id load feeding the K/V loads takes two of them, leaving a double-buffered K/V
      tile): 250 us, 1.0 of copy. Small tiles keep ~5 CTAs per SM resident, so a 512-CTA grid
      runs in one wave; 64/128-key tiles lost 20-30% to a partial second wave. Head dims that
      pad (96 -> 128) run 2 warps (228 us vs 234 us). H100 (2026-11-22, 4 vs 5 stages, us):
      4 where the grid has >= 3 programs a SM and pages of >= 16 rows (b64 ctx4096 p16 370.0
      vs 372.9, p64 366.7 vs 369.5; b128 ctx2048 367.0 vs 369.1), else 5 (b16 ctx16384 p64
      at P=2, 2 a SM: 442.5 vs 368.5; b64 p1: 379.1 vs 375.2).
    - fp8_cols: 64 keys, 2 warps: 209 us (4 warps 337 us, 8 warps 346-374 us). H100, round 4
      (2026-11-21, bf16 358 us at the four README shapes): the fast loop with keys as the
      MMA's M ("trans"), one page id a tile, V addressed from K, column-permuted V, 4 padded
      query heads, 4 stages: 190-197 us = 1.81-1.88x bf16 (the old loop 205-220 us, 1.63-1.75x;
      4 instead of 5 stages +3%; 1 or 4 warps, 32 or 128 keys and 2-4 partitions no better).
    - fp8_block: 64 keys, 4 warps, K/V dequantized to bf16 without a lo part (319 us; the
      hi + lo K/V pair costs 2x: 655 us), so float32-scaled blockwise K/V carry bf16 rounding
      (as a bf16 cache would); e8m0 scales dequantize exactly.
    hi_lo carries P as a hi + lo pair through the P @ V MMA; kv_lo does the same for
    float32-scaled blockwise K/V. fp8_cols knobs (`_fast_flags`; launches the fast loop does
    not serve fall back to the general one): fast, addr, clamp, v_delta, k_cvt, v_cvt, v_sel,
    v_perm, trans, and gp_min (the padded query-head tile, 16 by default)."""
    if kv_kind == "fp8_cols":
        stages = 5 if hbm3e and ctas_per_sm <= 4 else 4
        cfg = dict(BLOCK_N=64, num_warps=2, num_stages=stages, tma=False, hi_lo=True,
                   kv_lo=False, **FP8_FAST_LOOP)  # fmt: skip
    elif kv_kind == "fp8_block":
        cfg = dict(BLOCK_N=64, num_warps=4, num_stages=5, tma=False, hi_lo=True, kv_lo=False)
    else:
        block_n = max(16, min(128, _pow2_floor(16 * 1024 // ((dk + dv) * kv_bytes))))
        padded = dk != triton.next_power_of_2(dk) or dv != triton.next_power_of_2(dv)
        full_grid = ctas_per_sm >= 3 and (page_size == 0 or page_size >= 16)
        stages = 4 if full_grid and not hbm3e else 5
        cfg = dict(BLOCK_N=block_n, num_warps=2 if padded else 4, num_stages=stages,
                   tma=False, hi_lo=True, kv_lo=False)  # fmt: skip
    cfg.update(DECODE_OVERRIDE)
    return cfg


def prefill_config(dk_pad: int, dv_pad: int, q_bytes: int, tma_ok, fp8: bool = False) -> dict:
    """Prefill launch (BLOCK_M queries x BLOCK_N keys). `tma_ok(block_n)` says whether K/V
    tiles of that many keys can be TMA boxes (tiles inside one page); 128-key TMA tiles are
    fastest, then 64-key TMA tiles, then 64-key pointer gathers (H200 measurements).
    blocks_fastest orders the grid (request, head, block) instead of (request, block, head):
    H100 2026-11-21, causal 8 x 4096, 32 heads d128: 436 vs 417 TFLOP/s in the same run (the
    blocks of one head share K/V in L2)."""
    d = max(dk_pad, dv_pad)
    if q_bytes >= 4:
        cfg = dict(BLOCK_M=64, BLOCK_N=32, num_warps=4, num_stages=2)
    elif fp8 and d <= 128:  # the upcasts need registers: 163 vs 150 TFLOP/s at 128 x 64
        cfg = dict(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=3)
    elif d <= 128:
        bn = 128 if tma_ok(128) else 64
        cfg = dict(BLOCK_M=128, BLOCK_N=bn, num_warps=8, num_stages=3)
    else:
        cfg = dict(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=2)
    cfg["tma"] = True
    cfg["hi_lo"] = False
    cfg["kv_lo"] = False
    cfg["blocks_fastest"] = True
    cfg.update(PREFILL_OVERRIDE)
    return cfg


def _use_sm90_prefill(q: torch.Tensor, ka: KernelArgs, va: KernelArgs, dk: int, dv: int,
                      mask: Mask) -> tuple[dict, bool] | None:  # fmt: skip
    """The `_sm90_prefill_plan` of the launch when a Gluon sm_90 prefill serves it, else None
    (`gluon_prefill_ws` where K/V tiles are TMA boxes, else `gluon_prefill`): BF16/FP16 K/V
    of q's dtype without quantization,
    d_qk == d_v in (64, 128), a range mask (not a tensor mask), 16-byte aligned rows; every
    paged cache, and ragged / row-offset K/V where the warp-specialized kernel applies (else
    the tl kernel). PREFILL_OVERRIDE["gluon"]: False forces the tl kernel, True a Gluon kernel
    wherever the shapes allow.

    H100 2026-11-22 (bench/gpu_mha_dev.py --prefill; causal 8 x 4096, 32/8 heads, d128, bf16,
    TFLOP/s, tl vs Gluon): ragged K/V 422 vs 509-515 (warp-specialized); pages of 16 317 vs 499
    (warp-specialized, a box a page), of 64 354 vs 509, of 128 406 vs 511."""
    if not q.is_cuda or cuda_capability(q.device) != (9, 0):
        return None
    return _sm90_prefill_serves(q, ka, va, dk, dv, mask)


def _sm90_prefill_serves(q: torch.Tensor, ka: KernelArgs, va: KernelArgs, dk: int, dv: int,
                         mask: Mask) -> tuple[dict, bool] | None:  # fmt: skip
    """`_use_sm90_prefill` on an sm_90 device (without its device check: `ops.offline`
    captures take it alone)."""
    want = PREFILL_OVERRIDE.get("gluon")
    if want is False or not gluon_prefill.HAS_GLUON:
        return None
    if PREFILL_OVERRIDE.get("hi_lo") or PREFILL_OVERRIDE.get("kv_lo"):
        return None  # P is rounded to q's dtype (no hi + lo pair)
    if not _sm90_prefill_shapes_ok(q, ka, va, dk, dv, mask):
        return None
    # Ragged / row-offset K/V: the warp-specialized kernel, or else the tl kernel.
    plan = _sm90_prefill_plan(ka, va)
    paged = ka.page_size > 0 and va.page_size > 0
    return plan if want is True or paged or plan[0]["ws"] else None


def _sm90_prefill_shapes_ok(q: torch.Tensor, ka: KernelArgs, va: KernelArgs, dk: int, dv: int,
                            mask: Mask) -> bool:  # fmt: skip
    """The device-independent part of `_use_sm90_prefill`."""
    ok = q.dtype in (torch.bfloat16, torch.float16) and dk == dv and dk in (64, 128)
    ok = ok and mask.kind != "tensor"
    for a in (ka, va):
        r = a.rows
        ok = ok and a.quant_format is None and r.dtype == q.dtype and r.stride(2) == 1
        ok = ok and r.stride(0) % 8 == 0 and r.stride(1) % 8 == 0 and r.data_ptr() % 16 == 0
    return bool(ok)


def _quant_code(ka: KernelArgs, head_dim: int) -> int:
    f = ka.quant_format
    if f is None:
        return Q_NONE
    if f == "per_tensor":
        return Q_TENSOR
    if f == "blockwise":
        return Q_TOKEN if ka.granularity in (0, head_dim) else Q_BLOCK
    raise InvalidArgumentError(
        f"mha: quant_format {f!r} is an MLA layout; mha reads plain, blockwise or per-tensor K/V"
    )


def _tma_ok(ka: KernelArgs, block_n: int) -> bool:
    """A [BLOCK_N, D] TMA box of the [rows, heads * D] view is usable: tiles stay in one page,
    D is a power of two <= 256, and the view is 16-byte aligned."""
    r = ka.rows
    d = r.shape[2]
    elem = r.element_size()
    return (
        (ka.page_size == 0 or ka.page_size % block_n == 0)
        and d == triton.next_power_of_2(d)
        and d >= 16
        and d <= 256
        and r.stride(2) == 1
        and r.stride(1) == d
        and (r.stride(0) * elem) % 16 == 0
        and r.data_ptr() % 16 == 0
    )


def _kv_launch_args(
    ka: KernelArgs, head_dim: int, tma_block_n: int | None, gluon_layout=None
) -> tuple[list, dict]:
    """Positional args (base, stride_r, stride_h, lut, stride_lut, row_offsets, page_stride) and
    the constexprs of one operand. With tma_block_n, base is a descriptor of [tma_block_n, D]
    boxes of the [rows, heads * D] view: a tl one, or a Gluon one in `gluon_layout`."""
    r = ka.rows
    check(r.stride(2) == 1, "K/V rows", "a last dim of stride 1", r.stride())
    base = r
    if tma_block_n is not None:
        from triton.tools.tensor_descriptor import TensorDescriptor

        view = [r, [r.shape[0], r.shape[1] * r.shape[2]], [r.stride(0), 1]]
        block = [tma_block_n, r.shape[2]]
        if gluon_layout is None:
            base = TensorDescriptor(*view, block)
        else:
            base = GluonTensorDescriptor(*view, block, gluon_layout)
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
    quant = _quant_code(ka, head_dim)
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


def _same_rows(ka: KernelArgs, va: KernelArgs, k_tma: bool, v_tma: bool) -> bool:
    """K and V tiles share their physical rows (same lookup table / offsets and load kind)."""
    if ka.page_size != va.page_size or k_tma != v_tma:
        return False
    if ka.page_size > 0:
        return ka.lut is va.lut and ka.page_stride_rows == va.page_stride_rows
    return ka.row_offsets is va.row_offsets


def _mma_flags(cfg: dict, prec: str, kcx: dict, vcx: dict) -> dict:
    """MMA operand constexprs.

    MMA_F16: FP8 K and V with per-token / per-tensor scales run fp16 MMAs (e4m3 is exact in
    fp16 and upcasts with one native cvt per pair; fp16 P keeps 11 bits, so no hi/lo split).
    Otherwise cfg["hi_lo"] carries P, and cfg["kv_lo"] float32-scaled blockwise K/V, as
    bf16/fp16 hi + lo pairs through the MMAs. Never for float32 inputs (IEEE dots)."""
    fp8_cols = (Q_TENSOR, Q_TOKEN)
    f16 = prec != "ieee" and kcx["QUANT"] in fp8_cols and vcx["QUANT"] in fp8_cols
    f16 = f16 and cfg.get("mma_f16", True)
    on = bool(cfg["hi_lo"]) and prec != "ieee"
    kv_lo = bool(cfg.get("kv_lo", False)) and prec != "ieee"
    return dict(
        P_SPLIT=on and not f16,
        MMA_F16=f16,
        K_LO=kv_lo and kcx["QUANT"] == Q_BLOCK and not kcx["E8M0"],
        V_LO=kv_lo and vcx["QUANT"] == Q_BLOCK and not vcx["E8M0"],
    )


def _storage_delta(a: torch.Tensor, b: torch.Tensor) -> int | None:
    """Element offset of view b from view a when both view one storage with equal strides and
    dtype (so that b's element at the same index is a's plus a constant), else None."""
    if a.dtype != b.dtype or a.stride() != b.stride() or a.device != b.device:
        return None
    if a.untyped_storage().data_ptr() != b.untyped_storage().data_ptr():
        return None
    return b.storage_offset() - a.storage_offset()


_CVT = {"tl": 0, "int": 1, "asm": 2}  # e4m3 -> fp16 upcast of the fast decode loop


def _fast_flags(
    cfg: dict, ka: KernelArgs, va: KernelArgs, dk: int, dv: int, kcx: dict, vcx: dict,
    tma: bool, mma_f16: bool,
) -> dict:  # fmt: skip
    """Constexprs of the decode kernel's FP8 fast loop (`_fp8_fast_loop`), from the launch
    config keys (all off by default):
    fast: use it (FP8 per-token / per-tensor K/V with fp16 MMAs, no TMA, K and V on one page
      table with the same power-of-two page size, or both unpaged, head dims powers of two);
    addr: 1 per-token page lookup (shift / mask), 2 one page id a tile (page % BLOCK_N == 0);
    clamp: unmasked loads of clamped token indices; v_delta: V (and V scale) addresses from
    K's plus a constant when both view one storage; k_cvt / v_cvt: e4m3 upcast "tl" (cast),
    "int" (integer ops, inline PTX) or "asm" (cvt.f16x2.e4m3x2 in inline PTX; both plain tl
    under the interpreter); v_sel: keep the V select (register upcast);
    v_perm: permute V's columns (and the output's) so that a thread's MMA operand columns are
    contiguous bytes (`_perm_cols`); trans: the transposed products (keys as the MMA's M)."""
    off = dict(FAST=False)
    if not cfg.get("fast", False) or not mma_f16 or tma:
        return off
    page = ka.page_size
    pow2 = all(x >= 16 and x == triton.next_power_of_2(x) for x in (dk, dv))
    if va.page_size != page or not pow2:
        return off
    if page > 0:
        if page & (page - 1) or ka.lut is not va.lut or ka.page_stride_rows != va.page_stride_rows:
            return off
        limit = 2**31 - 1
        for a in (ka, va):
            if a.page_stride_rows * a.rows.stride(0) > limit:
                return off
            if a.scales is not None and a.scales.ndim == 3:
                if a.page_stride_rows * a.scales.stride(0) > limit:
                    return off
    elif ka.row_offsets is not va.row_offsets:
        return off
    v_delta = vs_delta = None
    if cfg.get("v_delta", False):
        v_delta = _storage_delta(ka.rows, va.rows)
        if kcx["QUANT"] == Q_TOKEN and vcx["QUANT"] == Q_TOKEN:
            vs_delta = _storage_delta(ka.scales, va.scales)
        if v_delta is not None and abs(v_delta) >= 2**31:
            v_delta = None
        if vs_delta is not None and abs(vs_delta) >= 2**31:
            vs_delta = None
    asm = os.environ.get("TRITON_INTERPRET") != "1"
    bn = cfg["BLOCK_N"]
    w = cfg["num_warps"]
    trans = bool(cfg.get("trans", False))
    perm_w = w if cfg.get("v_perm", False) and dv >= (16 if trans else 8) * w else 0
    addr = 2 if cfg.get("addr", 1) == 2 and page > 0 and page % bn == 0 else 1
    return dict(
        FAST=True,
        ADDR=addr,
        LOG2_PAGE=max(page, 1).bit_length() - 1,
        CLAMP=bool(cfg.get("clamp", False)),
        V_DELTA=v_delta,
        VS_DELTA=vs_delta,
        K_CVT=_CVT[cfg.get("k_cvt", "tl")],
        V_CVT=_CVT[cfg.get("v_cvt", "tl")],
        V_SEL=bool(cfg.get("v_sel", True)),
        V_PERM=perm_w,
        TRANS=trans,
        ASM=asm,
    )


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
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Attention of ragged queries over K/V operands (docs/ops.md `mha`).

    q: [total_q, h_q, d_qk] bf16/fp16/fp32; q_row_offsets: [batch + 1] int32 (device).
    k, v: operands with h_kv heads (h_q % h_kv == 0), head dims d_qk and d_v <= 256.
    mask: None means causal(). scale: None means 1/sqrt(d_qk). sinks: [h_q] float32 logits.
    num_partitions: split-K partitions of the decode path (int or a one-element host tensor).
    max_q_len: optional host-known bound on q_len (e.g. max_lengths[step, 0]); 1 selects the
      decode path. Without it, decode is taken iff q.shape[0] == batch.
    Returns out [total_q, h_q, d_v] in q.dtype, and LSE [total_q, h_q] f32 if return_lse.
    """
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
    lse = torch.empty((total_q, h_q), dtype=torch.float32, device=q.device) if return_lse else None
    if total_q == 0 or batch == 0:
        return (out, lse) if return_lse else out

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
    decode = (max_q_len == 1) if max_q_len is not None else (total_q == batch)
    block_b = max(16, min(1024, triton.next_power_of_2(batch + 1)))
    prec = "ieee" if q.dtype == torch.float32 else "tf32"
    common_tail = [
        ka.cache_lengths,
        q_row_offsets,
        batch,
        sinks if sinks is not None else q,
        mask_t,
        stride_mt,
        mask_cols,
        mask.param,
    ]

    if decode:
        kv_bytes = max(ka.rows.element_size(), va.rows.element_size())
        if q.dtype == torch.float32:
            kv_bytes = 4
        kinds = {_quant_code(ka, dk), _quant_code(va, dv)}
        if kinds <= {Q_TENSOR, Q_TOKEN} and q.dtype != torch.float32:
            kv_kind = "fp8_cols"
        elif Q_BLOCK in kinds:
            kv_kind = "fp8_block"
        else:
            kv_kind = "plain"
        sms = num_sms(q.device)
        hbm3e = fast_hbm(q.device)
        if num_partitions is None:
            bound = ka.lut.shape[1] * ka.page_size if ka.page_size > 0 else ka.rows.shape[0]
            parts = mha_num_partitions(total_q, h_kv, 1, bound, sms, kv_bytes, hbm3e)
        else:
            parts = int(num_partitions)
        check(parts >= 1, "num_partitions", "an int >= 1", parts)
        cfg = decode_config(
            dk, dv, kv_bytes, kv_kind, ctas_per_sm=total_q * parts * h_kv / sms,
            page_size=ka.page_size, hbm3e=hbm3e,
        )  # fmt: skip
        bn = cfg["BLOCK_N"]
        k_tma = cfg["tma"] and _tma_ok(ka, bn)
        v_tma = cfg["tma"] and _tma_ok(va, bn)
        k_args, kcx = _kv_launch_args(ka, dk, bn if k_tma else None)
        v_args, vcx = _kv_launch_args(va, dv, bn if v_tma else None)
        split = parts > 1
        mma = _mma_flags(cfg, prec, kcx, vcx)
        if split:
            po = torch.empty((total_q, h_q, parts, dv), dtype=torch.float32, device=q.device)
            pl = torch.empty((total_q, h_q, parts), dtype=torch.float32, device=q.device)
        else:
            po = pl = out
        kv_args = [
            k_args[0], k_args[1], k_args[2], k_args[3], k_args[4], k_args[5], k_args[6],
            v_args[0], v_args[1], v_args[2], v_args[3], v_args[4], v_args[5], v_args[6],
            k_args[7], k_args[8], k_args[9], v_args[7], v_args[8], v_args[9],
        ]  # fmt: skip
        launch(_mha_decode_kernel, (total_q * parts * h_kv,),
            q, q.stride(0), q.stride(1),
            *kv_args,
            *common_tail,
            out, out.stride(0), out.stride(1),
            lse if lse is not None else out,
            lse.stride(0) if lse is not None else 0,
            lse.stride(1) if lse is not None else 0,
            po, pl, parts, sm_scale * LOG2E_F,
            H_KV=h_kv, GROUP=group, GP=max(cfg.get("gp_min", 16), triton.next_power_of_2(group)),
            **_fast_flags(cfg, ka, va, dk, dv, kcx, vcx, k_tma or v_tma, mma["MMA_F16"]),
            DK=dk, DKP=dkp, DV=dv, DVP=dvp, BLOCK_N=bn,
            K_PAGE=kcx["PAGE"], V_PAGE=vcx["PAGE"], V_SAME_ROWS=_same_rows(ka, va, k_tma, v_tma),
            K_QUANT=kcx["QUANT"], V_QUANT=vcx["QUANT"], KG=kcx["G"], VG=vcx["G"],
            K_E8M0=kcx["E8M0"], V_E8M0=vcx["E8M0"], MASK=mask.code,
            HAS_SINKS=sinks is not None and not split, SPLIT=split,
            WRITE_LSE=lse is not None and not split,
            K_TMA=k_tma, V_TMA=v_tma, DOT_PREC=prec, **mma,
            BLOCK_B=block_b, PDL=split and pdl_enabled(q),
            NUM_STAGES=cfg["num_stages"], num_warps=cfg["num_warps"],
        )  # fmt: skip
        if split:
            combine_triton(po, pl, out, lse, sinks)
    elif plan := _use_sm90_prefill(q, ka, va, dk, dv, mask):
        _prefill_sm90(plan, q, q_row_offsets, ka, va, dk, h_q, group, block_b, mask, sinks, out,
                      lse, sm_scale)  # fmt: skip
    else:
        cfg = prefill_config(
            dkp,
            dvp,
            q.element_size(),
            lambda bn: _tma_ok(ka, bn) and _tma_ok(va, bn),
            fp8=ka.quant_format is not None or va.quant_format is not None,
        )
        bm, bn = cfg["BLOCK_M"], cfg["BLOCK_N"]
        k_tma = cfg["tma"] and _tma_ok(ka, bn)
        v_tma = cfg["tma"] and _tma_ok(va, bn)
        k_args, kcx = _kv_launch_args(ka, dk, bn if k_tma else None)
        v_args, vcx = _kv_launch_args(va, dv, bn if v_tma else None)
        kv_args = [
            k_args[0], k_args[1], k_args[2], k_args[3], k_args[4], k_args[5], k_args[6],
            v_args[0], v_args[1], v_args[2], v_args[3], v_args[4], v_args[5], v_args[6],
            k_args[7], k_args[8], k_args[9], v_args[7], v_args[8], v_args[9],
        ]  # fmt: skip
        n_tiles = min(triton.cdiv(total_q, bm) + batch, total_q)
        launch(_mha_prefill_kernel, (n_tiles * h_q,),
            q, q.stride(0), q.stride(1),
            *kv_args,
            *common_tail,
            out, out.stride(0), out.stride(1),
            lse if lse is not None else out,
            lse.stride(0) if lse is not None else 0,
            lse.stride(1) if lse is not None else 0,
            sm_scale * LOG2E_F,
            H_Q=h_q, GROUP=group, DK=dk, DKP=dkp, DV=dv, DVP=dvp, BLOCK_M=bm, BLOCK_N=bn,
            K_PAGE=kcx["PAGE"], V_PAGE=vcx["PAGE"], V_SAME_ROWS=_same_rows(ka, va, k_tma, v_tma),
            K_QUANT=kcx["QUANT"], V_QUANT=vcx["QUANT"], KG=kcx["G"], VG=vcx["G"],
            K_E8M0=kcx["E8M0"], V_E8M0=vcx["E8M0"], MASK=mask.code,
            HAS_SINKS=sinks is not None, WRITE_LSE=lse is not None,
            REVERSE=mask.kind in ("causal", "sliding_window_causal", "chunked_causal"),
            K_TMA=k_tma, V_TMA=v_tma, DOT_PREC=prec, **_mma_flags(cfg, prec, kcx, vcx),
            BLOCK_B=block_b, BLOCKS_FASTEST=bool(cfg.get("blocks_fastest", False)),
            NUM_STAGES=cfg["num_stages"], num_warps=cfg["num_warps"],
        )  # fmt: skip
    return (out, lse) if return_lse else out


# Gluon sm_90 prefill launches. H100 2026-11-22, bench/gpu_mha_dev.py --prefill, causal
# 8 x 4096, 32/8 heads, d128, TFLOP/s.
# Warp-specialized (gluon_prefill_ws; K/V tiles of TMA boxes): 128 query rows, BLOCK_N keys a
# tile, NBUF stages; 12 warps at 168 registers a thread, moved by setmaxnreg to 240 for each
# consumer warpgroup and 24 for the producer's. Ragged: 128 x 2 509-515, 128 x 3 508-513,
# 64 x 4 463-466; pages of 16 / 64 / 128 at 128 x 2: 499 / 509 / 511.
PREFILL_SM90_WS = dict(BLOCK_N=128, NBUF=2, ws=True, consumer_regs=240, maxnreg=168)
# Otherwise (gluon_prefill: pages of 1, of sizes that do not divide 128, or overrides):
# 16 * num_warps query rows, an NBUF-deep ring filled by TMA boxes where tiles stay in one page,
# by cp.async otherwise. Before the warp-specialized kernel: pages of 128: 128 x 3 426, 64 x 4
# 397; of 64: 64 x 4 396, 64 x 5 391, cp.async 362; of 16 (cp.async): 64 x 4 352, 128 x 3 337.
# Ragged K/V (TMA, 32 heads): 128 x 3 426, 64 x 4-6 392; one warpgroup of 64 rows (two CTAs a
# SM) 64 x 3 424, 128 x 3 366.
PREFILL_SM90 = dict(BLOCK_N=64, NBUF=4, num_warps=8)
PREFILL_SM90_TMA128 = dict(BLOCK_N=128, NBUF=3, num_warps=8)


def _tma_box_rows(ka: KernelArgs, block_n: int) -> int | None:
    """Rows of the TMA boxes that fill a [block_n, D] tile: block_n where tiles stay in one
    page (row-offset K/V, pages a multiple of block_n), the page size where pages of >= 8 rows
    divide block_n (one box a page), else None (no TMA)."""
    if _tma_ok(ka, block_n):
        return block_n
    p = ka.page_size
    if p >= 8 and block_n % p == 0 and _tma_ok(ka, p):
        return p
    return None


def _sm90_prefill_plan(ka: KernelArgs, va: KernelArgs) -> tuple[dict, bool]:
    """(launch config, one-box TMA tiles) of the Gluon sm_90 prefill. cfg["ws"]: the
    warp-specialized kernel (`gluon_prefill_ws`), wherever K and V tiles are TMA boxes (one a
    tile, or one a page); cfg["K_BOX"], cfg["V_BOX"]: its box rows."""
    kb, vb = _tma_box_rows(ka, 128), _tma_box_rows(va, 128)
    if kb and vb and PREFILL_OVERRIDE.get("g_ws", True) and PREFILL_OVERRIDE.get("g_tma", True):
        cfg = dict(PREFILL_SM90_WS)
    else:
        wide = _tma_ok(ka, 128) and _tma_ok(va, 128)
        cfg = dict(PREFILL_SM90_TMA128 if wide else PREFILL_SM90)
    cfg.update({k[2:]: v for k, v in PREFILL_OVERRIDE.items() if k.startswith("g_")})
    bn = cfg["BLOCK_N"]
    use_tma = bool(cfg.get("tma", True)) and _tma_ok(ka, bn) and _tma_ok(va, bn)
    kb, vb = _tma_box_rows(ka, bn), _tma_box_rows(va, bn)
    cfg["ws"] = bool(cfg.get("ws")) and cfg.get("tma", True) and bool(kb and vb)
    for key in ("consumer_regs", "maxnreg"):
        cfg.setdefault(key, PREFILL_SM90_WS[key])
    cfg["K_BOX"], cfg["V_BOX"] = kb, vb
    return cfg, use_tma


def _prefill_sm90(plan, q, q_row_offsets, ka, va, d, h_q, group, block_b, mask, sinks, out,
                  lse, sm_scale) -> None:  # fmt: skip
    """Launch `gluon_prefill_ws._mha_prefill_ws` or `gluon_prefill._mha_prefill_sm90` (the
    grid and block order of the tl kernel) as `plan` (`_sm90_prefill_plan`) says."""
    cfg, use_tma = plan
    total_q, batch = q.shape[0], q_row_offsets.shape[0] - 1
    bn = cfg["BLOCK_N"]
    layout = nvmma_128b(2)
    ws = cfg["ws"]
    box_k, box_v = (cfg["K_BOX"], cfg["V_BOX"]) if ws else ((bn, bn) if use_tma else (None, None))
    k_args, kcx = _kv_launch_args(ka, d, box_k, layout)  # the kernel's shared layout
    v_args, vcx = _kv_launch_args(va, d, box_v, layout)
    tail = [
        ka.cache_lengths, q_row_offsets, batch, sinks if sinks is not None else q, mask.param,
        out, out.stride(0), out.stride(1), lse if lse is not None else out,
        lse.stride(0) if lse is not None else 0, lse.stride(1) if lse is not None else 0,
        sm_scale * LOG2E_F,
    ]  # fmt: skip
    cx = dict(
        H_Q=h_q, GROUP=group, D=d, BLOCK_N=bn, K_PAGE=kcx["PAGE"], V_PAGE=vcx["PAGE"],
        MASK=mask.code, HAS_SINKS=sinks is not None, WRITE_LSE=lse is not None,
        REVERSE=mask.kind in ("causal", "sliding_window_causal", "chunked_causal"),
        BLOCKS_FASTEST=True, BLOCK_B=block_b, NBUF=cfg["NBUF"],
    )  # fmt: skip
    rows = 128 if ws else 16 * cfg["num_warps"]
    grid = (min(triton.cdiv(total_q, rows) + batch, total_q) * h_q,)
    if ws:  # TMA descriptors, lookup tables, row offsets, page strides
        launch(gluon_prefill_ws._mha_prefill_ws, grid,
            q, q.stride(0), q.stride(1), k_args[0], *k_args[3:7], v_args[0], *v_args[3:7],
            *tail, K_BOX=box_k, V_BOX=box_v, CONSUMER_REGS=cfg["consumer_regs"], num_warps=4,
            maxnreg=cfg["maxnreg"], **cx,
        )  # fmt: skip
    else:
        launch(gluon_prefill._mha_prefill_sm90, grid,
            q, q.stride(0), q.stride(1), *k_args[:7], *v_args[:7], *tail,
            V_SAME_ROWS=_same_rows(ka, va, use_tma, use_tma), TMA=use_tma,
            num_warps=cfg["num_warps"], **cx,
        )  # fmt: skip
