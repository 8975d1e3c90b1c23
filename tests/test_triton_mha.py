"""Triton MHA kernels (`ops/mha/triton_*.py`) against a float64 oracle and `mha_reference`.

CPU runs go through the Triton interpreter (TRITON_INTERPRET=1, set before triton is imported)
at small shapes: they check indexing, masking, paging, FP8 dequantization, split-K and sinks.
Inputs are adversarial (DESIGN.md section 5): shuffled non-contiguous pages, sentinel page ids in
unused lookup-table columns, NaN in every slot no valid position points to, NaN-poisoned outputs.
GPU tests (`-m gpu`) repeat the checks at serving sizes and replay a captured CUDA graph with
refreshed lengths and page tables.

Tolerances. The decode path carries P (and float32-scaled blockwise K/V) as bf16 hi + lo pairs
through the MMAs, so it meets DESIGN.md's bf16 bounds (BF16_TOL). The prefill path rounds P to
bf16 before P @ V as FlashAttention does; at these tiny shapes (few keys, output values O(1))
that costs up to ~2^-9 of |v| absolutely, hence PREFILL_TOL; the same cases also run with
`hi_lo` forced on under BF16_TOL, which checks the prefill indexing tightly.
"""

from __future__ import annotations

import math
import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"  # CPU CI: before triton is imported


from pagedattn import (  # noqa: E402
    ContinuousBatchingOperand,
    DenseOperand,
    KVCacheParams,
    KVQuantConfig,
    PagedOperand,
    RaggedOperand,
)
from pagedattn.errors import InvalidArgumentError  # noqa: E402
from pagedattn.fp8 import quantize_blockwise, quantize_per_tensor  # noqa: E402
from pagedattn.ops import masks, offline  # noqa: E402
from pagedattn.ops.mha import mha  # noqa: E402
from pagedattn.ops.mha import selection as MS  # noqa: E402
from pagedattn.ops.mha import triton_mha as TM  # noqa: E402
from pagedattn.ops.mha.selection import MHATuning  # noqa: E402
from pagedattn.ops.mha.triton_mha import mha_triton  # noqa: E402
from pagedattn.ops.pdl import pdl_enabled  # noqa: E402
from pagedattn.testing import BF16_TOL, assert_close, make_paged_cache, poison_  # noqa: E402

BF16 = torch.bfloat16
E8M0 = torch.float8_e8m0fnu
LAYER = 1  # of 2 layers: catches layer-stride mistakes
PREFILL_TOL = dict(abs_tol=6e-3, rel_tol=2 / 128, cos_tol=3e-5)
LSE_TOL = dict(abs_tol=2e-4, rel_tol=1e-5, cos_tol=1e-9)
ON_GPU = torch.cuda.is_available()
DEV = "cuda" if ON_GPU else "cpu"


# --------------------------------------------------------------------------------------------
# Oracle and cache builders (independent of the kernels' addressing)
# --------------------------------------------------------------------------------------------
def oracle(q, ks, vs, cache_lens, offsets, mask, scale=None, sinks=None):
    """float64 attention; ks[b], vs[b]: [cache_len + q_len, h_kv, d] float64 of request b.
    Returns (out [total_q, h_q, d_v], lse [total_q, h_q])."""
    total_q, h_q, d = q.shape
    h_kv, d_v = ks[0].shape[1], vs[0].shape[2]
    heads = torch.arange(h_q) // (h_q // h_kv)
    if mask.kind == "tensor":
        mask = masks.tensor_mask(mask.tensor.cpu())
    scale = 1 / math.sqrt(d) if scale is None else scale
    out = torch.zeros(total_q, h_q, d_v, dtype=torch.float64)
    lse = torch.full((total_q, h_q), -math.inf, dtype=torch.float64)
    for b in range(len(offsets) - 1):
        s0, s1 = offsets[b], offsets[b + 1]
        if s1 == s0:
            continue
        n = cache_lens[b] + s1 - s0
        qp = cache_lens[b] + torch.arange(s1 - s0)[:, None]
        kp = torch.arange(n)[None, :]
        rows = torch.arange(s0, s1)[:, None]
        allowed = mask.allowed(qp, kp, rows.clamp(max=total_q - 1))
        s = torch.einsum("qhd,khd->hqk", q[s0:s1].double().cpu(), ks[b][:, heads]) * scale
        s = s.masked_fill(~allowed[None], -math.inf)
        m = s.amax(-1, keepdim=True)
        m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
        e = torch.exp(s - m)
        den = e.sum(-1)
        lse[s0:s1] = torch.where(den > 0, torch.log(den) + m[..., 0], -math.inf).T
        if sinks is not None:
            den = den + torch.exp(sinks.double().cpu()[:, None] - m[..., 0])
        o = torch.einsum("hqk,khd->qhd", e, vs[b][:, heads])
        out[s0:s1] = o / torch.where(den > 0, den, torch.ones_like(den)).T[..., None]
    return out, lse


def encode(x, fmt, G, scale_dtype, pt_scale):
    """Logical x [n, h, d] -> (stored rows, stored scales or None, float64 dequantized)."""
    if fmt is None:
        stored = x.to(BF16)
        return stored, None, stored.double()
    if fmt == "blockwise":
        raw, sc = quantize_blockwise(x, G, scale_dtype)
        return raw, sc, raw.double() * sc.double().repeat_interleave(G, dim=-1)
    raw = quantize_per_tensor(x, pt_scale)
    return raw, None, raw.double() * pt_scale


