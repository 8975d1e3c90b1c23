"""`mha` on mixed steps with the `num_decodes` hint (decodes first, then prefill chunks, as a
serving engine orders them): the Triton path's two launches (the decode kernel's balanced list
for the decodes, the prefill kernel for the chunks) against the float64 oracle of
test_triton_mha and against the one-launch path; the reference checks the hint.

Adversarial: NaN in every unowned cache slot (`make_paged_cache`), sentinel lookup-table
columns, poisoned outputs, decodes of 0 and 1 cached tokens beside a long one, sinks, every
mask kind, FP8 K/V, a tensor mask, and a hint that lies (typed error on the reference).
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"  # CPU CI: before triton is imported

from test_triton_mha import (  # noqa: E402
    DEV,
    LSE_TOL,
    PREFILL_TOL,
    build_paged,
    offsets_of,
    oracle,
    rand_q,
)

from pagedattn import KVQuantConfig  # noqa: E402
from pagedattn.errors import InvalidArgumentError  # noqa: E402
from pagedattn.ops import masks  # noqa: E402
from pagedattn.ops.mha import mha  # noqa: E402
from pagedattn.testing import assert_close, poison_  # noqa: E402


def _run(q, k, v, offsets, num_decodes, backend="triton", **kw):
    out = poison_(torch.empty(q.shape[0], q.shape[1], v.head_dim, dtype=q.dtype, device=DEV))
    offs = torch.tensor(offsets, dtype=torch.int32, device=DEV)
    res, lse = mha(q, k, v, offs, out=out, return_lse=True, num_decodes=num_decodes,
                   backend=backend, **kw)  # fmt: skip
    assert res is out
    return res.cpu(), lse.cpu()


CASES = [
    # page, h_kv, group, d, decode cache lengths, chunks (cached, new), mask
    (16, 2, 4, 64, [0, 1, 700, 33], [(40, 70), (0, 17)], masks.causal()),
    (1, 1, 8, 128, [300, 2], [(5, 40)], masks.sliding_window_causal(50)),
    (3, 2, 2, 96, [90, 0, 4, 1, 260], [(100, 33), (1, 2), (64, 64)], masks.chunked_causal(64)),
    (16, 4, 1, 64, [500], [(0, 9)], masks.null()),
]


@pytest.mark.parametrize("page,h_kv,group,d,dec,chunks,mask", CASES,
                         ids=[f"p{c[0]}-g{c[2]}-d{c[3]}-{c[6].kind}" for c in CASES])  # fmt: skip
def test_mixed_step_matches_the_oracle(gen, page, h_kv, group, d, dec, chunks, mask):
    cache_lens = dec + [c for c, _ in chunks]
    q_lens = [1] * len(dec) + [n for _, n in chunks]
    k, v, ks, vs = build_paged(page, h_kv, d, cache_lens, q_lens, gen=gen)
    offs = offsets_of(q_lens)
    q = rand_q(offs[-1], h_kv * group, d, gen)
    sinks = torch.randn(h_kv * group, generator=gen).to(DEV)
    out, lse = _run(q, k, v, offs, len(dec), mask=mask, sinks=sinks)
    ref, ref_lse = oracle(q, ks, vs, cache_lens, offs, mask, None, sinks)
    assert_close(out, ref, **PREFILL_TOL, name="out")
    assert_close(lse, ref_lse, **LSE_TOL, name="lse")
    one, lse1 = _run(q, k, v, offs, None, mask=mask, sinks=sinks)  # one launch
    assert_close(out, one, **PREFILL_TOL, name="vs one launch")
    assert_close(lse, lse1, **LSE_TOL, name="lse vs one launch")


def test_mixed_fp8_and_tensor_mask(gen):
    cache_lens, q_lens = [200, 0, 31], [1, 1, 12]
    k, v, ks, vs = build_paged(16, 2, 64, cache_lens, q_lens, quant=KVQuantConfig.per_token(),
                               gen=gen)  # fmt: skip
    offs = offsets_of(q_lens)
    q = rand_q(offs[-1], 4, 64, gen)
    keys = max(c + n for c, n in zip(cache_lens, q_lens))
    t = torch.rand(offs[-1], keys, generator=gen) < 0.7
    mask = masks.tensor_mask(t.to(DEV))
    out, lse = _run(q, k, v, offs, 2, mask=mask)
    ref, ref_lse = oracle(q, ks, vs, cache_lens, offs, mask, None, None)
    assert_close(out, ref, **PREFILL_TOL, name="out")
    assert_close(lse, ref_lse, **LSE_TOL, name="lse")


@pytest.mark.parametrize("hint", [0, 3])
def test_all_chunks_or_all_decodes(gen, hint):
    """num_decodes 0 (only chunks) and == batch (only decodes) are one launch."""
    q_lens = [1, 1, 1] if hint == 3 else [5, 2, 7]
    cache_lens = [80, 3, 0]
    k, v, ks, vs = build_paged(16, 1, 64, cache_lens, q_lens, gen=gen)
    offs = offsets_of(q_lens)
    q = rand_q(offs[-1], 2, 64, gen)
    out, lse = _run(q, k, v, offs, hint)
    ref, ref_lse = oracle(q, ks, vs, cache_lens, offs, masks.causal(), None, None)
    assert_close(out, ref, **PREFILL_TOL, name="out")


def test_reference_checks_the_hint(gen):
    cache_lens, q_lens = [10, 4], [2, 1]  # the first request has two queries
    k, v, _, _ = build_paged(16, 1, 64, cache_lens, q_lens, gen=gen)
    q = rand_q(3, 2, 64, gen)
    with pytest.raises(InvalidArgumentError, match="num_decodes"):
        _run(q, k, v, offsets_of(q_lens), 1, backend="reference")
    for bad in (-1, 3, 1.0, True, "1"):
        with pytest.raises(InvalidArgumentError, match="num_decodes"):
            _run(q, k, v, offsets_of(q_lens), bad)


@pytest.mark.gpu
@pytest.mark.skipif(DEV != "cuda", reason="needs CUDA")
def test_gpu_mixed_serving_step(gen):
    """A serving-sized mixed step (56 decodes of skewed lengths, 4 chunks of 256 over 1k) on
    the compiled kernels, against the one-launch path."""
    g = torch.Generator().manual_seed(3)
    dec = (torch.exp(torch.randn(56, generator=g)) * 800).long().clamp(1, 8000).tolist()
    chunks = [(1000, 256)] * 4
    cache_lens, q_lens = dec + [c for c, _ in chunks], [1] * 56 + [n for _, n in chunks]
    k, v, ks, vs = build_paged(16, 8, 128, cache_lens, q_lens, gen=gen)
    offs = offsets_of(q_lens)
    q = rand_q(offs[-1], 32, 128, gen)
    out, lse = _run(q, k, v, offs, 56)
    one, lse1 = _run(q, k, v, offs, None)
    assert_close(out, one, **PREFILL_TOL, name="vs one launch")
    assert_close(lse, lse1, **LSE_TOL, name="lse vs one launch")
