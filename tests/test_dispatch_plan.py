"""Split-K planning: one wave of resident CTAs at most, metadata in runtime_inputs."""

from __future__ import annotations

import torch

from pagedattn import KVCacheParams, PagedKVCacheManager
from pagedattn.cache import dispatch


def test_partitions_fill_one_wave_at_most():
    # MHA: the split aims at 2 CTAs/SM x 132 SMs = 264 tiles.
    assert dispatch.mha_num_partitions(64, 8, 1, 4096, 132) == 1  # 512 tiles already
    assert dispatch.mha_num_partitions(16, 8, 1, 16384, 132) == 2  # 128 tiles -> 256
    assert dispatch.mha_num_partitions(16, 8, 1, 16384, 132, kv_bytes=1) == 4  # FP8: 4 CTAs/SM
    assert dispatch.mha_num_partitions(1, 8, 1, 1 << 15, 132) == 33  # 2 * 132 // 8
    assert dispatch.mha_num_partitions(1, 1, 1, 1 << 15, 132) == dispatch.MAX_PARTITIONS
    assert dispatch.mha_num_partitions(1, 8, 1, 1000, 132) == 1000 // 256
    assert dispatch.mha_num_partitions(1, 8, 5, 1 << 15, 132) == 1  # prefill is not split
    # H200-class devices (`fast_hbm`): 4 CTAs/SM for 2-byte K/V, FP8 unchanged.
    assert dispatch.mha_num_partitions(16, 8, 1, 16384, 132, 2, True) == 4
    assert dispatch.mha_num_partitions(64, 8, 1, 4096, 132, 2, True) == 1  # 512 tiles already
    assert dispatch.mha_num_partitions(16, 8, 1, 16384, 132, 1, True) == 4
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


def test_mla_tile_of_the_small_fp8_kernel(monkeypatch):
    """The rope-aware FP8 keys-as-M kernel (sm_90, h_q <= 16, d_qk 576) has 16-row tiles;
    every other MLA launch 64-row tiles; one CTA a SM either way."""
    assert dispatch.mla_tile(16, 576, True, "cpu") == (1, 64)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(dispatch, "_cuda_properties", lambda i: ((9, 0), 132, 80 << 30))
    assert dispatch.mla_tile(16, 576, True, "cuda:0") == (1, 16)
    assert dispatch.mla_tile(1, 576, True, "cuda:0") == (1, 16)
    assert dispatch.mla_tile(20, 576, True, "cuda:0") == (1, 64)
    assert dispatch.mla_tile(16, 512, True, "cuda:0") == (1, 64)
    assert dispatch.mla_tile(16, 576, False, "cuda:0") == (1, 64)
    monkeypatch.setattr(dispatch, "_cuda_properties", lambda i: ((10, 0), 148, 180 << 30))
    assert dispatch.mla_tile(16, 576, True, "cuda:0") == (1, 64)
    # b 128 x h_q 16: 128 tiles fill the 132 SMs once (P = 2 would take a second wave); b 16:
    # 16 tiles, P = 8 (132 // 16).
    assert dispatch.mla_num_partitions(128, 16, 1, 4096, 132, 1, 16) == 1
    assert dispatch.mla_num_partitions(64, 16, 2, 4096, 132, 1, 16) == 1  # 2 tiles a request
    assert dispatch.mla_num_partitions(16, 16, 1, 4096, 132, 1, 16) == 8


def test_device_queries_are_cached_per_device(monkeypatch):
    """Capability and SM count come from one properties query per CUDA device (an eager
    launch asks several times); other devices get None and DEFAULT_NUM_SMS."""
    assert dispatch.cuda_capability("cpu") is None
    assert dispatch.num_sms("cpu") == dispatch.DEFAULT_NUM_SMS
    calls = []

    class Props:
        major, minor, multi_processor_count, total_memory = 9, 0, 114, 141 << 30

    def props(i):
        calls.append(i)
        return Props()

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_properties", props)
    dispatch._cuda_properties.cache_clear()
    try:
        for _ in range(3):
            assert dispatch.cuda_capability("cuda:1") == (9, 0)
            assert dispatch.num_sms(torch.device("cuda", 1)) == 114
            assert dispatch.fast_hbm("cuda:1")
        assert calls == [1]
    finally:
        dispatch._cuda_properties.cache_clear()


def test_fast_hbm_is_sm90_with_more_than_100_gib(monkeypatch):
    """The H200-class choice (`fast_hbm`): sm_90 with > 100 GiB of memory (H200 141 GB), not
    an H100 (80 GB) or another architecture, and never a CPU device."""
    assert not dispatch.fast_hbm("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    for props, want in [
        (((9, 0), 132, 141 * 10**9), True),
        (((9, 0), 132, 80 * 2**30), False),
        (((10, 0), 148, 180 * 2**30), False),
    ]:
        monkeypatch.setattr(dispatch, "_cuda_properties", lambda i, p=props: p)
        assert dispatch.fast_hbm("cuda:0") is want


def test_decode_stages_follow_the_device():
    """`decode_config`'s pipeline stages: the H100 choice (4 at a full grid of pages >= 16,
    else 5; FP8 4) unless `hbm3e` (5 for 2-byte K/V; FP8 5 up to 4 CTAs a SM)."""
    from pagedattn.ops.mha.triton_mha import decode_config

    def st(kind, ctas, page=16, hbm3e=False):
        return decode_config(128, 128, 2, kind, ctas, page, hbm3e)["num_stages"]

    assert (st("plain", 3.9), st("plain", 1.9), st("plain", 3.9, page=1)) == (4, 5, 5)
    assert (st("plain", 3.9, hbm3e=True), st("plain", 7.8, hbm3e=True)) == (5, 5)
    assert (st("fp8_cols", 3.9), st("fp8_cols", 7.8)) == (4, 4)
    assert (st("fp8_cols", 3.9, hbm3e=True), st("fp8_cols", 7.8, hbm3e=True)) == (5, 4)