def build_paged(page_size, h_kv, d, cache_lens, q_lens, quant=None, gen=None):
    """Paged cache (2 layers, LAYER used) holding cache_len + q_len tokens per request.
    Returns (k_op, v_op, ks64, vs64)."""
    params = KVCacheParams(
        BF16, num_layers=2, n_kv_heads=h_kv, head_dim=d, page_size=page_size, quantization=quant
    )
    cache = make_paged_cache(params, cache_lens, q_lens, generator=gen, device=DEV)
    inp = cache.inputs
    lut = inp.lookup_table.cpu()
    fmt, G = params.quant_format, params.scale_granularity
    ks, vs = [], []
    for kv, store in ((0, ks), (1, vs)):
        pt = None
        if fmt == "per_tensor":
            pt = float(torch.rand((), generator=gen) * 0.01 + 0.02)
            inp.kv_scales[kv, LAYER] = pt
        for b, n in enumerate(cache.seq_lens):
            x = torch.randn(n, h_kv, d, generator=gen) * (2.0 if kv == 0 else 1.0)
            raw, sc, deq = encode(x, fmt, G, params.scale_dtype, pt)
            t = torch.arange(n)
            page, slot = lut[b, t // page_size].long(), t % page_size
            inp.kv_blocks[page.to(DEV), kv, LAYER, slot.to(DEV)] = raw.to(DEV)
            if sc is not None:  # through a byte view: CPU index_put has no e8m0 kernel
                dst = inp.kv_scales.view(torch.uint8) if sc.dtype == E8M0 else inp.kv_scales
                src = sc.view(torch.uint8) if sc.dtype == E8M0 else sc
                dst[page.to(DEV), kv, LAYER, slot.to(DEV)] = src.to(DEV)
            store.append(deq)
    return PagedOperand(inp, params, LAYER, "k"), PagedOperand(inp, params, LAYER, "v"), ks, vs


def offsets_of(q_lens):
    return [0, *torch.tensor(q_lens).cumsum(0).tolist()]


def call(q, k, v, offsets, **kw):
    """mha_triton into a NaN-poisoned buffer; returns (out, lse) on the CPU."""
    out = poison_(torch.empty(q.shape[0], q.shape[1], v.head_dim, dtype=q.dtype, device=DEV))
    offs = torch.tensor(offsets, dtype=torch.int32, device=DEV)
    res, lse = mha_triton(q, k, v, offs, out=out, return_lse=True, **kw)
    assert res is out
    return res.cpu(), lse.cpu()


def check(
    q, k, v, ks, vs, cache_lens, offsets, *, tol=BF16_TOL, lse_tol=LSE_TOL, mask=None,
    sinks=None, **kw,
):  # fmt: skip
    out, lse = call(q, k, v, offsets, mask=mask, sinks=sinks, **kw)
    ref, ref_lse = oracle(q, ks, vs, cache_lens, offsets, mask or masks.causal(), None, sinks)
    assert_close(out, ref, **tol, name="out")
    assert_close(lse, ref_lse, **lse_tol, name="lse")
    return out, lse


@pytest.fixture
def hi_lo_prefill():
    """The tuning of a prefill with P (and float32-scaled blockwise K/V) carried as hi + lo,
    for tight indexing checks under the bf16 bounds."""
    return MHATuning(prefill=dict(hi_lo=True, kv_lo=True))


def rand_q(n, h_q, d, gen):
    return torch.randn(n, h_q, d, generator=gen).to(BF16).to(DEV)


# --------------------------------------------------------------------------------------------
# Decode: page sizes x GQA ratios x head dims, split-K, sinks, LSE
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "page_size,group,d",
    [(1, 4, 64), (3, 1, 96), (16, 8, 128), (3, 8, 64), (16, 4, 96), (1, 1, 128)],
)
@pytest.mark.parametrize("parts", [1, 3])
def test_decode_shapes(page_size, group, d, parts, gen):
    h_kv = 2
    cache_lens = [0, 37, 5, 70]
    k, v, ks, vs = build_paged(page_size, h_kv, d, cache_lens, [1] * 4, gen=gen)
    q = rand_q(4, h_kv * group, d, gen)
    sinks = torch.randn(h_kv * group, generator=gen).to(DEV) if parts == 3 else None
    check(q, k, v, ks, vs, cache_lens, offsets_of([1] * 4), sinks=sinks, num_partitions=parts)


@pytest.mark.parametrize("parts", [1, 2, 5, 40])
def test_decode_split_invariance(parts, gen):
    """Any partition count gives the same result (40 > tiles: many empty partitions)."""
    cache_lens = [90, 3, 41]
    k, v, ks, vs = build_paged(16, 2, 64, cache_lens, [1] * 3, gen=gen)
    q = rand_q(3, 8, 64, gen)
    out, lse = check(q, k, v, ks, vs, cache_lens, offsets_of([1] * 3), num_partitions=parts)
    one, lse1 = call(q, k, v, offsets_of([1] * 3), num_partitions=1)
    assert_close(out, one, abs_tol=1e-2, rel_tol=2 / 128, cos_tol=1e-6)
    assert_close(lse, lse1, **LSE_TOL)


@pytest.mark.parametrize("parts", [1, 4])
def test_sinks_extremes(parts, gen):
    """+inf sink -> output 0; -inf sink -> no effect; LSE never includes the sink."""
    cache_lens = [20, 65]
    k, v, ks, vs = build_paged(3, 2, 64, cache_lens, [1, 1], gen=gen)
    q = rand_q(2, 8, 64, gen)
    sinks = torch.randn(8, generator=gen) * 3
    sinks[0], sinks[5] = math.inf, -math.inf
    out, _ = check(
        q, k, v, ks, vs, cache_lens, [0, 1, 2], sinks=sinks.to(DEV), num_partitions=parts
    )
    assert torch.equal(out[:, 0], torch.zeros_like(out[:, 0]))


