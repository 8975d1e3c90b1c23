"""The balanced decode work list (`ops/mha/triton_worklist.py`) against the float64 oracle.

Where a call leaves num_partitions to the op, MHA decode splits each row into chunks of about
the same number of tiles over the whole batch, so skewed lengths spread over every SM. These
tests give it skewed batches (rows of 0 and 1 cached tokens beside long ones split into many
items), sinks, the LSE, sliding windows, FP8 per-token K/V, ragged rows (which fall back to
one item a row), and compare with the oracle and with the one-partition launch. The CPU runs
go through the Triton interpreter at small shapes; the GPU tests (`-m gpu`) run serving sizes,
a request split over every SM, and CUDA-graph replay with lengths that change between replays.
"""

from __future__ import annotations

import math
import os

import pytest
import torch
import triton
import triton.language as tl

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"  # CPU CI: before triton is imported

from test_triton_mha import (  # noqa: E402
    BF16,
    DEV,
    LSE_TOL,
    big_paged,
    build_paged,
    call,
    check,
    gpu_reference,
    offsets_of,
    rand_q,
)

from pagedattn import KVCacheParams, KVQuantConfig, PagedOperand  # noqa: E402
from pagedattn.errors import InvalidArgumentError  # noqa: E402
from pagedattn.ops import masks  # noqa: E402
from pagedattn.ops import prepared as PR  # noqa: E402
from pagedattn.ops.launch import recording  # noqa: E402
from pagedattn.ops.list_order import LIST_BUCKETS  # noqa: E402
from pagedattn.ops.mha import StepPlan  # noqa: E402
from pagedattn.ops.mha import selection as MS  # noqa: E402
from pagedattn.ops.mha import triton_worklist as TW  # noqa: E402
from pagedattn.ops.mha.selection import MHATuning  # noqa: E402
from pagedattn.ops.mha.triton_mha import mha_triton  # noqa: E402
from pagedattn.testing import BF16_TOL, assert_close, make_paged_cache, poison_  # noqa: E402

LEGACY = MHATuning(decode=dict(balanced=False))
COMBINE = MHATuning(decode=dict(fused_merge=False))
FUSED = MHATuning()  # the fused merge (the shipped form, at every row count)


def _plan(q, k, v, **kw):
    dev = MS.Device(sm90=False, sms=132, hbm3e=False)
    ka, va = k.kernel_args(), v.kernel_args()
    return MS.decode_plan(q, ka, va, q.shape[2], v.head_dim, None, MS.NO_TUNING, dev, **kw)


def test_plan_is_balanced_only_when_partitions_are_left_to_the_op(gen):
    k, v, _, _ = build_paged(16, 2, 64, [5, 9], [1, 1], gen=gen)
    q = rand_q(2, 8, 64, gen)
    plan = _plan(q, k, v)
    # two rows: the fused merge and the small batches' shorter items (`small_rows`)
    assert plan.target == 2 * 132 // 2 and plan.min_blocks == math.ceil(64 / plan.config.BLOCK_N)
    assert plan.fused and plan.config.max_ctas_per_sm == 2  # the list's wave (an H100's)
    ka, va = k.kernel_args(), v.kernel_args()
    h200 = MS.Device(sm90=True, sms=132, hbm3e=True)
    on_h200 = MS.decode_plan(q, ka, va, 64, 64, None, MS.NO_TUNING, h200)
    assert on_h200.config.max_ctas_per_sm == 4 and on_h200.target == 4 * 132 // 2
    uncapped = MHATuning(decode=dict(max_ctas_per_sm=0))
    assert MS.decode_plan(q, ka, va, 64, 64, None, uncapped, h200).config.max_ctas_per_sm == 0
    unfused = MS.decode_plan(q, k.kernel_args(), v.kernel_args(), 64, 64, None, COMBINE,
                             MS.Device(sm90=False, sms=132, hbm3e=False))  # fmt: skip
    assert not unfused.fused and unfused.min_blocks == plan.min_blocks
    one = _plan(q[:1], k.select_requests(0, 1), v.select_requests(0, 1))
    assert one.fused and one.min_blocks == plan.min_blocks
    ka, va = k.kernel_args(), v.kernel_args()
    dev = MS.Device(sm90=False, sms=132, hbm3e=False)
    fixed = MS.decode_plan(q, ka, va, 64, 64, 3, MS.NO_TUNING, dev)
    assert fixed.target == 0 and fixed.num_partitions == 3
    off = MS.decode_plan(q, ka, va, 64, 64, None, LEGACY, dev)
    assert off.target == 0


