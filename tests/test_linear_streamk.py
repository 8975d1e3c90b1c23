"""`pagedattn.ops.linear.linear` (the stream-K linear of a decode step's projections): the Triton
kernel (under TRITON_INTERPRET=1 on the CPU, natively with `-m gpu`) and the reference against a
float64 oracle under DESIGN.md section 5's rule, with the fused SwiGLU operand, biases, rows
that do not fill a tile, widths and depths that split tiles between programs (whole tiles,
tiles cut in two, a tile over many programs), NaN / inf inputs, and bit-equal repeat calls;
the counters return to zero; bad arguments raise typed errors naming them."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from pagedattn.errors import InvalidArgumentError
from pagedattn.ops.fused.reference import silu_mul_reference
from pagedattn.ops.linear.dense import StreamKConfig, linear, streamk_applies
from pagedattn.ops.prepared import current_device, current_stream, semaphores
from pagedattn.testing import assert_close

ON_GPU = torch.cuda.is_available()
DEV = "cuda" if ON_GPU else "cpu"
# (M, N, K, act, bias, config): the units a program walks against a tile's k-blocks
CASES = [
    (5, 100, 200, None, True, StreamKConfig(block_n=16, block_k=32)),  # 1 unit each, K tail
    (16, 2048, 64, None, False, StreamKConfig(block_n=16, block_k=16)),  # whole + cut tiles
    (3, 96, 64, "silu_mul", True, StreamKConfig(block_n=32, block_k=16)),
    (64, 80, 136, "silu_mul", False, StreamKConfig(block_n=64, block_k=64)),  # N, K tails
    (33, 40, 1024, None, True, StreamKConfig(block_n=32, block_k=16, max_rows=64)),  # 2 tiles
]
GPU_CASES = [
    (64, 2048, 2048, None, False, StreamKConfig()),
    (64, 2048, 8192, "silu_mul", False, StreamKConfig()),
    (1, 3072, 2048, None, True, StreamKConfig()),
    (128, 4096, 4096, None, False, StreamKConfig(max_rows=128)),
    (17, 576, 2048, None, False, StreamKConfig(block_k=64, stages=6)),
]


def _oracle(x, w, b, act):
    xr = x.double()
    if act == "silu_mul":  # the operand rounded to the dtype, as both paths feed the product
        xr = silu_mul_reference(x).double() if not x.is_cuda else _silu_rounded(x)
    y = xr @ w.double().T
    return y if b is None else y + b.double()


def _silu_rounded(x):
    K = x.shape[1] // 2
    g, u = x[:, :K].float(), x[:, K:].float()
    return (g / (1.0 + torch.exp(-g)) * u).to(x.dtype).double()


def _inputs(M, N, K, act, bias, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(M, 2 * K if act else K, generator=g).to(dtype).to(DEV)
    w = (torch.randn(N, K, generator=g) * K**-0.5).to(dtype).to(DEV)
    b = torch.randn(N, generator=g).to(dtype).to(DEV) if bias else None
    return x, w, b


def _check(y, x, w, b, act, name):
    ref = _oracle(x, w, b, act)
    # bf16 / fp16 output: a rounding of the result, plus the operand's rounding for silu_mul
    # (the interpreter's exp differs from torch's in the last float32 bit)
    assert_close(y, ref, abs_tol=2e-2, rel_tol=2 / 128, cos_tol=2e-5, name=name)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("case", range(len(CASES)))
def test_streamk_matches_float64(case, dtype):
    M, N, K, act, bias, cfg = CASES[case]
    x, w, b = _inputs(M, N, K, act, bias, dtype, case)
    assert streamk_applies(x, w, cfg)
    y = linear(x, w, b, act=act, config=cfg, backend="triton")
    _check(y, x, w, b, act, f"case {case}")
    assert torch.equal(y, linear(x, w, b, act=act, config=cfg, backend="triton"))
    ref = linear(x, w, b, act=act, config=cfg, backend="reference")
    _check(ref, x, w, b, act, f"reference {case}")
    sem = semaphores(x.device, current_stream(current_device(x)), 1)
    assert int(sem.count_nonzero()) == 0  # every counter set back


def test_streamk_nan_inf_rows():
    M, N, K = 6, 96, 128
    x, w, _ = _inputs(M, N, K, None, False, torch.bfloat16, 7)
    x[1, 5] = float("nan")
    x[3, 0] = float("inf")
    cfg = StreamKConfig(block_n=32, block_k=32)
    y = linear(x, w, config=cfg, backend="triton")
    ref = linear(x, w, config=cfg, backend="reference")
    assert torch.isnan(y[1]).all() and torch.isnan(ref[1]).all()
    assert torch.equal(torch.isnan(y[3]), torch.isnan(ref[3]))  # inf * w of both signs: NaN
    keep = [0, 2, 4, 5]
    _check(y[keep], x[keep], w, None, None, "finite rows")


def test_streamk_not_taken_falls_back():
    """Rows past max_rows, float32, and a strided x go to torch (the reference) exactly."""
    x, w, b = _inputs(70, 48, 64, None, True, torch.bfloat16, 3)
    cfg = StreamKConfig(max_rows=64)
    assert not streamk_applies(x, w, cfg)
    assert torch.equal(linear(x, w, b, config=cfg, backend="triton"), F.linear(x, w, b))
    x32, w32 = x.float(), w.float()
    assert not streamk_applies(x32, w32, cfg)
    assert torch.equal(linear(x32, w32, backend="triton"), F.linear(x32, w32))
    xt = torch.randn(64, 16, dtype=torch.bfloat16, device=DEV).T  # [16, 64], column stride 16
    assert not streamk_applies(xt, w, cfg)
    assert torch.equal(linear(xt, w, backend="triton"), F.linear(xt, w))
    e = linear(x[:0], w, b, backend="triton")
    assert e.shape == (0, 48)


def test_linear_bad_arguments():
    x, w, b = _inputs(4, 32, 64, None, True, torch.bfloat16, 1)
    with pytest.raises(InvalidArgumentError, match="weight"):
        linear(x, w[:, :32])
    with pytest.raises(InvalidArgumentError, match="weight"):
        linear(x, w.float())
    with pytest.raises(InvalidArgumentError, match="bias"):
        linear(x, w, b[:8])
    with pytest.raises(InvalidArgumentError, match="act"):
        linear(x, w, act="gelu")
    with pytest.raises(InvalidArgumentError, match="x"):
        linear(x[0], w)
    with pytest.raises(InvalidArgumentError, match="x"):
        linear(x[:, :63], w[:, :31], act="silu_mul")  # an odd gate | up width
    with pytest.raises(InvalidArgumentError, match="config"):
        linear(x, w, config={"block_n": 64})
    with pytest.raises(InvalidArgumentError, match="backend"):
        linear(x, w, backend="cuda")


@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="needs a CUDA device")
@pytest.mark.parametrize("case", range(len(GPU_CASES)))
def test_streamk_gpu_shapes(case):
    """Decode shapes (Llama-3.2-1B / 3-8B projections) on the GPU, with a poisoned output
    pool: against float64, repeatable bit for bit, and inside a CUDA graph."""
    M, N, K, act, bias, cfg = GPU_CASES[case]
    x, w, b = _inputs(M, N, K, act, bias, torch.bfloat16, 100 + case)
    torch.empty(4 * M * N, dtype=torch.bfloat16, device=DEV).fill_(float("nan"))
    y = linear(x, w, b, act=act, config=cfg)
    _check(y, x, w, b, act, f"gpu case {case}")
    assert torch.equal(y, linear(x, w, b, act=act, config=cfg))
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        linear(x, w, b, act=act, config=cfg)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=s):
        yg = linear(x, w, b, act=act, config=cfg)
    x.copy_(torch.randn_like(x))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(yg, linear(x, w, b, act=act, config=cfg))
