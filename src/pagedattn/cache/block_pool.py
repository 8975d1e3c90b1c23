"""The page pool of one data-parallel replica, with ref counts and a prefix cache.

Pages are handed out lowest id first from the never-cached free set, then by evicting free
cached pages least recently used first ("lazy" eviction: a cached page stays reusable until the
pool needs it). A cached page is a full page whose hash is registered; its hash chains over
(parent hash, page tokens, salt) with sha256 (see `page_hash`).
"""

from __future__ import annotations

import hashlib
import heapq
import struct
from collections import OrderedDict
from collections.abc import Sequence

import numpy as np

from ..errors import INT64_MAX, InvalidArgumentError, OutOfPagesError, check, check_int

_NONE = b"\x00"  # tag of an absent parent / salt
_SOME = b"\x01"  # tag of a present parent / salt
HASH_BYTES = 32  # sha256 digest size


def _page_hash(parent: bytes | None, tokens: Sequence[int], salt: bytes | None) -> bytes:
    """`page_hash` without argument checks, for callers that validated (the manager)."""
    n = len(tokens)
    msg = b"".join(
        (
            _NONE if parent is None else _SOME + parent,
            n.to_bytes(8, "little"),
            struct.pack(f"<{n}q", *tokens),  # each token as int64 LE
            _NONE if salt is None else _SOME + salt,
        )
    )
    return hashlib.sha256(msg).digest()


def page_hash(parent: bytes | None, tokens: Sequence[int], salt: bytes | None = None) -> bytes:
    """The 32-byte prefix-cache key of one full page: sha256 over the self-delimiting message

        parent_field || uint64 LE len(tokens) || each token as int64 LE || salt_field

    where parent_field is b"\\x00" for a first page (parent None) or b"\\x01" + the parent
    page's 32-byte digest, and salt_field is b"\\x00" for no salt (None) or b"\\x01" + salt.
    Every field's length is fixed or announced before its bytes, so distinct (parent, tokens,
    salt) never give the same message: in particular salt None and salt b"" differ, and no
    salt can be chosen to make a page collide with an unsalted (or differently salted) one.

    tokens: ints in [0, 2**63). salt: bytes or None (the manager encodes a str salt as UTF-8).
    Raises `InvalidArgumentError` for a parent that is not None or 32 bytes, a salt that is not
    bytes or None, or tokens that are not such ints.
    """
    check(
        parent is None or (isinstance(parent, bytes) and len(parent) == HASH_BYTES),
        "parent",
        "None or a 32-byte digest",
        repr(parent),
    )
    check(salt is None or isinstance(salt, bytes), "salt", "bytes or None", repr(salt))
    check(
        isinstance(tokens, (list, tuple))
        and all(type(t) is int for t in tokens)
        and (not tokens or (min(tokens) >= 0 and max(tokens) <= INT64_MAX)),
        "tokens",
        "a list or tuple of ints in [0, 2**63)",
        repr(tokens)[:80],
    )
    return _page_hash(parent, tokens, salt)


class BlockPool:
    """Ref-counted pages with an LRU prefix cache. All mutators either succeed or change nothing:
    bad arguments raise `InvalidArgumentError`, a short pool `OutOfPagesError`."""

    def __init__(self, total_num_pages: int) -> None:
        self.total_num_pages = check_int("total_num_pages", total_num_pages, 1)
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
        get = self.hash_to_page.get
        for h in hashes:
            try:
                p = get(h)
            except TypeError:
                raise InvalidArgumentError(f"hashes: expected digests (bytes), got {h!r}") from None
            if p is None:
                break
            out.append(p)
        return out

    # Mutators --------------------------------------------------------------------------
    # Each checks its arguments (typed `InvalidArgumentError`) before changing anything.
    def _check_pages(self, name: str, pages: object) -> list[int]:
        check(
            isinstance(pages, (list, tuple)),
            name,
            "a list or tuple of page ids",
            type(pages).__name__,
        )
        n = self.total_num_pages
        for p in pages:
            if not (type(p) is int and 0 <= p < n):
                check_int(f"{name}[...]", p, 0, n - 1)  # raises unless a numpy int in range
        return [int(p) for p in pages]

    def take(self, n: int) -> list[int]:
        """n fresh pages with ref count 1; raises OutOfPagesError (no change) if short."""
        n = check_int("n", n, 0)
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
            out.append(p)
        self.ref_counts[out] = 1
        return out

    def acquire(self, pages: Sequence[int]) -> None:
        """Add one owner to each page, pulling free cached ones out of the LRU. Each page must
        be owned already or cached (a free page that is not cached is handed out by `take`)."""
        pages = self._check_pages("pages", pages)
        for p in pages:
            check(
                self.ref_counts[p] > 0 or p in self._evictable,
                "pages",
                "owned or cached pages",
                f"page {p}, free and not cached",
            )
        for p in pages:
            if self.ref_counts[p] == 0:
                del self._evictable[p]
            self.ref_counts[p] += 1

    def release(self, pages: Sequence[int]) -> None:
        """Drop one owner of each page; at zero, cached pages become evictable (most recent
        last), others free. Release a request's pages tail first, so its deepest pages are
        evicted before their parents. A page released more times than it has owners (a double
        free) raises `InvalidArgumentError` before any change."""
        pages = self._check_pages("pages", pages)
        drops: dict[int, int] = {}
        for p in pages:
            drops[p] = drops.get(p, 0) + 1
        for p, k in drops.items():
            check(
                int(self.ref_counts[p]) >= k,
                "pages",
                "pages released at most once per owner",
                f"page {p} released {k}x with {int(self.ref_counts[p])} owner(s) (double free)",
            )
        for p in pages:
            self.ref_counts[p] -= 1
            if self.ref_counts[p] == 0:
                if p in self.page_to_hash:
                    self._evictable[p] = None
                else:
                    heapq.heappush(self._free, p)

    def register(self, page: int, h: bytes) -> bool:
        """Record a full owned page under hash h; False if h (or the page) is already cached."""
        page = check_int("page", page, 0, self.total_num_pages - 1)
        check(self.ref_counts[page] > 0, "page", "an owned page", f"free page {page}")
        check(isinstance(h, bytes) and len(h) == HASH_BYTES, "h", "a 32-byte digest", repr(h)[:80])
        if h in self.hash_to_page or page in self.page_to_hash:
            return False
        self.hash_to_page[h] = page
        self.page_to_hash[page] = h
        return True

    def evict(self, n: int | None = None) -> int:
        """Forget up to n (default all) free cached pages, LRU first. Returns how many."""
        if n is not None:
            n = check_int("n", n, 0)
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
