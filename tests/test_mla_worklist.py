"""The balanced work list of dense MLA decode (`pagedattn.ops.mla.worklist`) against the
float64 oracle of test_triton_mla and against the one-partition-count launch.

CPU runs use Triton's interpreter on the portable kernel; the GPU tests run the sm_90 kernels
that take the list (keys-as-M BF16 / rope-aware FP8, the TMA-fed seesaw) at skewed lengths:
one long request among empty and one-token ones, every SM sharing a single request, multi-token
queries, sinks, NaN in every unowned cache slot, sentinel pages, poisoned outputs, and a CUDA
graph replayed after the lengths changed.
"""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl
from test_triton_mla import (
    DEV,
    ON_GPU,
    build_cache,
    check,
    dense_keys,
    make_q,
    make_sinks,
    oracle,
    run,
    set_tuning,
    tol_for,
)

from pagedattn.errors import InvalidArgumentError
from pagedattn.ops.list_order import LIST_BUCKETS
from pagedattn.ops.mla import triton_mla
from pagedattn.ops.mla.tuning import MLATuning
from pagedattn.ops.mla.worklist import (
    mla_find_item,
    mla_host_item_count,
    mla_host_long_tokens,
    mla_host_run_programs,
    mla_host_runs,
    mla_work_list,
)
from pagedattn.testing import ragged_offsets


def _plan(q, kv, q_lens, **kw):
    """The launches `mla_decode_triton` makes (not run): (decode launch, combine called)."""
    from pagedattn.ops import offline

    calls = []
    launches = offline.capture(
        triton_mla,
        lambda: triton_mla.mla_decode_triton(q, kv, ragged_offsets(q_lens, q.device), **kw),
        mla_worklist_combine_triton=lambda *a, **k: calls.append(k),
        mla_runs_combine_triton=lambda *a, **k: calls.append(k),
        mla_combine_triton=lambda *a, **k: None,
    )
    return launches[0], calls


def _case(gen, fmt, cache_lens, q_lens, h_q=16, causal=True, sink=False, **kw):
    cache = build_cache(fmt, 576, 16, cache_lens, q_lens, gen, h_q)
    offs = ragged_offsets(q_lens).tolist()
    q = make_q(offs[-1], h_q, 576, gen)
    s = make_sinks(h_q, gen) if sink else None
    o, lse = run(q, cache.operand(), q_lens, causal=causal, attn_sink=s, **kw)
    ref = oracle(q, offs, dense_keys(cache, cache_lens, q_lens, causal), sink=s)
    check(o, lse, *ref, tol_for(fmt, 576))
    return q, cache, o, lse


SKEWED = [
    # format, cache_lens, q_lens, h_q, causal, sink
    ("bf16", [700, 0, 1, 40, 3], [1, 1, 1, 1, 1], 16, True, False),  # one long, 0 and 1
    ("bf16", [0, 0, 0], [1, 1, 1], 16, True, True),  # nothing cached
    ("bf16", [300, 5, 129], [4, 2, 3], 16, True, True),  # multi-token tiles (TPT > 1)
    ("bf16", [260, 17], [1, 3], 20, False, False),  # heads not a power of two, non-causal
    ("rope_aware", [513, 2, 0, 64], [1, 1, 2, 1], 16, True, True),
    ("fp8_g64_e8m0", [400, 1], [2, 1], 16, True, False),
    ("bf16", [450], [1], 128, True, True),  # one request over every item, two head blocks
    ("bf16", [2600, 5, 0], [1, 1, 1], 16, True, True),  # > 8 pieces: the combine's 2nd step
    ("bf16", [3, 0, 90, 1, 900, 40], [1, 1, 2, 1, 1, 1], 16, True, True),  # long ones last
]


