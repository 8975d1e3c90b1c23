"""The ops under torch.compile: traced through their torch.library custom ops."""

from __future__ import annotations

import torch

import pagedattn as pa
from pagedattn.ops import masks
from pagedattn.testing import assert_close, make_paged_cache, ragged_offsets


def test_mha_under_torch_compile_matches_eager(gen):
    p = pa.KVCacheParams(torch.float32, 1, 2, 32, 3, num_q_heads=4)
    cache = make_paged_cache(p, [5, 0], [1, 4], generator=gen)
    offs = ragged_offsets([1, 4])
    k = torch.randn(5, 2, 32, generator=gen)
    v = torch.randn(5, 2, 32, generator=gen)
    pa.store_kv(k, v, cache.inputs, p, 0, offs)
    # The cached prefix of request 0 (5 tokens) is NaN: write it too.
    pre = pa.testing.ragged_offsets([5, 0])
    cl = cache.inputs.cache_lengths.clone()
    cache.inputs.cache_lengths.zero_()
    pa.store_kv(
        torch.randn(5, 2, 32, generator=gen),
        torch.randn(5, 2, 32, generator=gen),
        cache.inputs,
        p,
        0,
        pre,
    )
    cache.inputs.cache_lengths.copy_(cl)
    q = torch.randn(5, 4, 32, generator=gen)
    ko = pa.PagedOperand(cache.inputs, p, 0, "k")
    vo = pa.PagedOperand(cache.inputs, p, 0, "v")
    sinks = torch.randn(4, generator=gen)

    def f(q, sinks):
        return pa.mha(
            q, ko, vo, offs, mask=masks.sliding_window_causal(3), sinks=sinks, return_lse=True
        )

    eager = f(q, sinks)
    compiled = torch.compile(f, fullgraph=True)(q, sinks)
    assert_close(compiled[0], eager[0], abs_tol=1e-6, rel_tol=1e-6, cos_tol=1e-9)
    assert_close(compiled[1], eager[1], abs_tol=1e-6, rel_tol=1e-6, cos_tol=1e-9)


def test_mla_decode_sparse_under_torch_compile_matches_eager(gen):
    p = pa.KVCacheParams(torch.bfloat16, 1, 1, 576, 16, is_mla=True, num_q_heads=4)
    cache = make_paged_cache(p, [0, 0], [20, 7], generator=gen)
    lat = torch.randn(27, 1, 576, generator=gen).bfloat16()
    cache.inputs.cache_lengths.zero_()
    pa.store_kv(lat, None, cache.inputs, p, 0, ragged_offsets([20, 7]))
    cache.inputs.cache_lengths.copy_(torch.tensor([19, 6], dtype=torch.int32))
    op = pa.PagedOperand(cache.inputs, p, 0, "k")
    lut = cache.inputs.lookup_table
    q = torch.randn(2, 4, 576, generator=gen).bfloat16()
    offs = ragged_offsets([1, 1])
    pos = torch.tensor([[0, 5, 19, -1], [3, 6, 2, 1 << 30]])
    blocks = lut.long()[torch.arange(2)[:, None], pos.clamp(0, 19) // 16]
    idx = torch.where(pos >= 0, blocks * 16 + pos.clamp(0) % 16, pos).int()
    idx[1, 3] = 1 << 30  # out of range: invalid
    sink = torch.randn(4, generator=gen)

    def f(q, sink):
        return pa.mla_decode(q, op, offs, indices=idx, attn_sink=sink)

    eager = f(q, sink)
    compiled = torch.compile(f, fullgraph=True)(q, sink)
    for a, b in zip(compiled, eager):
        assert_close(a.float(), b.float(), abs_tol=0, rel_tol=0, cos_tol=0)

    def g(q, sink):  # out alone (return_lse=False), compiled and on the reference backend
        return pa.mla_decode(q, op, offs, indices=idx, attn_sink=sink, return_lse=False)

    for out in (torch.compile(g, fullgraph=True)(q, sink), g(q, sink)):
        assert isinstance(out, torch.Tensor)
        assert_close(out.float(), eager[0].float(), abs_tol=0, rel_tol=0, cos_tol=0)