@pytest.mark.parametrize(
    "page_size,group,mask",
    [
        (16, 4, masks.causal()),
        (1, 1, masks.causal()),
        (3, 8, masks.sliding_window_causal(300)),
        (16, 2, masks.chunked_causal(512)),
    ],
)
def test_skewed_batch_against_oracle(page_size, group, mask, gen):
    """Rows of 0 and 1 cached tokens beside rows split into several items (1500 cached keys:
    24 tiles of 64 in chunks of >= 4 tiles), with sinks and the LSE."""
    h_kv, d = 2, 64
    cache_lens = [0, 1500, 1, 700, 3, 40]
    b = len(cache_lens)
    k, v, ks, vs = build_paged(page_size, h_kv, d, cache_lens, [1] * b, gen=gen)
    q = rand_q(b, h_kv * group, d, gen)
    sinks = torch.randn(h_kv * group, generator=gen).to(DEV)
    out, lse = check(q, k, v, ks, vs, cache_lens, offsets_of([1] * b), mask=mask, sinks=sinks)
    one, lse1 = call(q, k, v, offsets_of([1] * b), mask=mask, sinks=sinks, num_partitions=1)
    assert_close(out, one, abs_tol=1e-2, rel_tol=2 / 128, cos_tol=1e-6)
    assert_close(lse, lse1, **LSE_TOL)


@pytest.mark.parametrize("lens", [[0, 1500, 1, 700, 3, 40], [700] * 6], ids=["skew", "uniform"])
def test_many_wave_list_against_oracle(lens, gen):
    """The list of 3 waves (`waves`: more, smaller items; the two-pass combine merges rows of
    several) on a skewed and a uniform batch, with sinks and the LSE, against the oracle and
    the one-partition launch."""
    tuning = MHATuning(decode=dict(waves=3))
    b = len(lens)
    k, v, ks, vs = build_paged(16, 2, 64, lens, [1] * b, gen=gen)
    q = rand_q(b, 8, 64, gen)
    sinks = torch.randn(8, generator=gen).to(DEV)
    out, lse = check(q, k, v, ks, vs, lens, offsets_of([1] * b), sinks=sinks, config=tuning)
    one, lse1 = call(q, k, v, offsets_of([1] * b), sinks=sinks, num_partitions=1)
    assert_close(out, one, abs_tol=1e-2, rel_tol=2 / 128, cos_tol=1e-6)
    assert_close(lse, lse1, **LSE_TOL)


@pytest.mark.parametrize("plan", [None, "host"])
def test_fused_merge_equals_the_combine_launch_and_leaves_counters_at_zero(plan, gen):
    """A skewed batch (rows split into several items, rows of 0 and 1 keys) with sinks and the
    LSE: the decode launch's fused merge against the combine launch (`fused_merge` off) and the
    oracle, over the kernels' own list and a host step plan; afterwards every counter of the
    stream's semaphores is back at 0 (a second call then merges the same)."""
    cache_lens = [0, 1500, 1, 700, 3, 2900, 40]
    b = len(cache_lens)
    k, v, ks, vs = build_paged(16, 2, 64, cache_lens, [1] * b, gen=gen)
    q = rand_q(b, 8, 64, gen)
    sinks = torch.randn(8, generator=gen).to(DEV)
    offs = offsets_of([1] * b)
    step = (lambda: StepPlan(cache_lens)) if plan else (lambda: None)
    fused, lse = check(q, k, v, ks, vs, cache_lens, offs, sinks=sinks, plan=step(),
                       config=FUSED)  # fmt: skip
    sem = PR.semaphores(torch.device(DEV), PR.current_stream(PR.current_device(q)), 1)
    assert sem is not None and int(sem.abs().sum()) == 0
    again, lse2 = call(q, k, v, offs, sinks=sinks, plan=step(), config=FUSED)
    assert torch.equal(again, fused) and torch.equal(lse2, lse)
    comb, lse3 = call(q, k, v, offs, sinks=sinks, plan=step(), config=COMBINE)
    assert_close(fused, comb, abs_tol=1e-2, rel_tol=2 / 128, cos_tol=1e-6)
    assert_close(lse, lse3, **LSE_TOL)


