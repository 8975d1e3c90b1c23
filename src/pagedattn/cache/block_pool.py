"""The page pool of one data-parallel replica, with ref counts and a prefix cache.

Pages are handed out lowest id first from the never-cached free set, then by evicting free
cached pages least recently used first ("lazy" eviction: a cached page stays reusable until the
pool needs it). A cached page is a full page whose hash is registered; its hash chains over
(parent hash, page tokens, salt) with sha256 (see `page_hash`).
"""

from __future__ import annotations

import hashlib
import heapq
from collections import OrderedDict
from collections.abc import Sequence

import numpy as np

from ..errors import OutOfPagesError


def page_hash(parent: bytes | None, tokens: Sequence[int], salt: bytes | None = None) -> bytes:
    """sha256(parent || int64 little-endian tokens || salt); parent is b"" for a first page."""
    h = hashlib.sha256()
    h.update(parent or b"")
    h.update(np.asarray(tokens, dtype="<i8").tobytes())
    if salt:
        h.update(salt)
    return h.digest()


class BlockPool:
    """Ref-counted pages with an LRU prefix cache. All mutators either succeed or change nothing."""

    def __init__(self, total_num_pages: int) -> None:
        self.total_num_pages = total_num_pages
        self.ref_counts = np.zeros(total_num_pages, dtype=np.int32)
        self._free: list[int] = list(range(total_num_pages))  # heap of never-cached free pages
        self._evictable: OrderedDict[int, None] = OrderedDict()  # free cached pages, LRU first
        self.hash_to_page: dict[bytes, int] = {}
        self.page_to_hash: dict[int, bytes] = {}
        self.num_evictions = 0

    # Queries ---------------------------------------------------------------------------
    @property
    def num_free(self) -> int:
        """Pages with ref count 0 (never cached, or cached and evictable)."""
        return len(self._free) + len(self._evictable)

    @property
    def num_used(self) -> int:
        return self.total_num_pages - self.num_free

    @property
    def num_cached(self) -> int:
        return len(self.page_to_hash)

    def free_pages(self) -> set[int]:
        return set(self._free) | set(self._evictable)

    def evictable_pages(self) -> list[int]:
        """Free cached pages, least recently used first."""
        return list(self._evictable)

    def lookup(self, hashes: Sequence[bytes]) -> list[int]:
        """Pages of the longest cached prefix of `hashes` (no state change)."""
        out = []
        for h in hashes:
            p = self.hash_to_page.get(h)
            if p is None:
                break
            out.append(p)
        return out

    # Mutators --------------------------------------------------------------------------
    def take(self, n: int) -> list[int]:
        """n fresh pages with ref count 1; raises OutOfPagesError (no change) if short."""
        if n > self.num_free:
            raise OutOfPagesError(
                f"need {n} pages, only {self.num_free} free of {self.total_num_pages}"
            )
        out = []
        for _ in range(n):
            if self._free:
                p = heapq.heappop(self._free)
            else:
                p, _ = self._evictable.popitem(last=False)
                del self.hash_to_page[self.page_to_hash.pop(p)]
                self.num_evictions += 1
            self.ref_counts[p] = 1
            out.append(p)
        return out

    def acquire(self, pages: Sequence[int]) -> None:
        """Add one owner to each (cached) page, pulling free ones out of the LRU."""
        for p in pages:
            if self.ref_counts[p] == 0:
                del self._evictable[p]
            self.ref_counts[p] += 1

    def release(self, pages: Sequence[int]) -> None:
        """Drop one owner of each page; at zero, cached pages become evictable (most recent
        last), others free. Release a request's pages tail first, so its deepest pages are
        evicted before their parents."""
        for p in pages:
            assert self.ref_counts[p] > 0, f"double free of page {p}"
            self.ref_counts[p] -= 1
            if self.ref_counts[p] == 0:
                if p in self.page_to_hash:
                    self._evictable[p] = None
                else:
                    heapq.heappush(self._free, p)

    def register(self, page: int, h: bytes) -> bool:
        """Record a full owned page under hash h; False if h (or the page) is already cached."""
        if h in self.hash_to_page or page in self.page_to_hash:
            return False
        self.hash_to_page[h] = page
        self.page_to_hash[page] = h
        return True

    def evict(self, n: int | None = None) -> int:
        """Forget up to n (default all) free cached pages, LRU first. Returns how many."""
        k = len(self._evictable) if n is None else min(n, len(self._evictable))
        for _ in range(k):
            p, _ = self._evictable.popitem(last=False)
            del self.hash_to_page[self.page_to_hash.pop(p)]
            heapq.heappush(self._free, p)
            self.num_evictions += 1
        return k

    def snapshot(self) -> tuple:
        """Everything observable, for equality checks in tests."""
        return (
            self.ref_counts.tobytes(),
            tuple(sorted(self._free)),
            tuple(self._evictable),
            tuple(sorted(self.hash_to_page.items())),
            self.num_evictions,
        )
