"""The engine's scheduler, step inputs and faults, on the fake HistoryModel (test_engine_fakes).

Greedy tokens must equal `reference_greedy` exactly: the fake reads each request's history
back from the paged cache, so any lost, duplicated or misplaced token, page or position shows.
Covered: chunked prefill under the token budget with decodes in the same step, prefix hits,
two requests with the same prefix admitted in the same step (the manager merges their pages at
commit), preemption by recompute, a property test over random workloads on tiny pools (every
request finishes exactly once, with the reference tokens), typed rejection of prompts the cache
can never hold, and a model that raises mid-step.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_engine_fakes import VOCAB, FakeModelError, HistoryModel, reference_greedy

from pagedattn import KVCacheParams, PagedKVCacheManager
from pagedattn.engine import (
    LLM,
    NotSupportedYetError,
    PromptTooLongError,
    SamplingParams,
    build_step_inputs,
)
from pagedattn.errors import InvalidArgumentError, UnknownRequestError
from pagedattn.testing import poison_

GREEDY = SamplingParams(max_tokens=5, temperature=0.0)


# Every test runs in both step modes: synchronous, and overlapped (`async_scheduling`: step n + 1
# launched before step n's tokens are read, its deferred inputs filled on the device; outputs
# one call late). The fake reads each request's history from the cache, so a deferred token
# filled from the wrong row, or a stop seen too late, changes the tokens.
_MODE = {"async_scheduling": False}


@pytest.fixture(autouse=True, params=[False, True], ids=["sync", "async"])
def step_mode(request):
    _MODE["async_scheduling"] = request.param
    yield request.param
    _MODE["async_scheduling"] = False


def make_llm(model: HistoryModel | None = None, **kw) -> LLM:
    kw.setdefault("page_size", 2)
    kw.setdefault("num_pages", 64)
    kw.setdefault("async_scheduling", _MODE["async_scheduling"])
    llm = LLM(model or HistoryModel(), **kw)
    poison_(llm.manager.buffers[0].kv_blocks)  # a read of an unwritten slot raises
    return llm


def check_invariants(mgr: PagedKVCacheManager) -> None:
    """free + used == total; no page both free and owned; ref counts == owners."""
    owners: dict[int, int] = {}
    for rid in mgr.request_ids:
        pages = mgr.pages(rid)
        assert len(set(pages)) == len(pages)
        for p in pages:
            owners[p] = owners.get(p, 0) + 1
    for pool in mgr.pools:
        free = pool.free_pages()
        assert pool.num_free == len(free)
        assert pool.num_free + pool.num_used == pool.total_num_pages
        assert not (free & set(owners))
        for p in range(pool.total_num_pages):
            assert pool.ref_counts[p] == owners.get(p, 0), p


def prompt_of(n: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, VOCAB, (n,), generator=g).tolist()


def assert_reference(outs, prompts, params, max_model_len=1 << 30):
    for o, p, sp in zip(outs, prompts, params):
        want, reason = reference_greedy(
            p, sp.max_tokens, stop=sp.stop_token_ids, max_model_len=max_model_len
        )
        assert o.prompt_token_ids == p
        assert o.outputs[0].token_ids == want, (o.request_id, o.outputs[0].token_ids, want)
        assert o.outputs[0].finish_reason == reason


# --------------------------------------------------------------------------------------------
def test_chunked_prefill_mixes_decodes_and_chunks_under_the_budget():
    model = HistoryModel()
    llm = make_llm(model, max_num_batched_tokens=7)
    prompts = [prompt_of(n, s) for s, n in enumerate([3, 17, 9, 1, 12])]
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], GREEDY)
    assert_reference(outs, prompts, [GREEDY] * 5)
    assert max(model.step_sizes) <= 7
    assert model.step_sizes.count(7) >= 3  # chunks filled the budget
    st_ = llm.stats()
    assert st_.generated_tokens == 25 and st_.prompt_tokens == sum(map(len, prompts))
    assert st_.finished_requests == 5 and st_.preemptions == 0
    assert llm.manager.request_ids == [] and llm.manager.stats().used_pages == 0


def test_step_mixes_decode_and_prefill_chunk():
    model = HistoryModel()
    llm = make_llm(model, max_num_batched_tokens=4)
    a = llm.add_request([1, 2], SamplingParams(max_tokens=6, temperature=0))
    llm.step()  # a's prompt -> its first token
    b = llm.add_request(prompt_of(10, 3), SamplingParams(max_tokens=2, temperature=0))
    batch = llm.scheduler.schedule()
    assert [s.request_id for s in batch.seqs] == [a, b]
    assert batch.num_new_tokens == [1, 3]  # a decode and a 3-token chunk of b
    llm.scheduler.waiting.clear()  # (drop the scheduled step: abort both cleanly)
    llm.abort_request(a)
    llm.abort_request(b)
    check_invariants(llm.manager)
    assert llm.manager.stats().used_pages == 0


def test_step_inputs_slots_positions_and_rows():
    model = HistoryModel()
    llm = make_llm(model, page_size=3)
    mgr = llm.manager
    mgr.claim("x", [5, 6, 7, 8, 9])
    mgr.alloc("x", 4)
    mgr.claim("y", [1, 2])
    mgr.alloc("y", 2)
    inp = build_step_inputs(mgr, [("x", [5, 6, 7, 8, 9], 4), ("y", [1, 2], 2)], "cpu")
    assert inp.input_ids.tolist() == [5, 6, 7, 8, 1, 2]
    assert inp.positions.tolist() == [0, 1, 2, 3, 0, 1]
    assert inp.q_row_offsets.dtype == torch.int32 and inp.q_row_offsets.tolist() == [0, 4, 6]
    assert inp.logits_rows.tolist() == [5] and inp.sample_index == [1]  # x's chunk is partial
    px, py = mgr.pages("x"), mgr.pages("y")
    want = [px[0] * 3, px[0] * 3 + 1, px[0] * 3 + 2, px[1] * 3, py[0] * 3, py[0] * 3 + 1]
    assert inp.slots.tolist() == want
    assert inp.kv_inputs[0].cache_lengths.tolist() == [0, 0]
    with pytest.raises(InvalidArgumentError, match="num_new_tokens"):
        build_step_inputs(mgr, [("x", [5, 6, 7, 8, 9], 6)], "cpu")
    with pytest.raises(UnknownRequestError):
        build_step_inputs(mgr, [("z", [1], 1)], "cpu")


def test_prefix_hit_across_steps():
    llm = make_llm(page_size=2)
    base = prompt_of(11, 1)
    (first,) = llm.generate([{"prompt_token_ids": base}], GREEDY)
    p2 = base[:8] + [3, 4]
    (second,) = llm.generate([{"prompt_token_ids": p2}], GREEDY)
    assert second.metrics.prefix_hit_tokens == 8
    assert_reference([first, second], [base, p2], [GREEDY] * 2)
    assert llm.stats().prefix_hit_tokens == 8


def test_same_prefix_admitted_in_one_step_shares_pages_after_commit():
    """Both compute the shared prefix in the first step; at commit the later request switches
    to the earlier one's cached pages and frees its copies (manager.step)."""
    llm = make_llm(page_size=2, max_num_batched_tokens=64)
    mgr = llm.manager
    shared = prompt_of(6, 5)
    prompts = [shared + [1, 2, 3], shared + [4], shared + [9, 9]]
    params = SamplingParams(max_tokens=4, temperature=0)
    seqs = [llm.add_request({"prompt_token_ids": p}, params) for p in prompts]
    llm.step()  # every prompt in one step: no hit at admission
    assert llm.stats().prefix_hit_tokens == 0
    pages = [mgr.pages(r) for r in seqs]
    assert pages[0][:3] == pages[1][:3] == pages[2][:3]  # the 3 full shared pages
    assert llm.stats().deduplicated_pages == 6
    check_invariants(mgr)
    outs = []
    while llm.has_unfinished_requests():
        outs += [o for o in llm.step() if o.finished]
    outs.sort(key=lambda o: o.request_id)
    assert_reference(outs, prompts, [params] * 3)


