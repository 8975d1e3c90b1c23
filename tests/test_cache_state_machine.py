"""Hypothesis state machine over the manager's lifecycle, failures included.

A model of every request (its tokens, salt, replica and committed length) runs beside a
`PagedKVCacheManager`; a fake "model" writes, for each token it commits, a K/V value that hashes
the whole prefix and the salt, so any page shared wrongly (across salts, prefixes or replicas)
shows up as a wrong value. Covered: page size 1 and 3; one or two data-parallel replicas;
batches of several requests per alloc/runtime_inputs/step; prompt chunks, multi-step
(`num_steps` > 1, possibly stopping early) and draft tokens (some accepted, plus a bonus token);
prefix hits, salts (None, "" and "t1" are three tenants), LRU eviction and preemption. Failing
calls (unknown ids, duplicates, no allocation, too many new tokens, token ids outside
[0, 2**63) mixed with good requests, bad counts, bools for ints) must raise a `PagedAttnError`
and leave `snapshot()` unchanged; the good call that follows must then work.
"""

from __future__ import annotations

import hashlib
import math

import numpy as np
import pytest
import torch
from bad_inputs import assert_rejected, bad_ints, bad_token_lists
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from pagedattn import (
    CapacityError,
    DuplicateRequestError,
    KVCacheParams,
    MaxLengthExceededError,
    OutOfPagesError,
    PagedKVCacheManager,
    UnknownRequestError,
    store_kv,
)
from pagedattn.testing import ragged_offsets

TOKENS_PER_REPLICA, MAX_SEQ, MAX_BATCH = 30, 18, 5
VOCAB = st.integers(0, 3)
# Prompts start from a few shared system prompts so that prefix hits are common.
PROMPTS = st.builds(
    lambda head, tail: head + tail,
    st.sampled_from([[], [0, 1, 2, 3, 0, 1, 2], [2, 2, 2, 1]]),
    st.lists(VOCAB, min_size=1, max_size=8),
)
GHOST = "ghost"  # never claimed
BAD_IDS = [5, None, 1.5, "ab"]  # request_ids that are not a list/tuple of ids
# Token ids a manager must reject (outside [0, 2**63) or not ints).
BAD_TOKENS = [-1, 2**64, 2**63, -(2**63), 1.5, "7", None, True, np.float32(1)]
# Calls with bad arguments while no request has an allocation.
IDLE_FAILURES = (
    "claim_duplicate",
    "claim_bad_tokens",
    "claim_empty",
    "claim_too_long",
    "claim_bad_salt",
    "claim_bad_replica",
    "claim_unhashable",
    "alloc_unknown",
    "alloc_bad_count",
    "alloc_too_long",
    "runtime_unknown",
    "runtime_no_alloc",
    "runtime_bad_steps",
    "runtime_bad_ids",
    "step_unknown",
    "step_no_alloc",
    "step_bad_ids",
    "release_unknown",
    "evict_bad_count",
    "evict_bad_replica",
)
# Calls with bad arguments between a batch's alloc and its step.
PENDING_FAILURES = (
    "step_bad_token",
    "step_too_many",
    "step_unknown",
    "step_duplicate",
    "step_length_mismatch",
    "step_unallocated_member",
    "runtime_too_many_steps",
    "runtime_unknown",
    "runtime_duplicate",
    "runtime_unallocated_member",
    "runtime_bad_padded_cols",
)


def kv_value(tokens: list[int], salt: str | None) -> float:
    """What the 'model' writes for the last token of `tokens`: depends on the whole prefix and
    the salt (exact in float32: < 2**24)."""
    h = hashlib.sha256(repr((salt, tokens)).encode()).digest()
    return float(int.from_bytes(h[:3], "little"))


class Req:
    def __init__(self, tokens: list[int], salt: str | None, replica: int, hit: int) -> None:
        self.tokens, self.salt, self.replica, self.cached = list(tokens), salt, replica, hit
        self.values = [kv_value(tokens[: i + 1], salt) for i in range(hit)]

    def commit(self, new_tokens: list[int], num_committed: int) -> None:
        self.tokens += new_tokens
        for i in range(self.cached, self.cached + num_committed):
            self.values.append(kv_value(self.tokens[: i + 1], self.salt))
        self.cached += num_committed


