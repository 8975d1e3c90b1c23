"""`pagedattn.compat.flashinfer` against a float64 oracle of FlashInfer's documented semantics.

The oracle is written from FlashInfer's docs and kernels, not from pagedattn: request b's KV is
`indices[indptr[b]:indptr[b+1]]` pages holding `(pages - 1) * page_size + last_page_len[b]`
tokens, read straight from the NHD/HND cache tensor; its queries are the last q_len tokens;
logits `sm_scale * q.k` (query head h reads KV head h // (h_qo // h_kv)); causal `j <= p`; the
window keeps `j >= p - window_left`; a sink joins the denominator and the returned LSE
(base 2). FP8 caches dequantize as `e4m3 * k_scale` / `* v_scale`.

Every case uses fresh random data, shuffled pages, NaN in every cache slot no request reads
(the unused tail of last pages, spare pages) and NaN-poisoned `out` / `lse` buffers.
"""

from __future__ import annotations

import math
import os

import pytest
import torch

from pagedattn import InvalidArgumentError
from pagedattn.compat import UnsupportedFeatureError
from pagedattn.compat.flashinfer import (
    BatchDecodeWithPagedKVCacheWrapper,
    BatchPrefillWithPagedKVCacheWrapper,
)
from pagedattn.testing import BF16_TOL, assert_close

# The Triton backend on these CPU tensors runs in the interpreter, which conftest turns on only
# without CUDA (tests/test_compat_edge_cases.py's `gpu` duplicates cover the CUDA kernels).
BACKENDS = [
    "reference",
    pytest.param(
        "triton",
        marks=pytest.mark.skipif(
            os.environ.get("TRITON_INTERPRET") != "1", reason="needs TRITON_INTERPRET=1"
        ),
    ),
]

BF16, F32, E4M3 = torch.bfloat16, torch.float32, torch.float8_e4m3fn
LSE_TOL = dict(abs_tol=2e-4, rel_tol=1e-5, cos_tol=1e-10)
K_SCALE, V_SCALE = 0.02, 0.03  # randn / scale stays well inside e4m3's range