def test_manager_merges_duplicate_prefix_pages_at_step():
    params = KVCacheParams(torch.float32, 1, 1, 2, page_size=2)
    m = PagedKVCacheManager(params, total_num_pages=12)
    toks = [1, 2, 3, 4, 5]
    for rid in ("a", "b"):
        assert m.claim(rid, toks) == 0
        m.alloc(rid, 5)
    a0, b0 = m.pages("a"), m.pages("b")
    assert not set(a0) & set(b0)
    m.step(["a", "b"], [[7], [8]])
    assert m.pages("a") == a0
    assert m.pages("b") == a0[:2] + b0[2:]
    pool = m.pools[0]
    assert all(pool.ref_counts[p] == 2 for p in a0[:2])
    assert all(pool.ref_counts[p] == 0 for p in b0[:2]) and set(b0[:2]) <= pool.free_pages()
    assert m.stats().deduplicated_pages == 2 and m.stats().used_pages == 4
    # Salts isolate: a different salt never merges.
    m.claim("c", toks, salt="t")
    m.alloc("c", 5)
    m.step(["c"], [[1]])
    assert not set(m.pages("c")) & set(a0)
    for rid in ("a", "b", "c"):
        m.release(rid)
    assert m.stats().used_pages == 0


def test_preemption_by_recompute_gives_the_same_tokens():
    model = HistoryModel()
    # 10 pages of 2 tokens: the four requests (up to 14 + 6 tokens each) cannot all fit.
    llm = make_llm(model, page_size=2, num_pages=10, max_num_batched_tokens=8)
    prompts = [prompt_of(n, 10 + n) for n in (9, 14, 5, 11)]
    params = SamplingParams(max_tokens=6, temperature=0)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
    assert_reference(outs, prompts, [params] * 4)
    st_ = llm.stats()
    assert st_.preemptions > 0 and st_.peak_used_pages <= 10
    assert sum(o.metrics.num_preemptions for o in outs) == st_.preemptions
    check_invariants(llm.manager)