class CacheMachine(RuleBasedStateMachine):
    """Subclasses may narrow SALTS / IDLE / PENDING (to run one failure kind at a time)."""

    SALTS = (None, "", "t1")
    IDLE = IDLE_FAILURES
    PENDING = PENDING_FAILURES

    @initialize(page_size=st.sampled_from([1, 3]), dp=st.sampled_from([1, 2]))
    def setup(self, page_size, dp):
        self.ps, self.dp = page_size, dp
        self.pages = TOKENS_PER_REPLICA // page_size
        self.params = KVCacheParams(
            torch.float32, 1, 1, 2, page_size, devices=["cpu"] * dp, data_parallel_degree=dp
        )
        self.m = PagedKVCacheManager(
            self.params, self.pages, max_batch_size=MAX_BATCH, max_seq_len=MAX_SEQ
        )
        self.model: dict[int, Req] = {}
        self.next_id = 0
        self.query_tokens = self.hit_tokens = 0

    # Helpers -------------------------------------------------------------------------
    def rejected(self, fn, *args, names=None, **kw):
        return assert_rejected(fn, *args, state=(self.m,), names=names, **kw)

    def new_id(self) -> int:
        self.next_id += 1
        return self.next_id - 1

    def _expected_alloc_error(self, rid, n, steps, drafts):
        r = self.model[rid]
        total = r.cached + n + steps - 1 + drafts
        if total > MAX_SEQ:
            return MaxLengthExceededError
        need = math.ceil(total / self.ps) - len(self.m.pages(rid))
        if need > self.m.pools[r.replica].num_free:
            return OutOfPagesError
        return None

    def _expected_decodes_error(self, batch):
        """`alloc_decodes`'s error for a batch of decodes: a request too long, else a replica
        whose pool cannot cover its requests' total need (all or nothing), else None."""
        need: dict[int, int] = {}
        for rid in batch:
            r = self.model[rid]
            if r.cached + 1 > MAX_SEQ:
                return MaxLengthExceededError
            more = max(math.ceil((r.cached + 1) / self.ps) - len(self.m.pages(rid)), 0)
            need[r.replica] = need.get(r.replica, 0) + more
        if any(n > self.m.pools[rep].num_free for rep, n in need.items()):
            return OutOfPagesError
        return None

    def _write(self, batch, writes) -> None:
        """Store each request's written token values at cache_length + i, per replica."""
        ins = self.m.runtime_inputs(batch) if batch else []
        for replica in range(self.dp):
            mine = [rid for rid in batch if self.model[rid].replica == replica]
            vals = [v for rid in mine for v in writes[rid]]
            if not vals:
                continue
            k = torch.tensor(vals, dtype=torch.float32).view(-1, 1, 1).expand(-1, 1, 2)
            k = k.contiguous()
            offs = ragged_offsets([len(writes[rid]) for rid in mine])
            store_kv(k, -k, ins[replica], self.params, 0, offs)

    def _check_inputs(self, batch, steps, padded_cols) -> None:
        ins = self.m.runtime_inputs(batch, steps, padded_cols=padded_cols)
        assert len(ins) == self.dp  # tensor-parallel degree 1: one device per replica
        for replica, inp in enumerate(ins):
            mine = [rid for rid in batch if self.model[rid].replica == replica]
            assert inp.batch_size == len(mine)
            if not mine:
                continue
            assert inp.kv_blocks is self.m.buffers[replica].kv_blocks
            cls = [self.model[rid].cached for rid in mine]
            assert inp.cache_lengths.tolist() == cls
            pages = [self.m.pages(rid) for rid in mine]
            width = padded_cols or max(len(p) for p in pages)
            want = [p + [self.pages] * (width - len(p)) for p in pages]
            assert inp.lookup_table.tolist() == want
            ns = [self.pending[rid] for rid in mine]
            grown = max(c + n for c, n in zip(cls, ns))
            want_ml = [[max(ns), max(cls)]] + [[1, grown + i - 1] for i in range(1, steps)]
            assert inp.max_lengths.tolist() == want_ml

    # Rules ---------------------------------------------------------------------------
    @rule(prompt=PROMPTS, data=st.data())
    def claim(self, prompt, data):
        rid = self.new_id()
        salt = data.draw(st.sampled_from(self.SALTS), label="salt")
        replica = data.draw(st.none() | st.integers(0, self.dp - 1), label="replica")
        if len(self.m.request_ids) >= MAX_BATCH:
            err = self.rejected(self.m.claim, rid, prompt, salt=salt, replica=replica)
            assert isinstance(err, CapacityError)
            return
        load = [0] * self.dp
        for r in self.model.values():
            load[r.replica] += 1
        hit = self.m.claim(rid, prompt, salt=salt, replica=replica)
        got = self.m.replica_of(rid)
        assert got == replica if replica is not None else load[got] == min(load)
        assert hit % self.ps == 0 and 0 <= hit < len(prompt)
        self.model[rid] = Req(prompt, salt, got, hit)
        self.query_tokens += len(prompt)
        self.hit_tokens += hit

    @rule(data=st.data())
    def batch(self, data):
        """alloc + runtime_inputs + (model writes) + step over several requests at once."""
        if not self.model:
            return
        ids = sorted(self.model)
        batch = data.draw(
            st.lists(st.sampled_from(ids), min_size=1, max_size=len(ids), unique=True),
            label="batch",
        )
        mode = data.draw(st.sampled_from(["single", "multi_step", "draft"]), label="mode")
        steps = data.draw(st.integers(2, 3)) if mode == "multi_step" else 1
        drafts = data.draw(st.integers(1, 3)) if mode == "draft" else 0
        self.pending: dict[int, int] = {}
        had = {rid: len(self.m.pages(rid)) for rid in batch}
        decodes = all(len(self.model[r].tokens) - self.model[r].cached == 1 for r in batch)
        if mode == "single" and decodes and data.draw(st.booleans(), label="alloc_decodes"):
            want = self._expected_decodes_error(batch)
            if want is None:
                self.m.alloc_decodes(batch)
                self.pending = dict.fromkeys(batch, 1)
            else:
                err = self.rejected(
                    self.m.alloc_decodes, batch, names=("request_ids", "alloc_decodes")
                )
                assert isinstance(err, want), (err, want)
                return
        for rid in list(batch) if not self.pending else []:
            r = self.model[rid]
            known = len(r.tokens) - r.cached
            n = data.draw(st.sampled_from([known, 1, known]) | st.integers(1, known), label="n")
            want = self._expected_alloc_error(rid, n, steps, drafts)
            if want is None:
                self.m.alloc(rid, n, steps, num_draft_tokens=drafts)
                self.pending[rid] = n
            else:
                err = self.rejected(self.m.alloc, rid, n, steps, num_draft_tokens=drafts)
                assert isinstance(err, want), (err, want)
                batch.remove(rid)
        if not batch:
            return
        # Pages cover every reserved slot (they never shrink: rejected drafts keep theirs).
        for rid in batch:
            slots = self.model[rid].cached + self.pending[rid] + steps - 1 + drafts
            assert len(self.m.pages(rid)) == max(had[rid], math.ceil(slots / self.ps))
        # What the model samples and writes.
        new_tokens, writes, commits = [], {}, {}
        for rid in batch:
            r, n = self.model[rid], self.pending[rid]
            chunk = r.tokens[r.cached : r.cached + n]
            finishing = r.cached + n == len(r.tokens)
            if not finishing:
                nt, extra_inputs = [], []
            elif mode == "multi_step":  # may stop early (a stop token)
                nt = data.draw(st.lists(VOCAB, min_size=1, max_size=steps), label="sampled")
                extra_inputs = nt[:-1]
            elif mode == "draft":
                proposed = data.draw(st.lists(VOCAB, min_size=drafts, max_size=drafts))
                accepted = data.draw(st.integers(0, drafts), label="accepted")
                nt = proposed[:accepted] + [data.draw(VOCAB, label="bonus")]
                extra_inputs = proposed  # the verify pass writes every proposal's K/V
            else:
                nt, extra_inputs = [data.draw(VOCAB, label="sampled")], []
            seq = r.tokens[: r.cached] + chunk + extra_inputs
            writes[rid] = [kv_value(seq[: i + 1], r.salt) for i in range(r.cached, len(seq))]
            commits[rid] = n + max(len(nt) - 1, 0)
            new_tokens.append(nt)
        kind = data.draw(st.sampled_from(("none", *self.PENDING)), label="pending failure")
        self._pending_failure(kind, batch, new_tokens, steps, drafts, data)
        need = max(len(self.m.pages(rid)) for rid in batch)
        widest = math.ceil(MAX_SEQ / self.ps)
        padded = data.draw(st.none() | st.integers(need, widest), label="padded_cols")
        self._check_inputs(batch, steps, padded)
        self._write(batch, writes)
        form = data.draw(st.sampled_from([list, tuple, np.array, torch.tensor]), label="form")
        arg = [form(nt) if nt else nt for nt in new_tokens]
        self.m.step(batch, arg)
        for rid, nt in zip(batch, new_tokens):
            self.model[rid].commit(nt, commits[rid])
        self.pending = {}

    def _pending_failure(self, kind, batch, new_tokens, steps, drafts, data):
        m, rej = self.m, self.rejected
        others = [rid for rid in self.model if rid not in batch]
        if kind == "step_bad_token":
            i = data.draw(st.integers(0, len(batch) - 1), label="bad index")
            bad = list(new_tokens)
            tok = data.draw(st.sampled_from(BAD_TOKENS), label="bad token")
            whole = data.draw(st.booleans(), label="whole list bad")
            bad[i] = data.draw(bad_token_lists()) if whole else [*new_tokens[i][:-1], tok]
            rej(m.step, batch, bad, names="new_tokens")
        elif kind == "step_too_many":
            i = data.draw(st.integers(0, len(batch) - 1), label="index")
            bad = list(new_tokens)
            bad[i] = [*new_tokens[i], *[0] * (steps + drafts)] if new_tokens[i] else [0]
            rej(m.step, batch, bad, names="new_tokens")
        elif kind == "step_unknown":
            rej(m.step, [*batch, GHOST], [*new_tokens, [1]], names="request_id")
        elif kind == "step_duplicate":
            rej(m.step, [*batch, batch[0]], [*new_tokens, new_tokens[0]], names="request_ids")
        elif kind == "step_length_mismatch":
            bad = new_tokens[:-1] if data.draw(st.booleans()) else [*new_tokens, []]
            rej(m.step, batch, bad, names="new_tokens")
        elif kind == "step_unallocated_member" and others:
            rej(m.step, [*batch, others[0]], [*new_tokens, [1]], names="request_ids")
        elif kind == "runtime_too_many_steps":
            rej(m.runtime_inputs, batch, steps + 1, names="request_ids")
        elif kind == "runtime_unknown":
            rej(m.runtime_inputs, [GHOST, *batch], steps, names="request_id")
        elif kind == "runtime_duplicate":
            rej(m.runtime_inputs, [*batch, batch[-1]], steps, names="request_ids")
        elif kind == "runtime_unallocated_member" and others:
            rej(m.runtime_inputs, [*batch, others[0]], steps, names="request_ids")
        elif kind == "runtime_bad_padded_cols":
            need = max(len(m.pages(rid)) for rid in batch)
            widest = math.ceil(MAX_SEQ / self.ps)
            cols = data.draw(st.sampled_from([need - 1, widest + 1, True, 1.5, "3", -1]))
            rej(m.runtime_inputs, batch, steps, padded_cols=cols, names="padded_cols")

    @rule(data=st.data())
    def idle_failure(self, data):
        """A call with a bad argument while nothing is allocated changes nothing."""
        if not self.IDLE or not self.model:
            return
        m = self.m
        kind = data.draw(st.sampled_from(self.IDLE), label="idle failure")
        live = data.draw(st.sampled_from(sorted(self.model)), label="live id")
        full = len(self.model) >= MAX_BATCH

        def rej(fn, *args, names=None, **kw):
            # A claim at capacity may be refused for capacity first: any named error will do.
            named = None if full and fn == m.claim else names
            return self.rejected(fn, *args, names=named, **kw)

        if kind == "claim_duplicate":
            err = rej(m.claim, live, [1], names="request_id")
            assert isinstance(err, DuplicateRequestError)
        elif kind == "claim_bad_tokens":
            rej(m.claim, GHOST, data.draw(bad_token_lists()), names="prompt_tokens")
        elif kind == "claim_empty":
            rej(m.claim, GHOST, [], names="prompt_tokens")
        elif kind == "claim_too_long":
            err = rej(m.claim, GHOST, [0] * (MAX_SEQ + 1), names="prompt_tokens")
            assert isinstance(err, (MaxLengthExceededError, CapacityError))
        elif kind == "claim_bad_salt":
            salt = data.draw(st.sampled_from([5, 1.5, ["a"], True]))
            rej(m.claim, GHOST, [1, 2], salt=salt, names="salt")
        elif kind == "claim_bad_replica":
            replica = data.draw(st.sampled_from([self.dp, -1, True, False, 1.0, "0"]))
            rej(m.claim, GHOST, [1, 2], replica=replica, names="replica")
        elif kind == "claim_unhashable":
            rej(m.claim, [live], [1, 2], names="request_id")
        elif kind == "alloc_unknown":
            assert isinstance(rej(m.alloc, GHOST, 1, names="request_id"), UnknownRequestError)
        elif kind == "alloc_bad_count":
            known = len(self.model[live].tokens) - self.model[live].cached
            which = data.draw(st.sampled_from(["num_new_tokens", "num_steps", "num_draft_tokens"]))
            kw = {"num_new_tokens": 1, "num_steps": 1, "num_draft_tokens": 0}
            kw[which] = data.draw(
                bad_ints(1, known) if which == "num_new_tokens" else bad_ints(kw[which])
            )
            rej(m.alloc, live, kw["num_new_tokens"], kw["num_steps"], names=(which, "request"),
                num_draft_tokens=kw["num_draft_tokens"])  # fmt: skip
        elif kind == "alloc_too_long":
            err = rej(m.alloc, live, 1, MAX_SEQ + 1)
            assert isinstance(err, MaxLengthExceededError)
        elif kind == "runtime_unknown":
            rej(m.runtime_inputs, [live, GHOST], names="request_id")
        elif kind == "runtime_no_alloc":
            rej(m.runtime_inputs, [live], names="request_ids")
        elif kind == "runtime_bad_steps":
            rej(m.runtime_inputs, [live], data.draw(bad_ints(1)), names=("num_steps", "request"))
        elif kind == "runtime_bad_ids":
            rej(
                m.runtime_inputs,
                data.draw(st.sampled_from(BAD_IDS)),
                names="request_ids",
            )
        elif kind == "step_unknown":
            rej(m.step, [GHOST, live], [[1], [1]], names="request_id")
        elif kind == "step_no_alloc":
            rej(m.step, [live], [[1]], names="request_ids")
        elif kind == "step_bad_ids":
            rej(m.step, data.draw(st.sampled_from(BAD_IDS)), names="request_ids")
        elif kind == "release_unknown":
            assert isinstance(rej(m.release, GHOST, names="request_id"), UnknownRequestError)
        elif kind == "evict_bad_count":
            rej(m.evict, data.draw(st.sampled_from([-1, True, 1.5, "2"])), names="num_pages")
        elif kind == "evict_bad_replica":
            replica = data.draw(st.sampled_from([self.dp, -1, True, 1.0, "0"]))
            rej(m.evict, 1, replica, names="replica")

    @rule(data=st.data())
    def release(self, data):
        if not self.model:
            return
        rid = data.draw(st.sampled_from(sorted(self.model)), label="release id")
        if data.draw(st.booleans(), label="preempt"):
            # Preemption: an allocation that is never committed, then release.
            if self._expected_alloc_error(rid, 1, 1, 0) is None:
                self.m.alloc(rid, 1)
        self.m.release(rid)
        del self.model[rid]
        assert rid not in self.m

    @rule(n=st.none() | st.integers(0, 4), data=st.data())
    def evict(self, n, data):
        replica = data.draw(st.none() | st.integers(0, self.dp - 1), label="evict replica")
        pools = range(self.dp) if replica is None else [replica]
        before = {i: self.m.pools[i].evictable_pages() for i in pools}
        done = self.m.evict(n, replica)
        left = n
        for i in pools:  # replicas in order, least recently used first
            k = len(before[i]) if left is None else min(left, len(before[i]))
            assert self.m.pools[i].evictable_pages() == before[i][k:]
            left = None if left is None else left - k
        assert done == sum(len(b) for b in before.values()) - sum(
            len(self.m.pools[i].evictable_pages()) for i in pools
        )

    @rule()
    def reset_prefix_cache(self):
        self.m.reset_prefix_cache()
        for pool in self.m.pools:
            assert pool.evictable_pages() == []
            assert all(pool.ref_counts[p] > 0 for p in pool.page_to_hash)

    # Invariants ------------------------------------------------------------------------
    @invariant()
    def pools_and_requests(self):
        m, ps = self.m, self.ps
        assert sorted(m.request_ids) == sorted(self.model)
        owners: list[dict[int, list[tuple[int, int]]]] = [{} for _ in range(self.dp)]
        for rid, r in self.model.items():
            assert m.replica_of(rid) == r.replica
            assert m.tokens(rid) == r.tokens
            assert m.cache_length(rid) == r.cached < len(r.tokens)
            pages = m.pages(rid)
            assert len(set(pages)) == len(pages)
            assert r.cached <= len(pages) * ps
            for k, p in enumerate(pages):
                owners[r.replica].setdefault(p, []).append((rid, k))
        for i, pool in enumerate(m.pools):
            own = owners[i]
            free = pool.free_pages()
            assert pool.num_free == len(free)  # the free lists hold no page twice
            assert pool.num_free + pool.num_used == self.pages
            assert len(free) + len(own) == self.pages
            assert pool.num_used == len(own)
            assert not (free & set(own))  # no page both free and owned
            for p in range(self.pages):
                assert pool.ref_counts[p] == len(own.get(p, ()))
            # Hash maps are inverse; free cached pages are exactly the evictable ones.
            assert len(pool.hash_to_page) == len(pool.page_to_hash)
            assert all(pool.hash_to_page[h] == p for p, h in pool.page_to_hash.items())
            assert set(pool.evictable_pages()) == {
                p for p in pool.page_to_hash if pool.ref_counts[p] == 0
            }
            assert not (set(pool.evictable_pages()) & set(own))
            for p, holders in own.items():
                if p in pool.page_to_hash:
                    # A hashed page is a full page its owners have committed.
                    for rid, k in holders:
                        assert (k + 1) * ps <= self.model[rid].cached
                if len(holders) > 1:
                    # Shared only as a cached prefix: same index, same tokens, same salt.
                    assert p in pool.page_to_hash
                    (rid0, k0), *rest = holders
                    r0 = self.model[rid0]
                    for rid, k in rest:
                        r = self.model[rid]
                        assert k == k0 and r.salt == r0.salt
                        assert r.tokens[: (k + 1) * ps] == r0.tokens[: (k + 1) * ps]
        s = m.stats()
        assert s.total_pages == self.pages * self.dp == s.used_pages + s.free_pages
        assert s.cached_pages == sum(len(p.page_to_hash) for p in m.pools)
        assert (s.prefix_query_tokens, s.prefix_hit_tokens) == (self.query_tokens, self.hit_tokens)

    @invariant()
    def committed_kv_bytes(self):
        """Every committed position holds the value written for its own prefix and salt."""
        for rid, r in self.model.items():
            if not r.cached:
                continue
            blocks = self.m.buffers[r.replica].kv_blocks  # [pages, 2, 1, ps, 1, 2]
            pages = torch.tensor(self.m.pages(rid))
            k = blocks[pages, 0, 0, :, 0, 0].reshape(-1)[: r.cached]
            v = blocks[pages, 1, 0, :, 0, 1].reshape(-1)[: r.cached]
            want = torch.tensor(r.values, dtype=torch.float32)
            assert torch.equal(k, want) and torch.equal(v, -want), rid


