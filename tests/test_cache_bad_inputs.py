"""Bad arguments to the host-side cache layer: typed errors naming the argument, no state change.

Regression tests for issue 55's cache cases (each failed before the fix), then hypothesis tests
that call every public manager method, from a random valid state, with one bad argument, and
build KVCacheParams / KVQuantConfig with one bad field.
"""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
import torch
from bad_inputs import assert_rejected, bad_ints, bad_token_lists
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pagedattn import (
    KVCacheInputsPerDevice,
    KVCacheParams,
    KVQuantConfig,
    PagedKVCacheManager,
)
from pagedattn.cache import BlockPool, allocate_buffers, page_hash

F32 = torch.float32
INT32_MAX = 2**31 - 1


def mgr(page_size=4, pages=16, dp=1, **kw):
    p = KVCacheParams(F32, 1, 1, 2, page_size, devices=["cpu"] * dp, data_parallel_degree=dp, **kw)
    return PagedKVCacheManager(p, pages, max_batch_size=8, max_seq_len=32)


def prefill(m, rid, prompt, sampled=7, **claim_kw):
    hit = m.claim(rid, prompt, **claim_kw)
    m.alloc(rid, len(prompt) - hit)
    m.step([rid], [[sampled]])
    return hit


def allocated(m, *rids, prompt=(1, 2, 3, 4, 5)):
    for rid in rids:
        m.claim(rid, list(prompt))
        m.alloc(rid, len(prompt))


# ---- 1. step is atomic over its requests ---------------------------------------------------


@pytest.mark.parametrize("page_size", [1, 4])
@pytest.mark.parametrize("bad", [2**64, 2**63, -1])
def test_step_is_atomic_when_a_later_request_has_a_bad_token(page_size, bad):
    m = mgr(page_size)
    allocated(m, "ok", "h")
    assert_rejected(m.step, ["ok", "h"], [[9], [bad]], state=(m,), names="new_tokens['h']")
    # Nothing was committed, and "h" is not wedged: the same step with a good token works.
    m.step(["ok", "h"], [[9], [3]])
    assert m.cache_length("ok") == m.cache_length("h") == 5
    m.alloc("h", 1)
    m.step(["h"], [[4]])
    assert m.tokens("h")[-2:] == [3, 4]


# ---- 2. token ids outside [0, 2**63) --------------------------------------------------------

BAD_IDS = [-1, -(2**31), 2**63, 2**64, np.uint64(2**63), np.int64(-5)]


@pytest.mark.parametrize("bad", BAD_IDS, ids=repr)
def test_prompt_token_ids_out_of_int64_range(bad):
    m = mgr()
    prefill(m, "a", [1, 2, 3, 4, 5, 6])
    assert_rejected(m.claim, "b", [1, 2, bad], state=(m,), names="prompt_tokens")
    assert_rejected(m.claim, "b", (bad,), state=(m,), names="prompt_tokens")


@pytest.mark.parametrize("bad", BAD_IDS, ids=repr)
def test_new_token_ids_out_of_int64_range(bad):
    m = mgr()
    allocated(m, "a")
    assert_rejected(m.step, ["a"], [[bad]], state=(m,), names="new_tokens['a']")
    assert_rejected(m.step, ("a",), [(5, bad)], state=(m,), names="new_tokens['a']")


def test_negative_ids_in_arrays_and_tensors_and_bool_tensors():
    m = mgr()
    allocated(m, "a")
    for toks in (np.array([1, -2]), torch.tensor([-3]), torch.tensor([True])):
        assert_rejected(m.claim, "b", toks, state=(m,), names="prompt_tokens")
        assert_rejected(m.step, ["a"], [toks], state=(m,), names="new_tokens['a']")
    # Good arrays and tensors still work.
    m.claim("b", np.array([1, 2], dtype=np.uint8))
    m.step(["a"], [torch.tensor([6])])
    assert m.tokens("a")[-1] == 6


# ---- 3. every salt isolates, "" and b"" included --------------------------------------------


@pytest.mark.parametrize("cached_salt, asked_salt", [(None, ""), (None, b""), ("", None)])
def test_empty_salt_isolates_from_no_salt(cached_salt, asked_salt):
    m = mgr(page_size=2)
    prompt = [1, 2, 3, 4, 5]
    prefill(m, "a", prompt, salt=cached_salt)
    assert m.claim("b", prompt, salt=asked_salt) == 0
    assert m.claim("c", prompt, salt=cached_salt) == 4  # the same salt still hits


