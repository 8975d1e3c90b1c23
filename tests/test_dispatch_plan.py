"""Split-K planning: one wave of resident CTAs at most, metadata in runtime_inputs."""

from __future__ import annotations

import torch

from pagedattn import KVCacheParams, PagedKVCacheManager
from pagedattn.cache import dispatch


def test_partitions_fill_one_wave_at_most():
    # MHA: 4 CTAs/SM x 132 SMs = 528 resident tiles.
    assert dispatch.mha_num_partitions(64, 8, 1, 4096, 132) == 1  # 512 tiles: a full wave
    assert dispatch.mha_num_partitions(16, 8, 1, 16384, 132) == 4  # 128 tiles -> 512
    assert dispatch.mha_num_partitions(1, 8, 1, 1 << 15, 132) == dispatch.MAX_PARTITIONS
    assert dispatch.mha_num_partitions(1, 8, 1, 1000, 132) == 1000 // 256
    assert dispatch.mha_num_partitions(1, 8, 5, 1 << 15, 132) == 1  # prefill is not split
    # MLA: one CTA a SM; h_q 128 is two 64-row tiles a request.
    assert dispatch.mla_num_partitions(128, 16, 1, 8192, 132) == 1
    assert dispatch.mla_num_partitions(32, 128, 1, 8192, 132) == 2
    assert dispatch.mla_num_partitions(4, 16, 2, 8192, 132) == 32
    assert dispatch.mla_num_partitions(4, 16, 1, 200, 132) == 1


def test_runtime_inputs_carry_the_plan():
    p = KVCacheParams(torch.bfloat16, 1, 1, 576, 64, is_mla=True, num_q_heads=16)
    m = PagedKVCacheManager(p, 64)
    m.claim("a", list(range(3000)))
    m.alloc("a", 3000)
    (inp,) = m.runtime_inputs(["a"])
    parts = dispatch.mla_num_partitions(1, 16, 3000, 3000, dispatch.DEFAULT_NUM_SMS)
    assert inp.attention_dispatch_metadata.tolist() == [1, 3000, parts]
    assert (
        inp.mla_num_partitions.tolist() == [parts] and inp.mla_num_partitions.device.type == "cpu"
    )
    m.step(["a"], [[1]])
    m.alloc("a", 1)
    (inp,) = m.runtime_inputs(["a"])
    assert inp.attention_dispatch_metadata.tolist() == [1, 1, 3000 // 256]
