"""Edge cases of the compat layers, through both pagedattn backends, and their bad arguments.

Every entry point of `pagedattn.compat` (FlashInfer's paged decode and prefill wrappers, the
prefill one taking ragged queries; FlashMLA's `flash_mla_with_kvcache`, dense and sparse) runs
the edge cases of the interface it copies on backend "reference" and on backend "triton" (the
interpreter on a CPU; the CUDA kernels in the `gpu` duplicates, run on an H200), and the two
must agree: NaN/inf positions equal, finite values within the tolerances of
tests/test_compat_*.py. Where the interface refuses a case (an empty batch), both backends
raise the same typed error and change nothing.

Cases: zero-length requests, among others and alone (FlashInfer: no KV token, no query, fewer
KV tokens than queries; FlashMLA: `cache_seqlens` 0 or below s_q); empty batches; topk_length 0
(and negative, and past the stride); every invalid sparse index kind of DESIGN.md section 5
(-1, -2^31, exactly one past the end, huge), in the main and the extra cache; invalid page and
block ids. Unused cache slots hold NaN, so a skipped entry that were read would show.

Then hypothesis feeds each entry point random bad arguments: each must raise a typed error
naming the argument and change no state (a rejected plan() leaves the previous plan usable, a
rejected run() or FlashMLA call writes no cache byte, no out buffer, no metadata).

FlashInfer's ragged-KV and MLA wrappers and FlashMLA's sparse prefill have no compat layer, so
no cases here.
"""

from __future__ import annotations

import math
import os

import pytest
import torch
from bad_inputs import assert_rejected, bad_ints, fingerprint
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_compat_flash_mla import Cache as MLACache

from pagedattn import InvalidArgumentError
from pagedattn.compat import flash_mla as fm
from pagedattn.compat.flashinfer import (
    BatchDecodeWithPagedKVCacheWrapper,
    BatchPrefillWithPagedKVCacheWrapper,
)
from pagedattn.errors import PagedAttnError
from pagedattn.testing import BF16_TOL, assert_close

BF16, F32, I32 = torch.bfloat16, torch.float32, torch.int32
BACKENDS = ("reference", "triton")
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
LSE_TOL = dict(abs_tol=2e-4, rel_tol=1e-5, cos_tol=1e-10)  # tests/test_compat_*.py's
# The compat tests bound each backend's distance to a float64 oracle by BF16_TOL / LSE_TOL, so
# two backends may differ by twice that (the Triton kernels round P to bf16 before P @ V).
OUT_CROSS_TOL = {k: 2 * v for k, v in BF16_TOL.items()}
LSE_CROSS_TOL = {k: 2 * v for k, v in LSE_TOL.items()}
INT32_MAX = 2**31 - 1
SETTINGS = settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow], database=None
)


def assert_agree(res: dict) -> None:
    """The backends' (out, lse) agree: NaN/inf positions (and signs) equal, finite values
    within twice the compat tests' tolerances."""
    (o_r, l_r), (o_t, l_t) = res["reference"], res["triton"]
    assert o_r.shape == o_t.shape and l_r.shape == l_t.shape
    assert_close(o_t, o_r, **OUT_CROSS_TOL, name="out")
    assert_close(l_t, l_r, **LSE_CROSS_TOL, name="lse")


def runnable(device: str, backend: str = "triton") -> None:
    """Skip a CPU run of the Triton backend without the interpreter (conftest sets
    TRITON_INTERPRET=1 only without CUDA: a GPU machine runs the `gpu` duplicates instead)."""
    if device == "cpu" and backend == "triton" and os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("the Triton backend on a CPU needs TRITON_INTERPRET=1")


def both(fn, device: str) -> dict:
    """fn(backend) on each backend."""
    runnable(device)
    return {be: fn(be) for be in BACKENDS}


class WrapperState:
    """What a FlashInfer wrapper holds (its plan, static buffers, FP8 scale scalars), read
    afresh by `assert_rejected`'s fingerprint (`snapshot`). 0-dim tensors are fingerprinted as
    1-element views (`fingerprint` views tensors as bytes, which a 0-dim tensor cannot be)."""

    def __init__(self, w) -> None:
        self.w = w

    def snapshot(self) -> list:
        return fingerprint(
            *(
                v.reshape(1) if isinstance(v, torch.Tensor) and v.ndim == 0 else v
                for v in vars(self.w).values()
            )
        )


def small(x: torch.Tensor) -> torch.Tensor:
    """FlashMLA's test distribution, N(0, 1) / 10 clamped to [-1, 1] (NaN kept): with the
    Triton kernels' bf16 P @ V, outputs of unit-scale values cancel to small numbers whose
    error exceeds the absolute bound, at any backend."""
    return (x / 10).clamp(-1, 1)


def seed_of(gen: torch.Generator) -> int:
    return int(torch.randint(0, 2**31 - 1, (), generator=gen))


