"""KVCacheParams / KVQuantConfig validation and buffer layout."""

from __future__ import annotations

import pytest
import torch

from pagedattn import InvalidArgumentError, KVCacheParams, KVQuantConfig, PagedKVCacheManager
from pagedattn.cache import allocate_buffers

BF16 = torch.bfloat16


@pytest.mark.parametrize("page_size", [1, 3, 7, 16, 64, 129])
def test_any_page_size_mha_layout(page_size):
    p = KVCacheParams(BF16, num_layers=3, n_kv_heads=4, head_dim=96, page_size=page_size)
    b = allocate_buffers(p, 5)
    assert b.kv_blocks.shape == (5, 2, 3, page_size, 4, 96)
    assert b.kv_blocks.dtype == BF16 and b.kv_scales is None
    assert p.bytes_per_page() == 2 * 3 * page_size * 4 * 96 * 2


def test_mla_layout_and_replication():
    p = KVCacheParams(
        BF16, 2, 1, 576, 64, is_mla=True, num_q_heads=16, devices=["cpu", "cpu", "cpu"]
    )
    assert p.kv_dim == 1 and p.tp_degree == 3 and p.n_kv_heads_per_device == 1
    assert allocate_buffers(p, 2).kv_blocks.shape == (2, 1, 2, 64, 1, 576)


def test_tp_shards_kv_heads_and_dp_groups():
    p = KVCacheParams(
        BF16, 1, 8, 64, 16, num_q_heads=32, devices=["cpu"] * 4, data_parallel_degree=2
    )
    assert p.tp_degree == 2 and p.n_kv_heads_per_device == 4
    assert p.replica_devices(1) == (torch.device("cpu"),) * 2


@pytest.mark.parametrize(
    "G, scale_dtype", [(None, torch.float32), (32, torch.float32), (64, torch.float8_e8m0fnu)]
)
def test_blockwise_scales_layout(G, scale_dtype):
    q = KVQuantConfig("blockwise", G, scale_dtype)
    p = KVCacheParams(BF16, 2, 2, 128, 5, quantization=q)
    b = allocate_buffers(p, 3)
    n = 128 // (G or 128)
    assert b.kv_blocks.dtype == torch.float8_e4m3fn
    assert b.kv_scales.shape == (3, 2, 2, 5, 2, n) and b.kv_scales.dtype == scale_dtype
    assert p.bytes_per_page() == 2 * 2 * 5 * 2 * (128 + n * b.kv_scales.element_size())


def test_per_tensor_and_packed_mla_layouts():
    p = KVCacheParams(BF16, 2, 2, 64, 4, quantization=KVQuantConfig.per_tensor())
    b = allocate_buffers(p, 3)
    assert b.kv_scales.shape == (2, 2) and torch.equal(b.kv_scales, torch.ones(2, 2))
    kw = dict(is_mla=True, num_q_heads=8)
    ra = KVCacheParams(BF16, 1, 1, 576, 64, quantization=KVQuantConfig.mla_rope_aware(), **kw)
    assert (ra.row_elems, ra.storage_dtype, ra.scales_shape(2)) == (
        640,
        torch.uint8,
        (2, 1, 1, 64, 1, 1),
    )
    v32 = KVCacheParams(BF16, 1, 1, 576, 64, quantization=KVQuantConfig.flashmla_v32(), **kw)
    assert v32.row_elems == 656 and v32.scales_shape(2) is None
    m1 = KVCacheParams(BF16, 1, 1, 512, 64, quantization=KVQuantConfig.flashmla_model1(), **kw)
    assert m1.row_elems == 584 and m1.scale_dtype == torch.float8_e8m0fnu


def test_memory_budget_sizing():
    p = KVCacheParams(BF16, 2, 2, 64, 16)
    per_page = p.bytes_per_page()
    m = PagedKVCacheManager(p, memory_bytes=10 * per_page + per_page // 2)
    assert m.total_num_pages == 10
    with pytest.raises(InvalidArgumentError, match="memory_bytes"):
        PagedKVCacheManager(p, memory_bytes=per_page - 1)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(page_size=0), "page_size"),
        (dict(head_dim=-1), "head_dim"),
        (dict(dtype=torch.int8), "dtype"),
        (dict(quantization=KVQuantConfig.blockwise(48)), "granularity"),
        (dict(n_kv_heads=3, devices=["cpu", "cpu"]), "n_kv_heads"),
        (dict(num_q_heads=6), "num_q_heads"),
        (dict(devices=["cpu"] * 3, data_parallel_degree=2), "data_parallel_degree"),
        (dict(quantization=KVQuantConfig.mla_rope_aware()), "format"),
        (dict(is_mla=True, n_kv_heads=1), "num_q_heads"),
        (dict(is_mla=True, n_kv_heads=2, num_q_heads=4), "n_kv_heads"),
    ],
)
def test_params_validation(kwargs, match):
    base = dict(dtype=BF16, num_layers=1, n_kv_heads=4, head_dim=64, page_size=16)
    base.update(kwargs)
    with pytest.raises(InvalidArgumentError, match=match):
        KVCacheParams(**base)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(format="int4"), "format"),
        (dict(scale_dtype=torch.float16), "scale_dtype"),
        (dict(granularity=0), "granularity"),
        (dict(format="per_tensor", granularity=32), "granularity"),
        (dict(format="mla_rope_aware", scale_dtype=torch.float8_e8m0fnu), "scale_dtype"),
    ],
)
def test_quant_config_validation(kwargs, match):
    with pytest.raises(InvalidArgumentError, match=match):
        KVQuantConfig(**kwargs)


def test_v32_needs_576_and_model1_needs_512():
    kw = dict(is_mla=True, num_q_heads=8)
    with pytest.raises(InvalidArgumentError, match="576"):
        KVCacheParams(BF16, 1, 1, 512, 64, quantization=KVQuantConfig.flashmla_v32(), **kw)
    with pytest.raises(InvalidArgumentError, match="512"):
        KVCacheParams(BF16, 1, 1, 576, 64, quantization=KVQuantConfig.flashmla_model1(), **kw)
