"""`ops.linear.linear_small_m`: the Triton few-row product (`triton_small_m`; Triton's
interpreter on the CPU, compiled on a GPU) and the reference, each against a float64 product
of the same bf16/fp16 operands: ragged M, N and K (masks of every edge), strided rows of x, a
NaN row, a poisoned `out`; bad arguments raise before `out` is written."""

from __future__ import annotations

import os

import torch

ON_GPU = torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1"
if not ON_GPU:
    os.environ["TRITON_INTERPRET"] = "1"  # CPU CI: before triton is imported

import pytest  # noqa: E402

from pagedattn.errors import InvalidArgumentError  # noqa: E402
from pagedattn.ops.linear import linear_small_m, linear_small_m_reference  # noqa: E402
from pagedattn.ops.linear.triton_small_m import (  # noqa: E402
    linear_small_m_triton,
    small_m_config,
)
from pagedattn.testing import assert_close, poison_  # noqa: E402

DEV = "cuda" if ON_GPU else "cpu"
SHAPES = [(1, 40, 48), (5, 33, 130), (16, 64, 256), (23, 130, 300), (64, 24, 520)]
if ON_GPU:
    SHAPES += [(64, 2048, 2048), (8, 3072, 2048), (48, 4096, 14336), (64, 16384, 2048)]


def _operands(m, n, k, dtype, gen, strided=False):
    x = torch.randn(m, k + (5 if strided else 0), generator=gen)[:, :k]
    w = torch.randn(n, k, generator=gen) / k**0.5
    x, w = x.to(dtype), w.to(dtype)
    return x.to(DEV), w.to(DEV)


def _oracle(x, w):
    return (x.double().cpu() @ w.double().cpu().T).to(x.dtype).double()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", SHAPES)
def test_triton_and_reference_match_float64(shape, dtype, gen):
    m, n, k = shape
    x, w = _operands(m, n, k, dtype, gen, strided=m % 2 == 1)
    if m > 1:
        x[1, k // 3] = float("nan")  # a NaN row
    want = _oracle(x, w)
    for name, fn in (("triton", linear_small_m_triton), ("reference", linear_small_m_reference)):
        out = poison_(torch.empty(m, n, dtype=dtype, device=DEV))
        got = fn(x, w, out)
        assert got is out
        assert_close(out, want, name=f"{name} {shape}")
        assert (not torch.isnan(out).any()) if m == 1 else torch.isnan(out[1]).all()
    via = linear_small_m(x, w, backend="triton" if ON_GPU else None)
    assert_close(via, want, name="linear_small_m")


def test_empty_and_zero_k(gen):
    x, w = _operands(3, 8, 16, torch.bfloat16, gen)
    assert linear_small_m_triton(x[:0], w).shape == (0, 8)
    z = linear_small_m_triton(x[:, :0], w[:, :0], poison_(torch.empty(3, 8, dtype=x.dtype)))
    assert torch.equal(z, torch.zeros_like(z))


def test_config_covers_the_sms():
    """BN grows only while the grid keeps 2 programs a SM (132 SMs: an H200)."""
    assert small_m_config(64, 2048, 2048, 132)["BN"] == 16  # 128 programs
    assert small_m_config(64, 16384, 2048, 132)["BN"] == 32  # 512
    assert small_m_config(1, 4096, 14336, 132) == dict(BM=16, BN=16, BK=256, num_warps=4,
                                                       num_stages=3)  # fmt: skip
    assert small_m_config(64, 57344, 4096, 132)["BN"] == 128  # 448


@pytest.mark.parametrize(
    "change",
    ["many_rows", "float32", "w_dtype", "w_width", "x_stride", "out_shape", "out_dtype"],
)
def test_bad_arguments_raise_before_writing(change, gen):
    x, w = _operands(4, 8, 16, torch.bfloat16, gen)
    out = torch.full((4, 8), 7.0, dtype=torch.bfloat16, device=DEV)
    kw = {}
    if change == "many_rows":
        x = torch.randn(65, 16).to(torch.bfloat16).to(DEV)
    elif change == "float32":
        x = x.float()
    elif change == "w_dtype":
        w = w.half()
    elif change == "w_width":
        w = w[:, :8]
    elif change == "x_stride":
        x = x.t().contiguous().t()
    elif change == "out_shape":
        out = out[:, :4]
    elif change == "out_dtype":
        out = out.float()
    before = out.clone()
    name = {"many_rows": "x", "float32": "x", "x_stride": "x"}.get(change, "w")
    name = "out" if change.startswith("out") else name
    with pytest.raises(InvalidArgumentError, match=f"^{name}"):
        linear_small_m(x, w, out=out, **kw)
    assert torch.equal(out, before)
