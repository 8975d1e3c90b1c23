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
    pa.store_kv(torch.randn(5, 2, 32, generator=gen), torch.randn(5, 2, 32, generator=gen),
                cache.inputs, p, 0, pre)
    cache.inputs.cache_lengths.copy_(cl)
    q = torch.randn(5, 4, 32, generator=gen)
    ko = pa.PagedOperand(cache.inputs, p, 0, "k")
    vo = pa.PagedOperand(cache.inputs, p, 0, "v")
    sinks = torch.randn(4, generator=gen)

    def f(q, sinks):
        return pa.mha(q, ko, vo, offs, mask=masks.sliding_window_causal(3), sinks=sinks,
                      return_lse=True)

    eager = f(q, sinks)
    compiled = torch.compile(f, fullgraph=True)(q, sinks)
    assert_close(compiled[0], eager[0], abs_tol=1e-6, rel_tol=1e-6, cos_tol=1e-9)
    assert_close(compiled[1], eager[1], abs_tol=1e-6, rel_tol=1e-6, cos_tol=1e-9)
