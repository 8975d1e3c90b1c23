"""The launch choices of the MLA decode kernels, as frozen configuration (`MLATuning`).

One frozen dataclass a kernel family, bundled in `MLATuning`:
  - `TlTuning`: the portable tl kernel (`triton_mla_kernel._mla_decode_kernel`);
  - `Sm90Tuning`: the 64-row Gluon kernels (`gluon_mla._mla_decode_sm90`, and whether the
    seesaw takes their BF16 / V32 tiles);
  - `KeysAsMTuning`: the keys-as-M kernels for few query rows (`_mla_decode_sm90_t`,
    `gluon_mla_tw._mla_decode_sm90_tw`);
  - `SeesawTuning`: the warp-specialized seesaws (`gluon_mla_ss`, the TMA-fed `gluon_mla_st`,
    the persistent `gluon_mla_ps`);
  - `WorkListTuning`: the balanced work list of dense decode (`worklist`).
Each field's default is what ships, with the measurement it came from (history:
docs/kernels/triton_mla.md). A default of None stands for a rule of the shipped selection
(`triton_mla_plan`), which the field's comment states; a value forces that choice.

Field names are unique across the families, so a flat mapping of names to values addresses
them: `MLATuning().replace(sm90_bn=32, ss_order=0)` (None restores a field's default), and
`PAGEDATTN_MLA_TUNING='{"sm90_bn": 32}'` (`pagedattn.env.tuning_overrides`) for development
runs; an unknown name raises InvalidArgumentError. `mla_decode_triton(config=None)` takes
`from_env()`: the shipped defaults with that variable's overrides, read at each call.

`MLATuning.trace` (development, `dev/gpu_mla_dev.py --trace`): an int64 buffer that the traced
sm_90 kernels fill with per-CTA timestamps (None: no trace code compiled in).
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, field
from typing import Any

from ... import env
from ...errors import InvalidArgumentError


@dataclass(frozen=True)
class TlTuning:
    """The portable kernel's tile (`triton_mla_plan._tile_config`, `_prefetch`)."""

    # Query rows a tile. None: the rows a tile can fill (h_q, times the mean query length in
    # dense mode), a power of two in [16, 64].
    BM: int | None = None
    # Keys a tile. None: 16 for BF16 and 64 for FP8 at <= 32 rows, 32 at 64 rows (H200,
    # gpu_mla_dev runs 2-3: as many bytes in flight as the registers hold unspilled).
    BN: int | None = None
    # None: 4 for BF16 and 8 for FP8 at <= 32 rows (2 / 1 CTAs a SM), 8 at 64 rows.
    num_warps: int | None = None
    num_stages: int = 3
    # Hand-pipelined loads (the kernel's PREFETCH). None: at <= 32 rows, where the register-held
    # next tile does not spill (64 rows: 88 vs 121 TFLOP/s); never for per-element scales.
    prefetch: bool | None = None


@dataclass(frozen=True)
class Sm90Tuning:
    """The 64-row sm_90 tile (`triton_mla_plan._sm90_config`)."""

    # H200 gpu_mla_dev run 3: BN 64 x 2 stages vs BN 32 x 3-4: dense bf16 h_q 128 0.80 vs 1.12 ms
    sm90_bn: int = 64
    sm90_nbuf: int | None = None  # cp.async ring stages; None: 4 at BN 32, else 2
    # BF16: P V waited for behind the next S (H100: h_q 128 s_k 8192 0.757 vs 0.797 ms)
    sm90_pipe: bool = True
    # BF16 / V32 tiles to the seesaw (H100: dense bf16 h_q 128 s_k 8192 484 vs 387 TF/s)
    sm90_ss: bool = True