def test_decode_path_ragged_fallback(gen):
    """total_q == batch without one query per request (q_lens 0, 2, 1): the decode kernel finds
    each row's request itself; an explicit max_q_len hint selects either path."""
    cache_lens, q_lens = [30, 12, 7], [0, 2, 1]
    k, v, ks, vs = build_paged(3, 2, 64, cache_lens, q_lens, gen=gen)
    q = rand_q(3, 8, 64, gen)
    offs = offsets_of(q_lens)
    check(q, k, v, ks, vs, cache_lens, offs, num_partitions=2)  # decode path (total_q == batch)
    check(q, k, v, ks, vs, cache_lens, offs, max_q_len=2, tol=PREFILL_TOL)  # prefill path


# --------------------------------------------------------------------------------------------
# Masks, on the decode path and on a mixed prefill/decode batch
# --------------------------------------------------------------------------------------------
def all_masks(total_q, max_keys, gen):
    t = torch.rand(total_q, max_keys, generator=gen) > 0.4
    t[0] = False  # a query that sees no key: output 0, LSE -inf
    return [
        masks.null(),
        masks.causal(),
        masks.sliding_window_causal(5),
        masks.sliding_window_noncausal(4),
        masks.chunked_causal(8),
        masks.tensor_mask(t.to(DEV)),
    ]


@pytest.mark.parametrize("mi", range(6))
def test_masks_decode(mi, gen):
    cache_lens = [33, 0, 17]
    k, v, ks, vs = build_paged(3, 1, 64, cache_lens, [1] * 3, gen=gen)
    q = rand_q(3, 4, 64, gen)
    mask = all_masks(3, 30, gen)[mi]
    sinks = torch.randn(4, generator=gen).to(DEV)
    check(q, k, v, ks, vs, cache_lens, [0, 1, 2, 3], mask=mask, sinks=sinks, num_partitions=2)


@pytest.mark.parametrize("mi", range(6))
def test_masks_mixed_batch(mi, gen, hi_lo_prefill):
    cache_lens, q_lens = [0, 9, 23, 5], [37, 6, 1, 0]
    k, v, ks, vs = build_paged(16, 2, 64, cache_lens, q_lens, gen=gen)
    offs = offsets_of(q_lens)
    q = rand_q(offs[-1], 4, 64, gen)
    mask = all_masks(offs[-1], 40, gen)[mi]
    check(q, k, v, ks, vs, cache_lens, offs, mask=mask, config=hi_lo_prefill)


# --------------------------------------------------------------------------------------------
# Chunked prefill (production numerics and hi/lo), head dims, GQA, sinks
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("page_size,h_q,h_kv,d", [(3, 8, 2, 96), (16, 8, 1, 128), (1, 4, 4, 64)])
def test_chunked_prefill(page_size, h_q, h_kv, d, gen):
    cache_lens, q_lens = [0, 40, 11], [70, 9, 1]
    k, v, ks, vs = build_paged(page_size, h_kv, d, cache_lens, q_lens, gen=gen)
    offs = offsets_of(q_lens)
    q = rand_q(offs[-1], h_q, d, gen)
    sinks = torch.randn(h_q, generator=gen).to(DEV)
    check(q, k, v, ks, vs, cache_lens, offs, sinks=sinks, tol=PREFILL_TOL)


def test_chunked_prefill_hi_lo(gen, hi_lo_prefill):
    cache_lens, q_lens = [150, 0], [45, 130]
    k, v, ks, vs = build_paged(16, 2, 64, cache_lens, q_lens, gen=gen)
    offs = offsets_of(q_lens)
    q = rand_q(offs[-1], 8, 64, gen)
    sinks = torch.tensor([math.inf, -math.inf, 0.5, 2.0, -1.0, 0.0, 3.0, 1.0]).to(DEV)
    out, _ = check(q, k, v, ks, vs, cache_lens, offs, sinks=sinks, config=hi_lo_prefill)
    assert torch.equal(out[:, 0], torch.zeros_like(out[:, 0]))


# --------------------------------------------------------------------------------------------
# FP8 caches: blockwise (float32 / e8m0 scales), per-token, per-tensor; decode and prefill
# --------------------------------------------------------------------------------------------
FP8 = [
    KVQuantConfig.per_token(),
    KVQuantConfig.per_token(E8M0),
    KVQuantConfig.blockwise(32),
    KVQuantConfig.blockwise(16, E8M0),
    KVQuantConfig.per_tensor(),
]


def as_decoded(quant, xs):
    """What the decode kernel computes with: blockwise FP8 with float32 scales (G < head_dim)
    is dequantized to bf16 without a lo part by default, like a bf16 cache, so the oracle
    takes the dequantized values rounded to bf16. That rounding (2^-9 relative) moves an
    output by up to ~2.2e-2 of |v| against the unrounded values when a request has a few
    keys and one dominates (seed 1243841026, 9 keys): a bound on the data, not the kernel,
    so the kernel is held to the bf16 bounds against the rounded values instead."""
    rounded = quant.format == "blockwise" and quant.granularity is not None
    if not rounded or quant.scale_dtype == E8M0:
        return xs
    return [x.to(BF16).double() for x in xs]


