"""The step's decode work plan (`ops/mha/work_plan.py`, `mha(plan=StepPlan())`).

The planner kernel against its torch mirror; the plan's invariants (every key of a row in
exactly one of its items, the waves rule on uniform, skewed and one-long batches); decode
through a plan against the float64 oracle (sinks, LSE, rows of 0 and 1 keys beside split
ones), through a plan made for other lengths (still exact), and against the launch without a
plan; the public argument's checks. The CPU runs go through the Triton interpreter; the GPU
tests (`-m gpu`) run serving sizes and a plan captured in a CUDA graph with its launches,
replayed with new lengths.
"""

from __future__ import annotations

import math
import os

import numpy as np
import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"  # CPU CI: before triton is imported

from test_mha_worklist import skewed_paged  # noqa: E402
from test_triton_mha import (  # noqa: E402
    BF16,
    DEV,
    LSE_TOL,
    build_paged,
    call,
    check,
    gpu_reference,
    offsets_of,
    rand_q,
)

from pagedattn import PagedOperand, mha  # noqa: E402
from pagedattn.errors import InvalidArgumentError  # noqa: E402
from pagedattn.ops.mha import StepPlan  # noqa: E402
from pagedattn.ops.mha.triton_mha import mha_triton  # noqa: E402
from pagedattn.ops.mha.work_plan import (  # noqa: E402
    HEADER,
    MAX_SPLIT,
    MAX_WAVES,
    plan_work,
    plan_work_host,
)
from pagedattn.testing import BF16_TOL, assert_close, poison_  # noqa: E402

LENGTHS = {
    "skew": [0, 1500, 1, 700, 3, 40, 9000, 64],
    "uniform": [700] * 6,
    "one-long": [65536, 0, 1, 0] + [200] * 12,
    "one-long-late": [200] * 12 + [0, 1, 65536, 0, 3000],
    # more rows than a planner step reads (128): the order's ranks cross steps
    "many": [int(x) for x in np.random.default_rng(5).lognormal(np.log(900), 1.2, 300)],
    "tiny": [0],
}
SHAPES = [(32, 66, 8), (64, 3, 4), (16, 20, 16)]  # (BLOCK_N, target, min tiles)


def _items(p: torch.Tensor, rows: int):
    n, cap = int(p[0]), int(p[3])
    items = p[HEADER : HEADER + 4 * n].view(n, 4).tolist()
    table = p[HEADER + 4 * cap : HEADER + 4 * cap + 2 * rows].view(rows, 2).tolist()
    return items, table


@pytest.mark.parametrize("name", list(LENGTHS))
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_planner_kernel_equals_its_mirror(name, shape):
    bn, target, min_blocks = shape
    lens = LENGTHS[name]
    cl = torch.tensor(lens, dtype=torch.int32, device=DEV)
    kw = dict(block_n=bn, target=target, min_blocks=min_blocks)
    dev = plan_work(cl, len(lens), **kw).cpu()
    host = plan_work_host(cl.cpu(), len(lens), **kw)
    n, cap = int(host[0]), int(host[3])
    assert torch.equal(dev[: HEADER + 4 * n], host[: HEADER + 4 * n])
    assert torch.equal(dev[HEADER + 4 * cap :], host[HEADER + 4 * cap :])


