"""MHAOperand implementations against hand-computed rows (shuffled pages, odd page sizes)."""

from __future__ import annotations

import pytest
import torch

import pagedattn as pa
from pagedattn import InvalidArgumentError
from pagedattn.operands import RowOperand, flatten_operand, unflatten_operand
from pagedattn.testing import make_paged_cache

PAGE_SIZES = [1, 3, 16, 64, 128]


@pytest.mark.parametrize("page_size", PAGE_SIZES)
@pytest.mark.parametrize("layer, kv", [(0, "k"), (1, "v"), (2, "k")])
def test_paged_rows_hand_computed(page_size, layer, kv, gen):
    L, H, D = 3, 2, 8
    p = pa.KVCacheParams(torch.float32, L, H, D, page_size)
    cache = make_paged_cache(p, [2 * page_size + 1, 5], [1, 0], generator=gen)
    inp = cache.inputs
    op = pa.PagedOperand(inp, p, layer, kv)
    assert isinstance(op, pa.MHAOperand)
    assert op.page_size == page_size and not op.quantization_enabled
    stride = 2 * L * page_size  # kv_dim * num_layers * page_size rows between pages
    assert op.page_stride_rows == stride
    kvi = 0 if kv == "k" else 1
    lut = inp.lookup_table.tolist()
    flat = inp.kv_blocks.view(-1)
    for b, n in enumerate(cache.seq_lens):
        for t in range(n):
            page, off = lut[b][t // page_size], t % page_size
            assert op.row_idx(b, t) == page * stride + off
            # The row view addresses exactly kv_blocks[page, kv, layer, off].
            op.rows[op.row_idx(b, t)] = torch.full((H, D), float(1000 * b + t))
            assert torch.equal(inp.kv_blocks[page, kvi, layer, off], op.rows[op.row_idx(b, t)])
        assert op.cache_length(b) == inp.cache_lengths[b]
        assert torch.equal(op.rows_for(b, n), torch.tensor([op.row_idx(b, t) for t in range(n)]))
    assert op.max_context_length() == max(2 * page_size + 1, 5)
    # The view spans the buffer without running past it.
    last = (op.num_kv_rows() - 1) * H * D + op.rows.storage_offset() + H * D
    assert last <= flat.numel()


@pytest.mark.parametrize("page_size", PAGE_SIZES)
def test_tma_row_and_populate(page_size, gen):
    p = pa.KVCacheParams(torch.float32, 2, 1, 4, page_size)
    cache = make_paged_cache(p, [3 * page_size + 2], generator=gen)
    op = pa.PagedOperand(cache.inputs, p, 1, "v")
    lut = cache.inputs.lookup_table[0].tolist()
    stride = op.page_stride_rows
    for block, off in [(lut[0], 0), (lut[1], page_size - 1), (lut[2], page_size // 2)]:
        assert op.get_tma_row(block * page_size + off) == block * stride + off
    # populate: one physical row per page sub-tile that a BN-row tile touches.
    for base, bn in [(0, 16), (page_size - 1, 4), (page_size, 2 * page_size)]:
        if base + bn > 3 * page_size + 2 + page_size:
            continue
        got = op.populate(0, base, bn)
        expect, t = [], base
        while t < base + bn:
            expect.append(lut[t // page_size] * stride + t % page_size)
            t = (t // page_size + 1) * page_size
        assert got == expect


def test_dense_continuous_ragged_rows(gen):
    x = torch.randn(3, 7, 2, 4, generator=gen)
    op = pa.DenseOperand(x, torch.tensor([2, 0, 5], dtype=torch.int32))
    assert op.page_size == 0 and op.row_idx(2, 4) == 2 * 7 + 4
    assert torch.equal(op.rows[op.row_idx(2, 4)], x[2, 4])
    assert op.get_tma_row(17) == 17
    slots = torch.tensor([4, 1], dtype=torch.int32)
    cb_cache = torch.randn(6, 9, 2, 4, generator=gen)
    cb = pa.ContinuousBatchingOperand(cb_cache, slots, torch.tensor([3, 8], dtype=torch.int32))
    assert cb.row_idx(0, 2) == 4 * 9 + 2 and torch.equal(cb.gather(1, 8)[3], cb_cache[1, 3])
    r = torch.randn(10, 2, 4, generator=gen)
    offs = torch.tensor([0, 3, 3, 10], dtype=torch.int32)
    rg = pa.RaggedOperand(r, offs)
    assert rg.cache_length(1) == 0 and rg.row_idx(2, 6) == 9
    assert torch.equal(rg.gather(2, 7), r[3:10])


@pytest.mark.parametrize("page_size", [1, 3, 16])
def test_scales_operand_matches_quantized_cache(page_size, gen):
    q = pa.KVQuantConfig.blockwise(4)
    p = pa.KVCacheParams(torch.bfloat16, 2, 2, 16, page_size, quantization=q)
    cache = make_paged_cache(p, [0], [5], generator=gen)
    offs = torch.tensor([0, 5], dtype=torch.int32)
    k = torch.randn(5, 2, 16, generator=gen).bfloat16()
    pa.store_kv(k, k, cache.inputs, p, 1, offs)
    s_op = pa.ScalesOperand(cache.inputs, p, 1, "k")
    k_op = pa.PagedOperand(cache.inputs, p, 1, "k")
    assert s_op.rows.shape[-1] == 4 and k_op.quantization_granularity == 4
    for t in range(5):
        assert s_op.row_idx(0, t) == k_op.row_idx(0, t)
        want = k[t].float().view(2, 4, 4).abs().amax(-1) / 448
        torch.testing.assert_close(s_op.rows[s_op.row_idx(0, t)].float(), want)
    assert k_op.scales.data_ptr() == s_op.rows.data_ptr()


def test_flatten_round_trip(gen):
    p = pa.KVCacheParams(
        torch.bfloat16,
        1,
        1,
        576,
        3,
        is_mla=True,
        num_q_heads=4,
        quantization=pa.KVQuantConfig.mla_rope_aware(),
    )
    cache = make_paged_cache(p, [4], generator=gen)
    op = pa.PagedOperand(cache.inputs, p, 0, "k")
    again = unflatten_operand(*flatten_operand(op))
    assert isinstance(again, RowOperand)
    for name in (
        "page_size",
        "page_stride_rows",
        "head_dim",
        "quant_format",
        "rope_dim",
        "quantization_granularity",
        "scale_dtype",
    ):
        assert getattr(again, name) == getattr(op, name), name
    assert again.rows is op.rows and again.scales is op.scales


def test_operand_errors():
    p = pa.KVCacheParams(torch.bfloat16, 2, 1, 576, 4, is_mla=True, num_q_heads=4)
    cache = make_paged_cache(p, [1])
    with pytest.raises(InvalidArgumentError, match="kv"):
        pa.PagedOperand(cache.inputs, p, 0, "v")
    with pytest.raises(InvalidArgumentError, match="layer_idx"):
        pa.PagedOperand(cache.inputs, p, 2, "k")
    with pytest.raises(InvalidArgumentError, match="x"):
        pa.DenseOperand(torch.zeros(2, 3), torch.zeros(2, dtype=torch.int32))
    with pytest.raises(InvalidArgumentError, match="row_offsets"):
        pa.RaggedOperand(torch.zeros(4, 1, 2), torch.tensor([0, 4]))
    with pytest.raises(InvalidArgumentError, match="quantization"):
        pa.ScalesOperand(cache.inputs, p, 0)


def test_paged_rows_are_memoized_per_blocks_tensor():
    """A layer's row view is made once per blocks tensor (the engine builds every layer's
    operands each step): the same view object again, equal to a fresh one; a new storage
    under the same tensor gets a new view; the memo lets the blocks tensor go."""
    import gc

    from pagedattn import operands as O

    b = torch.randn(3, 2, 2, 4, 2, 8)
    r1, r2 = O._paged_rows(b, 1, 1), O._paged_rows(b, 1, 1)
    fresh = O._paged_rows_view(b, 1, 1)
    assert r1 is r2 and r1[1] == fresh[1]
    assert r1[0].data_ptr() == fresh[0].data_ptr() and r1[0].stride() == fresh[0].stride()
    b.view(-1)[37] = 1234.0
    assert torch.equal(r1[0], fresh[0])
    b.set_(torch.randn(3, 2, 2, 4, 2, 8))  # a new storage under the same tensor object
    r3 = O._paged_rows(b, 1, 1)
    assert r3[0].data_ptr() == O._paged_rows_view(b, 1, 1)[0].data_ptr() != r1[0].data_ptr()
    i = id(b)
    del b, r1, r2, r3, fresh
    gc.collect()
    assert i not in O._ROWS