@pytest.mark.parametrize("quant", FP8, ids=lambda c: f"{c.format}-{c.granularity}-{c.scale_dtype}")
def test_fp8_decode(quant, gen):
    cache_lens = [45, 8, 19]
    k, v, ks, vs = build_paged(3, 2, 64, cache_lens, [1] * 3, quant=quant, gen=gen)
    q = rand_q(3, 8, 64, gen)
    ks, vs = as_decoded(quant, ks), as_decoded(quant, vs)
    check(q, k, v, ks, vs, cache_lens, [0, 1, 2, 3], num_partitions=2)


def test_fp8_blockwise_kv_lo(gen):
    """kv_lo carries float32-scaled blockwise K/V as hi + lo: back to the bf16 bounds."""
    cache_lens = [45, 8, 19]
    quant = KVQuantConfig.blockwise(32)
    k, v, ks, vs = build_paged(16, 2, 64, cache_lens, [1] * 3, quant=quant, gen=gen)
    q = rand_q(3, 8, 64, gen)
    kv_lo = MHATuning(decode=dict(kv_lo=True))
    check(q, k, v, ks, vs, cache_lens, [0, 1, 2, 3], num_partitions=2, config=kv_lo)


@pytest.mark.parametrize("quant", FP8, ids=lambda c: f"{c.format}-{c.granularity}-{c.scale_dtype}")
def test_fp8_prefill(quant, gen, hi_lo_prefill):
    cache_lens, q_lens = [20, 0], [13, 30]
    k, v, ks, vs = build_paged(16, 2, 64, cache_lens, q_lens, quant=quant, gen=gen)
    offs = offsets_of(q_lens)
    q = rand_q(offs[-1], 4, 64, gen)
    check(q, k, v, ks, vs, cache_lens, offs, config=hi_lo_prefill)


def test_fp8_blockwise_non_power_of_two_group(gen):
    """G = 48 (not a power of two) takes the per-element scale gather; d 96."""
    cache_lens = [30, 7]
    quant = KVQuantConfig.blockwise(48)
    k, v, ks, vs = build_paged(3, 1, 96, cache_lens, [1, 1], quant, gen)
    q = rand_q(2, 4, 96, gen)
    check(q, k, v, as_decoded(quant, ks), as_decoded(quant, vs), cache_lens, [0, 1, 2])


# --------------------------------------------------------------------------------------------
# Non-paged operands, against the reference op too
# --------------------------------------------------------------------------------------------
def test_dense_and_continuous_batching(gen):
    B, S, H, D = 3, 24, 2, 64
    x = torch.full((B, S, H, D), math.nan)
    y = torch.full((B, S, H, D), math.nan)
    cache_lens = [5, 0, 17]
    for b, c in enumerate(cache_lens):
        x[b, : c + 1] = torch.randn(c + 1, H, D, generator=gen)
        y[b, : c + 1] = torch.randn(c + 1, H, D, generator=gen)
    x, y = x.to(BF16), y.to(BF16)
    cl = torch.tensor(cache_lens, dtype=torch.int32, device=DEV)
    ks = [x[b, : c + 1].double() for b, c in enumerate(cache_lens)]
    vs = [y[b, : c + 1].double() for b, c in enumerate(cache_lens)]
    q = rand_q(3, 8, D, gen)
    k_op, v_op = DenseOperand(x.to(DEV), cl), DenseOperand(y.to(DEV), cl)
    check(q, k_op, v_op, ks, vs, cache_lens, [0, 1, 2, 3], num_partitions=2)
    slots = torch.tensor([2, 0, 1], dtype=torch.int32, device=DEV)  # request b lives in slot
    xc = torch.full((B, S, H, D), math.nan, dtype=BF16)
    yc = torch.full((B, S, H, D), math.nan, dtype=BF16)
    xc[slots.cpu().long()], yc[slots.cpu().long()] = x, y
    k_op = ContinuousBatchingOperand(xc.to(DEV), slots, cl)
    v_op = ContinuousBatchingOperand(yc.to(DEV), slots, cl)
    check(q, k_op, v_op, ks, vs, cache_lens, [0, 1, 2, 3])


def test_ragged_prefill_against_reference(gen):
    """Ragged K/V (no cached prefix): oracle, and the reference op on the same inputs."""
    from pagedattn.ops.mha.reference import mha_reference

    q_lens = [33, 0, 70]
    offs = offsets_of(q_lens)
    n = offs[-1]
    k = torch.randn(n, 2, 64, generator=gen).to(BF16)
    v = torch.randn(n, 2, 64, generator=gen).to(BF16)
    offs_t = torch.tensor(offs, dtype=torch.int32, device=DEV)
    k_op, v_op = RaggedOperand(k.to(DEV), offs_t), RaggedOperand(v.to(DEV), offs_t)
    ks = [k[offs[b] : offs[b + 1]].double() for b in range(3)]
    vs = [v[offs[b] : offs[b + 1]].double() for b in range(3)]
    q = rand_q(n, 8, 64, gen)
    sinks = torch.randn(8, generator=gen).to(DEV)
    out, lse = check(q, k_op, v_op, ks, vs, [0, 0, 0], offs, sinks=sinks, tol=PREFILL_TOL)
    ref, ref_lse = mha_reference(q, k_op, v_op, offs_t, sinks=sinks, return_lse=True)
    assert_close(out, ref.cpu(), **PREFILL_TOL, name="vs reference")
    assert_close(lse, ref_lse.cpu(), **LSE_TOL, name="lse vs reference")


def test_public_op_dispatch_and_reference(gen):
    """`mha(..., backend="triton")` reaches these kernels and agrees with the reference."""
    cache_lens = [12, 50]
    k, v, ks, vs = build_paged(16, 2, 64, cache_lens, [1, 1], gen=gen)
    q = rand_q(2, 8, 64, gen)
    offs = torch.tensor([0, 1, 2], dtype=torch.int32, device=DEV)
    a = mha(q, k, v, offs, backend="triton", num_partitions=2)
    b = mha(q, k, v, offs, backend="reference", num_partitions=2)
    assert_close(a.cpu(), b.cpu(), **BF16_TOL)


