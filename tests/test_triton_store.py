"""Triton store_kv (`ops/store_kv/triton_store.py`) against `store_kv_reference`, byte for byte.

Both writers run on identical copies of a NaN-poisoned paged cache (shuffled pages, sentinel ids
in unused lookup-table columns); every byte of the pool, scales included, must match afterwards:
the new tokens land at `cache_length + i` and nothing else is touched. CPU runs go through the
Triton interpreter. e8m0 reference results are produced through a uint8 view (CPU index_put
has no e8m0 kernel); they are also checked against the exact ceil(log2) rounding rule.
"""

from __future__ import annotations

import math
import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"  # CPU CI: before triton is imported

from pagedattn import KVCacheInputsPerDevice, KVCacheParams, KVQuantConfig  # noqa: E402
from pagedattn.fp8 import quantize_blockwise  # noqa: E402
from pagedattn.operands import DenseOperand, PagedOperand  # noqa: E402
from pagedattn.ops.store_kv import store_kv  # noqa: E402
from pagedattn.ops.store_kv.reference import (  # noqa: E402
    store_kv_reference,
    token_batch_and_pos,
)
from pagedattn.ops.store_kv.triton_store import store_kv_triton  # noqa: E402
from pagedattn.testing import make_paged_cache, ragged_offsets  # noqa: E402

E8M0 = torch.float8_e8m0fnu
DEV = "cuda" if torch.cuda.is_available() else "cpu"
LAYER = 1


def reference_write(k, v, inp, params, offs):
    """The reference semantics (`store_kv_reference`) for blockwise caches, written here with
    the reference's own row mapping and quantizer (e8m0 scales through a byte view: CPU
    index_put has no e8m0 kernel); other formats go through store_kv_reference itself."""
    kop, vop = PagedOperand(inp, params, LAYER, "k"), PagedOperand(inp, params, LAYER, "v")
    if params.quant_format != "blockwise":
        store_kv_reference(k, v, kop, vop, offs)
        return
    for x, op in ((k, kop), (v, vop)):
        b, pos = token_batch_and_pos(offs, op.cache_lengths, x.shape[0])
        rows = op.physical_rows(b, pos)
        q, s = quantize_blockwise(x, op.quantization_granularity, op.scale_dtype)
        op.rows[rows] = q
        if s.dtype == E8M0:
            op.scales.view(torch.uint8)[rows] = s.view(torch.uint8)
        else:
            op.scales[rows] = s


def twin_caches(params, cache_lens, q_lens, gen):
    cache = make_paged_cache(params, cache_lens, q_lens, generator=gen, device=DEV)
    a = cache.inputs
    b = KVCacheInputsPerDevice(
        a.kv_blocks.clone(),
        a.cache_lengths,
        a.lookup_table,
        a.max_lengths,
        None if a.kv_scales is None else a.kv_scales.clone(),
    )
    if params.quant_format == "per_tensor":
        a.kv_scales[0, LAYER], a.kv_scales[1, LAYER] = 0.013, 0.021
        b.kv_scales.copy_(a.kv_scales)
    return a, b


def assert_same_bytes(a, b):
    for name in ("kv_blocks", "kv_scales"):
        x, y = getattr(a, name), getattr(b, name)
        if x is None:
            continue
        diff = int((x.view(torch.uint8) != y.view(torch.uint8)).sum())
        assert diff == 0, f"{name}: {diff} bytes differ"


def assert_cache_matches(a, b, params):
    """Byte equality, except for blockwise FP8 on CUDA: there PyTorch evaluates the
    reference's `amax / 448` as `amax * (1 / 448)` (a division by a Python scalar becomes a
    reciprocal multiply on CUDA) while the kernel divides correctly rounded, as the CPU
    reference does. Scales may then differ by one float32 ulp (e8m0: a factor 2 when that ulp
    crosses a power of two) and values by one e4m3 ulp: compare the dequantized pool."""
    if DEV == "cpu" or params.quant_format != "blockwise":
        assert_same_bytes(a, b)
        return
    for kv in ("k", "v"):
        oa, ob = PagedOperand(a, params, LAYER, kv), PagedOperand(b, params, LAYER, kv)
        rows = torch.arange(oa.num_kv_rows(), device=DEV)
        x, y = oa.load_rows(rows), ob.load_rows(rows)
        assert torch.equal(torch.isnan(x), torch.isnan(y)), f"{kv}: NaN positions differ"
        fin = ~torch.isnan(y)
        err = (x - y).abs()[fin]
        bound = y.abs()[fin] * 2.0**-3 + 1e-3 * float(y.abs()[fin].max())
        assert bool((err <= bound).all()), f"{kv}: max error {float(err.max()):.3e}"
        raw_a, raw_b = oa.rows.view(torch.uint8), ob.rows.view(torch.uint8)
        frac = float((raw_a != raw_b).float().mean())
        assert frac < 1e-2, f"{kv}: {frac:.2%} of the fp8 bytes differ"


