"""PagedKVCacheManager: exact expectations, prefix caching, multi-device, failures."""

from __future__ import annotations

import hashlib
import itertools

import numpy as np
import pytest
import torch

from pagedattn import (
    CapacityError,
    DuplicateRequestError,
    InvalidArgumentError,
    KVCacheInputsPerDevice,
    KVCacheParams,
    MaxLengthExceededError,
    OutOfPagesError,
    PagedAttnError,
    PagedKVCacheManager,
    UnknownRequestError,
    gather_kv,
    store_kv,
)
from pagedattn.cache.inputs import FIELD_ORDER, OPTIONAL_FIELDS
from pagedattn.testing import ragged_offsets

BF16 = torch.bfloat16


def mgr(pages=8, page_size=4, **kw):
    extra = {k: kw.pop(k) for k in ("max_batch_size", "max_seq_len") if k in kw}
    p = KVCacheParams(BF16, 1, 2, 8, page_size, **kw)
    return PagedKVCacheManager(p, pages, **extra)


def run_prefill(m, rid, tokens, sampled=100, **claim_kw):
    hit = m.claim(rid, tokens, **claim_kw)
    m.alloc(rid, len(tokens) - hit)
    m.runtime_inputs([rid])
    m.step([rid], [[sampled]])
    return hit