def test_empty_batch():
    k, v, _, _ = build_paged(16, 2, 64, [3], [1])
    q = torch.empty(0, 8, 64, dtype=BF16, device=DEV)
    out = mha_triton(q, k, v, torch.zeros(2, dtype=torch.int32, device=DEV))
    assert out.shape == (0, 8, 64)


def test_tuning_overrides(monkeypatch, gen):
    """Launch configs take overrides from PAGEDATTN_MHA_TUNING and from `config=` (on top);
    an unknown knob raises, naming it. (Launches captured, not run.)"""
    k, v, _, _ = build_paged(16, 2, 64, [12, 50], [1, 1], gen=gen)
    q = rand_q(2, 8, 64, gen)
    offs = torch.tensor([0, 1, 2], dtype=torch.int32, device=DEV)

    def decode_launch(**kw):
        (made,) = offline.capture(TM, lambda: mha_triton(q, k, v, offs, num_partitions=1, **kw))
        return made.kwargs["BLOCK_N"], made.kwargs["NUM_STAGES"], made.kwargs["num_warps"]

    monkeypatch.delenv("PAGEDATTN_MHA_TUNING", raising=False)
    assert decode_launch() == (64, 5, 2)  # bf16 d64: 16 KB of K+V a stage, 2 warps
    monkeypatch.setenv("PAGEDATTN_MHA_TUNING", '{"decode": {"BLOCK_N": 16, "num_stages": 3}}')
    assert decode_launch() == (16, 3, 2)
    assert decode_launch(config=MHATuning(decode=dict(num_stages=2, num_warps=4))) == (16, 2, 4)
    monkeypatch.setenv("PAGEDATTN_MHA_TUNING", '{"decode": {"stages": 3}}')
    with pytest.raises(InvalidArgumentError, match="stages"):
        decode_launch()
    monkeypatch.setenv("PAGEDATTN_MHA_TUNING", '{"decoder": {"num_stages": 3}}')
    with pytest.raises(InvalidArgumentError, match="decoder"):
        decode_launch()
    monkeypatch.delenv("PAGEDATTN_MHA_TUNING")
    with pytest.raises(InvalidArgumentError, match="g_nbuf"):
        MHATuning(prefill=dict(gluon=True, g_nbuf=3))


# --------------------------------------------------------------------------------------------
# GPU: serving sizes, CUDA-graph replay with changing lengths
# --------------------------------------------------------------------------------------------
def big_paged(b, ctx, page, h_kv, d, quant=None):
    """Random paged cache on the GPU (every slot finite), ctx cached + 1 new token each."""
    params = KVCacheParams(BF16, 1, h_kv, d, page, devices=["cuda"], quantization=quant)
    cache = make_paged_cache(params, [ctx] * b, [1] * b, device="cuda")
    inp = cache.inputs
    x = torch.randn(inp.kv_blocks.shape, device="cuda")
    if quant is None:
        inp.kv_blocks.copy_(x.to(BF16))
    else:
        raw, sc = quantize_blockwise(x, quant.granularity or d, quant.scale_dtype)
        inp.kv_blocks.copy_(raw)
        inp.kv_scales.view(torch.uint8).copy_(sc.view(torch.uint8))
    return params, inp


def gpu_reference(q, k_op, v_op, rows, scale):
    """float64 decode attention for the listed requests (one query each)."""
    outs = []
    cl = k_op.cache_lengths.tolist()
    g = q.shape[1] // k_op.num_heads
    for b in rows:
        K = k_op.gather(b, cl[b] + 1, torch.float64).repeat_interleave(g, 1)
        V = v_op.gather(b, cl[b] + 1, torch.float64).repeat_interleave(g, 1)
        p = torch.softmax(torch.einsum("hd,khd->hk", q[b].double(), K) * scale, -1)
        outs.append(torch.einsum("hk,khd->hd", p, V))
    return torch.stack(outs)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "page,d,quant",
    [(16, 128, None), (1, 128, None), (64, 96, None), (64, 128, KVQuantConfig.per_token())],
)
def test_gpu_decode_serving_size(page, d, quant):
    params, inp = big_paged(32, 4096, page, 8, d, quant)
    k, v = PagedOperand(inp, params, 0, "k"), PagedOperand(inp, params, 0, "v")
    q = torch.randn(32, 32, d, device="cuda").to(BF16)
    offs = torch.arange(33, dtype=torch.int32, device="cuda")
    out = mha_triton(q, k, v, offs)
    rows = [0, 13, 31]
    assert_close(out[rows], gpu_reference(q, k, v, rows, d**-0.5), **BF16_TOL)


@pytest.mark.gpu
def test_gpu_prefill_serving_size():
    n, h, d = 2048, 32, 128
    q = torch.randn(2 * n, h, d, device="cuda").to(BF16)
    k = torch.randn(2 * n, 8, d, device="cuda").to(BF16)
    v = torch.randn(2 * n, 8, d, device="cuda").to(BF16)
    offs = torch.tensor([0, n, 2 * n], dtype=torch.int32, device="cuda")
    out = mha_triton(q, RaggedOperand(k, offs), RaggedOperand(v, offs), offs)
    ref = torch.nn.functional.scaled_dot_product_attention(
        q[:n].double().transpose(0, 1),
        k[:n].double().repeat_interleave(4, 1).transpose(0, 1),
        v[:n].double().repeat_interleave(4, 1).transpose(0, 1),
        is_causal=True,
    ).transpose(0, 1)
    assert_close(out[:n], ref, abs_tol=4e-3, rel_tol=2 / 128, cos_tol=1e-5)