@dataclass(frozen=True)
class KeysAsMTuning:
    """The keys-as-M kernels (`triton_mla_plan._sm90_t_config`): BF16 tiles of <= 32 query rows,
    rope-aware FP8 of <= 16 (`_mla_decode_sm90_t`; TW: `_mla_decode_sm90_tw`)."""

    sm90_t: bool = True  # False: the 64-row kernels take these tiles too
    sm90_t_nbuf: int = 2  # `_mla_decode_sm90_t`'s ring stages (BF16 73 KB tiles; FP8 two CTAs a SM)
    t_pf: bool = True  # each e4m3 chunk loaded one chunk ahead (`t_tile` PF; H100)
    t_kswz: int = 1  # FP8 stages laid out without bank conflicts (`t_raw_layout`; H100)
    # Rope-aware FP8 <= 16 rows to the warp-specialized kernel (H100: s_k 8192 237 us
    # vs 253 at P = 2 on the one-warpgroup kernel)
    sm90_tw: bool = True
    # TW ring stages. None: 3, 4 on an H200 (`hbm3e`; H200, s_k 8192 0.1580 vs
    # 0.1608 ms)
    tw_nbuf: int | None = None
    tw_regs: tuple[int, int] = (232, 48)  # setmaxnreg (consumer, producer)
    tw_pre: int = 1  # tiles issued by the CTA's warps before the partitions start
    # page size a compile-time constant (PS_C) and int32 rows (ADDR): H200 s_k 8192
    # 0.193 -> 0.186 ms
    tw_psc: bool = True
    tw_addr: bool = True
    # the scale folded into the softmax max (FOLD): H200 s_k 8192 0.186 -> 0.184 ms
    tw_fold: bool = True
    # SPEC (needs FOLD): H200 s_k 8192 0.193 -> 0.185 ms
    tw_spec: bool = True


@dataclass(frozen=True)
class SeesawTuning:
    """The seesaw kernels (`gluon_mla_ss`, `gluon_mla_st`, `gluon_mla_ps`; `triton_mla_plan`)."""

    # dense BF16 pages of whole tiles to the TMA-fed seesaw (H100: s_k 8192 0.589
    # vs 0.613 ms)
    ss_tma: bool = True
    st_regs: int = 240  # the TMA-fed seesaw's setmaxnreg
    # warpgroup 1's order in a pair of tiles. None: 2 for BF16, 1 for V32 (H100:
    # dense bf16 0.605 vs 0.626 ms, sparse V32 0.472 vs 0.492)
    ss_order: int | None = None
    ss_half: bool = True  # half-stage release (same measurement)
    # setmaxnreg (consumer, producer). None: (232, 48) for BF16, (200, 104) on the V32 cluster
    # kernel (H100: 0.415 vs 0.424 ms at 200 / 112), else (200, 112)
    ss_regs: tuple[int, int] | None = None
    # V32 with two head blocks a token to the 2-CTA cluster kernel (H100: sparse
    # 0.445 vs 0.468 ms from HBM)
    ss_cross: bool = True
    # the cluster kernel's groups copied to the peer once stored (SS_SPLITCP). None: dense only
    # (H100: dense V32 0.797 vs 0.820 ms, sparse 0.435 vs 0.428)
    ss_splitcp: bool | None = None
    # a half's two groups in one store (SS_DEQ1): H100 sparse V32 0.419-0.424 vs
    # 0.428-0.434 ms (same measurement as ss_splitcp)
    ss_deq1: bool = True
    ps_const: bool = True  # the cluster producer's page size a compile-time constant (PS_C)
    ss_addr: bool = True  # the cluster producer's int32 rows (SS_ADDR)
    # q cp.async'ed (SS_QASYNC; one token a tile, whole 64-head blocks only). None: sparse V32
    # cluster only (H200: 0.414 vs 0.416 ms; dense slower)
    ss_qasync: bool | None = None
    ss_persist: bool = False  # sparse V32 on the persistent cluster kernel (opt-in: slower)
    ps_epi: int = 1  # the persistent kernel's epilogue (0: 4-byte stores)
    ps_g: int | None = None  # its clusters; None: one a pair of SMs (at most one a token)
    ps_order: int = 1  # its work order (0: token order; 1: by query index where ragged)


