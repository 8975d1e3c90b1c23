"""Triton blockwise-FP8 bmm (`ops/linear/triton_fp8_bmm.py`) against the reference.

CPU runs use TRITON_INTERPRET=1 (set before triton is imported) at small shapes; they check
indexing, masking (partial last n/k blocks, k groups spanning several chunks or less than
one) and the fused activation quantization, which must be bit-identical to
`quantize_activation_groups`. `@pytest.mark.gpu` tests run DeepSeek's shapes on the GPU.

Tolerances: the kernel and the reference quantize x identically and use the same weight
scales, so they differ only in how the fp32 sum is formed: the reference adds the rounded
products (x_q * sx) * (w_q * sw) in matmul order, the kernel adds exact e4m3 products inside
each k group and scales the group's partial sum. Against a float64 oracle of the same
quantized operands the error is at most `ACC_TOL * sum |terms|`: fp32 rounding on the CPU
(2^-20), and on Hopper the fp8 tensor core's accumulator, which keeps about 14 bits
(DeepSeek-V3 report, section 3.3.2): each k32 step may lose 2^-14 of its largest product per
product, at most 32 * 2^-14 = 2^-9 of the step's sum of |terms|. bf16 outputs additionally
round once (one bf16 ulp, within 2/128 relative).
"""

from __future__ import annotations

import os

import torch

ON_GPU = torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1"
if not ON_GPU:
    os.environ["TRITON_INTERPRET"] = "1"  # CPU CI: before triton is imported

import pytest  # noqa: E402

from pagedattn.ops.linear import (  # noqa: E402
    dequantize_activation_groups,
    dequantize_weight_blocks,
    fp8_bmm,
    fp8_bmm_reference,
    quantize_activation_groups,
    quantize_weight_blocks,
)
from pagedattn.ops.linear.triton_fp8_bmm import (  # noqa: E402
    fp8_bmm_triton,
    quantize_activation_groups_triton,
)
from pagedattn.testing import BF16_TOL, assert_close, poison_  # noqa: E402

BF16, F16, F32 = torch.bfloat16, torch.float16, torch.float32
E4M3, E8M0 = torch.float8_e4m3fn, torch.float8_e8m0fnu
DEV = "cuda" if ON_GPU else "cpu"
ACC_TOL = 2.0**-9 if ON_GPU else 2.0**-20


def random_x(shape, gen, dtype=BF16, strided=False):
    """Fresh activations with row-to-row magnitude variation; optionally a strided view
    (the MLA branch's q_nope^T)."""
    b, m, k = shape
    x = torch.randn(m, b, k + 7, generator=gen) * torch.exp(torch.randn(m, b, 1, generator=gen))
    x = x.to(dtype).to(DEV)
    x = x[..., 3 : 3 + k].transpose(0, 1)  # [b, m, k], strides (k + 7, b * (k + 7), 1)
    return x if strided else x.contiguous()


def random_w(b, n, k, n_gran, k_gran, sdt, gen):
    w = torch.randn(b, n, k, generator=gen) * torch.exp(torch.randn(b, n, 1, generator=gen) * 0.5)
    wq, ws = quantize_weight_blocks(w, n_gran, k_gran, sdt)
    return wq.to(DEV), ws.to(DEV)


def oracle(x, wq, ws, n_gran, k_gran):
    """float64 product of the reference's quantized operands, and sum_k |x_k w_nk|."""
    xq, sx = quantize_activation_groups(x.cpu(), k_gran)
    xd = dequantize_activation_groups(xq, sx, k_gran, torch.float64)
    wd = dequantize_weight_blocks(wq.cpu(), ws.cpu(), n_gran, k_gran, torch.float64)
    return xd @ wd.transpose(1, 2), xd.abs() @ wd.abs().transpose(1, 2)