SM90 = ON_GPU and torch.cuda.get_device_capability() == (9, 0)


def check_gluon_prefill(q, k, v, ks, vs, cache_lens, offs, mask, sinks, **over):
    """The Gluon sm_90 prefill (forced, launch overrides `over`) against the oracle, then
    against the tl kernel on the same inputs."""
    gluon, tl = MHATuning(prefill=dict(gluon=True, **over)), MHATuning(prefill=dict(gluon=False))
    out, lse = check(q, k, v, ks, vs, cache_lens, offs, mask=mask, sinks=sinks,
                     tol=PREFILL_TOL, config=gluon)  # fmt: skip
    out_tl, lse_tl = call(q, k, v, offs, mask=mask, sinks=sinks, config=tl)
    assert_close(out, out_tl, **PREFILL_TOL, name="vs tl kernel")
    assert_close(lse, lse_tl, **LSE_TOL, name="lse vs tl kernel")


def _paged_prefill_case(page_size, h_q, h_kv, d, mi, gen):
    """A chunked-prefill batch over a paged cache (prefixes longer than a tile, a request with
    no new token), mask `mi` of five range masks, random sinks."""
    cache_lens, q_lens = [0, 300, 23, 5, 129], [277, 6, 1, 0, 140]
    k, v, ks, vs = build_paged(page_size, h_kv, d, cache_lens, q_lens, gen=gen)
    offs = offsets_of(q_lens)
    q = rand_q(offs[-1], h_q, d, gen)
    mask = [masks.null(), masks.causal(), masks.sliding_window_causal(70),
            masks.sliding_window_noncausal(33), masks.chunked_causal(128)][mi]  # fmt: skip
    sinks = torch.randn(h_q, generator=gen).to(DEV)
    return q, k, v, ks, vs, cache_lens, offs, mask, sinks


@pytest.mark.gpu
@pytest.mark.skipif(not SM90, reason="the Gluon prefill is sm_90 only")
@pytest.mark.parametrize("mi", range(5))
@pytest.mark.parametrize(
    "page_size,h_q,h_kv,d", [(16, 8, 2, 64), (1, 4, 4, 128), (64, 8, 1, 128), (128, 8, 2, 64)]
)
def test_gpu_sm90_prefill(mi, page_size, h_q, h_kv, d, gen):
    """The Gluon sm_90 prefill (`gluon_prefill`) against the oracle: every range mask, GQA,
    chunked prefixes longer than a tile, a request with no new token, sinks, the LSE; and
    against the tl kernel on the same inputs."""
    q, k, v, ks, vs, cache_lens, offs, mask, sinks = _paged_prefill_case(
        page_size, h_q, h_kv, d, mi, gen
    )
    ka, va = k.kernel_args(), v.kernel_args()
    assert MS.sm90_prefill_serves(q, ka, va, d, d, mask)  # every paged cache
    check_gluon_prefill(q, k, v, ks, vs, cache_lens, offs, mask, sinks)


@pytest.mark.gpu
@pytest.mark.skipif(not SM90, reason="the Gluon prefill is sm_90 only")
@pytest.mark.parametrize(
    "cfg",
    [
        dict(g_ws=False, g_BLOCK_N=128, g_NBUF=3),
        dict(g_ws=False, g_num_warps=4, g_BLOCK_N=64, g_NBUF=3),
        dict(g_ws=False),
    ],
)
def test_gpu_sm90_prefill_launch_configs(cfg, gen):
    """The (not warp-specialized) Gluon prefill's tile shapes over pages of 16 (cp.async):
    128-key tiles, one warpgroup of 64 rows, the default 64 x 4."""
    cache_lens, q_lens = [0, 300, 129], [277, 6, 140]
    k, v, ks, vs = build_paged(16, 2, 128, cache_lens, q_lens, gen=gen)
    offs = offsets_of(q_lens)
    q = rand_q(offs[-1], 8, 128, gen)
    tuning = MHATuning(prefill=dict(gluon=True, **cfg))
    check(q, k, v, ks, vs, cache_lens, offs, mask=masks.causal(), tol=PREFILL_TOL, config=tuning)


@pytest.mark.gpu
@pytest.mark.skipif(not SM90, reason="the Gluon prefill is sm_90 only")
@pytest.mark.parametrize("mi", range(5))
@pytest.mark.parametrize(
    "page_size,h_q,h_kv,d,bn",
    [
        (64, 8, 1, 128, 64),
        (128, 8, 2, 64, 128),
        (128, 4, 4, 128, 128),
        (16, 8, 2, 128, 128),
        (8, 4, 1, 64, 128),
        (32, 8, 8, 128, 64),
    ],
)
def test_gpu_sm90_prefill_ws(mi, page_size, h_q, h_kv, d, bn, gen):
    """The warp-specialized Gluon prefill (`gluon_prefill_ws`) over paged caches (a TMA box a
    tile, or one a page for pages smaller than a tile): every range mask, GQA, chunked
    prefixes, a request with no new token, sinks, the LSE; against the oracle and the tl
    kernel."""
    q, k, v, ks, vs, cache_lens, offs, mask, sinks = _paged_prefill_case(
        page_size, h_q, h_kv, d, mi, gen
    )
    over = dict(g_ws=True, g_BLOCK_N=bn, g_NBUF=2 if bn == 128 else 4)
    assert MS.sm90_prefill_plan(k.kernel_args(), v.kernel_args(), MHATuning(prefill=over)).ws
    check_gluon_prefill(q, k, v, ks, vs, cache_lens, offs, mask, sinks, **over)