def by_hand(tokens, page_size, salt=None):
    """sha256 chain recomputed independently of the library (page_hash's documented encoding:
    parent field, token count, int64 tokens, salt field; None tagged 0, a value tagged 1)."""
    out, parent = [], None
    for k in range((len(tokens) - 1) // page_size):
        page = tokens[k * page_size : (k + 1) * page_size]
        blob = (b"\x00" if parent is None else b"\x01" + parent) + len(page).to_bytes(8, "little")
        blob += b"".join(int(t).to_bytes(8, "little", signed=True) for t in page)
        blob += b"\x00" if salt is None else b"\x01" + salt
        parent = hashlib.sha256(blob).digest()
        out.append(parent)
    return out


def test_pages_handed_out_lowest_first_and_table_padding():
    m = mgr(pages=8, page_size=4)
    m.claim("a", list(range(6)))
    m.alloc("a", 6)
    m.claim("b", list(range(50, 59)))
    m.alloc("b", 9)
    assert m.pages("a") == [0, 1] and m.pages("b") == [2, 3, 4]
    (inp,) = m.runtime_inputs(["a", "b"])
    assert inp.lookup_table.tolist() == [[0, 1, 8], [2, 3, 4]]  # sentinel = total_num_pages
    assert inp.cache_lengths.tolist() == [0, 0]
    assert inp.max_lengths.tolist() == [[9, 0]] and inp.max_lengths.device.type == "cpu"
    assert inp.lookup_table.dtype == torch.int32 and inp.cache_lengths.dtype == torch.int32


def test_runtime_inputs_staged_equals_runtime_inputs_plus_arrays():
    """The staged form gives runtime_inputs' tensors, and the caller's arrays back (dtypes and
    shapes kept); packed as on CUDA (one uint8 buffer, 16-byte aligned views), equal again."""
    from pagedattn.cache.buffers import packed_copy  # noqa: PLC0415

    m = mgr(pages=8, page_size=4, enable_dispatch_metadata=True)
    m.claim("a", list(range(6)))
    m.alloc("a", 6)
    m.claim("b", list(range(50, 59)))
    m.alloc("b", 9)
    arrays = [np.arange(5, dtype=np.int64), np.array([0, 6, 15], np.int32),
              np.zeros((0,), np.int64), np.arange(6, dtype=np.int32).reshape(2, 3)]  # fmt: skip
    (want,) = m.runtime_inputs(["a", "b"])
    (got,), staged = m.runtime_inputs_staged(["a", "b"], arrays)
    for name in FIELD_ORDER:
        a, b = getattr(want, name), getattr(got, name)
        assert (a is None) == (b is None) and (a is b or torch.equal(a, b)), name
    for t, a in zip(staged, arrays):
        assert t.dtype == torch.from_numpy(a).dtype and np.array_equal(t.numpy(), a)
    host = [want.cache_lengths.numpy(), want.lookup_table.numpy(), *arrays]
    views = packed_copy(host, lambda p: torch.from_numpy(p.copy()))
    base = views[0].data_ptr()
    for t, a in zip(views, host):
        assert (t.data_ptr() - base) % 16 == 0
        assert t.dtype == torch.from_numpy(a).dtype and np.array_equal(t.numpy(), a)
    with pytest.raises(UnknownRequestError):
        m.runtime_inputs_staged(["a", "zz"], arrays)


def test_host_runtime_inputs_are_runtime_inputs_arrays_on_the_host():
    """The host form: runtime_inputs' device fields as numpy (dtypes, values), the same
    argument checks, and a typed error for a cache on more than one device."""
    m = mgr(pages=8, page_size=4, enable_dispatch_metadata=True)
    m.claim("a", list(range(6)))
    m.alloc("a", 6)
    m.claim("b", list(range(50, 59)))
    m.alloc("b", 9)
    for cols in (None, m.max_pages_per_request):
        (want,) = m.runtime_inputs(["b", "a"], padded_cols=cols)
        got = m.host_runtime_inputs(["b", "a"], padded_cols=cols)
        for name in ("cache_lengths", "lookup_table", "attention_dispatch_metadata",
                     "max_lengths"):  # fmt: skip
            t = getattr(want, name)
            assert got[name].dtype == t.numpy().dtype and np.array_equal(got[name], t), name
    with pytest.raises(UnknownRequestError):
        m.host_runtime_inputs(["a", "zz"])
    with pytest.raises(InvalidArgumentError, match="padded_cols"):
        m.host_runtime_inputs(["a", "b"], padded_cols=1)
    m.claim("c", [1, 2])
    with pytest.raises(InvalidArgumentError, match="no allocation"):
        m.host_runtime_inputs(["a", "c"])
    tp = PagedKVCacheManager(KVCacheParams(BF16, 1, 4, 8, 4, devices=["cpu", "cpu"]), 8)
    tp.claim("a", [1])
    tp.alloc("a", 1)
    with pytest.raises(InvalidArgumentError, match="one device"):
        tp.host_runtime_inputs(["a"])


def test_hash_chain_matches_hand_computation():
    m = mgr(pages=8, page_size=3)
    toks = [5, 9, 2, 7, 7, 1, 3, 8]
    run_prefill(m, "a", toks)
    # committed 8 tokens -> pages 0,1 full (6 tokens) are hashed; page 2 partial is not.
    pool = m.pools[0]
    expect = by_hand(toks + [0], 3)[:2]
    assert [pool.page_to_hash[p] for p in (0, 1)] == expect
    assert 2 not in pool.page_to_hash
    salted = mgr(pages=8, page_size=3)
    run_prefill(salted, "a", toks, salt="tenant-1")
    assert salted.pools[0].page_to_hash[0] == by_hand(toks + [0], 3, b"tenant-1")[0]


def test_prefix_hit_refcounts_and_last_token_never_hits():
    m = mgr(pages=10, page_size=4)
    prompt = list(range(12))
    run_prefill(m, "a", prompt)  # 12 prompt tokens committed -> 3 full pages
    assert m.pools[0].ref_counts[:3].tolist() == [1, 1, 1]
    # Same 12-token prompt: the last token never hits, so only 2 pages (8 tokens) match.
    assert m.claim("b", prompt) == 8
    assert m.pages("b") == [0, 1]
    assert m.pools[0].ref_counts[:3].tolist() == [2, 2, 1]
    assert m.cache_length("b") == 8
    # A longer prompt sharing the prefix hits all 3 pages.
    assert m.claim("c", prompt + [77]) == 12
    assert m.pools[0].ref_counts[:3].tolist() == [3, 3, 2]
    st = m.stats()
    assert (st.prefix_query_tokens, st.prefix_hit_tokens) == (12 + 12 + 13, 20)
    assert st.hit_rate == pytest.approx(20 / 37)


def test_salt_isolates_tenants():
    m = mgr(pages=10, page_size=4)
    prompt = list(range(9))
    run_prefill(m, "a", prompt, salt="alice")
    assert m.claim("b", prompt, salt="bob") == 0
    assert m.claim("c", prompt) == 0
    assert m.claim("d", prompt, salt="alice") == 8


def test_lru_eviction_order_is_lazy_and_tail_first():
    m = mgr(pages=6, page_size=2)
    run_prefill(m, "a", [1, 2, 3, 4, 5])  # pages 0,1,2; commits 5 -> pages 0,1 hashed
    run_prefill(m, "b", [9, 8, 7, 6, 5])  # pages 3,4,5; pages 3,4 hashed
    m.release("a")
    m.release("b")
    pool = m.pools[0]
    # a's pages released tail first (1 then 0), then b's (4 then 3); unhashed ones are free.
    assert pool.evictable_pages() == [1, 0, 4, 3]
    assert pool.num_free == 6 and pool.num_cached == 4
    # A new request takes the never-cached pages first (2, 5), then evicts LRU (1, then 0).
    m.claim("c", list(range(100, 108)))
    m.alloc("c", 8)
    assert m.pages("c") == [2, 5, 1, 0]
    assert m.stats().evictions == 2
    assert pool.evictable_pages() == [4, 3]
    # b's prefix survives: page 3 (tokens 9,8) is still cached.
    assert m.claim("d", [9, 8, 7, 6, 5]) == 4 and m.pages("d") == [3, 4]


def test_decode_steps_cache_lengths_and_multi_step_max_lengths():
    m = mgr(pages=16, page_size=4)
    m.claim("a", list(range(5)))
    m.alloc("a", 5)
    m.runtime_inputs(["a"])
    m.step(["a"], [[50]])
    assert m.cache_length("a") == 5 and m.tokens("a")[-1] == 50
    m.alloc("a", 1, num_steps=3)
    (inp,) = m.runtime_inputs(["a"], num_steps=3)
    assert inp.cache_lengths.tolist() == [5]
    assert inp.max_lengths.tolist() == [[1, 5], [1, 6], [1, 7]]
    assert len(m.pages("a")) == 2  # 5 + 1 + 2 = 8 tokens
    m.step(["a"], [[51, 52, 53]])
    assert m.cache_length("a") == 8 and m.tokens("a")[-3:] == [51, 52, 53]


def test_new_token_rows_are_the_pages_rows_of_each_requests_next_positions():
    m = mgr(pages=16, page_size=4)
    run_prefill(m, "a", list(range(6)))  # 6 cached
    m.claim("b", list(range(3)))
    m.alloc("a", 1)
    m.alloc("b", 3)
    cl, rows = m.new_token_rows(["a", "b"], [1, 3])
    assert cl.tolist() == [6, 0]
    by_pages = [m.pages("a")[6 // 4] * 4 + 6 % 4]
    by_pages += [m.pages("b")[p // 4] * 4 + p % 4 for p in range(3)]
    assert rows.tolist() == by_pages
    before = m.snapshot() if hasattr(m, "snapshot") else None
    with pytest.raises(InvalidArgumentError, match=r"requests\[0\].*alloc"):
        m.new_token_rows(["a"], [5])  # pages for 8 tokens, 11 needed
    with pytest.raises(UnknownRequestError):
        m.new_token_rows(["zzz"], [1])
    if before is not None:
        assert m.snapshot() == before


def test_chunked_prefill_commits_chunks():
    m = mgr(pages=16, page_size=4)
    m.claim("a", list(range(10)))
    m.alloc("a", 4)
    (inp,) = m.runtime_inputs(["a"])
    assert inp.max_lengths.tolist() == [[4, 0]]
    with pytest.raises(InvalidArgumentError, match="new_tokens"):
        m.step(["a"], [[1]])  # a partial prompt chunk samples nothing
    m.step(["a"])
    m.alloc("a", 6)
    (inp,) = m.runtime_inputs(["a"])
    assert inp.cache_lengths.tolist() == [4] and inp.max_lengths.tolist() == [[6, 4]]
    m.step(["a"], [[99]])
    assert m.cache_length("a") == 10


def test_speculative_draft_slots():
    p = KVCacheParams(BF16, 1, 2, 8, 4, enable_speculative=True)
    m = PagedKVCacheManager(p, 16)
    m.claim("a", list(range(7)))
    m.alloc("a", 7)
    m.step(["a"], [[70]])
    m.alloc("a", 1, num_draft_tokens=3)  # verify 1 + 3 drafts: slots up to 7 + 4 = 11
    assert len(m.pages("a")) == 3
    (inp,) = m.runtime_inputs(["a"])
    assert inp.draft_attention_dispatch_metadata is not None
    with pytest.raises(InvalidArgumentError, match="new_tokens"):
        m.step(["a"], [[1, 2, 3, 4, 5]])  # at most 1 + 3 sampled tokens
    m.step(["a"], [[71, 72, 73]])  # two drafts accepted + one bonus token
    assert m.cache_length("a") == 10


def test_tensor_parallel_same_page_ids_and_data_parallel_pools():
    tp = KVCacheParams(BF16, 1, 4, 8, 4, devices=["cpu", "cpu"])
    m = PagedKVCacheManager(tp, 8)
    m.claim("a", list(range(6)))
    m.alloc("a", 6)
    ins = m.runtime_inputs(["a"])
    assert len(ins) == 2
    assert torch.equal(ins[0].lookup_table, ins[1].lookup_table)
    assert ins[0].kv_blocks.shape[4] == 2 and ins[0].kv_blocks is not ins[1].kv_blocks
    dp = KVCacheParams(BF16, 1, 4, 8, 4, devices=["cpu"] * 4, data_parallel_degree=2)
    m = PagedKVCacheManager(dp, 8)
    m.claim("a", list(range(6)))
    m.claim("b", list(range(9)))
    assert {m.replica_of("a"), m.replica_of("b")} == {0, 1}
    m.alloc("a", 6)
    m.alloc("b", 9)
    assert m.pages("a")[0] == 0 and m.pages("b")[0] == 0  # independent pools
    ins = m.runtime_inputs(["a", "b"])
    assert [i.batch_size for i in ins] == [1, 1, 1, 1]
    mla = KVCacheParams(BF16, 1, 1, 576, 64, is_mla=True, num_q_heads=16, devices=["cpu"] * 2)
    assert mla.n_kv_heads_per_device == 1


def optional_combos():
    yield from itertools.product([0, 1], [0, 1], [0, 1], [0, 1])


@pytest.mark.parametrize("scales, meta, spec, is_mla", list(optional_combos()))
def test_flatten_unflatten_round_trip(scales, meta, spec, is_mla):
    from pagedattn import KVQuantConfig

    kw = dict(is_mla=True, num_q_heads=8) if is_mla else {}
    quant = None
    if scales:
        quant = KVQuantConfig.mla_rope_aware() if is_mla else KVQuantConfig.blockwise(8)
    p = KVCacheParams(
        BF16,
        1,
        1,
        576 if is_mla else 64,
        4,
        quantization=quant,
        enable_dispatch_metadata=bool(meta),
        enable_speculative=bool(spec),
        **kw,
    )
    m = PagedKVCacheManager(p, 4)
    m.claim("a", [1, 2, 3])
    m.alloc("a", 3, num_draft_tokens=1)
    (inp,) = m.runtime_inputs(["a"])
    flat = inp.flatten()
    present = KVCacheInputsPerDevice.present_fields(p)
    assert [n for n in FIELD_ORDER if getattr(inp, n) is not None] == list(present)
    assert len(flat) == len(present)
    for again in (KVCacheInputsPerDevice.from_flat(iter(flat), p), inp.unflatten(iter(flat))):
        for n in FIELD_ORDER:
            a, b = getattr(inp, n), getattr(again, n)
            assert (a is None and b is None) or a is b
        assert len(again.flatten()) == len(flat)
        assert all(x is y for x, y in zip(again.flatten(), flat))
    # Every optional field is skipped when None, kept in order otherwise.
    for n in OPTIONAL_FIELDS:
        assert (getattr(inp, n) is None) == (n not in present)
    with pytest.raises(InvalidArgumentError, match="ran out"):
        KVCacheInputsPerDevice.from_flat(iter(flat[:-1]), p)
    with pytest.raises(InvalidArgumentError, match="ran out"):
        inp.unflatten(iter(flat[:-1]))


def test_prefix_hit_returns_exact_bytes_written():
    p = KVCacheParams(BF16, 2, 2, 16, 4)
    m = PagedKVCacheManager(p, 16)
    prompt = list(range(11))
    m.claim("a", prompt)
    m.alloc("a", 11)
    (inp,) = m.runtime_inputs(["a"])
    k = torch.randn(11, 2, 16).to(BF16)
    v = torch.randn(11, 2, 16).to(BF16)
    store_kv(k, v, inp, p, 1, ragged_offsets([11]))
    m.step(["a"], [[0]])
    m.release("a")
    assert m.claim("b", prompt + [5]) == 8
    m.alloc("b", 4)
    (inp,) = m.runtime_inputs(["b"])
    kk, vv = gather_kv(inp, p, 1, 0, 8, out_dtype=BF16)
    assert torch.equal(kk.view(torch.int16), k[:8].view(torch.int16))
    assert torch.equal(vv.view(torch.int16), v[:8].view(torch.int16))


# ---- Failures: typed errors, no state change ------------------------------------------


def test_errors_share_one_base():
    for e in (
        OutOfPagesError,
        UnknownRequestError,
        DuplicateRequestError,
        MaxLengthExceededError,
        CapacityError,
        InvalidArgumentError,
    ):
        assert issubclass(e, PagedAttnError)


def failing_calls(m):
    yield OutOfPagesError, lambda: m.alloc("big", 37)
    yield UnknownRequestError, lambda: m.alloc("nope", 1)
    yield UnknownRequestError, lambda: m.release("nope")
    yield UnknownRequestError, lambda: m.runtime_inputs(["a", "nope"])
    yield UnknownRequestError, lambda: m.step(["nope"], [[1]])
    yield DuplicateRequestError, lambda: m.claim("a", [1, 2])
    yield MaxLengthExceededError, lambda: m.claim("long", list(range(100)))
    yield MaxLengthExceededError, lambda: m.alloc("a", 1, num_steps=60)
    yield CapacityError, lambda: m.claim("x4", [1])
    yield InvalidArgumentError, lambda: m.claim("bad", [])
    yield InvalidArgumentError, lambda: m.claim("bad", [1.5, 2])
    yield InvalidArgumentError, lambda: m.claim("bad", "abc")
    yield InvalidArgumentError, lambda: m.claim("bad", torch.tensor([1.0]))
    yield InvalidArgumentError, lambda: m.claim(["unhashable"], [1])
    yield InvalidArgumentError, lambda: m.claim("bad", [1], replica=3)
    yield InvalidArgumentError, lambda: m.claim("bad", [1], salt=5)
    yield InvalidArgumentError, lambda: m.alloc("a", 0)
    yield InvalidArgumentError, lambda: m.alloc("a", -2)
    yield InvalidArgumentError, lambda: m.alloc("a", 1, num_steps=0)
    yield InvalidArgumentError, lambda: m.alloc("a", 1, num_draft_tokens=-1)
    yield InvalidArgumentError, lambda: m.alloc("a", 5)  # only 1 known uncached token
    yield InvalidArgumentError, lambda: m.runtime_inputs(["a", "a"])
    yield InvalidArgumentError, lambda: m.runtime_inputs(["c"])  # claimed, not allocated
    yield InvalidArgumentError, lambda: m.runtime_inputs(["a"], num_steps=0)
    yield InvalidArgumentError, lambda: m.runtime_inputs(["a"], padded_cols=0)
    yield InvalidArgumentError, lambda: m.step(["a"], [[1], [2]])
    yield InvalidArgumentError, lambda: m.step(["a"], [[1, 2, 3]])
    yield InvalidArgumentError, lambda: m.step(["c"], [[1]])
    yield InvalidArgumentError, lambda: m.evict(-1)


def test_failed_calls_change_nothing():
    m = mgr(pages=12, page_size=4, max_batch_size=3, max_seq_len=48)
    run_prefill(m, "a", list(range(10)))
    m.alloc("a", 1)
    m.claim("big", list(range(45)))
    m.claim("c", [7, 7, 7])
    for err, call in failing_calls(m):
        before = m.snapshot()
        with pytest.raises(err):
            call()
        assert m.snapshot() == before, f"{err.__name__} changed state"


def test_out_of_pages_mid_batch_leaves_pool_intact():
    m = mgr(pages=3, page_size=2)
    m.claim("a", [1, 2, 3])
    m.alloc("a", 3)
    before = m.snapshot()
    m.claim("b", [4, 5, 6])
    with pytest.raises(OutOfPagesError):
        m.alloc("b", 3)
    m.release("b")
    assert m.pools[0].snapshot() == before[-1][0]


def test_padded_cols_for_cuda_graphs():
    m = mgr(pages=8, page_size=4, max_seq_len=32)
    m.claim("a", [1, 2, 3])
    m.alloc("a", 3)
    (inp,) = m.runtime_inputs(["a"], padded_cols=8)
    assert inp.lookup_table.shape == (1, 8)
    assert inp.lookup_table[0, 1:].tolist() == [8] * 7
    static = inp
    m.step(["a"], [[4]])
    m.alloc("a", 1)
    (fresh,) = m.runtime_inputs(["a"])
    static.copy_(fresh)
    assert static.cache_lengths.tolist() == [3]
    assert static.lookup_table[0].tolist() == [0] + [8] * 7


def test_table_builds_are_vectorised_numpy():
    m = mgr(pages=64, page_size=1, max_batch_size=32)
    for i in range(32):
        m.claim(i, [i, i + 1])
        m.alloc(i, 2)
    (inp,) = m.runtime_inputs(list(range(32)))
    expect = np.array([m.pages(i) for i in range(32)], dtype=np.int32)
    assert np.array_equal(inp.lookup_table.numpy(), expect)


def _decoders(m, lengths, seed=0):
    """Requests r0.. prefilled with `lengths` tokens and one sampled token each (a decode)."""
    rng = np.random.default_rng(seed)
    rids = [f"r{i}" for i in range(len(lengths))]
    for rid, n in zip(rids, lengths):
        run_prefill(m, rid, rng.integers(0, 1000, n).tolist(), sampled=int(rng.integers(1000)))
    return rids


def test_alloc_decodes_equals_alloc_one_by_one():
    """Across page boundaries (lengths 3..9 on pages of 4) and several steps, the batched
    call leaves the manager exactly as `alloc(rid, 1)` per request does."""
    lengths = [3, 4, 5, 7, 8, 9, 1]
    a, b = mgr(pages=64, page_size=4), mgr(pages=64, page_size=4)
    rids = _decoders(a, lengths)
    assert _decoders(b, lengths) == rids
    for step in range(6):
        a.alloc_decodes(rids)
        for rid in rids:
            b.alloc(rid, 1)
        assert a.snapshot() == b.snapshot(), step
        for m in (a, b):
            m.runtime_inputs(rids)
            m.step(rids, [[step + 7]] * len(rids))
    assert a.snapshot() == b.snapshot()


def test_alloc_decodes_is_all_or_nothing():
    m = mgr(pages=4, page_size=2, max_seq_len=9)
    rids = _decoders(m, [2, 2, 1])  # 3, 3 and 2 tokens known, 2, 2, 1 cached: 3 pages used
    before = m.snapshot()
    with pytest.raises(OutOfPagesError):  # r0 and r1 need a page each, 1 is free
        m.alloc_decodes(rids)
    assert m.snapshot() == before
    m.alloc_decodes(rids[1:])  # r1's page: fits
    assert len(m.pages("r1")) == 2 and m.stats().free_pages == 0
    before = m.snapshot()
    with pytest.raises(UnknownRequestError):
        m.alloc_decodes(["r0", "nope"])
    assert m.snapshot() == before
    m.release("r2")  # its page for p
    m.claim("p", [1, 2])
    m.alloc("p", 2)
    m.runtime_inputs(["p"])
    m.step(["p"], [[]])  # the prompt cached, nothing sampled: no token pending
    before = m.snapshot()
    with pytest.raises(InvalidArgumentError, match="'p'"):
        m.alloc_decodes(["r0", "p"])
    assert m.snapshot() == before


def test_deferred_tokens_equal_step_with_the_values():
    """`step_deferred` then `fill_deferred` (the overlapped engine: the next step allocated
    before the value is known) leaves the manager as `step` with the values does, pages
    entering the prefix cache included (lengths across page boundaries, several steps)."""
    lengths = [3, 4, 5, 7, 8, 1]
    a, b = mgr(pages=64, page_size=4), mgr(pages=64, page_size=4)
    rids = _decoders(a, lengths)
    assert _decoders(b, lengths) == rids
    for step in range(7):
        vals = [(step * 31 + 7 * i) % 1000 for i in range(len(rids))]
        for m in (a, b):
            m.alloc_decodes(rids)
            m.runtime_inputs(rids)
        a.step_deferred(rids, [True] * len(rids))
        a.alloc_decodes(rids[:2])  # the next step's decode input is the deferred token
        a.fill_deferred(rids, vals)
        b.step(rids, [[v] for v in vals])
        b.alloc_decodes(rids[:2])
        assert a.snapshot() == b.snapshot(), step
        for m in (a, b):  # the next step: r0, r1 allocated ahead; the others now
            m.alloc_decodes(rids[2:])
            m.runtime_inputs(rids)
            m.step(rids, [[1]] * len(rids))
    assert a.snapshot() == b.snapshot()
    assert a.stats().cached_pages == b.stats().cached_pages > 0


def test_deferred_token_errors_are_typed_and_change_nothing():
    m = mgr(pages=16, page_size=2)
    rids = _decoders(m, [1, 2])  # 2 and 3 tokens known, 1 and 2 cached
    m.alloc_decodes(rids)
    m.runtime_inputs(rids)
    before = m.snapshot()
    for bad in ([True], [1, 0], (True, "x"), "tt"):
        with pytest.raises(InvalidArgumentError, match="sampling"):
            m.step_deferred(rids, bad)
        assert m.snapshot() == before
    with pytest.raises(InvalidArgumentError, match="token"):
        m.step(rids, [[-(2**63)], [5]])  # the placeholder is no token for `step`
    assert m.snapshot() == before
    with pytest.raises(InvalidArgumentError, match="no deferred token"):
        m.fill_deferred(rids, [1, 2])
    m.step_deferred(rids, [True, True])
    before = m.snapshot()
    for args, err in (
        ((rids, [1]), InvalidArgumentError),
        ((rids, [1, -1]), InvalidArgumentError),
        ((["r0", "zz"], [1, 2]), UnknownRequestError),
    ):
        with pytest.raises(err):
            m.fill_deferred(*args)
        assert m.snapshot() == before
    # r1 (3 cached + a deferred 4th token): committing the step whose input is that token
    # fills page 1 (tokens 2 and 3), so it is refused until the value is given.
    m.alloc_decodes(["r1"])
    m.runtime_inputs(["r1"])
    before = m.snapshot()
    with pytest.raises(InvalidArgumentError, match="deferred"):
        m.step(["r1"], [[9]])
    assert m.snapshot() == before
    m.fill_deferred(rids, [4, 5])
    m.step(["r1"], [[9]])
    assert m.cache_length("r1") == 4 and m.stats().cached_pages == 3


# --------------------------------------------------------------------------------------------
# StagingRing: the engine's persistent host-to-device staging
# --------------------------------------------------------------------------------------------
class _FakeEvent:
    """A CUDA event stand-in: `done` says whether the recorded copy ran; every call logged."""

    log: list = []

    def __init__(self) -> None:
        self.done = True
        _FakeEvent.log.append(("new", id(self)))

    def record(self) -> None:
        self.done = False
        _FakeEvent.log.append(("record", id(self)))

    def query(self) -> bool:
        return self.done

    def synchronize(self) -> None:
        self.done = True
        _FakeEvent.log.append(("sync", id(self)))


def test_packed_layout_offsets_are_16_byte_aligned_and_consecutive():
    from pagedattn.cache.buffers import packed_layout  # noqa: PLC0415

    assert packed_layout([]) == ([], 16)
    assert packed_layout([0]) == ([0], 16)
    assert packed_layout([8, 17, 0, 16, 4]) == ([0, 16, 48, 48, 64], 80)


def test_staging_ring_round_trips_and_reuses_its_buffers():
    """Each stage gives the arrays back (dtype, shape, values; 16-byte aligned views of one
    buffer); slots are used in turn, so the views of a stage survive depth - 1 later stages
    and the buffers are allocated once (grown only for a larger stage)."""
    from pagedattn.cache.buffers import StagingRing  # noqa: PLC0415

    ring = StagingRing("cpu", depth=2)
    rng = np.random.default_rng(0)

    def arrays(n):
        return [rng.integers(0, 99, n).astype(np.int64),
                rng.integers(0, 9, (2, 3)).astype(np.int32), np.zeros(0, np.int64),
                rng.random(n).astype(np.float32)]  # fmt: skip

    first_in = arrays(5)
    first = ring.stage(first_in)
    base = first[0].data_ptr()
    for t, a in zip(first, first_in):
        assert (t.data_ptr() - base) % 16 == 0
        assert t.dtype == torch.from_numpy(a).dtype and np.array_equal(t.numpy(), a)
    second_in = arrays(5)
    second = ring.stage(second_in)
    assert second[0].data_ptr() != base  # the other slot
    for t, a in zip(first, first_in):  # still intact after one later stage (depth 2)
        assert np.array_equal(t.numpy(), a)
    third_in = arrays(5)
    third = ring.stage(third_in)
    assert third[0].data_ptr() == base  # slot 0 again: no new buffer
    assert np.array_equal(first[0].numpy(), third_in[0])  # (its views now read the new stage)
    for t, a in zip(second + third, second_in + third_in):
        assert np.array_equal(t.numpy(), a)
    big = [np.arange(3000, dtype=np.int64)]
    (t,) = ring.stage(big)
    assert np.array_equal(t.numpy(), big[0])  # grown past the 4 KiB first buffer
    with pytest.raises(InvalidArgumentError):
        StagingRing("cpu", depth=0)


def test_staging_ring_copies_into_a_fixed_destination():
    """copy_into: what `fill` writes into the slot's host bytes lands in the first nbytes of
    the destination (the rest untouched), slots in turn under the same guard, the host buffer
    grown for a larger copy; no device buffer of the ring's own is made."""
    from pagedattn.cache.buffers import StagingRing  # noqa: PLC0415

    _FakeEvent.log = []
    ring = StagingRing("cpu", depth=2, event=_FakeEvent)
    dst = torch.full((1000,), -1, dtype=torch.int64)
    for k, n in enumerate((10, 7, 600)):  # words; the third grows the 4 KiB buffer

        def fill(host, n=n, k=k):
            host[: n * 8].view(np.int64)[:] = np.arange(n) + 100 * k

        ring.copy_into(dst, n * 8, fill)
        assert dst[:n].tolist() == list(range(100 * k, 100 * k + n))
        if k == 1:  # words past the copy keep the earlier one's
            assert dst[7:10].tolist() == [7, 8, 9]
        assert (dst[max(n, 10) :] == -1).all()
    assert ring.num_waits == 1  # the third copy reused slot 0 before its event was done
    assert all(slot[2] is None for slot in ring._slots)


def test_staging_ring_waits_only_for_a_slot_whose_copy_has_not_run():
    """The reuse guard: a slot's host buffer is rewritten only after its previous copy's event
    (`synchronize` when `query` says it has not run; no wait when it has), one event per slot
    recorded after each copy."""
    from pagedattn.cache.buffers import StagingRing  # noqa: PLC0415

    _FakeEvent.log = []
    ring = StagingRing("cpu", depth=2, event=_FakeEvent)
    a = [np.arange(4, dtype=np.int64)]
    ring.stage(a)
    ring.stage(a)
    ev0, ev1 = ring._slots[0][3], ring._slots[1][3]
    assert ev0 is not ev1 and not ev0.done and not ev1.done
    assert ring.num_waits == 0
    ring.stage(a)  # slot 0 again, its copy not run: waits for it
    assert ring.num_waits == 1 and ("sync", id(ev0)) in _FakeEvent.log
    assert ring._slots[0][3] is ev0 and not ev0.done  # recorded again, same event
    ev1.done = True  # slot 1's copy ran: no wait
    n_sync = sum(k == "sync" for k, _ in _FakeEvent.log)
    ring.stage(a)
    assert ring.num_waits == 1 and sum(k == "sync" for k, _ in _FakeEvent.log) == n_sync
    assert sum(k == "new" for k, _ in _FakeEvent.log) == 2  # one event per slot, ever
