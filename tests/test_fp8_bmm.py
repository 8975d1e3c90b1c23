"""`pagedattn.ops.linear`: blockwise FP8 bmm, RoPE (both conventions), RMSNorm.

The FP8 oracle quantizes activations and dequantizes weights itself, block by block in
loops, then multiplies in float64. A second check compares with the unquantized float64
product within FP8 error. RoPE and RMSNorm are checked against hand-written loops.
"""

from __future__ import annotations

import math

import pytest
import torch

from pagedattn import InvalidArgumentError
from pagedattn.ops.linear import (
    dequantize_weight_blocks,
    fp8_bmm,
    fp8_bmm_reference,
    make_freqs_cis,
    quantize_activation_groups,
    quantize_weight_blocks,
    rmsnorm,
    rope,
)
from pagedattn.testing import BF16_TOL, assert_close, cos_diff

BF16, F32, E4M3, E8M0 = torch.bfloat16, torch.float32, torch.float8_e4m3fn, torch.float8_e8m0fnu


# --------------------------------------------------------------------------------------------
# Oracle pieces (loops over groups / blocks)
# --------------------------------------------------------------------------------------------
def oracle_quantize_activations(x: torch.Tensor, k_gran: int):
    """x [B, M, K] -> (x_q e4m3, scales [B, M, ceil(K/k_gran)] f32, dequantized float64).
    scale = amax(|group|) / 448 in float32, floored at 2^-126; x_q = e4m3(x / scale)."""
    B, M, K = x.shape
    G = -(-K // k_gran)
    xq = torch.empty(B, M, K, dtype=E4M3)
    sc = torch.empty(B, M, G, dtype=F32)
    for b in range(B):
        for m in range(M):
            for g in range(G):
                grp = x[b, m, g * k_gran : (g + 1) * k_gran].float()
                s = torch.clamp(grp.abs().max() / torch.tensor(448.0), min=2.0**-126)
                sc[b, m, g] = s
                xq[b, m, g * k_gran : (g + 1) * k_gran] = (grp / s).clamp(-448, 448).to(E4M3)
    deq = xq.double() * sc.double().repeat_interleave(k_gran, dim=-1)[..., :K]
    return xq, sc, deq


def oracle_dequantize_weights(w: torch.Tensor, ws: torch.Tensor, n_gran: int, k_gran: int):
    B, N, K = w.shape
    out = torch.empty(B, N, K, dtype=torch.float64)
    for b in range(B):
        for i in range(ws.shape[1]):
            for j in range(ws.shape[2]):
                rs, cs = slice(i * n_gran, (i + 1) * n_gran), slice(j * k_gran, (j + 1) * k_gran)
                out[b, rs, cs] = w[b, rs, cs].double() * float(ws[b, i, j].float())
    return out


def random_weights(B, N, K, gen):
    """Fresh weights with block-to-block magnitude variation."""
    w = torch.randn(B, N, K, generator=gen)
    return w * torch.exp(torch.randn(B, N, 1, generator=gen) * 0.5)


# --------------------------------------------------------------------------------------------
# fp8_bmm
# --------------------------------------------------------------------------------------------
BMM_CASES = [
    # B, M, N, K, n_gran, k_gran, w scale dtype, x dtype, out dtype
    (3, 5, 300, 200, 128, 128, F32, BF16, BF16),  # partial last blocks on both axes
    (2, 1, 512, 128, 128, 128, E8M0, BF16, BF16),
    (4, 7, 96, 80, 32, 64, F32, F32, F32),
    (16, 3, 512, 128, 128, 128, F32, BF16, BF16),  # w_uk of DeepSeek, per head
    (2, 4, 130, 512, 128, 128, E8M0, BF16, F32),  # w_uv-like, n not a block multiple
]


@pytest.mark.parametrize(
    "B,M,N,K,n_gran,k_gran,sdt,xdt,odt",
    BMM_CASES,
    ids=[f"b{c[0]}-m{c[1]}-n{c[2]}-k{c[3]}-g{c[4]}x{c[5]}-{c[6]}-{c[8]}" for c in BMM_CASES],
)
def test_fp8_bmm_matches_oracle(gen, B, M, N, K, n_gran, k_gran, sdt, xdt, odt):
    x = (torch.randn(B, M, K, generator=gen) * 3).to(xdt)
    wq, ws = quantize_weight_blocks(random_weights(B, N, K, gen), n_gran, k_gran, sdt)
    assert wq.dtype == E4M3 and ws.dtype == sdt
    assert ws.shape == (B, -(-N // n_gran), -(-K // k_gran))

    xq_ref, sc_ref, x64 = oracle_quantize_activations(x, k_gran)
    xq, sc = quantize_activation_groups(x, k_gran)
    assert torch.equal(xq.view(torch.uint8), xq_ref.view(torch.uint8))
    assert torch.equal(sc, sc_ref)

    w64 = oracle_dequantize_weights(wq, ws, n_gran, k_gran)
    ref = x64 @ w64.transpose(1, 2)
    out = fp8_bmm(x, wq, ws, k_gran=k_gran, n_gran=n_gran, out_dtype=odt, backend="reference")
    assert out.dtype == odt and out.shape == (B, M, N)
    # float32 output: accumulation error is relative to the sum of |terms|, not to the result.
    mag = float((x64.abs() @ w64.abs().transpose(1, 2)).max())
    tol = BF16_TOL if odt == BF16 else dict(abs_tol=2**-20 * mag, rel_tol=1e-5, cos_tol=1e-10)
    assert_close(out, ref, **tol)


@pytest.mark.parametrize("sdt", [F32, E8M0])
def test_fp8_bmm_close_to_unquantized_product(gen, sdt):
    B, M, N, K = 4, 6, 256, 384
    x = torch.randn(B, M, K, generator=gen).to(BF16)
    w = random_weights(B, N, K, gen)
    wq, ws = quantize_weight_blocks(w, 128, 128, sdt)
    out = fp8_bmm(x, wq, ws, backend="reference", out_dtype=F32).double()
    exact = x.double() @ w.double().transpose(1, 2)
    rel = float((out - exact).norm() / exact.norm())
    # e4m3 keeps 3 mantissa bits: each operand carries ~2-3% rms relative rounding error.
    assert rel < 0.06, rel
    assert cos_diff(out, exact) < 2e-3


@pytest.mark.parametrize("sdt", [F32, E8M0])
def test_weight_block_scales(gen, sdt):
    B, N, K, ng, kg = 2, 200, 136, 128, 64
    w = random_weights(B, N, K, gen)
    wq, ws = quantize_weight_blocks(w, ng, kg, sdt)
    for b in range(B):
        for i in range(ws.shape[1]):
            for j in range(ws.shape[2]):
                amax = float(w[b, i * ng : (i + 1) * ng, j * kg : (j + 1) * kg].abs().max())
                s = float(ws[b, i, j].float())
                if sdt == F32:
                    assert s == pytest.approx(amax / 448, rel=1e-6)
                else:  # smallest power of two with amax / s <= 448
                    assert s == 2.0 ** math.ceil(math.log2(amax / 448))
    deq = dequantize_weight_blocks(wq, ws, ng, kg)  # float32: one rounding of the exact product
    assert torch.equal(deq, oracle_dequantize_weights(wq, ws, ng, kg).float())
    deq = deq.double()
    s_full = ws.float().repeat_interleave(ng, 1).repeat_interleave(kg, 2)[:, :N, :K].double()
    err = (deq - w.double()).abs()
    # e4m3 rounding: half an ulp is 2^-4 relative for normals, 2^-10 * scale for subnormals.
    assert torch.all(err <= w.double().abs() * 2.0**-4 + s_full * 2.0**-10 + 1e-12)


def test_fp8_bmm_public_equals_reference_and_lazy_export(gen):
    import pagedattn

    x = torch.randn(2, 3, 128, generator=gen).to(BF16)
    wq, ws = quantize_weight_blocks(torch.randn(2, 64, 128, generator=gen))
    a = pagedattn.fp8_bmm(x, wq, ws)
    b = fp8_bmm_reference(x, wq, ws)
    assert torch.equal(a, b)


def test_fp8_bmm_triton_refused_on_cpu(gen, monkeypatch):
    # Triton decorates its own language functions when first imported, reading
    # TRITON_INTERPRET then: import it before unsetting the variable, or later interpreter
    # runs in this process fail ("Cannot call @triton.jit'd outside of the scope of a kernel").
    pytest.importorskip("triton")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    wq, ws = quantize_weight_blocks(torch.randn(1, 8, 16, generator=gen), 8, 8)
    with pytest.raises(InvalidArgumentError, match="backend"):
        fp8_bmm(torch.randn(1, 2, 16).to(BF16), wq, ws, k_gran=8, n_gran=8, backend="triton")


def _bad_bmm_cases():
    wq, ws = quantize_weight_blocks(torch.randn(2, 8, 16), 8, 8)
    x = torch.randn(2, 3, 16).to(BF16)
    return [
        ("x_2d", dict(x=x[0]), "x"),
        ("x_int", dict(x=x.to(torch.int32)), "x"),
        ("w_bf16", dict(w=wq.to(BF16)), "w"),
        ("w_k", dict(w=wq[..., :8].contiguous()), "w"),
        ("w_batch", dict(w=wq[:1], w_scale=ws[:1]), "w"),
        ("scale_shape", dict(w_scale=ws[:, :, :1]), "w_scale"),
        ("scale_dtype", dict(w_scale=ws.to(torch.float16)), "w_scale"),
        ("k_gran_zero", dict(k_gran=0), "k_gran"),
        ("n_gran_float", dict(n_gran=8.0), "n_gran"),
        ("n_gran_bool", dict(n_gran=True), "n_gran"),
        ("k_gran_past_int32", dict(k_gran=2**31), "k_gran"),
        ("out_dtype", dict(out_dtype=torch.int8), "out_dtype"),
        ("out_dtype_str", dict(out_dtype="bfloat16"), "out_dtype"),
        ("scale_negative", dict(w_scale=-ws), "w_scale"),
        ("scale_nan", dict(w_scale=ws * math.nan), "w_scale"),
        ("scale_zero", dict(w_scale=ws * 0), "w_scale"),
        ("backend_empty", dict(backend=""), "backend"),
    ], dict(x=x, w=wq, w_scale=ws, k_gran=8, n_gran=8)


BAD_BMM, GOOD_BMM = _bad_bmm_cases()


@pytest.mark.parametrize("over,match", [b[1:] for b in BAD_BMM], ids=[b[0] for b in BAD_BMM])
def test_fp8_bmm_bad_arguments(over, match):
    kw = {**GOOD_BMM, **over}
    x, w, ws = kw.pop("x"), kw.pop("w"), kw.pop("w_scale")
    kw.setdefault("backend", "reference")
    with pytest.raises(InvalidArgumentError, match=match):
        fp8_bmm(x, w, ws, **kw)


@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_fp8_bmm_blocks_past_the_axes_cover_them(gen, backend):
    """k_gran / n_gran beyond k / n: one block of the whole axis (no padding up to the block:
    a block of 2^31 - 1 allocates nothing more), the same as blocks of exactly k / n on the
    same backend (the Triton kernel's accumulation order can differ from the reference's by an
    ulp of the bf16 output: seed 1670473610; the backends' agreement is checked with a
    tolerance elsewhere)."""
    B, M, N, K = 2, 3, 24, 40
    x = torch.randn(B, M, K, generator=gen).to(BF16)
    wq, ws = quantize_weight_blocks(random_weights(B, N, K, gen), 2**31 - 1, 2**31 - 1)
    assert ws.shape == (B, 1, 1)
    big = fp8_bmm(x, wq, ws, k_gran=2**31 - 1, n_gran=2**31 - 1, backend=backend)
    exact = fp8_bmm(x, wq, ws, k_gran=K, n_gran=N, backend=backend)
    assert torch.equal(big, exact)
    xq, sx = quantize_activation_groups(x, 2**31 - 1)
    assert sx.shape == (B, M, 1)
    xq_k, sx_k = quantize_activation_groups(x, K)
    assert torch.equal(sx, sx_k) and torch.equal(xq.view(torch.uint8), xq_k.view(torch.uint8))


# --------------------------------------------------------------------------------------------
# RoPE
# --------------------------------------------------------------------------------------------
def rope_loop(x: torch.Tensor, pos: list[int], theta: float, interleaved: bool) -> torch.Tensor:
    """float64 [T, H, D]: each pair (a, b) rotated by angle pos * theta^(-2i/D)."""
    T, H, D = x.shape
    out = x.double().clone()
    for t in range(T):
        for i in range(D // 2):
            ang = pos[t] * theta ** (-2 * i / D)
            c, s = math.cos(ang), math.sin(ang)
            ia, ib = (2 * i, 2 * i + 1) if interleaved else (i, i + D // 2)
            for h in range(H):
                a, b = float(x[t, h, ia]), float(x[t, h, ib])
                out[t, h, ia] = a * c - b * s
                out[t, h, ib] = a * s + b * c
    return out


def test_make_freqs_cis_layout():
    d, P, theta = 16, 50, 500.0
    f = make_freqs_cis(d, P, theta)
    assert f.shape == (P, d) and f.dtype == F32
    for p in (0, 1, 7, 49):
        for i in range(d // 2):
            ang = p * theta ** (-2 * i / d)
            assert float(f[p, 2 * i]) == pytest.approx(math.cos(ang), abs=1e-7)
            assert float(f[p, 2 * i + 1]) == pytest.approx(math.sin(ang), abs=1e-7)


@pytest.mark.parametrize("interleaved", [True, False], ids=["interleaved", "half"])
@pytest.mark.parametrize("dtype", [F32, BF16])
def test_rope_matches_loop(gen, interleaved, dtype):
    T, H, D, theta = 5, 3, 64, 10000.0
    x = torch.randn(T, H, D, generator=gen).to(dtype)
    x0 = x.clone()
    pos = torch.randint(0, 300, (T,), generator=gen)
    out = rope(x, make_freqs_cis(D, 300, theta), pos, interleaved=interleaved)
    assert torch.equal(x, x0), "rope must not modify its input"
    assert out.dtype == dtype and out.shape == x.shape
    ref = rope_loop(x, pos.tolist(), theta, interleaved)
    # float32 cos/sin of angles up to 300 rad: |error| ~ 300 * 2^-24 ~ 2e-5 at most.
    tol = BF16_TOL if dtype == BF16 else dict(abs_tol=1e-4, rel_tol=1e-5, cos_tol=1e-10)
    assert_close(out, ref, **tol)


def test_rope_2d_input_and_position_zero_is_identity(gen):
    x = torch.randn(4, 8, generator=gen)
    out = rope(x, make_freqs_cis(8, 4), torch.zeros(4, dtype=torch.int64), interleaved=True)
    assert torch.equal(out, x)


@pytest.mark.parametrize(
    "kw,match",
    [
        (dict(x=torch.randn(3, 2, 7)), "x"),
        (dict(freqs_cis=torch.randn(10, 6)), "freqs_cis"),
        (dict(positions=torch.tensor([0, 1, 20])), "positions"),
        (dict(positions=torch.tensor([0, -1, 2])), "positions"),
        (dict(positions=torch.tensor([0.0, 1.0, 2.0])), "positions"),
        (dict(positions=torch.tensor([0, 1])), "positions"),
    ],
    ids=["odd_dim", "freqs_dim", "pos_past_table", "pos_negative", "pos_float", "pos_len"],
)
def test_rope_bad_arguments(kw, match):
    args = dict(x=torch.randn(3, 2, 8), freqs_cis=make_freqs_cis(8, 10), positions=torch.arange(3))
    args.update(kw)
    with pytest.raises(InvalidArgumentError, match=match):
        rope(args["x"], args["freqs_cis"], args["positions"], interleaved=False)
    with pytest.raises(InvalidArgumentError, match="rope_dim"):
        make_freqs_cis(7, 10)


# --------------------------------------------------------------------------------------------
# RMSNorm
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [F32, BF16])
def test_rmsnorm_matches_loop(gen, dtype):
    T, D, eps = 6, 512, 1e-6
    x = (torch.randn(T, 1, D, generator=gen) * 3).to(dtype)
    gamma = (torch.randn(D, generator=gen) * 0.5 + 1).to(dtype)
    out = rmsnorm(x, gamma, eps)
    assert out.dtype == dtype and out.shape == x.shape
    ref = torch.empty(T, 1, D, dtype=torch.float64)
    for t in range(T):
        row = [float(v) for v in x[t, 0]]
        inv = 1 / math.sqrt(sum(v * v for v in row) / D + eps)
        for j in range(D):
            ref[t, 0, j] = row[j] * inv * float(gamma[j])
    tol = BF16_TOL if dtype == BF16 else dict(abs_tol=1e-5, rel_tol=1e-5, cos_tol=1e-10)
    assert_close(out, ref, **tol)


def test_rmsnorm_bad_arguments():
    with pytest.raises(InvalidArgumentError, match="gamma"):
        rmsnorm(torch.randn(2, 8), torch.ones(7), 1e-6)
    with pytest.raises(InvalidArgumentError, match="eps"):
        rmsnorm(torch.randn(2, 8), torch.ones(8), float("nan"))
    with pytest.raises(InvalidArgumentError, match="x"):
        rmsnorm(torch.ones(2, 8, dtype=torch.int32), torch.ones(8), 1e-6)