# --------------------------------------------------------------------------------------------
# FlashInfer: a paged cache (NHD, one [P, 2, page, h_kv, d] tensor) in CSR page-table form
# --------------------------------------------------------------------------------------------
class PageTable:
    """Random pages (shuffled, NaN in every slot no request reads) for `kv_lens`."""

    def __init__(self, seed: int, kv_lens, ps: int, h_kv: int, d: int, dtype, device) -> None:
        g = torch.Generator().manual_seed(seed)
        n_pages = [-(-n // ps) for n in kv_lens]
        self.num_pages = total = sum(n_pages) + 2
        perm = torch.randperm(total, generator=g)
        self.indptr = torch.tensor([0, *torch.tensor(n_pages).cumsum(0).tolist()], dtype=I32)
        self.indices = perm[: sum(n_pages)].to(I32)
        self.last = torch.tensor(
            [n - (p - 1) * ps if p else 0 for n, p in zip(kv_lens, n_pages)], dtype=I32
        )
        used = torch.zeros(total, ps, dtype=torch.bool)
        for b, n in enumerate(kv_lens):
            pages = self.indices[self.indptr[b] : self.indptr[b + 1]].long()
            t = torch.arange(n)
            used[pages[t // ps], t % ps] = True
        x = small(torch.randn(total, 2, ps, h_kv, d, generator=g))
        x[~used[:, None].expand(total, 2, ps)] = float("nan")
        self.cache = x.to(dtype).to(device)
        self.gen = g

    def plan_args(self, h_qo: int, h_kv: int, d: int, ps: int) -> tuple:
        return self.indptr, self.indices, self.last, h_qo, h_kv, d, ps


def fi_shape(device: str) -> dict:
    """Tiny on the CPU (the interpreter); a realistic GQA head layout on the GPU."""
    if device == "cuda":
        return dict(ps=16, h_qo=8, h_kv=2, d=128)
    return dict(ps=4, h_qo=4, h_kv=2, d=16)


def fi_decode(device: str, backend: str, kv_lens, q_len: int = 1, seed: int = 0):
    s = fi_shape(device)
    pt = PageTable(seed, kv_lens, s["ps"], s["h_kv"], s["d"], BF16, device)
    w = BatchDecodeWithPagedKVCacheWrapper(
        torch.empty(8, device=device), "NHD", pagedattn_backend=backend
    )
    w.plan(
        *pt.plan_args(s["h_qo"], s["h_kv"], s["d"], s["ps"]), q_data_type=BF16, q_len_per_req=q_len
    )
    q = torch.randn(len(kv_lens) * q_len, s["h_qo"], s["d"], generator=pt.gen).to(BF16)
    return w.run(q.to(device), pt.cache, return_lse=True)


def fi_prefill(device: str, backend: str, q_lens, kv_lens, causal: bool, seed: int = 0):
    s = fi_shape(device)
    pt = PageTable(seed, kv_lens, s["ps"], s["h_kv"], s["d"], BF16, device)
    w = BatchPrefillWithPagedKVCacheWrapper(
        torch.empty(8, device=device), "NHD", pagedattn_backend=backend
    )
    qo = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=I32)
    w.plan(
        qo, *pt.plan_args(s["h_qo"], s["h_kv"], s["d"], s["ps"]), causal=causal, q_data_type=BF16
    )
    q = torch.randn(int(qo[-1]), s["h_qo"], s["d"], generator=pt.gen).to(BF16)
    return w.run(q.to(device), pt.cache, return_lse=True)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "kv_lens,q_len",
    [
        ([0, 7, 0, 3], 1),  # requests without KV among others
        ([0], 1),  # alone
        ([1, 0, 6, 0], 3),  # fewer KV tokens than queries (and none), 3 queries each
    ],
)
def test_flashinfer_decode_zero_length_requests(gen, device, kv_lens, q_len):
    seed = seed_of(gen)
    res = both(lambda be: fi_decode(device, be, kv_lens, q_len, seed), device)
    assert_agree(res)
    o, l = res["reference"]
    for b, n in enumerate(kv_lens):
        rows = slice(b * q_len, b * q_len + max(q_len - n, 0))  # queries before position 0
        assert bool((o[rows] == 0).all()) and bool((l[rows] == -math.inf).all())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize(
    "q_lens,kv_lens",
    [
        # requests without queries (one also without KV), without KV, with fewer KV tokens
        # than queries, among ordinary ones
        ([0, 3, 0, 2, 4, 3], [4, 5, 0, 0, 2, 70]),
        ([0, 0], [0, 3]),  # no query at all
        ([2], [0]),  # a request without KV alone
        ([150, 2], [3, 70]),  # 147 queries before position 0: more than a key tile
    ],
)
def test_flashinfer_prefill_zero_length_requests(gen, device, causal, q_lens, kv_lens):
    seed = seed_of(gen)
    res = both(lambda be: fi_prefill(device, be, q_lens, kv_lens, causal, seed), device)
    assert_agree(res)
    o, l = res["reference"]
    row = 0
    for ql, kl in zip(q_lens, kv_lens):
        blind = ql if kl == 0 else (max(ql - kl, 0) if causal else 0)
        assert bool((o[row : row + blind] == 0).all())
        assert bool((l[row : row + blind] == -math.inf).all())
        row += ql


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("backend", BACKENDS)
def test_empty_batches_are_refused_alike(device, backend):
    """b = 0: FlashInfer plans at least one request and FlashMLA asserts a positive batch;
    both backends raise the same typed error and the previous plan stays."""
    runnable(device, backend)
    s = fi_shape(device)
    pt = PageTable(1, [3, 5], s["ps"], s["h_kv"], s["d"], BF16, device)
    args = pt.plan_args(s["h_qo"], s["h_kv"], s["d"], s["ps"])
    ws = torch.empty(8, device=device)
    w = BatchDecodeWithPagedKVCacheWrapper(ws, "NHD", pagedattn_backend=backend)
    w.plan(*args, q_data_type=BF16)
    empty = torch.zeros(0, dtype=I32)
    assert_rejected(
        w.plan,
        torch.zeros(1, dtype=I32),
        empty,
        empty,
        *args[3:],
        q_data_type=BF16,
        state=(WrapperState(w),),
        names="last_page_len",
    )
    if backend == "reference":  # the previous plan runs (a rejection launches nothing)
        w.run(torch.randn(2, s["h_qo"], s["d"]).to(BF16).to(device), pt.cache)
    pw = BatchPrefillWithPagedKVCacheWrapper(ws, "NHD", pagedattn_backend=backend)
    assert_rejected(
        pw.plan,
        torch.zeros(1, dtype=I32),
        torch.zeros(1, dtype=I32),
        empty,
        empty,
        *args[3:],
        q_data_type=BF16,
        state=(WrapperState(pw),),
        names="qo_indptr",
    )
    meta = fm.get_mla_metadata()[0]
    c = mla_dense_case(device, [4], s_q=1)
    q0 = c["q"][:0]
    assert_rejected(
        fm.flash_mla_with_kvcache,
        q0,
        c["k_cache"],
        c["block_table"][:0],
        c["cache_seqlens"][:0],
        512,
        meta,
        backend=backend,
        state=(meta, c["k_cache"]),
        names="q",
    )


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", ["-1", "-2^31", "one past the end", "huge"])
@pytest.mark.parametrize("prefill", [False, True])
def test_flashinfer_invalid_page_ids(device, backend, kind, prefill):
    """A page id the requests read outside [0, num_pages): a typed error naming the page
    table on both backends (negative ids in plan(), the rest in run(), which first sees the
    cache), and no state change. An id past indptr[-1] is never read and is fine."""
    runnable(device, backend)
    s = fi_shape(device)
    pt = PageTable(2, [5, 3], s["ps"], s["h_kv"], s["d"], BF16, device)
    bad = {"-1": -1, "-2^31": -(2**31), "one past the end": pt.num_pages, "huge": INT32_MAX}[kind]
    indices = torch.cat([pt.indices, torch.tensor([bad], dtype=I32)])  # unread: fine
    args = list(pt.plan_args(s["h_qo"], s["h_kv"], s["d"], s["ps"]))
    ws = torch.empty(8, device=device)
    if prefill:
        w = BatchPrefillWithPagedKVCacheWrapper(ws, "NHD", pagedattn_backend=backend)
        args.insert(0, torch.tensor([0, 1, 2], dtype=I32))
        name = "paged_kv_indices"
    else:
        w = BatchDecodeWithPagedKVCacheWrapper(ws, "NHD", pagedattn_backend=backend)
        name = "indices"
    i_idx = 2 if prefill else 1
    args[i_idx] = indices
    w.plan(*args, q_data_type=BF16)
    q = torch.randn(2, s["h_qo"], s["d"]).to(BF16).to(device)
    good = w.run(q, pt.cache) if backend == "reference" else None  # (a rejection launches none)
    read = indices.clone()
    read[1] = bad  # a page of request 0
    args[i_idx] = read
    state = (WrapperState(w), pt.cache, q)
    if bad < 0:
        assert_rejected(w.plan, *args, q_data_type=BF16, state=state, names=name)
    else:
        w.plan(*args, q_data_type=BF16)
        state = (WrapperState(w), pt.cache, q)
        assert_rejected(w.run, q, pt.cache, state=state, names=name)
        args[i_idx] = indices
        w.plan(*args, q_data_type=BF16)
    if good is not None:
        assert torch.equal(w.run(q, pt.cache), good)


# --------------------------------------------------------------------------------------------
# FlashMLA dense: cache_seqlens 0 and below s_q
# --------------------------------------------------------------------------------------------
def mla_shape(device: str) -> dict:
    return dict(h_q=16, page=64) if device == "cuda" else dict(h_q=2, page=4)


def mla_dense_case(device: str, seqlens, s_q: int, seed: int = 0) -> dict:
    """A dense call's arguments: a shuffled bf16 block table (sentinels in unused columns),
    NaN in every unread slot."""
    s = mla_shape(device)
    g = torch.Generator().manual_seed(seed)
    page = s["page"]
    n_blocks = [-(-n // page) for n in seqlens]
    P = sum(n_blocks) + 2
    perm = torch.randperm(P, generator=g)
    table = torch.full((len(seqlens), max(max(n_blocks), 1) + 1), P, dtype=I32)
    used = torch.zeros(P, page, dtype=torch.bool)
    k = 0
    for b, (n, nb) in enumerate(zip(seqlens, n_blocks)):
        table[b, :nb] = perm[k : k + nb].int()
        k += nb
        t = torch.arange(n)
        used[table[b, t // page].long(), t % page] = True
    cache = MLACache(g, "bf16", P, page, used)
    cache.k_cache.copy_(small(cache.k_cache))
    q = torch.randn(len(seqlens), s_q, s["h_q"], 576, generator=g).to(BF16)
    return dict(
        q=q.to(device),
        k_cache=cache.k_cache.to(device),
        block_table=table.to(device),
        cache_seqlens=torch.tensor(seqlens, dtype=I32, device=device),
    )


def mla_dense(device: str, backend: str, seqlens, s_q: int, causal: bool, seed: int = 0):
    c = mla_dense_case(device, seqlens, s_q, seed)
    return fm.flash_mla_with_kvcache(
        c["q"], c["k_cache"], c["block_table"], c["cache_seqlens"], 512, None,
        causal=causal, backend=backend,
    )  # fmt: skip


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize(
    "seqlens,s_q",
    [
        ([0, 5, 1], 2),  # zero-length and shorter-than-s_q requests among others
        ([0], 1),  # alone
        ([0, 0], 3),
        ([3, 9], 4),  # causal: request 0's first query sees no key
    ],
)
def test_flash_mla_dense_zero_length_requests(gen, device, causal, seqlens, s_q):
    """FlashMLA accepts cache_seqlens below s_q (0 included): query i sees keys
    < seqlen - s_q + i + 1 (causal) or < seqlen; one that sees none gets out 0, lse +inf."""
    seed = seed_of(gen)
    res = both(lambda be: mla_dense(device, be, seqlens, s_q, causal, seed), device)
    assert_agree(res)
    o, l = res["reference"]
    for b, n in enumerate(seqlens):
        blind = s_q if n == 0 else (max(s_q - n, 0) if causal else 0)
        assert bool((o[b, :blind] == 0).all()) and bool((l[b, :, :blind] == math.inf).all())
        assert bool(torch.isfinite(l[b, :, blind:]).all())


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    "what,value",
    [
        ("cache_seqlens", -1),
        ("cache_seqlens", 10**6),  # past the block table
        ("block_table", -1),
        ("block_table", -(2**31)),
        ("block_table", "one past the end"),
        ("block_table", INT32_MAX),
    ],
)
def test_flash_mla_dense_bad_values_on_the_host(backend, what, value):
    """Device values FlashMLA leaves undefined, checked on the host where that is free (CPU
    tensors; the reference backend anywhere): a typed error naming the caller's argument on
    both backends, the metadata untouched. (On CUDA the kernels guard them, with no sync.)"""
    runnable("cpu", backend)
    c = mla_dense_case("cpu", [5, 3], s_q=1)
    meta = fm.get_mla_metadata()[0]
    if what == "cache_seqlens":
        c["cache_seqlens"][0] = value
    else:
        num_blocks = c["k_cache"].shape[0]
        c["block_table"][0, 1] = num_blocks if value == "one past the end" else value
    assert_rejected(
        fm.flash_mla_with_kvcache,
        c["q"], c["k_cache"], c["block_table"], c["cache_seqlens"], 512, meta,
        backend=backend, state=(meta, *c.values()), names=what,
    )  # fmt: skip
    assert not meta.have_initialized


# --------------------------------------------------------------------------------------------
# FlashMLA sparse: topk_length 0, every invalid index kind, main and extra cache
# --------------------------------------------------------------------------------------------
def scale_down(c: MLACache) -> None:
    """Values / 8 in place, exactly (unused slots stay NaN): bf16 elements, or a V32 token's
    float32 tile scales and bf16 rope."""
    if c.fmt == "bf16":
        c.k_cache.div_(8)
        return
    rows = c.k_cache[:, :, 0]  # [P, page, 656] bytes
    for lo, hi, dt in ((512, 528, torch.float32), (528, 656, BF16)):
        part = rows[..., lo:hi].contiguous().view(dt) / 8
        rows[..., lo:hi] = part.view(torch.uint8)


def mla_sparse_case(device: str, fmt: str, topk_length, x_topk_length, seed: int = 0) -> dict:
    """A sparse call's arguments, every index row mixing valid entries with each invalid kind
    (-1, -2^31, one past the end, huge); query (0, 1) has none valid at all."""
    s = mla_shape(device)
    g = torch.Generator().manual_seed(seed)
    b, s_q, topk, x_topk = len(topk_length), 2, 8, 6
    page = s["page"]
    main = MLACache(g, fmt, 5, page, torch.rand(5, page, generator=g) < 0.5)
    extra = MLACache(g, fmt, 3, page, torch.rand(3, page, generator=g) < 0.5)
    for c in (main, extra):
        scale_down(c)

    def indices(c: MLACache, width: int) -> torch.Tensor:
        written = torch.nonzero(c.used.flatten()).flatten()
        idx = written[torch.randint(len(written), (b, s_q, width), generator=g)]
        invalid = torch.tensor([-1, -(2**31), c.P * c.page, INT32_MAX])
        slots = torch.rand(b, s_q, width, generator=g).argsort(-1)[..., :4]
        idx.scatter_(-1, slots, invalid.expand(b, s_q, 4))
        idx[0, 1] = -1
        return idx.to(I32)

    q = torch.randn(b, s_q, s["h_q"], main.d, generator=g).to(BF16)
    return dict(
        q=q.to(device),
        k_cache=main.k_cache.to(device),
        is_fp8_kvcache=main.is_fp8,
        indices=indices(main, topk).to(device),
        topk_length=torch.tensor(topk_length, dtype=I32, device=device),
        extra_k_cache=extra.k_cache.to(device),
        extra_indices_in_kvcache=indices(extra, x_topk).to(device),
        extra_topk_length=torch.tensor(x_topk_length, dtype=I32, device=device),
        attn_sink=torch.randn(s["h_q"], generator=g).to(device),
    )


def mla_sparse(device: str, backend: str, c: dict, extra: bool):
    kw = dict(c)
    if not extra:
        for k in ("extra_k_cache", "extra_indices_in_kvcache", "extra_topk_length"):
            kw.pop(k)
    q, k_cache = kw.pop("q"), kw.pop("k_cache")
    return fm.flash_mla_with_kvcache(
        q, k_cache, None, None, 512, None, softmax_scale=0.05, backend=backend, **kw
    )


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fmt", ["bf16", "v32"])
@pytest.mark.parametrize(
    "topk_length,x_topk_length,extra",
    [
        ([0, 8, 5], [2, 0, 4], True),  # topk_length 0 among others; extra_topk_length 0
        ([0], [0], True),  # alone: only the sink
        ([0, 0], [0, 0], False),  # no key at all: out 0, lse +inf
        ([-3, 9, 2**31 - 1], [4, -1, 5], True),  # negative = none; past the stride = all
    ],
)
def test_flash_mla_sparse_edge_cases(gen, device, fmt, topk_length, x_topk_length, extra):
    c = mla_sparse_case(device, fmt, topk_length, x_topk_length, seed_of(gen))
    res = both(lambda be: mla_sparse(device, be, c, extra), device)
    assert_agree(res)
    o, l = res["reference"]
    assert bool((o[0, 1] == 0).all()) and bool((l[0, :, 1] == math.inf).all())  # no valid entry
    for b, n in enumerate(topk_length):
        n_x = x_topk_length[b] if extra else 0
        if n <= 0 and n_x <= 0:
            assert bool((o[b] == 0).all()) and bool((l[b] == math.inf).all())


# --------------------------------------------------------------------------------------------
# Bad arguments (hypothesis): typed errors naming the argument, no state change
# --------------------------------------------------------------------------------------------
NOT_BOOLS = st.sampled_from([None, 1, 0, "yes", 1.0, [True]])
NOT_STRINGS = st.sampled_from([None, 1, ["NHD"], b"NHD", torch.zeros(1)])
BAD_SCALES = st.sampled_from(
    [-1.0, 0.0, -0.0, math.nan, math.inf, -math.inf, "1.0", [1.0], True, None, -1]
)
MISSING, UNKNOWN = "<missing>", "<unknown keyword>"


def _tensor_bads(good: torch.Tensor, *extra, none: bool = True) -> st.SearchStrategy:
    """Wrong versions of an index tensor: float, bool, one more dim, meta, not a tensor (None
    too unless `none` is False: the argument is optional), + extra."""
    vals = [
        good.float(),
        good.bool(),
        good.unsqueeze(0),
        torch.empty_like(good, device="meta"),
        good.tolist(),
        "x",
        *extra,
    ]
    return st.sampled_from(vals + ([None] if none else []))


def _call_with(fn, kw: dict, name: str, value):
    """fn(**kw) with kw[name] replaced by value (MISSING: dropped; UNKNOWN: an extra kw)."""
    kw = dict(kw)
    if value is MISSING:
        kw.pop(name)
    elif value is UNKNOWN:
        kw["bogus_argument"] = 1
    else:
        kw[name] = value
    return lambda: fn(**kw)


def _decode_fixture(graph: bool = False):
    """A planned decode wrapper (CUDA-graph mode: static metadata buffers, which a rejected
    plan() must not write either)."""
    pt = PageTable(3, [5, 2, 7], 4, 2, 16, BF16, "cpu")
    bufs = {}
    if graph:
        bufs = dict(
            use_cuda_graph=True,
            paged_kv_indptr_buffer=torch.zeros(4, dtype=I32),
            paged_kv_indices_buffer=torch.zeros(16, dtype=I32),
            paged_kv_last_page_len_buffer=torch.zeros(3, dtype=I32),
        )
    w = BatchDecodeWithPagedKVCacheWrapper(
        torch.empty(8), "NHD", pagedattn_backend="reference", **bufs
    )
    plan = dict(
        indptr=pt.indptr,
        indices=pt.indices,
        last_page_len=pt.last,
        num_qo_heads=4,
        num_kv_heads=2,
        head_dim=16,
        page_size=4,
        q_data_type=BF16,
        sm_scale=0.3,
        window_left=4,
    )
    w.plan(**plan)
    q = torch.randn(3, 4, 16, generator=pt.gen).to(BF16)
    return pt, w, plan, q


def _plan_bads(pt: PageTable, kv: dict) -> dict:
    """Bad values of the page-table and scalar arguments shared by both wrappers' plan()."""
    ip, idx, last = kv["indptr"], kv["indices"], kv["last_page_len"]
    return {
        kv["indptr_name"]: _tensor_bads(
            ip, ip.flip(0), ip[:-1], ip + 100, ip - 1, torch.tensor([0, 3, 2, 5], dtype=I32)
        ),
        kv["indices_name"]: _tensor_bads(idx, idx - 100, torch.full_like(idx, -(2**31))),
        kv["last_name"]: _tensor_bads(last, last + 5, last - 10, last[:-1]),
        "num_qo_heads": bad_ints(1, INT32_MAX) | st.just(3),
        "num_kv_heads": bad_ints(1, INT32_MAX),
        "page_size": bad_ints(1, INT32_MAX),
        "window_left": bad_ints(-1, INT32_MAX - 1),
        "sm_scale": BAD_SCALES.filter(lambda x: x is not None),
        "pos_encoding_mode": st.sampled_from(["ROPE", "rope_llama", "ALIBI", None, 1, ["NONE"]]),
        "logits_soft_cap": st.sampled_from([-1.0, 30.0, math.nan, math.inf, "1", True]),
        "q_data_type": st.sampled_from(["float17", None, 3, torch.int32, torch.float8_e5m2]),
        "kv_data_type": st.sampled_from([torch.float8_e5m2, torch.int8, torch.float16, "x", 3]),
        "o_data_type": st.sampled_from([torch.int32, "foo", 1, torch.float8_e4m3fn]),
        "non_blocking": NOT_BOOLS,
        "disable_split_kv": NOT_BOOLS,
        "seq_lens": _tensor_bads(last, last + 100, -last - 1, last[:-1], none=False),
        "rope_scale": st.sampled_from(["x", [1.0], torch.zeros(1)]),
        "fixed_split_size": st.sampled_from(["x", 1.5, True]),
    }


@SETTINGS
@given(data=st.data(), graph=st.booleans())
def test_flashinfer_decode_plan_bad_arguments(data, graph):
    """A rejected plan() names the argument, changes nothing (CUDA-graph buffers included),
    and the previous plan runs."""
    pt, w, plan, q = _decode_fixture(graph)
    before = w.run(q, pt.cache)
    bads = _plan_bads(
        pt,
        dict(plan, indptr_name="indptr", indices_name="indices", last_name="last_page_len"),
    )
    bads.update(
        head_dim=bad_ints(1, INT32_MAX),
        q_len_per_req=bad_ints(1, INT32_MAX),
        window_right=st.sampled_from([1, -1, "0", None]),
        data_type=st.sampled_from(["float17", 3, [1]]),
        block_tables=st.sampled_from(["x", 3]),
    )
    required = ["indptr", "indices", "last_page_len", "num_qo_heads", "num_kv_heads"]
    name = data.draw(st.sampled_from(sorted(bads) + [MISSING, UNKNOWN]), label="argument")
    if name == MISSING:
        name = data.draw(st.sampled_from([*required, "head_dim", "page_size"]))
        value = MISSING
    elif name == UNKNOWN:
        value, name = UNKNOWN, "bogus_argument"
    else:
        value = data.draw(bads[name], label="value")
    names = (name, "indptr", "last_page_len") if name in ("last_page_len", "seq_lens") else name
    if name == "indices":
        names = ("indices", "indptr")
    assert_rejected(
        _call_with(w.plan, plan, name, value), state=(WrapperState(w), pt.cache), names=names
    )
    assert torch.equal(w.run(q, pt.cache), before)


@SETTINGS
@given(data=st.data())
def test_flashinfer_prefill_plan_bad_arguments(data):
    pt = PageTable(4, [5, 2, 7], 4, 2, 16, BF16, "cpu")
    w = BatchPrefillWithPagedKVCacheWrapper(torch.empty(8), "NHD", pagedattn_backend="reference")
    plan = dict(
        qo_indptr=torch.tensor([0, 2, 3, 6], dtype=I32),
        paged_kv_indptr=pt.indptr,
        paged_kv_indices=pt.indices,
        paged_kv_last_page_len=pt.last,
        num_qo_heads=4,
        num_kv_heads=2,
        head_dim_qk=16,
        page_size=4,
        causal=True,
        q_data_type=BF16,
    )
    w.plan(**plan)
    q = torch.randn(6, 4, 16, generator=pt.gen).to(BF16)
    before = w.run(q, pt.cache)
    qo = plan["qo_indptr"]
    bads = _plan_bads(
        pt,
        dict(
            indptr=pt.indptr,
            indices=pt.indices,
            last_page_len=pt.last,
            indptr_name="paged_kv_indptr",
            indices_name="paged_kv_indices",
            last_name="paged_kv_last_page_len",
        ),
    )
    bads.update(
        qo_indptr=_tensor_bads(qo, qo.flip(0), qo + 1, qo[:-1]),
        head_dim_qk=bad_ints(1, INT32_MAX),
        head_dim_vo=bad_ints(1, INT32_MAX).filter(lambda x: x is not None),
        causal=NOT_BOOLS,
        use_fp16_qk_reduction=NOT_BOOLS,
        custom_mask=st.sampled_from([torch.ones(3, dtype=torch.bool), "x", torch.ones(1000)]),
        packed_custom_mask=st.sampled_from([torch.ones(3, dtype=torch.uint8), "x"]),
        prefix_len_ptr=st.just(torch.zeros(3, dtype=I32)),
        max_token_per_sequence=st.sampled_from(["x", 1.5]),
    )
    name = data.draw(st.sampled_from(sorted(bads) + [MISSING, UNKNOWN]), label="argument")
    if name == MISSING:
        required = [k for k in plan if k not in ("q_data_type", "causal")]
        name = data.draw(st.sampled_from(required))
        value = MISSING
    elif name == UNKNOWN:
        value, name = UNKNOWN, "bogus_argument"
    else:
        value = data.draw(bads[name], label="value")
    names = name
    if name in ("paged_kv_last_page_len", "seq_lens", "qo_indptr"):
        names = (name, "paged_kv_indptr", "paged_kv_last_page_len", "qo_indptr")
    elif name == "paged_kv_indices":
        names = (name, "paged_kv_indptr")
    assert_rejected(
        _call_with(w.plan, plan, name, value), state=(WrapperState(w), pt.cache), names=names
    )
    assert torch.equal(w.run(q, pt.cache), before)


@SETTINGS
@given(data=st.data())
def test_flashinfer_run_bad_arguments(data):
    """A rejected run() names the argument and writes nothing: no cache byte, no out / lse
    byte, not the plan's lookup table (its sentinel) nor the FP8 scale scalars."""
    pt, w, plan, q = _decode_fixture()
    before = w.run(q, pt.cache)
    out = torch.full((3, 4, 16), math.nan, dtype=BF16)
    lse = torch.full((3, 4), math.nan)
    run = dict(q=q, paged_kv_cache=pt.cache, out=out, lse=lse, return_lse=True)
    cache = pt.cache
    bads = dict(
        q=st.sampled_from([q.float(), q[:2], q[..., :8], torch.empty_like(q, device="meta"), None]),
        paged_kv_cache=st.sampled_from(
            [cache.float(), cache[:, :, :2], (cache[:, 0],), cache[:, 0], None, "x"]
        ),
        q_scale=BAD_SCALES.filter(lambda x: x is not None) | st.just(torch.ones(2)),
        k_scale=BAD_SCALES.filter(lambda x: x is not None) | st.just(torch.tensor(2.0)),
        v_scale=BAD_SCALES.filter(lambda x: x is not None) | st.just(torch.ones(2)),
        out=st.sampled_from([out.float(), out[:2], torch.empty_like(out, device="meta"), "x"]),
        lse=st.sampled_from([lse.double(), lse[:2], "x"]),
        return_lse=NOT_BOOLS,
        window_left=st.sampled_from([5, -1, "4", 4.0, True]),
        sinks=st.sampled_from([torch.zeros(3), torch.zeros(4, dtype=I32), "x", torch.zeros(1, 4)]),
        lse_base=st.sampled_from(["log10", None, 2, ["ln"]]),
        enable_pdl=st.sampled_from(["yes", 1]),
        q_len_per_req=st.sampled_from([0, 2, "1", 1.0]),
        kv_cache_sf=st.just(torch.zeros(1)),
        skip_softmax_threshold_scale_factor=st.sampled_from(["x", [1.0]]),
    )
    name = data.draw(st.sampled_from(sorted(bads) + [MISSING, UNKNOWN]), label="argument")
    if name == MISSING:
        name = data.draw(st.sampled_from(["q", "paged_kv_cache"]))
        value = MISSING
    elif name == UNKNOWN:
        value, name = UNKNOWN, "bogus_argument"
    else:
        value = data.draw(bads[name], label="value")
    names = name
    if name in ("q_scale", "k_scale"):
        names = (name, "sm_scale * q_scale")
    state = (WrapperState(w), cache, q, out, lse)
    assert_rejected(_call_with(w.run, run, name, value), state=state, names=names)
    assert torch.equal(w.run(q, pt.cache), before)


@pytest.mark.parametrize(
    "cls,kw,name",
    [
        (BatchDecodeWithPagedKVCacheWrapper, dict(kv_layout="NDH"), "kv_layout"),
        (BatchDecodeWithPagedKVCacheWrapper, dict(kv_layout=["NHD"]), "kv_layout"),
        (BatchDecodeWithPagedKVCacheWrapper, dict(use_cuda_graph=1), "use_cuda_graph"),
        (BatchDecodeWithPagedKVCacheWrapper, dict(use_tensor_cores="y"), "use_tensor_cores"),
        (BatchDecodeWithPagedKVCacheWrapper, dict(backend="fa9"), "backend"),
        (BatchDecodeWithPagedKVCacheWrapper, dict(pagedattn_backend="cuda"), "pagedattn_backend"),
        (BatchDecodeWithPagedKVCacheWrapper, dict(pagedattn_backend=""), "pagedattn_backend"),
        (BatchDecodeWithPagedKVCacheWrapper, dict(jit_args=[1]), "jit_args"),
        (BatchDecodeWithPagedKVCacheWrapper, dict(use_cuda_graph=True), "paged_kv_indptr_buffer"),
        (BatchDecodeWithPagedKVCacheWrapper, dict(bogus=1), "bogus"),
        (BatchDecodeWithPagedKVCacheWrapper, dict(float_workspace_buffer=MISSING), "float_work"),
        (BatchDecodeWithPagedKVCacheWrapper, dict(float_workspace_buffer="x"), "float_work"),
        (BatchPrefillWithPagedKVCacheWrapper, dict(kv_layout=None), "kv_layout"),
        (BatchPrefillWithPagedKVCacheWrapper, dict(use_cuda_graph=True), "qo_indptr_buf"),
        (BatchPrefillWithPagedKVCacheWrapper, dict(max_pages_per_request=0), "max_pages"),
        (BatchPrefillWithPagedKVCacheWrapper, dict(custom_mask_buf=1, oops=2), "oops"),
    ],
)
def test_flashinfer_constructor_bad_arguments(cls, kw, name):
    kw = dict(kw)
    kw.setdefault("float_workspace_buffer", torch.empty(8))
    if kw["float_workspace_buffer"] is MISSING:
        kw.pop("float_workspace_buffer")
    assert_rejected(lambda: cls(**kw), names=name)


def test_flashinfer_other_methods_bind_typed():
    pt, w, plan, q = _decode_fixture()
    state = (WrapperState(w),)
    assert_rejected(w.end_forward, 1, state=state, names="end_forward")
    assert_rejected(w.reset_workspace_buffer, torch.empty(8), state=state, names="int_workspace")
    assert_rejected(w.run_return_lse, state=state, names="q")
    assert_rejected(w.begin_forward, pt.indptr, state=state, names="indices")
    assert_rejected(w.run, q, pt.cache, k_scale=-1, state=(*state, pt.cache), names="k_scale")


def _mla_fixture(sparse: bool):
    if sparse:
        c = mla_sparse_case("cpu", "v32", [3, 8, 0], [2, 0, 4])
        kw = dict(c, block_table=None, cache_seqlens=None, head_dim_v=512, softmax_scale=0.05)
    else:
        c = mla_dense_case("cpu", [5, 0, 9], s_q=2)
        kw = dict(c, head_dim_v=512, causal=True)
    kw["backend"] = "reference"
    return kw


@SETTINGS
@given(data=st.data(), sparse=st.booleans(), used=st.booleans())
def test_flash_mla_bad_arguments(data, sparse, used):
    """A rejected FlashMLA call names the argument and writes nothing: not the metadata object
    (fresh, or used by a call of this configuration), no tensor argument."""
    kw = _mla_fixture(sparse)
    meta = fm.get_mla_metadata()[0]
    if used:
        fm.flash_mla_with_kvcache(tile_scheduler_metadata=meta, **kw)
    kw["tile_scheduler_metadata"] = meta
    q, k = kw["q"], kw["k_cache"]
    other_meta = fm.get_mla_metadata()[0]  # a metadata object of another configuration
    other_meta.have_initialized = True
    other_meta.config = fm.FlashMLASchedMeta.Config(7, 1, 1, 1, 1, False, False, None, None, None)
    fp8 = kw.get("is_fp8_kvcache", False)
    bads = dict(
        q=st.sampled_from(
            [
                q.int(),
                q[0],
                q[..., :100],
                q[:, :1].expand(-1, 9, -1, -1),
                torch.empty_like(q, device="meta"),
                None,
            ]
        ),
        k_cache=st.sampled_from([k[..., :-1], k[0], k.float(), None, "x"]),
        head_dim_v=bad_ints(1, 512),
        tile_scheduler_metadata=st.sampled_from(["x", 3, other_meta]),
        num_splits=st.sampled_from(["x", 3]),
        softmax_scale=BAD_SCALES.filter(lambda x: x is not None),
        causal=NOT_BOOLS | (st.just(True) if sparse else st.nothing()),
        is_fp8_kvcache=NOT_BOOLS | st.just(not fp8),
        attn_sink=st.sampled_from(
            [torch.zeros(3), torch.zeros(q.shape[2], dtype=torch.float64), "x"]
        ),
        backend=st.sampled_from(["cuda", "", 0, False, ["triton"]]),
    )
    if sparse:
        idx, tl = kw["indices"], kw["topk_length"]
        x_idx, x_tl = kw["extra_indices_in_kvcache"], kw["extra_topk_length"]
        bads.update(
            indices=_tensor_bads(idx, idx.long(), idx[:1], none=False),
            topk_length=_tensor_bads(tl, tl.long(), tl[:1], none=False),
            extra_k_cache=st.sampled_from([kw["extra_k_cache"][..., :-1], "x"]),
            extra_indices_in_kvcache=_tensor_bads(x_idx, x_idx[:, :1]),
            extra_topk_length=_tensor_bads(x_tl, x_tl.long(), none=False),
            block_table=st.sampled_from([torch.zeros(3, 2, dtype=torch.int64), "x"]),
        )
    else:
        bt, sl = kw["block_table"], kw["cache_seqlens"]
        bads.update(
            block_table=_tensor_bads(bt, bt.long(), bt[:2], bt - 100, bt[:, :0]),
            cache_seqlens=_tensor_bads(sl, sl.long(), sl[:2], sl - 20, sl + 10**6),
            topk_length=st.just(torch.zeros(3, dtype=I32)),
            extra_indices_in_kvcache=st.just(torch.zeros(3, 2, 1, dtype=I32)),
        )
    name = data.draw(st.sampled_from(sorted(bads) + [MISSING, UNKNOWN]), label="argument")
    if name == MISSING:
        name = data.draw(st.sampled_from(["q", "k_cache", "block_table", "cache_seqlens"]))
        value = MISSING
    elif name == UNKNOWN:
        value, name = UNKNOWN, "bogus_argument"
    else:
        value = data.draw(bads[name], label="value")
    names = {
        "block_table": ("block_table", "block_table / cache_seqlens"),
        "cache_seqlens": ("cache_seqlens", "block_table / cache_seqlens"),
        "is_fp8_kvcache": ("is_fp8_kvcache",),
        "q": ("q", "q.shape", "q.dtype", "q.device"),
        "k_cache": ("k_cache",),
    }.get(name, (name,))
    if used:  # a valid but different shape is the metadata's mismatch
        names = (*names, "tile_scheduler_metadata")
    state = (meta, *[v for v in kw.values() if isinstance(v, torch.Tensor)])
    assert_rejected(
        _call_with(fm.flash_mla_with_kvcache, kw, name, value), state=state, names=names
    )
    assert meta.have_initialized == used


def test_bad_calls_raise_typed_errors_not_type_error():
    """The issue's cases: an unknown keyword of a FlashInfer wrapper, k_scale=-1 named as
    k_scale (not "scale ... -0.125"), cache_seqlens < s_q accepted."""
    pt, w, plan, q = _decode_fixture()
    with pytest.raises(InvalidArgumentError, match="bogus"):
        w.plan(**plan, bogus=1)
    with pytest.raises(InvalidArgumentError, match="^k_scale:"):
        w.run(q, pt.cache, k_scale=-1)
    with pytest.raises(PagedAttnError, match="window_lft"):
        w.run(q, pt.cache, window_lft=3)
    c = mla_dense_case("cpu", [0, 1], s_q=2)
    o, l = fm.flash_mla_with_kvcache(
        c["q"], c["k_cache"], c["block_table"], c["cache_seqlens"], 512, causal=True,
        backend="reference",
    )  # fmt: skip
    assert bool((o[0] == 0).all()) and bool((l[0] == math.inf).all())
    assert bool((o[1, 0] == 0).all()) and bool(torch.isfinite(l[1, :, 1]).all())