@pytest.mark.parametrize("name", list(LENGTHS))
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_plan_covers_every_key_once(name, shape):
    """Rows by their items' size, largest chunk first, ties in row order; a row's items are
    consecutive and tile [0, its keys) in whole BLOCK_N tiles, the last open-ended; the table
    gives each row's first item and count; n_items <= capacity."""
    bn, target, min_blocks = shape
    lens = LENGTHS[name]
    rows = len(lens)
    p = plan_work_host(torch.tensor(lens), rows, block_n=bn, target=target, min_blocks=min_blocks)
    items, table = _items(p, rows)
    assert int(p[0]) <= int(p[3]) == MAX_WAVES * target + rows
    tiles = [(length + bn) // bn for length in lens]
    chunk = [-(-t // n) for t, (_, n) in zip(tiles, table)]
    at = 0
    for r in sorted(range(rows), key=lambda r: (-chunk[r], r)):
        first, n = table[r]
        assert first == at and n >= 1
        mine = items[first : first + n]
        assert all(it[0] == r and it[3] == n for it in mine)
        edge = 0
        for j, (_, lo, hi, _) in enumerate(mine):
            assert lo == edge and lo % bn == 0
            if j == n - 1:
                assert hi == -1 and lo < lens[r] + 1
            else:
                assert hi > lo and hi % bn == 0
            edge = hi
        at += n
    assert at == int(p[0]) == len(items)


def test_waves_rule():
    """One wave where its items are even or a row would split into more than MAX_SPLIT items;
    MAX_WAVES waves for a skewed batch (H200 numbers: BLOCK_N 32, target 66, 8 tiles)."""
    kw = dict(block_n=32, target=66, min_blocks=8)

    def waves(lens):
        return int(plan_work_host(torch.tensor(lens), len(lens), **kw)[1])

    assert waves([4095] * 64) == 1  # uniform: a row an item
    assert waves([16383] * 16) == 1  # four even items a row
    g = torch.Generator().manual_seed(0)
    skew = torch.empty(128).log_normal_(math.log(1536), 1.0, generator=g).clamp(32, 32768)
    assert waves(skew.long().tolist()) == MAX_WAVES
    one_long = [32767] + [199] * 63  # its row would split into > MAX_SPLIT items
    p = plan_work_host(torch.tensor(one_long), 64, **kw)
    assert int(p[1]) == 1 and int(p[4]) == 0  # the long row leads: row order
    late = [199] * 10 + [32767] + [199] * 53
    assert int(plan_work_host(torch.tensor(late), 64, **kw)[4]) == 1  # its items first
    assert int(plan_work_host(torch.tensor([4095] * 64), 64, **kw)[4]) == 0
    cb3 = max(-(-(1025 + 63 * 7) * 9 // (MAX_WAVES * 66 * 8)), 8)
    assert -(-1025 // cb3) > MAX_SPLIT


@pytest.mark.parametrize("where", ["device", "host"])
@pytest.mark.parametrize("lens", [[0, 1500, 1, 700, 3, 40, 2600, 64], [700] * 6, [3000, 0, 1, 2]],
                         ids=str)  # fmt: skip
def test_decode_through_a_plan_against_oracle(lens, where, gen):
    b = len(lens)
    k, v, ks, vs = build_paged(16, 2, 64, lens, [1] * b, gen=gen)
    q = rand_q(b, 8, 64, gen)
    sinks = torch.randn(8, generator=gen).to(DEV)
    plan = StepPlan(lens if where == "host" else None)
    out, lse = check(q, k, v, ks, vs, lens, offsets_of([1] * b), sinks=sinks, plan=plan)
    assert len(plan.plans) == 1
    ((buf, n),) = plan.plans.values()
    ((rows, bn, target, min_blocks),) = plan.plans
    kw = dict(block_n=bn, target=target, min_blocks=min_blocks)
    one_wave = int(plan_work_host(torch.tensor(lens), rows, **kw)[1]) == 1
    # a device plan is always used; a host plan unless it keeps the kernels' own list
    assert (buf is None) == (where == "host" and one_wave)
    assert (n is None) == (where == "device" or one_wave)
    if n is not None:  # the host's plan is the device planner's
        assert n == int(buf[0])
        dev = plan_work(k.kernel_args().cache_lengths, rows, **kw).cpu()
        cap = int(dev[3])
        assert torch.equal(buf.cpu()[: HEADER + 4 * n], dev[: HEADER + 4 * n])
        assert torch.equal(buf.cpu()[HEADER + 4 * cap :], dev[HEADER + 4 * cap :])
    # a second layer reads the same plan (no new one), with the same result
    again, lse2 = call(q, k, v, offsets_of([1] * b), sinks=sinks, plan=plan)
    assert len(plan.plans) == 1
    assert torch.equal(out, again) and torch.equal(lse, lse2)
    # against the launch that derives its list in every program
    own, own_lse = call(q, k, v, offsets_of([1] * b), sinks=sinks)
    assert_close(out, own, abs_tol=1e-2, rel_tol=2 / 128, cos_tol=1e-6)
    assert_close(lse, own_lse, **LSE_TOL)


def test_a_plan_of_other_lengths_stays_exact(gen):
    """Plan one step's lengths, then run a step of other lengths (longer and shorter rows) of
    the same batch with that plan: every key is still read once."""
    first = [40, 2500, 0, 900]
    later = [2900, 3, 1700, 0]
    b = len(first)
    k, v, ks, vs = build_paged(16, 2, 64, later, [1] * b, gen=gen)
    plan = StepPlan()
    ka = k.kernel_args()
    old = torch.tensor(first, dtype=torch.int32, device=DEV)
    q = rand_q(b, 8, 64, gen)
    # plan from the first lengths, under the key the launch will ask for
    call(q, k, v, offsets_of([1] * b), plan=plan)
    ((key, _),) = plan.plans.items()
    rows, bn, target, min_blocks = key
    plan.plans[key] = (plan_work(old, rows, block_n=bn, target=target, min_blocks=min_blocks),
                       None)  # fmt: skip
    assert ka.cache_lengths.tolist() == later
    check(q, k, v, ks, vs, later, offsets_of([1] * b), plan=plan)


def test_windowed_decode_ignores_the_plan(gen):
    """A sliding-window row derives its own list (the plan balances full rows only)."""
    from pagedattn.ops import masks

    lens = [0, 1500, 1, 700]
    k, v, ks, vs = build_paged(16, 2, 64, lens, [1] * 4, gen=gen)
    q = rand_q(4, 8, 64, gen)
    plan = StepPlan()
    check(q, k, v, ks, vs, lens, offsets_of([1] * 4), mask=masks.sliding_window_causal(300),
          plan=plan)  # fmt: skip
    assert not plan.plans


@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_public_argument(backend, gen):
    lens = [300, 5]
    k, v, _, _ = build_paged(16, 2, 64, lens, [1, 1], gen=gen)
    q = rand_q(2, 8, 64, gen)
    offs = torch.tensor(offsets_of([1, 1]), dtype=torch.int32, device=DEV)
    plain = mha(q, k, v, offs, backend=backend)
    planned = mha(q, k, v, offs, backend=backend, plan=StepPlan())
    assert_close(planned, plain, abs_tol=1e-2, rel_tol=2 / 128, cos_tol=1e-6)
    with pytest.raises(InvalidArgumentError, match="plan"):
        mha(q, k, v, offs, backend=backend, plan={"not": "a plan"})
    for bad in ([[1, 2]], [1.5, 2.0], torch.zeros(2, dtype=torch.bool)):
        with pytest.raises(InvalidArgumentError, match="cache_lengths"):
            StepPlan(bad)


# --------------------------------------------------------------------------------------------
# GPU: serving sizes, a plan captured with its launches
# --------------------------------------------------------------------------------------------
def _lognormal(b, seed):
    g = torch.Generator().manual_seed(seed)
    lens = torch.empty(b).log_normal_(math.log(1536), 1.0, generator=g).clamp(32, 32768)
    return lens.long().tolist()


@pytest.mark.gpu
@pytest.mark.parametrize("b", [64, 256])
def test_gpu_planned_skew_against_reference(b):
    cache_lens = _lognormal(b, b)
    cache_lens[:3] = [0, 1, 65536]
    params, inp = skewed_paged(cache_lens, 16, 8, 128)
    k, v = PagedOperand(inp, params, 0, "k"), PagedOperand(inp, params, 0, "v")
    q = torch.randn(b, 32, 128, device="cuda").to(BF16)
    offs = torch.arange(b + 1, dtype=torch.int32, device="cuda")
    plan = StepPlan()
    out = poison_(torch.empty_like(q))
    mha_triton(q, k, v, offs, out=out, plan=plan)
    ((buf, _),) = plan.plans.values()
    host = plan_work_host(inp.cache_lengths.cpu(), b, **_plan_kw(plan))
    n, cap = int(host[0]), int(host[3])
    assert torch.equal(buf.cpu()[: HEADER + 4 * n], host[: HEADER + 4 * n])
    assert torch.equal(buf.cpu()[HEADER + 4 * cap :], host[HEADER + 4 * cap :])
    rows = [0, 1, 2, 17, b - 1]
    assert_close(out[rows], gpu_reference(q, k, v, rows, 128**-0.5), **BF16_TOL)
    own = mha_triton(q, k, v, offs)
    assert_close(out, own, abs_tol=1e-2, rel_tol=2 / 128, cos_tol=1e-6)
    hosted = mha_triton(q, k, v, offs, plan=StepPlan(cache_lens))  # the grid: the items
    assert_close(hosted, out, abs_tol=1e-2, rel_tol=2 / 128, cos_tol=1e-6)


def _plan_kw(plan: StepPlan) -> dict:
    ((rows, bn, target, min_blocks),) = plan.plans
    return dict(block_n=bn, target=target, min_blocks=min_blocks)


@pytest.mark.gpu
def test_gpu_graph_plans_each_replay():
    """A step function that makes its StepPlan and runs two layers, captured once: each
    replay plans its own lengths (uniform, one long, skewed) and equals an eager step."""
    b, ctx = 64, 8192
    params, inp = skewed_paged([ctx] * b, 16, 8, 128)
    k, v = PagedOperand(inp, params, 0, "k"), PagedOperand(inp, params, 0, "v")
    q = torch.randn(b, 32, 128, device="cuda").to(BF16)
    offs = torch.arange(b + 1, dtype=torch.int32, device="cuda")
    out1, out2 = torch.empty_like(q), torch.empty_like(q)

    def step():
        plan = StepPlan()
        mha_triton(q, k, v, offs, out=out1, plan=plan)
        mha_triton(out1, k, v, offs, out=out2, plan=plan)

    side = torch.cuda.Stream()  # warmed on the capture's stream: its fused-merge counters
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=side):
        step()
    for lens in ([ctx] * b, [ctx - 1] + [0] * (b - 1), [min(x, ctx - 1) for x in _lognormal(b, 3)]):
        inp.cache_lengths.copy_(torch.tensor(lens, dtype=torch.int32))
        q.copy_(torch.randn_like(q))
        out2.fill_(math.nan)
        graph.replay()
        plan = StepPlan()
        e1 = mha_triton(q, k, v, offs, plan=plan)
        e2 = mha_triton(e1, k, v, offs, plan=plan)
        assert torch.equal(out2, e2)
        assert_close(out1, gpu_reference(q, k, v, range(b), 128**-0.5), **BF16_TOL)
    assert MAX_SPLIT >= 32