def _row_slots_case(d, dr, gen, device=DEV, cache_lens=(0, 300, 23, 129, 5),
                    q_lens=(277, 6, 1, 140, 0), slot_rows=640):  # fmt: skip
    """K of d + dr dims and V of d (dr > 0: MLA's expanded prefill, 192 / 128) in one NaN padded
    row slot of slot_rows rows per request (row offsets, slots in a shuffled order) with cached
    prefixes, and q of d + dr dims; (q, k, v, ks, vs, cache_lens, offs), ks / vs each
    request's K / V in float64."""
    B, S, H = len(cache_lens), slot_rows, 2
    xc = torch.full((B, S, H, d + dr), math.nan, dtype=BF16)
    yc = torch.full((B, S, H, d), math.nan, dtype=BF16)
    slots = [3, 0, 4, 1, 2][:B] if B == 5 else list(range(B))[::-1]
    cache_lens, q_lens = list(cache_lens), list(q_lens)
    ks, vs = [], []
    for b, (c, n) in enumerate(zip(cache_lens, q_lens)):
        x = torch.randn(c + n, H, d + dr, generator=gen).to(BF16)
        y = torch.randn(c + n, H, d, generator=gen).to(BF16)
        xc[slots[b], : c + n], yc[slots[b], : c + n] = x, y
        ks.append(x.double())
        vs.append(y.double())
    cl = torch.tensor(cache_lens, dtype=torch.int32, device=device)
    st = torch.tensor(slots, dtype=torch.int32, device=device)
    k = ContinuousBatchingOperand(xc.to(device), st, cl)
    v = ContinuousBatchingOperand(yc.to(device), st, cl)
    offs = offsets_of(q_lens)
    q = torch.randn(offs[-1], 8, d + dr, generator=gen).to(BF16).to(device)
    return q, k, v, ks, vs, cache_lens, offs


@pytest.mark.gpu
@pytest.mark.skipif(not SM90, reason="the Gluon prefill is sm_90 only")
@pytest.mark.parametrize("mi", range(4))
@pytest.mark.parametrize(
    "cfg",
    [
        dict(),
        dict(g_ws=False),
        dict(g_ws=False, g_BLOCK_N=128, g_NBUF=3),
        dict(g_ws=False, g_tma=False),
        dict(g_ws=False, g_num_warps=4, g_NBUF=3),
        dict(g_BLOCK_N=128, g_NBUF=3),
        dict(g_BLOCK_N=64, g_NBUF=4),
    ],
)
def test_gpu_sm90_prefill_row_offsets_tma(mi, cfg, gen):
    """The Gluon prefill over one slot per request (row offsets, cached prefixes) whose unused
    rows are NaN: TMA boxes read past each request's keys (K masked, the last V tile zeroed).
    Against the oracle and against the tl kernel."""
    D = 128
    q, k, v, ks, vs, cache_lens, offs = _row_slots_case(D, 0, gen)
    mask = [masks.causal(), masks.null(), masks.sliding_window_causal(70),
            masks.chunked_causal(128)][mi]  # fmt: skip
    sinks = torch.randn(8, generator=gen).to(DEV)
    ka = k.kernel_args()
    assert MS.tma_ok(ka, 128) and MS.sm90_prefill_serves(q, ka, ka, D, D, mask)
    assert MS.sm90_prefill_plan(ka, ka).ws  # the default: warp-specialized
    check_gluon_prefill(q, k, v, ks, vs, cache_lens, offs, mask, sinks, **cfg)


@pytest.mark.parametrize("d,dr", [(128, 64), (64, 32), (64, 16)])
def test_sm90_prefill_takes_wider_k(d, dr, gen):
    """d_qk = d_v + 16 / 32 / 64 goes to the warp-specialized Gluon prefill (K boxed as its
    first d_v columns and the rest), where both are TMA boxes; d_qk < d_v, a non-power-of-two
    remainder, or K/V that are not TMA boxes do not."""
    q, k, v, *_ = _row_slots_case(d, dr, gen, device="cpu")
    ka, va = k.kernel_args(), v.kernel_args()
    causal = masks.causal()
    assert MS.tma_ok(ka, 128, d) and not MS.tma_ok(ka, 128)
    p = MS.sm90_prefill_serves(q, ka, va, d + dr, d, causal)
    assert p is not None and p.ws and p.k_box == 128
    assert MS.sm90_prefill_serves(q, va, ka, d, d + dr, causal) is None  # d_qk < d_v
    paged1 = build_paged(1, 2, d + dr, [3], [2], gen=gen)[0].kernel_args()  # pages of 1
    assert MS.sm90_prefill_serves(q, paged1, va, d + dr, d, causal) is None
    q48, k48, *_ = _row_slots_case(d, 48, gen, device="cpu")  # 48: not a power of two
    assert MS.sm90_prefill_serves(q48, k48.kernel_args(), va, d + 48, d, causal) is None


@pytest.mark.parametrize("d,dr", [(64, 32), (128, 64)])
@pytest.mark.parametrize("mi", [0, 2])
def test_prefill_wider_k_against_oracle(d, dr, mi, gen):
    """d_qk = d_v + dr (MLA's expanded prefill) on the portable prefill kernel (what every
    device without the sm_90 Gluon kernel runs): NaN padded row slots, cached prefixes, sinks
    and the LSE, against the float64 oracle."""
    q, k, v, ks, vs, cache_lens, offs = _row_slots_case(
        d, dr, gen, cache_lens=(0, 20, 5), q_lens=(9, 3, 17), slot_rows=48
    )
    mask = [masks.causal(), masks.null(), masks.sliding_window_causal(7)][mi]
    sinks = torch.randn(8, generator=gen).to(DEV)
    check(q, k, v, ks, vs, cache_lens, offs, mask=mask, sinks=sinks, tol=PREFILL_TOL)


