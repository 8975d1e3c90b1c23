"""`pagedattn.ops.mha.mha` (reference backend) against a float64 loop oracle.

Every case uses fresh random data, caches from `make_paged_cache` (shuffled pages, sentinel ids
in unused lookup-table columns, NaN in every unreferenced slot) or non-paged buffers padded with
NaN, and NaN-poisoned output buffers. The oracle below is written independently of the library:
it reads the K/V it wrote (dequantized in float64 for FP8) and applies the mask, sink and
softmax one query row at a time.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pagedattn import (
    ContinuousBatchingOperand,
    DenseOperand,
    InvalidArgumentError,
    KVCacheParams,
    KVQuantConfig,
    PagedOperand,
    RaggedOperand,
)
from pagedattn.fp8 import quantize_blockwise, quantize_per_tensor
from pagedattn.ops import masks
from pagedattn.ops.mha import mha, mha_reference
from pagedattn.testing import BF16_TOL, assert_close, make_paged_cache, poison_, ragged_offsets

BF16, F32 = torch.bfloat16, torch.float32
LAYER = 1  # of 2 layers: catches layer-stride mistakes
# float32 outputs: the reference accumulates in float32, the oracle in float64; errors are a few
# float32 ulps of values of order 1 (sums of <= 100 terms).
F32_TOL = dict(abs_tol=2e-5, rel_tol=1e-4, cos_tol=1e-10)
# LSE in float32: |lse| is O(1..10); log/exp/sum rounding stays far below 1e-4.
LSE_TOL = dict(abs_tol=1e-4, rel_tol=1e-5, cos_tol=1e-10)

# A mixed batch: fresh prefill, chunked prefill over a prefix, decode, and a request with no
# query this step (only its cached prefix exists).
CACHE_LENS = [0, 5, 11, 23, 9]
NEW_TOKENS = [7, 4, 1, 1, 0]


def tol_for(dtype: torch.dtype) -> dict:
    return BF16_TOL if dtype == BF16 else F32_TOL


# --------------------------------------------------------------------------------------------
# Oracle
# --------------------------------------------------------------------------------------------
def visible(mask: masks.Mask, row: int, qp: int, j: int) -> bool:
    """Is key position j visible to the query at absolute position qp (global row `row`)?"""
    kind = mask.kind
    if kind == "null":
        return True
    if kind == "causal":
        return j <= qp
    if kind == "sliding_window_causal":
        return qp - mask.window < j <= qp
    if kind == "sliding_window_noncausal":
        return abs(qp - j) < mask.window
    if kind == "chunked_causal":
        return j <= qp and j // mask.chunk == qp // mask.chunk
    assert kind == "tensor"
    t = mask.tensor
    return j < t.shape[1] and bool(t[row, j])


def oracle(q, ks, vs, cache_lens, offsets, mask, scale=None, sinks=None):
    """float64 attention. ks[b], vs[b]: [n_b, h_kv, d] float64 keys/values of request b
    (n_b = cache_len + q_len). Returns (out [total_q, h_q, d_v], lse [total_q, h_q])."""
    total_q, h_q, d = q.shape
    h_kv, d_v = ks[0].shape[1], vs[0].shape[2]
    kv_head = torch.arange(h_q) // (h_q // h_kv)
    scale = 1 / math.sqrt(d) if scale is None else scale
    q64 = q.double()
    out = torch.zeros(total_q, h_q, d_v, dtype=torch.float64)
    lse = torch.full((total_q, h_q), -math.inf, dtype=torch.float64)
    for b in range(len(offsets) - 1):
        for i in range(offsets[b + 1] - offsets[b]):
            row, qp = offsets[b] + i, cache_lens[b] + i
            js = [j for j in range(cache_lens[b] + offsets[b + 1] - offsets[b])]
            js = [j for j in js if visible(mask, row, qp, j)]
            if not js:
                continue
            kk = ks[b][js][:, kv_head]  # [nj, h_q, d]
            vv = vs[b][js][:, kv_head]
            s = torch.einsum("jhd,hd->hj", kk, q64[row]) * scale
            m = s.max(dim=1, keepdim=True).values
            e = torch.exp(s - m)
            den = e.sum(dim=1)
            lse[row] = m[:, 0] + torch.log(den)
            if sinks is not None:
                den = den + torch.exp(sinks.double() - m[:, 0])  # +inf sink: den = inf
            out[row] = torch.einsum("hj,jhd->hd", e, vv) / den[:, None]
    return out, lse


# --------------------------------------------------------------------------------------------
# Cache builders (independent addressing: page = lut[b, t // page_size], slot t % page_size)
# --------------------------------------------------------------------------------------------
def encode(x: torch.Tensor, params: KVCacheParams, per_tensor_scale: float | None):
    """Logical x [n, h, d] -> (stored rows, stored scales or None, float64 dequantized)."""
    f = params.quant_format
    if f is None:
        stored = x.to(params.dtype)
        return stored, None, stored.double()
    if f == "blockwise":
        G = params.scale_granularity
        raw, sc = quantize_blockwise(x.float(), G, params.scale_dtype)
        deq = raw.double() * sc.double().repeat_interleave(G, dim=-1)
        return raw, sc, deq
    assert f == "per_tensor"
    raw = quantize_per_tensor(x.float(), per_tensor_scale)
    return raw, None, raw.double() * per_tensor_scale


def build_paged(
    page_size,
    h_kv,
    d,
    cache_lens,
    new_tokens,
    *,
    dtype=BF16,
    quant=None,
):
    """A paged cache with request b's K/V written at positions [0, cache_len + new).
    Returns (k operand, v operand, ks64, vs64) with ks64[b]: [n_b, h_kv, d] float64."""
    params = KVCacheParams(
        dtype, num_layers=2, n_kv_heads=h_kv, head_dim=d, page_size=page_size, quantization=quant
    )
    cache = make_paged_cache(params, cache_lens, new_tokens)
    inp = cache.inputs
    lut = inp.lookup_table
    ks, vs = [], []
    for kv, store in ((0, ks), (1, vs)):
        scale = None
        if params.quant_format == "per_tensor":
            scale = float(torch.rand(()) * 0.01 + 0.025)  # |x| <~ 10 -> |raw| <~ 400
            inp.kv_scales[kv, LAYER] = scale
        for b, n in enumerate(cache.seq_lens):
            x = torch.randn(n, h_kv, d) * (2.0 if kv == 0 else 1.0)  # scores of std ~2
            raw, sc, deq = encode(x, params, scale)
            for t in range(n):
                page, slot = int(lut[b, t // page_size]), t % page_size
                inp.kv_blocks[page, kv, LAYER, slot] = raw[t]
                if sc is not None:
                    inp.kv_scales[page, kv, LAYER, slot] = sc[t]
            store.append(deq)
    k = PagedOperand(inp, params, LAYER, "k")
    v = PagedOperand(inp, params, LAYER, "v")
    return k, v, ks, vs


def make_q(offsets, h_q, d, dtype=BF16):
    return torch.randn(offsets[-1], h_q, d).to(dtype)


def run(q, k, v, offsets, **kw):
    """mha through the public API into a poisoned buffer; returns (out, lse)."""
    out = poison_(torch.empty(q.shape[0], q.shape[1], v.head_dim, dtype=q.dtype))
    offs = torch.tensor(offsets, dtype=torch.int32)
    res, lse = mha(q, k, v, offs, out=out, return_lse=True, **kw)
    assert res is out
    return res, lse


def lens_to_offsets(lens):
    return ragged_offsets(lens).tolist()


def check_against_oracle(q, k, v, ks, vs, cache_lens, offsets, mask=None, sinks=None, **kw):
    out, lse = run(q, k, v, offsets, mask=mask, sinks=sinks, **kw)
    ref_out, ref_lse = oracle(
        q, ks, vs, cache_lens, offsets, mask or masks.causal(), kw.get("scale"), sinks
    )
    assert_close(out, ref_out, **tol_for(q.dtype), name="out")
    assert_close(lse, ref_lse, **LSE_TOL, name="lse")
    return out, lse


# --------------------------------------------------------------------------------------------
# Shapes: page sizes, GQA ratios (and MQA), head dims; chunked prefill + decode in one batch
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "page_size,h_q,h_kv,d",
    [
        (1, 4, 4, 64),  # MHA
        (3, 8, 2, 96),  # GQA 4
        (16, 16, 2, 128),  # GQA 8
        (3, 8, 1, 64),  # MQA
        (16, 4, 1, 96),  # MQA, d 96
        (1, 8, 1, 128),  # MQA, page 1
    ],
)
def test_shapes_chunked_prefill_and_decode(page_size, h_q, h_kv, d):
    k, v, ks, vs = build_paged(page_size, h_kv, d, CACHE_LENS, NEW_TOKENS)
    offsets = lens_to_offsets(NEW_TOKENS)
    q = make_q(offsets, h_q, d)
    check_against_oracle(q, k, v, ks, vs, CACHE_LENS, offsets)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_other_dtypes(dtype):
    k, v, ks, vs = build_paged(3, 2, 64, CACHE_LENS, NEW_TOKENS, dtype=dtype)
    offsets = lens_to_offsets(NEW_TOKENS)
    q = make_q(offsets, 8, 64, dtype)
    out, _ = run(q, k, v, offsets)
    ref, _ = oracle(q, ks, vs, CACHE_LENS, offsets, masks.causal())
    assert out.dtype == dtype
    # fp16 output rounding: 2^-11 relative.
    tol = F32_TOL if dtype == torch.float32 else dict(abs_tol=2e-4, rel_tol=2e-3, cos_tol=1e-6)
    assert_close(out, ref, **tol)


def test_explicit_scale_and_default_mask_is_causal():
    k, v, ks, vs = build_paged(3, 2, 64, CACHE_LENS, NEW_TOKENS, dtype=F32)
    offsets = lens_to_offsets(NEW_TOKENS)
    q = make_q(offsets, 4, 64, F32)
    out_default, _ = run(q, k, v, offsets, scale=0.37)
    out_causal, _ = run(q, k, v, offsets, scale=0.37, mask=masks.causal())
    torch.testing.assert_close(out_default, out_causal, rtol=0, atol=0)
    check_against_oracle(q, k, v, ks, vs, CACHE_LENS, offsets, scale=0.37)


# --------------------------------------------------------------------------------------------
# Masks
# --------------------------------------------------------------------------------------------
def _tensor_mask(total_q: int, max_keys: int) -> masks.Mask:
    t = torch.rand(total_q, max_keys) < 0.6
    t[0] = False  # a query that sees nothing: out 0, lse -inf
    return masks.tensor_mask(t)


MASKS = {
    "null": lambda tq: masks.null(),
    "causal": lambda tq: masks.causal(),
    "sliding_window_causal_1": lambda tq: masks.sliding_window_causal(1),
    "sliding_window_causal_4": lambda tq: masks.sliding_window_causal(4),
    "sliding_window_noncausal_3": lambda tq: masks.sliding_window_noncausal(3),
    "chunked_causal_5": lambda tq: masks.chunked_causal(5),
    # max_keys (20) shorter than the longest request (24 keys): keys past it are masked
    "tensor": lambda tq: _tensor_mask(tq, 20),
}


@pytest.mark.parametrize("name", list(MASKS))
@pytest.mark.parametrize("dtype", [BF16, F32])
def test_masks(name, dtype):
    k, v, ks, vs = build_paged(3, 2, 64, CACHE_LENS, NEW_TOKENS, dtype=dtype)
    offsets = lens_to_offsets(NEW_TOKENS)
    q = make_q(offsets, 8, 64, dtype)
    mask = MASKS[name](offsets[-1])
    out, lse = check_against_oracle(q, k, v, ks, vs, CACHE_LENS, offsets, mask=mask)
    if name == "tensor":
        assert torch.all(out[0] == 0) and torch.all(lse[0] == -math.inf)


# --------------------------------------------------------------------------------------------
# Sinks
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "mask",
    [masks.causal(), masks.sliding_window_causal(3), _tensor_mask(13, 24)],
    ids=["causal", "swa3", "tensor"],
)
def test_sinks(mask):
    h_q = 8
    k, v, ks, vs = build_paged(16, 2, 64, CACHE_LENS, NEW_TOKENS)
    offsets = lens_to_offsets(NEW_TOKENS)
    assert offsets[-1] == 13
    q = make_q(offsets, h_q, 64)
    sinks = torch.randn(h_q) * 2
    sinks[1] = math.inf  # output 0, LSE unaffected
    sinks[2] = -math.inf  # same as no sink
    sinks[3] = 30.0  # dominates the denominator
    out, lse = check_against_oracle(q, k, v, ks, vs, CACHE_LENS, offsets, mask=mask, sinks=sinks)
    assert torch.all(out[:, 1] == 0)
    out_nosink, lse_nosink = run(q, k, v, offsets, mask=mask)
    torch.testing.assert_close(out[:, 2], out_nosink[:, 2], rtol=0, atol=0)
    torch.testing.assert_close(lse, lse_nosink, rtol=0, atol=0)  # the sink is not in the LSE


# --------------------------------------------------------------------------------------------
# FP8 caches (oracle on the dequantized cache)
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "quant,d",
    [
        (KVQuantConfig.blockwise(32), 64),
        (KVQuantConfig.blockwise(32, torch.float8_e8m0fnu), 128),
        (KVQuantConfig.per_token(), 96),
        (KVQuantConfig.per_token(torch.float8_e8m0fnu), 64),
        (KVQuantConfig.per_tensor(), 128),
    ],
    ids=["block32-f32", "block32-e8m0", "token-f32", "token-e8m0", "tensor"],
)
@pytest.mark.parametrize("page_size", [1, 16])
def test_fp8(quant, d, page_size):
    k, v, ks, vs = build_paged(page_size, 2, d, CACHE_LENS, NEW_TOKENS, quant=quant)
    assert k.quantization_enabled and k.dtype == torch.float8_e4m3fn
    offsets = lens_to_offsets(NEW_TOKENS)
    q = make_q(offsets, 8, d)
    sinks = torch.randn(8)
    check_against_oracle(
        q, k, v, ks, vs, CACHE_LENS, offsets, sinks=sinks, mask=masks.sliding_window_causal(9)
    )


# --------------------------------------------------------------------------------------------
# Non-paged operands (NaN everywhere no request points to)
# --------------------------------------------------------------------------------------------
def _rand_kv(n, h, d):
    return torch.randn(n, h, d) * 0.7


def _dense_kv(S, h_kv, d, d_v, dtype=torch.float32):
    """Dense K/V operands [batch, S, h_kv, d / d_v] (NaN past each request's tokens) over
    CACHE_LENS + NEW_TOKENS, and their tokens in float64 per request."""
    seq = [c + n for c, n in zip(CACHE_LENS, NEW_TOKENS)]
    kd = torch.full((len(seq), S, h_kv, d), math.nan, dtype=dtype)
    vd = torch.full((len(seq), S, h_kv, d_v), math.nan, dtype=dtype)
    ks, vs = [], []
    for b, n in enumerate(seq):
        kd[b, :n], vd[b, :n] = _rand_kv(n, h_kv, d), _rand_kv(n, h_kv, d_v)
        ks.append(kd[b, :n].double())
        vs.append(vd[b, :n].double())
    cl = torch.tensor(CACHE_LENS, dtype=torch.int32)
    return DenseOperand(kd, cl), DenseOperand(vd, cl), ks, vs


def test_dense_operand():
    h_kv, d, S = 2, 64, 30
    k, v, ks, vs = _dense_kv(S, h_kv, d, d, BF16)
    offsets = lens_to_offsets(NEW_TOKENS)
    q = make_q(offsets, 8, d)
    check_against_oracle(q, k, v, ks, vs, CACHE_LENS, offsets, num_partitions=3)


def test_dense_operand_fp8_blockwise():
    h_kv, d, S, G = 2, 64, 28, 32
    seq = [c + n for c, n in zip(CACHE_LENS, NEW_TOKENS)]
    ops, ref = [], []
    for _ in range(2):
        raw = torch.full((len(seq), S, h_kv, d), math.nan).to(torch.float8_e4m3fn)
        sc = torch.full((len(seq), S, h_kv, d // G), math.nan)
        deq = []
        for b, n in enumerate(seq):
            r, s = quantize_blockwise(_rand_kv(n, h_kv, d), G)
            raw[b, :n], sc[b, :n] = r, s
            deq.append(r.double() * s.double().repeat_interleave(G, dim=-1))
        ops.append(DenseOperand(raw, torch.tensor(CACHE_LENS, dtype=torch.int32), sc, G))
        ref.append(deq)
    offsets = lens_to_offsets(NEW_TOKENS)
    q = make_q(offsets, 4, d)
    check_against_oracle(q, ops[0], ops[1], ref[0], ref[1], CACHE_LENS, offsets)


def test_strided_q_and_value_head_dim_differs():
    """q as a slice of a fused QKV projection (non-contiguous), and d_v != d_qk."""
    h_q, h_kv, d, d_v, S = 4, 2, 64, 32, 26
    k, v, ks, vs = _dense_kv(S, h_kv, d, d_v)
    offsets = lens_to_offsets(NEW_TOKENS)
    qkv = torch.randn(offsets[-1], (h_q + 2 * h_kv) * d)
    q = qkv[:, : h_q * d].view(-1, h_q, d)
    assert not q.is_contiguous()
    out, _ = check_against_oracle(q, k, v, ks, vs, CACHE_LENS, offsets, num_partitions=2)
    assert out.shape == (offsets[-1], h_q, d_v)


def test_continuous_batching_operand():
    h_kv, d, S, M = 1, 96, 32, 7
    seq = [c + n for c, n in zip(CACHE_LENS, NEW_TOKENS)]
    slots = torch.tensor([5, 0, 3, 6, 2], dtype=torch.int32)  # unused slots 1, 4: all NaN
    kc = torch.full((M, S, h_kv, d), math.nan, dtype=BF16)
    vc = torch.full_like(kc, math.nan)
    ks, vs = [], []
    for b, n in enumerate(seq):
        s = int(slots[b])
        kc[s, :n], vc[s, :n] = _rand_kv(n, h_kv, d), _rand_kv(n, h_kv, d)
        ks.append(kc[s, :n].double())
        vs.append(vc[s, :n].double())
    cl = torch.tensor(CACHE_LENS, dtype=torch.int32)
    k, v = ContinuousBatchingOperand(kc, slots, cl), ContinuousBatchingOperand(vc, slots, cl)
    offsets = lens_to_offsets(NEW_TOKENS)
    q = make_q(offsets, 8, d)
    check_against_oracle(q, k, v, ks, vs, CACHE_LENS, offsets, mask=masks.chunked_causal(6))


@pytest.mark.parametrize("mask", [masks.causal(), masks.null()], ids=["causal", "null"])
def test_ragged_operand(mask):
    """Prefill K/V passed directly; rows between requests are NaN gaps."""
    h_kv, d = 4, 64
    lens = [6, 1, 9, 4]
    starts, pos = [], 0
    for n in lens:
        starts.append(pos)
        pos += n + 3  # 3 NaN rows after each request
    x = {kv: torch.full((pos, h_kv, d), math.nan, dtype=BF16) for kv in "kv"}
    ks, vs = [], []
    for b, n in enumerate(lens):
        for kv, store in (("k", ks), ("v", vs)):
            x[kv][starts[b] : starts[b] + n] = _rand_kv(n, h_kv, d)
            store.append(x[kv][starts[b] : starts[b] + n].double())
    row_offsets = torch.tensor(starts + [pos], dtype=torch.int32)
    k, v = RaggedOperand(x["k"], row_offsets), RaggedOperand(x["v"], row_offsets)
    offsets = lens_to_offsets(lens)
    q = make_q(offsets, 8, d)
    check_against_oracle(q, k, v, ks, vs, [0] * len(lens), offsets, mask=mask, num_partitions=2)


# --------------------------------------------------------------------------------------------
# Split-K
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "cache_lens,new_tokens",
    [([61, 3, 40, 17], [1, 1, 1, 1]), ([20, 0, 33], [5, 9, 2])],
    ids=["decode", "prefill"],
)
@pytest.mark.parametrize(
    "mask", [masks.causal(), masks.sliding_window_causal(5)], ids=["causal", "swa5"]
)
def test_split_k_invariance(cache_lens, new_tokens, mask):
    k, v, ks, vs = build_paged(3, 2, 64, cache_lens, new_tokens, dtype=F32)
    offsets = lens_to_offsets(new_tokens)
    q = make_q(offsets, 8, 64, F32)
    sinks = torch.randn(8)
    sinks[0] = math.inf
    results = {}
    for P in (1, 2, 7, 32):
        results[P] = check_against_oracle(
            q, k, v, ks, vs, cache_lens, offsets, mask=mask, sinks=sinks, num_partitions=P
        )
    base_out, base_lse = results[1]
    for P in (2, 7, 32):
        out, lse = results[P]
        torch.testing.assert_close(out, base_out, rtol=1e-5, atol=2e-6)
        torch.testing.assert_close(lse, base_lse, rtol=1e-6, atol=2e-6)
    # num_partitions=None is P = 1
    out_none, lse_none = run(q, k, v, offsets, mask=mask, sinks=sinks)
    torch.testing.assert_close(out_none, base_out, rtol=0, atol=0)
    torch.testing.assert_close(lse_none, base_lse, rtol=0, atol=0)


# --------------------------------------------------------------------------------------------
# Random property test over shapes, masks, partitions and page sizes
# --------------------------------------------------------------------------------------------
MASK_STRATEGY = st.one_of(
    st.just(masks.null()),
    st.just(masks.causal()),
    st.integers(1, 8).map(masks.sliding_window_causal),
    st.integers(1, 8).map(masks.sliding_window_noncausal),
    st.integers(1, 8).map(masks.chunked_causal),
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    page_size=st.sampled_from([1, 2, 3, 5, 16]),
    h_kv=st.sampled_from([1, 2]),
    group=st.sampled_from([1, 3, 4]),
    lens=st.lists(st.tuples(st.integers(0, 20), st.integers(0, 6)), min_size=1, max_size=4),
    mask=MASK_STRATEGY,
    P=st.one_of(st.none(), st.integers(1, 9)),
    with_sinks=st.booleans(),
)
def test_random_configs(page_size, h_kv, group, lens, mask, P, with_sinks):
    cache_lens = [c for c, _ in lens]
    new_tokens = [n for _, n in lens]
    k, v, ks, vs = build_paged(page_size, h_kv, 32, cache_lens, new_tokens, dtype=F32)
    offsets = lens_to_offsets(new_tokens)
    q = make_q(offsets, h_kv * group, 32, F32)
    sinks = torch.randn(h_kv * group) if with_sinks else None
    check_against_oracle(
        q, k, v, ks, vs, cache_lens, offsets, mask=mask, sinks=sinks, num_partitions=P
    )


# --------------------------------------------------------------------------------------------
# Edge cases, dispatch
# --------------------------------------------------------------------------------------------
def test_no_queries():
    k, v, _, _ = build_paged(3, 2, 64, [4, 7], [0, 0])
    q = torch.empty(0, 4, 64, dtype=BF16)
    out, lse = mha(q, k, v, ragged_offsets([0, 0]), return_lse=True)
    assert out.shape == (0, 4, 64) and lse.shape == (0, 4) and lse.dtype == torch.float32


def test_returns_out_only_by_default_and_reference_is_dispatched_on_cpu(monkeypatch):
    monkeypatch.delenv("PAGEDATTN_BACKEND", raising=False)
    k, v, _, _ = build_paged(3, 2, 64, CACHE_LENS, NEW_TOKENS)
    offs = ragged_offsets(NEW_TOKENS)
    q = make_q(offs.tolist(), 4, 64)
    res = mha(q, k, v, offs)
    assert isinstance(res, torch.Tensor) and res.shape == (13, 4, 64) and res.dtype == BF16
    direct = mha_reference(q, k, v, offs)
    torch.testing.assert_close(res, direct, rtol=0, atol=0)
    res2 = mha(q, k, v, offs, backend="reference")
    torch.testing.assert_close(res, res2, rtol=0, atol=0)


def test_triton_backend_refused_on_cpu_without_interpreter(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.delenv("PAGEDATTN_BACKEND", raising=False)
    k, v, _, _ = build_paged(3, 2, 64, [2], [1])
    q = make_q([0, 1], 2, 64)
    with pytest.raises(InvalidArgumentError, match="backend"):
        mha(q, k, v, ragged_offsets([1]), backend="triton")
    with pytest.raises(InvalidArgumentError, match="backend"):
        mha(q, k, v, ragged_offsets([1]), backend="cuda")


# --------------------------------------------------------------------------------------------
# Bad arguments
# --------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def good():
    k, v, _, _ = build_paged(3, 2, 64, [4, 6], [3, 1])
    return dict(q=torch.randn(4, 8, 64, dtype=BF16), k=k, v=v, offs=ragged_offsets([3, 1]))


def _call(good, **over):
    a = {**good, **over}
    kw = {n: a[n] for n in a if n not in ("q", "k", "v", "offs")}
    return mha(a["q"], a["k"], a["v"], a["offs"], **kw)


BAD = [
    ("q", dict(q=torch.randn(4, 8 * 64, dtype=BF16)), "q"),
    ("q_dtype", dict(q=torch.randn(4, 8, 64, dtype=torch.float64)), "q.dtype"),
    ("q_int", dict(q=torch.zeros(4, 8, 64, dtype=torch.int32)), "q.dtype"),
    ("q_not_tensor", dict(q=[[1.0]]), "q"),
    ("head_dim", dict(q=torch.randn(4, 8, 32, dtype=BF16)), "k"),
    ("heads_not_multiple", dict(q=torch.randn(4, 5, 64, dtype=BF16)), "q"),
    ("k_dtype", dict(q=torch.randn(4, 8, 64, dtype=torch.float16)), "k.dtype"),
    ("k_not_operand", dict(k=torch.randn(10, 2, 64)), "k"),
    ("offs_dtype", dict(offs=torch.tensor([0, 3, 4], dtype=torch.int64)), "q_row_offsets"),
    ("offs_shape", dict(offs=torch.tensor([0, 4], dtype=torch.int32)), "q_row_offsets"),
    ("offs_total", dict(offs=torch.tensor([0, 3, 5], dtype=torch.int32)), "q_row_offsets"),
    ("offs_decreasing", dict(offs=torch.tensor([0, 5, 4], dtype=torch.int32)), "q_row_offsets"),
    ("offs_start", dict(offs=torch.tensor([1, 3, 4], dtype=torch.int32)), "q_row_offsets"),
    ("mask_type", dict(mask="causal"), "mask"),
    ("mask_tensor_rows", dict(mask=masks.tensor_mask(torch.ones(3, 10, dtype=torch.bool))), "mask"),
    ("scale_neg", dict(scale=-1.0), "scale"),
    ("scale_nan", dict(scale=math.nan), "scale"),
    ("scale_tensor", dict(scale=torch.tensor(0.1)), "scale"),
    ("sinks_shape", dict(sinks=torch.zeros(2)), "sinks"),
    ("sinks_dtype", dict(sinks=torch.zeros(8, dtype=BF16)), "sinks"),
    ("partitions_zero", dict(num_partitions=0), "num_partitions"),
    ("partitions_float", dict(num_partitions=2.0), "num_partitions"),
    ("partitions_bool", dict(num_partitions=True), "num_partitions"),
    ("return_lse", dict(return_lse=1), "return_lse"),
    ("out_shape", dict(out=torch.empty(4, 8, 32, dtype=BF16)), "out"),
    ("out_dtype", dict(out=torch.empty(4, 8, 64, dtype=F32)), "out"),
    ("backend", dict(backend="cuda"), "backend"),
]


@pytest.mark.parametrize("over,match", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_arguments(good, over, match):
    with pytest.raises(InvalidArgumentError, match=match):
        _call(good, **over)


def test_bad_operands(good):
    k, v, _, _ = build_paged(3, 1, 64, [4, 6], [3, 1])
    with pytest.raises(InvalidArgumentError, match="^v"):
        _call(good, v=v)  # 1 head vs k's 2
    k3, v3, _, _ = build_paged(3, 2, 64, [4, 6, 1], [3, 1, 0])
    with pytest.raises(InvalidArgumentError, match="^v"):
        _call(good, v=v3)  # batch 3 vs 2
    with pytest.raises(InvalidArgumentError, match="q_row_offsets"):
        _call(good, k=k3, v=v3)  # offsets for batch 2
    mla = KVCacheParams(
        BF16, 1, 1, 576, 4, is_mla=True, num_q_heads=8, quantization=KVQuantConfig.flashmla_v32()
    )
    mc = make_paged_cache(mla, [2, 2], [3, 1])
    with pytest.raises(InvalidArgumentError, match="k.quant_format"):
        _call(good, k=PagedOperand(mc.inputs, mla, 0, "k"))


def test_keys_past_the_lookup_table(good):
    """Cache lengths that reach past a request's allocated pages are refused by name."""
    k, v, _, _ = build_paged(3, 2, 64, [4, 6], [3, 1])
    k.cache_lengths[0] = 100  # 103 keys > the table's reach
    with pytest.raises(InvalidArgumentError, match="^k"):
        _call(good, k=k, v=v)
    k2, v2, _, _ = build_paged(3, 2, 64, [4, 6], [3, 1])
    k2.cache_lengths[1] = 10  # 11 keys: the 4th column is an unused (sentinel) entry
    with pytest.raises(InvalidArgumentError, match="^k"):
        _call(good, k=k2, v=v2)