def test_stop_tokens_eos_and_max_model_len():
    p = prompt_of(4, 2)
    free, _ = reference_greedy(p, 8)
    stop = free[2]
    model = HistoryModel(eos=[stop])
    llm = make_llm(model)
    first = free.index(stop) + 1
    (o,) = llm.generate([{"prompt_token_ids": p}], SamplingParams(max_tokens=8, temperature=0))
    assert o.outputs[0].token_ids == free[:first] and o.outputs[0].finish_reason == "stop"
    assert o.outputs[0].stop_reason == stop
    ign = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
    (o,) = llm.generate([{"prompt_token_ids": p}], ign)
    assert o.outputs[0].token_ids == free and o.outputs[0].finish_reason == "length"
    st2 = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True, stop_token_ids=[free[1]])
    (o,) = llm.generate([{"prompt_token_ids": p}], st2)
    assert o.outputs[0].token_ids == free[:2]
    # max_model_len: the request stops with "length" when prompt + output reach it.
    llm = make_llm(HistoryModel(), max_model_len=6)
    (o,) = llm.generate([{"prompt_token_ids": p}], SamplingParams(max_tokens=8, temperature=0))
    assert o.outputs[0].token_ids == free[:2] and o.outputs[0].finish_reason == "length"


# --------------------------------------------------------------------------------------------
# Faults
# --------------------------------------------------------------------------------------------
def test_prompt_too_long_is_rejected_and_others_are_undisturbed():
    llm = make_llm(page_size=2, num_pages=8)  # 16 tokens at most
    assert llm.max_model_len == 16
    ok = [prompt_of(7, 1), prompt_of(12, 2)]
    ids = [llm.add_request({"prompt_token_ids": p}, GREEDY) for p in ok]
    llm.step()
    before = llm.manager.snapshot()
    with pytest.raises(PromptTooLongError, match="max_model_len=16"):
        llm.add_request({"prompt_token_ids": prompt_of(17, 3)}, GREEDY)
    with pytest.raises(PromptTooLongError):  # generate: nothing of the call is queued
        llm.generate([{"prompt_token_ids": [1]}, {"prompt_token_ids": prompt_of(40, 4)}])
    assert llm.manager.snapshot() == before and llm.num_unfinished_requests == 2
    outs = {}
    while llm.has_unfinished_requests():
        outs.update({o.request_id: o for o in llm.step() if o.finished})
    assert_reference([outs[i] for i in ids], ok, [GREEDY] * 2, max_model_len=16)
    # A 16-token prompt fits exactly (it stops at once: max_model_len reached).
    (o,) = llm.generate([{"prompt_token_ids": prompt_of(16, 5)}], GREEDY)
    assert len(o.outputs[0].token_ids) == 1 and o.outputs[0].finish_reason == "length"


