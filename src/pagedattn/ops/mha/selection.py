"""Launch selection of the Triton MHA op: which kernel serves a call of `mha_triton`, and with
which frozen configuration (a launch plan). Host arithmetic on shapes, strides, dtypes and
device facts only: no device data is read, so a plan is CUDA-graph safe.

- `plan(...)` -> `DecodePlan` | `PrefillPlan` | `Sm90PrefillPlan`:
  - decode (`triton_decode`) where every request has one query: `max_q_len == 1`, or, with no
    hint, `total_q == batch`. Unless the call fixes num_partitions, the balanced work list
    (`triton_worklist`: about equal chunks over all rows, one wave of items a KV head); with
    `balanced` off, split-K partitions from `cache.dispatch.mha_num_partitions` (SM count, a
    host bound on the cache length).
  - the Gluon sm_90 prefill (`gluon_prefill_ws` where K/V tiles are TMA boxes, else
    `gluon_prefill`) on sm_90 for BF16/FP16 K/V of q's dtype, d_qk == d_v in (64, 128), a range
    mask, 16-byte aligned rows: every paged cache, and ragged / row-offset K/V where the
    warp-specialized kernel applies (`sm90_prefill_serves`);
  - else the tl prefill (`triton_prefill`).
- Configurations: `DecodeConfig` (`decode_config`: by K/V kind, head dims, grid fill, page size
  and device), `PrefillConfig` (`prefill_config`), `Sm90PrefillConfig` (`sm90_prefill_plan`).
  Their defaults and the constants below are the shipped choices; the measurements behind them
  are in docs/kernels/mha_decode.md, mha_prefill.md and gluon_prefill.md.
- `MHATuning`: development overrides of those fields, from `mha_triton(..., config=)` and from
  `PAGEDATTN_MHA_TUNING` (`tuning_from_env`: a JSON object {"decode": {...}, "prefill": {...}});
  an unknown field raises InvalidArgumentError.
- `Device`: the device facts a plan depends on (sm_90, SM count, H200-class HBM), given
  explicitly so that `ops.offline` captures can plan as on any chip.
- `mma_flags` / `fast_flags`: the kernel constexprs that follow from a config and the operands.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from types import MappingProxyType
from typing import Any

import torch
import triton

from ... import env
from ...cache.dispatch import mha_ctas_per_sm, mha_num_partitions
from ...errors import InvalidArgumentError, check
from ...operands import KernelArgs
from ..gluon_imports import HAS_GLUON
from ..masks import Mask
from .triton_tiles import Q_BLOCK, Q_NONE, Q_TENSOR, Q_TOKEN


class _Fields:
    """Read a config like the dict it replaced (`cfg["num_stages"]`)."""

    def __getitem__(self, key: str) -> Any:
        return getattr(self, key)


@dataclass(frozen=True)
class DecodeConfig(_Fields):
    """Decode launch (`triton_decode._mha_decode_kernel`); defaults: plain BF16 d128 K/V.

    BLOCK_N keys a tile, num_warps, num_stages (tl.range pipeline), tma (TMA tile loads), hi_lo
    (P as a hi + lo pair through P @ V), kv_lo (the same for float32-scaled blockwise K/V),
    mma_f16 (fp16 MMAs for FP8 per-token / per-tensor K/V). The FP8 fast loop's knobs
    (`fast_flags`): fast, addr, clamp, v_delta, v_sel, v_perm, gp_min (the padded query-head
    tile), trans, k_cvt / v_cvt ("tl", "int" or "asm" e4m3 upcasts). balanced: where the call
    leaves num_partitions to the op, the balanced work list (`triton_worklist`) of `waves`
    waves of resident CTAs instead of one partition count per batch (one ships: more waves
    balance large skewed batches better but split the rows of uniform ones and over-split a
    lone long request; docs/kernels/mha_decode.md has the measurements). fused_merge: a split
    row's last item merges the row in the decode launch (counters on `ops.prepared.semaphores`;
    `triton_worklist.merge_items_online`, its loads merge_stages deep) instead of a combine
    launch after it, at every row count (H200: the combine cost 3-15 us a call, most of it
    where no row split; the fused merge's first, wider form cost ~11 us a launch where rows did
    split, in instruction fetches: docs/kernels/mha_decode.md, "the fused merge" and "The fused
    merge's code size"). Items hold at least min_chunk keys from small_rows rows up, else
    small_min_chunk: a small batch is bound by each item's chain of dependent loads, not by
    bytes, and shorter items end sooner (H200, `dev/sweep_gqa_decode.py`, graph replays,
    Llama-3-8B heads, 512-560 keys a row: b8 / b16 with 64-key items 21.3 / 20.8 us against
    22.3 / 21.6 with the combine launch; b64 43.7 against 48.0 with 256-key items).
    max_ctas_per_sm: at most this many resident CTAs a SM (`ops.launch.occupancy_shared`: the
    launch's shared memory raised to fit no more), -1 the list's (`cache.dispatch.
    mha_ctas_per_sm`, whose wave the items are sized for), 0 none: Qwen3-30B-A3B heads
    (32 / 4) b256, one item a row, ran 89.5 us at 5 CTAs a SM (1.55 waves) and 80.3 at 4
    (two even waves). list_order: the kernels' own list's order (a step's plan has its own):
    1 rows by bucket of their items' size, largest first (`ops.list_order.bucket_ends`), 0
    split rows first: H200, the suite's GQA steps on the kernels' own list (graph replays,
    `dev/profile_gqa_skew.py`), skewed b32 / b64 / b128 / b256 78.2 / 204.7 / 395.7 / 789.7 ->
    74.1 / 169.3 / 313.2 / 612.5 us, one long among 63 / 255 61.4 / 105.0 -> 61.7 / 109.0 (each
    of its ~2,600 programs derives the buckets), the uniform control 248.1 -> 248.6
    (docs/kernels/mha_decode.md, "Longest items first")."""

    BLOCK_N: int = 32
    num_warps: int = 4
    num_stages: int = 5
    tma: bool = False
    hi_lo: bool = True
    kv_lo: bool = False
    mma_f16: bool = True
    fast: bool = False
    addr: int = 1
    clamp: bool = False
    v_delta: bool = False
    v_sel: bool = True
    v_perm: bool = False
    gp_min: int = 16
    trans: bool = False
    k_cvt: str = "tl"
    v_cvt: str = "tl"
    balanced: bool = True
    waves: int = 1
    min_chunk: int = 256
    fused_merge: bool = True
    small_rows: int = 48
    small_min_chunk: int = 64
    merge_stages: int = 4
    max_ctas_per_sm: int = -1
    list_order: int = 1


# FP8 per-token / per-tensor decode: the fast loop, keys as the MMA's M, one page id a tile, V
# addressed from K, column-permuted V, 4 padded query heads, Triton's e4m3 cast (inline PTX
# measured the same, 0.5%). H100: 190-197 us = 1.81-1.88x bf16 (mha_decode.md).
FP8_FAST_LOOP = DecodeConfig(BLOCK_N=64, num_warps=2, num_stages=4, fast=True, addr=2,
                             clamp=True, v_delta=True, v_sel=False, v_perm=True, gp_min=4,
                             trans=True)  # fmt: skip


@dataclass(frozen=True)
class PrefillConfig(_Fields):
    """tl prefill launch (`triton_prefill._mha_prefill_kernel`); defaults: BF16/FP16 d <= 128
    with 128-key TMA tiles. blocks_fastest orders the grid (request, head, block): H100,
    causal 8 x 4096, 32 heads d128: 436 vs 417 TFLOP/s (mha_prefill.md)."""

    BLOCK_M: int = 128
    BLOCK_N: int = 128
    num_warps: int = 8
    num_stages: int = 3
    tma: bool = True
    hi_lo: bool = False
    kv_lo: bool = False
    mma_f16: bool = True
    blocks_fastest: bool = True


@dataclass(frozen=True)
class Sm90PrefillConfig(_Fields):
    """Gluon sm_90 prefill launch; defaults: the warp-specialized kernel (`gluon_prefill_ws`),
    128 query rows, BLOCK_N keys a tile in an NBUF-deep ring, 12 warps at maxnreg registers a
    thread, moved by setmaxnreg to consumer_regs for each consumer warpgroup. Without ws:
    `gluon_prefill`, 16 * num_warps query rows, TMA boxes where tiles stay in one page (tma),
    cp.async otherwise. H100, ragged causal 8 x 4096: 509-515 TFLOP/s
    (gluon_prefill.md)."""

    BLOCK_N: int = 128
    NBUF: int = 2
    num_warps: int = 8
    ws: bool = True
    tma: bool = True
    consumer_regs: int = 240
    maxnreg: int = 168


SM90_PREFILL_WS = Sm90PrefillConfig()
# gluon_prefill where 128-key tiles are TMA boxes (128 x 3: ragged 426 TFLOP/s), else 64 x 4
# (pages of 64: 396; of 16, cp.async: 352). H100 (gluon_prefill.md).
SM90_PREFILL_TMA128 = Sm90PrefillConfig(BLOCK_N=128, NBUF=3, ws=False)
SM90_PREFILL = Sm90PrefillConfig(BLOCK_N=64, NBUF=4, ws=False)


def _names(cls: type) -> frozenset[str]:
    return frozenset(f.name for f in fields(cls))


DECODE_KNOBS = _names(DecodeConfig)
PREFILL_FIELDS = _names(PrefillConfig)
# prefill overrides: PrefillConfig fields (the tl kernel), "gluon" (True: a Gluon sm_90 kernel
# wherever the shapes allow; False: the tl kernel) and "g_" + a Sm90PrefillConfig field
PREFILL_KNOBS = PREFILL_FIELDS | {"gluon"} | {"g_" + n for n in _names(Sm90PrefillConfig)}


def _frozen(knobs: Mapping[str, Any] | None, allowed: frozenset[str], what: str) -> Mapping:
    knobs = dict(knobs or {})
    unknown = sorted(set(knobs) - allowed)
    if unknown:
        raise InvalidArgumentError(
            f"{what}: unknown MHA tuning knobs {unknown} (known: {sorted(allowed)})"
        )
    return MappingProxyType(knobs)


@dataclass(frozen=True)
class MHATuning:
    """Development overrides of the launch choices, applied over what the selection picks for
    a call's shapes and device. decode: DecodeConfig fields; prefill: PrefillConfig fields,
    "gluon" and "g_<Sm90PrefillConfig field>" (see PREFILL_KNOBS). Unknown names raise."""

    decode: Mapping[str, Any] = field(default_factory=dict)
    prefill: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "decode", _frozen(self.decode, DECODE_KNOBS, "decode"))
        object.__setattr__(self, "prefill", _frozen(self.prefill, PREFILL_KNOBS, "prefill"))

    def over(self, other: MHATuning | None) -> MHATuning:
        """These overrides with `other`'s on top."""
        if other is None:
            return self
        return MHATuning({**self.decode, **other.decode}, {**self.prefill, **other.prefill})


NO_TUNING = MHATuning()


def tuning_from_env() -> MHATuning:
    """The overrides of `PAGEDATTN_MHA_TUNING` (a JSON object with "decode" and / or "prefill"
    objects; NO_TUNING when unset)."""
    spec = env.tuning_overrides("MHA")
    if not spec:
        return NO_TUNING
    unknown = sorted(set(spec) - {"decode", "prefill"})
    if unknown:
        raise InvalidArgumentError(
            f"PAGEDATTN_MHA_TUNING: unknown keys {unknown} (expected 'decode', 'prefill')"
        )
    for path, knobs in spec.items():
        if not isinstance(knobs, dict):
            raise InvalidArgumentError(
                f"PAGEDATTN_MHA_TUNING: {path!r} must be a JSON object of knobs, got {knobs!r}"
            )
    return MHATuning(spec.get("decode"), spec.get("prefill"))


@dataclass(frozen=True)
class Device:
    """The device facts a plan depends on: sm_90 (the Gluon prefills), the SM count (split-K)
    and an H200-class part (`cache.dispatch.fast_hbm`: more stages and splits in decode)."""

    sm90: bool
    sms: int
    hbm3e: bool


@dataclass(frozen=True)
class DecodePlan:
    """target > 0: the balanced work list (`triton_worklist`) of at most target + batch items
    a KV head, chunks of at least min_blocks tiles; else num_partitions per row."""

    config: DecodeConfig
    num_partitions: int
    k_tma: bool
    v_tma: bool
    target: int = 0
    min_blocks: int = 1
    fused: bool = False  # (balanced) split rows merged in the decode launch


@dataclass(frozen=True)
class PrefillPlan:
    config: PrefillConfig
    k_tma: bool
    v_tma: bool


@dataclass(frozen=True)
class Sm90PrefillPlan:
    """ws: the warp-specialized kernel, whose K/V tiles are k_box / v_box-row TMA boxes (one a
    tile, or one a page); else `gluon_prefill`, with TMA tiles where tma."""

    config: Sm90PrefillConfig
    ws: bool
    tma: bool
    k_box: int | None
    v_box: int | None


MAX_BALANCED_ROWS = 1024  # the mha launcher's BLOCK_B cap: rows of one work-list vector


def _pow2_floor(x: int) -> int:
    return 1 << (max(int(x), 1).bit_length() - 1)


def decode_config(
    dk: int,
    dv: int,
    kv_bytes: int,
    kv_kind: str = "plain",
    ctas_per_sm: float = 0.0,
    page_size: int = 0,
    hbm3e: bool = False,
    tuning: MHATuning = NO_TUNING,
) -> DecodeConfig:
    """Decode launch for K/V of `kv_kind`: "plain" (bf16/fp16/fp32), "fp8_cols" (FP8 with
    per-token or per-tensor scales: fp16 MMAs) or "fp8_block" (FP8 with G < head_dim scales).
    ctas_per_sm: the launch's programs over the SM count; page_size: the K cache's (0: rows);
    hbm3e: an H200-class device. Measurements: docs/kernels/mha_decode.md."""
    if kv_kind == "fp8_cols":
        # H200: 5 stages where the grid holds <= 4 CTAs a SM (b64 p16 145 vs 160 us)
        cfg = replace(FP8_FAST_LOOP, num_stages=5 if hbm3e and ctas_per_sm <= 4 else 4)
    elif kv_kind == "fp8_block":  # 319 us; a hi + lo K/V pair (kv_lo) costs 2x
        cfg = DecodeConfig(BLOCK_N=64, num_warps=4, num_stages=5)
    else:
        # ~16 KB of K+V a stage (one wave at ~5 CTAs a SM); 2 warps for padded head dims and
        # for d <= 64 (H200, Llama-3.2-1B's and gpt-oss's heads, b1-b256: level at b1, 1-5% faster
        # from b64, 13-16% at b8-b32 than 4 warps; docs/kernels/mha_decode.md "The fixed cost of
        # a decode launch"); H100:
        # 4 stages at a full grid of pages >= 16 (+1%), else 5 (H200: 5, 7-8% over 4)
        block_n = max(16, min(128, _pow2_floor(16 * 1024 // ((dk + dv) * kv_bytes))))
        padded = dk != triton.next_power_of_2(dk) or dv != triton.next_power_of_2(dv)
        full_grid = ctas_per_sm >= 3 and (page_size == 0 or page_size >= 16)
        stages = 4 if full_grid and not hbm3e else 5
        warps = 2 if padded or dk + dv <= 128 else 4
        cfg = DecodeConfig(BLOCK_N=block_n, num_warps=warps, num_stages=stages)
    cfg = replace(cfg, **tuning.decode)
    order = cfg.list_order
    check(type(order) is int and order in (0, 1), "config.decode['list_order']", "0 or 1", order)
    return cfg


def prefill_config(
    dk_pad: int,
    dv_pad: int,
    q_bytes: int,
    tma_ok: Callable[[int], bool],
    fp8: bool = False,
    tuning: MHATuning = NO_TUNING,
) -> PrefillConfig:
    """tl prefill launch (BLOCK_M queries x BLOCK_N keys). `tma_ok(block_n)` says whether K/V
    tiles of that many keys can be TMA boxes (tiles inside one page); 128-key TMA tiles are
    fastest, then 64-key TMA tiles, then 64-key pointer gathers (H200 measurements)."""
    d = max(dk_pad, dv_pad)
    if q_bytes >= 4:
        cfg = PrefillConfig(BLOCK_M=64, BLOCK_N=32, num_warps=4, num_stages=2)
    elif fp8 and d <= 128:  # the upcasts need registers: 163 vs 150 TFLOP/s at 128 x 64
        cfg = PrefillConfig(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=3)
    elif d <= 128:
        cfg = PrefillConfig(BLOCK_N=128 if tma_ok(128) else 64)
    else:
        cfg = PrefillConfig(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=2)
    return replace(cfg, **{k: v for k, v in tuning.prefill.items() if k in PREFILL_FIELDS})


def quant_code(ka: KernelArgs, head_dim: int) -> int:
    """The kernels' QUANT constexpr of an operand (`triton_tiles` Q_* codes)."""
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


def tma_ok(ka: KernelArgs, block_n: int, box_cols: int | None = None) -> bool:
    """A [BLOCK_N, D] TMA box of the [rows, heads * D] view is usable: tiles stay in one page,
    D is a power of two in [16, 256], and the view is 16-byte aligned. box_cols < D: boxes of
    [BLOCK_N, box_cols] and [BLOCK_N, D - box_cols] (a head's first columns and the rest, the
    Gluon prefill's d_qk > d_v), each width a power of two in [16, 256]."""
    r = ka.rows
    d = r.shape[2]
    elem = r.element_size()
    widths = (d,) if box_cols is None or box_cols >= d else (box_cols, d - box_cols)
    return (
        (ka.page_size == 0 or ka.page_size % block_n == 0)
        and all(w == triton.next_power_of_2(w) and 16 <= w <= 256 for w in widths)
        and (d * elem) % 16 == 0
        and r.stride(2) == 1
        and r.stride(1) == d
        and (r.stride(0) * elem) % 16 == 0
        and r.data_ptr() % 16 == 0
    )


def tma_box_rows(ka: KernelArgs, block_n: int, box_cols: int | None = None) -> int | None:
    """Rows of the TMA boxes that fill a [block_n, D] tile: block_n where tiles stay in one
    page (row-offset K/V, pages a multiple of block_n), the page size where pages of >= 8 rows
    divide block_n (one box a page), else None (no TMA). box_cols: as `tma_ok`."""
    if tma_ok(ka, block_n, box_cols):
        return block_n
    p = ka.page_size
    if p >= 8 and block_n % p == 0 and tma_ok(ka, p, box_cols):
        return p
    return None


def same_rows(ka: KernelArgs, va: KernelArgs, k_tma: bool, v_tma: bool) -> bool:
    """K and V tiles share their physical rows (same lookup table / offsets and load kind)."""
    if ka.page_size != va.page_size or k_tma != v_tma:
        return False
    if ka.page_size > 0:
        return ka.lut is va.lut and ka.page_stride_rows == va.page_stride_rows
    return ka.row_offsets is va.row_offsets


def decode_plan(
    q: torch.Tensor,
    ka: KernelArgs,
    va: KernelArgs,
    dk: int,
    dv: int,
    num_partitions: int | torch.Tensor | None,
    tuning: MHATuning,
    device: Device,
) -> DecodePlan:
    """The decode launch: config, split-K partitions, TMA loads."""
    total_q, h_kv = q.shape[0], ka.rows.shape[1]
    kv_bytes = max(ka.rows.element_size(), va.rows.element_size())
    if q.dtype == torch.float32:
        kv_bytes = 4
    kinds = {quant_code(ka, dk), quant_code(va, dv)}
    if kinds <= {Q_TENSOR, Q_TOKEN} and q.dtype != torch.float32:
        kv_kind = "fp8_cols"
    elif Q_BLOCK in kinds:
        kv_kind = "fp8_block"
    else:
        kv_kind = "plain"
    sms = device.sms
    if num_partitions is None:
        bound = ka.lut.shape[1] * ka.page_size if ka.page_size > 0 else ka.rows.shape[0]
        parts = mha_num_partitions(total_q, h_kv, 1, bound, sms, kv_bytes, device.hbm3e)
    else:
        parts = int(num_partitions)
    check(parts >= 1, "num_partitions", "an int >= 1", parts)
    cfg = decode_config(
        dk, dv, kv_bytes, kv_kind, ctas_per_sm=total_q * parts * h_kv / sms,
        page_size=ka.page_size, hbm3e=device.hbm3e, tuning=tuning,
    )  # fmt: skip
    target = min_blocks = 0
    fused = False
    # the work list holds every row in one [BLOCK_B <= 1024] vector
    if num_partitions is None and cfg.balanced and 0 < total_q < MAX_BALANCED_ROWS:
        ctas = mha_ctas_per_sm(kv_bytes, device.hbm3e)
        target = max(1, cfg.waves * ctas * sms // h_kv)
        cfg = decode_config(
            dk, dv, kv_bytes, kv_kind, ctas_per_sm=min(total_q, target) * h_kv / sms,
            page_size=ka.page_size, hbm3e=device.hbm3e, tuning=tuning,
        )  # fmt: skip
        fused = cfg.fused_merge
        chunk = cfg.min_chunk if total_q >= cfg.small_rows else cfg.small_min_chunk
        min_blocks = triton.cdiv(chunk, cfg.BLOCK_N)
        if cfg.max_ctas_per_sm < 0:
            cfg = replace(cfg, max_ctas_per_sm=ctas)
        parts = 1
    bn = cfg.BLOCK_N
    return DecodePlan(
        cfg, parts, cfg.tma and tma_ok(ka, bn), cfg.tma and tma_ok(va, bn), target, min_blocks,
        fused,
    )  # fmt: skip


def prefill_plan(
    q: torch.Tensor, ka: KernelArgs, va: KernelArgs, dkp: int, dvp: int, tuning: MHATuning
) -> PrefillPlan:
    """The tl prefill launch: config and TMA loads (dkp, dvp: padded head dims)."""
    cfg = prefill_config(
        dkp,
        dvp,
        q.element_size(),
        lambda bn: tma_ok(ka, bn) and tma_ok(va, bn),
        fp8=ka.quant_format is not None or va.quant_format is not None,
        tuning=tuning,
    )
    bn = cfg.BLOCK_N
    return PrefillPlan(cfg, cfg.tma and tma_ok(ka, bn), cfg.tma and tma_ok(va, bn))


def sm90_prefill_plan(
    ka: KernelArgs, va: KernelArgs, tuning: MHATuning = NO_TUNING
) -> Sm90PrefillPlan:
    """The Gluon sm_90 prefill launch: the warp-specialized kernel wherever K and V tiles are
    TMA boxes (one a tile, or one a page), else `gluon_prefill`. K wider than V (d_qk > d_v)
    is boxed as its first d_v columns and the rest (`tma_ok`'s box_cols)."""
    over = {k[2:]: v for k, v in tuning.prefill.items() if k.startswith("g_")}
    kc = va.rows.shape[2]
    kb, vb = tma_box_rows(ka, 128, kc), tma_box_rows(va, 128)
    if kb and vb and over.get("ws", True) and over.get("tma", True):
        cfg = SM90_PREFILL_WS
    else:
        wide = tma_ok(ka, 128) and tma_ok(va, 128)
        cfg = SM90_PREFILL_TMA128 if wide else SM90_PREFILL
    cfg = replace(cfg, **over)
    bn = cfg.BLOCK_N
    use_tma = bool(cfg.tma) and tma_ok(ka, bn) and tma_ok(va, bn)
    kb, vb = tma_box_rows(ka, bn, kc), tma_box_rows(va, bn)
    ws = bool(cfg.ws) and cfg.tma and bool(kb and vb)
    return Sm90PrefillPlan(cfg, ws, use_tma, kb, vb)


def sm90_prefill_shapes_ok(
    q: torch.Tensor, ka: KernelArgs, va: KernelArgs, dk: int, dv: int, mask: Mask
) -> bool:
    """The shapes a Gluon sm_90 prefill takes: BF16/FP16 K/V of q's dtype without quantization,
    d_v in (64, 128) and d_qk == d_v, or d_qk = d_v + 16 / 32 / 64 (MLA's expanded prefill:
    192 / 128; the warp-specialized kernel only, `sm90_prefill_serves`), a range mask (not a
    tensor mask), 16-byte aligned rows."""
    ok = q.dtype in (torch.bfloat16, torch.float16) and dv in (64, 128)
    ok = ok and (dk == dv or dk - dv in (16, 32, 64))
    ok = ok and mask.kind != "tensor"
    for a in (ka, va):
        r = a.rows
        ok = ok and a.quant_format is None and r.dtype == q.dtype and r.stride(2) == 1
        ok = ok and r.stride(0) % 8 == 0 and r.stride(1) % 8 == 0 and r.data_ptr() % 16 == 0
    return bool(ok)


def sm90_prefill_serves(
    q: torch.Tensor,
    ka: KernelArgs,
    va: KernelArgs,
    dk: int,
    dv: int,
    mask: Mask,
    tuning: MHATuning = NO_TUNING,
) -> Sm90PrefillPlan | None:
    """The Gluon prefill's plan where one serves the launch on an sm_90 device, else None:
    every paged cache, and ragged / row-offset K/V where the warp-specialized kernel applies
    (else the tl kernel). Overrides: "gluon" False forces the tl kernel, True a Gluon kernel
    wherever the shapes allow; hi_lo / kv_lo need the tl kernel (P in q's dtype here). H100,
    causal 8 x 4096 d128, tl vs Gluon: ragged 422 vs 509-515 TFLOP/s, pages of
    16 317 vs 499 (gluon_prefill.md)."""
    want = tuning.prefill.get("gluon")
    if want is False or not HAS_GLUON:
        return None
    if tuning.prefill.get("hi_lo") or tuning.prefill.get("kv_lo"):
        return None  # P is rounded to q's dtype (no hi + lo pair)
    if not sm90_prefill_shapes_ok(q, ka, va, dk, dv, mask):
        return None
    p = sm90_prefill_plan(ka, va, tuning)
    if dk != dv and not p.ws:  # (gluon_prefill takes d_qk == d_v only)
        return None
    paged = ka.page_size > 0 and va.page_size > 0
    return p if want is True or paged or p.ws else None


def plan(
    q: torch.Tensor,
    ka: KernelArgs,
    va: KernelArgs,
    dk: int,
    dv: int,
    batch: int,
    mask: Mask,
    max_q_len: int | None,
    num_partitions: int | torch.Tensor | None,
    tuning: MHATuning,
    device: Device,
) -> DecodePlan | PrefillPlan | Sm90PrefillPlan:
    """The launch plan of a `mha_triton` call (see the module docstring)."""
    decode = (max_q_len == 1) if max_q_len is not None else (q.shape[0] == batch)
    if decode:
        return decode_plan(q, ka, va, dk, dv, num_partitions, tuning, device)
    if device.sm90 and (p := sm90_prefill_serves(q, ka, va, dk, dv, mask, tuning)):
        return p
    dkp = max(16, triton.next_power_of_2(dk))
    dvp = max(16, triton.next_power_of_2(dv))
    return prefill_plan(q, ka, va, dkp, dvp, tuning)


def mma_flags(cfg: DecodeConfig | PrefillConfig, prec: str, kcx: dict, vcx: dict) -> dict:
    """MMA operand constexprs.

    MMA_F16: FP8 K and V with per-token / per-tensor scales run fp16 MMAs (e4m3 is exact in
    fp16 and upcasts with one native cvt per pair; fp16 P keeps 11 bits, so no hi/lo split).
    Otherwise cfg.hi_lo carries P, and cfg.kv_lo float32-scaled blockwise K/V, as bf16/fp16
    hi + lo pairs through the MMAs. Never for float32 inputs (IEEE dots)."""
    fp8_cols = (Q_TENSOR, Q_TOKEN)
    f16 = prec != "ieee" and kcx["QUANT"] in fp8_cols and vcx["QUANT"] in fp8_cols
    f16 = f16 and cfg.mma_f16
    on = bool(cfg.hi_lo) and prec != "ieee"
    kv_lo = bool(cfg.kv_lo) and prec != "ieee"
    return dict(
        P_SPLIT=on and not f16,
        MMA_F16=f16,
        K_LO=kv_lo and kcx["QUANT"] == Q_BLOCK and not kcx["E8M0"],
        V_LO=kv_lo and vcx["QUANT"] == Q_BLOCK and not vcx["E8M0"],
    )


def storage_delta(a: torch.Tensor, b: torch.Tensor) -> int | None:
    """Element offset of view b from view a when both view one storage with equal strides and
    dtype (so that b's element at the same index is a's plus a constant), else None."""
    if a.dtype != b.dtype or a.stride() != b.stride() or a.device != b.device:
        return None
    if a.untyped_storage().data_ptr() != b.untyped_storage().data_ptr():
        return None
    return b.storage_offset() - a.storage_offset()


_CVT = {"tl": 0, "int": 1, "asm": 2}  # e4m3 -> fp16 upcast of the fast decode loop


def fast_flags(
    cfg: DecodeConfig, ka: KernelArgs, va: KernelArgs, dk: int, dv: int, kcx: dict, vcx: dict,
    tma: bool, mma_f16: bool,
) -> dict:  # fmt: skip
    """Constexprs of the decode kernel's FP8 fast loop (`triton_decode._fp8_fast_loop`), from
    the config's knobs:
    fast: use it (FP8 per-token / per-tensor K/V with fp16 MMAs, no TMA, K and V on one page
      table with the same power-of-two page size, or both unpaged, head dims powers of two);
    addr: 1 per-token page lookup (shift / mask), 2 one page id a tile (page % BLOCK_N == 0);
    clamp: unmasked loads of clamped token indices; v_delta: V (and V scale) addresses from
    K's plus a constant when both view one storage; k_cvt / v_cvt: e4m3 upcast "tl" (cast),
    "int" (integer ops, inline PTX) or "asm" (cvt.f16x2.e4m3x2 in inline PTX; both plain tl
    under the interpreter); v_sel: keep the V select (register upcast);
    v_perm: permute V's columns (and the output's) so that a thread's MMA operand columns are
    contiguous bytes (`triton_decode._perm_cols`); trans: the transposed products (keys as the
    MMA's M)."""
    off = dict(FAST=False)
    if not cfg.fast or not mma_f16 or tma:
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
    if cfg.v_delta:
        v_delta = storage_delta(ka.rows, va.rows)
        if kcx["QUANT"] == Q_TOKEN and vcx["QUANT"] == Q_TOKEN:
            vs_delta = storage_delta(ka.scales, va.scales)
        if v_delta is not None and abs(v_delta) >= 2**31:
            v_delta = None
        if vs_delta is not None and abs(vs_delta) >= 2**31:
            vs_delta = None
    asm = os.environ.get("TRITON_INTERPRET") != "1"
    bn = cfg.BLOCK_N
    w = cfg.num_warps
    trans = bool(cfg.trans)
    perm_w = w if cfg.v_perm and dv >= (16 if trans else 8) * w else 0
    addr = 2 if cfg.addr == 2 and page > 0 and page % bn == 0 else 1
    return dict(
        FAST=True,
        ADDR=addr,
        LOG2_PAGE=max(page, 1).bit_length() - 1,
        CLAMP=bool(cfg.clamp),
        V_DELTA=v_delta,
        VS_DELTA=vs_delta,
        K_CVT=_CVT[cfg.k_cvt],
        V_CVT=_CVT[cfg.v_cvt],
        V_SEL=bool(cfg.v_sel),
        V_PERM=perm_w,
        TRANS=trans,
        ASM=asm,
    )