@pytest.mark.gpu
@pytest.mark.skipif(not SM90, reason="needs an sm_90 GPU")
@pytest.mark.parametrize("d,dr", [(128, 64), (64, 32), (64, 16)])
@pytest.mark.parametrize("mi", [0, 2])
def test_gpu_sm90_prefill_wider_k(d, dr, mi, gen):
    """The warp-specialized Gluon prefill with d_qk = d_v + dr (MLA's expanded form) over NaN
    padded row slots with cached prefixes, against the oracle and the tl kernel."""
    q, k, v, ks, vs, cache_lens, offs = _row_slots_case(d, dr, gen)
    mask = [masks.causal(), masks.null(), masks.sliding_window_causal(70)][mi]
    sinks = torch.randn(8, generator=gen).to(DEV)
    assert MS.sm90_prefill_serves(q, k.kernel_args(), v.kernel_args(), d + dr, d, mask).ws
    check_gluon_prefill(q, k, v, ks, vs, cache_lens, offs, mask, sinks)


@pytest.mark.gpu
def test_gpu_cuda_graph_replay_with_changing_lengths():
    """Capture once; refresh cache_lengths, the lookup table and q in place; replay."""
    b, ctx = 8, 1024
    params, inp = big_paged(b, ctx, 16, 8, 128)
    k, v = PagedOperand(inp, params, 0, "k"), PagedOperand(inp, params, 0, "v")
    q = torch.randn(b, 32, 128, device="cuda").to(BF16)
    offs = torch.arange(b + 1, dtype=torch.int32, device="cuda")
    out = torch.empty_like(q)
    for _ in range(2):  # compile outside the capture
        mha_triton(q, k, v, offs, out=out, num_partitions=4)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        mha_triton(q, k, v, offs, out=out, num_partitions=4)
    cols = inp.lookup_table.shape[1] - 2
    for _ in range(3):
        inp.cache_lengths.copy_(torch.randint(0, ctx, (b,), device="cuda", dtype=torch.int32))
        inp.lookup_table[:, :cols] = inp.lookup_table[torch.randperm(b, device="cuda"), :cols]
        q.copy_(torch.randn_like(q))
        out.fill_(math.nan)
        graph.replay()
        rows = list(range(b))
        assert_close(out, gpu_reference(q, k, v, rows, 128**-0.5), **BF16_TOL)


def test_pdl_off_on_cpu(monkeypatch):
    """Programmatic dependent launch is only for compiled CUDA launches (on sm_90 by default,
    off with PAGEDATTN_PDL=0): never on a CPU tensor."""
    monkeypatch.delenv("PAGEDATTN_PDL", raising=False)
    assert not pdl_enabled(torch.zeros(1))
    monkeypatch.setenv("PAGEDATTN_PDL", "1")
    assert not pdl_enabled(torch.zeros(1))


def test_pdl_as_on_sm90_for_offline_captures(monkeypatch):
    """Inside `pdl_as_on_sm90` (the offline sm_90 captures) a CPU tensor's launches take PDL
    as an sm_90 GPU's do, PAGEDATTN_PDL=0 included; outside, and after an error inside, the
    CPU answer again; a capture inside gets the chain's PDL arguments."""
    from pagedattn.ops import offline, prepared
    from pagedattn.ops.fused import triton_fused as TF
    from pagedattn.ops.pdl import pdl_as_on_sm90

    monkeypatch.delenv("PAGEDATTN_PDL", raising=False)
    x = torch.randn(2, 64)
    with pdl_as_on_sm90():
        assert pdl_enabled(x)
        monkeypatch.setenv("PAGEDATTN_PDL", "0")
        assert not pdl_enabled(x)
        monkeypatch.delenv("PAGEDATTN_PDL")
        (made,) = offline.capture(prepared, lambda: TF.argmax_rows_triton(x),
                                  _fast_path=lambda kernel, grid: False)  # fmt: skip
    assert made.kwargs.get("PDL") is True and made.kwargs.get("launch_pdl") is True
    with pytest.raises(RuntimeError), pdl_as_on_sm90():
        raise RuntimeError
    assert not pdl_enabled(x)


@pytest.mark.gpu
def test_gpu_split_decode_pdl_matches_serial(monkeypatch):
    """The split-K decode with its combine launched dependent (PDL) gives the serial launch's
    output bit for bit, and the float64 reference within tolerance."""
    params, inp = big_paged(4, 4096, 64, 8, 128)
    k, v = PagedOperand(inp, params, 0, "k"), PagedOperand(inp, params, 0, "v")
    q = torch.randn(4, 32, 128, device="cuda").to(BF16)
    offs = torch.arange(5, dtype=torch.int32, device="cuda")
    outs = {}
    for mode in ("0", "1"):
        monkeypatch.setenv("PAGEDATTN_PDL", mode)
        assert pdl_enabled(q) == (mode == "1" and torch.cuda.get_device_capability()[0] >= 9)
        outs[mode] = poison_(torch.empty_like(q))
        mha_triton(q, k, v, offs, num_partitions=8, out=outs[mode])
    assert torch.equal(outs["0"], outs["1"])
    assert_close(outs["1"], gpu_reference(q, k, v, range(4), 128**-0.5), **BF16_TOL)