@dataclass(frozen=True)
class WorkListTuning:
    """The balanced work list of dense decode (`worklist`; `triton_mla_plan`)."""

    # dense decode without num_partitions on the list (the tl kernel and, on sm_90, the
    # keys-as-M and TMA-fed seesaw kernels). False: one partition count for the batch.
    balanced: bool = True
    # the list's target: items a head block, in waves of the kernel's resident CTAs
    wl_waves: int = 1
    # blocks of BN keys an item holds at least (its prologue stays a small part of it)
    wl_min_blocks: int = 4
    # the kernels that have them (the portable one, the keys-as-M BF16 one) walk contiguous
    # runs of the step's blocks instead of one item a program (`worklist`, "Contiguous runs")
    wl_runs: bool = True
    # on those kernels, one item a program where the list's items fit one wave (no tile cut
    # mid-run: H200, bench_real, mla h_q 16 uniform b128 x 4k 0.150 ms on the list, 0.184 on
    # runs, which cut every request in two); runs otherwise
    wl_one_wave: bool = True
    # the TMA-fed seesaw (h_q 64-128) walks the runs too (opt-in): 0.85-0.90 of its item
    # list's time on skewed h_q 128 steps, but 1.08x on the uniform control and 1.12x on one
    # long request among short ones, so off until a choice keeps the list there (measured:
    # docs/kernels/gluon_mla_st.md, "Contiguous runs")
    wl_st_runs: bool = False
    # on the runs, the TMA-fed seesaw (one CTA a SM) takes the list's items over up to this
    # many waves where that many of the longest take at most 9/8 of a run: a uniform batch of
    # more whole tiles than programs keeps them whole (h_q 128 b128 x 4k: 0.97x the runs'
    # time, which cut nearly every tile; same section)
    wl_st_item_waves: int = 2
    # blocks a piece of the runs holds at least (`wl_min_blocks` is the item list's): small
    # batches, whose steps hold fewer than RUN_P x this many blocks, cut finer: H200,
    # bench_real, h_q 16 b1 / b8 x 1024 keys, device us a call 20.9 / 21.6 (4 blocks), 16.8 /
    # 18.3 (2), 16.2 / 18.3 (1); 29.3 / 29.6 (8, another run); the skewed, one-long and uniform
    # cases unchanged (their pieces hold 8-65 blocks); docs/kernels/triton_mla.md, "Small
    # batches"
    wl_run_min_blocks: int = 2
    # a tile's prologue and epilogue (q, its first pages, the ring fill, the store) in blocks
    # of the runs' stream: H200, per-CTA traces of the keys-as-M kernel on the suite's skewed
    # h_q 16 steps (`dev/trace_mla_runs.py`) fit 5.5-7.7 us a segment against 1.6-2.1 us a
    # 64-key BF16 block; 3 (2 before) took skew b128 / b256 193.3 / 363.0 -> 189.7 / 356.8 us
    # (graph replays), b64 105.7 -> 105.3, the one-wave cases unmoved
    # (docs/kernels/triton_mla.md, "The runs' prologue")
    wl_overhead: int = 3
    # opt-in: the keys-as-M BF16 kernel (two ring stages) keeps one ring across a run's
    # segments (`gluon_mla._t_runs_x`: a segment's first block in flight while the one before
    # it computes its last). H200, per-CTA traces (`dev/trace_mla_runs.py`): a segment's cost
    # 5.7-5.8 -> 3.7-4.0 us, but a block's 1.86-1.96 -> 2.03-2.08 us (255 registers with
    # spills, against 201), so graph replays moved skew b64 103.3 -> 102.4 us, b256 350.6 ->
    # 352.4, one long 37.9 -> 37.6, the uniform control 144.7 -> 146.3: off
    # (docs/kernels/triton_mla.md, "One ring across the runs' segments")
    wl_xseg: bool = False
    # the item list's order where one item a program serves (the TMA-fed seesaw, the keys-as-M
    # kernel at 32 rows, the rope-aware FP8 one, the portable kernel without runs): 1 by bucket
    # of the items' size, largest first (`ops.list_order.bucket_ends`), so that a grid of more
    # items than a wave starts its longest first; 0 request order. H200, graph replays
    # (`dev/profile_mla_skew.py`), request order -> buckets: h_q 128 skew b64 /
    # b128 226.5 / 439.1 -> 194.7 / 349.1 us, one long 81.5 -> 70.0, the uniform b128 control
    # 266.1 -> 269.9 (its combine then derived the buckets too; the partials now lie in
    # request order, `worklist.mla_find_item`'s slot, and it does not); h_q 16 (the runs)
    # unchanged (docs/kernels/triton_mla.md, "Longest items first, by buckets")
    wl_order: int = 1
    # the item list's combine (`worklist.MergeShape`): the first `wl_long_max` tokens whose
    # tile was cut into >= `wl_long_min` items are merged by `wl_long_fine` programs a (16
    # heads, 256 dims) instead of one; wl_long_max 0: none. H200, graph replays
    # (`dev/profile_mla_skew.py`, three calls): h_q 128 one long among 63 x 300 66.0-66.9 ->
    # 64.2-64.9 us; skewed b64 / b128 and the uniform control within their noise (1-2%); 2 or 8
    # parts, 1-2 slots and 2-8 partials a step no better (docs/kernels/triton_mla.md, "The
    # long chains' merge")
    wl_long_min: int = 16
    wl_long_max: int = 4
    wl_long_fine: int = 4