def check_against_oracle(out, x, wq, ws, n_gran, k_gran):
    """out within ACC_TOL * sum|terms| of the float64 oracle (plus one rounding to a 16-bit
    out dtype); NaN exactly where the oracle has NaN."""
    exact, mag = oracle(x, wq, ws, n_gran, k_gran)
    o = out.double().cpu()
    nan = torch.isnan(exact)
    assert torch.equal(torch.isnan(o), nan), "NaN positions differ"
    o, exact, mag = o[~nan], exact[~nan], mag[~nan]
    if out.dtype == F32:
        err = (o - exact).abs()
        bound = ACC_TOL * mag + 1e-30
        assert torch.all(err <= bound), f"max err/bound {float((err / bound).max()):.3g}"
    else:
        # One rounding to bf16/fp16 of a value within ACC_TOL * mag of the exact product.
        slack = (ACC_TOL * mag).clamp_min(BF16_TOL["abs_tol"])
        err = (o - exact).abs()
        ok = (err <= slack) | (err <= BF16_TOL["rel_tol"] * exact.abs())
        assert ok.all(), f"{int((~ok).sum())} elements out of tolerance"
        assert_close(o, exact, abs_tol=float(slack.max()), rel_tol=2 / 128, cos_tol=5e-6)


# --------------------------------------------------------------------------------------------
# Activation quantization (the pre-pass kernel and the GEMM's fused path use the same math)
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "shape,k_gran,dtype",
    [
        ((2, 5, 300), 128, BF16),
        ((3, 17, 96), 32, F32),
        ((1, 4, 200), 24, F16),
        ((2, 3, 70), 256, BF16),
    ],
    ids=["bf16-g128-partial", "f32-g32", "f16-g24", "g256-bigger-than-k"],
)
def test_quantize_activation_groups_bit_exact(gen, shape, k_gran, dtype):
    x = random_x(shape, gen, dtype, strided=True)
    x[0, 1, 5] = float("nan")  # poisons its group only
    x[-1, -1, :] = 0  # all-zero groups get the floor scale
    xq, sx = quantize_activation_groups_triton(x, k_gran)
    rq, rs = quantize_activation_groups(x.cpu(), k_gran)
    assert torch.equal(xq.cpu().view(torch.uint8), rq.view(torch.uint8))
    torch.testing.assert_close(sx.cpu(), rs, rtol=0, atol=0, equal_nan=True)


# --------------------------------------------------------------------------------------------
# The GEMM
# --------------------------------------------------------------------------------------------
BMM_CASES = [
    # B, M, N, K, n_gran, k_gran, w scale dtype, x dtype, out dtype, prequant
    (3, 5, 300, 200, 128, 128, F32, BF16, BF16, False),  # partial last n and k blocks
    (2, 1, 512, 128, 128, 128, E8M0, BF16, F32, False),  # w_uk of DeepSeek, one token
    (2, 70, 130, 512, 128, 128, F32, BF16, F32, None),  # m > 64: unswapped, pre-pass (auto)
    (2, 70, 130, 512, 128, 128, E8M0, BF16, BF16, False),  # m > 64, fused quantization
    (4, 7, 96, 80, 32, 64, E8M0, F32, F32, False),  # small blocks, partial k group
    (2, 3, 96, 300, 64, 256, F32, BF16, F32, False),  # groups of 2 chunks, partial
    (2, 3, 40, 100, 16, 24, F32, F16, F16, False),  # group < one chunk (masked columns)
    (2, 4, 130, 512, 128, 128, E8M0, BF16, BF16, True),  # separate quantization pass
    (1, 9, 64, 300, 64, 256, F32, BF16, F32, True),  # pre-pass + chunked groups
]


@pytest.mark.parametrize(
    "B,M,N,K,n_gran,k_gran,sdt,xdt,odt,prequant",
    BMM_CASES,
    ids=[
        f"b{c[0]}-m{c[1]}-n{c[2]}-k{c[3]}-g{c[4]}x{c[5]}-{str(c[6])[6:]}-{str(c[8])[6:]}"
        + {True: "-pre", False: "-fused", None: ""}[c[9]]
        for c in BMM_CASES
    ],
)
def test_fp8_bmm_matches_reference(gen, B, M, N, K, n_gran, k_gran, sdt, xdt, odt, prequant):
    x = random_x((B, M, K), gen, xdt, strided=True)
    wq, ws = random_w(B, N, K, n_gran, k_gran, sdt, gen)
    out = fp8_bmm_triton(x, wq, ws, k_gran=k_gran, n_gran=n_gran, out_dtype=odt, prequant=prequant)
    assert out.shape == (B, M, N) and out.dtype == odt
    check_against_oracle(out, x, wq, ws, n_gran, k_gran)
    if not ON_GPU:  # on the GPU the oracle's bound above is the one that holds
        ref = fp8_bmm_reference(x, wq, ws, k_gran=k_gran, n_gran=n_gran, out_dtype=odt)
        assert_close(out, ref, **BF16_TOL)