def test_page_hash_none_and_empty_salt_differ():
    assert page_hash(None, [1, 2], None) != page_hash(None, [1, 2], b"")
    assert page_hash(None, [1, 2], b"x") != page_hash(None, [1, 2], None)


def test_a_crafted_salt_cannot_reach_unsalted_pages():
    """Before the fix a page's message was parent || tokens || salt, with nothing delimiting
    them: a salt equal to the next page's token bytes made a first page hash like an unsalted
    second page, so a salted tenant saw another tenant's (unsalted) K/V."""
    ps = 4

    def old_hash(parent, toks, salt=b""):
        blob = parent + b"".join(int(t).to_bytes(8, "little", signed=True) for t in toks)
        return hashlib.sha256(blob + salt).digest()

    # A victim first page whose hash reads as 4 non-negative int64 tokens.
    for v in range(10_000):
        first = [v, 1, 2, 3]
        chunks = [int.from_bytes(old_hash(b"", first)[i : i + 8], "little") for i in (0, 8, 16, 24)]
        if all(c < 2**63 for c in chunks):
            break
    second = [4, 5, 6, 7]
    m = mgr(page_size=ps, pages=16)
    prefill(m, "victim", first + second + [8])
    salt = b"".join(t.to_bytes(8, "little") for t in second)
    assert m.claim("tenant", chunks + [0], salt=salt) == 0


def test_str_salt_with_lone_surrogate_is_accepted():
    m = mgr()
    assert m.claim("a", [1, 2, 3], salt="\ud800") == 0
    assert_rejected(m.claim, "b", [1], state=(m,), names="salt", salt=bytearray(b"x"))


# ---- 4. KVCacheParams / KVQuantConfig field types -------------------------------------------

PARAMS = dict(dtype=F32, num_layers=1, n_kv_heads=2, head_dim=8, page_size=4)
MLA = dict(PARAMS, n_kv_heads=1, head_dim=576, is_mla=True, num_q_heads=4)


@pytest.mark.parametrize(
    "base, field, bad",
    [
        (PARAMS, "num_q_heads", 0),
        (PARAMS, "num_layers", True),
        (MLA, "mla_rope_dim", 64.5),
        (MLA, "mla_rope_dim", 64.0),
        (PARAMS, "num_q_heads", "8"),
        (PARAMS, "head_dim", 8.0),
        (PARAMS, "page_size", 2**64),
        (PARAMS, "is_mla", 1),
        (PARAMS, "enable_prefix_caching", "yes"),
        (PARAMS, "enable_speculative", None),
        (PARAMS, "dtype", "float32"),
        (PARAMS, "dtype", np.zeros(3)),
        (PARAMS, "devices", "not-a-device"),
        (PARAMS, "devices", []),
        (PARAMS, "devices", [True]),
        (PARAMS, "devices", None),
        (PARAMS, "quantization", "fp8"),
        (PARAMS, "data_parallel_degree", 1.0),
    ],
    ids=lambda v: v.get("is_mla") and "MLA" or "MHA" if isinstance(v, dict) else repr(v),
)
def test_params_field_types(base, field, bad):
    assert_rejected(KVCacheParams, **dict(base, **{field: bad}), names=f"KVCacheParams.{field}")


@pytest.mark.parametrize(
    "field, bad",
    [
        ("format", None),
        ("format", np.array(["blockwise"])),
        ("granularity", True),
        ("granularity", 16.0),
        ("granularity", "16"),
        ("scale_dtype", "float32"),
        ("scale_dtype", np.zeros(2)),
    ],
    ids=repr,
)
def test_quant_config_field_types(field, bad):
    assert_rejected(KVQuantConfig, **{field: bad}, names=f"KVQuantConfig.{field}")


def test_replica_devices_range():
    p = KVCacheParams(F32, 1, 1, 2, 4, devices=["cpu"] * 2, data_parallel_degree=2)
    for bad in (2, -1, True, None):
        assert_rejected(p.replica_devices, bad, names="replica")