QUANTS = [
    None,
    KVQuantConfig.per_token(),
    KVQuantConfig.per_token(E8M0),
    KVQuantConfig.blockwise(16),
    KVQuantConfig.blockwise(32, E8M0),
    KVQuantConfig.per_tensor(),
]


@pytest.mark.parametrize("quant", QUANTS, ids=lambda c: "bf16" if c is None else f"{c}")
@pytest.mark.parametrize("page_size,h,d", [(3, 2, 64), (16, 3, 96), (1, 1, 128)])
def test_store_matches_reference(quant, page_size, h, d, gen):
    params = KVCacheParams(torch.bfloat16, 2, h, d, page_size, quantization=quant)
    cache_lens, q_lens = [5, 0, 17, 9], [3, 8, 1, 0]
    a, b = twin_caches(params, cache_lens, q_lens, gen)
    offs = ragged_offsets(q_lens, DEV)
    n = sum(q_lens)
    k = (torch.randn(n, h, d, generator=gen) * 3).to(torch.bfloat16).to(DEV)
    v = torch.randn(n, h, d, generator=gen).to(torch.bfloat16).to(DEV)
    k[0, 0, 5] = math.nan  # NaN propagates through its block, as in the reference
    k[1, 0, :] = 0.0  # an all-zero block: the scale floor keeps it finite
    store_kv_triton(
        k, v, PagedOperand(a, params, LAYER, "k"), PagedOperand(a, params, LAYER, "v"), offs
    )
    reference_write(k, v, b, params, offs)
    assert_cache_matches(a, b, params)


def test_e8m0_scales_are_exact_ceil_pow2(gen):
    """The stored e8m0 exponent is the smallest power of two >= amax / 448."""
    params = KVCacheParams(torch.bfloat16, 2, 2, 64, 16, quantization=KVQuantConfig.per_token(E8M0))
    a, _ = twin_caches(params, [0], [40], gen)
    k = (torch.randn(40, 2, 64, generator=gen) * 10).to(torch.bfloat16).to(DEV)
    kop = PagedOperand(a, params, LAYER, "k")
    store_kv_triton(k, None, kop, None, ragged_offsets([40], DEV))
    pos = torch.arange(40, device=DEV)
    rows = kop.physical_rows(torch.zeros(40, dtype=torch.long, device=DEV), pos)
    byte = kop.scales.view(torch.uint8)[rows].long().cpu()
    want = (k.float().abs().amax(-1).cpu() / 448).clamp_min(2.0**-126)
    mant, exp = torch.frexp(want)  # want = mant * 2^exp, mant in [0.5, 1)
    ceil_log2 = torch.where(mant == 0.5, exp - 1, exp)
    assert torch.equal(byte[..., 0], ceil_log2 + 127)


def test_store_non_paged_operand(gen):
    """Row-offset operands (a dense [B, S, H, D] buffer)."""
    B, S, H, D = 3, 12, 2, 64
    x = torch.full((B, S, H, D), math.nan, dtype=torch.bfloat16, device=DEV)
    y = x.clone()
    cl = torch.tensor([2, 0, 7], dtype=torch.int32, device=DEV)
    offs = ragged_offsets([3, 5, 1], DEV)
    k = torch.randn(9, H, D, generator=gen).to(torch.bfloat16).to(DEV)
    v = torch.randn(9, H, D, generator=gen).to(torch.bfloat16).to(DEV)
    store_kv_triton(k, v, DenseOperand(x, cl), DenseOperand(y, cl), offs)
    x2, y2 = torch.full_like(x, math.nan), torch.full_like(y, math.nan)
    store_kv_reference(k, v, DenseOperand(x2, cl), DenseOperand(y2, cl), offs)
    assert torch.equal(x.view(torch.int16), x2.view(torch.int16))
    assert torch.equal(y.view(torch.int16), y2.view(torch.int16))


def test_public_store_kv_triton_backend(gen):
    params = KVCacheParams(torch.bfloat16, 2, 2, 64, 3, quantization=KVQuantConfig.blockwise(32))
    a, b = twin_caches(params, [4, 10], [6, 1], gen)
    offs = ragged_offsets([6, 1], DEV)
    k = torch.randn(7, 2, 64, generator=gen).to(torch.bfloat16).to(DEV)
    v = torch.randn(7, 2, 64, generator=gen).to(torch.bfloat16).to(DEV)
    store_kv(k, v, a, params, LAYER, offs, backend="triton")
    store_kv(k, v, b, params, LAYER, offs, backend="reference")
    assert_cache_matches(a, b, params)