def test_out_view_is_written_in_place(gen):
    """out= as the MLA branch passes it: q_full[..., :rank] seen as [h_q, tokens, rank]; the
    other columns of the poisoned buffer stay untouched."""
    h_q, tokens, nope, rank, d_qk = 4, 3, 128, 192, 256
    q = random_x((tokens, h_q, nope + 64), gen)  # [tokens, h_q, nope + rope]
    wq, ws = random_w(h_q, rank, nope, 128, 128, F32, gen)
    q_full = poison_(torch.empty(tokens, h_q, d_qk, dtype=BF16, device=DEV))
    x = q[..., :nope].transpose(0, 1)
    res = fp8_bmm_triton(x, wq, ws, out=q_full[..., :rank].transpose(0, 1))
    assert res.data_ptr() == q_full.data_ptr()
    assert torch.isnan(q_full[..., rank:]).all()
    assert torch.equal(q_full[..., :rank].transpose(0, 1), fp8_bmm_triton(x, wq, ws))


def test_public_dispatch_and_nan_groups(gen):
    x = random_x((2, 4, 256), gen)
    x[1, 2, 130] = float("nan")  # group 1 of row 2 of batch 1
    wq, ws = random_w(2, 64, 256, 128, 128, F32, gen)
    out = fp8_bmm(x, wq, ws, backend="triton", out_dtype=F32)
    assert torch.isnan(out[1, 2]).all() and not torch.isnan(out[0]).any()
    check_against_oracle(out, x, wq, ws, 128, 128)


def test_empty_and_degenerate_shapes(gen):
    wq, ws = random_w(2, 8, 32, 8, 8, F32, gen)
    assert fp8_bmm_triton(
        torch.empty(2, 0, 32, dtype=BF16, device=DEV), wq, ws, k_gran=8, n_gran=8
    ).shape == (2, 0, 8)
    wq0, ws0 = random_w(2, 8, 0, 8, 8, F32, gen)
    out = fp8_bmm_triton(torch.empty(2, 3, 0, dtype=BF16, device=DEV), wq0, ws0, k_gran=8, n_gran=8)
    assert torch.equal(out.cpu(), torch.zeros(2, 3, 8, dtype=BF16))


def test_bad_out_is_refused(gen):
    from pagedattn import InvalidArgumentError

    x = random_x((2, 3, 64), gen)
    wq, ws = random_w(2, 16, 64, 16, 64, F32, gen)
    with pytest.raises(InvalidArgumentError, match="out"):
        fp8_bmm_triton(
            x, wq, ws, k_gran=64, n_gran=16, out=torch.empty(2, 3, 15, dtype=BF16, device=DEV)
        )
    with pytest.raises(InvalidArgumentError, match="w_scale"):
        fp8_bmm_triton(x, wq, ws.to(F16), k_gran=64, n_gran=16)


# --------------------------------------------------------------------------------------------
# GPU: DeepSeek shapes (w_uk: n = kv_lora_rank 512, k = qk_nope 128; w_uv: n = v_head 128,
# k = 512) for h_q 16 / 128 and decode-sized m (tokens)
# --------------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("h_q", [16, 128])
@pytest.mark.parametrize("which", ["w_uk", "w_uv"])
@pytest.mark.parametrize("tokens", [1, 64, 200])
@pytest.mark.parametrize("sdt", [F32, E8M0], ids=["f32", "e8m0"])
def test_gpu_deepseek_shapes(gen, h_q, which, tokens, sdt):
    n, k = (512, 128) if which == "w_uk" else (128, 512)
    x = random_x((h_q, tokens, k), gen, strided=True)
    wq, ws = random_w(h_q, n, k, 128, 128, sdt, gen)
    out = poison_(torch.empty(h_q, tokens, n, dtype=BF16, device=DEV))
    fp8_bmm_triton(x, wq, ws, out=out)
    check_against_oracle(out, x, wq, ws, 128, 128)
    check_against_oracle(fp8_bmm_triton(x, wq, ws, prequant=True), x, wq, ws, 128, 128)