def test_numpy_ints_are_normalised():
    p = KVCacheParams(F32, np.int64(2), 2, 8, np.int32(4), enable_speculative=np.bool_(True))
    assert type(p.num_layers) is int and type(p.page_size) is int
    assert p.enable_speculative is True
    assert p == KVCacheParams(F32, 2, 2, 8, 4, enable_speculative=True)


# ---- 5. evict's replica -----------------------------------------------------------------------


@pytest.mark.parametrize("replica", [5, 2, -1, True, 1.0, "0"], ids=repr)
def test_evict_replica_range_and_type(replica):
    m = mgr(page_size=1, dp=2)
    prefill(m, "a", [1, 2, 3], replica=0)
    prefill(m, "b", [1, 2, 3], replica=1)
    m.release("a")
    m.release("b")
    assert_rejected(m.evict, 1, replica=replica, state=(m,), names="replica")
    assert m.evict(1, replica=1) == 1


# ---- 6. request_ids must be a sequence, not a str ---------------------------------------------


def test_request_ids_string_is_not_a_sequence_of_ids():
    m = mgr()
    allocated(m, "p", "e", "n", "d", "i", "g")  # "pending" as one-letter ids
    assert_rejected(m.runtime_inputs, "pending", state=(m,), names="request_ids")
    assert_rejected(m.runtime_inputs, "pig", state=(m,), names="request_ids")
    assert_rejected(m.runtime_inputs, b"pe", state=(m,), names="request_ids")
    assert_rejected(m.step, "pe", [[1], [2]], state=(m,), names="request_ids")
    assert_rejected(m.runtime_inputs, ["p"], padded_cols=True, state=(m,), names="padded_cols")
    m.runtime_inputs(["p", "e"], padded_cols=np.int64(2))


# ---- 7. unflatten: the seed's instance form, and from_flat by params -------------------------


def _inputs(**kw):
    p = KVCacheParams(F32, 1, 1, 8, 4, **kw)
    m = PagedKVCacheManager(p, 4)
    m.claim("a", [1, 2, 3])
    m.alloc("a", 3)
    (inp,) = m.runtime_inputs(["a"])
    return p, inp


@pytest.mark.parametrize("meta, spec", [(0, 0), (1, 0), (1, 1)])
def test_unflatten_is_an_instance_method_with_the_template_deciding_fields(meta, spec):
    p, inp = _inputs(
        enable_dispatch_metadata=bool(meta),
        enable_speculative=bool(spec),
        quantization=KVQuantConfig.blockwise(4),
    )
    flat = inp.flatten()
    again = inp.unflatten(iter(flat))
    assert isinstance(again, KVCacheInputsPerDevice) and again is not inp
    assert all(x is y for x, y in zip(again.flatten(), flat)) and len(again.flatten()) == len(flat)
    # The template alone decides: drop a field from it and unflatten consumes one value less.
    template = KVCacheInputsPerDevice(
        inp.kv_blocks, inp.cache_lengths, inp.lookup_table, inp.max_lengths
    )
    four = template.unflatten(iter(flat))
    assert len(four.flatten()) == 4 and four.kv_scales is None
    assert all(x is y for x, y in zip(four.flatten(), flat))
    by_params = KVCacheInputsPerDevice.from_flat(iter(flat), p)
    assert all(x is y for x, y in zip(by_params.flatten(), flat))


def test_unflatten_errors_are_typed():
    p, inp = _inputs()
    flat = inp.flatten()
    for call in (
        lambda: inp.unflatten(iter(flat[:-1])),  # runs out
        lambda: inp.unflatten(iter([*flat[:-1], [1, 2]])),  # not a tensor
        lambda: inp.unflatten(flat),  # not an iterator
        lambda: KVCacheInputsPerDevice.unflatten(iter(flat), p),  # the old classmethod call
        lambda: KVCacheInputsPerDevice.from_flat(iter(flat[:2]), p),
        lambda: KVCacheInputsPerDevice.from_flat(iter(flat), "params"),
        lambda: KVCacheInputsPerDevice.from_flat(iter([None] * 9), p),
    ):
        assert_rejected(call, state=(inp,))


# ---- 8. the other entry points --------------------------------------------------------------