def test_model_raising_mid_step_leaves_manager_sound_and_engine_usable():
    model = HistoryModel()
    llm = make_llm(model, page_size=2, num_pages=12, max_num_batched_tokens=6)
    prompts = [prompt_of(n, 20 + n) for n in (5, 9, 3)]
    ids = [llm.add_request({"prompt_token_ids": p}, GREEDY) for p in prompts]
    model.fail_on_call = {1, 4, 5}
    outs, failures = {}, 0
    while llm.has_unfinished_requests():
        before = llm.manager.stats()
        try:
            outs.update({o.request_id: o for o in llm.step() if o.finished})
        except FakeModelError:
            failures += 1
            check_invariants(llm.manager)
            after = llm.manager.stats()
            assert after.cached_pages == before.cached_pages  # nothing committed
    assert failures == 3 and llm.stats().failed_steps == 3
    assert_reference([outs[i] for i in ids], prompts, [GREEDY] * 3)
    # generate: a failure aborts the call's requests; the engine then works normally.
    model.fail_on_call = {model.calls + 1}
    with pytest.raises(FakeModelError):
        llm.generate([{"prompt_token_ids": p} for p in prompts], GREEDY)
    assert not llm.has_unfinished_requests() and llm.manager.request_ids == []
    check_invariants(llm.manager)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], GREEDY)
    assert_reference(outs, prompts, [GREEDY] * 3)


def test_abort_between_steps_leaves_the_others_exact():
    """A request aborted between two steps (overlapped: while its next step is in flight, its
    sample not yet read) finishes as "abort" and is never returned again; the others' tokens
    are the reference's; the pool ends empty."""
    llm = make_llm(num_pages=24, max_num_batched_tokens=6)
    prompts = [prompt_of(n, 40 + n) for n in (4, 7, 2, 9)]
    params = SamplingParams(max_tokens=8, temperature=0.0)
    ids = [llm.add_request({"prompt_token_ids": p}, params) for p in prompts]
    outs, steps = {}, 0
    while llm.has_unfinished_requests():
        for o in llm.step():
            assert o.request_id != ids[1] or steps <= 3
            if o.finished:
                outs[o.request_id] = o
        steps += 1
        if steps == 3:
            llm.abort_request(ids[1])
        check_invariants(llm.manager)
    assert ids[1] not in outs
    keep = [0, 2, 3]
    assert_reference([outs[ids[i]] for i in keep], [prompts[i] for i in keep], [params] * 3)
    assert llm.manager.request_ids == [] and llm.manager.stats().used_pages == 0


def test_stream_closed_early_aborts_its_requests():
    llm = make_llm()
    prompts = [prompt_of(5, 1), prompt_of(8, 2)]
    it = llm.stream([{"prompt_token_ids": p} for p in prompts], GREEDY)
    got = [next(it), next(it)]
    assert all(len(o.outputs[0].new_token_ids) == 1 for o in got)
    it.close()
    assert not llm.has_unfinished_requests() and llm.manager.stats().used_pages == 0


def test_outputs_share_the_requests_token_list():
    """A request's outputs of successive steps hold one list (no copy of the generation a
    step), which equals the concatenated deltas whenever it is read."""
    llm = make_llm()
    seen: dict[int, list] = {}
    deltas: dict[int, list[int]] = {}
    for o in llm.stream([{"prompt_token_ids": prompt_of(5, 1)}], GREEDY):
        toks = o.outputs[0].token_ids
        assert seen.setdefault(o.request_id, toks) is toks
        deltas.setdefault(o.request_id, []).extend(o.outputs[0].new_token_ids)
        assert toks == deltas[o.request_id]
    assert len(next(iter(seen.values()))) == GREEDY.max_tokens