@pytest.mark.parametrize(
    "fmt,cache_lens,q_lens,h_q,causal,sink",
    SKEWED,
    ids=[f"{c[0]}-b{len(c[1])}-max{max(c[1])}-sq{max(c[2])}-h{c[3]}" for c in SKEWED],
)
@pytest.mark.parametrize(
    "knobs",
    [{"wl_one_wave": False}, {}, {"wl_runs": False}, {"wl_runs": False, "wl_order": 0}],
    ids=["runs", "one-wave", "items", "items-request-order"],
)
def test_balanced_list_matches_the_oracle(
    gen, monkeypatch, fmt, cache_lens, q_lens, h_q, causal, sink, knobs
):
    """Skewed lengths on the contiguous runs, on one wave of items (program p, item p: the
    runs' launch where the list fits one wave) and on the item list's own launch, by size (the
    default) and in request order (`wl_order` 0): long requests cut into many pieces or items
    (min 4 blocks of BN keys on the CPU's target), whole tiles written directly."""
    set_tuning(monkeypatch, knobs)
    _case(gen, fmt, cache_lens, q_lens, h_q, causal, sink)


def test_one_request_over_every_program(gen, monkeypatch):
    """One request cut over every program of the runs (pieces of two units: ~140 pieces, the
    runs' combine merging them all), beside requests of 0 and 1 cached keys, with sinks."""
    set_tuning(monkeypatch, {"wl_one_wave": False, "wl_run_min_blocks": 1})
    cache_lens, q_lens = [4500, 0, 1], [1, 1, 1]
    q, cache, _, _ = _case(gen, "bf16", cache_lens, q_lens, sink=True)
    launch, _ = _plan(q, cache.operand(), q_lens)
    kw = launch.kwargs
    runs = mla_host_runs(ragged_offsets(q_lens), torch.tensor(cache_lens), tpt=1, bn=kw["BN"],
                         ovh=kw["RUN_OVH"], run_p=kw["RUN_P"], run_min=1)  # fmt: skip
    pieces = max(s[4] for r in runs for s in r if s[0] == 0)
    # every program shares it but those the other units fill (pieces of at least one unit:
    # the short requests' blocks and prologues, the long one's prologue)
    others = 2 * (1 + kw["RUN_OVH"]) + kw["RUN_OVH"]
    assert pieces >= launch.grid[0] - others and pieces > 100


def test_runs_give_orphan_tokens_zero(gen):
    """Tokens past q_row_offsets[batch] (no request) get output 0 and LSE -inf on the runs,
    whatever the buffers held before (poisoned output)."""
    cache_lens, q_lens = [900, 3], [1, 2]
    cache = build_cache("bf16", 576, 16, cache_lens, q_lens, gen, 16)
    q = make_q(5, 16, 576, gen)
    out = torch.full((5, 16, 512), float("nan"), dtype=torch.bfloat16, device=DEV)
    o, lse = triton_mla.mla_decode_triton(q, cache.operand(), ragged_offsets(q_lens, DEV), out=out)
    assert torch.all(o[3:] == 0) and torch.all(lse[3:] == float("-inf"))
    ref = oracle(q[:3], [0, 1, 3], dense_keys(cache, cache_lens, q_lens, True))
    check(o[:3], lse[:3], *ref, tol_for("bf16", 576))


@pytest.mark.parametrize("order", [2, -1, True])
def test_bad_list_order_is_named_and_writes_nothing(gen, order):
    """A list order other than 0 or 1 gets a typed error naming the knob before any launch,
    on the runs too (which keep request order): the output keeps its poison."""
    cache_lens, q_lens = [900, 3, 40], [1, 1, 1]
    cache = build_cache("bf16", 576, 16, cache_lens, q_lens, gen, 16)
    q = make_q(3, 16, 576, gen)
    out = torch.full((3, 16, 512), float("nan"), dtype=torch.bfloat16, device=DEV)
    with pytest.raises(InvalidArgumentError, match="wl_order"):
        triton_mla.mla_decode_triton(q, cache.operand(), ragged_offsets(q_lens, DEV), out=out,
                                     config=MLATuning().replace(wl_order=order))  # fmt: skip
    assert torch.isnan(out.float()).all()