def test_claim_replica_bool_and_alloc_bool_counts():
    m = mgr(dp=2)
    allocated(m, "a")
    assert_rejected(m.claim, "b", [1, 2], replica=True, state=(m,), names="replica")
    assert_rejected(m.claim, "b", [1, 2], replica=2.0, state=(m,), names="replica")
    assert_rejected(m.alloc, "a", True, state=(m,), names="num_new_tokens")
    assert_rejected(m.alloc, "a", 1, num_steps=False, state=(m,), names="num_steps")
    assert_rejected(m.alloc, "a", 1, num_steps=2**64, state=(m,), names="num_steps")
    m.claim("b", [1, 2], replica=np.int64(1))
    assert m.replica_of("b") == 1


def test_unknown_and_unhashable_ids():
    m = mgr()
    allocated(m, "a")
    for call in (m.release, m.cache_length, m.pages, m.tokens, m.replica_of):
        assert_rejected(call, "nope", state=(m,), names="request_id")
        assert_rejected(call, ["a"], state=(m,), names="request_id")
    assert_rejected(m.runtime_inputs, ["a", ["x"]], state=(m,), names="request_ids[1]")
    assert_rejected(m.claim, float("nan"), [1], state=(m,), names="request_id")
    assert ["a"] not in m and "a" in m


def test_manager_and_buffer_constructor_counts():
    p = KVCacheParams(F32, 1, 1, 2, 4)
    for kw, name in (
        (dict(total_num_pages=True), "total_num_pages"),
        (dict(total_num_pages=2.0), "total_num_pages"),
        (dict(memory_bytes="4096"), "memory_bytes"),
        (dict(memory_bytes=4096.0), "memory_bytes"),
        (dict(total_num_pages=4, max_batch_size=True), "max_batch_size"),
    ):
        assert_rejected(PagedKVCacheManager, p, **kw, names=name)
    # Cache lengths are int32, and so is the lookup table's sentinel (total_num_pages).
    big_pages = KVCacheParams(F32, 1, 1, 2, 2**20)
    assert_rejected(PagedKVCacheManager, big_pages, 2, max_seq_len=2**31, names="max_seq_len")
    assert_rejected(allocate_buffers, p, 2**31, names="total_num_pages")
    assert_rejected(allocate_buffers, p, True, names="total_num_pages")
    assert_rejected(allocate_buffers, p, 2, device="nowhere", names="device")


def test_copy_checks_every_field_before_copying_any():
    _, static = _inputs()
    _, fresh = _inputs()
    fresh.cache_lengths.fill_(3)
    fresh.attention_dispatch_metadata = fresh.attention_dispatch_metadata[:-1].clone()
    assert_rejected(static.copy_, fresh, state=(static,), names="attention_dispatch_metadata")
    assert_rejected(static.copy_, "inputs", state=(static,), names="other")
    assert_rejected(static.copy_, fresh.flatten(), state=(static,), names="other")
    _, fresh = _inputs()
    fresh.lookup_table = fresh.lookup_table.float()
    assert_rejected(static.copy_, fresh, state=(static,), names="lookup_table")
    _, fresh = _inputs()
    fresh.lookup_table = fresh.lookup_table.expand(2, -1)[:, :0]  # narrower, but 2 rows
    assert_rejected(static.copy_, fresh, state=(static,), names="lookup_table")


def test_block_pool_mutators_check_before_changing():
    pool = BlockPool(4)
    pool.take(2)
    for call, args in (
        (pool.release, ([1, 0, 0],)),  # double free of page 0 after page 1
        (pool.release, ([7],)),
        (pool.release, (1,)),
        (pool.acquire, ([0, 3],)),  # page 3 is free and not cached
        (pool.take, (True,)),
        (pool.take, (-1,)),
        (pool.evict, (1.5,)),
        (pool.register, (3, b"x" * 32)),  # not owned
        (pool.register, (0, "h")),
        (pool.lookup, ([[1]],)),
    ):
        assert_rejected(call, *args, state=(pool,))
    for args in ((None, [1], 5), (b"short", [1]), (None, [-1]), (None, [1.0]), (None, "ab")):
        assert_rejected(page_hash, *args)


# ---- 9. hypothesis: one bad argument from a random valid state --------------------------------