def test_stream_yields_each_token_once():
    llm = make_llm(max_num_batched_tokens=5)
    prompts = [prompt_of(n, n) for n in (3, 8, 1)]
    toks: dict[int, list[int]] = {}
    finals = {}
    for o in llm.stream([{"prompt_token_ids": p} for p in prompts], GREEDY):
        toks.setdefault(o.request_id, []).extend(o.outputs[0].new_token_ids)
        assert toks[o.request_id] == o.outputs[0].token_ids
        if o.finished:
            assert o.request_id not in finals
            finals[o.request_id] = o
    outs = [finals[k] for k in sorted(finals)]
    assert_reference(outs, prompts, [GREEDY] * 3)


def test_bad_arguments_are_typed():
    with pytest.raises(NotSupportedYetError, match="tensor_parallel_size=2"):
        LLM(HistoryModel(), tensor_parallel_size=2, num_pages=4)
    with pytest.raises(InvalidArgumentError, match="max_model_len"):
        LLM(HistoryModel(), page_size=2, num_pages=4, max_model_len=9)
    with pytest.raises(InvalidArgumentError, match="gpu_memory_utilization"):
        LLM(HistoryModel(), num_pages=4, gpu_memory_utilization=0.5)
    llm = make_llm()
    for bad in ([], [VOCAB], [-1], [1.5], {"prompt": "x"}):
        with pytest.raises(InvalidArgumentError):
            llm.add_request(bad if not isinstance(bad, list) else {"prompt_token_ids": bad})
    with pytest.raises(InvalidArgumentError, match="tokenizer"):
        llm.add_request("text without a tokenizer")
    for kw in (
        dict(max_tokens=0),
        dict(temperature=-1.0),
        dict(top_p=0.0),
        dict(top_p=1.5),
        dict(top_k=-2),
        dict(seed=-1),
        dict(stop_token_ids=[-3]),
        dict(ignore_eos=1),
        dict(temperature=float("nan")),
    ):
        with pytest.raises(InvalidArgumentError, match="SamplingParams"):
            SamplingParams(**kw)
    with pytest.raises(UnknownRequestError):
        llm.abort_request(12345)
    assert llm.manager.request_ids == []


