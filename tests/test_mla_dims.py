"""`mla_decode` at a checkpoint's own MLA dimensions (kv_lora_rank + rope dim other than 512 +
64) over BF16 / FP16 caches: the portable Triton kernel (interpreter on the CPU) and the
reference against a float64 oracle that reads the cache through the operand, dense and sparse,
balanced list and split-K; FP8 caches keep their fixed dimensions (typed error).

Adversarial: NaN in every unowned cache slot (`make_paged_cache`), sentinel lookup-table
columns, a poisoned output buffer, requests of 0 and 1 keys beside a long one, sinks.
"""

from __future__ import annotations

import math
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

from pagedattn import KVCacheParams, KVQuantConfig, PagedOperand  # noqa: E402
from pagedattn.errors import InvalidArgumentError  # noqa: E402
from pagedattn.ops.mla import mla_decode  # noqa: E402
from pagedattn.testing import make_paged_cache, poison_, ragged_offsets  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def _cache(d_qk, rope, cache_lens, q_lens, gen, dtype=torch.bfloat16, ps=16, quant=None):
    params = KVCacheParams(
        dtype, 1, 1, d_qk, ps, is_mla=True, num_q_heads=4, mla_rope_dim=rope,
        quantization=quant, devices=(DEV,),
    )  # fmt: skip
    pc = make_paged_cache(params, cache_lens, q_lens, generator=gen, device=DEV)
    ps_ = params.page_size
    lut = pc.inputs.lookup_table.tolist()
    blocks = pc.inputs.kv_blocks  # [pages, 1 (k), layers, page_size, 1, d]
    for b, n in enumerate(pc.seq_lens):
        for j in range(n):
            x = torch.randn(d_qk, generator=gen).clamp(-4, 4)
            blocks[lut[b][j // ps_], 0, 0, j % ps_, 0] = x.to(dtype).to(DEV)
    return params, pc, PagedOperand(pc.inputs, params, 0, "k")


def _oracle(q, op, offs, cache_lens, d_v, scale, causal=True, sink=None, idx=None, topk=None):
    """float64: each query token's softmax over its visible keys (dense) or valid indices."""
    tokens, h_q, _ = q.shape
    out = torch.zeros(tokens, h_q, d_v, dtype=torch.float64)
    lse = torch.full((tokens, h_q), float("-inf"), dtype=torch.float64)
    for b in range(len(offs) - 1):
        n = offs[b + 1] - offs[b]
        if n == 0:
            continue
        keys = op.gather(b, cache_lens[b] + n).double().cpu()[:, 0]  # [keys, d_qk]
        for i in range(n):
            t = offs[b] + i
            if idx is None:
                vis = cache_lens[b] + i + 1 if causal else cache_lens[b] + n
                kk = keys[:vis]
            else:
                limit = idx.shape[1] if topk is None else int(topk[b])
                rows = [int(e) for e in idx[t, :limit].tolist() if 0 <= int(e) < op.num_kv_rows()]
                kk = op.load_rows(torch.tensor(rows, dtype=torch.long), torch.float64).cpu()
                kk = kk.reshape(len(rows), -1)
            if kk.shape[0] == 0:
                continue
            s = q[t].double().cpu() @ kk.T * scale  # [h_q, keys]
            m = s.max(1, keepdim=True).values
            p = torch.exp(s - m)
            den = p.sum(1)
            lse[t] = (m[:, 0] + torch.log(den)).float()
            if sink is not None:
                den = den + torch.exp(sink.double().cpu() - m[:, 0])
            out[t] = (p @ kk[:, :d_v]) / den[:, None]
    return out, lse


DIMS = [(160, 32, 128), (160, 32, 64), (288, 32, 256), (96, 32, 64), (544, 32, 512)]


@pytest.mark.parametrize("backend", ["triton", "reference"])
@pytest.mark.parametrize("d_qk,rope,d_v", DIMS, ids=[f"{d[0]}-{d[2]}" for d in DIMS])
@pytest.mark.parametrize("P", [None, 2])
def test_dense_any_dims(gen, backend, d_qk, rope, d_v, P):
    cache_lens, q_lens = [90, 0, 1, 33], [1, 2, 1, 3]
    _, pc, op = _cache(d_qk, rope, cache_lens, q_lens, gen)
    offs = ragged_offsets(q_lens).tolist()
    q = (torch.randn(offs[-1], 4, d_qk, generator=gen) * 2).to(torch.bfloat16).to(DEV)
    sink = torch.randn(4, generator=gen).to(DEV)
    out = poison_(torch.empty(offs[-1], 4, d_v, dtype=q.dtype, device=DEV))
    o, lse = mla_decode(q, op, ragged_offsets(q_lens, DEV), d_v=d_v, attn_sink=sink,
                        num_partitions=P, out=out, backend=backend)  # fmt: skip
    ref_o, ref_lse = _oracle(q, op, offs, cache_lens, d_v, 1 / math.sqrt(d_qk), sink=sink)
    assert not torch.isnan(o).any()
    torch.testing.assert_close(o.double().cpu(), ref_o, atol=3e-2, rtol=2e-2)
    torch.testing.assert_close(lse.double().cpu(), ref_lse, atol=2e-3, rtol=1e-4)


def test_sparse_any_dims(gen):
    cache_lens, q_lens = [70, 20], [1, 1]
    _, pc, op = _cache(160, 32, cache_lens, q_lens, gen)
    q = (torch.randn(2, 4, 160, generator=gen) * 2).to(torch.bfloat16).to(DEV)
    rows = [op.rows_for(b, cache_lens[b] + 1).tolist() for b in range(2)]
    idx = torch.full((2, 24), -1, dtype=torch.int32)
    idx[0, :20] = torch.tensor(rows[0][::3][:20], dtype=torch.int32)
    idx[1, :10] = torch.tensor(rows[1][:10], dtype=torch.int32)
    idx[1, 10] = op.num_kv_rows()  # one past the end: skipped
    topk = torch.tensor([24, 11], dtype=torch.int32)
    o, lse = mla_decode(q, op, ragged_offsets(q_lens, DEV), d_v=128, indices=idx.to(DEV),
                        topk_lengths=topk.to(DEV))  # fmt: skip
    ref_o, ref_lse = _oracle(q, op, [0, 1, 2], cache_lens, 128, 1 / math.sqrt(160), idx=idx,
                             topk=topk)  # fmt: skip
    torch.testing.assert_close(o.double().cpu(), ref_o, atol=3e-2, rtol=2e-2)
    torch.testing.assert_close(lse.double().cpu(), ref_lse, atol=2e-3, rtol=1e-4)


def test_fp8_caches_keep_their_dimensions(gen):
    _, _, op = _cache(160, 32, [5], [1], gen, quant=KVQuantConfig.blockwise(32))
    q = torch.randn(1, 4, 160).to(torch.bfloat16).to(DEV)
    with pytest.raises(InvalidArgumentError, match="kv.head_dim"):
        mla_decode(q, op, ragged_offsets([1], DEV), d_v=128)


def test_d_v_past_d_qk_is_a_typed_error(gen):
    _, _, op = _cache(160, 32, [5], [1], gen)
    q = torch.randn(1, 4, 160).to(torch.bfloat16).to(DEV)
    with pytest.raises(InvalidArgumentError, match="d_v"):
        mla_decode(q, op, ragged_offsets([1], DEV))  # d_v 512 > d_qk 160


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("d_qk,rope,d_v", DIMS, ids=[f"{d[0]}-{d[2]}" for d in DIMS])
def test_gpu_dense_any_dims(gen, d_qk, rope, d_v):
    """The compiled portable kernel at other dimensions (balanced list and P = 2)."""
    for P in (None, 2):
        test_dense_any_dims(gen, "triton", d_qk, rope, d_v, P)