TOKENS = st.integers(0, 5)
SHARED = [[], [1, 2, 3, 4, 5]]
UNHASHABLE = st.sampled_from([[1], {"a": 1}, np.zeros(2), {1}])
UNKNOWN_IDS = st.sampled_from(["nope", 12345, None, 2.5, ("x", 1)]) | UNHASHABLE
NOT_SEQUENCES = st.sampled_from(["ab", b"ab", 5, None, {"r0"}, 1.5, object()])


@st.composite
def manager_states(draw):
    """A manager with claimed-only, allocated, decoding and released requests."""
    ps = draw(st.sampled_from([1, 4]))
    dp = draw(st.sampled_from([1, 2]))
    p = KVCacheParams(F32, 1, 1, 2, ps, devices=["cpu"] * dp, data_parallel_degree=dp)
    m = PagedKVCacheManager(p, 96, max_batch_size=6, max_seq_len=32)
    for i in range(draw(st.integers(1, 5))):
        rid = f"r{i}"
        prompt = draw(st.sampled_from(SHARED)) + draw(st.lists(TOKENS, min_size=1, max_size=6))
        hit = m.claim(rid, prompt, salt=draw(st.sampled_from([None, "t"])))
        stage = draw(st.sampled_from(["claimed", "allocated", "decoding", "released"]))
        if stage == "claimed":
            continue
        m.alloc(rid, len(prompt) - hit)
        if stage == "allocated":
            continue
        m.step([rid], [[draw(TOKENS)]])
        if stage == "released":
            m.release(rid)
        else:
            m.alloc(rid, 1, draw(st.integers(1, 2)))
    return m


def _no_none(s):
    return s.filter(lambda v: v is not None)


def _bad_call(data, m):
    """(fn, args, kwargs, names) of one public method with one bad argument."""
    rids = m.request_ids
    ready = [r for r in rids if m._requests[r].pending]  # allocated, so step/runtime_inputs work
    dp = len(m.pools)
    draw = data.draw
    method = draw(
        st.sampled_from(
            ["claim", "alloc", "runtime_inputs", "step", "release", "evict"]
            + ["cache_length", "pages", "tokens"]
        )
    )
    if method == "claim":
        arg = draw(st.sampled_from(["request_id", "prompt_tokens", "salt", "replica"]))
        kw = dict(request_id="new", prompt_tokens=[1, 2, 3])
        kw[arg] = draw(
            {
                "request_id": UNHASHABLE | st.sampled_from([*rids, float("nan")]),
                "prompt_tokens": bad_token_lists() | st.just([]) | st.just(list(range(33))),
                "salt": st.sampled_from([5, 1.5, True, [b"x"], bytearray(b"x"), object()]),
                "replica": _no_none(bad_ints(0, dp - 1)),
            }[arg]
        )
        return m.claim, (), kw, arg
    if method in ("release", "cache_length", "pages", "tokens"):
        return getattr(m, method), (draw(UNKNOWN_IDS),), {}, "request_id"
    if method == "alloc" and not rids:
        return m.alloc, (draw(UNKNOWN_IDS), 1), {}, "request_id"
    if method == "alloc":
        rid = draw(st.sampled_from(rids))
        r = m._requests[rid]
        known = len(r.tokens) - m.cache_length(rid)
        arg = draw(
            st.sampled_from(["request_id", "num_new_tokens", "num_steps", "num_draft_tokens"])
        )
        kw = dict(request_id=rid, num_new_tokens=1, num_steps=1, num_draft_tokens=0)
        kw[arg] = draw(
            {
                "request_id": UNKNOWN_IDS,
                "num_new_tokens": bad_ints(1, known),
                "num_steps": bad_ints(1),
                "num_draft_tokens": bad_ints(0),
            }[arg]
        )
        return m.alloc, (), kw, arg
    if method == "evict":
        arg = draw(st.sampled_from(["num_pages", "replica"]))
        kw = dict(num_pages=1, replica=None)
        kw[arg] = draw(
            _no_none(bad_ints(0)) if arg == "num_pages" else _no_none(bad_ints(0, dp - 1))
        )
        return m.evict, (), kw, arg
    batch = draw(st.lists(st.sampled_from(ready), unique=True)) if ready else []
    unready = [r for r in rids if r not in ready]
    bad_ids = NOT_SEQUENCES | UNKNOWN_IDS.map(lambda x: [*batch, x])
    if batch:
        bad_ids = bad_ids | st.just([*batch, batch[0]])
    if unready:
        bad_ids = bad_ids | st.sampled_from(unready).map(lambda x: [*batch, x])
    if method == "runtime_inputs":
        args = ["request_ids"] + (["num_steps", "padded_cols"] if batch else [])
        arg = draw(st.sampled_from(args))
        kw = dict(request_ids=batch, num_steps=1, padded_cols=None)
        if arg == "request_ids":
            kw[arg] = draw(bad_ids)
        elif arg == "num_steps":
            kw[arg] = draw(bad_ints(1, min(m._requests[r].num_steps for r in batch)))
        else:
            need = max(len(m.pages(r)) for r in batch)
            kw[arg] = draw(_no_none(bad_ints(need, m.max_pages_per_request)))
        return m.runtime_inputs, (), kw, arg
    # step: a good token list for each request but one bad argument.
    arg = draw(st.sampled_from(["request_ids", "new_tokens"] + (["entry"] if batch else [])))
    good = [[draw(TOKENS)] for _ in batch]
    if arg == "request_ids":
        return m.step, (draw(bad_ids), good), {}, "request_ids"
    if arg == "new_tokens":
        bad = draw(NOT_SEQUENCES.filter(lambda v: v is not None) | st.just([*good, [1]]))
        return m.step, (batch, bad), {}, "new_tokens"
    i = draw(st.integers(0, len(batch) - 1))
    r = m._requests[batch[i]]
    too_many = [1] * (r.num_steps + r.num_draft + 1)
    good[i] = draw(bad_token_lists() | st.just(too_many))
    return m.step, (batch, good), {}, f"new_tokens[{batch[i]!r}]"


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_manager_rejects_one_bad_argument_and_changes_nothing(data):
    m = data.draw(manager_states())
    fn, args, kw, name = _bad_call(data, m)
    assert_rejected(fn, *args, state=(m,), names=name, **kw)