@pytest.mark.parametrize("b", [1, 2, 47, 48])
def test_merge_by_row_count_at_the_rule_boundaries(b, gen):
    """Every row count takes the fused merge (one launch): items of at least 64 keys below 48
    rows, 256 from 48 (`DecodeConfig.small_rows`). Each against the oracle, rows of 0 and 1
    keys beside split ones, sinks, the LSE."""
    cache_lens = ([300, 0, 1] * 16)[:b] if b > 1 else [300]
    k, v, ks, vs = build_paged(16, 1, 32, cache_lens, [1] * b, gen=gen)
    q = rand_q(b, 2, 32, gen)
    plan = _plan(q, k, v)
    chunk = 64 if b < 48 else 256
    assert plan.fused and plan.min_blocks == math.ceil(chunk / plan.config.BLOCK_N)
    sinks = torch.randn(2, generator=gen).to(DEV)
    with recording() as made:
        check(q, k, v, ks, vs, cache_lens, offsets_of([1] * b), sinks=sinks)
    assert len(made) == 1, [m.kernel for m in made]


def _decode_case(cache_lens, gen):
    """One decode query a request over `cache_lens` (page 16, 2 KV heads of 64 dims, 8 query
    heads), with sinks: (q, k, v, ks, vs, sinks, offsets)."""
    b = len(cache_lens)
    k, v, ks, vs = build_paged(16, 2, 64, cache_lens, [1] * b, gen=gen)
    q = rand_q(b, 8, 64, gen)
    sinks = torch.randn(8, generator=gen).to(DEV)
    return q, k, v, ks, vs, sinks, offsets_of([1] * b)


@pytest.mark.parametrize("config", [None, FUSED], ids=["combine launch", "fused"])
def test_one_pass_merge_equals_two_passes_bit_for_bit(config, monkeypatch, gen):
    """Rows of at most one merge step of items merge in one round of loads (`merge_items`'
    ONE_PASS): the same arithmetic as the two passes, so the combine launch's output and LSE
    are equal bit for bit with ONE_PASS off, over rows of one, a few and many items (the many
    take the two passes either way), sinks and rows of 0 and 1 keys; the fused merge (same
    function) against the oracle."""
    import functools

    import pagedattn.ops.mha.triton_mha as TM

    # (64-key tiles and 64-key items at 8 rows: rows of 130 and 300 keys are 3 and 5 items,
    # one merge step; those of 700-9000 keys 11-141, two passes)
    cache_lens = [0, 1500, 1, 300, 3, 2900, 130, 9000]
    q, k, v, ks, vs, sinks, offs = _decode_case(cache_lens, gen)
    one, lse = check(q, k, v, ks, vs, cache_lens, offs, sinks=sinks, config=config)
    if config is None:
        two_pass = functools.partial(TM.worklist_combine_triton, one_pass=False)
        monkeypatch.setattr(TM, "worklist_combine_triton", two_pass)
        two, lse2 = call(q, k, v, offs, sinks=sinks)
        assert torch.equal(one, two) and torch.equal(lse, lse2)


