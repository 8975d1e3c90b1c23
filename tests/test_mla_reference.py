"""`pagedattn.ops.mla.mla_decode` (reference backend) against a float64 loop oracle.

Every case uses fresh random data in caches from `make_paged_cache` (shuffled pages, sentinel
ids in unused lookup-table columns, NaN in every unreferenced slot) and NaN-poisoned output
buffers. The oracle is written independently of the library: it decodes the cache's raw
bytes itself (float64, from the documented byte layout of each format), addresses tokens from
the lookup table itself, and computes the softmax one query token at a time.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from oracles import LAYER, Cache, decode_pool, dense_keys, invalid_kinds, make_sinks, oracle

from pagedattn import (
    DenseOperand,
    InvalidArgumentError,
    KVCacheParams,
    KVQuantConfig,
    PagedOperand,
    RaggedOperand,
    store_kv,
)
from pagedattn.errors import Lazy
from pagedattn.errors import check as check_arg
from pagedattn.fp8 import quantize_blockwise
from pagedattn.ops.mla import (
    MAX_Q_PER_REQUEST,
    mla_decode,
    mla_decode_reference,
)
from pagedattn.testing import BF16_TOL, assert_close, make_paged_cache, poison_, ragged_offsets

BF16, F32, E8M0 = torch.bfloat16, torch.float32, torch.float8_e8m0fnu
# LSE in float32: |lse| is O(1..10); float32 rounding of the sums stays far below 1e-4.
LSE_TOL = dict(abs_tol=1e-4, rel_tol=1e-5, cos_tol=1e-10)
ROPE = 64

# name -> (KVQuantConfig factory or None, d_qk values the format supports)
FORMATS = {
    "bf16": (lambda: None, (576, 512)),
    "fp8_g64_f32": (lambda: KVQuantConfig.blockwise(64), (576, 512)),
    "fp8_g64_e8m0": (lambda: KVQuantConfig.blockwise(64, E8M0), (576, 512)),
    "fp8_g128_f32": (lambda: KVQuantConfig.blockwise(128), (512,)),
    "fp8_g128_e8m0": (lambda: KVQuantConfig.blockwise(128, E8M0), (512,)),
    "fp8_token_e8m0": (lambda: KVQuantConfig.per_token(E8M0), (576, 512)),
    "fp8_per_tensor": (lambda: KVQuantConfig.per_tensor(), (576, 512)),
    "rope_aware": (lambda: KVQuantConfig.mla_rope_aware(), (576, 512)),
    "v32": (lambda: KVQuantConfig.flashmla_v32(), (576,)),
    "model1": (lambda: KVQuantConfig.flashmla_model1(), (512,)),
}
PER_TENSOR_SCALE = 0.0125  # |x| <= ~5.6 for randn values: x / s stays inside e4m3's range


# --------------------------------------------------------------------------------------------
# Caches, queries and the oracle
# --------------------------------------------------------------------------------------------
def write_tokens(params: KVCacheParams, inputs, x: torch.Tensor, seq: list[int]) -> None:
    """Write x [sum(seq), 1, d] at positions 0..seq[b]-1 of each request of layer LAYER."""
    if params.quant_format == "blockwise" and params.scale_dtype == E8M0:
        # store_kv's reference cannot write e8m0 scales yet (torch has no index_put for
        # float8_e8m0fnu): write the quantized tokens one slot at a time here.
        raw, sc = quantize_blockwise(x.float(), params.scale_granularity, E8M0)
        lut, ps, t = inputs.lookup_table.tolist(), params.page_size, 0
        for b, n in enumerate(seq):
            for j in range(n):
                page, slot = lut[b][j // ps], j % ps
                inputs.kv_blocks[page, 0, LAYER, slot] = raw[t]
                inputs.kv_scales[page, 0, LAYER, slot] = sc[t]
                t += 1
        return
    zero = dataclasses.replace(inputs, cache_lengths=torch.zeros(len(seq), dtype=torch.int32))
    store_kv(x, None, zero, params, LAYER, ragged_offsets(seq), backend="reference")


def build_cache(fmt, d_qk, page_size, cache_lens, q_lens, gen, h_q=16) -> Cache:
    """A 2-layer MLA cache whose first cache_len + q_len tokens of each request hold fresh
    random bf16 values (quantized by store_kv into the format); every other slot is NaN."""
    factory, dims = FORMATS[fmt]
    assert d_qk in dims
    params = KVCacheParams(
        BF16,
        2,
        1,
        d_qk,
        page_size,
        is_mla=True,
        num_q_heads=h_q,
        quantization=factory(),
        mla_rope_dim=ROPE,
    )
    pc = make_paged_cache(params, cache_lens, q_lens, generator=gen)
    if params.quant_format == "per_tensor":
        pc.inputs.kv_scales.fill_(PER_TENSOR_SCALE)
    seq = pc.seq_lens
    total = sum(seq)
    x = torch.randn(total, 1, d_qk, generator=gen)
    # Vary magnitudes across tokens so that quantization scales differ.
    x = (x * torch.exp(torch.randn(total, 1, 1, generator=gen) * 0.3)).clamp(-5.5, 5.5)
    write_tokens(params, pc.inputs, x.to(BF16), seq)
    pool = decode_pool(params, pc.inputs, LAYER)
    return Cache(params, pc.inputs, seq, pool, pc.inputs.lookup_table.tolist())


def make_q(tokens, h_q, d_qk, gen, dtype=BF16):
    return (torch.randn(tokens, h_q, d_qk, generator=gen) * 2).to(dtype)


def run(q, kv, offsets_t, **kw):
    tokens, h_q, _ = q.shape
    d_v = kw.get("d_v", 512)
    out = poison_(torch.empty(tokens, h_q, d_v, dtype=q.dtype))
    o, lse = mla_decode(q, kv, offsets_t, out=out, backend="reference", **kw)
    assert o is out and lse.dtype == F32 and lse.shape == (tokens, h_q)
    return o, lse


def check(o, lse, ref_o, ref_lse, tol=BF16_TOL):
    assert_close(o, ref_o, **tol, name="out")
    assert_close(lse, ref_lse, **LSE_TOL, name="lse")


def offsets_list(q_lens):
    return ragged_offsets(q_lens).tolist()


# --------------------------------------------------------------------------------------------
# Dense
# --------------------------------------------------------------------------------------------
DENSE_CASES = [
    # page_size, h_q, d_qk, format, cache_lens, q_lens, causal, d_v
    (1, 16, 576, "bf16", [0, 5, 33], [1, 4, 2], True, 512),
    (16, 20, 576, "fp8_g64_f32", [17, 0, 50], [2, 4, 1], True, 512),
    (64, 1, 576, "fp8_token_e8m0", [70, 3], [4, 1], True, 512),
    (16, 16, 512, "fp8_g128_f32", [31, 9], [1, 2], True, 512),
    (64, 20, 512, "fp8_g128_e8m0", [65, 0], [2, 4], True, 448),
    (1, 1, 512, "fp8_g64_e8m0", [12, 3], [4, 1], False, 512),
    (16, 16, 576, "fp8_per_tensor", [20, 40, 0], [1, 2, 8], True, 512),
    (16, 16, 576, "bf16", [7, 0], [3, 2], False, 256),
    (16, 16, 576, "rope_aware", [21, 2], [2, 4], True, 512),
    (1, 20, 512, "rope_aware", [9], [3], True, 512),
    (64, 16, 576, "v32", [80, 0], [1, 4], True, 512),
    (16, 20, 512, "model1", [33, 5], [4, 1], True, 512),
    (1, 1, 512, "model1", [6, 0], [2, 3], False, 512),
]


@pytest.mark.parametrize(
    "ps,h_q,d_qk,fmt,cache_lens,q_lens,causal,d_v",
    DENSE_CASES,
    ids=[f"ps{c[0]}-h{c[1]}-d{c[2]}-{c[3]}-{'causal' if c[6] else 'null'}" for c in DENSE_CASES],
)
@pytest.mark.parametrize("with_sink", [False, True], ids=["nosink", "sink"])
def test_dense(gen, ps, h_q, d_qk, fmt, cache_lens, q_lens, causal, d_v, with_sink):
    cache = build_cache(fmt, d_qk, ps, cache_lens, q_lens, gen, h_q)
    offs = offsets_list(q_lens)
    q = make_q(offs[-1], h_q, d_qk, gen)
    sink = make_sinks(h_q, gen) if with_sink else None
    o, lse = run(q, cache.operand(), ragged_offsets(q_lens), d_v=d_v, causal=causal, attn_sink=sink)
    ref_o, ref_lse = oracle(q, offs, dense_keys(cache, cache_lens, q_lens, causal), d_v, sink=sink)
    check(o, lse, ref_o, ref_lse)
    if with_sink and h_q > 1:
        assert torch.all(o[:, 0] == 0), "a sink of +inf must give output 0"


def test_unreferenced_slots_really_hold_nan(gen):
    """The adversarial premise of every test here: the pool has NaN wherever no token is."""
    cache = build_cache("bf16", 576, 16, [5, 20], [1, 1], gen)
    assert torch.isnan(cache.pool).any()
    for b, n in enumerate(cache.seq_lens):
        assert not torch.isnan(torch.stack([cache.key(b, j) for j in range(n)])).any()


def test_explicit_scale_and_fp32_queries(gen):
    params = KVCacheParams(F32, 2, 1, 576, 16, is_mla=True, num_q_heads=4)
    pc = make_paged_cache(params, [9, 30], [2, 1], generator=gen)
    x = torch.randn(sum(pc.seq_lens), 1, 576, generator=gen)
    zero = dataclasses.replace(pc.inputs, cache_lengths=torch.zeros(2, dtype=torch.int32))
    store_kv(x, None, zero, params, LAYER, ragged_offsets(pc.seq_lens))
    pool = pc.inputs.kv_blocks[:, 0, LAYER, :, 0, :].double()
    cache = Cache(params, pc.inputs, pc.seq_lens, pool, pc.inputs.lookup_table.tolist())
    q = make_q(3, 4, 576, gen, F32)
    o, lse = run(q, cache.operand(), ragged_offsets([2, 1]), scale=0.07)
    ref_o, ref_lse = oracle(q, [0, 2, 3], dense_keys(cache, [9, 30], [2, 1], True), 512, 0.07)
    check(o, lse, ref_o, ref_lse, dict(abs_tol=2e-5, rel_tol=1e-4, cos_tol=1e-10))


# --------------------------------------------------------------------------------------------
# Sparse (+ extra cache)
# --------------------------------------------------------------------------------------------
def nan_slots(cache: Cache) -> list[int]:
    """Encoded in-range slots no token was written to (they hold NaN)."""
    written = {cache.encode(b, j) for b, n in enumerate(cache.seq_lens) for j in range(n)}
    return [e for e in range(cache.slots) if e not in written]


def build_indices(cache: Cache, offs, stride, topk, gen):
    """[tokens, stride] int32 rows for each query of each request: within topk[b], a random
    mix of valid encodings (of the request's own tokens, duplicates allowed) and every invalid
    kind; past topk[b], NaN slots and valid encodings that must be ignored.
    Returns (indices, oracle list of the valid encodings of each token)."""
    tokens = offs[-1]
    bad = invalid_kinds(cache)
    nan = nan_slots(cache)
    idx = torch.empty(tokens, stride, dtype=torch.int32)
    valid = []
    for b in range(len(offs) - 1):
        n = cache.seq_lens[b]
        lim = stride if topk is None else max(0, min(topk[b], stride))
        for t in range(offs[b], offs[b + 1]):
            row = []
            for p in range(stride):
                r = int(torch.randint(0, 4, (), generator=gen))
                if p < lim:
                    if r == 0 or n == 0:
                        row.append(bad[int(torch.randint(0, len(bad), (), generator=gen))])
                    else:
                        row.append(cache.encode(b, int(torch.randint(0, n, (), generator=gen))))
                elif r < 2 and nan:
                    row.append(nan[int(torch.randint(0, len(nan), (), generator=gen))])
                elif n:
                    row.append(cache.encode(b, int(torch.randint(0, n, (), generator=gen))))
                else:
                    row.append(-1)
            idx[t] = torch.tensor(row, dtype=torch.int32)
            valid.append([e for e in row[:lim] if 0 <= e < cache.slots])
    return idx, valid


SPARSE_CASES = [
    # ps, h_q, d_qk, fmt, extra (fmt, ps) or None, topk_lengths kind
    (16, 16, 576, "bf16", None, "lengths"),
    (1, 20, 576, "fp8_g64_e8m0", ("bf16", 64), "lengths"),
    (64, 1, 576, "v32", ("fp8_g64_f32", 1), "none"),
    (16, 16, 512, "model1", ("fp8_g128_e8m0", 16), "lengths"),
    (64, 20, 512, "fp8_g128_f32", ("model1", 64), "over"),
    (16, 16, 576, "rope_aware", ("v32", 16), "lengths"),
    (1, 16, 576, "fp8_per_tensor", ("rope_aware", 1), "lengths"),
]


@pytest.mark.parametrize(
    "ps,h_q,d_qk,fmt,extra,topk_kind",
    SPARSE_CASES,
    ids=[f"ps{c[0]}-h{c[1]}-d{c[2]}-{c[3]}-extra_{c[4]}-{c[5]}" for c in SPARSE_CASES],
)
@pytest.mark.parametrize("with_sink", [False, True], ids=["nosink", "sink"])
def test_sparse(gen, ps, h_q, d_qk, fmt, extra, topk_kind, with_sink):
    cache_lens, q_lens = [40, 3, 0, 17], [2, 1, 4, 1]
    offs = offsets_list(q_lens)
    cache = build_cache(fmt, d_qk, ps, cache_lens, q_lens, gen, h_q)
    stride = 24
    topk = {
        "lengths": [13, 0, 24, 5],  # 0: nothing from the main cache for request 1
        "none": None,
        "over": [30, 2, 100, 24],  # past the stride: every position counts
    }[topk_kind]
    idx, valid = build_indices(cache, offs, stride, topk, gen)
    kw = dict(indices=idx, topk_lengths=None if topk is None else torch.tensor(topk).int())
    keys_main = [[cache.at(e) for e in v] for v in valid]
    keys_extra = [[] for _ in valid]
    if extra is not None:
        efmt, eps = extra
        ecache = build_cache(efmt, d_qk, eps, [25, 9, 2, 0], [0, 0, 0, 0], gen, h_q)
        etopk = [7, 10, 0, 3]
        eidx, evalid = build_indices(ecache, offs, 10, etopk, gen)
        keys_extra = [[ecache.at(e) for e in v] for v in evalid]
        kw.update(
            extra_kv=ecache.operand(),
            extra_indices=eidx,
            extra_topk_lengths=torch.tensor(etopk).int(),
        )
    q = make_q(offs[-1], h_q, d_qk, gen)
    sink = make_sinks(h_q, gen) if with_sink else None
    o, lse = run(q, cache.operand(), ragged_offsets(q_lens), attn_sink=sink, **kw)

    def keys_of(b, i):
        ks = keys_main[offs[b] + i] + keys_extra[offs[b] + i]
        return torch.stack(ks) if ks else torch.zeros(0, d_qk, dtype=torch.float64)

    ref_o, ref_lse = oracle(q, offs, keys_of, 512, sink=sink)
    check(o, lse, ref_o, ref_lse)


def test_no_visible_key_gives_zero_and_minus_inf(gen):
    q_lens = [2, 1]
    cache = build_cache("bf16", 576, 16, [10, 4], q_lens, gen)
    idx, _ = build_indices(cache, [0, 2, 3], 8, [8, 8], gen)
    q = make_q(3, 16, 576, gen)
    for sink in (None, make_sinks(16, gen)):
        o, lse = run(
            q,
            cache.operand(),
            ragged_offsets(q_lens),
            indices=idx,
            topk_lengths=torch.zeros(2, dtype=torch.int32),
            attn_sink=sink,
        )
        assert torch.all(o == 0) and torch.all(lse == -math.inf)
    # Only invalid entries: the same.
    bad = torch.tensor(invalid_kinds(cache), dtype=torch.int32).repeat(3, 1)
    o, lse = run(q, cache.operand(), ragged_offsets(q_lens), indices=bad)
    assert torch.all(o == 0) and torch.all(lse == -math.inf)


def test_empty_index_rows(gen):
    """stride 0 in the main cache; the extra cache alone supplies the keys."""
    q_lens = [1, 2]
    offs = offsets_list(q_lens)
    cache = build_cache("bf16", 576, 16, [3, 4], q_lens, gen)
    ecache = build_cache("fp8_g64_f32", 576, 1, [12, 6], [0, 0], gen)
    eidx, evalid = build_indices(ecache, offs, 6, None, gen)
    q = make_q(3, 16, 576, gen)
    o, lse = run(
        q,
        cache.operand(),
        ragged_offsets(q_lens),
        indices=torch.empty(3, 0, dtype=torch.int32),
        extra_kv=ecache.operand(),
        extra_indices=eidx,
    )

    def keys_of(b, i):
        ks = [ecache.at(e) for e in evalid[offs[b] + i]]
        return torch.stack(ks) if ks else torch.zeros(0, 576, dtype=torch.float64)

    check(o, lse, *oracle(q, offs, keys_of, 512))


def test_dense_main_with_extra_cache(gen):
    """Dense causal main keys joined with a sparse extra cache in one softmax."""
    cache_lens, q_lens = [6, 20], [3, 1]
    offs = offsets_list(q_lens)
    cache = build_cache("fp8_g64_f32", 576, 16, cache_lens, q_lens, gen)
    ecache = build_cache("bf16", 576, 64, [30, 8], [0, 0], gen)
    eidx, evalid = build_indices(ecache, offs, 5, [4, 5], gen)
    q = make_q(4, 16, 576, gen)
    o, lse = run(
        q,
        cache.operand(),
        ragged_offsets(q_lens),
        extra_kv=ecache.operand(),
        extra_indices=eidx,
        extra_topk_lengths=torch.tensor([4, 5], dtype=torch.int32),
    )
    dense = dense_keys(cache, cache_lens, q_lens, True)

    def keys_of(b, i):
        ks = [ecache.at(e) for e in evalid[offs[b] + i]]
        return torch.cat([dense(b, i), torch.stack(ks)]) if ks else dense(b, i)

    check(o, lse, *oracle(q, offs, keys_of, 512))


# --------------------------------------------------------------------------------------------
# Split-K
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["dense", "sparse_extra"])
def test_split_k_invariance(gen, mode):
    cache_lens, q_lens = [90, 0, 33, 7], [1, 4, 2, 8]
    offs = offsets_list(q_lens)
    cache = build_cache("fp8_g64_f32", 576, 16, cache_lens, q_lens, gen)
    q = make_q(offs[-1], 16, 576, gen)
    sink = make_sinks(16, gen)
    kw = dict(attn_sink=sink)
    if mode == "dense":
        keys_of = dense_keys(cache, cache_lens, q_lens, True)
    else:
        topk = [40, 3, 0, 17]
        idx, valid = build_indices(cache, offs, 40, topk, gen)
        ecache = build_cache("bf16", 576, 1, [20, 20, 20, 20], [0, 0, 0, 0], gen)
        eidx, evalid = build_indices(ecache, offs, 9, [9, 0, 4, 9], gen)
        kw.update(
            indices=idx,
            topk_lengths=torch.tensor(topk).int(),
            extra_kv=ecache.operand(),
            extra_indices=eidx,
            extra_topk_lengths=torch.tensor([9, 0, 4, 9]).int(),
        )

        def keys_of(b, i):
            t = offs[b] + i
            ks = [cache.at(e) for e in valid[t]] + [ecache.at(e) for e in evalid[t]]
            return torch.stack(ks) if ks else torch.zeros(0, 576, dtype=torch.float64)

    ref_o, ref_lse = oracle(q, offs, keys_of, 512, sink=sink)
    o1, lse1 = run(q, cache.operand(), ragged_offsets(q_lens), num_partitions=1, **kw)
    check(o1, lse1, ref_o, ref_lse)
    for P in (2, 7, 32):
        o, lse = run(q, cache.operand(), ragged_offsets(q_lens), num_partitions=P, **kw)
        check(o, lse, ref_o, ref_lse)
        assert_close(o, o1, **BF16_TOL, name=f"out P={P} vs P=1")
        assert_close(lse, lse1, abs_tol=1e-5, rel_tol=1e-6, cos_tol=1e-12, name="lse")


# --------------------------------------------------------------------------------------------
# Non-paged operands, addressing helpers
# --------------------------------------------------------------------------------------------
def test_dense_and_ragged_operands(gen):
    B, S, d = 2, 12, 576
    x = torch.randn(B, S, 1, d, generator=gen).to(BF16)
    cl = [5, 9]
    q_lens = [3, 2]
    filled = x.clone()
    for b in range(B):
        filled[b, cl[b] + q_lens[b] :] = float("nan")  # past each request's keys
    op = DenseOperand(filled, torch.tensor(cl, dtype=torch.int32))
    q = make_q(5, 4, d, gen)
    offs = offsets_list(q_lens)
    o, lse = run(q, op, ragged_offsets(q_lens))

    def keys_of(b, i):
        return x[b, : cl[b] + i + 1, 0].double()

    check(o, lse, *oracle(q, offs, keys_of, 512))
    # Sparse over a non-paged operand: indices are row ids in [0, B*S) (valid rows: 0..7 and
    # 12..22; B*S is one past the end).
    idx = torch.tensor([[0, 13, -1, 22], [5, 20, 2**31 - 1, 1]] * 2 + [[14, 14, 0, B * S]])
    o, lse = run(q, op, ragged_offsets(q_lens), indices=idx.int())
    flat = x.reshape(B * S, d).double()

    def keys_of_sparse(b, i):
        return torch.stack([flat[e] for e in idx[offs[b] + i].tolist() if 0 <= e < B * S])

    check(o, lse, *oracle(q, offs, keys_of_sparse, 512))
    # Ragged operand (no cached prefix): request b reads its q_len(b) rows from its offset.
    rag = RaggedOperand(x.reshape(B * S, 1, d)[:9], ragged_offsets([4, 5]))
    o, lse = run(q, rag, ragged_offsets(q_lens), causal=False)
    starts = [0, 4]
    check(o, lse, *oracle(q, offs, lambda b, i: flat[starts[b] : starts[b] + q_lens[b]], 512))


@pytest.mark.parametrize("ps", [1, 16, 64])
def test_tma_rows_matches_get_tma_row(gen, ps):
    cache = build_cache("bf16", 576, ps, [70, 3], [1, 1], gen)
    op = cache.operand()
    assert op.num_sparse_slots() == cache.slots
    enc = torch.randint(0, cache.slots, (50,), generator=gen)
    rows = op.tma_rows(enc)
    assert rows.tolist() == [op.get_tma_row(int(e)) for e in enc]
    for b, n in enumerate(cache.seq_lens):
        for j in range(0, n, 7):
            assert op.get_tma_row(cache.encode(b, j)) == op.row_idx(b, j)


# --------------------------------------------------------------------------------------------
# Dispatch and errors
# --------------------------------------------------------------------------------------------
def test_public_op_matches_reference_and_lazy_export(gen):
    import pagedattn

    cache = build_cache("bf16", 576, 16, [4], [2], gen)
    q = make_q(2, 16, 576, gen)
    a, la = pagedattn.mla_decode(q, cache.operand(), ragged_offsets([2]))
    b, lb = mla_decode_reference(q, cache.operand(), ragged_offsets([2]))
    assert torch.equal(a, b) and torch.equal(la, lb)


def test_triton_backend_refused_on_cpu_without_interpreter(gen, monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    cache = build_cache("bf16", 576, 16, [4], [1], gen)
    q = make_q(1, 16, 576, gen)
    with pytest.raises(InvalidArgumentError, match="backend"):
        mla_decode(q, cache.operand(), ragged_offsets([1]), backend="triton")
    monkeypatch.setenv("PAGEDATTN_BACKEND", "cuda-magic")
    with pytest.raises(InvalidArgumentError, match="backend"):
        mla_decode(q, cache.operand(), ragged_offsets([1]))


@pytest.fixture(scope="module")
def good():
    g = torch.Generator().manual_seed(0)
    cache = build_cache("bf16", 576, 16, [5, 3], [2, 1], g)
    ecache = build_cache("bf16", 512, 16, [5], [0], g)
    return dict(
        q=make_q(3, 16, 576, g),
        kv=cache.operand(),
        q_row_offsets=ragged_offsets([2, 1]),
        ecache=ecache,
    )


def _call(good, **over):
    kw = {k: v for k, v in good.items() if k != "ecache"}
    kw.update(over)
    q, kv, offs = kw.pop("q"), kw.pop("kv"), kw.pop("q_row_offsets")
    return mla_decode(q, kv, offs, backend="reference", **kw)


I32 = torch.int32
BAD = [
    ("q_2d", dict(q=torch.zeros(3, 576, dtype=BF16)), "q"),
    ("q_int", dict(q=torch.zeros(3, 16, 576, dtype=I32)), "q.dtype"),
    ("q_d640", dict(q=torch.zeros(3, 16, 640, dtype=BF16)), "d_qk"),
    ("q_d256_vs_cache", dict(q=torch.zeros(3, 16, 256, dtype=BF16)), "d_v|kv.head_dim"),
    ("q_dtype_vs_cache", dict(q=torch.zeros(3, 16, 576, dtype=torch.float16)), "kv.dtype"),
    ("kv_not_operand", dict(kv=torch.zeros(4, 1, 576)), "kv"),
    ("offsets_int64", dict(q_row_offsets=torch.tensor([0, 2, 3])), "q_row_offsets"),
    ("offsets_batch", dict(q_row_offsets=torch.tensor([0, 3], dtype=I32)), "batch size"),
    (
        "offsets_total",
        dict(q_row_offsets=torch.tensor([0, 2, 4], dtype=I32)),
        r"q_row_offsets\[-1\]",
    ),
    (
        "offsets_start",
        dict(q_row_offsets=torch.tensor([1, 2, 3], dtype=I32)),
        r"q_row_offsets\[0\]",
    ),
    ("d_v_big", dict(d_v=600), "d_v"),
    ("d_v_zero", dict(d_v=0), "d_v"),
    ("scale_neg", dict(scale=-1.0), "scale"),
    ("scale_nan", dict(scale=float("nan")), "scale"),
    ("causal_str", dict(causal="yes"), "causal"),
    ("indices_int64", dict(indices=torch.zeros(3, 4, dtype=torch.int64)), "indices"),
    ("indices_rows", dict(indices=torch.zeros(2, 4, dtype=I32)), "indices"),
    ("topk_without_indices", dict(topk_lengths=torch.zeros(2, dtype=I32)), "topk_lengths"),
    (
        "topk_shape",
        dict(indices=torch.zeros(3, 4, dtype=I32), topk_lengths=torch.zeros(3, dtype=I32)),
        "topk_lengths",
    ),
    ("extra_indices_without_kv", dict(extra_indices=torch.zeros(3, 4, dtype=I32)), "extra_indices"),
    (
        "extra_lengths_without_kv",
        dict(extra_topk_lengths=torch.zeros(2, dtype=I32)),
        "extra_topk_lengths",
    ),
    ("sink_f64", dict(attn_sink=torch.zeros(16, dtype=torch.float64)), "attn_sink"),
    ("sink_shape", dict(attn_sink=torch.zeros(8)), "attn_sink"),
    ("partitions_zero", dict(num_partitions=0), "num_partitions"),
    ("partitions_float", dict(num_partitions=2.0), "num_partitions"),
    ("out_shape", dict(out=torch.zeros(3, 16, 576, dtype=BF16)), "out"),
    ("out_dtype", dict(out=torch.zeros(3, 16, 512)), "out"),
]


@pytest.mark.parametrize("over,match", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_arguments(good, over, match):
    with pytest.raises(InvalidArgumentError, match=match):
        _call(good, **over)


def test_error_messages_describe_the_argument(good):
    """The `got` part of a message (built lazily, only when a check fails) names the value."""
    want = (
        r"out: expected a torch.bfloat16 tensor of shape \(3, 16, 512\) on cpu, "
        r"got torch.float32 tensor of shape \(3, 16, 512\) on cpu"
    )
    with pytest.raises(InvalidArgumentError, match=want):
        _call(good, out=torch.zeros(3, 16, 512))
    calls = []
    check_arg(True, "x", "y", Lazy(lambda: calls.append(1)))
    assert calls == []  # a passing check formats nothing
    with pytest.raises(InvalidArgumentError, match="x: expected y, got 7"):
        check_arg(False, "x", "y", Lazy(lambda: 7))


def test_bad_extra_and_request_limits(good, gen):
    ecache = good["ecache"]
    with pytest.raises(InvalidArgumentError, match="extra_indices"):
        _call(good, extra_kv=good["kv"])
    with pytest.raises(InvalidArgumentError, match="extra_kv.head_dim"):
        _call(good, extra_kv=ecache.operand(), extra_indices=torch.zeros(3, 2, dtype=I32))
    n = MAX_Q_PER_REQUEST + 1
    cache = build_cache("bf16", 576, 16, [2], [n], gen)
    with pytest.raises(InvalidArgumentError, match=f"at most {MAX_Q_PER_REQUEST}"):
        mla_decode(make_q(n, 16, 576, gen), cache.operand(), ragged_offsets([n]))
    # Decreasing offsets.
    with pytest.raises(InvalidArgumentError, match="q_row_offsets"):
        _call(good, q_row_offsets=torch.tensor([0, 4, 3], dtype=I32))


def test_keys_past_the_lookup_table(gen):
    cache = build_cache("bf16", 576, 4, [6], [1], gen)
    lut = cache.inputs.lookup_table
    inputs = dataclasses.replace(cache.inputs, lookup_table=lut[:, :1].contiguous())
    op = PagedOperand(inputs, cache.params, LAYER, "k")
    with pytest.raises(InvalidArgumentError, match="lookup_table"):
        mla_decode(make_q(1, 16, 576, gen), op, ragged_offsets([1]))
    # A sentinel page id where the request reads keys.
    lut2 = lut.clone()
    lut2[0, 1] = cache.pool.shape[0]
    op = PagedOperand(dataclasses.replace(cache.inputs, lookup_table=lut2), cache.params, LAYER)
    with pytest.raises(InvalidArgumentError, match=r"lookup_table\[0, 1\]"):
        mla_decode(make_q(1, 16, 576, gen), op, ragged_offsets([1]))