# --------------------------------------------------------------------------------------------
# Property test: random workloads on tiny pools
# --------------------------------------------------------------------------------------------
SHARED = [prompt_of(6, 99), prompt_of(4, 98)]
PROMPT = st.builds(
    lambda head, k, tail: SHARED[head][:k] + tail,
    st.integers(0, 1),
    st.integers(0, 6),
    st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=8),
)
REQUEST = st.tuples(
    PROMPT,
    st.integers(1, 8),  # max_tokens
    st.integers(0, 4),  # arrival step
    st.booleans(),  # a stop token (the reference's 2nd token) or not
)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)  # fmt: skip
@given(
    requests=st.lists(REQUEST, min_size=2, max_size=8),
    page_size=st.integers(1, 3),
    extra_pages=st.sampled_from([0, 0, 1, 2, 8]),
    budget=st.integers(1, 12),
    max_num_seqs=st.integers(1, 5),
)
def test_random_workloads_finish_each_request_exactly_once(
    requests, page_size, extra_pages, budget, max_num_seqs
):
    longest = max(len(p) + m for p, m, _, _ in requests)
    num_pages = -(-longest // page_size) + extra_pages  # one request always fits alone
    model = HistoryModel()
    llm = make_llm(
        model,
        page_size=page_size,
        num_pages=num_pages,
        max_num_batched_tokens=budget,
        max_num_seqs=max_num_seqs,
    )
    params, want = [], []
    for p, m, _, stops in requests:
        free, _ = reference_greedy(p, m)
        stop = (free[1],) if stops and len(free) > 1 else ()
        sp = SamplingParams(max_tokens=m, temperature=0.0, stop_token_ids=stop)
        params.append(sp)
        want.append(reference_greedy(p, m, stop=stop))
    order = sorted(range(len(requests)), key=lambda i: requests[i][2])
    rid_of: dict[int, int] = {}
    finished: dict[int, list] = {}
    step = 0
    while len(rid_of) < len(requests) or llm.has_unfinished_requests():
        for i in order:
            if i not in rid_of and requests[i][2] <= step:
                rid_of[i] = llm.add_request({"prompt_token_ids": requests[i][0]}, params[i])
        for o in llm.step():
            if o.finished:
                finished.setdefault(o.request_id, []).append(o)
        check_invariants(llm.manager)
        assert llm.manager.stats().used_pages <= num_pages
        step += 1
        assert step < 2000, "no progress"
    assert max(model.step_sizes) <= budget
    for i, rid in rid_of.items():
        (o,) = finished[rid]  # exactly once
        toks, reason = want[i]
        assert o.outputs[0].token_ids == toks and o.outputs[0].finish_reason == reason
    assert len(finished) == len(requests)
    assert llm.manager.request_ids == [] and llm.manager.stats().used_pages == 0


# --------------------------------------------------------------------------------------------
# The scheduler's per-request shortcuts (host time a step)
# --------------------------------------------------------------------------------------------
def test_schedule_marks_pure_decode_batches_and_counts_prompt_tokens():
    """`ScheduledBatch.all_decodes` is True exactly for a step of decodes alone (the engine
    then skips its per-request prompt-token count), with the general path's counts; an
    admission in the same step makes it a mixed batch. The engine's prompt-token count over a
    run with such steps stays exact."""
    llm = make_llm(max_num_batched_tokens=16)
    sched = llm.scheduler
    ids = [llm.add_request(prompt_of(n, n), SamplingParams(max_tokens=4, temperature=0))
           for n in (5, 7)]  # fmt: skip
    first = sched.schedule()
    assert not first.all_decodes and first.num_new_tokens == [5, 7]
    sched.resolve(sched.commit(first), [3, 4])
    pure = sched.schedule()
    assert pure.all_decodes and pure.num_new_tokens == [1, 1]
    assert all(s.is_decode for s in pure.seqs)
    sched.resolve(sched.commit(pure), [5, 6])
    ids.append(llm.add_request(prompt_of(3, 3), SamplingParams(max_tokens=2, temperature=0)))
    mixed = sched.schedule()
    assert not mixed.all_decodes and mixed.num_new_tokens == [1, 1, 3]
    assert [s.is_decode for s in mixed.seqs] == [True, True, False]
    sched.waiting.clear()  # (drop the scheduled step: abort all cleanly)
    for rid in ids:
        llm.abort_request(rid)
    check_invariants(llm.manager)

    llm = make_llm(max_num_batched_tokens=16)
    seen = []
    schedule = llm.scheduler.schedule
    llm.scheduler.schedule = lambda: seen.append(schedule()) or seen[-1]
    prompts = [prompt_of(n, n) for n in (5, 7, 3)]
    params = SamplingParams(max_tokens=4, temperature=0)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
    assert_reference(outs, prompts, [params] * 3)
    assert any(b.all_decodes for b in seen) and not all(b.all_decodes for b in seen if b.seqs)
    assert llm.stats().prompt_tokens == 5 + 7 + 3


def test_finish_counter_and_inlined_stop_checks():
    """`Scheduler.num_finished` counts every finish once (stop token, length, abort), and the
    resolve's stop / length rules are `reference_greedy`'s."""
    p = prompt_of(4, 7)
    free, _ = reference_greedy(p, 6)
    llm = make_llm(HistoryModel(eos=[free[1]]))
    sched = llm.scheduler
    outs = llm.generate([{"prompt_token_ids": p}] * 2,
                        [SamplingParams(max_tokens=6, temperature=0),
                         SamplingParams(max_tokens=3, temperature=0, ignore_eos=True)])  # fmt: skip
    assert [o.outputs[0].finish_reason for o in outs] == ["stop", "length"]
    assert outs[0].outputs[0].token_ids == free[:2] and outs[0].outputs[0].stop_reason == free[1]
    assert outs[1].outputs[0].token_ids == free[:3]
    assert sched.num_finished == 2
    rid = llm.add_request(p, SamplingParams(max_tokens=6, temperature=0))
    llm.abort_request(rid)
    assert sched.num_finished == 3
    llm.abort_request(llm.add_request(p))  # (a second abort of nothing running)
    assert sched.num_finished == 4
