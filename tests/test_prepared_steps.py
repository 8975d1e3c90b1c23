"""Prepared calls of `pagedattn.mha` beyond plain decode: a serving engine's every call (its
layers' `mha(..., num_decodes=..., plan=...)`) hits the prepared path after its first.

On a CPU the kernels run in Triton's interpreter, so the hit path runs end to end:
- mixed steps (decodes first, then prefill chunks: two launch parts, the second over views
  from a later request), prefill and chunked prefill: a hit gives the same bytes as the full
  path (`mha_mixed_triton`) on the same inputs, and the float64 oracle's values; new tensors,
  new lengths and new step plans between hits;
- a step plan whose item count changes with the lengths (the launch's grid is the call's),
  a device-made plan (the capacity as the grid), and a plan that keeps the kernels' own list
  (the other kernel variant: its own entry, then both hit);
- the compiled form (what a CUDA hit runs) hands the launcher the pointers (offset views
  included), grids and values of the full path's own launches of the same call;
- `prepared._match_source` maps a view from a later element to its source and offset, and
  refuses a view that two sources sharing memory could hold.
Adversarial inputs as the op's own tests: NaN in every unowned cache slot, poisoned outputs,
decodes of 0 and 1 cached tokens beside long ones, sinks, windowed and tensor masks.
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"  # CPU CI: before triton is imported

from prepared_fixtures import (  # noqa: E402
    assert_launched_as,
    count_full_paths,
    fresh_prepared,
    recording_build,
)
from test_triton_mha import (  # noqa: E402
    DEV,
    LSE_TOL,
    PREFILL_TOL,
    build_paged,
    offsets_of,
    oracle,
    rand_q,
)

from pagedattn.ops import masks, offline  # noqa: E402
from pagedattn.ops import prepared as PR  # noqa: E402
from pagedattn.ops.launch import Launched  # noqa: E402
from pagedattn.ops.mha import StepPlan, mha  # noqa: E402
from pagedattn.ops.mha import triton_mha as TM  # noqa: E402
from pagedattn.ops.mha import triton_worklist as WL  # noqa: E402
from pagedattn.ops.mha import work_plan as WP  # noqa: E402
from pagedattn.testing import assert_close, poison_  # noqa: E402


@pytest.fixture(autouse=True)
def fresh_cache():
    yield from fresh_prepared(TM)


@pytest.fixture
def full_paths(monkeypatch):
    return count_full_paths(monkeypatch, TM)


def same(a, b):
    """Bitwise equal (out, lse) pairs, NaN positions included."""
    for x, y in zip(a, b):
        assert x.shape == y.shape and x.dtype == y.dtype
        assert torch.equal(x.isnan(), y.isnan())
        assert torch.equal(x.nan_to_num(), y.nan_to_num())


def _step(k, cache_lens, q_lens, gen, h_q):
    """A step's inputs over operand k's cache: its lengths written (shorter than the cache
    holds where a later step asks so), a fresh q and offsets."""
    k.cache_lengths.copy_(torch.tensor(cache_lens, dtype=torch.int32))
    offs = torch.tensor(offsets_of(q_lens), dtype=torch.int32, device=DEV)
    return rand_q(int(offs[-1]), h_q, k.head_dim, gen), offs


def _both(q, k, v, offs, nd, plans=(None, None), **kw):
    """(the public op's result, the full path's) of one call, each into a poisoned out and
    with its step plan of `plans`."""
    outs = [poison_(torch.empty(q.shape[0], q.shape[1], v.head_dim, dtype=q.dtype, device=DEV))
            for _ in range(2)]  # fmt: skip
    got = mha(q, k, v, offs, out=outs[0], return_lse=True, num_decodes=nd, plan=plans[0],
              backend="triton", **kw)  # fmt: skip
    want = TM.mha_mixed_triton(q, k, v, offs, nd or 0, out=outs[1], return_lse=True,
                               plan=plans[1], **kw)  # fmt: skip
    assert got[0] is outs[0]
    return got, want


MIXED = [  # page, h_kv, group, d, steps of (decode cache lengths, chunks (cached, new)), mask
    (16, 2, 4, 64, [([0, 1, 700, 33], [(40, 70), (0, 17)]),
                    ([5, 0, 690, 40], [(12, 70), (3, 17)]),
                    ([1, 2, 3, 4], [(0, 70), (1, 17)])], masks.causal()),
    (3, 1, 2, 96, [([90, 0, 260], [(100, 33)]), ([1, 1, 1], [(7, 33)])],
     masks.sliding_window_causal(50)),
]  # fmt: skip


@pytest.mark.parametrize("planned", [None, "host", "device"])
@pytest.mark.parametrize("case", range(len(MIXED)))
def test_mixed_step_hits(case, planned, gen, full_paths):
    """A mixed step's call, then the next steps' (new lengths, q, out and step plan): one
    miss (its two launch parts), then hits equal to the full path, and to the oracle."""
    page, h_kv, group, d, steps, mask = MIXED[case]
    dec0, ch0 = steps[0]
    nd = len(dec0)
    most = [max(s[0][i] for s in steps) for i in range(nd)]
    most += [max(s[1][j][0] for s in steps) for j in range(len(ch0))]
    q_lens = [1] * nd + [n for _, n in ch0]
    k, v, ks, vs = build_paged(page, h_kv, d, most, q_lens, gen=gen)
    sinks = torch.randn(h_kv * group, generator=gen).to(DEV)
    kinds = set()  # the step plans' kinds seen (a buffer, the kernels' own list): a miss each
    for i, (dec, chunks) in enumerate(steps):
        lens = dec + [c for c, _ in chunks]
        q, offs = _step(k, lens, q_lens, gen, h_kv * group)
        plans = [None, None]
        if planned:
            plans = [StepPlan(lens[:nd] if planned == "host" else None) for _ in range(2)]
        before = len(full_paths)
        got, want = _both(q, k, v, offs, nd, plans, mask=mask, sinks=sinks)
        kind = tuple(b is not None for b, _ in plans[1].plans.values()) if planned else ()
        miss, _ = kind not in kinds, kinds.add(kind)
        parts = 2  # the full path's own run included: 2 each call, 2 more at a miss
        assert len(full_paths) - before == (2 * parts if miss else parts)
        same(got, want)
        ks_i = [x[: n + m] for x, n, m in zip(ks, lens, q_lens)]
        vs_i = [x[: n + m] for x, n, m in zip(vs, lens, q_lens)]
        ref, ref_lse = oracle(q, ks_i, vs_i, lens, offsets_of(q_lens), mask, None, sinks)
        assert_close(got[0].cpu(), ref, **PREFILL_TOL, name=f"out, step {i}")
        assert_close(got[1].cpu(), ref_lse, **LSE_TOL, name=f"lse, step {i}")
    assert len(TM.PREPARED.cache) == len(kinds)


def test_prefill_and_tensor_mask_hit(gen, full_paths):
    """Chunked prefill (no hint) and a mixed step with a tensor mask: each prepared once."""
    cache_lens, q_lens = [200, 0, 31], [1, 1, 12]
    k, v, ks, vs = build_paged(16, 2, 64, cache_lens, q_lens, gen=gen)
    keys = max(c + n for c, n in zip(cache_lens, q_lens))
    for nd in (None, 2):
        for i in range(2):
            q, offs = _step(k, cache_lens, q_lens, gen, 4)
            t = torch.rand(int(offs[-1]), keys, generator=gen) < 0.7
            mask = masks.tensor_mask(t.to(DEV))
            before = len(full_paths)
            got, want = _both(q, k, v, offs, nd, mask=mask)
            parts = 2 if nd else 1
            assert len(full_paths) - before == (2 * parts if i == 0 else parts)
            same(got, want)
            ref, ref_lse = oracle(q, ks, vs, cache_lens, offsets_of(q_lens), mask, None, None)
            assert_close(got[0].cpu(), ref, **PREFILL_TOL, name="out")
    assert len(TM.PREPARED.cache) == 2


@pytest.fixture
def fused_merge(monkeypatch):
    """The decode's fused merge (shipped at every row count) with the 256-key items of 48 rows
    and more: these tests' batches are smaller, and their plans (waves, item counts) assume
    that item size."""
    monkeypatch.setenv("PAGEDATTN_MHA_TUNING", '{"decode": {"small_min_chunk": 256}}')


def test_step_plans_of_both_kinds_each_get_an_entry(gen, full_paths, fused_merge):
    """Decode steps with a host step plan: a skewed step's plan is a buffer (its item count
    the grid), a uniform step's keeps the kernels' own list (the other kernel): two entries
    under one key, and then every step hits, equal to the full path with the same plan."""
    b = 8
    # (on the CPU's device facts: BLOCK_N 64, target 132; both skewed plans take 3 waves, of
    # 4 and 6 items for the long row)
    skew, skew2, uniform = [0, 1000, 1, 2, 3, 4, 5, 6], [6, 5, 4, 3, 2, 1, 1400, 0], [300] * b
    k, v, ks, vs = build_paged(16, 2, 64, [1400] * b, [1] * b, gen=gen)
    kinds = []
    for i, lens in enumerate([skew, uniform, skew2, uniform]):
        q, offs = _step(k, lens, [1] * b, gen, 8)
        before = len(full_paths)
        got, want = _both(q, k, v, offs, b, (StepPlan(lens), StepPlan(lens)))
        assert len(full_paths) - before == (2 if i < 2 else 1)  # a miss per kind, then hits
        same(got, want)
        ((buf, _),) = plans_of(lens, k)
        kinds.append(buf is not None)
    assert kinds == [True, False, True, False]
    (entries,) = TM.PREPARED.cache._d.values()
    assert sorted(e.plan_buf for _, _, e in entries) == [False, True]


def plans_of(lens, k):
    """The (buffer, item count) a host step plan gives the decode launch over `lens`."""
    plan = StepPlan(lens)
    q = rand_q(len(lens), 8, k.head_dim, torch.Generator().manual_seed(0))
    offs = torch.arange(len(lens) + 1, dtype=torch.int32, device=DEV)
    TM.mha_triton(q, k, k, offs, plan=plan)
    return list(plan.plans.values())


def _captured(call):
    """The launches `call` makes through the MHA modules, none run, and its result."""
    res = []
    inner: list = []
    made = offline.capture(TM, lambda: inner.extend(offline.capture(WL, lambda: res.append(
        call()))))  # fmt: skip
    return made + inner, res[0]


@pytest.mark.skipif(
    torch.cuda.is_available(),
    reason="the compiled form against the interpreter's capture (on an H200 the prefill part "
    "takes TMA descriptors, which the stub launcher does not encode): on CUDA the real "
    "compiled launches are checked by test_gpu_engine_steps_hit",
)
def test_compiled_form_of_a_planned_mixed_step(monkeypatch, gen, fused_merge):
    """The compiled form of a mixed step with a host step plan (the code a CUDA hit runs; its
    C launcher a recorder): for a second call with other tensors, lengths and plan, each
    launch gets the grid (the plan's item count), values and pointers (views from a later
    request: their source's pointer plus the offset) of the full path's own launches."""
    seen: list = []
    nd, chunks = 8, [(40, 9), (3, 20)]
    q_lens = [1] * nd + [n for _, n in chunks]
    calls = []
    # (skewed enough for a 3-wave plan on the CPU's device facts, of other item counts)
    for dec in ([0, 3000, 1, 2, 3, 4, 5, 6], [6, 5, 4, 3, 2, 1, 2000, 0]):
        k, v, _, _ = build_paged(16, 2, 64, [3000] * nd + [40, 3], q_lens, gen=gen)
        lens = dec + [c for c, _ in chunks]
        q, offs = _step(k, lens, q_lens, gen, 8)
        out = torch.empty(q.shape[0], 8, 64, dtype=q.dtype, device=DEV)
        calls.append((q, k, v, offs, out, StepPlan(dec)))
    kw = dict(mask=masks.causal(), scale=None, sinks=None, num_partitions=None, return_lse=True)

    def full(c):
        q, k, v, offs, out, plan = c
        return TM._mixed_path(q, k, v, offs, nd, out=out, plan=plan, **kw)

    made, ((_, full_lse), rans) = _captured(lambda: full(calls[0]))
    q, k, v, offs, out, plan = calls[0]
    key, src = TM._signature(q, k, v, offs, None, None, None, None, True, out, "triton", nd, plan)
    monkeypatch.setattr(PR.PreparedLaunch, "build", staticmethod(recording_build(seen)))
    recs = [Launched(m.kernel, m.grid, m.args, m.kwargs) for m in made]
    assert len(recs) == 2  # the decode part (its merge fused) and the prefill part
    entry = TM._prepare_call(recs, src, rans, (out, full_lse), True, masks.causal())
    assert entry is not None and entry.fast and entry.plan_buf and entry.grid_at == 0

    q, k, v, offs, out, plan = calls[1]
    key2, src2 = TM._signature(q, k, v, offs, None, None, None, None, True, out, "triton", nd,
                               plan)  # fmt: skip
    assert key2 == key
    result = entry(src2, plan)
    assert result[0] is out
    want, (_, rans2) = _captured(lambda: full(calls[1]))
    assert len(seen) == len(want) == 2
    assert rans2[0].plan_buf is src2[TM._PLAN]
    stream = PR.current_stream(PR.current_device(q))
    _, base = PR.workspace(entry.device, stream, max(entry.ws_numel, 1))
    d = rans2[0]
    where = {i: base + 4 * off for i, _, _, off, _ in entry.parts}
    pointers = {id(d.po): where[TM._PO], id(d.pl): where[TM._PL]}

    def pointer_of(t):  # (the LSE's views: the decode part's first rows, the prefill's whole)
        if t.data_ptr() == d.lse.data_ptr():
            return result[1].data_ptr()
        return pointers.get(id(t))

    assert_launched_as(seen, want, stream, pointer_of)
    # the decode launch's grid is the plan's item count, which differs between the two calls
    assert seen[0][0] != recs[0].grid[0]


def test_match_source_maps_views_to_offsets():
    a = torch.arange(40, dtype=torch.int32)
    b = torch.arange(12, dtype=torch.float32)
    whole = torch.zeros(64, dtype=torch.int32)
    lo, hi = whole[:30], whole[30:]
    assert PR._match_source(a, [b, a]) == (1, 0)
    assert PR._match_source(a[:7], [b, a]) == (1, 0)
    assert PR._match_source(a[5:], [b, a]) == (1, 20)
    assert PR._match_source(a[5:].view(torch.float32), [b, a]) == (1, 20)
    assert PR._match_source(torch.arange(3, dtype=torch.int32), [b, a]) is None
    assert PR._match_source(hi[4:], [lo, hi]) == (1, 16)  # inside one of two in one storage
    assert PR._match_source(whole[20:], [whole[:40], whole[10:]]) is None  # inside both
    assert PR._match_source(a[5:], [a, a]) == (0, 20)  # one object twice


@pytest.mark.parametrize("fused", [True, False])
def test_plan_kernel_launches_are_not_prepared(gen, monkeypatch, fused):
    """A device-made step plan launches its planner once a step (inside the first layer's
    call): the prepared call asks the step plan each call and launches only its own kernels,
    which the plan's second layer reads (the decode kernel, and its combine unless fused)."""
    if not fused:
        monkeypatch.setenv("PAGEDATTN_MHA_TUNING", '{"decode": {"fused_merge": false}}')
    lens = [0, 600, 1, 300, 3, 900]
    b = len(lens)
    k, v, _, _ = build_paged(16, 2, 64, lens, [1] * b, gen=gen)
    q, offs = _step(k, lens, [1] * b, gen, 8)
    planner = []
    real = WP.plan_work

    def counted(*a, **kw):
        planner.append(1)
        return real(*a, **kw)

    monkeypatch.setattr(WP, "plan_work", counted)
    for _ in range(2):  # two steps of two layers each
        plan = StepPlan()
        first = mha(q, k, v, offs, num_decodes=b, plan=plan, backend="triton")
        second = mha(q, k, v, offs, num_decodes=b, plan=plan, backend="triton")
        assert torch.equal(first, second)
    assert len(planner) == 2 and len(TM.PREPARED.cache) == 1
    ((_, _, entry),) = next(iter(TM.PREPARED.cache._d.values()))
    assert entry.plan_buf and len(entry.launches) == (1 if fused else 2)


# --------------------------------------------------------------------------------------------
# GPU: serving sizes, compiled launches, a captured step
# --------------------------------------------------------------------------------------------
def _serving_cache(cache_lens, q_lens, seed):
    from pagedattn import KVCacheParams, PagedOperand
    from pagedattn.testing import make_paged_cache

    params = KVCacheParams(torch.bfloat16, 1, 8, 128, 16, devices=["cuda"])
    g = torch.Generator().manual_seed(seed)
    cache = make_paged_cache(params, cache_lens, q_lens, generator=g, device="cuda")
    cache.inputs.kv_blocks.copy_(torch.randn(cache.inputs.kv_blocks.shape, device="cuda"))
    inp = cache.inputs
    return PagedOperand(inp, params, 0, "k"), PagedOperand(inp, params, 0, "v"), inp


def _lognormal(n, g, most):
    import math

    x = torch.empty(n).log_normal_(math.log(1536), 1.0, generator=g)
    return x.clamp(0, most).long().tolist()


@pytest.mark.gpu
def test_gpu_engine_steps_hit():
    """An engine's layer calls at serving sizes, on the compiled launches (the sm_90 prefill's
    TMA descriptors where the device plans them): mixed steps (56 decodes of lognormal
    lengths, 4 chunks of 256 over cached prefixes) and decode steps (64 requests), without a
    step plan and with host and device ones, over steps of new lengths, q and plans: every
    signature is prepared, and each hit equals the full path bitwise; the decodes are close
    to the float64 reference."""
    from test_triton_mha import BF16_TOL, gpu_reference

    g = torch.Generator().manual_seed(7)
    most = 6000
    for nd, chunks in ((56, 4), (64, 0)):
        q_lens = [1] * nd + [256] * chunks
        k, v, inp = _serving_cache([most] * (nd + chunks), q_lens, nd)
        offs = torch.tensor(offsets_of(q_lens), dtype=torch.int32, device="cuda")
        for step in range(4):
            lens = _lognormal(nd, g, most) + [int(x) for x in torch.randint(0, most, (chunks,))]
            if step == 1:
                lens[: nd // 2] = [0, 1] * (nd // 4)  # rows of 0 and 1 keys beside long ones
            inp.cache_lengths.copy_(torch.tensor(lens, dtype=torch.int32))
            q = torch.randn(int(offs[-1]), 32, 128, device="cuda").to(torch.bfloat16)
            for planned in (None, "host", "device"):
                plans = [None, None]
                if planned:
                    plans = [StepPlan(lens[:nd] if planned == "host" else None)
                             for _ in range(2)]  # fmt: skip
                for _ in range(2):  # (the second call of a new kind of plan is a hit)
                    got, want = _both(q, k, v, offs, nd, plans)
                    same(got, want)
            ref = gpu_reference(q, k, v, range(0, nd, 5), 128**-0.5)
            assert_close(got[0][:nd:5].float().cpu(), ref.cpu(), **BF16_TOL)
    entries = [e for c in TM.PREPARED.cache._d.values() for _, _, e in c]
    assert entries and all(e is not None for e in entries)
    assert any(e.plan_buf for e in entries) and any(len(e.launches) == 2 for e in entries)


@pytest.mark.gpu
def test_gpu_captured_step_replays_new_lengths():
    """A decode step of two layers (`mha(..., num_decodes=b, plan=StepPlan())`: prepared hits
    once warm) captured in a CUDA graph with its device-made plan: each replay with new
    lengths (uniform, one long, skewed) equals an eager step on the full path."""
    import math

    b, most = 64, 8192
    k, v, inp = _serving_cache([most] * b, [1] * b, 3)
    q = torch.randn(b, 32, 128, device="cuda").to(torch.bfloat16)
    offs = torch.arange(b + 1, dtype=torch.int32, device="cuda")
    out1, out2 = torch.empty_like(q), torch.empty_like(q)

    def step():
        plan = StepPlan()
        mha(q, k, v, offs, out=out1, num_decodes=b, plan=plan, backend="triton")
        mha(out1, k, v, offs, out=out2, num_decodes=b, plan=plan, backend="triton")

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm (a miss, then hits) on a side stream
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(side)
    assert len(TM.PREPARED.cache) == 1
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=side):  # (the stream has its fused-merge counters)
        step()
    g = torch.Generator().manual_seed(11)
    for lens in ([most] * b, [most] + [0] * (b - 1), _lognormal(b, g, most)):
        inp.cache_lengths.copy_(torch.tensor(lens, dtype=torch.int32))
        q.copy_(torch.randn_like(q))
        out2.fill_(math.nan)
        graph.replay()
        plan = StepPlan()
        e1 = TM.mha_mixed_triton(q, k, v, offs, b, plan=plan)
        e2 = TM.mha_mixed_triton(e1, k, v, offs, b, plan=plan)
        assert torch.equal(out1, e1) and torch.equal(out2, e2)
