"""`PagedKVCacheManager`: requests, pages, prefix caching and per-device inputs.

Lifecycle of a request:

    claim(rid, prompt_tokens)          -> tokens served from the prefix cache
    alloc(rid, num_new_tokens, num_steps=1, num_draft_tokens=0)
    runtime_inputs(rids, num_steps=1)  -> [KVCacheInputsPerDevice] one per device
    ... run the model: it writes K/V of the new tokens at cache_length + i ...
    step(rids, new_tokens)             -> commit; full pages enter the prefix cache
    release(rid)

`step` commits `num_new_tokens + len(new_tokens[i]) - 1` tokens for request i: the prompt chunk
(or the one decode input), plus one per extra multi-step step or accepted draft token; the last
sampled token is the input of the next step and is not cached yet.

Deferred tokens (an engine that schedules step n+1 before step n's samples reach the host):
`step_deferred(rids, sampling)` commits a step whose sampled tokens are not known yet; each
one holds its place (`DEFERRED`, never a valid token id; the next `alloc` treats it as the
known, uncached decode input) until `fill_deferred(rids, tokens)` gives its value. A page is
hashed only once all its tokens are known: a commit that would fill a page holding a deferred
token raises InvalidArgumentError.

Prefix pages computed twice: requests with the same prefix claimed before any of them committed
it (e.g. admitted in the same step) each compute it in pages of their own. When `step` commits a
full page whose hash is already cached under another page, the request switches to that cached
page (same index, same tokens, same salt) and its duplicate goes back to the free pool, so such
requests share their prefix from then on (`CacheStats.deduplicated_pages` counts the switches).

Every public method validates first and mutates after: a call that raises leaves every count,
ref count and table exactly as it was.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from itertools import compress
from operator import attrgetter

import numpy as np
import torch

from ..errors import (
    INT32_MAX,
    INT64_MAX,
    CapacityError,
    DuplicateRequestError,
    InvalidArgumentError,
    Lazy,
    MaxLengthExceededError,
    OutOfPagesError,
    UnknownRequestError,
    check,
    check_int,
)
from .block_pool import BlockPool, _page_hash
from .buffers import DeviceBuffers, StagingRing, allocate_buffers, hosts_to_device
from .dispatch import fast_hbm, mha_num_partitions, mla_num_partitions, mla_tile, num_sms
from .inputs import KVCacheInputsPerDevice
from .params import KVCacheParams


class _Allocations:
    """The manager's per-slot allocation state, in arrays (like its tables) so that a batch's
    checks and commits are array ops: the tokens alloc'ed for this step (the step's prompt
    length; 0: no allocation), its num_steps and num_draft, and the request's known tokens
    (len(tokens))."""

    def __init__(self, num_slots: int) -> None:
        self.pending = np.zeros(num_slots, np.int64)
        self.num_steps = np.ones(num_slots, np.int64)
        self.num_draft = np.zeros(num_slots, np.int64)
        self.num_tokens = np.zeros(num_slots, np.int64)

    def reset(self, slot: int, num_tokens: int = 0) -> None:
        """No allocation in `slot`, whose request knows `num_tokens` tokens."""
        self.pending[slot], self.num_steps[slot], self.num_draft[slot] = 0, 1, 0
        self.num_tokens[slot] = num_tokens


@dataclass
class _Request:
    rid: Hashable
    replica: int
    slot: int
    tokens: list[int]
    salt: bytes | None
    allocs: _Allocations = field(repr=False, compare=False)  # the manager's (read by slot)
    # The hash chain of its full cached pages: len(hashes) == cache length // page_size with
    # prefix caching (claim's hits, then `step` hashes each page it fills), else empty.
    hashes: list[bytes] = field(default_factory=list)
    prefix_hit: int = 0

    @property
    def pending(self) -> int:
        """Tokens alloc'ed for this step (the step's prompt length; 0: no allocation)."""
        return int(self.allocs.pending[self.slot])

    @property
    def num_steps(self) -> int:
        return int(self.allocs.num_steps[self.slot])

    @property
    def num_draft(self) -> int:
        return int(self.allocs.num_draft[self.slot])


_SLOT = attrgetter("slot")


def _first_true(mask: np.ndarray) -> int | None:
    """The index of the first True of a 1-D bool array, or None: a batch check's first bad
    request (argmax: cheaper than nonzero or any for the small arrays of a step)."""
    if mask.size:
        i = int(mask.argmax())
        if mask[i]:
            return i
    return None


@dataclass
class CacheStats:
    """Counters since construction. Hit rate = prefix_hit_tokens / prefix_query_tokens."""

    total_pages: int
    used_pages: int
    free_pages: int
    cached_pages: int
    prefix_query_tokens: int
    prefix_hit_tokens: int
    evictions: int
    deduplicated_pages: int = 0  # pages freed by `step` for a copy already cached

    @property
    def hit_rate(self) -> float:
        return (
            self.prefix_hit_tokens / self.prefix_query_tokens if self.prefix_query_tokens else 0.0
        )


_TOKEN_RANGE = "ints in [0, 2**63)"
#: The place of a sampled token whose value is not known yet (`step_deferred`,
#: `fill_deferred`); `step` and `claim` refuse it as they refuse every negative id.
DEFERRED = -(2**63)
_INT_DTYPES = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)


def _as_tokens(name: str, tokens: object) -> list[int]:
    """`tokens` as a list of Python ints in [0, 2**63) (token ids are hashed as int64), or
    `InvalidArgumentError` naming `name`. Accepts a list/tuple of ints (numpy ints included),
    a 1-D integer numpy array or a 1-D integer CPU tensor (a CUDA tensor syncs: avoid)."""
    tt = type(tokens)
    if tt is list or tt is tuple:
        # Fast path: the hot decode loop passes lists of Python ints (the set of the elements'
        # types: one pass at C speed).
        if set(map(type, tokens)) <= {int}:
            if tokens and (min(tokens) < 0 or max(tokens) > INT64_MAX):
                bad = next(t for t in tokens if not 0 <= t <= INT64_MAX)
                raise InvalidArgumentError(f"{name}: expected {_TOKEN_RANGE}, got token {bad}")
            return list(tokens)
    elif isinstance(tokens, torch.Tensor):
        check(
            tokens.ndim == 1 and tokens.dtype in _INT_DTYPES and tokens.device.type != "meta",
            name,
            "a 1-D integer sequence",
            f"tensor {tuple(tokens.shape)} {tokens.dtype} on {tokens.device}",
        )
        tokens = tokens.tolist()
    elif isinstance(tokens, np.ndarray):
        check(
            tokens.ndim == 1 and np.issubdtype(tokens.dtype, np.integer),
            name,
            "a 1-D integer sequence",
            f"array {tokens.shape} {tokens.dtype}",
        )
        tokens = tokens.tolist()
    else:
        check(
            isinstance(tokens, Sequence) and not isinstance(tokens, (str, bytes)),
            name,
            "a sequence of ints",
            type(tokens).__name__,
        )
    out = list(tokens)
    for t in out:
        if not (isinstance(t, (int, np.integer)) and not isinstance(t, bool)):
            raise InvalidArgumentError(f"{name}: expected {_TOKEN_RANGE}, got {t!r}")
        if not 0 <= t <= INT64_MAX:
            raise InvalidArgumentError(f"{name}: expected {_TOKEN_RANGE}, got token {t}")
    return [int(t) for t in out]


def _as_ids(name: str, ids: object) -> Sequence:
    """`ids` as a sequence of request ids; a str or bytes is one id, never a sequence of them."""
    if type(ids) is list or type(ids) is tuple:
        return ids
    check(
        isinstance(ids, Sequence) and not isinstance(ids, (str, bytes, bytearray)),
        name,
        "a sequence (list or tuple) of request ids",
        repr(ids)[:80],
    )
    return ids


def _encode_salt(salt: object) -> bytes | None:
    check(
        salt is None or isinstance(salt, (str, bytes)),
        "salt",
        "str, bytes or None",
        type(salt).__name__,
    )
    if isinstance(salt, str):
        # Any str has an encoding: lone surrogates pass through rather than raise.
        return salt.encode("utf-8", "surrogatepass")
    return salt


class PagedKVCacheManager:
    """Host-side manager of a paged KV cache over one or more devices.

    params: the cache's `KVCacheParams`.
    total_num_pages / memory_bytes: pool size per data-parallel replica (exactly one of them;
      memory_bytes is a per-device budget).
    max_batch_size: most requests claimed at once.
    max_seq_len: most tokens a request may hold, lookahead/draft slots included.
    """

    def __init__(
        self,
        params: KVCacheParams,
        total_num_pages: int | None = None,
        *,
        memory_bytes: int | None = None,
        max_batch_size: int = 256,
        max_seq_len: int | None = None,
    ) -> None:
        check(isinstance(params, KVCacheParams), "params", "a KVCacheParams", type(params))
        max_batch_size = check_int("max_batch_size", max_batch_size, 1, INT32_MAX)
        if max_seq_len is not None:
            max_seq_len = check_int("max_seq_len", max_seq_len, 1, INT32_MAX)
        self.params = params
        self._buffers: list[DeviceBuffers] = [
            allocate_buffers(params, total_num_pages, memory_bytes=memory_bytes, device=d)
            for d in params.devices
        ]
        self.total_num_pages = self._buffers[0].kv_blocks.shape[0]
        self.max_batch_size = max_batch_size
        if max_seq_len is None:  # cache lengths are int32
            max_seq_len = min(self.total_num_pages * params.page_size, INT32_MAX)
        self.max_seq_len = max_seq_len
        self.max_pages_per_request = math.ceil(self.max_seq_len / params.page_size)
        dp = params.data_parallel_degree
        self.pools = [BlockPool(self.total_num_pages) for _ in range(dp)]
        # Slot tables, vectorised so that runtime_inputs gathers rows instead of looping.
        self._table = np.full(
            (self.max_batch_size, self.max_pages_per_request), self.total_num_pages, np.int32
        )
        self._num_pages = np.zeros(self.max_batch_size, np.int32)
        self._cache_len = np.zeros(self.max_batch_size, np.int32)
        self._allocs = _Allocations(self.max_batch_size)
        self._free_slots = list(range(self.max_batch_size - 1, -1, -1))
        self._requests: dict[Hashable, _Request] = {}
        self._prefix_query_tokens = 0
        self._prefix_hit_tokens = 0
        self._deduplicated_pages = 0
        self._sms = num_sms(params.devices[0])
        self._hbm3e = fast_hbm(params.devices[0])
        rope_fp8 = params.quant_format == "mla_rope_aware"
        self._staging: dict[torch.device, StagingRing] = {}  # `runtime_inputs_staged`'s
        self._mla_tile = mla_tile(params.num_q_heads, params.head_dim, rope_fp8, params.devices[0])

    # Introspection ---------------------------------------------------------------------
    @property
    def buffers(self) -> list[DeviceBuffers]:
        """One `DeviceBuffers` per device of params.devices."""
        return self._buffers

    # Each of these raises UnknownRequestError for an id that is not claimed (or unhashable).
    def cache_length(self, rid: Hashable) -> int:
        """Tokens of request `rid` whose K/V is cached (committed by `step` or a prefix hit)."""
        return int(self._cache_len[self._get(rid).slot])

    def pages(self, rid: Hashable) -> list[int]:
        """Physical page ids of request `rid`, in order (its lookup-table row)."""
        r = self._get(rid)
        return self._table[r.slot, : self._num_pages[r.slot]].tolist()

    def new_token_rows(
        self, request_ids: Sequence[Hashable], num_new_tokens: Sequence[int]
    ) -> tuple[np.ndarray, np.ndarray]:
        """(cache lengths [b] int64, rows [sum(num_new_tokens)] int64) of a step's requests:
        each request's cache length cl and the cache rows `page * page_size + pos % page_size`
        of its positions cl .. cl + n - 1, request after request (what `store_kv` writes; no
        state changes). Raises UnknownRequestError for an unclaimed id and InvalidArgumentError
        (naming the request) where its pages do not cover cl + n (`alloc` first)."""
        ps = self.params.page_size
        try:
            reqs = list(map(self._requests.__getitem__, request_ids))
        except (KeyError, TypeError):
            reqs = [self._get(r) for r in request_ids]  # raises, naming the id
        slots = np.fromiter(map(_SLOT, reqs), np.int64, len(reqs))
        cl = self._cache_len[slots].astype(np.int64)
        n = np.asarray(num_new_tokens, dtype=np.int64).reshape(-1)
        have = self._num_pages[slots].astype(np.int64) * ps
        b = _first_true(have < cl + n)
        if b is not None:
            raise InvalidArgumentError(
                f"requests[{b}]: request {request_ids[b]!r} has pages for {int(have[b])} tokens, "
                f"the step needs {int(cl[b] + n[b])}; call manager.alloc(request_id, {int(n[b])}) "
                "first"
            )
        starts = np.cumsum(n) - n
        pos = np.arange(int(n.sum()), dtype=np.int64) + np.repeat(cl - starts, n)
        pages = self._table[np.repeat(slots, n), pos // ps].astype(np.int64)
        return cl, pages * ps + pos % ps

    def tokens(self, rid: Hashable) -> list[int]:
        """Every token of request `rid` known so far (prompt, then committed samples)."""
        return list(self._get(rid).tokens)

    def replica_of(self, rid: Hashable) -> int:
        """The data-parallel replica that holds request `rid`."""
        return self._get(rid).replica

    def __contains__(self, rid: Hashable) -> bool:
        """Whether `rid` is claimed (False for an unhashable value, which never can be)."""
        try:
            return rid in self._requests
        except TypeError:
            return False

    @property
    def request_ids(self) -> list[Hashable]:
        return list(self._requests)

    def stats(self) -> CacheStats:
        return CacheStats(
            total_pages=self.total_num_pages * len(self.pools),
            used_pages=sum(p.num_used for p in self.pools),
            free_pages=sum(p.num_free for p in self.pools),
            cached_pages=sum(p.num_cached for p in self.pools),
            prefix_query_tokens=self._prefix_query_tokens,
            prefix_hit_tokens=self._prefix_hit_tokens,
            evictions=sum(p.num_evictions for p in self.pools),
            deduplicated_pages=self._deduplicated_pages,
        )

    def snapshot(self) -> tuple:
        """Every piece of manager state, for equality checks (tests of failed calls)."""
        reqs = tuple(
            (
                repr(r.rid),
                r.replica,
                r.slot,
                tuple(r.tokens),
                r.salt,
                tuple(r.hashes),
                r.pending,
                r.num_steps,
                r.num_draft,
                int(self._allocs.num_tokens[r.slot]),
                r.prefix_hit,
            )
            for r in self._requests.values()
        )
        return (
            reqs,
            self._table.tobytes(),
            self._num_pages.tobytes(),
            self._cache_len.tobytes(),
            tuple(self._free_slots),
            self._prefix_query_tokens,
            self._prefix_hit_tokens,
            self._deduplicated_pages,
            tuple(p.snapshot() for p in self.pools),
        )

    # Lifecycle -------------------------------------------------------------------------
    def _get(self, rid: Hashable, name: str = "request_id") -> _Request:
        try:
            return self._requests[rid]
        except (KeyError, TypeError):
            raise UnknownRequestError(f"{name}: {rid!r} is not a claimed request id") from None

    def _get_all(self, request_ids: object) -> tuple[list[_Request], np.ndarray]:
        """The distinct claimed requests of `request_ids` (a list/tuple, not a str), and
        their slots ([b] int64)."""
        ids = _as_ids("request_ids", request_ids)
        try:
            reqs = list(map(self._requests.__getitem__, ids))
        except (KeyError, TypeError):
            for i, rid in enumerate(ids):
                self._get(rid, f"request_ids[{i}]")
            raise
        slots = np.fromiter(map(_SLOT, reqs), np.int64, len(reqs))
        if len(slots) > 1 and np.bincount(slots).max() > 1:  # (each request has its own slot)
            check(False, "request_ids", "no duplicates", list(ids))
        return reqs, slots

    def _prefix_hashes(self, tokens: list[int], salt: bytes | None) -> list[bytes]:
        """Hash chain of the full pages of tokens[:-1] (the last prompt token never hits)."""
        ps = self.params.page_size
        out, parent = [], None
        for k in range((len(tokens) - 1) // ps):
            parent = _page_hash(parent, tokens[k * ps : (k + 1) * ps], salt)
            out.append(parent)
        return out

    def claim(
        self,
        request_id: Hashable,
        prompt_tokens: Sequence[int],
        *,
        salt: str | bytes | None = None,
        replica: int | None = None,
    ) -> int:
        """Register a request and match its prompt against the prefix cache.

        Returns the number of prompt tokens already cached (a multiple of page_size, always
        < len(prompt_tokens)).

        request_id: any hashable id not claimed yet (float NaN, never equal to itself, is
          rejected).
        prompt_tokens: a non-empty sequence of token ids, ints in [0, 2**63), at most
          max_seq_len of them (see `step` for the accepted sequence types).
        salt: None, or a str (hashed as its UTF-8 bytes) or bytes that isolates a tenant: a
          request with a salt sees only pages cached under that same salt, a request without
          one only pages cached without one. Every salt isolates, "" and b"" included.
        replica: an int in [0, data_parallel_degree) pinning a data-parallel replica
          (default: the least loaded).

        Raises DuplicateRequestError, MaxLengthExceededError, CapacityError (no free batch
        slot) or InvalidArgumentError naming the argument, with no state change.
        """
        try:
            hash(request_id)
        except TypeError:
            raise InvalidArgumentError(
                f"request_id: expected a hashable id, got {type(request_id).__name__}"
            ) from None
        check(
            not (isinstance(request_id, float) and request_id != request_id),
            "request_id",
            "an id equal to itself",
            request_id,
        )
        if request_id in self._requests:
            raise DuplicateRequestError(f"request_id: {request_id!r} is already claimed")
        tokens = _as_tokens("prompt_tokens", prompt_tokens)
        check(len(tokens) >= 1, "prompt_tokens", "at least one token", len(tokens))
        if len(tokens) > self.max_seq_len:
            raise MaxLengthExceededError(
                f"prompt_tokens: {len(tokens)} tokens exceed max_seq_len={self.max_seq_len}"
            )
        salt = _encode_salt(salt)
        dp = len(self.pools)
        if replica is None:
            # Fewest active requests first, then most free pages, then lowest index.
            load = [0] * dp
            for r in self._requests.values():
                load[r.replica] += 1
            replica = min(range(dp), key=lambda i: (load[i], -self.pools[i].num_free, i))
        else:
            replica = check_int("replica", replica, 0, dp - 1)
        if not self._free_slots:
            raise CapacityError(f"max_batch_size={self.max_batch_size} requests already claimed")
        pool = self.pools[replica]
        hit_pages: list[int] = []
        hashes: list[bytes] = []
        if self.params.enable_prefix_caching:
            hashes = self._prefix_hashes(tokens, salt)
            hit_pages = pool.lookup(hashes)
        # -- validated; mutate --
        if self.params.enable_prefix_caching:
            pool.acquire(hit_pages)
            self._prefix_query_tokens += len(tokens)
        slot = self._free_slots.pop()
        n = len(hit_pages)
        self._table[slot, :n] = hit_pages
        self._num_pages[slot] = n
        self._cache_len[slot] = n * self.params.page_size
        self._allocs.reset(slot, len(tokens))
        hit = n * self.params.page_size
        self._prefix_hit_tokens += hit
        self._requests[request_id] = _Request(
            request_id, replica, slot, tokens, salt, self._allocs, hashes[:n], prefix_hit=hit
        )
        return hit

    def alloc(
        self,
        request_id: Hashable,
        num_new_tokens: int,
        num_steps: int = 1,
        *,
        num_draft_tokens: int = 0,
    ) -> None:
        """Reserve pages for this step's new tokens, `num_steps - 1` more decode steps and
        `num_draft_tokens` speculative slots.

        num_new_tokens: an int in [1, tokens known but not cached]; num_steps: an int >= 1;
        num_draft_tokens: an int >= 0. Raises UnknownRequestError, InvalidArgumentError or
        MaxLengthExceededError naming the argument, or OutOfPagesError, with no state change.
        """
        r = self._get(request_id)
        if not (type(num_new_tokens) is int and num_steps == 1 and num_draft_tokens == 0
                and type(num_steps) is int and type(num_draft_tokens) is int):  # fmt: skip
            # (the engine's one-step calls skip the general checks; the bounds follow)
            num_new_tokens = check_int("num_new_tokens", num_new_tokens, 1)
            num_steps = check_int("num_steps", num_steps, 1)
            num_draft_tokens = check_int("num_draft_tokens", num_draft_tokens, 0)
        n, steps, drafts = num_new_tokens, num_steps, num_draft_tokens
        if n < 1:
            check_int("num_new_tokens", n, 1)  # raises, naming it
        cl = int(self._cache_len[r.slot])
        known = len(r.tokens) - cl
        check(
            n <= known,
            "num_new_tokens",
            f"<= {known} (tokens known but not cached for request {request_id!r})",
            n,
        )
        total = cl + n + steps - 1 + drafts
        if total > self.max_seq_len:
            raise MaxLengthExceededError(
                f"num_new_tokens/num_steps/num_draft_tokens: request {request_id!r} would hold "
                f"{total} tokens, more than max_seq_len={self.max_seq_len}"
            )
        have = int(self._num_pages[r.slot])
        need = math.ceil(total / self.params.page_size) - have
        if need > 0:
            new = self.pools[r.replica].take(need)  # raises before any change
            self._table[r.slot, have : have + need] = new
            self._num_pages[r.slot] = have + need
        a = self._allocs
        a.pending[r.slot], a.num_steps[r.slot], a.num_draft[r.slot] = n, steps, drafts

    def alloc_decodes(self, request_ids: Sequence[Hashable]) -> None:
        """`alloc(rid, 1)` for every request of `request_ids` (a list/tuple of distinct
        claimed ids, each with a token known but not cached: a decode), at once: the page
        need of all of them is computed with array ops, and the pages taken only if every
        replica's pool covers its requests' need. Raises UnknownRequestError,
        InvalidArgumentError, MaxLengthExceededError (naming the request) or OutOfPagesError
        with no state change; the same end state as the calls one by one otherwise."""
        reqs, slots = self._get_all(request_ids)
        if not reqs:
            return
        cl = self._cache_len[slots].astype(np.int64)
        known = self._allocs.num_tokens[slots] - cl
        i = _first_true(known < 1)
        if i is not None:
            raise InvalidArgumentError(
                f"request_ids: {reqs[i].rid!r} has no token known but not cached (not a decode)"
            )
        i = _first_true(cl + 1 > self.max_seq_len)
        if i is not None:
            raise MaxLengthExceededError(
                f"request_ids: request {reqs[i].rid!r} would hold {int(cl[i]) + 1} tokens, more "
                f"than max_seq_len={self.max_seq_len}"
            )
        ps = self.params.page_size
        have = self._num_pages[slots].astype(np.int64)
        need = np.maximum(-(-(cl + 1) // ps) - have, 0)
        grow = np.flatnonzero(need)
        by_pool: dict[int, list[int]] = {}  # replica -> the requests (indices) that grow
        for i in grow.tolist():
            by_pool.setdefault(reqs[i].replica, []).append(i)
        for rep, mine in by_pool.items():
            n, pool = int(need[mine].sum()), self.pools[rep]
            if n > pool.num_free:
                raise OutOfPagesError(
                    f"alloc_decodes: need {n} pages, only {pool.num_free} free of "
                    f"{pool.total_num_pages}"
                )
        # -- validated; mutate --
        for rep, mine in by_pool.items():
            # One take for the replica: the pages that takes one request at a time would give
            # (in order), placed with array ops.
            k = need[mine]
            new = self.pools[rep].take(int(k.sum()))
            first = np.repeat(np.cumsum(k) - k, k)  # each new page's request's first index
            cols = np.repeat(have[mine], k) + np.arange(len(new)) - first
            self._table[np.repeat(slots[mine], k), cols] = new
            self._num_pages[slots[mine]] = have[mine] + k
        a = self._allocs
        a.pending[slots], a.num_steps[slots], a.num_draft[slots] = 1, 1, 0

    def runtime_inputs(
        self,
        request_ids: Sequence[Hashable],
        num_steps: int = 1,
        *,
        padded_cols: int | None = None,
    ) -> list[KVCacheInputsPerDevice]:
        """Inputs for one step of a batch, one `KVCacheInputsPerDevice` per device.

        The batch is split by data-parallel replica (keeping order); each device of a replica
        gets that replica's requests. `padded_cols` fixes the lookup-table width (for CUDA
        graphs); by default it is the widest request of the batch.

        request_ids: a list/tuple (not a str) of distinct claimed, allocated request ids.
        num_steps: an int in [1, the num_steps each request was allocated for].
        padded_cols: None or an int in [widest request's pages, max pages per request].
        Raises UnknownRequestError or InvalidArgumentError naming the argument; reads only.
        """
        return self._runtime_inputs(request_ids, (), num_steps, padded_cols, False)[0]

    def runtime_inputs_staged(
        self,
        request_ids: Sequence[Hashable],
        arrays: Sequence[np.ndarray],
        num_steps: int = 1,
        *,
        padded_cols: int | None = None,
    ) -> tuple[list[KVCacheInputsPerDevice], list[torch.Tensor]]:
        """`runtime_inputs`, and the caller's host `arrays` (int32 / int64 / float32 numpy) on
        the first device, copied in the same host-to-device copy as that device's inputs
        (an engine step's index arrays and the cache inputs in one copy). Returns (the inputs,
        the arrays as tensors in order). Same checks as runtime_inputs.

        On CUDA the copy goes through the manager's persistent staging (`buffers.StagingRing`,
        two slots per device: no pinning or allocation a step): the device tensors returned
        are views of a staging buffer that the second later call overwrites (in stream order),
        so they are for the work queued before then (a step's kernels); `runtime_inputs`
        returns tensors of their own. Elsewhere as `buffers.hosts_to_device`."""
        return self._runtime_inputs(request_ids, arrays, num_steps, padded_cols, True)

    def host_runtime_inputs(
        self,
        request_ids: Sequence[Hashable],
        num_steps: int = 1,
        *,
        padded_cols: int | None = None,
    ) -> dict[str, np.ndarray]:
        """`runtime_inputs`' arrays on the host, for a cache on one device: numpy arrays by
        field name, "cache_lengths" [b] int32, "lookup_table" [b, padded_cols] int32 (its
        unused entries the sentinel), "max_lengths" [num_steps, 2] int32 and, where the params
        enable them, "attention_dispatch_metadata" int64 (and the draft, MLA fields
        `runtime_inputs` has). For a caller that places them itself (the engine's decode
        graphs stage them into their own buffers). The same arguments and checks as
        `runtime_inputs`; a cache on more than one device raises InvalidArgumentError."""
        check(
            len(self.params.devices) == 1,
            "host_runtime_inputs",
            "a cache on one device",
            f"{len(self.params.devices)} devices",
        )
        _, slots, steps, padded_cols = self._checked_batch(request_ids, num_steps, padded_cols)
        return self._host_inputs(slots, steps, padded_cols)

    def _checked_batch(
        self, request_ids: Sequence[Hashable], num_steps: int, padded_cols: int | None
    ) -> tuple[list, np.ndarray, int, int | None]:
        """(the requests, their slots, num_steps, padded_cols) after `runtime_inputs`' checks."""
        steps = check_int("num_steps", num_steps, 1)
        reqs, slots = self._get_all(request_ids)
        idle = self._allocs.pending[slots] == 0
        i = _first_true(idle | (steps > self._allocs.num_steps[slots]))
        if i is not None:
            r = reqs[i]
            if idle[i]:
                raise InvalidArgumentError(
                    f"request_ids[{i}]: {r.rid!r} has no allocation; "
                    "call alloc(request_id, num_new_tokens, num_steps) first"
                )
            raise InvalidArgumentError(
                f"num_steps: {steps} is more than request_ids[{i}]={r.rid!r} was allocated "
                f"for ({r.num_steps}); call alloc(request_id, num_new_tokens, num_steps)"
            )
        if padded_cols is not None:
            need = int(self._num_pages[slots].max()) if len(reqs) else 0
            padded_cols = check_int("padded_cols", padded_cols, need, self.max_pages_per_request)
        return reqs, slots, steps, padded_cols

    def _runtime_inputs(
        self,
        request_ids: Sequence[Hashable],
        arrays: Sequence[np.ndarray],
        num_steps: int,
        padded_cols: int | None,
        ring: bool,
    ) -> tuple[list[KVCacheInputsPerDevice], list[torch.Tensor]]:
        reqs, slots, steps, padded_cols = self._checked_batch(request_ids, num_steps, padded_cols)
        arrays = list(arrays)
        p = self.params
        out: list[KVCacheInputsPerDevice] = []
        staged: list[torch.Tensor] = []
        if len(self.pools) > 1:
            replicas = np.fromiter((r.replica for r in reqs), np.int64, len(reqs))
        for replica in range(len(self.pools)):
            mine = slots if len(self.pools) == 1 else slots[replicas == replica]
            host = self._host_inputs(mine, steps, padded_cols)
            for dev_i, dev in enumerate(p.replica_devices(replica)):
                buf = self._buffers[replica * p.tp_degree + dev_i]
                inputs, staged_here = self._to_device(
                    host, buf, dev, arrays if not out else [], ring
                )
                out.append(inputs)
                staged = staged or staged_here
        return out, staged

    def _host_inputs(self, slots: np.ndarray, steps: int, padded_cols: int | None) -> dict:
        """The host arrays of the requests in `slots` ([b] int64, batch order)."""
        p = self.params
        b = len(slots)
        pending = self._allocs.pending[slots]
        drafts = self._allocs.num_draft[slots]
        cache_len = self._cache_len[slots]
        if padded_cols is None:
            padded_cols = int(self._num_pages[slots].max()) if b else 1
        lut = self._table[slots, :padded_cols]
        max_prompt = int(pending.max()) if b else 0
        max_cache = int(cache_len.max()) if b else 0
        # step 0: (max new tokens, max cached); step i > 0: one token over a cache grown by the
        # first step's tokens and i - 1 decode tokens.
        grown = int((cache_len + pending).max()) if b else 0
        max_lengths = np.empty((steps, 2), np.int32)
        max_lengths[0] = (max_prompt, max_cache)
        for i in range(1, steps):
            max_lengths[i] = (1, grown + i - 1)
        host = {
            "cache_lengths": cache_len,
            "lookup_table": lut,
            "max_lengths": max_lengths,
        }
        if p.enable_dispatch_metadata:
            valid = grown
            if p.is_mla:
                parts = mla_num_partitions(
                    b, p.num_q_heads, max_prompt, valid, self._sms, *self._mla_tile
                )
                host["attention_dispatch_metadata"] = np.array([b, max_prompt, parts], np.int64)
                host["mla_num_partitions"] = np.array([parts], np.int64)
            else:
                heads = p.n_kv_heads_per_device
                kv_bytes = p.storage_dtype.itemsize
                parts = mha_num_partitions(
                    b, heads, max_prompt, valid, self._sms, kv_bytes, self._hbm3e
                )
                host["attention_dispatch_metadata"] = np.array(
                    [b, max_prompt, parts, valid], np.int64
                )
            if p.enable_speculative:
                dq = 1 + (int(drafts.max()) if b else 0)
                if p.is_mla:
                    dparts = mla_num_partitions(
                        b, p.num_q_heads, dq, valid + dq, self._sms, *self._mla_tile
                    )
                    host["draft_attention_dispatch_metadata"] = np.array([b, dq, dparts], np.int64)
                    host["draft_mla_num_partitions"] = np.array([dparts], np.int64)
                else:
                    dparts = mha_num_partitions(
                        b, heads, dq, valid + dq, self._sms, kv_bytes, self._hbm3e
                    )
                    host["draft_attention_dispatch_metadata"] = np.array(
                        [b, dq, dparts, valid + dq], np.int64
                    )
        return host

    def _to_device(
        self,
        host: dict,
        buf: DeviceBuffers,
        dev: torch.device,
        arrays: list[np.ndarray],
        ring: bool,
    ) -> tuple[KVCacheInputsPerDevice, list[torch.Tensor]]:
        """The inputs of one device, their device arrays and `arrays` in one copy (through the
        device's `StagingRing` with `ring` on CUDA)."""

        def hs(a: np.ndarray | None) -> torch.Tensor | None:
            return None if a is None else torch.from_numpy(np.ascontiguousarray(a))

        names = ["cache_lengths", "lookup_table"] + [
            n for n in ("attention_dispatch_metadata", "draft_attention_dispatch_metadata")
            if host.get(n) is not None
        ]  # fmt: skip
        packed = [host[n] for n in names] + arrays
        if ring and dev.type == "cuda":
            stager = self._staging.get(dev)
            if stager is None:
                stager = self._staging[dev] = StagingRing(dev)
            moved = stager.stage(packed)
        else:
            moved = hosts_to_device(packed, dev)
        on_dev = dict(zip(names, moved))
        inputs = KVCacheInputsPerDevice(
            kv_blocks=buf.kv_blocks,
            cache_lengths=on_dev["cache_lengths"],
            lookup_table=on_dev["lookup_table"],
            max_lengths=hs(host["max_lengths"]),
            kv_scales=buf.kv_scales,
            attention_dispatch_metadata=on_dev.get("attention_dispatch_metadata"),
            draft_attention_dispatch_metadata=on_dev.get("draft_attention_dispatch_metadata"),
            mla_num_partitions=hs(host.get("mla_num_partitions")),
            draft_mla_num_partitions=hs(host.get("draft_mla_num_partitions")),
        )
        return inputs, moved[len(names) :]

    def step(
        self, request_ids: Sequence[Hashable], new_tokens: Sequence[Sequence[int]] | None = None
    ) -> None:
        """Commit this step's K/V. new_tokens[i]: the tokens sampled for request i (empty for
        a prompt chunk that is not the last one). Full pages enter the prefix cache.

        request_ids: a list/tuple (not a str) of distinct claimed, allocated request ids.
        new_tokens: None (nothing sampled) or a sequence (not a str) of one token sequence per
          request: a list/tuple of ints, a 1-D integer numpy array or CPU tensor, each id in
          [0, 2**63); at most num_steps + num_draft_tokens of them, none for a prompt chunk
          that does not finish the prompt.

        A newly full page whose hash is already cached under another page (another request
        computed the same prefix first, possibly in this very step) is replaced by that page in
        the request's table, and the duplicate is freed.

        Atomic: every request's arguments are checked and every new page hash computed before
        anything is committed, so a bad value for any request (UnknownRequestError or
        InvalidArgumentError naming it, e.g. "new_tokens['h']") leaves all requests as they were.
        """
        self._commit(request_ids, new_tokens)

    def step_deferred(self, request_ids: Sequence[Hashable], sampling: Sequence[bool]) -> None:
        """`step` with each sampled token deferred: sampling[i] says whether request i sampled
        one (a list/tuple of bools, one per request); its value comes later, through
        `fill_deferred` (module docstring). The same checks and atomicity as `step`."""
        ids = _as_ids("request_ids", request_ids)
        check(
            isinstance(sampling, (list, tuple))
            and len(sampling) == len(ids)
            and set(map(type, sampling)) <= {bool},
            "sampling",
            f"a list of {len(ids)} bools",
            Lazy(lambda: repr(sampling)[:80]),
        )
        reqs, slots = self._get_all(request_ids)
        a = self._allocs
        pending = a.pending[slots]
        self._check_allocated(reqs, pending)
        cl = self._cache_len[slots]
        new_len = cl + pending
        sampled = np.fromiter(sampling, bool, len(reqs))
        # A sample comes only with a chunk that completes the known tokens.
        first_bad = _first_true(sampled & (a.num_tokens[slots] > new_len))
        filled: list[tuple[_Request, list[bytes]]] = []
        if self.params.enable_prefix_caching:
            ps = self.params.page_size
            # The requests whose pages this step fills (len(hashes) == cache length // ps),
            # checked and hashed in batch order, up to the first bad request.
            fills = np.flatnonzero(new_len // ps > cl // ps)
            for i, n in zip(fills.tolist(), new_len[fills].tolist()):
                if first_bad is not None and i >= first_bad:
                    break
                r = reqs[i]
                nt = [DEFERRED] if sampling[i] else []
                filled.append((r, self._new_page_hashes(r, n, nt)))
        if first_bad is not None:
            r = reqs[first_bad]
            raise InvalidArgumentError(
                f"new_tokens[{r.rid!r}]: expected empty while the prompt is not fully "
                f"cached, got {[DEFERRED]}"
            )
        # -- validated; mutate (nothing below can raise) --
        for r in compress(reqs, sampling):
            r.tokens.append(DEFERRED)
        a.num_tokens[slots] += sampled
        self._cache_len[slots] = new_len
        a.pending[slots] = 0
        for r, hashes in filled:
            self._register_pages(r, hashes)

    @staticmethod
    def _check_allocated(reqs: list[_Request], pending: np.ndarray) -> None:
        """Raise, naming the first, unless every request has an allocation (`pending`: the
        requests' pending tokens)."""
        i = _first_true(pending == 0)
        if i is not None:
            raise InvalidArgumentError(
                f"request_ids[{i}]: {reqs[i].rid!r} has no allocation to commit; call alloc first"
            )

    def _new_page_hashes(self, r: _Request, new_len: int, nt: list[int]) -> list[bytes]:
        """The hashes of the pages that committing `nt` (to a cache length of `new_len`)
        fills; raises InvalidArgumentError for a page with a deferred token. No change."""
        ps = self.params.page_size
        hashes: list[bytes] = []
        start = len(r.hashes) * ps
        toks = r.tokens[start:] + nt
        parent = r.hashes[-1] if r.hashes else None
        for k in range(new_len // ps - len(r.hashes)):
            page = toks[k * ps : (k + 1) * ps]
            if DEFERRED in page:
                raise InvalidArgumentError(
                    f"request_ids: {r.rid!r} fills page {len(r.hashes) + k} with a "
                    "deferred token; call fill_deferred first"
                )
            parent = _page_hash(parent, page, r.salt)
            hashes.append(parent)
        return hashes

    def _register_pages(self, r: _Request, hashes: list[bytes]) -> None:
        """Enter the pages of `hashes` (from `_new_page_hashes`) into the prefix cache."""
        pool = self.pools[r.replica]
        k0 = len(r.hashes)
        r.hashes.extend(hashes)
        for k, h in enumerate(hashes, k0):
            page = int(self._table[r.slot, k])
            if pool.register(page, h):
                continue
            # The same prefix page is cached already (computed by another request
            # meanwhile, or earlier in this loop): share it, free the duplicate.
            cached = pool.hash_to_page.get(h)
            if cached is not None and cached != page:
                pool.acquire([cached])
                pool.release([page])
                self._table[r.slot, k] = cached
                self._deduplicated_pages += 1

    def _commit(self, request_ids: Sequence[Hashable], new_tokens: object) -> None:
        reqs, slots = self._get_all(request_ids)
        a = self._allocs
        self._check_allocated(reqs, a.pending[slots])
        if new_tokens is None:
            new_tokens = [[]] * len(reqs)
        check(
            isinstance(new_tokens, Sequence)
            and not isinstance(new_tokens, (str, bytes))
            and len(new_tokens) == len(reqs),
            "new_tokens",
            f"a sequence of {len(reqs)} token lists",
            Lazy(lambda: repr(new_tokens)[:80]),
        )
        plan = []
        ps = self.params.page_size
        caching = self.params.enable_prefix_caching
        allocs = zip(
            self._cache_len[slots].tolist(),
            a.pending[slots].tolist(),
            a.num_steps[slots].tolist(),
            a.num_draft[slots].tolist(),
        )
        for r, nt, (cl, pending, steps, drafts) in zip(reqs, new_tokens, allocs):
            if not (
                type(nt) is list
                and (not nt or (len(nt) == 1 and type(nt[0]) is int and 0 <= nt[0] <= INT64_MAX))
            ):  # (the decode loop's one sampled token, or none, skips the general check)
                nt = _as_tokens(f"new_tokens[{r.rid!r}]", nt)
            if nt and len(r.tokens) > cl + pending:
                raise InvalidArgumentError(
                    f"new_tokens[{r.rid!r}]: expected empty while the prompt is not fully "
                    f"cached, got {nt}"
                )
            extra = len(nt) - 1 if nt else 0
            if extra > steps - 1 + drafts:
                raise InvalidArgumentError(
                    f"new_tokens[{r.rid!r}]: expected at most {steps + drafts} "
                    f"tokens for this allocation, got {len(nt)}"
                )
            new_len = cl + pending + extra
            # Hash the pages this step fills now, before any mutation.
            hashes: list[bytes] = []
            if caching and new_len // ps > len(r.hashes):
                hashes = self._new_page_hashes(r, new_len, nt)
            plan.append((r, nt, new_len, hashes))
        # -- validated; mutate (nothing below can raise) --
        for r, nt, new_len, hashes in plan:
            r.tokens.extend(nt)
            a.num_tokens[r.slot] += len(nt)
            self._cache_len[r.slot] = new_len
            if hashes:
                self._register_pages(r, hashes)
        a.pending[slots] = 0

    def fill_deferred(self, request_ids: Sequence[Hashable], tokens: Sequence[int]) -> None:
        """Give the value of each request's deferred token (the last one it committed with
        `step_deferred`). request_ids: a list/tuple of claimed ids, each ending in a
        deferred token; tokens: one int in [0, 2**63) each. Raises UnknownRequestError or
        InvalidArgumentError naming the request, with no change."""
        reqs, _ = self._get_all(request_ids)
        tokens = _as_tokens("tokens", tokens)
        check(len(tokens) == len(reqs), "tokens", f"{len(reqs)} token ids", len(tokens))
        for r in reqs:
            if not r.tokens or r.tokens[-1] != DEFERRED:
                raise InvalidArgumentError(f"request_ids: {r.rid!r} has no deferred token")
        for r, t in zip(reqs, tokens):
            r.tokens[-1] = t

    def release(self, request_id: Hashable) -> None:
        """Drop a request: its pages lose an owner (tail first) and its slot is freed.
        Raises UnknownRequestError (no change) for an id that is not claimed."""
        r = self._get(request_id)
        n = int(self._num_pages[r.slot])
        self.pools[r.replica].release(self._table[r.slot, :n][::-1].tolist())
        self._table[r.slot, :n] = self.total_num_pages
        self._num_pages[r.slot] = 0
        self._cache_len[r.slot] = 0
        self._allocs.reset(r.slot)
        self._free_slots.append(r.slot)
        del self._requests[r.rid]

    def evict(self, num_pages: int | None = None, replica: int | None = None) -> int:
        """Eagerly forget up to num_pages (None: all) free cached pages, LRU first, of one
        replica (an int in [0, data_parallel_degree)) or of every replica (None, in replica
        order). Returns how many. Raises InvalidArgumentError naming a bad argument."""
        if num_pages is not None:
            num_pages = check_int("num_pages", num_pages, 0, INT64_MAX)
        if replica is not None:
            replica = check_int("replica", replica, 0, len(self.pools) - 1)
        pools = self.pools if replica is None else [self.pools[replica]]
        done = 0
        for pool in pools:
            done += pool.evict(None if num_pages is None else num_pages - done)
        return done

    def reset_prefix_cache(self) -> int:
        return self.evict()


__all__ = ["DEFERRED", "PagedKVCacheManager", "CacheStats", "OutOfPagesError"]