@pytest.mark.parametrize("fused", [False, True], ids=["combine launch", "fused"])
def test_split_rows_first_matches_the_oracle(fused, gen):
    """The kernels' own list with split rows first (`list_order` 0, the shipped order's
    alternative): long rows after short ones, rows of 0 and 1 keys, sinks and the LSE, through
    the combine launch and the fused merge, against the oracle; the same result as the shipped
    order's (rows by bucket of their items' size, `list_order` 1)."""
    cfg = MHATuning(decode=dict(list_order=0, fused_merge=fused))
    cache_lens = [3, 0, 130, 1, 2900, 40, 9000, 700]
    q, k, v, ks, vs, sinks, offs = _decode_case(cache_lens, gen)
    with recording() as made:
        out, lse = check(q, k, v, ks, vs, cache_lens, offs, sinks=sinks, config=cfg)
    assert all(m.kwargs.get("LIST_ORDER", 0) == 0 for m in made), [m.kwargs for m in made]
    with recording() as made:
        ship, lse0 = call(q, k, v, offs, sinks=sinks,
                          config=MHATuning(decode=dict(fused_merge=fused)))  # fmt: skip
    assert any(m.kwargs.get("LIST_ORDER") == 1 for m in made), [m.kwargs for m in made]
    assert_close(out, ship, abs_tol=1e-2, rel_tol=2 / 128, cos_tol=1e-6)
    assert_close(lse, lse0, **LSE_TOL)


@pytest.mark.parametrize("h_kv,group,d,page", [(3, 3, 96, 16), (1, 6, 48, 1), (2, 5, 80, 7)])
def test_fused_merge_with_padded_heads_and_dims(h_kv, group, d, page, gen):
    """Split rows merged in the launch where the query heads of a KV head (3, 5, 6) and the
    head dim (96, 80, 48) are padded to powers of two, over odd page sizes, with sinks and
    the LSE, against the oracle."""
    cache_lens = [0, 1500, 1, 2300, 3]
    b = len(cache_lens)
    k, v, ks, vs = build_paged(page, h_kv, d, cache_lens, [1] * b, gen=gen)
    q = rand_q(b, h_kv * group, d, gen)
    sinks = torch.randn(h_kv * group, generator=gen).to(DEV)
    check(q, k, v, ks, vs, cache_lens, offsets_of([1] * b), sinks=sinks, config=FUSED)


def test_semaphores_are_per_stream_zeroed_and_kept():
    """One zeroed int32 tensor per (device, stream) (on a CPU, per thread), the same for every
    call that fits; a call that needs more counters gets a larger one, and the smaller stays
    alive (a captured graph may still read it)."""
    import threading

    dev = torch.device("cpu")
    a = PR.semaphores(dev, 0, 10)
    assert a.dtype == torch.int32 and a.numel() >= 10 and int(a.abs().sum()) == 0
    assert PR.semaphores(dev, 0, a.numel()) is a
    other = []
    t = threading.Thread(target=lambda: other.append(PR.semaphores(dev, 0, 10)))
    t.start()
    t.join()
    assert other[0] is not a  # another thread
    big = PR.semaphores(dev, 0, a.numel() + 1)
    assert big is not a and big.numel() > a.numel() and int(big.abs().sum()) == 0
    assert any(t is a for t in PR._RETIRED) and PR.semaphores(dev, 0, 10) is big


def test_fp8_per_token_fast_loop(gen):
    """FP8 per-token K/V (the fast loop) through the work list."""
    quant = KVQuantConfig.per_token()
    cache_lens = [900, 2, 0, 333]
    k, v, ks, vs = build_paged(16, 2, 64, cache_lens, [1] * 4, quant=quant, gen=gen)
    q = rand_q(4, 8, 64, gen)
    check(q, k, v, ks, vs, cache_lens, offsets_of([1] * 4))


@pytest.mark.parametrize("order", [2, -1, True])
def test_bad_list_order_is_named_and_writes_nothing(order, gen):
    """A list order other than 0 or 1 gets a typed error naming the knob, before any launch:
    the output keeps its poison."""
    q, k, v, _ks, _vs, _sinks, offs = _decode_case([40, 900, 3], gen)
    out = poison_(torch.empty_like(q))
    before = out.clone()
    offs = torch.tensor(offs, dtype=torch.int32, device=DEV)
    with pytest.raises(InvalidArgumentError, match="list_order"):
        mha_triton(q, k, v, offs, out=out, config=MHATuning(decode={"list_order": order}))
    assert torch.equal(out.view(torch.int16), before.view(torch.int16))


