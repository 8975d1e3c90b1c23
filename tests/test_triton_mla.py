"""Triton MLA decode (`pagedattn.ops.mla.triton_mla`) against an independent float64 oracle.

CPU runs use TRITON_INTERPRET=1 (set before triton is imported) at small shapes: they check the
kernels' indexing and masking. `@pytest.mark.gpu` tests run the compiled kernels on the full
grid (dense/sparse x every cache format x h_q x s_q x page size) and under CUDA-graph replay.

Adversarial setup everywhere: caches from `make_paged_cache` (shuffled non-contiguous pages,
sentinel page ids in unused lookup-table columns, NaN in every slot no valid token occupies),
NaN-poisoned output buffers, invalid sparse indices of every kind, topk_length 0, sinks of
+inf. The oracle decodes the raw cache bytes itself (float64, from the documented layouts),
addresses tokens from the lookup table itself and runs one softmax per query token.
"""

from __future__ import annotations

import os

import torch

# Without a GPU the kernels run in Triton's interpreter; the variable must be set before any
# Triton kernel is defined (importing torch defines none).
if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

import dataclasses  # noqa: E402
import json  # noqa: E402
import zlib  # noqa: E402

import oracles  # noqa: E402
import pytest  # noqa: E402
from oracles import (  # noqa: E402
    LAYER,
    PS_CASES,
    Cache,
    decode_pool,
    dense_keys,
    invalid_kinds,
    oracle,
)

from pagedattn import (  # noqa: E402
    InvalidArgumentError,
    KVCacheParams,
    KVQuantConfig,
    PagedOperand,
    store_kv,
)
from pagedattn.fp8 import quantize_blockwise  # noqa: E402
from pagedattn.ops.gluon_imports import HAS_GLUON as HAS_GLUON_ST  # noqa: E402
from pagedattn.ops.mla.triton_mla import mla_decode_triton  # noqa: E402
from pagedattn.testing import assert_close, make_paged_cache, poison_, ragged_offsets  # noqa: E402

BF16, F32, E8M0 = torch.bfloat16, torch.float32, torch.float8_e8m0fnu
ROPE = 64
ON_GPU = torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1"
DEV = "cuda" if ON_GPU else "cpu"

# P is rounded to bf16 before the P.V product (as FlashMLA does) and outputs are bf16. With the
# few, peaky keys of these tests (|v| <= 5.5, q ~ 2 randn) an output near 0 can be off by a few
# 2^-9 * max|v| * p (seen: 2.5e-2 once in 4e5 elements on the GPU), so abs_tol is 3e-2. The
# cosine bound is what catches indexing or masking mistakes (one wrong key among 20 moves it to
# ~1e-2): 1e-5, twice FlashMLA's 5e-6, because with h_q = 1 and few peaky keys the bf16 P alone
# reaches 4-5e-6 (the fp32-P reference lands at 1.3e-6 from output rounding alone).
TOL = dict(abs_tol=3e-2, rel_tol=2 / 128, cos_tol=1e-5)
# FP8 rows whose dequantized values are not exact in bf16 (float32 scales applied per element:
# blockwise with several float32 scales a token, rope-aware d_qk 512 whose per-token scale
# sits next to an unscaled rope chunk) are rounded to bf16 once, like a bf16 cache would be:
# scores move by ~|q||k| 2^-9 (a few 1e-3 here, 2e-2 in the tails) and peaky softmaxes
# amplify that. Power-of-two scales (e8m0, V32, MODEL1) and per-token scales (folded into S
# and P) are exact and use TOL. abs_tol: these roundings alone (K/V to bf16, P to bf16, the
# output to bf16), replayed in float64 on 68 seeds of the GPU grid's rope-aware d_qk 512,
# h_q 64, page 64 case, reach 5.5e-2 (an element near 0 under a peaky softmax); the GPU grid
# once saw 6.1e-2 (2026-11-21, H100). 8e-2 leaves that tail room. cos_tol: the same replay
# of the h_q 1 cases (three output rows) reaches 3.4e-5 (s_q 1, page 128); 1e-4 is still
# 100x below what one wrong key does.
TOL_DEQ = dict(abs_tol=8e-2, rel_tol=4 / 128, cos_tol=1e-4, lse_abs=3e-2, lse_cos=5e-6)
TOL = dict(TOL, lse_abs=2e-3, lse_cos=1e-8)

# name -> (KVQuantConfig factory, d_qk values it supports, dequantized with rounding)
FORMATS = {
    "bf16": (lambda: None, (576, 512), False),
    "fp8_g64_f32": (lambda: KVQuantConfig.blockwise(64), (576, 512), True),
    "fp8_g64_e8m0": (lambda: KVQuantConfig.blockwise(64, E8M0), (576, 512), False),
    "fp8_g128_e8m0": (lambda: KVQuantConfig.blockwise(128, E8M0), (512,), False),
    "fp8_g192_f32": (lambda: KVQuantConfig.blockwise(192), (576,), True),  # gather path
    "fp8_token_f32": (lambda: KVQuantConfig.per_token(), (576, 512), False),
    "fp8_per_tensor": (lambda: KVQuantConfig.per_tensor(), (576, 512), False),
    "rope_aware": (lambda: KVQuantConfig.mla_rope_aware(), (576, 512), False),
    "v32": (lambda: KVQuantConfig.flashmla_v32(), (576,), False),
    "model1": (lambda: KVQuantConfig.flashmla_model1(), (512,), False),
}
PER_TENSOR_SCALE = 0.0125


def tol_for(fmt: str, d_qk: int) -> dict:
    multi = FORMATS[fmt][2] or (fmt == "rope_aware" and d_qk == 512)
    return TOL_DEQ if multi else TOL