@pytest.mark.gpu
def test_gpu_store_serving_size():
    """A 4096-token prefill chunk + decode tokens, FP8 blockwise, on the GPU."""
    gen = torch.Generator().manual_seed(0)
    params = KVCacheParams(
        torch.bfloat16, 2, 8, 128, 16, devices=["cuda"], quantization=KVQuantConfig.blockwise(64)
    )
    q_lens = [4096] + [1] * 63
    a, b = twin_caches(params, [0] + [1000] * 63, q_lens, gen)
    offs = ragged_offsets(q_lens, "cuda")
    k = torch.randn(sum(q_lens), 8, 128, device="cuda").to(torch.bfloat16)
    v = torch.randn_like(k)
    store_kv(k, v, a, params, LAYER, offs, backend="triton")
    reference_write(k, v, b, params, offs)
    assert_cache_matches(a, b, params)


# rope_store_kv: RoPE and the cache write in one launch ----------------------------------------
def _rope_case(params, h_q, cache_lens, q_lens, gen, norm):
    h, d = params.n_kv_heads_per_device, params.head_dim
    T = sum(q_lens)
    qkv = (torch.randn(T, (h_q + 2 * h) * d, generator=gen) * 2).to(torch.bfloat16).to(DEV)
    ang = torch.rand(T, d // 2, generator=gen) * 6.3
    cos, sin = ang.cos().to(torch.bfloat16).to(DEV), ang.sin().to(torch.bfloat16).to(DEV)
    kw = {}
    if norm:
        kw = dict(
            q_norm=(1 + 0.2 * torch.randn(d, generator=gen)).to(torch.bfloat16).to(DEV),
            k_norm=(1 + 0.2 * torch.randn(d, generator=gen)).to(torch.bfloat16).to(DEV),
            eps=1e-6,
        )
    return qkv, cos, sin, kw


@pytest.mark.parametrize("quant", [None, KVQuantConfig.per_token()], ids=["bf16", "fp8"])
@pytest.mark.parametrize("norm", [False, True], ids=["rope", "qk_norm"])
@pytest.mark.parametrize("page_size,h_q,h,d", [(16, 8, 2, 64), (5, 4, 4, 32), (1, 3, 1, 16)])
@pytest.mark.parametrize("steps", ["decode", "mixed"])
def test_rope_store_kv_equals_two_ops(quant, norm, page_size, h_q, h, d, steps, gen):
    """One launch (a plain cache on the Triton backend; FP8 takes the two ops) gives q and
    every byte of the NaN-poisoned pool exactly as `rope_qkv` then `store_kv` on a twin."""
    from pagedattn.ops.fused import rope_qkv  # noqa: PLC0415
    from pagedattn.ops.store_kv import rope_store_kv  # noqa: PLC0415

    params = KVCacheParams(torch.bfloat16, 2, h, d, page_size, quantization=quant)
    cache_lens, q_lens = ([5, 0, 17, 9], [1, 1, 1, 1]) if steps == "decode" else (
        [5, 0, 17, 9], [3, 8, 1, 0])  # fmt: skip
    a, b = twin_caches(params, cache_lens, q_lens, gen)
    offs = ragged_offsets(q_lens, DEV)
    qkv, cos, sin, kw = _rope_case(params, h_q, cache_lens, q_lens, gen, norm)
    q = rope_store_kv(qkv, cos, sin, h_q, h, a, params, LAYER, offs, backend="triton", **kw)
    q2, k2, v2 = rope_qkv(qkv, cos, sin, h_q, h, backend="triton", **kw)
    store_kv(k2, v2, b, params, LAYER, offs, backend="triton")
    assert torch.equal(q, q2)
    assert_same_bytes(a, b)


def test_rope_store_kv_bad_arguments_write_nothing(gen):
    from pagedattn.errors import InvalidArgumentError  # noqa: PLC0415
    from pagedattn.ops.store_kv import rope_store_kv  # noqa: PLC0415

    params = KVCacheParams(torch.bfloat16, 2, 2, 32, 4)
    a, _ = twin_caches(params, [3, 6], [1, 1], gen)
    before = a.kv_blocks.clone()
    offs = ragged_offsets([1, 1], DEV)
    qkv, cos, sin, _ = _rope_case(params, 4, [3, 6], [1, 1], gen, False)
    with pytest.raises(InvalidArgumentError, match="k_new"):  # 3 KV heads for a 2-head cache
        rope_store_kv(qkv[:, : 8 * 32], cos, sin, 2, 3, a, params, LAYER, offs)
    with pytest.raises(InvalidArgumentError, match="cos"):
        rope_store_kv(qkv, cos[:, :8], sin, 4, 2, a, params, LAYER, offs)
    with pytest.raises(InvalidArgumentError, match="q_row_offsets"):
        rope_store_kv(qkv, cos, sin, 4, 2, a, params, LAYER, offs[:2])
    with pytest.raises(InvalidArgumentError, match="layer_idx"):
        rope_store_kv(qkv, cos, sin, 4, 2, a, params, 7, offs)
    assert torch.equal(a.kv_blocks.view(torch.uint8), before.view(torch.uint8))
