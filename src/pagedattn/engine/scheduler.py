"""Continuous batching with chunked prefill, prefix caching and preemption by recompute.

Each `schedule()` builds one step under a budget of `max_num_batched_tokens` new tokens:

1. Running requests first: every decode (1 token each), then the prompt chunks of requests
   still prefilling (as many of their tokens as the budget has left), each group oldest first.
2. Then waiting requests, oldest first, while the budget, the batch slots (`max_num_seqs`) and
   the pages last: `claim` matches the prompt against the prefix cache, its first chunk is
   allocated, and admission stops at the first request that does not fit (no overtaking). No
   request is admitted in a step that preempted one.
3. Pages: `alloc` of a running request that finds the pool empty preempts the newest running
   request (frees its pages, `release`; it waits to be admitted again and then recomputes its
   tokens, mostly from the prefix cache). A request is never preempted for a newer one, so the
   oldest always progresses: every step finishes a token or a chunk of the oldest request, and
   no request can starve (each fits the pool alone: `max_model_len` <= pool tokens).

Requests with a shared prefix admitted before either committed it (the same step, say) both
compute it; when the step commits, the manager switches the later one to the cached pages and
frees its copies (cache/manager.py, `step`), so they share the prefix from then on.

After the model ran, in two halves (the engine's overlapped mode runs the next step between
them, llm_engine.py):
- `commit(batch)` commits the step (`manager.step`) with each sample deferred (its value not
  known yet, `DEFERRED`): the request's next decode can be scheduled. A request that reaches
  its length limit (max_tokens or max_model_len) with it is not scheduled again.
- `resolve(seqs, tokens)` gives the samples their values (`manager.fill_deferred`), finishes
  requests (a stop token, max_tokens, or max_model_len) and releases their pages. A request
  that finished here while its next step was already scheduled has that step's work dropped
  (the engine does not commit it).
`update(batch, sampled)` is both at once.
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ..cache.manager import DEFERRED, PagedKVCacheManager
from ..errors import OutOfPagesError, check_int
from .sequence import Sequence, SequenceStatus


def _key(s: Sequence) -> int:
    return s.request_id


@dataclass
class ScheduledBatch:
    """One step's work: `seqs[i]` runs `num_new_tokens[i]` tokens (in this order)."""

    seqs: list[Sequence] = field(default_factory=list)
    num_new_tokens: list[int] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)
    # every request a decode (`Sequence.is_decode`): set by `Scheduler.schedule` when it knows
    all_decodes: bool = False

    @property
    def num_batched_tokens(self) -> int:
        return sum(self.num_new_tokens)

    def samples(self, i: int) -> bool:
        """Whether request i's chunk completes its known tokens (so it samples a token)."""
        s = self.seqs[i]
        return s.num_computed + self.num_new_tokens[i] == s.num_tokens

    def sampling(self) -> list[bool]:
        """`samples(i)` of every request, in order."""
        # (`Sequence.num_tokens` inlined: every request, every step)
        return [
            s.num_computed + n == len(s._tokens) for s, n in zip(self.seqs, self.num_new_tokens)
        ]

    def __len__(self) -> int:
        return len(self.seqs)