def test_ragged_rows_fall_back_to_one_item_a_row(gen):
    """total_q == batch but not one query a request: every row is one item, still exact."""
    cache_lens, q_lens = [600, 7, 90], [2, 0, 1]
    k, v, ks, vs = build_paged(16, 2, 64, cache_lens, q_lens, gen=gen)
    q = rand_q(3, 8, 64, gen)
    check(q, k, v, ks, vs, cache_lens, offsets_of(q_lens), max_q_len=None)


def test_nan_in_one_row_stays_in_that_row(gen):
    """A NaN query row of a split request is NaN after the combine; the other rows are not."""
    cache_lens = [1200, 5]
    k, v, ks, vs = build_paged(16, 1, 64, cache_lens, [1, 1], gen=gen)
    q = rand_q(2, 2, 64, gen)
    q[0, 1, 3] = float("nan")
    out, lse = call(q, k, v, offsets_of([1, 1]))
    assert torch.isnan(out[0, 1]).all() and torch.isnan(lse[0, 1])
    assert torch.isfinite(out[0, 0]).all() and torch.isfinite(out[1]).all()


# --------------------------------------------------------------------------------------------
# GPU: serving sizes, one request over every SM, graph replay with new lengths
# --------------------------------------------------------------------------------------------
def skewed_paged(cache_lens, page, h_kv, d):
    params = KVCacheParams(BF16, 1, h_kv, d, page, devices=["cuda"])
    cache = make_paged_cache(params, cache_lens, [1] * len(cache_lens), device="cuda")
    cache.inputs.kv_blocks.copy_(torch.randn(cache.inputs.kv_blocks.shape, device="cuda"))
    return params, cache.inputs


@pytest.mark.gpu
@pytest.mark.parametrize("page", [1, 16])
def test_gpu_lognormal_lengths(page):
    g = torch.Generator().manual_seed(5)
    lens = (torch.empty(64).log_normal_(math.log(1500), 1.0, generator=g)).clamp(32, 32768)
    cache_lens = lens.long().tolist()
    cache_lens[:2] = [0, 1]
    params, inp = skewed_paged(cache_lens, page, 8, 128)
    k, v = PagedOperand(inp, params, 0, "k"), PagedOperand(inp, params, 0, "v")
    q = torch.randn(64, 32, 128, device="cuda").to(BF16)
    offs = torch.arange(65, dtype=torch.int32, device="cuda")
    out = poison_(torch.empty_like(q))
    mha_triton(q, k, v, offs, out=out)
    rows = [0, 1, int(lens.argmax()), 17, 63]
    assert_close(out[rows], gpu_reference(q, k, v, rows, 128**-0.5), **BF16_TOL)
    legacy = mha_triton(q, k, v, offs, config=LEGACY)
    assert_close(out, legacy, abs_tol=1e-2, rel_tol=2 / 128, cos_tol=1e-6)


@pytest.mark.gpu
def test_gpu_one_request_split_over_every_sm():
    """One 64k request among requests of 0 and 1 tokens: its items outnumber the SMs."""
    cache_lens = [65536, 0, 1, 0]
    params, inp = skewed_paged(cache_lens, 64, 8, 128)
    k, v = PagedOperand(inp, params, 0, "k"), PagedOperand(inp, params, 0, "v")
    q = torch.randn(4, 32, 128, device="cuda").to(BF16)
    offs = torch.arange(5, dtype=torch.int32, device="cuda")
    out, lse = mha_triton(q, k, v, offs, return_lse=True)
    assert_close(out, gpu_reference(q, k, v, range(4), 128**-0.5), **BF16_TOL)
    assert torch.isfinite(lse).all()
    plan = MS.decode_plan(
        q, k.kernel_args(), v.kernel_args(), 128, 128, None, MS.NO_TUNING,
        MS.Device(True, torch.cuda.get_device_properties(0).multi_processor_count, False),
    )  # fmt: skip
    tiles = math.ceil(65537 / plan.config.BLOCK_N)
    assert tiles / max(plan.min_blocks, math.ceil(tiles / plan.target)) >= plan.target / 2


