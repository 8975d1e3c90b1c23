"""Which kernel serves an MLA decode launch, and how: `plan_decode` -> a frozen `LaunchPlan`.

From the checked arguments (`triton_mla_args.DecodeArgs`: shapes, operand format and page
geometry), two device facts (whether the Gluon sm_90 kernels serve, `sm90`: Hopper, and
`sm90_serves`; whether it is an H200-class part, `hbm3e`) and the tuning
(`tuning.MLATuning`), the plan names the kernel, its compile-time constants and launch options,
the grid, the cluster size and the split-K partition count. `triton_mla` only launches it.

On sm_90 (`sm90`), BF16, rope-aware FP8 and V32 caches with d_qk 576, paged, without an extra
cache, first match of:
  1. keys-as-M (`_sm90_t_config`): BF16 tiles of <= 32 query rows, rope-aware FP8 of <= 16:
     `gluon_mla_tw._mla_decode_sm90_tw` (FP8, 16 rows, warp-specialized; 4 ring stages on an
     H200, 3 else), else `gluon_mla._mla_decode_sm90_t`;
  2. 64-row tiles (`_sm90_config`) of BF16 / V32 to the seesaws: the TMA-fed
     `gluon_mla_st._mla_decode_sm90_st` (dense BF16, pages of whole 64-key tiles), else
     `gluon_mla_ss._mla_decode_sm90_ss` (V32 with two head blocks a token: its 2-CTA cluster
     form; sparse with one partition and `ss_persist`: the persistent `gluon_mla_ps`);
  3. `gluon_mla._mla_decode_sm90` (rope-aware FP8 64-row tiles: S split by keys).
Everything else (other formats, d_qk 512, an extra cache, other GPUs, the CPU interpreter):
the portable `triton_mla_kernel._mla_decode_kernel` (`_tile_config`, `_prefetch`).

Partitions: dense decode without an extra operand on the tl kernel, the keys-as-M kernels
and the TMA-fed seesaw takes the balanced work list (`worklist`: every request's keys in
chunks of about the same size, so a long request is shared by all SMs) unless
`num_partitions` is given or `config.wl.balanced` is off; else `num_partitions`, or
`cache.dispatch.mla_num_partitions` (one wave of tiles over the longest request). The tl
kernel and the keys-as-M BF16 kernel at 16 rows walk the list's contiguous runs instead
(`RUN_KERNELS`, `config.wl.wl_runs`; one wave of items where those fit).
The measurements behind each choice: docs/kernels/triton_mla.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, NamedTuple

import torch

from ...cache.dispatch import MLA_CTAS_PER_SM, mla_num_partitions, mla_tile, num_sms
from ...errors import check
from ..pdl import pdl_enabled
from . import tuning as _tuning
from .sm90.gluon_mla import (
    RUNS_TRACE_SLOTS,
    TILE_TRACE_SLOTS,
    _mla_decode_sm90,
    _mla_decode_sm90_t,
)
from .sm90.gluon_mla_ps import _mla_decode_sm90_ps
from .sm90.gluon_mla_ss import _mla_decode_sm90_ss
from .sm90.gluon_mla_st import _mla_decode_sm90_st, st_descriptors
from .sm90.gluon_mla_tw import _mla_decode_sm90_tw
from .triton_mla_args import FMT_BF16, FMT_ROPE_AWARE, FMT_V32, DecodeArgs, OperandArgs
from .triton_mla_kernel import _mla_decode_kernel
from .tuning import KeysAsMTuning, MLATuning, SeesawTuning, Sm90Tuning, TlTuning

# The cluster seesaws' runtime arguments that hold shared offsets (`ops.launch` smem_args).
SS_CROSS_SMEM = MappingProxyType({"OFF_K": "k_lat", "OFF_READY": "ready", "OFF_REMPTY": "rempty"})


class LaunchPlan(NamedTuple):
    """One decode launch, chosen (immutable): `launch(kernel, grid, *<args>(...),
    cluster=cluster, smem_args=smem_args, **kwargs)`, then the split-K combine where
    `partitions` > 1 (the persistent kernel: where `ps` (G, L, NPR) has L % NPR)."""

    kernel: Any
    args: str  # the positional list: "tl_args", "sm90_args" or "ps_args" of DecodeArgs
    grid: tuple[int, ...]
    # constexprs, launch options, keyword runtime arguments: a dict made for this plan alone (a
    # read-only view would cost the launch's ** 8 us more on the CI CPU)
    kwargs: dict[str, Any]
    partitions: int = 1  # P (split-K)
    cluster: int = 1
    smem_args: Mapping[str, str] | None = None
    ps: tuple[int, int, int] | None = None  # the persistent kernel's (G, L, NPR)
    # the balanced work list's (TARGET, MIN_BLOCKS) (`worklist`): grid (TARGET + tokens) x NHB;
    # with `runs`, the contiguous runs' (RUN_P, MIN_BLOCKS): grid RUN_P x NHB
    balanced: tuple[int, int] | None = None
    runs: bool = False


def _next_pow2(n: int) -> int:
    """`triton.next_power_of_2(n)` for n >= 1, without its 4.6 us a host call (a Triton
    constexpr function: it unwraps its arguments and imports on every call; CI CPU)."""
    return 1 << (n - 1).bit_length()


def _mean_q_len(tokens: int, batch: int) -> int:
    """Query tokens a request, on average, rounded up and capped at 8 (tiles share keys)."""
    return min(8, max(1, -(-tokens // max(batch, 1))))


def _tile_config(
    h_q: int, tokens: int, batch: int, sparse: bool, fp8: bool, tuning: TlTuning | None = None
) -> dict:
    """The portable kernel's tile: BM (query rows a tile), HPT (heads a tile), TPT (tokens a
    tile), NHB (head blocks), BN, warps and pipeline depth. Rows are (token, head) pairs of one
    request."""
    t = _tuning.from_env().tl if tuning is None else tuning
    want = h_q if sparse else h_q * _mean_q_len(tokens, batch)
    bm = t.BM if t.BM is not None else min(64, max(16, _next_pow2(want)))
    if h_q > bm:  # heads in blocks of BM, one token a tile
        hpt, tpt = bm, 1
    else:  # all heads of up to BM // h_q tokens (dense) a tile
        hpt, tpt = h_q, (1 if sparse else max(1, bm // h_q))
    nhb = -(-h_q // hpt)
    if bm <= 32:  # memory-bound tiles: BF16 BN=16 x 4 warps (2 CTAs/SM), FP8 BN=64 x 8 warps
        warps, bn = (8, 64) if fp8 else (4, 16)
    else:  # 64-row tiles (on sm_90 the Gluon kernel serves most of these)
        warps, bn = 8, 32
    warps = t.num_warps if t.num_warps is not None else warps
    bn = t.BN if t.BN is not None else bn
    return dict(BM=bm, HPT=hpt, TPT=tpt, NHB=nhb, BN=bn, num_warps=warps,
                num_stages=t.num_stages)  # fmt: skip


def _prefetch(op: OperandArgs, cfg: dict, tuning: TlTuning | None = None) -> bool:
    """Hand-pipelined loads (PREFETCH) for memory-bound (<= 32-row) tiles, Triton's pipeliner
    for 64-row tiles (measured: 88 vs 121 TFLOP/s); never for per-element scales."""
    t = _tuning.from_env().tl if tuning is None else tuning
    if t.prefetch is not None:
        return bool(t.prefetch) and op.prefetch_default
    return op.prefetch_default and cfg["BM"] <= 32


def _sm90_config(h_q: int, sparse: bool, fmt: int, tuning: Sm90Tuning | None = None) -> dict:
    """Tile of the 64-row sm_90 kernels: 64 rows (heads of one token, or all heads of up to
    64 // h_q tokens in dense mode; padded), BN keys a tile, an NBUF-deep cp.async ring; PIPE
    (BF16 only: FP8 tiles are dequantized into one buffer that the previous P V still reads);
    SS: the seesaw takes it (BF16 and V32: rope-aware FP8 folds its per-token scale into S and
    P, where the seesaw's producer would round the dequantized tile to bf16)."""
    t = _tuning.from_env().sm90 if tuning is None else tuning
    fp8 = fmt != FMT_BF16
    hpt = min(h_q, 64)
    tpt = 1 if (sparse or h_q >= 64) else 64 // h_q
    bn = t.sm90_bn
    nbuf = t.sm90_nbuf if t.sm90_nbuf is not None else (4 if bn == 32 else 2)
    pipe = (not fp8) and t.sm90_pipe is not False
    ss = bn == 64 and nbuf == 2 and fmt in (FMT_BF16, FMT_V32) and t.sm90_ss is not False
    return dict(BM=64, HPT=hpt, TPT=tpt, NHB=-(-h_q // hpt), BN=bn, NBUF=nbuf, PIPE=pipe, SS=ss)


def _sm90_t_config(
    h_q: int,
    tokens: int,
    batch: int,
    sparse: bool,
    fmt: int,
    hbm3e: bool = False,
    tuning: KeysAsMTuning | None = None,
) -> dict | None:
    """Tile of the keys-as-M sm_90 kernels (`_mla_decode_sm90_t`; TW: `_mla_decode_sm90_tw`),
    or None where they do not serve: BF16 caches with at most 32 query rows a tile, rope-aware
    FP8 with at most 16 (FP8 at 32 rows: 64 more accumulator registers). In dense mode the
    heads of several tokens of a request share the tile, as many as the mean query length asks
    for. NR (the rows, padded) is 16 or 32. TW: rope-aware FP8 at 16 rows, whose ring keeps 4
    stages on an H200-class part (hbm3e, `cache.dispatch.fast_hbm`), else 3."""
    t = _tuning.from_env().t if tuning is None else tuning
    if t.sm90_t is False or h_q > 32 or fmt not in (FMT_BF16, FMT_ROPE_AWARE):
        return None
    max_rows = 32 if fmt == FMT_BF16 else 16
    if h_q > max_rows:
        return None
    tpt = 1 if sparse else max(1, min(_mean_q_len(tokens, batch), max_rows // h_q))
    nr = max(16, _next_pow2(h_q * tpt))
    nbuf = t.sm90_t_nbuf
    tw = fmt == FMT_ROPE_AWARE and nr == 16 and t.sm90_tw is not False
    if tw:
        nbuf = t.tw_nbuf if t.tw_nbuf is not None else (4 if hbm3e else 3)
    return dict(HPT=h_q, TPT=tpt, NHB=1, BN=64, NBUF=nbuf, NR=nr, TW=tw)


def sm90_serves(q: torch.Tensor, K: OperandArgs, has_x: bool, d_qk: int) -> bool:
    """Whether the Gluon sm_90 kernels take these operands on an sm_90 device (what
    `triton_mla._use_sm90_path` asks beside the device; `ops.offline` captures take it alone):
    BF16 queries, d_qk 576, a paged BF16 / rope-aware / V32 cache with 16-byte aligned rows,
    no extra cache."""
    return (
        q.dtype == torch.bfloat16
        and d_qk == 576
        and K.fmt in (FMT_BF16, FMT_ROPE_AWARE, FMT_V32)
        and K.paged
        and not has_x
        and K.data.data_ptr() % 16 == 0
        and (K.stride * K.data.element_size()) % 16 == 0
        and (K.fmt != FMT_ROPE_AWARE or K.sc.data_ptr() % 4 == 0)
    )


def _st_eligible(K: OperandArgs, sparse: bool, tuning: SeesawTuning | None = None) -> bool:
    """Whether the TMA-fed seesaw (`gluon_mla_st`) serves a seesaw launch: dense BF16 pages of
    whole 64-key tiles (unless `ss_tma` is off)."""
    t = _tuning.from_env().ss if tuning is None else tuning
    return t.ss_tma is not False and K.fmt == FMT_BF16 and not sparse and K.paged and K.ps % 64 == 0


def _page_size_constexpr(ps: int, enabled: bool = True) -> int:
    """The page size as a compile-time constant of a producer's tile loop (PS_C), or 0 (a
    run-time value): powers of two, which then split an index into page and offset with a
    shift and a mask instead of a run-time integer division (~15 instructions a row on the
    producer's path to its next loads). `enabled` False: always 0."""
    return ps if enabled and ps & (ps - 1) == 0 else 0


def _int32_rows(K: OperandArgs, enabled: bool = True) -> bool:
    """Whether a producer numbers a tile's rows in int32 and derives every pointer of a row
    from one int64 offset product (ADDR): where the cache has fewer than 2^31 rows, unless
    `enabled` is False."""
    return bool(enabled) and K.data.shape[0] < 2**31


def _ss_qasync(cfg: dict, h_q: int, want: bool) -> bool:
    """Whether the seesaw cp.asyncs q (`gluon_mla_ss` SS_QASYNC): where `want`, with one token
    a tile and whole 64-head blocks (h_q 64 or 128) only."""
    eligible = cfg["TPT"] == 1 and cfg["HPT"] == 64 and h_q == 64 * cfg["NHB"]
    return eligible and bool(want)


def ps_plan(
    tokens: int, n_idx: int, dev: torch.device, tuning: SeesawTuning | None = None
) -> tuple[int, int, int]:
    """(G, L, NPR) of the persistent sparse V32 kernel (`gluon_mla_ps`): G clusters of two
    CTAs (one a pair of SMs, at most one a token; `ps_g` forces it: more than num_sms // 2 runs
    in waves), L pairs of 64-key tiles a cluster (>= NPR), NPR pairs a token (its `indices`
    width)."""
    t = _tuning.from_env().ss if tuning is None else tuning
    npr = max(1, -(-n_idx // 128))
    g = max(1, min(t.ps_g if t.ps_g is not None else num_sms(dev) // 2, tokens))
    return g, -(-tokens * npr // g), npr


def _trace_kwargs(tr: torch.Tensor | None) -> dict:
    """A development trace buffer's kernel arguments: TRACE 2 (the seesaws' tile trace) for
    rows that hold one (`gluon_mla.TILE_TRACE_SLOTS` after the kernel's own slots), 3 for rows
    of `RUNS_TRACE_SLOTS` (the keys-as-M kernel's runs prologue, `dev/trace_mla_runs.py`), else 1."""
    if tr is None:
        return {}
    if tr.shape[1] > TILE_TRACE_SLOTS:
        return dict(TRACE=2, TR=tr)
    return dict(TRACE=3 if tr.shape[1] == RUNS_TRACE_SLOTS else 1, TR=tr)


def _partitions(
    a: DecodeArgs, num_partitions: int | None, rope_fp8_t: bool, dev: torch.device
) -> int:
    """P: `num_partitions`, else one wave of tiles (`cache.dispatch.mla_num_partitions`) over
    the longest key range a request can have; rope_fp8_t: the register-operand FP8 kernel (the
    keys-as-M one on a rope-aware cache) serves, with its own tile."""
    if num_partitions is None:
        K, sparse, tokens = a.K, a.sparse, a.tokens
        if sparse:
            bound = a.idx.shape[1]
        elif K.paged:
            bound = K.lut.shape[1] * K.ps
        else:
            bound = K.data.shape[0]
        if a.has_x:
            bound += a.x_idx.shape[1]
        est_sq = 1 if sparse else _mean_q_len(tokens, a.batch)
        units_batch = tokens if sparse else a.batch
        tile = mla_tile(a.h_q, a.d_qk, rope_fp8_t, dev)
        num_partitions = mla_num_partitions(units_batch, a.h_q, est_sq, bound, num_sms(dev), *tile)
    P = int(num_partitions)
    check(P >= 1, "num_partitions", "an int >= 1", num_partitions)
    return P


def _common(kwargs: dict, a: DecodeArgs, cfg: dict, P: int) -> dict:
    """`kwargs` with the constexprs every non-persistent kernel takes."""
    kwargs.update(
        H_Q=a.h_q, D_QK=a.d_qk, D_V=a.d_v, HPT=cfg["HPT"], TPT=cfg["TPT"], NHB=cfg["NHB"],
        B_P2=_next_pow2(a.batch + 1), CAUSAL=a.causal, HAS_SINK=a.sink is not None,
        SPLIT=P > 1, BN=cfg["BN"], PDL=P > 1 and pdl_enabled(a.q),
    )  # fmt: skip
    return kwargs


# The kernels that walk contiguous runs (`worklist`, "Contiguous runs"; the TMA-fed seesaw only
# with `wl_st_runs`); the others of the
# balanced list take one item a program, and so does the keys-as-M kernel at 32 query rows
# (TPT 2 at 16 heads), where the runs' state spills inside its key loop (offline sm_90 compile:
# 23 LDL and 9 STL between its MMAs, none at 16 rows).
RUN_KERNELS = (_mla_decode_kernel, _mla_decode_sm90_t, _mla_decode_sm90_st)


def _balanced_eligible(a: DecodeArgs, config: MLATuning, num_partitions: int | None) -> bool:
    """Whether the balanced work list (`worklist`) serves: dense decode without an extra
    operand, no explicit `num_partitions`, `config.wl.balanced`."""
    return config.wl.balanced and num_partitions is None and not a.sparse and not a.has_x


def _balance(plan: LaunchPlan, a: DecodeArgs, config: MLATuning, ctas_per_sm: int) -> LaunchPlan:
    """`plan` (one partition, grid x = tokens x head blocks [/ cluster]) on the balanced work
    list: TARGET = `wl_waves` waves of `ctas_per_sm` resident CTAs a SM over the head blocks,
    the grid (TARGET + tokens) x NHB, the kernel's BALANCED constexprs and PDL (the combine
    follows). On the kernels that walk contiguous runs (`RUN_KERNELS`, `wl_runs`): RUN_P =
    TARGET programs a head block, grid RUN_P x NHB, the RUNS constexprs (the TMA-fed
    seesaw's items over `wl_st_item_waves` waves, the others' over one), pieces of at least
    `wl_run_min_blocks` blocks."""
    nhb, wl = plan.kwargs["NHB"], config.wl
    check(type(wl.wl_order) is int and wl.wl_order in (0, 1), "config.wl.wl_order", "0 or 1",
          wl.wl_order)  # fmt: skip
    target = max(1, num_sms(a.q.device) * ctas_per_sm * wl.wl_waves // nhb)
    st = plan.kernel is _mla_decode_sm90_st
    runs = plan.kernel in RUN_KERNELS and (wl.wl_st_runs or not st)
    if wl.wl_runs and runs and plan.kwargs.get("NR", 16) == 16:
        waves = wl.wl_st_item_waves if st else 1
        kwargs = dict(plan.kwargs, RUNS=True, RUN_P=target, RUN_OVH=wl.wl_overhead,
                      ITEM_WAVES=waves if wl.wl_one_wave else 0,
                      MIN_BLOCKS=wl.wl_run_min_blocks, SPLIT=False,
                      PDL=pdl_enabled(a.q))  # fmt: skip
        if wl.wl_xseg and plan.kernel is _mla_decode_sm90_t and plan.kwargs["NBUF"] == 2:
            kwargs["RUN_XSEG"] = True
        return plan._replace(grid=(target * nhb,), kwargs=kwargs, partitions=1,
                             balanced=(target, wl.wl_run_min_blocks), runs=True)  # fmt: skip
    kwargs = dict(plan.kwargs, BALANCED=True, TARGET=target, MIN_BLOCKS=wl.wl_min_blocks,
                  SPLIT=False, PDL=pdl_enabled(a.q),
                  **({"LIST_ORDER": wl.wl_order} if wl.wl_order else {}))  # fmt: skip
    grid = ((target + a.tokens) * nhb,)
    return plan._replace(grid=grid, kwargs=kwargs, partitions=1,
                         balanced=(target, wl.wl_min_blocks))  # fmt: skip


def _tl_plan(a: DecodeArgs, config: MLATuning, num_partitions: int | None) -> LaunchPlan:
    """The portable kernel's launch."""
    K, X, t = a.K, a.X, config.tl
    cfg = _tile_config(a.h_q, a.tokens, a.batch, a.sparse, K.fmt != FMT_BF16, t)
    P = _partitions(a, num_partitions, False, a.q.device)
    kwargs = dict(
        BM=cfg["BM"],
        K_FMT=K.fmt, K_AMODE=K.amode, K_FOLD_T=K.fold_t, K_NC=K.nc, K_CW=K.cw, K_G=K.g,
        K_E8M0=K.e8m0, K_PAGED=K.paged, K_SPARSE=a.sparse, K_HAS_TOPK=a.topk is not None,
        K_TOPK_TOK=a.topk_tok,
        HAS_X=a.has_x, X_FMT=X.fmt, X_AMODE=X.amode, X_FOLD_T=X.fold_t, X_NC=X.nc, X_CW=X.cw,
        X_G=X.g, X_E8M0=X.e8m0, X_PAGED=X.paged, X_HAS_TOPK=a.x_topk is not None,
        X_TOPK_TOK=a.x_topk_tok,
        NUM_STAGES=cfg["num_stages"], K_PREFETCH=_prefetch(K, cfg, t),
        X_PREFETCH=_prefetch(X, cfg, t), K_ALIGN=K.align, X_ALIGN=X.align,
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
    )  # fmt: skip
    balanced = _balanced_eligible(a, config, num_partitions)
    P = 1 if balanced else P
    _common(kwargs, a, cfg, P)
    plan = LaunchPlan(_mla_decode_kernel, "tl_args", (a.tokens * cfg["NHB"], P), kwargs, P)
    if not balanced:
        return plan
    # BF16 tiles of <= 32 rows hold two CTAs a SM (`_tile_config`), others one
    return _balance(plan, a, config, 2 if cfg["BM"] <= 32 and K.fmt == FMT_BF16 else 1)


def _persistent_plan(
    a: DecodeArgs, config: MLATuning, regs: tuple[int, int], step: dict
) -> LaunchPlan:
    """Sparse V32 with two head blocks a token on the persistent cluster kernel; regs and step
    (DEQ1, PS_C, ADDR: the producer's tile step) as the per-token cluster kernel takes them."""
    g, L, npr = ps_plan(a.tokens, a.idx.shape[1], a.q.device, config.ss)
    kwargs = dict(
        H_Q=a.h_q, D_V=a.d_v, B_P2=_next_pow2(a.batch + 1),
        HAS_SINK=a.sink is not None, HAS_TOPK=a.topk is not None, TOPK_TOK=a.topk_tok, BN=64,
        CONSUMER_REGS=regs[0], PRODUCER_REGS=regs[1], EPI=config.ss.ps_epi,
        ORDER=config.ss.ps_order, num_warps=4, **step, **_trace_kwargs(config.trace),
    )  # fmt: skip
    return LaunchPlan(
        _mla_decode_sm90_ps, "ps_args", (g,), kwargs, 1, 2, SS_CROSS_SMEM,
        (g, L, npr),
    )  # fmt: skip


def _keys_as_m(a: DecodeArgs, cfg: dict, t: KeysAsMTuning) -> tuple[Any, dict]:
    """(kernel, its own constexprs) of a keys-as-M tile (`_sm90_t_config`)."""
    extra = dict(NR=cfg["NR"], PF=t.t_pf, KSWZ=t.t_kswz, num_warps=4)
    if not cfg["TW"]:
        return _mla_decode_sm90_t, extra
    fold = bool(t.tw_fold)
    extra.update(
        CONSUMER_REGS=t.tw_regs[0], PRODUCER_REGS=t.tw_regs[1], PRE=t.tw_pre,
        PS_C=_page_size_constexpr(a.K.ps, t.tw_psc), ADDR=_int32_rows(a.K, t.tw_addr),
        FOLD=fold, SPEC=fold and bool(t.tw_spec),  # SPEC needs FOLD
    )  # fmt: skip
    return _mla_decode_sm90_tw, extra


def _sm90_plan(
    a: DecodeArgs, config: MLATuning, num_partitions: int | None, hbm3e: bool
) -> LaunchPlan:
    """The Gluon sm_90 kernels' launch (module docstring: which one)."""
    K, h_q, sparse, s = a.K, a.h_q, a.sparse, config.ss
    cfg_t = _sm90_t_config(h_q, a.tokens, a.batch, sparse, K.fmt, hbm3e, config.t)
    cfg = cfg_t if cfg_t is not None else _sm90_config(h_q, sparse, K.fmt, config.sm90)
    balanced = _balanced_eligible(a, config, num_partitions)
    P = _partitions(a, num_partitions, cfg_t is not None and K.fmt == FMT_ROPE_AWARE, a.q.device)
    cluster = 1
    if cfg_t is not None:
        kernel, extra = _keys_as_m(a, cfg, config.t)
    elif cfg["SS"] and _st_eligible(K, sparse, s):  # the TMA-fed seesaw
        kd, kd3 = st_descriptors(K.data)
        kernel = _mla_decode_sm90_st
        extra = dict(REGS=s.st_regs, KD=kd, KD3=kd3, num_warps=4, K_lut_len=K.lut.shape[1])
    elif cfg["SS"]:
        kernel = _mla_decode_sm90_ss
        half = bool(s.ss_half)
        order = s.ss_order if s.ss_order is not None else (2 if K.fmt == FMT_BF16 else 1)
        cross = K.fmt == FMT_V32 and cfg["NHB"] == 2 and half and s.ss_cross
        regs = s.ss_regs
        if regs is None:
            regs = (232, 48) if K.fmt == FMT_BF16 else (200, 104) if cross else (200, 112)
        qasync = s.ss_qasync if s.ss_qasync is not None else (cross and sparse)
        extra = dict(SS_ORDER=order, SS_HALF=half, num_warps=4, CONSUMER_REGS=regs[0],
                     PRODUCER_REGS=regs[1], SS_QASYNC=_ss_qasync(cfg, h_q, qasync))  # fmt: skip
        if cross:  # the 2-CTA cluster kernel (each CTA dequantizes half of every tile)
            step = dict(DEQ1=bool(s.ss_deq1), PS_C=_page_size_constexpr(K.ps, s.ps_const),
                        ADDR=_int32_rows(K, s.ss_addr))  # fmt: skip
            splitcp = s.ss_splitcp if s.ss_splitcp is not None else not sparse
            extra.update(SS_CROSS=True, SS_SPLITCP=bool(splitcp), SS_DEQ1=step["DEQ1"],
                         PS_C=step["PS_C"], SS_ADDR=step["ADDR"])  # fmt: skip
            cluster = 2
            if sparse and P == 1 and s.ss_persist:
                return _persistent_plan(a, config, regs, step)
    else:
        kernel, extra = _mla_decode_sm90, dict(PIPE=cfg["PIPE"], num_warps=8)
    if kernel is not _mla_decode_sm90:  # the traced kernels
        extra.update(_trace_kwargs(config.trace))
    # the keys-as-M kernels and the TMA-fed seesaw take the balanced list or its runs (one CTA
    # a SM)
    balanced = balanced and kernel in (_mla_decode_sm90_t, _mla_decode_sm90_tw,
                                       _mla_decode_sm90_st)  # fmt: skip
    P = 1 if balanced else P
    kwargs = _common(extra, a, cfg, P)
    kwargs.update(SPARSE=sparse, HAS_TOPK=a.topk is not None, TOPK_TOK=a.topk_tok, FMT=K.fmt,
                  NBUF=cfg["NBUF"])  # fmt: skip
    grid = (a.tokens * cfg["NHB"] // cluster, P)  # grid x counts clusters
    smem = SS_CROSS_SMEM if cluster > 1 else None  # the kernel takes its own shared offsets
    plan = LaunchPlan(kernel, "sm90_args", grid, kwargs, P, cluster, smem)
    return _balance(plan, a, config, MLA_CTAS_PER_SM) if balanced else plan


def plan_decode(
    a: DecodeArgs,
    config: MLATuning,
    num_partitions: int | None = None,
    *,
    sm90: bool,
    hbm3e: bool = False,
) -> LaunchPlan:
    """The launch of one MLA decode (module docstring). sm90: the Gluon sm_90 kernels serve
    (an sm_90 device, `sm90_serves`); hbm3e: an H200-class part (`cache.dispatch.fast_hbm`):
    explicit, so that an offline capture can state them."""
    if sm90:
        return _sm90_plan(a, config, num_partitions, hbm3e)
    return _tl_plan(a, config, num_partitions)
