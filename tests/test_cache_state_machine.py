"""Hypothesis state machine over claim/alloc/step/release/evict, failures included."""

from __future__ import annotations

import hashlib

import torch
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    invariant,
    precondition,
    rule,
)

from pagedattn import (
    KVCacheParams,
    MaxLengthExceededError,
    OutOfPagesError,
    PagedKVCacheManager,
    gather_kv,
    store_kv,
)
from pagedattn.testing import ragged_offsets

PAGES, PAGE_SIZE, MAX_SEQ = 12, 3, 24
VOCAB = st.integers(0, 3)
# Prompts start from a few shared system prompts so that prefix hits are common.
PROMPTS = st.builds(
    lambda head, tail: head + tail,
    st.sampled_from([[], [0, 1, 2, 3, 0, 1, 2], [2, 2, 2, 1]]),
    st.lists(VOCAB, min_size=1, max_size=8),
)


def kv_value(tokens: list[int], salt: str | None) -> float:
    """What a 'model' writes for the last token of `tokens`: depends on the whole prefix."""
    h = hashlib.sha256(repr((salt, tokens)).encode()).digest()
    return float(int.from_bytes(h[:3], "little"))


class CacheMachine(RuleBasedStateMachine):
    requests = Bundle("requests")

    def __init__(self) -> None:
        super().__init__()
        self.params = KVCacheParams(torch.float32, 1, 1, 2, PAGE_SIZE)
        self.m = PagedKVCacheManager(self.params, PAGES, max_batch_size=6, max_seq_len=MAX_SEQ)
        self.salts: dict[int, str | None] = {}
        self.next_id = 0

    def _write(self, rid: int, n: int) -> None:
        """Write K/V for the next n tokens of rid at cache_length + i."""
        (inp,) = self.m.runtime_inputs([rid])
        cl = self.m.cache_length(rid)
        toks = self.m.tokens(rid)
        vals = torch.tensor(
            [kv_value(toks[: cl + i + 1], self.salts[rid]) for i in range(n)], dtype=torch.float32
        )
        k = vals.view(n, 1, 1).expand(n, 1, 2).contiguous()
        store_kv(k, -k, inp, self.params, 0, ragged_offsets([n]))

    @rule(
        target=requests,
        prompt=PROMPTS,
        salt=st.sampled_from([None, "t1"]),
    )
    def claim(self, prompt, salt):
        rid = self.next_id
        self.next_id += 1
        if len(self.m.request_ids) >= 6:
            return rid  # a later rule on an unclaimed id exercises UnknownRequestError
        hit = self.m.claim(rid, prompt, salt=salt)
        self.salts[rid] = salt
        assert hit % PAGE_SIZE == 0 and hit < len(prompt)
        if hit:
            # A prefix hit returns exactly the K/V bytes written for that prefix and salt.
            before = self.m.snapshot()
            try:
                self.m.alloc(rid, 1)
            except OutOfPagesError:
                assert self.m.snapshot() == before
                return rid
            (inp,) = self.m.runtime_inputs([rid])
            k, v = gather_kv(inp, self.params, 0, 0, hit)
            want = torch.tensor([kv_value(prompt[: i + 1], salt) for i in range(hit)])
            assert torch.equal(k[:, 0, 0], want) and torch.equal(v[:, 0, 1], -want)
        return rid

    @rule(rid=requests, chunk=st.integers(1, 8), steps=st.integers(1, 3), data=st.data())
    def run_step(self, rid, chunk, steps, data):
        if rid not in self.m:
            return
        known = len(self.m.tokens(rid)) - self.m.cache_length(rid)
        n = min(chunk, known)
        finishing = n == known
        steps = steps if finishing and n == 1 else 1
        before = self.m.snapshot()
        try:
            self.m.alloc(rid, n, num_steps=steps)
        except (OutOfPagesError, MaxLengthExceededError):
            assert self.m.snapshot() == before
            return
        self._write(rid, n)
        sampled = data.draw(st.lists(VOCAB, min_size=steps, max_size=steps)) if finishing else []
        if steps > 1:
            # Multi-step decode: the extra steps' inputs are the sampled tokens; write their K/V.
            self.m.step([rid], [sampled[:1]])
            for t in sampled[1:]:
                self.m.alloc(rid, 1)
                self._write(rid, 1)
                self.m.step([rid], [[t]])
        else:
            self.m.step([rid], [sampled])

    @rule(rid=consumes(requests))
    def release(self, rid):
        if rid in self.m:
            self.m.release(rid)

    @rule(n=st.integers(0, 4))
    def evict(self, n):
        self.m.evict(n)

    @precondition(lambda self: self.m.request_ids)
    @rule(extra=st.integers(1, 40))
    def failing_alloc(self, extra):
        rid = self.m.request_ids[0]
        before = self.m.snapshot()
        try:
            self.m.alloc(rid, 1, num_steps=PAGES * PAGE_SIZE + extra)
        except (OutOfPagesError, MaxLengthExceededError):
            assert self.m.snapshot() == before
        else:
            raise AssertionError("an allocation past max_seq_len succeeded")

    @invariant()
    def pool_invariants(self):
        pool = self.m.pools[0]
        owned: dict[int, int] = {}
        for rid in self.m.request_ids:
            for p in self.m.pages(rid):
                owned[p] = owned.get(p, 0) + 1
        free = pool.free_pages()
        # free + used == total; no double free (free list has no repeats).
        assert pool.num_free == len(free)
        assert len(free) + len(owned) == PAGES
        assert pool.num_used == len(owned)
        # No page both free and owned.
        assert not (free & set(owned))
        # Ref counts equal the number of owners.
        for p in range(PAGES):
            assert pool.ref_counts[p] == owned.get(p, 0)
        # Every cached page maps back to its hash.
        assert all(pool.hash_to_page[h] == p for p, h in pool.page_to_hash.items())


CacheMachine.TestCase.settings = settings(
    max_examples=200,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestCacheStateMachine = CacheMachine.TestCase