def test_host_runs_cover_every_block_once():
    """The runs' arithmetic (`mla_host_runs`, the kernels' mirror) for random skewed lengths,
    piece counts and tiles: every block of every tile is walked exactly once, a tile is cut
    into as many segments as it says, its slots are distinct (2 p or 2 p + 1 of its piece p,
    the first at the piece holding its first block), and no piece holds more than
    max(ceil(units / pieces), min) units."""
    g = torch.Generator().manual_seed(3)
    for _ in range(150):
        b = int(torch.randint(1, 30, (1,), generator=g))
        q_lens = torch.randint(0, 6, (b,), generator=g)
        cl = (torch.exp(torch.randn(b, generator=g) * 2.0) * 40).long().clamp(max=40000)
        run_p = int(torch.randint(1, 150, (1,), generator=g))
        tpt, ovh = (
            int(torch.randint(1, 4, (1,), generator=g)),
            int(torch.randint(0, 4, (1,), generator=g)),
        )
        run_min = int(torch.randint(1, 6, (1,), generator=g))
        offs = torch.cat([torch.zeros(1, dtype=torch.long), q_lens.cumsum(0)])
        runs = mla_host_runs(offs, cl, tpt=tpt, bn=64, ovh=ovh, run_p=run_p, run_min=run_min)
        seen: dict[int, list] = {}
        for p, segs in enumerate(runs):
            for t, lo, hi, slot, n in segs:
                assert slot in (2 * p, 2 * p + 1)
                seen.setdefault(t, []).append((lo, hi, slot, n))
        _, n_pieces = mla_host_run_programs(offs, cl, tpt=tpt, bn=64, ovh=ovh, run_p=run_p,
                                            run_min=run_min, item_waves=0)  # fmt: skip
        assert all(not segs for segs in runs[n_pieces:])
        for bi in range(b):
            w = -(-(int(cl[bi]) + int(q_lens[bi])) // 64)
            for j in range(-(-int(q_lens[bi]) // tpt)):
                segs = sorted(seen.pop(int(offs[bi]) + j * tpt))
                assert [s[0] for s in segs][0] == 0 and segs[-1][1] == w
                assert all(a[1] == c[0] for a, c in zip(segs, segs[1:]))  # contiguous, once
                assert all(s[3] == len(segs) for s in segs)
                assert len({s[2] for s in segs}) == len(segs)
        assert not seen


def test_balanced_list_equals_one_partition_count(gen, monkeypatch):
    """The list and the one-partition-count launch give the same outputs (both within the
    oracle's bound, and close to each other)."""
    q, cache, o, lse = _case(gen, "bf16", [900, 3, 0, 77], [1, 1, 1, 1], sink=True)
    set_tuning(monkeypatch, {"balanced": False})
    o2, lse2 = run(q, cache.operand(), [1, 1, 1, 1], attn_sink=None)
    set_tuning(monkeypatch, {"balanced": True})
    o3, lse3 = run(q, cache.operand(), [1, 1, 1, 1], attn_sink=None)
    torch.testing.assert_close(o3.float(), o2.float(), atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(lse3, lse2, atol=1e-4, rtol=1e-5)


@pytest.mark.parametrize("one_wave", [True, False])
def test_the_runs_are_taken_and_split_a_long_request(gen, monkeypatch, one_wave):
    """Dense decode without num_partitions on the portable kernel takes the runs' launch (grid:
    the programs that have work x head blocks on the host-length path: the list's items where
    they fit one wave of RUN_P, else the pieces that hold units), a long request is cut in
    many and the runs' combine follows."""
    set_tuning(monkeypatch, {"wl_one_wave": one_wave})
    cache_lens, q_lens = [2000, 1, 0], [1, 1, 1]
    cache = build_cache("bf16", 576, 16, cache_lens, q_lens, gen, 16)
    q = make_q(3, 16, 576, gen)
    launch, combines = _plan(q, cache.operand(), q_lens)
    kw = launch.kwargs
    assert kw["RUNS"] and kw["ITEM_WAVES"] == int(one_wave) and not kw.get("BALANCED")
    assert len(combines) == 1 and "run_p" in combines[0] and kw["META"].shape == (3, 4)
    offs, cl = ragged_offsets(q_lens), torch.tensor(cache_lens, dtype=torch.int32)
    items, n = mla_host_run_programs(offs, cl, tpt=kw["TPT"], bn=kw["BN"], ovh=kw["RUN_OVH"],
                                     run_p=kw["RUN_P"], run_min=kw["MIN_BLOCKS"],
                                     item_waves=int(one_wave))  # fmt: skip
    assert items == one_wave and n > 5 and launch.grid == (n * kw["NHB"],)
    if one_wave:
        assert n == mla_host_item_count(offs, cl, tpt=kw["TPT"], bn=kw["BN"], target=kw["RUN_P"],
                                        min_blocks=kw["MIN_BLOCKS"])  # fmt: skip


def test_item_waves_keep_uniform_tiles_whole():
    """The choice of `RUNS` launches (`mla_host_run_programs`, the kernels' mirror): a uniform
    batch of more whole tiles than programs takes the list over two waves where allowed (the
    TMA-fed seesaw: h_q 128 b128 x 4k, 128 tiles a head block for 66 programs; every program
    has work) and the runs otherwise; skewed lengths, whose longest items take more than half
    a run, take the runs at any wave count; a list of one wave takes items at any count."""
    kw = dict(tpt=1, bn=64, ovh=2, run_p=66, run_min=2)
    offs = ragged_offsets([1] * 128)
    uniform = torch.full((128,), 4095, dtype=torch.int32)
    assert mla_host_run_programs(offs, uniform, item_waves=2, **kw) == (True, 66)
    items, n = mla_host_run_programs(offs, uniform, item_waves=1, **kw)
    assert not items and n == 66
    g = torch.Generator().manual_seed(0)
    skew = (torch.exp(torch.randn(64, generator=g)) * 3072).long().clamp(32, 32768)
    offs64 = ragged_offsets([1] * 64)
    for waves in (0, 1, 2, 3):
        assert not mla_host_run_programs(offs64, skew, item_waves=waves, **kw)[0]
    few = torch.full((40,), 100, dtype=torch.int32)
    assert mla_host_run_programs(ragged_offsets([1] * 40), few, item_waves=2, **kw) == (True, 40)
    assert not mla_host_run_programs(ragged_offsets([1] * 40), few, item_waves=0, **kw)[0]


def test_the_list_is_taken_and_splits_a_long_request(gen, monkeypatch):
    """With the runs off, dense decode without num_partitions takes the item list (grid
    (items) x head blocks on the host-length path), a long request gets many items and the
    combine runs; num_partitions and sparse keep one partition count."""
    set_tuning(monkeypatch, {"wl_runs": False})
    cache_lens, q_lens = [2000, 1, 0], [1, 1, 1]
    cache = build_cache("bf16", 576, 16, cache_lens, q_lens, gen, 16)
    q = make_q(3, 16, 576, gen)
    launch, combines = _plan(q, cache.operand(), q_lens)
    kw = launch.kwargs
    assert kw["BALANCED"] and len(combines) == 1
    items = mla_host_item_count(
        ragged_offsets(q_lens), torch.tensor(cache_lens, dtype=torch.int32),
        tpt=kw["TPT"], bn=kw["BN"], target=kw["TARGET"], min_blocks=kw["MIN_BLOCKS"],
    )  # fmt: skip
    assert items > 10 and launch.grid == (items * kw["NHB"],)
    launch, combines = _plan(q, cache.operand(), q_lens, num_partitions=2)
    assert not launch.kwargs.get("BALANCED") and launch.grid[1] == 2


@pytest.mark.parametrize(
    "cache_lens,q_lens,h_q,long_max,fine",
    [
        ([700, 1, 0, 40], [1, 1, 1, 1], 16, 4, 4),  # one long token, slots left empty
        ([500, 3, 400, 0, 300], [1, 1, 2, 1, 3], 16, 2, 2),  # more long tokens than slots
        ([600, 1], [1, 1], 20, 1, 8),  # heads not a power of two, 8 parts of the dims
        ([300, 5], [1, 1], 128, 4, 4),  # two head blocks
    ],
)
def test_long_chains_merge_in_finer_programs(gen, monkeypatch, cache_lens, q_lens, h_q,
                                             long_max, fine):  # fmt: skip
    """The item list's combine with its long-chain programs (`wl_long_*`): the first long_max
    tokens of many items are merged in `fine` programs each, the grid's extra programs (past
    the tokens) taking their parts and exiting where no long token is left; sinks, the oracle
    and the launch's grid checked."""
    knobs = {"wl_runs": False, "wl_long_min": 3, "wl_long_max": long_max,
             "wl_long_fine": fine}  # fmt: skip
    set_tuning(monkeypatch, knobs)
    q, cache, _, _ = _case(gen, "bf16", cache_lens, q_lens, h_q, True, True)
    from pagedattn.ops import offline
    from pagedattn.ops.mla import worklist

    launches = offline.capture(
        worklist,
        lambda: triton_mla.mla_decode_triton(q, cache.operand(), ragged_offsets(q_lens, q.device)),
    )
    (comb,) = [x for x in launches if x.name == "_mla_worklist_combine_kernel"]
    kw = comb.kwargs
    longs = mla_host_long_tokens(ragged_offsets(q_lens), torch.tensor(cache_lens), tpt=kw["TPT"],
                                 bn=kw["BN"], target=kw["TARGET"], min_blocks=kw["MIN_BLOCKS"],
                                 long_min=3)  # fmt: skip
    assert longs >= 1  # (the case has long chains)
    # on the host's lengths (the CPU) a slot a long token there is, at most long_max
    slots = min(long_max, longs)
    assert kw["LONG_MAX"] == slots and kw["FINE"] == fine
    assert comb.grid[0] == sum(q_lens) + slots * (fine - 1)


def test_host_item_count_bounds_the_grid():
    """sum of items <= TARGET + tokens for any lengths (the CUDA grid's bound)."""
    g = torch.Generator().manual_seed(7)
    for _ in range(200):
        b = int(torch.randint(1, 40, (1,), generator=g))
        q_lens = torch.randint(0, 9, (b,), generator=g)
        cl = (torch.exp(torch.randn(b, generator=g) * 2.5) * 50).long().clamp(max=2**20)
        target = int(torch.randint(1, 300, (1,), generator=g))
        tpt = int(torch.randint(1, 5, (1,), generator=g))
        offs = torch.cat([torch.zeros(1, dtype=torch.long), q_lens.cumsum(0)])
        n = mla_host_item_count(offs, cl, tpt=tpt, bn=64, target=target, min_blocks=1)
        assert n <= target + int(q_lens.sum())


_FORCED = {"wl_one_wave": False, "wl_st_runs": True}  # the runs, on every kernel that has them


@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="needs CUDA")
@pytest.mark.parametrize(
    "fmt,h_q,knobs",
    [("bf16", 16, {}), ("bf16", 16, _FORCED), ("bf16", 128, {}), ("bf16", 128, _FORCED),
     ("bf16", 128, {"wl_st_runs": True}), ("bf16", 64, _FORCED), ("rope_aware", 16, {}),
     ("bf16", 128, {"wl_order": 0}), ("bf16", 16, {"wl_runs": False, "wl_order": 0}),
     ("bf16", 16, {"wl_runs": False}), ("rope_aware", 16, {"wl_order": 0}),
     ("bf16", 16, {**_FORCED, "wl_xseg": True}), ("bf16", 8, _FORCED),
     ("bf16", 8, {**_FORCED, "wl_xseg": True})],
    ids=["bf16-h16", "bf16-h16-forced-runs", "bf16-h128", "bf16-h128-forced-runs",
         "bf16-h128-st-runs", "bf16-h64-forced-runs", "rope_aware-h16",
         "bf16-h128-request-order", "bf16-h16-items-request-order", "bf16-h16-items",
         "rope_aware-h16-request-order", "bf16-h16-forced-runs-one-ring",
         "bf16-h8-forced-runs", "bf16-h8-forced-runs-one-ring"],
)  # fmt: skip
@pytest.mark.parametrize("shape", ["one_long", "lognormal", "mtp", "uniform", "edges"])
def test_gpu_balanced_sm90_kernels(gen, monkeypatch, fmt, h_q, knobs, shape):
    """The sm_90 kernels on the balanced paths (keys-as-M BF16 at 16 heads: items or runs,
    a ring a segment or (`wl_xseg`) one ring across a run's segments; at 8 heads, 2-token
    tiles on the runs; the TMA-fed seesaw at 64 and 128 on its item list, on its runs with
    items where they fit two waves (`wl_st_runs`), and both kernels forced onto the
    contiguous runs; rope-aware FP8 at 16 heads on the list): one 64k request among 0/1-token
    ones (every SM shares it), lognormal lengths, 2-token queries, 128 near-uniform requests
    (the seesaw's items over two waves on its runs), and the segments' edges (requests of 0,
    1, 63-65 and 127-128 keys among long ones, 2-token queries in 1-token tiles whose last
    block the causal limit empties, and queryless requests: pieces of 2 blocks cut tiles into
    1-block segments and empty ones); against the oracle."""
    set_tuning(monkeypatch, knobs)
    g = torch.Generator().manual_seed(11)
    if shape == "one_long":
        cache_lens, q_lens = [65536] + [0, 1, 37] * 7, [1] * 22
    elif shape == "lognormal":
        cache_lens = (torch.exp(torch.randn(40, generator=g)) * 600).long().clamp(1, 9000)
        cache_lens, q_lens = cache_lens.tolist(), [1] * 40
    elif shape == "mtp":
        cache_lens, q_lens = [3000, 5, 400, 0], [2, 2, 2, 2]
    elif shape == "uniform":  # 128 whole tiles: the seesaw's items over two waves
        cache_lens, q_lens = [1000 + i % 3 for i in range(128)], [1] * 128
    else:  # edges: as many tokens as requests (1-token tiles at 16 heads)
        cache_lens = [63, 0, 1, 64, 127, 3000, 2, 65, 0, 300, 128, 4000] * 2
        q_lens = [2, 0, 1, 1, 2, 1, 0, 2, 1, 1, 1, 0] * 2
    cache = build_cache(fmt, 576, 64, cache_lens, q_lens, gen, h_q)
    offs = ragged_offsets(q_lens).tolist()
    q = make_q(offs[-1], h_q, 576, gen)
    s = make_sinks(h_q, gen)
    o, lse = run(q, cache.operand(), q_lens, attn_sink=s)
    check(o, lse, *oracle(q, offs, dense_keys(cache, cache_lens, q_lens), sink=s),
          tol_for(fmt, 576))  # fmt: skip


@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="needs CUDA")
@pytest.mark.parametrize("one_wave", [True, False])
@pytest.mark.parametrize("h_q", [16, 128])
def test_gpu_balanced_graph_replays_with_new_lengths(gen, monkeypatch, one_wave, h_q):
    """A captured balanced launch replayed after the lengths changed (the long request cut to
    one key, then others emptied) equals a fresh eager call (with one wave of items where they
    fit, and forced onto the runs; the keys-as-M kernel at 16 heads, the TMA-fed seesaw at
    128 on its runs)."""
    from pagedattn.ops.mla import mla_decode

    set_tuning(monkeypatch, {"wl_one_wave": one_wave, "wl_st_runs": True})

    q_lens = [1] * 8
    cache = build_cache("bf16", 576, 64, [5000, 3, 0, 64, 1, 900, 2, 7], q_lens, gen, h_q)
    kv = cache.operand()
    q = make_q(8, h_q, 576, gen)
    offs = ragged_offsets(q_lens, DEV)
    out = torch.empty(8, h_q, 512, dtype=torch.bfloat16, device=DEV)
    mla_decode(q, kv, offs, out=out)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        _, lse_g = mla_decode(q, kv, offs, out=out)
    cl = cache.inputs.cache_lengths
    for lens in ([1, 3, 0, 64, 1, 900, 2, 7], [4000, 0, 0, 1, 1, 0, 2, 7]):  # within the pages
        cl.copy_(torch.tensor(lens, dtype=cl.dtype))
        graph.replay()
        torch.cuda.synchronize()
        fresh, lse = mla_decode(q, kv, offs)
        torch.testing.assert_close(out, fresh, atol=0, rtol=0)
        torch.testing.assert_close(lse_g, lse, atol=0, rtol=0)


def test_tuning_can_turn_the_list_off():
    assert MLATuning().replace(balanced=False).wl.balanced is False


@triton.jit
def _list_order_kernel(
    QOFF,
    K_CL,
    batch,
    END,
    N,
    KB,
    SLOT,
    TPT: tl.constexpr,
    BN: tl.constexpr,
    TARGET: tl.constexpr,
    MIN_BLOCKS: tl.constexpr,
    B_P2: tl.constexpr,
):
    r, c, n, end, chunk, o_lo = mla_work_list(
        QOFF, K_CL, batch, TPT, BN, TARGET, MIN_BLOCKS, B_P2, 1
    )
    tl.store(END + r, end)
    tl.store(N + r, n)
    tl.store(KB + r, chunk // BN)
    for k in range(0, tl.sum(n, 0)):  # each item's partial slot
        tl.store(SLOT + k, mla_find_item(r, c, n, end, chunk, o_lo, k, TPT, 1)[5])


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_list_by_size_puts_larger_buckets_first(seed):
    """`mla_work_list`'s ORDER 1: requests by bucket of their chunk (LIST_BUCKETS x blocks //
    (cb + 1)), the largest bucket first and request order within one; a request's items
    consecutive, every item numbered once; `mla_find_item`'s slot puts each item's partials where
    request order would (what the combine derives)."""
    batch, tpt, bn, target, min_blocks = 37, 2, 16, 12, 2
    g = torch.Generator().manual_seed(seed)
    cache_lens = (torch.empty(batch).log_normal_(5.0, 1.5, generator=g)).long().clamp(0, 9000)
    q_lens = torch.randint(0, 4, (batch,), generator=g)
    q_lens[0] = 0  # a request without queries: no item
    offs = ragged_offsets(q_lens.tolist()).to(torch.int32)
    b_p2 = triton.next_power_of_2(batch)
    end, n, kb = (torch.zeros(b_p2, dtype=torch.int32, device=DEV) for _ in range(3))
    slot = torch.full((target + int(q_lens.sum()),), -1, dtype=torch.int32, device=DEV)
    _list_order_kernel[(1,)](offs.to(DEV), cache_lens.to(DEV, torch.int32), batch, end, n, kb,
                             slot, TPT=tpt, BN=bn, TARGET=target, MIN_BLOCKS=min_blocks,
                             B_P2=b_p2)  # fmt: skip
    kb, slot = kb.cpu(), slot.cpu()
    tiles = (q_lens + tpt - 1) // tpt
    w = (cache_lens + q_lens + bn - 1) // bn
    cb = max(-(-int((tiles * w).sum()) * 9 // (target * 8)), min_blocks)
    key = [int(LIST_BUCKETS.value) * int(k) // (cb + 1) for k in kb[:batch]]
    n, end = n[:batch].tolist(), end[:batch].tolist()
    order = sorted((b for b in range(batch) if n[b]), key=lambda b: (-key[b], b))
    assert len({key[b] for b in order}) > 2  # the case spans several buckets
    at = 0
    for b in order:
        assert end[b] - n[b] == at
        at = end[b]
    assert at == sum(n)
    # the partials' slots: each request's items at its request-order rows, in item order
    rm = 0
    for b in range(batch):
        assert slot[end[b] - n[b] : end[b]].tolist() == list(range(rm, rm + n[b]))
        rm += n[b]