# --------------------------------------------------------------------------------------------
# Caches, queries, oracle
# --------------------------------------------------------------------------------------------
def _write(params: KVCacheParams, inputs, x: torch.Tensor, seq: list[int]) -> None:
    """x [sum(seq), 1, d] at positions 0..seq[b]-1 of each request, layer LAYER."""
    if params.quant_format == "blockwise":  # written here: independent of store_kv
        q, s = quantize_blockwise(x.float(), params.scale_granularity, params.scale_dtype)
        lut, ps = inputs.lookup_table.tolist(), params.page_size
        pages, slots = [], []
        for b, n in enumerate(seq):
            for j in range(n):
                pages.append(lut[b][j // ps])
                slots.append(j % ps)
        pages = torch.tensor(pages, device=x.device)
        slots = torch.tensor(slots, device=x.device)
        inputs.kv_blocks[pages, 0, LAYER, slots] = q
        if s.dtype == E8M0:  # torch has no index_put for e8m0: write the bytes
            inputs.kv_scales.view(torch.uint8)[pages, 0, LAYER, slots] = s.view(torch.uint8)
        else:
            inputs.kv_scales[pages, 0, LAYER, slots] = s
        return
    zero = dataclasses.replace(
        inputs, cache_lengths=torch.zeros(len(seq), dtype=torch.int32, device=x.device)
    )
    store_kv(x, None, zero, params, LAYER, ragged_offsets(seq, x.device), backend="reference")


def build_cache(
    fmt, d_qk, page_size, cache_lens, q_lens, gen, h_q=16, extra_pages=3, rise=0.0
) -> Cache:
    """Request b's first cache_lens[b] + q_lens[b] tokens hold random values (quantized into
    the format); every other slot is NaN. rise > 0: dims 0..7 of token j of a request of n
    tokens are rise * j / n instead (with `rising_q`, scores that climb along the keys)."""
    factory, dims, _ = FORMATS[fmt]
    assert d_qk in dims, (fmt, d_qk)
    params = KVCacheParams(
        BF16, 2, 1, d_qk, page_size, is_mla=True, num_q_heads=h_q,
        quantization=factory(), mla_rope_dim=ROPE, devices=(DEV,),
    )  # fmt: skip
    pc = make_paged_cache(
        params, cache_lens, q_lens, generator=gen, extra_pages=extra_pages, device=DEV
    )
    if params.quant_format == "per_tensor":
        pc.inputs.kv_scales.fill_(PER_TENSOR_SCALE)
    seq = pc.seq_lens
    total = sum(seq)
    x = torch.randn(total, 1, d_qk, generator=gen)
    x = (x * torch.exp(torch.randn(total, 1, 1, generator=gen) * 0.3)).clamp(-5.5, 5.5)
    if rise:
        frac = torch.cat([torch.arange(n) / n for n in seq])
        x[:, 0, :8] = rise * frac[:, None]
    _write(params, pc.inputs, x.to(BF16).to(DEV), seq)
    pool = decode_pool(params, pc.inputs)
    return Cache(params, pc.inputs, seq, pool, pc.inputs.lookup_table.tolist())


def make_q(tokens, h_q, d_qk, gen):
    return (torch.randn(tokens, h_q, d_qk, generator=gen) * 2).to(BF16).to(DEV)


def rising_q(tokens, h_q, d_qk, gen):
    """make_q with dims 0..7 set to +20 (even heads) or -20 (odd heads): over a
    `build_cache(rise=5.5)` cache an even head's scores climb by ~37 (natural log units) from
    its first key to its last (an odd head's fall), so its running max moves on many tiles."""
    q = torch.randn(tokens, h_q, d_qk, generator=gen) * 2
    q[:, :, :8] = torch.where(torch.arange(h_q) % 2 == 0, 20.0, -20.0)[None, :, None]
    return q.to(BF16).to(DEV)


def make_sinks(h_q, gen):
    return oracles.make_sinks(h_q, gen).to(DEV)


def run(q, kv, q_lens, **kw):
    tokens, h_q, _ = q.shape
    d_v = kw.get("d_v", 512)
    out = poison_(torch.empty(tokens, h_q, d_v, dtype=q.dtype, device=q.device))
    o, lse = mla_decode_triton(q, kv, ragged_offsets(q_lens, q.device), out=out, **kw)
    assert o is out and lse.dtype == F32 and lse.shape == (tokens, h_q)
    return o, lse


def check(o, lse, ref_o, ref_lse, tol=TOL):
    assert not torch.isnan(o).any(), "NaN in the output (an unwritten or poisoned element)"
    tol = dict(tol)
    lse_abs, lse_cos = tol.pop("lse_abs"), tol.pop("lse_cos")
    assert_close(o, ref_o, **tol, name="out")
    assert_close(lse, ref_lse, abs_tol=lse_abs, rel_tol=1e-4, cos_tol=lse_cos, name="lse")


def set_tuning(monkeypatch, tuning: dict) -> None:
    """`MLATuning` overrides for one test (restored after it), through PAGEDATTN_MLA_TUNING
    (on top of the run's own, if any), which `mla_decode_triton` reads at each call."""
    from pagedattn import env

    knobs = {**env.tuning_overrides("MLA"), **tuning}
    monkeypatch.setenv("PAGEDATTN_MLA_TUNING", json.dumps(knobs))


def reference_or_none():
    try:
        from pagedattn.ops.mla.reference import mla_decode_reference
    except ImportError:  # pragma: no cover - written by another engineer
        return None
    return mla_decode_reference


# --------------------------------------------------------------------------------------------
# Dense (lookup table)
# --------------------------------------------------------------------------------------------
DENSE_CASES = [
    # page_size, h_q, d_qk, format, cache_lens, q_lens, causal, partitions
    (1, 16, 576, "bf16", [0, 5, 33], [1, 4, 2], True, 1),
    (16, 20, 576, "bf16", [17, 0, 50], [2, 4, 1], True, 3),
    (64, 1, 576, "bf16", [70, 3], [4, 1], True, 2),
    (16, 16, 512, "bf16", [31, 9], [1, 2], False, 1),
    (16, 20, 576, "fp8_g64_f32", [17, 40], [2, 1], True, 1),
    (1, 16, 512, "fp8_g64_e8m0", [12, 3], [4, 1], False, 2),
    (64, 20, 512, "fp8_g128_e8m0", [65, 0], [2, 4], True, 1),
    (16, 1, 576, "fp8_g192_f32", [20, 6], [1, 2], True, 1),
    (16, 16, 576, "fp8_token_f32", [30, 2], [2, 1], True, 2),
    (16, 16, 512, "fp8_per_tensor", [20, 40], [1, 2], True, 1),
    (16, 16, 576, "rope_aware", [21, 2], [2, 4], True, 1),
    (1, 20, 512, "rope_aware", [9, 30], [3, 1], True, 2),
    (64, 16, 576, "v32", [80, 0], [1, 4], True, 1),
    (16, 20, 512, "model1", [33, 5], [4, 1], True, 2),
    (1, 1, 512, "model1", [6, 0], [2, 3], False, 1),
]


@pytest.mark.parametrize(
    "ps,h_q,d_qk,fmt,cache_lens,q_lens,causal,P",
    DENSE_CASES,
    ids=[f"ps{c[0]}-h{c[1]}-d{c[2]}-{c[3]}-sq{max(c[5])}-P{c[7]}" for c in DENSE_CASES],
)
def test_dense(gen, ps, h_q, d_qk, fmt, cache_lens, q_lens, causal, P):
    cache = build_cache(fmt, d_qk, ps, cache_lens, q_lens, gen, h_q)
    offs = ragged_offsets(q_lens).tolist()
    q = make_q(offs[-1], h_q, d_qk, gen)
    sink = make_sinks(h_q, gen) if P > 1 else None
    o, lse = run(q, cache.operand(), q_lens, causal=causal, attn_sink=sink, num_partitions=P)
    ref_o, ref_lse = oracle(q, offs, dense_keys(cache, cache_lens, q_lens, causal), sink=sink)
    check(o, lse, ref_o, ref_lse, tol_for(fmt, d_qk))
    if sink is not None and h_q > 1:
        assert torch.all(o[:, 0] == 0), "a sink of +inf must give output 0"


@pytest.mark.parametrize("h_q,s_q", [(128, 1), (64, 2), (16, 4)], ids=["h128", "h64sq2", "h16sq4"])
def test_dense_full_tiles(gen, h_q, s_q):
    """64-row tiles: 128 heads in two head blocks; 64 heads x 2 tokens; 16 heads x 4 tokens."""
    cache_lens, q_lens = [37, 0], [s_q, s_q]
    cache = build_cache("bf16", 576, 16, cache_lens, q_lens, gen, h_q)
    offs = ragged_offsets(q_lens).tolist()
    q = make_q(offs[-1], h_q, 576, gen)
    o, lse = run(q, cache.operand(), q_lens, num_partitions=2)
    check(o, lse, *oracle(q, offs, dense_keys(cache, cache_lens, q_lens)))


def test_d_v_and_scale(gen):
    cache_lens, q_lens = [25, 7], [2, 1]
    cache = build_cache("bf16", 576, 16, cache_lens, q_lens, gen, 4)
    offs = ragged_offsets(q_lens).tolist()
    q = make_q(3, 4, 576, gen)
    o, lse = run(q, cache.operand(), q_lens, d_v=448, scale=0.05)
    ref_o, ref_lse = oracle(q, offs, dense_keys(cache, cache_lens, q_lens), 448, 0.05)
    check(o, lse, ref_o, ref_lse)


@pytest.mark.parametrize("P", [1, 2, 3, 7])
def test_split_k_does_not_change_the_result(gen, P):
    cache_lens, q_lens = [150, 3, 64], [1, 2, 1]
    cache = build_cache("rope_aware", 576, 16, cache_lens, q_lens, gen, 16)
    offs = ragged_offsets(q_lens).tolist()
    q = make_q(offs[-1], 16, 576, gen)
    sink = make_sinks(16, gen)
    o, lse = run(q, cache.operand(), q_lens, attn_sink=sink, num_partitions=P)
    ref_o, ref_lse = oracle(q, offs, dense_keys(cache, cache_lens, q_lens), sink=sink)
    check(o, lse, ref_o, ref_lse)


def test_default_partitions_and_reference_agree(gen):
    """num_partitions=None (host heuristic) and the library's reference, when present."""
    cache_lens, q_lens = [300, 40], [1, 1]
    cache = build_cache("v32", 576, 64, cache_lens, q_lens, gen, 16)
    offs = ragged_offsets(q_lens).tolist()
    q = make_q(2, 16, 576, gen)
    o, lse = run(q, cache.operand(), q_lens)
    check(o, lse, *oracle(q, offs, dense_keys(cache, cache_lens, q_lens)))
    ref = reference_or_none()
    if ref is not None:
        r_o, r_lse = ref(q, cache.operand(), ragged_offsets(q_lens, q.device))
        check(o, lse, r_o, r_lse)


def test_sentinel_pages_are_never_read(gen):
    """Every unused lookup-table column holds the sentinel total_num_pages (out of bounds)."""
    cache_lens, q_lens = [16, 31], [1, 1]
    cache = build_cache("bf16", 576, 16, cache_lens, q_lens, gen, 16, extra_pages=0)
    lut = cache.inputs.lookup_table
    assert (lut == cache.pool.shape[0]).sum() >= 2  # sentinels present
    offs = ragged_offsets(q_lens).tolist()
    q = make_q(2, 16, 576, gen)
    o, lse = run(q, cache.operand(), q_lens, num_partitions=2)
    check(o, lse, *oracle(q, offs, dense_keys(cache, cache_lens, q_lens)))


# --------------------------------------------------------------------------------------------
# Sparse (+ extra cache)
# --------------------------------------------------------------------------------------------
def sparse_indices(cache: Cache, q_lens, stride, gen, n_valid):
    """[tokens, stride] int32: per token, n_valid[b] valid entries (random tokens of request b,
    duplicates allowed) scattered among invalid ones of every kind; positions >= n_valid[b]
    hold valid-looking entries that topk_lengths must hide."""
    bad = invalid_kinds(cache)
    rows, valid = [], []
    for b, n in enumerate(q_lens):
        seq = cache.seq_lens[b]
        for _ in range(n):
            row, ok = [], []
            for j in range(stride):
                if j < n_valid[b] and (seq == 0 or torch.rand((), generator=gen) < 0.25):
                    row.append(bad[int(torch.randint(len(bad), (), generator=gen))])
                elif seq > 0:
                    row.append(cache.encode(b, int(torch.randint(seq, (), generator=gen))))
                    if j < n_valid[b]:
                        ok.append(row[-1])
                else:
                    row.append(bad[j % len(bad)])
            rows.append(row)
            valid.append(ok)
    return torch.tensor(rows, dtype=torch.int32, device=DEV), valid


SPARSE_CASES = [
    # page_size, h_q, d_qk, main fmt, extra fmt or None, q_lens, stride, partitions, sink
    (16, 16, 576, "bf16", None, [1, 2], 40, 1, False),
    (1, 20, 576, "v32", None, [2, 1], 33, 2, True),
    (64, 1, 576, "rope_aware", "bf16", [1, 1], 24, 3, True),
    (16, 16, 512, "model1", "model1", [2, 2], 20, 1, True),
    (16, 20, 512, "fp8_g128_e8m0", "rope_aware", [1, 2], 17, 2, False),
    (1, 16, 576, "fp8_g64_f32", "fp8_per_tensor", [1, 1], 30, 1, True),
    (64, 16, 512, "fp8_token_f32", None, [4], 50, 2, False),
]


@pytest.mark.parametrize(
    "ps,h_q,d_qk,fmt,xfmt,q_lens,stride,P,with_sink",
    SPARSE_CASES,
    ids=[f"ps{c[0]}-h{c[1]}-d{c[2]}-{c[3]}-x{c[4]}-P{c[7]}" for c in SPARSE_CASES],
)
def test_sparse(gen, ps, h_q, d_qk, fmt, xfmt, q_lens, stride, P, with_sink):
    batch = len(q_lens)
    cache_lens = [int(torch.randint(20, 90, (), generator=gen)) for _ in range(batch)]
    cache = build_cache(fmt, d_qk, ps, cache_lens, q_lens, gen, h_q)
    topk = [stride - 3, 0] + [stride] * batch  # request 1 (if any) sees no main key
    topk = topk[:batch]
    idx, valid = sparse_indices(cache, q_lens, stride, gen, topk)
    kw = dict(indices=idx, topk_lengths=torch.tensor(topk, dtype=torch.int32, device=DEV))
    xvalid = [[] for _ in valid]
    xcache = None
    if xfmt is not None:
        xlens = [int(torch.randint(8, 40, (), generator=gen)) for _ in range(batch)]
        xcache = build_cache(xfmt, d_qk, 16, xlens, [0] * batch, gen, h_q)
        xstride = 12
        xtopk = [xstride, 5] + [xstride] * batch
        xtopk = xtopk[:batch]
        xidx, xvalid = sparse_indices(xcache, q_lens, xstride, gen, xtopk)
        kw.update(
            extra_kv=xcache.operand(),
            extra_indices=xidx,
            extra_topk_lengths=torch.tensor(xtopk, dtype=torch.int32, device=DEV),
        )
    offs = ragged_offsets(q_lens).tolist()
    q = make_q(offs[-1], h_q, d_qk, gen)
    sink = make_sinks(h_q, gen) if with_sink else None
    o, lse = run(q, cache.operand(), q_lens, attn_sink=sink, num_partitions=P, **kw)

    def keys_of(b, i):
        t = offs[b] + i
        keys = [cache.at(e) for e in valid[t]] + [xcache.at(e) for e in xvalid[t]]
        if not keys:
            return torch.zeros(0, d_qk, dtype=torch.float64)
        return torch.stack(keys)

    ref_o, ref_lse = oracle(q, offs, keys_of, sink=sink)
    tols = [tol_for(fmt, d_qk)] + ([tol_for(xfmt, d_qk)] if xfmt else [])
    tol = max(tols, key=lambda t: t["cos_tol"])
    check(o, lse, ref_o, ref_lse, tol)
    ref = reference_or_none()
    if ref is not None:
        r_o, r_lse = ref(q, cache.operand(), ragged_offsets(q_lens, q.device), attn_sink=sink, **kw)
        check(o, lse, r_o, r_lse, tol)


@pytest.mark.parametrize("P", [1, 3])
def test_sparse_nothing_visible(gen, P):
    """topk_length 0 and all-invalid rows: out 0, lse -inf; with a finite sink still 0."""
    cache = build_cache("v32", 576, 16, [30, 12], [1, 1], gen, 16)
    bad = invalid_kinds(cache)
    idx = torch.tensor([bad * 3, [cache.encode(1, 0)] * 18], dtype=torch.int32, device=DEV)
    topk = torch.tensor([18, 0], dtype=torch.int32, device=DEV)
    sink = torch.randn(16, generator=gen).to(DEV)
    o, lse = run(make_q(2, 16, 576, gen), cache.operand(), [1, 1], indices=idx,
                 topk_lengths=topk, attn_sink=sink, num_partitions=P)  # fmt: skip
    assert torch.all(o == 0)
    assert torch.all(lse == float("-inf"))


def test_sparse_without_topk_lengths_and_per_token_lengths(gen):
    """topk_lengths=None: every entry of the row is a candidate (validated by range only);
    [tokens] lengths: one length per query token."""
    q_lens = [2, 1]
    cache = build_cache("bf16", 512, 1, [25, 9], q_lens, gen, 20)
    stride = 21
    idx, valid = sparse_indices(cache, q_lens, stride, gen, [stride, stride])
    offs = ragged_offsets(q_lens).tolist()
    q = make_q(3, 20, 512, gen)
    o, lse = run(q, cache.operand(), q_lens, indices=idx)

    def keys_of(b, i):
        return torch.stack([cache.at(e) for e in valid[offs[b] + i]])

    check(o, lse, *oracle(q, offs, keys_of))
    per_tok = torch.tensor([stride, 4, 0], dtype=torch.int32, device=DEV)
    o, lse = run(q, cache.operand(), q_lens, indices=idx, topk_lengths=per_tok)
    idx_c = idx.cpu().tolist()

    def keys_of_tok(b, i):
        t = offs[b] + i
        n = int(per_tok[t])
        ok = [e for e in idx_c[t][:n] if 0 <= e < cache.slots]
        if not ok:
            return torch.zeros(0, 512, dtype=torch.float64)
        return torch.stack([cache.at(e) for e in ok])

    check(o, lse, *oracle(q, offs, keys_of_tok))


# --------------------------------------------------------------------------------------------
# Arguments
# --------------------------------------------------------------------------------------------
def test_invalid_arguments(gen):
    cache = build_cache("bf16", 576, 16, [4], [1], gen, 2)
    q = make_q(1, 2, 576, gen)
    offs = ragged_offsets([1], DEV)
    with pytest.raises(InvalidArgumentError):
        mla_decode_triton(q.float(), cache.operand(), offs)
    with pytest.raises(InvalidArgumentError):
        mla_decode_triton(q[..., :500], cache.operand(), offs)
    with pytest.raises(InvalidArgumentError):
        mla_decode_triton(q, cache.operand(), offs, d_v=600)
    with pytest.raises(InvalidArgumentError):
        mla_decode_triton(q, cache.operand(), offs, num_partitions=0)
    with pytest.raises(InvalidArgumentError):
        mla_decode_triton(q, cache.operand(), offs, extra_kv=cache.operand())
    with pytest.raises(InvalidArgumentError):
        mla_decode_triton(q, cache.operand(), offs, attn_sink=torch.zeros(3, device=DEV))


@pytest.mark.parametrize("sparse", [False, True])
def test_sm90_tile_takes_the_seesaw_kernel_for_bf16_and_v32(sparse, monkeypatch):
    """The 64-row sm_90 tile goes to the warp-specialized seesaw kernel for BF16 and V32
    caches, to the key-split kernel for rope-aware FP8 (and when the seesaw is turned off)."""
    import pagedattn.ops.mla.triton_mla_plan as M

    for h_q in (1, 20, 64, 128):
        assert M._sm90_config(h_q, sparse, M.FMT_BF16)["SS"]
        assert M._sm90_config(h_q, sparse, M.FMT_V32)["SS"]
        assert not M._sm90_config(h_q, sparse, M.FMT_ROPE_AWARE)["SS"]
    set_tuning(monkeypatch, {"sm90_ss": False})
    assert not M._sm90_config(128, sparse, M.FMT_BF16)["SS"]


def test_tma_seesaw_serves_dense_bf16_pages_of_whole_tiles(gen, monkeypatch):
    """The TMA-fed seesaw (gluon_mla_st) takes dense BF16 caches whose pages hold whole 64-key
    tiles; other pages, sparse decode, other formats and `MLATuning` ss_tma False keep the
    cp.async seesaw."""
    import pagedattn.ops.mla.triton_mla_plan as M

    def operand(fmt, ps):
        return M.OperandArgs(build_cache(fmt, 576, ps, [3], [1], gen).operand(), 576, BF16, "kv")

    for ps in (64, 128, 256):
        assert M._st_eligible(operand("bf16", ps), sparse=False)
        assert not M._st_eligible(operand("bf16", ps), sparse=True)
    for ps in (1, 16, 32, 96):
        assert not M._st_eligible(operand("bf16", ps), sparse=False)
    assert not M._st_eligible(operand("v32", 64), sparse=False)
    set_tuning(monkeypatch, {"ss_tma": False})
    assert not M._st_eligible(operand("bf16", 64), sparse=False)


@pytest.mark.skipif(not HAS_GLUON_ST, reason="needs Triton with Gluon")
def test_tma_seesaw_chunk_descriptor_sees_each_rows_64_column_chunks(gen):
    """The 3D TMA descriptor of the TMA-fed seesaw (one box a column half) views cache rows as
    [chunk, row, 64]: element (c, r, j) is row r's column 64 c + j, and a [4, 64, 64] box is the
    four chunks of a column half."""
    from pagedattn.ops.mla.sm90.gluon_mla_st import st_descriptors

    rows = build_cache("bf16", 576, 64, [3], [1], gen).operand().kernel_args().rows
    d = st_descriptors(rows)[1]
    assert d.block_shape == [4, 64, 64] and d.shape == [9, rows.shape[0], 64]
    seen = torch.as_strided(rows, d.shape, d.strides, rows.storage_offset())
    want = rows[:, 0].unflatten(1, (9, 64)).permute(1, 0, 2)
    assert torch.equal(seen.view(torch.int16), want.view(torch.int16))  # NaN-poisoned slots


@pytest.mark.parametrize("sparse", [False, True])
def test_small_rope_aware_tile_takes_the_warp_specialized_kernel(sparse, monkeypatch):
    """Rope-aware FP8 with at most 16 query rows a tile goes to the warp-specialized keys-as-M
    kernel (3 ring stages, 4 on an H200); BF16 and 32-row tiles stay on the one-warpgroup
    kernel, and so does rope-aware FP8 when the tuning turns the warp-specialized kernel off."""
    import pagedattn.ops.mla.triton_mla_plan as M

    for h_q in (1, 5, 16):
        cfg = M._sm90_t_config(h_q, 128, 128, sparse, M.FMT_ROPE_AWARE)
        assert cfg["TW"] and cfg["NR"] == 16 and cfg["NBUF"] == 3
        cfg = M._sm90_t_config(h_q, 128, 128, sparse, M.FMT_ROPE_AWARE, hbm3e=True)
        assert cfg["TW"] and cfg["NBUF"] == 4
        assert M._sm90_t_config(h_q, 128, 128, sparse, M.FMT_BF16, hbm3e=True)["NBUF"] == 2
        assert not M._sm90_t_config(h_q, 128, 128, sparse, M.FMT_BF16)["TW"]
    assert not M._sm90_t_config(20, 128, 128, sparse, M.FMT_BF16)["TW"]
    assert M._sm90_t_config(20, 128, 128, sparse, M.FMT_ROPE_AWARE) is None
    set_tuning(monkeypatch, {"sm90_tw": False})
    cfg = M._sm90_t_config(16, 128, 128, sparse, M.FMT_ROPE_AWARE)
    assert not cfg["TW"] and cfg["NBUF"] == 2


def test_tuning_is_frozen_configuration_with_checked_overrides(gen, monkeypatch):
    """`MLATuning` is frozen; `replace` and PAGEDATTN_MLA_TUNING override fields by name (None
    restores the shipped default) and an unknown name raises InvalidArgumentError naming it, from
    the variable as from `mla_decode_triton(config=None)`, which reads it at each call."""
    from pagedattn.ops.mla import tuning

    shipped = tuning.MLATuning()
    with pytest.raises(dataclasses.FrozenInstanceError):
        shipped.sm90.sm90_bn = 32
    t = shipped.replace(sm90_bn=32, ss_regs=(208, 96), gluon=False)
    assert (t.sm90.sm90_bn, t.ss.ss_regs, t.gluon) == (32, (208, 96), False)
    assert t.replace(sm90_bn=None, ss_regs=None, gluon=None) == shipped
    with pytest.raises(InvalidArgumentError, match="sm90_bm"):
        shipped.replace(sm90_bm=32)
    monkeypatch.setenv("PAGEDATTN_MLA_TUNING", json.dumps({"tw_nbuf": 5, "ss_regs": [200, 96]}))
    assert tuning.from_env() == shipped.replace(tw_nbuf=5, ss_regs=(200, 96))
    monkeypatch.setenv("PAGEDATTN_MLA_TUNING", json.dumps({"tw_nbuf": 5, "no_such_knob": 1}))
    with pytest.raises(InvalidArgumentError, match="no_such_knob"):
        tuning.from_env()
    cache = build_cache("bf16", 576, 16, [4], [1], gen, 2)
    with pytest.raises(InvalidArgumentError, match="no_such_knob"):
        mla_decode_triton(make_q(1, 2, 576, gen), cache.operand(), ragged_offsets([1], DEV))


def test_empty_batch():
    params = KVCacheParams(BF16, 1, 1, 576, 16, is_mla=True, num_q_heads=4, devices=(DEV,))
    pc = make_paged_cache(params, [3], [1], device=DEV)
    kv = PagedOperand(pc.inputs, params, 0, "k")
    q = torch.empty(0, 4, 576, dtype=BF16, device=DEV)
    offs = torch.zeros(2, dtype=torch.int32, device=DEV)
    o, lse = mla_decode_triton(q, kv, offs)
    assert o.shape == (0, 4, 512) and lse.shape == (0, 4)


# --------------------------------------------------------------------------------------------
# GPU: the full grid and CUDA graphs
# --------------------------------------------------------------------------------------------
GPU_FORMATS = [(f, d) for f, (_, dims, _) in FORMATS.items() for d in dims]


@pytest.mark.gpu
@pytest.mark.parametrize("ps", [1, 16, 64, 128], ids=lambda p: f"page{p}")
@pytest.mark.parametrize("s_q", [1, 2, 4], ids=lambda s: f"sq{s}")
@pytest.mark.parametrize("h_q", [1, 16, 20, 64, 128])
@pytest.mark.parametrize("fmt,d_qk", GPU_FORMATS, ids=[f"{f}-{d}" for f, d in GPU_FORMATS])
@pytest.mark.parametrize("mode", ["dense", "sparse"])
def test_gpu_grid(mode, fmt, d_qk, h_q, s_q, ps):
    """Every (mode, format, h_q) at every s_q in {1, 2, 4} and page size in {1, 16, 64, 128}:
    a test a case, so that xdist spreads them evenly and a run cut short keeps what it did."""
    _gpu_case(mode, fmt, d_qk, h_q, s_q, ps)


def _gpu_case(mode, fmt, d_qk, h_q, s_q, ps):
    # A stable seed (hash() of a str tuple changes with every interpreter: PYTHONHASHSEED).
    gen = torch.Generator().manual_seed(zlib.crc32(repr((mode, fmt, d_qk, h_q, s_q, ps)).encode()))
    batch = 3
    cache_lens = [700] + [int(torch.randint(0, 400, (), generator=gen)) for _ in range(batch - 1)]
    q_lens = [s_q] * batch
    cache = build_cache(fmt, d_qk, ps, cache_lens, q_lens, gen, h_q)
    offs = ragged_offsets(q_lens).tolist()
    q = make_q(offs[-1], h_q, d_qk, gen)
    sink = make_sinks(h_q, gen)
    P = 1 + (h_q + s_q + ps) % 4
    if mode == "dense":
        o, lse = run(q, cache.operand(), q_lens, attn_sink=sink, num_partitions=P)
        keys_of = dense_keys(cache, cache_lens, q_lens)
    else:
        stride = 160
        topk = [stride, 100, 0]
        idx, valid = sparse_indices(cache, q_lens, stride, gen, topk)
        topk_t = torch.tensor(topk, dtype=torch.int32, device=DEV)
        o, lse = run(q, cache.operand(), q_lens, attn_sink=sink, num_partitions=P,
                     indices=idx, topk_lengths=topk_t)  # fmt: skip

        def keys_of(b, i):
            v = valid[offs[b] + i]
            if not v:
                return torch.zeros(0, d_qk, dtype=torch.float64)
            return torch.stack([cache.at(e) for e in v])

    check(o, lse, *oracle(q, offs, keys_of, sink=sink), tol_for(fmt, d_qk))


@pytest.mark.gpu
@pytest.mark.parametrize("h_q", [100, 128])
@pytest.mark.parametrize("cross", [False, True])
@pytest.mark.parametrize("mode", ["dense", "sparse"])
def test_gpu_v32_cluster_kernel(mode, cross, h_q, monkeypatch):
    """V32 at two head blocks a token (h_q 100: the second block part masked; 128) with and
    without the 2-CTA cluster kernel (`MLATuning` ss_cross, on by default: each CTA dequantizes
    half of every tile and copies it into the other's shared memory) on the grid's cases: s_q
    {1, 2, 4} x pages {1, 16, 64, 128}, odd and even tile counts, partitions 1-4."""

    set_tuning(monkeypatch, {"ss_cross": cross})
    for s_q in (1, 2, 4):
        for ps in (1, 16, 64, 128):
            _gpu_case(mode, "v32", 576, h_q, s_q, ps)


@pytest.mark.gpu
@pytest.mark.parametrize("order", [1, 0])
@pytest.mark.parametrize("h_q", [100, 128])
@pytest.mark.parametrize("batch,s_q,stride", PS_CASES, ids=[f"b{c[0]}-sq{c[1]}" for c in PS_CASES])
def test_gpu_v32_persistent_kernel(batch, s_q, stride, h_q, order, monkeypatch):
    """The persistent cluster kernel (`MLATuning` ss_persist; sparse V32, two head blocks a
    token): with more tokens than clusters (b 40 s_q 2, b 70) a cluster's pairs cut tokens in
    two and the combine merges their partials (s_q 0: ragged query lengths 1-3, the work in
    token order, else by query index where order is 1; ps_order 0: token order
    always); b 7 s_q 4: one token a cluster. Top-k lengths
    full, a third and 0, invalid indices of every kind, a sink, a poisoned output; against the
    float64 oracle."""

    gen = torch.Generator().manual_seed(zlib.crc32(repr(("ps", batch, s_q, stride, h_q)).encode()))
    cache_lens = [int(torch.randint(0, 1500, (), generator=gen)) for _ in range(batch)]
    q_lens = [s_q or 1 + b % 3 for b in range(batch)]
    cache = build_cache("v32", 576, 64, cache_lens, q_lens, gen, h_q)
    topk = [(stride, stride // 3, 0)[b % 3] for b in range(batch)]
    idx, valid = sparse_indices(cache, q_lens, stride, gen, topk)
    offs = ragged_offsets(q_lens).tolist()
    q = make_q(offs[-1], h_q, 576, gen)
    sink = make_sinks(h_q, gen)

    def keys_of(b, i):
        v = valid[offs[b] + i]
        if not v:
            return torch.zeros(0, 576, dtype=torch.float64)
        return torch.stack([cache.at(e) for e in v])

    ref = oracle(q, offs, keys_of, sink=sink)
    set_tuning(monkeypatch, {"ss_persist": True, "ps_order": order})
    topk_t = torch.tensor(topk, dtype=torch.int32, device=DEV)
    o, lse = run(q, cache.operand(), q_lens, attn_sink=sink, num_partitions=1, indices=idx,
                 topk_lengths=topk_t)  # fmt: skip
    check(o, lse, *ref, tol_for("v32", 576))


@pytest.mark.gpu
@pytest.mark.parametrize("ps", [1, 64])
@pytest.mark.parametrize("h_q", [4, 16])
@pytest.mark.parametrize("fmt", ["bf16", "rope_aware"])
def test_gpu_ragged_query_lengths(fmt, h_q, ps):
    """Ragged query lengths (the grid's are uniform) at the head counts of the keys-as-M
    kernels on sm_90 (one token a tile at h_q 16, several at h_q 4): caches shorter than a
    tile and long ones, at 1, 2 and the default partitions; the last set has a request with
    no query token between two that have some."""
    for cache_lens, q_lens in (
        ([3, 0, 20, 9, 1, 17], [1, 3, 2, 1, 4, 2]),
        ([700, 5, 300, 0, 130, 64, 1000], [2, 1, 1, 4, 3, 1, 2]),
        ([5, 40, 700, 9], [2, 0, 1, 1]),
    ):
        gen = torch.Generator().manual_seed(zlib.crc32(repr((fmt, h_q, ps, q_lens)).encode()))
        cache = build_cache(fmt, 576, ps, cache_lens, q_lens, gen, h_q)
        offs = ragged_offsets(q_lens).tolist()
        q = make_q(offs[-1], h_q, 576, gen)
        ref = oracle(q, offs, dense_keys(cache, cache_lens, q_lens))
        for P in (1, 2, None):
            o, lse = run(q, cache.operand(), q_lens, num_partitions=P)
            check(o, lse, *ref, tol_for(fmt, 576))


# `gluon_mla_tw` launch variants (`MLATuning` overrides): the default, its producer's row
# addressing as before 2026-11-28 (run-time page size, int64 row products), 4 and 5 stages,
# the softmax's reduction of the pair (max, largest scale) as before 2026-11-28 (FOLD off),
# the reference max moved on every tile (SPEC off, as before 2026-11-28's fifth session).
TW_VARIANTS = [
    {}, {"tw_psc": False, "tw_addr": False}, {"tw_nbuf": 4}, {"tw_nbuf": 5}, {"tw_fold": False},
    {"tw_spec": False},
]  # fmt: skip


@pytest.mark.gpu
@pytest.mark.parametrize(
    "tuning", TW_VARIANTS, ids=["default", "rows64", "nbuf4", "nbuf5", "pairmax", "nospec"]
)
@pytest.mark.parametrize("mode", ["dense", "sparse"])
def test_gpu_rope_aware_tile_boundaries(mode, tuning, monkeypatch):
    """`gluon_mla_tw` (two consumer warpgroups on alternate tiles) and its launch variants at
    key counts around 64-key tiles: none, one tile (consumer 1 owns only the extra tile of an
    odd count), two, odd and even counts, partial tiles; h_q 16 (one token a tile) and h_q 4
    s_q 2-3 (causal multi-token tiles); pages 1, 48 and 64; partitions 1, 2, 3 and the default;
    a sink. Sparse: top-k lengths of 0, one tile and more, over invalid indices of every kind."""
    cache_lens = [0, 14, 63, 64, 65, 127, 128, 129, 191, 256, 699]
    set_tuning(monkeypatch, tuning)
    for h_q, s_q, ps in ((16, 1, 64), (4, 2, 1), (4, 3, 48)):
        q_lens = [s_q] * len(cache_lens)
        gen = torch.Generator().manual_seed(zlib.crc32(repr(("tw", mode, h_q, ps)).encode()))
        cache = build_cache("rope_aware", 576, ps, cache_lens, q_lens, gen, h_q)
        offs = ragged_offsets(q_lens).tolist()
        q = make_q(offs[-1], h_q, 576, gen)
        sink = make_sinks(h_q, gen)
        kw = {}
        if mode == "dense":
            keys_of = dense_keys(cache, cache_lens, q_lens)
        else:
            topk = [(0, 40, 64, 130, 200)[b % 5] for b in range(len(cache_lens))]
            idx, valid = sparse_indices(cache, q_lens, 200, gen, topk)
            kw = dict(indices=idx, topk_lengths=torch.tensor(topk, dtype=torch.int32,
                                                             device=DEV))  # fmt: skip

            def keys_of(b, i, valid=valid, offs=offs, cache=cache):
                v = valid[offs[b] + i]
                if not v:
                    return torch.zeros(0, 576, dtype=torch.float64)
                return torch.stack([cache.at(e) for e in v])

        ref = oracle(q, offs, keys_of, sink=sink)
        for P in (1, 2, 3, None):
            o, lse = run(q, cache.operand(), q_lens, attn_sink=sink, num_partitions=P, **kw)
            check(o, lse, *ref, tol_for("rope_aware", 576))


@pytest.mark.gpu
@pytest.mark.parametrize(
    "tuning", [{}, {"tw_fold": False}, {"tw_spec": False}], ids=["default", "pairmax", "nospec"]
)
def test_gpu_rope_aware_rising_scores(tuning, monkeypatch):
    """`gluon_mla_tw` where half the heads' running maxima climb along the keys (by ~53 in log2
    units over each request) and the other half's fall: O's and the row sums' rescale on the
    many tiles where a max moves, far past P's and the row sums' ranges. h_q 16 s_q 1 page
    64, and h_q 4 s_q 2 page 48 (causal multi-token tiles); partitions 1, 2 and the default."""
    cache_lens = [0, 64, 699, 2048, 4097]
    set_tuning(monkeypatch, tuning)
    for h_q, s_q, ps in ((16, 1, 64), (4, 2, 48)):
        q_lens = [s_q] * len(cache_lens)
        gen = torch.Generator().manual_seed(zlib.crc32(repr(("rise", h_q, ps)).encode()))
        cache = build_cache("rope_aware", 576, ps, cache_lens, q_lens, gen, h_q, rise=5.5)
        offs = ragged_offsets(q_lens).tolist()
        q = rising_q(offs[-1], h_q, 576, gen)
        ref = oracle(q, offs, dense_keys(cache, cache_lens, q_lens))
        for P in (1, 2, None):
            o, lse = run(q, cache.operand(), q_lens, num_partitions=P)
            check(o, lse, *ref, tol_for("rope_aware", 576))


@pytest.mark.gpu
@pytest.mark.parametrize("ps", [64, 128])
@pytest.mark.parametrize("h_q", [64, 128])
def test_gpu_seesaw_tile_boundaries(h_q, ps):
    """The seesaw kernels (TMA-fed for these pages) at key counts around 64-key tiles: key
    ranges of one tile (a pair's second tile missing), partial tiles past 16 keys (one wgmma
    k-step), odd tile counts, at 1, 2, 3 and the default partitions. (A miscompiled one-tile
    branch once summed P V over a tile's first 16 keys only.)"""
    cache_lens = [0, 14, 15, 16, 47, 62, 63, 64, 126, 127, 128, 191, 699]  # + 1 query token
    q_lens = [1] * len(cache_lens)
    gen = torch.Generator().manual_seed(zlib.crc32(repr(("tiles", h_q, ps)).encode()))
    cache = build_cache("bf16", 576, ps, cache_lens, q_lens, gen, h_q)
    offs = ragged_offsets(q_lens).tolist()
    q = make_q(offs[-1], h_q, 576, gen)
    sink = make_sinks(h_q, gen)
    ref = oracle(q, offs, dense_keys(cache, cache_lens, q_lens), sink=sink)
    for P in (1, 2, 3, None):
        o, lse = run(q, cache.operand(), q_lens, attn_sink=sink, num_partitions=P)
        check(o, lse, *ref, TOL)


@pytest.mark.gpu
def test_gpu_cuda_graph_replay_with_changing_lengths():
    """Capture once with static buffers; refresh lengths, lookup table and queries in place and
    replay: every replay must match the oracle for the new lengths."""
    gen = torch.Generator().manual_seed(1234)
    h_q, ps, max_len = 16, 64, 1024
    cache_lens = [700, 300, 1000]
    q_lens = [1, 1, 1]
    cache = build_cache("rope_aware", 576, ps, [max_len - 1] * 3, q_lens, gen, h_q)
    kv = cache.operand()
    offs_t = ragged_offsets(q_lens, DEV)
    q = make_q(3, h_q, 576, gen)
    out = torch.empty(3, h_q, 512, dtype=BF16, device=DEV)
    cl = cache.inputs.cache_lengths
    cl.copy_(torch.tensor(cache_lens, dtype=torch.int32))
    mla_decode_triton(q, kv, offs_t, out=out, num_partitions=4)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        _, lse = mla_decode_triton(q, kv, offs_t, out=out, num_partitions=4)
    for _ in range(3):
        new = [int(torch.randint(0, max_len - 1, (), generator=gen)) for _ in range(3)]
        cl.copy_(torch.tensor(new, dtype=torch.int32))
        q.copy_(make_q(3, h_q, 576, gen))
        poison_(out)
        graph.replay()
        torch.cuda.synchronize()
        ref = oracle(q, [0, 1, 2, 3], dense_keys(cache, new, q_lens))
        check(out, lse, *ref)