class Scheduler:
    """FCFS continuous batching over a `PagedKVCacheManager` (module docstring)."""

    def __init__(
        self,
        manager: PagedKVCacheManager,
        *,
        max_num_batched_tokens: int,
        max_num_seqs: int,
        max_model_len: int,
        eos_token_ids: tuple[int, ...] = (),
        stop_text: Callable[[Sequence], str | None] | None = None,
    ) -> None:
        self.manager = manager
        # the stop string a request's new token completed, or None (the engine's, which holds
        # the tokenizer; asked only for requests with `SamplingParams.stop`)
        self.stop_text = stop_text
        self.max_num_batched_tokens = check_int("max_num_batched_tokens", max_num_batched_tokens, 1)
        self.max_num_seqs = check_int("max_num_seqs", max_num_seqs, 1, manager.max_batch_size)
        self.max_model_len = check_int("max_model_len", max_model_len, 1, manager.max_seq_len)
        self.eos_token_ids = frozenset(eos_token_ids)
        self.waiting: list[Sequence] = []  # oldest first (request ids grow with arrival)
        self.running: list[Sequence] = []  # oldest first
        # Counters for the engine's metrics.
        self.num_preemptions = 0
        self.num_finished = 0  # requests finished (resolved or aborted), ever
        self.prefix_query_tokens = 0
        self.prefix_hit_tokens = 0

    # Queues ------------------------------------------------------------------------------
    def add(self, seq: Sequence) -> None:
        seq.status = SequenceStatus.WAITING
        bisect.insort(self.waiting, seq, key=_key)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def abort(self, seq: Sequence) -> None:
        """Drop a request wherever it is (its pages are released); it finishes as "abort"."""
        if seq.status is SequenceStatus.RUNNING:
            self.manager.release(seq.request_id)
            self.running.remove(seq)
        elif seq.status is SequenceStatus.WAITING:
            self.waiting.remove(seq)
        if seq.status is not SequenceStatus.FINISHED:
            self.num_finished += 1
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = seq.finish_reason or "abort"

    def _preempt(self, seq: Sequence) -> None:
        self.manager.release(seq.request_id)
        self.running.remove(seq)
        seq.num_computed = 0
        seq.metrics.num_preemptions += 1
        self.num_preemptions += 1
        self.add(seq)

    # Scheduling --------------------------------------------------------------------------
    def schedule(self) -> ScheduledBatch:
        budget = self.max_num_batched_tokens
        plan: dict[int, tuple[Sequence, int]] = {}  # request id -> (seq, tokens), in order
        preempted: list[Sequence] = []
        mgr = self.manager
        decodes, prefills = [], []
        max_len = self.max_model_len
        # (has_deferred, _length_done and is_decode inlined: every request, every step)
        for s in self.running:
            tokens, out = s._tokens, s.output_token_ids
            done = len(out) >= s.params.max_tokens or len(tokens) >= max_len
            if done and tokens[-1] == DEFERRED:
                continue  # at its length limit: waits for its deferred token, then finishes
            if len(tokens) - s.num_computed == 1 and out:
                decodes.append(s)
            else:
                prefills.append(s)
        rest = decodes + prefills
        fast = decodes[:budget]
        fast_planned = False
        if fast:  # the decodes' pages in one call; the loop below when the pool runs short
            rids = [s.request_id for s in fast]
            try:
                mgr.alloc_decodes(rids)
            except OutOfPagesError:
                pass
            else:
                plan.update(zip(rids, [(seq, 1) for seq in fast]))
                fast_planned = True
                budget -= len(fast)
                rest = decodes[len(fast) :] + prefills
        for seq in rest:
            if budget == 0:
                break
            if seq.status is not SequenceStatus.RUNNING:
                continue  # preempted earlier in this loop
            n = min(seq.num_pending, budget)
            while True:
                try:
                    mgr.alloc(seq.request_id, n)
                    break
                except OutOfPagesError:
                    victim = self.running[-1]  # the newest; `seq` itself if none is newer
                    self._preempt(victim)
                    preempted.append(victim)
                    if victim is seq:
                        break
                    if victim.request_id in plan:  # scheduled earlier in this step: undo
                        budget += plan.pop(victim.request_id)[1]
            if seq.status is SequenceStatus.RUNNING:
                plan[seq.request_id] = (seq, n)
                budget -= n
        if not preempted:
            self._admit(plan, budget)
        if fast_planned and not preempted and len(plan) == len(fast):  # the decodes alone
            return ScheduledBatch(fast, [1] * len(fast), preempted, all_decodes=True)
        work = list(plan.values())
        return ScheduledBatch([s for s, _ in work], [n for _, n in work], preempted)

    def _admit(self, plan: dict[int, tuple[Sequence, int]], budget: int) -> None:
        mgr = self.manager
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            tokens = seq.tokens
            if seq.has_deferred:  # preempted with its sample in flight: admitted once known
                return
            hit = mgr.claim(seq.request_id, tokens)
            n = min(len(tokens) - hit, budget)
            try:
                mgr.alloc(seq.request_id, n)
            except OutOfPagesError:
                mgr.release(seq.request_id)
                return
            self.waiting.pop(0)
            seq.status = SequenceStatus.RUNNING
            seq.num_computed = hit
            bisect.insort(self.running, seq, key=_key)
            self.prefix_query_tokens += len(tokens)
            self.prefix_hit_tokens += hit
            m = seq.metrics
            if m.first_scheduled_time is None:
                m.first_scheduled_time = time.perf_counter()
                m.prefix_hit_tokens = hit
            plan[seq.request_id] = (seq, n)
            budget -= n

    # After the model ran -----------------------------------------------------------------
    def update(self, batch: ScheduledBatch, sampled: list[int]) -> list[Sequence]:
        """Commit the step and resolve its samples: `sampled` holds one token for each request
        that samples (in batch order). Returns the requests that got a token (finished ones
        included)."""
        return self.resolve(self.commit(batch), sampled)

    def commit(self, batch: ScheduledBatch) -> list[Sequence]:
        """Commit the step's K/V with each request's sample deferred; returns the requests
        that sample, in batch order (the order of the step's sampled tokens)."""
        seqs = batch.seqs
        sampling = batch.sampling()
        self.manager.step_deferred([s.request_id for s in seqs], sampling)
        out = []
        for seq, n, x in zip(seqs, batch.num_new_tokens, sampling):
            seq.num_computed += n
            if x:  # (`Sequence.append_token(DEFERRED)` inlined: every request, every step)
                seq.output_token_ids.append(DEFERRED)
                seq._tokens.append(DEFERRED)
                out.append(seq)
        return out

    def resolve(self, seqs: list[Sequence], tokens: list[int]) -> list[Sequence]:
        """The values of the deferred samples of `seqs` (from `commit`; one token each).
        Requests finished meanwhile (aborted) are skipped; a preempted one (waiting) gets its
        value and may finish there. Returns the requests that got a token."""
        FINISHED, RUNNING = SequenceStatus.FINISHED, SequenceStatus.RUNNING
        live = [(s, t) for s, t in zip(seqs, tokens) if s.status is not FINISHED]
        held = [(s.request_id, t) for s, t in live if s.status is RUNNING]
        if held:
            rids, toks = zip(*held)
            self.manager.fill_deferred(rids, toks)
        now = time.perf_counter()
        eos, max_len = self.eos_token_ids, self.max_model_len
        for seq, tok in live:
            # (`Sequence.fill_deferred` and `_check_stop` inlined: every request, every step)
            out = seq.output_token_ids
            out[-1] = tok
            seq._tokens[-1] = tok
            seq._known.append(tok)
            m = seq.metrics
            m.num_generated_tokens += 1
            if m.first_token_time is None:
                m.first_token_time = now
            m.last_token_time = now
            p = seq.params
            if tok in p.stop_token_ids or (not p.ignore_eos and tok in eos):
                seq.finish_reason, seq.stop_reason = "stop", tok
            elif p.stop and self.stop_text and (hit := self.stop_text(seq)) is not None:
                seq.finish_reason, seq.stop_reason = "stop", hit
            elif len(out) >= p.max_tokens or len(seq._tokens) >= max_len:
                seq.finish_reason = "length"
            if seq.finish_reason is not None:
                if seq.status is RUNNING:
                    self.manager.release(seq.request_id)
                    self.running.remove(seq)
                else:
                    self.waiting.remove(seq)
                seq.status = FINISHED
                self.num_finished += 1
                m.finish_time = now
        return [seq for seq, _ in live]


__all__ = ["ScheduledBatch", "Scheduler"]
