"""gpt-oss's experts (`models.layers.GptOssExperts`): the grouped-matmul path (no host sync,
CUDA-graph safe) against the per-expert loop, on adversarial routings: every token on one
expert, experts with no token, a single token, ties in the router; bit for bit on the CPU,
within bf16 roundings on CUDA (whose grouped matmul blocks differently from the loop's); and
its tensor-parallel shards' partial sums adding up to the whole (bias once)."""

from __future__ import annotations

import pytest
import torch
from tiny_llama import tiny_gpt_oss_config

from pagedattn.models import ModelConfig
from pagedattn.models.layers import GptOssExperts, GptOssMoE, grouped_experts_ok
from pagedattn.models.parallel import shard

pytest.importorskip("transformers")

E, K = 4, 2


def _moe(dtype, device, seed=0, tp_size=1, tp_rank=0, whole=None):
    hf = tiny_gpt_oss_config(vocab_size=64, hidden_size=64, num_hidden_layers=1)
    cfg = ModelConfig.from_hf(hf)
    moe = GptOssMoE(cfg, dtype, tp_size, tp_rank).to(device)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in moe.named_parameters():
            if whole is None:
                p.copy_(torch.randn(p.shape, generator=g) * (0.1 if p.ndim < 3 else 0.2))
                continue
            dim = GptOssExperts.tp_shard.get(name.split(".")[-1]) if "experts" in name else None
            p.copy_(whole[name] if dim is None else shard(whole[name], dim, tp_rank, tp_size))
    return moe


def _routings(T: int):
    g = torch.Generator().manual_seed(T)
    yield "random", torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(T)])
    yield "one expert", torch.stack([torch.tensor([2, 0])] * T)  # experts 1, 3 empty
    yield "descending", torch.stack([torch.tensor([3, 1])] * T)  # slots not in expert order


@pytest.mark.parametrize("T", [1, 2, 7, 33])
def test_grouped_equals_loop_on_cpu(T):
    for dtype in (torch.float32, torch.bfloat16):
        moe = _moe(dtype, "cpu")
        x = torch.randn(T, 64).to(dtype)
        scores = torch.softmax(torch.randn(T, K), -1).to(dtype)
        for name, experts in _routings(T):
            a = moe.experts.forward_loop(x, scores, experts)
            b = moe.experts.forward_grouped(x, scores, experts)
            assert torch.equal(a, b), (dtype, name)
    assert grouped_experts_ok(torch.device("cpu"), torch.float32)


def test_tp_shards_sum_to_the_whole():
    whole_moe = _moe(torch.float32, "cpu", seed=3)
    whole = dict(whole_moe.named_parameters())
    x = torch.randn(9, 64)
    scores, experts = whole_moe.router(x)
    want = whole_moe.experts(x, scores, experts)
    parts = [
        _moe(torch.float32, "cpu", tp_size=2, tp_rank=r, whole=whole).experts(x, scores, experts)
        for r in range(2)
    ]
    torch.testing.assert_close(parts[0] + parts[1], want, rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("T", [1, 5, 64, 300])
def test_grouped_close_to_loop_on_cuda(T):
    moe = _moe(torch.bfloat16, "cuda", seed=T)
    x = torch.randn(T, 64, device="cuda").to(torch.bfloat16)
    scores = torch.softmax(torch.randn(T, K, device="cuda"), -1).to(torch.bfloat16)
    for name, experts in _routings(T):
        experts = experts.cuda()
        want = moe.experts.forward_loop(x, scores, experts).float()
        torch.cuda.set_sync_debug_mode("error")  # the grouped path never syncs
        try:
            got = moe.experts.forward_grouped(x, scores, experts).float()
        finally:
            torch.cuda.set_sync_debug_mode("default")
        scale = want.abs().max().item()
        assert (got - want).abs().max().item() <= 0.02 * scale, name
