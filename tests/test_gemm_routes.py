"""`models.gemm_routes` and `Linear.lt_rows`: a bias-free linear routed to cuBLASLt's bias
epilogue (`torch.addmm` with a zero bias) at the row counts start-up measured, F.linear at the
others; both paths against a float64 reference, NaN rows included, and the engine's routes."""

from __future__ import annotations

import pytest
import torch
from tiny_llama import save_tiny_llama

from pagedattn.models.gemm_routes import (
    apply_gemm_routes,
    describe_routes,
    measure_gemm_routes,
    routable_linears,
)
from pagedattn.models.layers import ColumnParallelLinear, Linear, RowParallelLinear
from pagedattn.testing import assert_close


def _linear(cls, k: int, n: int, bias: bool, dtype, dev, gen) -> Linear:
    lin = cls(k, n, bias, dtype=dtype)
    w = torch.randn(n, k, generator=gen, dtype=torch.float64) / k**0.5
    lin.weight.data = w.to(dtype).to(dev)
    if bias:
        lin.bias.data = torch.randn(n, generator=gen, dtype=torch.float64).to(dtype).to(dev)
    return lin


def _check_rows(lin: Linear, dev, dtype, gen, rows=(1, 3, 8)) -> None:
    """Each row count's output (a routed one or not, NaN in row 0) against float64."""
    k = lin.weight.shape[1]
    for m in rows:
        x = torch.randn(m, k, generator=gen, dtype=torch.float64).to(dtype).double()
        x[0, k // 2] = float("nan")
        ref = x @ lin.weight.double().cpu().T
        if lin.bias is not None:
            ref = ref + lin.bias.double().cpu()
        out = lin(x.to(dtype).to(dev))
        tol = {} if dtype == torch.bfloat16 else dict(abs_tol=1e-5, rel_tol=1e-5, cos_tol=1e-10)
        ref = ref.to(dtype).double()  # the reference rounded to the output's dtype
        assert_close(out, ref, name=f"{type(lin).__name__} m={m}", **tol)
        assert torch.isnan(out[0]).all() and not torch.isnan(out[1:]).any()


@pytest.mark.parametrize("cls", [Linear, ColumnParallelLinear, RowParallelLinear])
def test_routed_and_plain_rows_match_float64(cls):
    gen = torch.Generator().manual_seed(11)
    lin = _linear(cls, 48, 40, False, torch.float32, "cpu", gen)
    _check_rows(lin, "cpu", torch.float32, gen)  # nothing routed: F.linear
    lin.set_lt_rows(frozenset({3, 8}))
    assert lin.lt_rows == {3, 8} and lin._zero_bias is not None
    _check_rows(lin, "cpu", torch.float32, gen)  # 3 and 8 through addmm, 1 through F.linear
    x = torch.randn(2, 3, 48, generator=gen)  # 3-D: always F.linear
    torch.testing.assert_close(lin(x), torch.nn.functional.linear(x, lin.weight))
    lin.set_lt_rows(frozenset())
    assert lin._zero_bias is None


def test_a_routed_product_takes_addmm_and_a_biased_linear_never_does(monkeypatch):
    gen = torch.Generator().manual_seed(12)
    plain = _linear(Linear, 16, 24, False, torch.float32, "cpu", gen)
    biased = _linear(Linear, 16, 24, True, torch.float32, "cpu", gen)
    for lin in (plain, biased):
        lin.set_lt_rows(frozenset({4}))
    calls = []
    real = torch.addmm
    spy = lambda *a, **k: calls.append(a[1].shape[0]) or real(*a, **k)  # noqa: E731
    monkeypatch.setattr(torch, "addmm", spy)
    x4, x5 = torch.randn(4, 16, generator=gen), torch.randn(5, 16, generator=gen)
    plain(x4), plain(x5), biased(x4)
    assert calls == [4]  # the biased linear keeps F.linear (its bias is cuBLASLt's already)


def test_no_cuda_weights_no_routes():
    gen = torch.Generator().manual_seed(13)
    model = torch.nn.Sequential(_linear(Linear, 8, 8, False, torch.bfloat16, "cpu", gen))
    assert routable_linears(model) == {}
    assert measure_gemm_routes(model, [1, 2, 4]) == {}
    assert apply_gemm_routes(model, {(8, 8, torch.bfloat16): frozenset({1})}) == 0
    assert model[0].lt_rows == frozenset()
    assert describe_routes({(8, 16, torch.bfloat16): frozenset({4, 1})}) == {"8 x 16": [1, 4]}


@pytest.mark.gpu
def test_gpu_routed_rows_match_float64_and_the_engine_routes_alike(tmp_path):
    """On CUDA in bf16: each path against float64; an engine measures every bias-free shape at
    its decode buckets, and a second engine of the process routes alike (the measurements'
    cache), so their greedy tokens are equal."""
    from pagedattn.engine import LLM, SamplingParams
    from pagedattn.engine.cuda_graphs import decode_buckets

    gen = torch.Generator().manual_seed(14)
    for cls in (Linear, RowParallelLinear):
        lin = _linear(cls, 512, 384, False, torch.bfloat16, "cuda", gen)
        _check_rows(lin, "cuda", torch.bfloat16, gen, rows=(1, 64, 96))
        lin.set_lt_rows(frozenset({1, 64, 96}))
        _check_rows(lin, "cuda", torch.bfloat16, gen, rows=(1, 64, 96))

    save_tiny_llama(tmp_path, 77, 256, hidden_size=256, num_attention_heads=4,
                    num_key_value_heads=2, head_dim=64)  # fmt: skip
    kw = dict(device="cuda", dtype=torch.bfloat16, max_num_seqs=8, num_pages=64)
    a = LLM(str(tmp_path), **kw)
    buckets = set(decode_buckets(8))
    shapes = set(routable_linears(a.model))
    assert shapes and set(a.gemm_routes) == shapes
    assert all(rows <= buckets for rows in a.gemm_routes.values())
    for key, mods in routable_linears(a.model).items():
        assert all(m.lt_rows == a.gemm_routes[key] for m in mods)
    b = LLM(str(tmp_path), enforce_eager=True, **kw)
    assert b.gemm_routes == a.gemm_routes
    prompts = [{"prompt_token_ids": [5 + i, 9, 33, 2 * i]} for i in range(6)]
    sp = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    ta = [o.outputs[0].token_ids for o in a.generate(prompts, sp)]
    tb = [o.outputs[0].token_ids for o in b.generate(prompts, sp)]
    assert ta == tb