@pytest.mark.gpu
@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("warm_capture_stream", [True, False])
def test_gpu_graph_replay_with_new_lengths(warm_capture_stream, fused):
    """Capture the balanced launch once; change the lengths (skew included) and replay: equal
    to an eager call bit for bit. Warmed on the capture stream, the graph's fused merge counts
    on the stream's counters; otherwise on fresh zeros the graph fills each replay. Unfused
    (`fused_merge` off): the decode launch and its combine launch."""
    cfg = FUSED if fused else COMBINE
    b, ctx = 16, 8192
    params, inp = big_paged(b, ctx, 16, 8, 128)
    k, v = PagedOperand(inp, params, 0, "k"), PagedOperand(inp, params, 0, "v")
    q = torch.randn(b, 32, 128, device="cuda").to(BF16)
    offs = torch.arange(b + 1, dtype=torch.int32, device="cuda")
    out = torch.empty_like(q)
    side = torch.cuda.Stream() if warm_capture_stream else None
    if side is not None:
        side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            mha_triton(q, k, v, offs, out=out, config=cfg)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=side), recording() as made:
        mha_triton(q, k, v, offs, out=out, config=cfg)
    assert len(made) == (1 if fused else 2)  # the decode kernel (its merge fused), the combine
    for lens in ([ctx - 1] + [0] * (b - 1), [1] * b, None):
        if lens is None:
            lens = torch.randint(0, ctx, (b,)).tolist()
        inp.cache_lengths.copy_(torch.tensor(lens, dtype=torch.int32))
        q.copy_(torch.randn_like(q))
        out.fill_(math.nan)
        graph.replay()
        eager = mha_triton(q, k, v, offs, config=cfg)
        assert torch.equal(out, eager)
        assert_close(out, gpu_reference(q, k, v, range(b), 128**-0.5), **BF16_TOL)


@triton.jit
def _work_list_kernel(
    CL,
    OFFS,
    batch,
    END,
    N,
    CHUNK,
    BLOCK_N: tl.constexpr,
    TARGET: tl.constexpr,
    MIN_BLOCKS: tl.constexpr,
    BLOCK_B: tl.constexpr,
    ORDER: tl.constexpr,
):
    r, n, end, _lo, chunk = TW.work_list(CL, OFFS, batch, 0, 0, BLOCK_N, TARGET, MIN_BLOCKS,
                                         BLOCK_B, ORDER)  # fmt: skip
    tl.store(END + r, end)
    tl.store(N + r, n)
    tl.store(CHUNK + r, chunk)


@pytest.mark.parametrize("order", [0, 1])
def test_kernel_list_orders(order):
    """The kernels' own list: ORDER 0 numbers the split rows first (row order within each
    class), ORDER 1 the rows by bucket of their chunk, the largest bucket first (row order
    within one); a row's items consecutive, every item numbered once."""
    g = torch.Generator().manual_seed(3)
    batch, bn, target, min_blocks = 45, 16, 20, 2
    cache_lens = (torch.empty(batch).log_normal_(5.5, 1.5, generator=g)).long().clamp(0, 20000)
    b_p2 = triton.next_power_of_2(batch)
    end, n, chunk = (torch.zeros(b_p2, dtype=torch.int32, device=DEV) for _ in range(3))
    offs = torch.arange(batch + 1, dtype=torch.int32, device=DEV)
    _work_list_kernel[(1,)](cache_lens.to(DEV, torch.int32), offs, batch, end, n, chunk,
                            BLOCK_N=bn, TARGET=target, MIN_BLOCKS=min_blocks, BLOCK_B=b_p2,
                            ORDER=order)  # fmt: skip
    n, end, chunk = n[:batch].tolist(), end[:batch].tolist(), chunk[:batch].tolist()
    tiles = [(int(c) + bn) // bn for c in cache_lens]
    cb = max(-(-sum(tiles) * 9 // (target * 8)), min_blocks)
    if order == 0:
        key = [int(k > 1) for k in n]
    else:
        key = [min(int(LIST_BUCKETS.value) * c // (cb + 1), 7) for c in chunk]
    assert len(set(key)) > (1 if order == 0 else 2)  # the case spans several classes
    at = 0
    for r in sorted(range(batch), key=lambda r: (-key[r], r)):
        assert end[r] - n[r] == at
        at = end[r]
    assert at == sum(n)