CacheMachine.TestCase.settings = settings(
    max_examples=250,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestCacheStateMachine = CacheMachine.TestCase


# The failing calls above, pinned as plain examples ----------------------------------------
def _two_requests() -> PagedKVCacheManager:
    m = PagedKVCacheManager(KVCacheParams(torch.float32, 1, 1, 2, 1), 16, max_seq_len=16)
    for rid, prompt in (("ok", [1, 2, 3]), ("h", [4, 5])):
        m.claim(rid, prompt)
        m.alloc(rid, len(prompt), num_steps=2)
    return m


@pytest.mark.parametrize("bad", [-1, 2**64, 2**63, -(2**63), True, 1.5])
@pytest.mark.parametrize("committed", [False, True])
def test_step_with_one_bad_token_commits_no_request(bad, committed):
    """step(["ok", "h"], [[9], [bad]]) raises and commits neither request, also when the bad
    token would be committed and hashed (the first of two multi-step tokens)."""
    m = _two_requests()
    bad_list = [bad, 7] if committed else [bad]
    assert_rejected(m.step, ["ok", "h"], [[9], bad_list], state=(m,), names="new_tokens")
    m.step(["ok", "h"], [[9], [7, 8]])  # the same batch with good tokens still commits
    assert (m.cache_length("ok"), m.tokens("h"), m.cache_length("h")) == (3, [4, 5, 7, 8], 3)


@pytest.mark.parametrize("salts", [(None, ""), ("", None), (None, b""), ("", "t1")])
def test_every_salt_isolates_the_empty_one_included(salts):
    m = PagedKVCacheManager(KVCacheParams(torch.float32, 1, 1, 2, 2), 16, max_seq_len=16)
    prompt = [1, 2, 3, 4, 5]
    m.claim("a", prompt, salt=salts[0])
    m.alloc("a", 5)
    m.step(["a"], [[6]])
    assert m.claim("same", prompt, salt=salts[0]) == 4
    assert m.claim("other", prompt, salt=salts[1]) == 0