# --------------------------------------------------------------------------------------------
# Test data: a paged cache in FlashInfer's layout
# --------------------------------------------------------------------------------------------
class Case:
    """A random paged KV cache and page table (FlashInfer's CSR form)."""

    def __init__(
        self,
        gen: torch.Generator,
        kv_lens: list[int],
        *,
        page_size: int,
        h_kv: int,
        d_qk: int,
        d_vo: int | None = None,
        layout: str = "NHD",
        kv_dtype: torch.dtype = BF16,
        extra_pages: int = 3,
    ) -> None:
        d_vo = d_qk if d_vo is None else d_vo
        self.layout, self.page_size, self.kv_lens = layout, page_size, kv_lens
        self.h_kv, self.d_qk = h_kv, d_qk
        n_pages = [-(-n // page_size) for n in kv_lens]
        total = sum(n_pages) + extra_pages
        perm = torch.randperm(total, generator=gen)
        self.indptr = torch.tensor(
            [0, *torch.tensor(n_pages).cumsum(0).tolist()], dtype=torch.int32
        )
        self.indices = perm[: sum(n_pages)].to(torch.int32)
        self.last_page_len = torch.tensor(
            [n - (p - 1) * page_size if p else 0 for n, p in zip(kv_lens, n_pages)],
            dtype=torch.int32,
        )
        used = torch.zeros(total, page_size, dtype=torch.bool)
        for b, n in enumerate(kv_lens):
            pages = self.indices[self.indptr[b] : self.indptr[b + 1]].long()
            t = torch.arange(n)
            used[pages[t // page_size], t % page_size] = True
        caches = []
        for d, scale in ((d_qk, K_SCALE), (d_vo, V_SCALE)):
            x = torch.randn(total, page_size, h_kv, d, generator=gen)
            x[~used] = float("nan")  # every slot no request reads
            if kv_dtype == E4M3:
                x = (x * (0.5 / scale)).to(E4M3)  # |x| ~ 0.5 / scale * N(0, 1) < 448
            else:
                x = x.to(kv_dtype)
            if layout == "HND":
                x = x.transpose(1, 2).contiguous()
            caches.append(x)
        self.k_cache, self.v_cache = caches
        self.num_pages = total

    def plan_args(self, h_qo: int) -> tuple:
        """plan()'s positional arguments from the page table on: indptr, indices,
        last_page_len, num_qo_heads, num_kv_heads, head_dim (qk), page_size."""
        ps = self.page_size
        return self.indptr, self.indices, self.last_page_len, h_qo, self.h_kv, self.d_qk, ps

    def single(self) -> torch.Tensor:
        """[P, 2, ...] (needs d_qk == d_vo)."""
        return torch.stack([self.k_cache, self.v_cache], dim=1)

    def tokens(self, b: int, which: str, scale: float) -> torch.Tensor:
        """float64 [kv_len, h_kv, d] of request b, gathered from the page table."""
        c = self.k_cache if which == "k" else self.v_cache
        c = c.double() * scale
        if self.layout == "HND":
            c = c.transpose(1, 2)  # -> [P, page, h, d]
        pages = self.indices[self.indptr[b] : self.indptr[b + 1]].long()
        t = torch.arange(self.kv_lens[b])
        return c[pages[t // self.page_size], t % self.page_size]


def oracle(
    case: Case,
    q: torch.Tensor,
    q_lens: list[int],
    *,
    causal: bool = True,
    window_left: int = -1,
    sm_scale: float | None = None,
    sinks: torch.Tensor | None = None,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
    custom: list[torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """FlashInfer semantics, float64 -> (out [total_q, h_qo, d_vo], lse base 2 [total_q, h_qo])."""
    total_q, h_qo, d = q.shape
    sm_scale = 1 / math.sqrt(d) if sm_scale is None else sm_scale
    outs, lses = [], []
    row = 0
    for b, ql in enumerate(q_lens):
        K, V = case.tokens(b, "k", k_scale), case.tokens(b, "v", v_scale)
        kv = K.shape[0]
        g = h_qo // K.shape[1]
        K, V = K.repeat_interleave(g, dim=1), V.repeat_interleave(g, dim=1)  # [kv, h_qo, d]
        for i in range(ql):
            p = kv - ql + i
            j = torch.arange(kv)
            vis = torch.ones(kv, dtype=torch.bool)
            if causal and custom is None:
                vis &= j <= p
            if window_left >= 0:
                vis &= j >= p - window_left
            if custom is not None:
                vis &= custom[b][i]
            qi = q[row + i].double()  # [h_qo, d]
            s = torch.einsum("hd,jhd->hj", qi, K[vis]) * sm_scale  # [h_qo, n_vis]
            terms = s if sinks is None else torch.cat([s, sinks.double()[:, None]], dim=1)
            if terms.shape[1] == 0:
                outs.append(torch.zeros(h_qo, V.shape[-1], dtype=torch.float64))
                lses.append(torch.full((h_qo,), -math.inf, dtype=torch.float64))
                continue
            lse = torch.logsumexp(terms, dim=1)  # [h_qo]
            w = torch.exp(s - lse[:, None])
            outs.append(torch.einsum("hj,jhd->hd", w, V[vis]))
            lses.append(lse / math.log(2))
        row += ql
    return torch.stack(outs), torch.stack(lses)


def poisoned(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    return torch.full(shape, float("nan"), dtype=dtype)


def workspace() -> torch.Tensor:
    return torch.empty(1024, dtype=torch.uint8)


# --------------------------------------------------------------------------------------------
# Decode
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("form", ["single", "tuple"])
@pytest.mark.parametrize("kv", ["bf16", "fp8"])
def test_decode(gen, layout, form, kv):
    kv_dtype = E4M3 if kv == "fp8" else BF16
    ps, h_kv, h_qo, d = 5, 2, 8, 32
    kv_lens = [1, 13, 37, 20]
    case = Case(gen, kv_lens, page_size=ps, h_kv=h_kv, d_qk=d, layout=layout, kv_dtype=kv_dtype)
    w = BatchDecodeWithPagedKVCacheWrapper(workspace(), layout)
    w.plan(
        *case.plan_args(h_qo),
        q_data_type=BF16,
        kv_data_type=kv_dtype,
    )
    q = torch.randn(len(kv_lens), h_qo, d, generator=gen).to(BF16)
    cache = case.single() if form == "single" else (case.k_cache, case.v_cache)
    scales = dict(k_scale=K_SCALE, v_scale=V_SCALE) if kv == "fp8" else {}
    out, lse = poisoned((4, h_qo, d), BF16), poisoned((4, h_qo), F32)
    o, l = w.run(q, cache, out=out, lse=lse, return_lse=True, **scales)
    assert o is out and l is lse
    ref_o, ref_l = oracle(case, q, [1] * 4, **scales)
    assert_close(o, ref_o, **BF16_TOL)
    assert_close(l, ref_l, **LSE_TOL, name="lse")
    # Padding entries of the lookup table hold the sentinel total_num_pages.
    lut = w._plan.lut
    assert bool((lut[w._plan.pad_mask] == case.num_pages).all())


@pytest.mark.parametrize("layout,ps", [("NHD", 4), ("HND", 4), ("HND", 1)])
def test_decode_window_sinks_gqa(gen, layout, ps):
    h_kv, h_qo, d = 1, 4, 16
    kv_lens = [3, 30, 17]
    window = 6  # keys p - 6 .. p: 7 keys
    case = Case(gen, kv_lens, page_size=ps, h_kv=h_kv, d_qk=d, layout=layout, kv_dtype=F32)
    sinks = torch.randn(h_qo, generator=gen)
    sinks[0] = float("inf")  # output 0 for head 0
    w = BatchDecodeWithPagedKVCacheWrapper(workspace(), layout)
    w.plan(
        *case.plan_args(h_qo),
        window_left=window,
        q_data_type="float32",
        sm_scale=0.3,
    )
    q = torch.randn(3, h_qo, d, generator=gen)
    o, l = w.run(q, case.single(), return_lse=True, sinks=sinks, window_left=window)
    ref_o, ref_l = oracle(case, q, [1] * 3, window_left=window, sinks=sinks, sm_scale=0.3)
    tol = dict(abs_tol=1e-5, rel_tol=1e-5, cos_tol=1e-12)
    assert_close(o, ref_o, **tol)
    assert bool((o[:, 0] == 0).all())
    assert_close(l, ref_l, **LSE_TOL, name="lse")
    # Natural-log LSE on request.
    _, l_ln = w.run(q, case.single(), return_lse=True, sinks=sinks, lse_base="ln")
    assert_close(l_ln, ref_l * math.log(2), **LSE_TOL, name="lse ln")


def test_decode_multi_token_and_tensor_scales(gen):
    """q_len_per_req > 1 (causal among the request's queries) with tensor FP8 scales."""
    ps, h_kv, h_qo, d, qlen = 8, 2, 4, 32, 3
    kv_lens = [3, 21, 40]
    case = Case(gen, kv_lens, page_size=ps, h_kv=h_kv, d_qk=d, kv_dtype=E4M3)
    w = BatchDecodeWithPagedKVCacheWrapper(workspace(), "NHD", use_tensor_cores=True)
    w.plan(
        *case.plan_args(h_qo),
        q_data_type=BF16,
        kv_data_type=E4M3,
        q_len_per_req=qlen,
    )
    q = torch.randn(3 * qlen, h_qo, d, generator=gen).to(BF16)
    o = w.run(
        q,
        (case.k_cache, case.v_cache),
        k_scale=torch.tensor([K_SCALE]),
        v_scale=torch.tensor(V_SCALE),
        q_scale=2.0,
    )
    ref_o, _ = oracle(
        case, q, [qlen] * 3, sm_scale=2.0 / math.sqrt(d), k_scale=K_SCALE, v_scale=V_SCALE
    )
    assert_close(o, ref_o, **BF16_TOL)


def test_decode_reads_live_cache_memory(gen):
    """run() views the caller's cache (no copy): later writes show up in the next run."""
    ps, d = 4, 16
    case = Case(gen, [9, 6], page_size=ps, h_kv=1, d_qk=d, kv_dtype=F32)
    w = BatchDecodeWithPagedKVCacheWrapper(workspace(), "NHD")
    w.plan(*case.plan_args(2), data_type=torch.float32)
    q = torch.randn(2, 2, d, generator=gen)
    cache = case.single()
    o1 = w.run(q, cache)
    cache[:, 1].mul_(2.0)  # scale every V in place
    o2 = w.run(q, cache)
    assert_close(o2, 2 * o1.double(), abs_tol=1e-6, rel_tol=1e-6, cos_tol=1e-12)


def test_decode_cuda_graph_buffers_refreshed_in_place(gen):
    """use_cuda_graph: plan() rewrites static buffers; a second plan gives fresh results."""
    ps, h_kv, h_qo, d, B = 4, 2, 4, 16, 3
    w = BatchDecodeWithPagedKVCacheWrapper(
        workspace(),
        "HND",
        use_cuda_graph=True,
        paged_kv_indptr_buffer=torch.empty(B + 1, dtype=torch.int32),
        paged_kv_indices_buffer=torch.empty(64, dtype=torch.int32),
        paged_kv_last_page_len_buffer=torch.empty(B, dtype=torch.int32),
    )
    assert w.is_cuda_graph_enabled
    ptrs = None
    for kv_lens in ([5, 12, 1], [30, 2, 17]):
        case = Case(gen, kv_lens, page_size=ps, h_kv=h_kv, d_qk=d, layout="HND", kv_dtype=F32)
        w.plan(*case.plan_args(h_qo), q_data_type=F32)
        p = w._plan
        now = (p.lut.data_ptr(), p.cache_lengths.data_ptr(), p.q_row_offsets.data_ptr())
        assert ptrs is None or now == ptrs
        ptrs = now
        q = torch.randn(B, h_qo, d, generator=gen)
        o = w.run(q, case.single())
        ref_o, _ = oracle(case, q, [1] * B)
        assert_close(o, ref_o, abs_tol=1e-5, rel_tol=1e-5, cos_tol=1e-12)
    bad = Case(gen, [3, 3], page_size=ps, h_kv=h_kv, d_qk=d, kv_dtype=F32)
    with pytest.raises(InvalidArgumentError, match="batch size"):
        w.plan(*bad.plan_args(h_qo), q_data_type=F32)


# --------------------------------------------------------------------------------------------
# Prefill
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("causal,window", [(True, -1), (True, 5), (False, -1), (False, 4)])
def test_prefill_masks(gen, layout, causal, window):
    ps, h_kv, h_qo, d = 6, 2, 4, 32
    kv_lens, q_lens = [7, 25, 16], [7, 9, 1]  # a full prompt, a chunk over a prefix, decode
    case = Case(gen, kv_lens, page_size=ps, h_kv=h_kv, d_qk=d, layout=layout)
    qo_indptr = torch.tensor([0, 7, 16, 17], dtype=torch.int32)
    w = BatchPrefillWithPagedKVCacheWrapper(workspace(), layout)
    w.plan(
        qo_indptr,
        *case.plan_args(h_qo),
        causal=causal,
        window_left=window,
        q_data_type=BF16,
    )
    q = torch.randn(17, h_qo, d, generator=gen).to(BF16)
    out = poisoned((17, h_qo, d), BF16)
    o, l = w.run_return_lse(q, case.single(), out=out)
    ref_o, ref_l = oracle(case, q, q_lens, causal=causal, window_left=window)
    assert_close(o, ref_o, **BF16_TOL)
    assert_close(l, ref_l, **LSE_TOL, name="lse")


@pytest.mark.parametrize("packed", [False, True])
def test_prefill_custom_mask_and_head_dim_vo(gen, packed):
    """custom_mask (bool or bit-packed little-endian per request) replaces causal; a tuple
    cache may carry a V head dim different from K's; sinks and FP8."""
    ps, h_kv, h_qo, d_qk, d_vo = 4, 1, 2, 32, 16
    kv_lens, q_lens = [10, 6], [4, 6]
    case = Case(gen, kv_lens, page_size=ps, h_kv=h_kv, d_qk=d_qk, d_vo=d_vo, kv_dtype=E4M3)
    masks = [torch.rand(ql, kl, generator=gen) < 0.6 for ql, kl in zip(q_lens, kv_lens)]
    masks[1][2] = False  # a query that sees no key: output 0
    flat = torch.cat([m.flatten() for m in masks])
    kwargs = {}
    if packed:
        segs = []
        for m in masks:
            bits = m.flatten().to(torch.int32)
            bits = torch.cat([bits, bits.new_zeros(-bits.numel() % 8)]).view(-1, 8)
            segs.append((bits << torch.arange(8)).sum(1).to(torch.uint8))
        kwargs["packed_custom_mask"] = torch.cat(segs)
    else:
        kwargs["custom_mask"] = flat
    w = BatchPrefillWithPagedKVCacheWrapper(workspace(), "NHD")
    w.plan(
        torch.tensor([0, 4, 10], dtype=torch.int32),
        *case.plan_args(h_qo),
        head_dim_vo=d_vo,
        causal=True,  # ignored with a custom mask
        q_data_type=BF16,
        kv_data_type=E4M3,
        o_data_type=torch.float32,
        **kwargs,
    )
    q = torch.randn(10, h_qo, d_qk, generator=gen).to(BF16)
    sinks = torch.randn(h_qo, generator=gen)
    out = poisoned((10, h_qo, d_vo), F32)
    o, l = w.run(
        q,
        (case.k_cache, case.v_cache),
        k_scale=K_SCALE,
        v_scale=V_SCALE,
        sinks=sinks,
        out=out,
        return_lse=True,
    )
    assert o is out
    ref_o, ref_l = oracle(
        case, q, q_lens, custom=masks, sinks=sinks, k_scale=K_SCALE, v_scale=V_SCALE
    )
    assert_close(o, ref_o, **BF16_TOL)  # computed in bf16 (q's dtype), returned as float32
    assert bool((o[4 + 2] == 0).all())
    assert_close(l, ref_l, **LSE_TOL, name="lse")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    "causal,window,custom",
    [(True, -1, False), (True, 2, False), (False, 3, False), (True, -1, True)],
)
def test_prefill_requests_shorter_than_their_queries(gen, backend, causal, window, custom):
    """As FlashInfer: a request may hold fewer KV tokens than queries (an empty one too). Its
    query i sits at kv_len - q_len + i, so causal queries before position 0 see no key (out 0,
    LSE -inf); without the causal mask every query sees the kv_len keys. The kernels take the
    negative cache length; the reference runs the rows that see a key."""
    ps, h_kv, h_qo, d = 4, 1, 2, 16
    kv_lens, q_lens = [2, 0, 5, 3], [4, 2, 5, 1]
    case = Case(gen, kv_lens, page_size=ps, h_kv=h_kv, d_qk=d, kv_dtype=F32)
    masks = None
    kwargs = {}
    if custom:
        masks = [torch.rand(ql, kl, generator=gen) < 0.7 for ql, kl in zip(q_lens, kv_lens)]
        kwargs["custom_mask"] = torch.cat([m.flatten() for m in masks])
    w = BatchPrefillWithPagedKVCacheWrapper(workspace(), "NHD", pagedattn_backend=backend)
    w.plan(
        torch.tensor([0, 4, 6, 11, 12], dtype=torch.int32),
        *case.plan_args(h_qo),
        causal=causal,
        window_left=window,
        q_data_type=F32,
        **kwargs,
    )
    q = torch.randn(12, h_qo, d, generator=gen)
    sinks = torch.randn(h_qo, generator=gen)
    out, lse = poisoned((12, h_qo, d), F32), poisoned((12, h_qo), F32)
    o, l = w.run(q, case.single(), out=out, lse=lse, return_lse=True, sinks=sinks)
    ref_o, ref_l = oracle(
        case, q, q_lens, causal=causal, window_left=window, custom=masks, sinks=sinks
    )
    tol = dict(abs_tol=1e-5, rel_tol=1e-5, cos_tol=1e-12)
    assert_close(o, ref_o, **tol)
    assert_close(l, ref_l, **LSE_TOL, name="lse")
    assert bool((o[4:6] == 0).all())  # the empty request
    if causal and not custom:
        assert bool((o[:2] == 0).all())  # request 0's queries at positions -2, -1
    # Without a sink the empty request's LSE is -inf (FlashInfer's neutral element).
    _, l0 = w.run(q, case.single(), return_lse=True)
    assert bool((l0[4:6] == -math.inf).all())


@pytest.mark.parametrize("backend", BACKENDS)
def test_decode_empty_requests(gen, backend):
    """Decode with requests holding no KV token (0 pages, last_page_len 0): out 0, LSE -inf."""
    ps, h_kv, h_qo, d = 4, 2, 4, 16
    kv_lens = [0, 9, 0]
    case = Case(gen, kv_lens, page_size=ps, h_kv=h_kv, d_qk=d, kv_dtype=BF16)
    w = BatchDecodeWithPagedKVCacheWrapper(workspace(), "NHD", pagedattn_backend=backend)
    w.plan(*case.plan_args(h_qo), q_data_type=BF16)
    q = torch.randn(3, h_qo, d, generator=gen).to(BF16)
    o, l = w.run(q, case.single(), out=poisoned((3, h_qo, d), BF16), return_lse=True)
    ref_o, ref_l = oracle(case, q, [1] * 3)
    assert_close(o, ref_o, **BF16_TOL)
    assert_close(l, ref_l, **LSE_TOL, name="lse")
    assert bool((o[0] == 0).all()) and bool((l[2] == -math.inf).all())


# --------------------------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------------------------
def test_unsupported_features_and_bad_arguments(gen):
    ps, d = 4, 16
    case = Case(gen, [5, 3], page_size=ps, h_kv=1, d_qk=d, kv_dtype=F32)
    args = case.plan_args(2)
    w = BatchDecodeWithPagedKVCacheWrapper(workspace(), "NHD")
    q = torch.randn(2, 2, d, generator=gen)
    with pytest.raises(InvalidArgumentError, match="plan"):
        w.run(q, case.single())
    with pytest.raises(UnsupportedFeatureError, match="logits_soft_cap"):
        w.plan(*args, logits_soft_cap=30.0, q_data_type=F32)
    with pytest.raises(NotImplementedError, match="pos_encoding_mode"):
        w.plan(*args, pos_encoding_mode="ROPE_LLAMA", q_data_type=F32)
    with pytest.raises(UnsupportedFeatureError, match="e5m2"):
        w.plan(*args, q_data_type=BF16, kv_data_type=torch.float8_e5m2)
    with pytest.raises(InvalidArgumentError, match="kv_layout"):
        BatchDecodeWithPagedKVCacheWrapper(workspace(), "NDH")
    w.plan(*args, q_data_type=F32, window_left=3)
    with pytest.raises(InvalidArgumentError, match="window_left"):
        w.run(q, case.single(), window_left=2)
    with pytest.raises(InvalidArgumentError, match="q"):
        w.run(q.to(BF16), case.single())
    with pytest.raises(InvalidArgumentError, match="page_size"):
        w.run(q, case.single()[:, :, :2])
    with pytest.raises(UnsupportedFeatureError, match="kv_cache_sf"):
        w.run(q, case.single(), kv_cache_sf=case.k_cache)
    with pytest.raises(UnsupportedFeatureError, match="float"):
        w.run(q, case.single(), k_scale=torch.tensor(2.0))  # tensor scale, non-FP8 cache
    pw = BatchPrefillWithPagedKVCacheWrapper(workspace(), "NHD")
    with pytest.raises(InvalidArgumentError, match="custom_mask"):
        pw.plan(
            torch.tensor([0, 1, 2], dtype=torch.int32),
            *args,
            custom_mask=torch.ones(3, dtype=torch.bool),
            q_data_type=F32,
        )
