"""`bench/bench_mha.py`'s MLA prefill inputs (issue 58's expanded form: d_qk != d_v, chunks
over a cached prefix): `mha` on them equals a float64 oracle in which query i of a chunk sees
the prefix and the chunk's first i + 1 keys, the semantics FlashInfer's causal ragged
prefill has for queries shorter than their keys."""

from __future__ import annotations

import math
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "bench"))

import bench_mha  # noqa: E402

from pagedattn import mha  # noqa: E402
from pagedattn.ops.masks import causal  # noqa: E402
from pagedattn.testing import assert_close  # noqa: E402


def test_mla_prefill_inputs_mean_chunks_over_a_prefix():
    nseq, n, prefix, h, d_qk, d_v = 3, 5, 7, 2, 48, 32
    q, k, v, q_offs, kv_offs, (k_op, v_op) = bench_mha.mla_prefill_inputs(
        nseq, n, prefix, h, d_qk, d_v, "cpu", torch.float32
    )
    assert q_offs.tolist() == [0, 5, 10, 15] and kv_offs.tolist() == [0, 12, 24, 36]
    out = mha(q, k_op, v_op, q_offs, mask=causal())
    ctx = prefix + n
    for r in range(nseq):
        qr = q[n * r : n * (r + 1)].double()
        kr, vr = k[ctx * r : ctx * (r + 1)].double(), v[ctx * r : ctx * (r + 1)].double()
        s = torch.einsum("qhd,khd->hqk", qr, kr) / math.sqrt(d_qk)
        seen = torch.arange(ctx)[None, :] <= (prefix + torch.arange(n))[:, None]
        p = s.masked_fill(~seen[None], float("-inf")).softmax(-1)
        want = torch.einsum("hqk,khd->qhd", p, vr)
        assert_close(out[n * r : n * (r + 1)], want, abs_tol=1e-5, rel_tol=1e-5, cos_tol=1e-9)