BOOL_FIELDS = ("is_mla", "enable_prefix_caching", "enable_dispatch_metadata", "enable_speculative")
NOT_BOOLS = st.sampled_from([1, 0, "yes", None, 1.0, np.int64(1), [True]])
BAD_PARAM_FIELDS = {
    "dtype": st.sampled_from([torch.int8, torch.float8_e4m3fn, "float32", None, 1, np.float32]),
    "devices": st.sampled_from(["nowhere", [], ["cpu", "xyz"], None, 1.5, [None], [True], {"cpu"}]),
    "quantization": st.sampled_from(["fp8", 1, True, {"format": "blockwise"}]),
    "num_q_heads": _no_none(bad_ints(1, INT32_MAX)),
    "mla_rope_dim": bad_ints(0, INT32_MAX),
    **{f: bad_ints(1, INT32_MAX) for f in ("num_layers", "n_kv_heads", "head_dim", "page_size")},
    "data_parallel_degree": bad_ints(1, INT32_MAX),
    **{f: NOT_BOOLS for f in BOOL_FIELDS},
}
BAD_QUANT_FIELDS = {
    "format": st.sampled_from(["int4", None, 1, b"blockwise", ["blockwise"], "BLOCKWISE"]),
    "granularity": _no_none(bad_ints(1, INT32_MAX)),
    "scale_dtype": st.sampled_from([torch.float16, "float32", None, 1, np.float32, torch.int8]),
}


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_params_reject_one_bad_field(data):
    field = data.draw(st.sampled_from(sorted(BAD_PARAM_FIELDS)))
    bad = data.draw(BAD_PARAM_FIELDS[field])
    base = dict(PARAMS, devices=["cpu"])
    if field == "mla_rope_dim" and data.draw(st.booleans()):
        base = dict(MLA)
        bad = data.draw(bad_ints(1, MLA["head_dim"] - 1))
    assert_rejected(KVCacheParams, **dict(base, **{field: bad}), names=f"KVCacheParams.{field}")


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_quant_config_rejects_one_bad_field(data):
    field = data.draw(st.sampled_from(sorted(BAD_QUANT_FIELDS)))
    bad = data.draw(BAD_QUANT_FIELDS[field])
    assert_rejected(KVQuantConfig, **{field: bad}, names=f"KVQuantConfig.{field}")