_FAMILIES = {
    "tl": TlTuning,
    "sm90": Sm90Tuning,
    "t": KeysAsMTuning,
    "ss": SeesawTuning,
    "wl": WorkListTuning,
}


@dataclass(frozen=True)
class MLATuning:
    """The MLA decode's launch choices: one config a kernel family, plus the dispatch's."""

    tl: TlTuning = field(default_factory=TlTuning)
    sm90: Sm90Tuning = field(default_factory=Sm90Tuning)
    t: KeysAsMTuning = field(default_factory=KeysAsMTuning)
    ss: SeesawTuning = field(default_factory=SeesawTuning)
    wl: WorkListTuning = field(default_factory=WorkListTuning)
    gluon: bool = True  # False: the portable kernel everywhere (no Gluon sm_90 kernel)
    # int64 [>= CTAs, slots] timestamps of the traced sm_90 kernels (development; module doc)
    trace: Any = field(default=None, compare=False)

    def replace(self, **knobs: Any) -> MLATuning:
        """This config with the fields named in `knobs` (any family's; None: the field's
        default) replaced. Unknown names raise InvalidArgumentError."""
        unknown = sorted(set(knobs) - set(_KNOB_FAMILY))
        if unknown:
            raise InvalidArgumentError(
                f"unknown MLATuning fields {unknown} (known: {sorted(_KNOB_FAMILY)})"
            )
        top: dict[str, Any] = {}
        groups: dict[str, dict[str, Any]] = {}
        for name, value in knobs.items():
            family = _KNOB_FAMILY[name]
            if value is None:
                value = _DEFAULTS[name]
            if family is None:
                top[name] = value
            else:
                groups.setdefault(family, {})[name] = value
        for family, values in groups.items():
            top[family] = dataclasses.replace(getattr(self, family), **values)
        return dataclasses.replace(self, **top)

    def knobs(self) -> dict[str, Any]:
        """Every field by its flat name (what `replace` takes)."""
        out = {n: getattr(self, n) for n in ("gluon", "trace")}
        for family in _FAMILIES:
            out.update(dataclasses.asdict(getattr(self, family)))
        return out


def _knob_family() -> dict[str, str | None]:
    names: dict[str, str | None] = {"gluon": None, "trace": None}
    for family, cls in _FAMILIES.items():
        for f in dataclasses.fields(cls):
            assert f.name not in names, f.name
            names[f.name] = family
    return names


_KNOB_FAMILY = _knob_family()
SHIPPED = MLATuning()
_DEFAULTS = SHIPPED.knobs()


def from_env() -> MLATuning:
    """The shipped config with `PAGEDATTN_MLA_TUNING`'s overrides (read now; parsed once a
    distinct value)."""
    spec = env.read("MLA_TUNING")
    return SHIPPED if spec is None else _from_spec(spec)


@functools.lru_cache(maxsize=8)
def _from_spec(spec: str) -> MLATuning:
    try:
        return SHIPPED.replace(**env.tuning_overrides("MLA"))
    except InvalidArgumentError as e:
        raise InvalidArgumentError(f"{env.PREFIX}MLA_TUNING: {e}") from None
