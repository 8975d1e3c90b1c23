"""FP8 formats: blockwise / per-tensor quantization and the packed MLA rows (rope-aware,
FlashMLA V32, FlashMLA MODEL1), in a paged cache and through FlashMLA interop.

Oracles are float64 and written from the formats' documentation (DESIGN.md, FlashMLA's
README and tests/quant.py), not from the implementation.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from pagedattn import InvalidArgumentError, KVCacheParams, KVQuantConfig, gather_kv, store_kv
from pagedattn.cache import allocate_buffers
from pagedattn.cache.flashmla import from_flashmla_cache, to_flashmla_cache
from pagedattn.fp8 import dequantize_blockwise, quantize_blockwise, quantize_per_tensor
from pagedattn.fp8 import mla_formats as mf
from pagedattn.operands import DenseOperand, PagedOperand, RowOperand, load_model1_rows
from pagedattn.ops.store_kv.reference import store_rows
from pagedattn.testing import make_paged_cache, ragged_offsets

F64, F32, BF16 = torch.float64, torch.float32, torch.bfloat16
E4M3, E8M0 = torch.float8_e4m3fn, torch.float8_e8m0fnu
FLOOR = 2.0**-126
FORMATS = ("mla_rope_aware", "flashmla_v32", "flashmla_model1")
D_QK = {"mla_rope_aware": 576, "flashmla_v32": 576, "flashmla_model1": 512}


# float64 oracles ------------------------------------------------------------------------------
def e4m3_round(v: torch.Tensor) -> torch.Tensor:
    """Round float64 values to the nearest e4m3fn value (ties to even), saturating at 448."""
    a = v.abs().clamp(max=448.0)
    e = torch.floor(torch.log2(a.clamp_min(2.0**-6)))  # subnormals share exponent -6
    step = torch.exp2(e - 3)  # 3 mantissa bits
    return (torch.round(a / step) * step).copysign(v)


def oracle_scales(x: torch.Tensor, G: int, pow2: bool) -> torch.Tensor:
    """float64 scale per group of G along the last dim: amax/448 (pow2: rounded up)."""
    s = (x.double().unflatten(-1, (-1, G)).abs().amax(-1) / 448.0).clamp_min(FLOOR)
    return torch.exp2(torch.ceil(torch.log2(s))) if pow2 else s


def oracle_dequant(x: torch.Tensor, s: torch.Tensor, G: int) -> torch.Tensor:
    """float64 quantize-dequantize of x with the per-group scales s."""
    xb, s = x.double().unflatten(-1, (-1, G)), s.double().unsqueeze(-1)
    return (e4m3_round((xb / s).clamp(-448, 448)) * s).flatten(-2)


def assert_pow2_scales(s: torch.Tensor, x: torch.Tensor, G: int) -> None:
    """Scales are powers of two, cover amax (no e4m3 overflow) and are the smallest such."""
    s = s.double()
    assert torch.isfinite(s).all()
    assert torch.equal(torch.log2(s), torch.round(torch.log2(s))), "scale not a power of two"
    amax = x.double().unflatten(-1, (-1, G)).abs().amax(-1)
    want = oracle_scales(x, G, pow2=True)
    # amax/448 within a float32 rounding of a power of two may round either way.
    near = (2 * s == want) & (amax / 448 <= s * (1 + 2**-20))
    assert ((s == want) | near).all(), "scale is not 2^ceil(log2(amax/448))"
    assert (amax / s <= 448 * (1 + 2**-20)).all()


def assert_e4m3_bound(out: torch.Tensor, x: torch.Tensor, s: torch.Tensor, G: int) -> None:
    """|out - x| <= 2^-4 |x| + 2^-10 s (e4m3 half step, normal and subnormal)."""
    err = (out.double() - x.double()).abs().unflatten(-1, (-1, G))
    s = s.double().unsqueeze(-1)
    bound = 2.0**-4 * x.double().abs().unflatten(-1, (-1, G)) + 2.0**-10 * s
    assert (err <= bound * (1 + 1e-6)).all(), f"max excess {(err - bound).max().item():.3e}"


def rand_tokens(gen: torch.Generator, n: int, d: int, dtype=F32) -> torch.Tensor:
    """[n, 1, d] random tokens spanning many magnitudes (per token and per 64-value span)."""
    x = torch.randn(n, 1, d, generator=gen, dtype=F64)
    tok = torch.exp2(torch.randint(-12, 12, (n, 1, 1), generator=gen).double())
    span = torch.exp2(torch.randint(-6, 6, (n, 1, d // 64), generator=gen).double())
    return (x * tok * span.repeat_interleave(64, -1)).to(dtype)


def bits(t: torch.Tensor) -> torch.Tensor:
    """Raw bits, so that NaN compares equal to the same NaN."""
    return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32}[t.element_size()])


# Byte layouts on hand-built rows ---------------------------------------------------------------
def test_rope_aware_byte_layout():
    x = torch.full((1, 1, 576), 0.25)
    x[0, 0, :4] = torch.tensor([224.0, -224.0, 0.5, 0.0])
    x[0, 0, 512:] = 0.5
    x[0, 0, 512:514] = torch.tensor([1.0, -2.0])
    raw, s = mf.pack_rope_aware(x)
    assert raw.shape == (1, 1, 640) and raw.dtype == torch.uint8
    assert s.shape == (1, 1, 1) and s.dtype == F32 and s.item() == 0.5  # 224 / 448
    r = raw[0, 0].tolist()
    assert r[:4] == [0x7E, 0xFE, 0x38, 0x00]  # 448, -448, 1.0, 0 in e4m3fn
    assert r[4:512] == [0x30] * 508  # 0.5
    assert r[512:516] == [0x80, 0x3F, 0x00, 0xC0]  # bf16 1.0, -2.0 little-endian
    assert r[516:640] == [0x00, 0x3F] * 62  # bf16 0.5
    assert torch.equal(mf.unpack_rope_aware(raw, s, 64, F32), x)


def test_v32_byte_layout():
    x = torch.zeros(1, 1, 576)
    x[0, 0, 0:128], x[0, 0, 0] = 1.0, 448.0  # tile 0: scale 1
    x[0, 0, 128:256], x[0, 0, 128] = 4.0, 1792.0  # tile 1: scale 4
    x[0, 0, 256:384], x[0, 0, 256] = -1.0, 300.0  # tile 2: 300/448 -> scale 1; 300 -> 288
    x[0, 0, 512], x[0, 0, 513:] = 1.0, -2.0  # tile 3 all zero
    raw = mf.pack_v32(x)
    assert raw.shape == (1, 1, 656) and raw.dtype == torch.uint8
    r = raw[0, 0].tolist()
    assert r[0] == 0x7E and r[1:128] == [0x38] * 127
    assert r[128] == 0x7E and r[129:256] == [0x38] * 127
    assert r[256] == 0x79 and r[257:384] == [0xB8] * 127  # 288 = 1.125 * 2^8; -1.0
    assert r[384:512] == [0] * 128
    # 4 float32 scales at bytes 512..528: 1.0, 4.0, 1.0, 2^-126 (floor of an all-zero tile)
    assert r[512:528] == [0, 0, 0x80, 0x3F, 0, 0, 0x80, 0x40, 0, 0, 0x80, 0x3F, 0, 0, 0x80, 0]
    assert r[528:532] == [0x80, 0x3F, 0x00, 0xC0] and r[532:656] == [0x00, 0xC0] * 62
    assert mf.v32_scales(raw).tolist() == [[[1.0, 4.0, 1.0, FLOOR]]]
    want = x.clone()
    want[0, 0, 256] = 288.0
    assert torch.equal(mf.unpack_v32(raw), want)


def model1_hand_token() -> tuple[torch.Tensor, list[int], list[int]]:
    """A MODEL1 token whose tile k has scale 2^(k-3), with its expected data/scale bytes."""
    x = torch.zeros(1, 1, 512)
    data = []
    for k in range(7):
        s = 2.0 ** (k - 3)
        x[0, 0, 64 * k : 64 * (k + 1)] = -2.0 * s
        x[0, 0, 64 * k] = 448.0 * s
        data += [0x7E] + [0xC0] * 63  # 448, -2.0
    x[0, 0, 448:] = 1.0
    data += [0x80, 0x3F] * 64
    return x, data, [124, 125, 126, 127, 128, 129, 130, 0]  # e8m0 2^-3..2^3, pad 0


def test_model1_token_byte_layout():
    x, want_data, want_scales = model1_hand_token()
    data, sb = mf.pack_model1_tokens(x)
    assert data.shape == (1, 576) and sb.shape == (1, 8)
    assert data[0].tolist() == want_data and sb[0].tolist() == want_scales
    assert torch.equal(mf.unpack_model1_tokens(data, sb), x)


def test_model1_page_layout_in_cache():
    """Token offset o of a page: data at o*576 and scales at page_size*576 + o*8 of the page's
    block (FlashMLA's MODEL1 layout), through the operand of layer 1 of a 2-layer cache."""
    ps, off, layer = 3, 1, 1
    p = mla_params("flashmla_model1", ps)
    cache = make_paged_cache(p, [2 * ps], extra_pages=2)
    blocks = cache.inputs.kv_blocks
    page = int(cache.inputs.lookup_table[0, 1])
    op = PagedOperand(cache.inputs, p, layer)
    assert op.page_stride_rows == 2 * ps
    row = op.row_idx(0, ps + off)
    assert row == page * op.page_stride_rows + off
    x, want_data, want_scales = model1_hand_token()
    want = blocks.clone()
    block = want[page, 0, layer].reshape(-1)  # the page's ps * 584 contiguous bytes
    block[off * 576 : off * 576 + 576] = torch.tensor(want_data).to(torch.uint8)
    block[ps * 576 + off * 8 : ps * 576 + off * 8 + 8] = torch.tensor(want_scales).to(torch.uint8)
    store_rows(op, torch.tensor([row]), x.to(BF16))
    assert torch.equal(blocks, want)  # nothing else changed
    assert torch.equal(load_model1_rows(op, torch.tensor([row])), x)
    assert torch.equal(op.load_rows(torch.tensor([row]), BF16), x.to(BF16))


# Round trips against the float64 oracle -----------------------------------------------------
@pytest.mark.parametrize("dtype", [F32, BF16])
def test_rope_aware_roundtrip(gen, dtype):
    x = rand_tokens(gen, 64, 576, dtype)
    raw, s = mf.pack_rope_aware(x)
    out = mf.unpack_rope_aware(raw, s, 64, F32)
    amax = x[..., :512].double().abs().amax(-1, keepdim=True)
    torch.testing.assert_close(s.double(), amax / 448, rtol=2**-23, atol=0)
    assert_e4m3_bound(out[..., :512], x[..., :512], s, 512)
    # e4m3 codes: the oracle's round-to-nearest of x/s, except where x/s sits on a tie that
    # float32 division (by a rounded s) may break either way.
    v = x[..., :512].double() / s.double()
    q = raw[..., :512].contiguous().view(E4M3).double()
    q_ref = e4m3_round(v)
    off = q != q_ref
    assert ((v - (q + q_ref) / 2).abs()[off] <= 2**-20 * v.abs()[off]).all()
    assert off.double().mean() < 0.01
    assert torch.equal(out[..., :512], (q * s.double()).float())  # q * s rounded once
    assert torch.equal(out[..., 512:], x[..., 512:].to(BF16).float())  # rope exact in bf16
    assert mf.unpack_rope_aware(raw, s, 64, BF16).dtype == BF16


@pytest.mark.parametrize("dtype", [F32, BF16])
def test_v32_roundtrip(gen, dtype):
    x = rand_tokens(gen, 64, 576, dtype)
    raw = mf.pack_v32(x)
    s = mf.v32_scales(raw)
    assert_pow2_scales(s, x[..., :512], 128)
    out = mf.unpack_v32(raw, F32)
    assert_e4m3_bound(out[..., :512], x[..., :512], s, 128)
    assert torch.equal(out[..., :512].double(), oracle_dequant(x[..., :512], s, 128))
    assert torch.equal(out[..., 512:], x[..., 512:].to(BF16).float())


@pytest.mark.parametrize("dtype", [F32, BF16])
def test_model1_roundtrip(gen, dtype):
    x = rand_tokens(gen, 64, 512, dtype)
    data, sb = mf.pack_model1_tokens(x)
    assert (sb[:, 7] == 0).all()
    s = sb[:, :7].view(E8M0).float().unsqueeze(1)
    assert_pow2_scales(s, x[..., :448], 64)
    out = mf.unpack_model1_tokens(data, sb, F32)
    assert out.shape == x.shape
    assert_e4m3_bound(out[..., :448], x[..., :448], s, 64)
    assert torch.equal(out[..., :448].double(), oracle_dequant(x[..., :448], s, 64))
    assert torch.equal(out[..., 448:], x[..., 448:].to(BF16).float())


@pytest.mark.parametrize("fmt", FORMATS)
def test_extreme_magnitudes_and_zero_groups(gen, fmt):
    """Scales stay finite powers of two (V32/MODEL1) without overflow over float32's range;
    an all-zero group gets the floor scale and dequantizes to exact zeros."""
    d = D_QK[fmt]
    k = torch.arange(-120, 121, 8, dtype=F64)
    x = torch.randn(k.numel(), 1, d, generator=gen, dtype=F64) * torch.exp2(k)[:, None, None]
    x[0, 0, : d - 64] = 0.0  # whole latent zero
    x = x.float()
    out = unpack(fmt, *pack(fmt, x))
    assert torch.isfinite(out).all()
    assert (out[0, 0, : d - 64] == 0).all()
    lat, s, G = latent_and_scales(fmt, x)
    assert torch.isfinite(s).all() and (s >= FLOOR).all()
    assert s[0].eq(FLOOR).all()
    if fmt != "mla_rope_aware":
        assert_pow2_scales(s, lat, G)
    assert_e4m3_bound(out[..., : d - 64], lat, s, G)


def pack(fmt: str, x: torch.Tensor) -> tuple:
    if fmt == "mla_rope_aware":
        return mf.pack_rope_aware(x)
    if fmt == "flashmla_v32":
        return (mf.pack_v32(x),)
    return mf.pack_model1_tokens(x)


def unpack(fmt: str, *packed: torch.Tensor) -> torch.Tensor:
    if fmt == "mla_rope_aware":
        return mf.unpack_rope_aware(*packed, 64, F32)
    if fmt == "flashmla_v32":
        return mf.unpack_v32(*packed)
    return mf.unpack_model1_tokens(*packed)


def latent_and_scales(fmt: str, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int]:
    """(latent part of x, the scales its packing used, group size)."""
    if fmt == "mla_rope_aware":
        return x[..., :512], mf.pack_rope_aware(x)[1], 512
    if fmt == "flashmla_v32":
        return x[..., :512], mf.v32_scales(mf.pack_v32(x)), 128
    return x[..., :448], mf.pack_model1_tokens(x)[1][:, :7].view(E8M0).float()[:, None], 64


@pytest.mark.parametrize("fmt", FORMATS)
def test_nonfinite_poisons_its_group_only(gen, fmt):
    d = D_QK[fmt]
    x = rand_tokens(gen, 4, d)
    x[0, 0, 3] = float("nan")  # latent NaN
    x[1, 0, 5] = float("inf")  # latent inf
    x[2, 0, d - 1] = float("nan")  # rope NaN
    x[3, 0, d - 2] = -float("inf")  # rope -inf
    out = unpack(fmt, *pack(fmt, x))
    G = {"mla_rope_aware": 512, "flashmla_v32": 128, "flashmla_model1": 64}[fmt]
    want_nan = torch.zeros(4, 1, d, dtype=torch.bool)
    want_nan[0, 0, :G] = want_nan[1, 0, :G] = True  # the whole first group
    want_nan[2, 0, d - 1] = True
    assert torch.equal(torch.isnan(out), want_nan)
    assert out[3, 0, d - 2] == -float("inf")
    assert torch.isfinite(out[3, 0, : d - 2]).all()


# Rope-aware <-> V32 ---------------------------------------------------------------------------
def test_rope_aware_v32_conversions(gen):
    x = rand_tokens(gen, 32, 576)
    raw, s = mf.pack_rope_aware(x)
    ra = mf.unpack_rope_aware(raw, s)
    v = mf.rope_aware_to_v32(raw, s)  # lossless
    assert v.shape == (32, 1, 656)
    assert torch.equal(mf.v32_scales(v), s.expand(32, 1, 4))
    assert torch.equal(mf.unpack_v32(v), ra)
    raw2, s2 = mf.v32_to_rope_aware(v)  # equal tile scales: bit for bit
    assert torch.equal(raw2, raw) and torch.equal(s2, s)

    vq = mf.rope_aware_to_v32(raw, s, requantize=True)
    sq = mf.v32_scales(vq)
    assert_pow2_scales(sq, ra[..., :512], 128)
    out = mf.unpack_v32(vq)
    assert_e4m3_bound(out[..., :512], ra[..., :512], sq, 128)
    assert torch.equal(out[..., 512:], ra[..., 512:])

    v32 = mf.pack_v32(x)  # distinct tile scales -> one token scale, the largest
    deq = mf.unpack_v32(v32)
    raw3, s3 = mf.v32_to_rope_aware(v32)
    s4 = mf.v32_scales(v32)
    assert torch.equal(s3, s4.amax(-1, keepdim=True))
    out3 = mf.unpack_rope_aware(raw3, s3)
    assert_e4m3_bound(out3[..., :512], deq[..., :512], s3, 512)
    top = (s4 == s3).repeat_interleave(128, -1)  # tiles at the token scale keep their bytes
    assert torch.equal(out3[..., :512][top], deq[..., :512][top])
    assert torch.equal(out3[..., 512:], deq[..., 512:])


# A real paged cache: store_kv / gather_kv ------------------------------------------------------
def mla_params(fmt: str, page_size: int, layers: int = 2) -> KVCacheParams:
    return KVCacheParams(
        BF16,
        layers,
        1,
        D_QK[fmt],
        page_size,
        is_mla=True,
        num_q_heads=8,
        quantization=KVQuantConfig(fmt),
    )


CACHE_LENS, NEW_TOKENS = [7, 0, 66], [2, 5, 1]


def fill_cache(gen, fmt: str, page_size: int):
    """A shuffled, poisoned 2-layer cache with both layers written by store_kv in two steps
    (prefix, then new tokens). Returns (cache, per-layer per-request tokens, expected bytes,
    expected scales)."""
    p = mla_params(fmt, page_size)
    cache = make_paged_cache(p, CACHE_LENS, NEW_TOKENS, generator=gen)
    inp = cache.inputs
    want_blocks = inp.kv_blocks.clone()
    want_scales = None if inp.kv_scales is None else inp.kv_scales.clone()
    lut = inp.lookup_table.tolist()
    d, ps = p.head_dim, page_size
    tokens = []
    for layer in range(p.num_layers):
        xs = [rand_tokens(gen, n, d, BF16) for n in cache.seq_lens]
        tokens.append(xs)
        prefix = dataclasses.replace(inp, cache_lengths=torch.zeros(3, dtype=torch.int32))
        for step_inp, lens, lo in ((prefix, CACHE_LENS, 0), (inp, NEW_TOKENS, 1)):
            k_new = torch.cat(
                [x[c : c + n] if lo else x[:n] for x, c, n in zip(xs, CACHE_LENS, lens)]
            )
            store_kv(k_new, None, step_inp, p, layer, ragged_offsets(lens), backend="reference")
        # Independent expectation: every token's packed bytes at its page / offset.
        for b, x in enumerate(xs):
            for t in range(x.shape[0]):
                page, o = lut[b][t // ps], t % ps
                tok = x[t : t + 1]
                if fmt == "flashmla_model1":
                    data, sb = mf.pack_model1_tokens(tok)
                    block = want_blocks[page, 0, layer].reshape(-1)
                    block[o * 576 : (o + 1) * 576] = data[0]
                    block[ps * 576 + o * 8 : ps * 576 + (o + 1) * 8] = sb[0]
                elif fmt == "flashmla_v32":
                    want_blocks[page, 0, layer, o] = mf.pack_v32(tok)[0]
                else:
                    raw, s = mf.pack_rope_aware(tok)
                    want_blocks[page, 0, layer, o] = raw[0]
                    want_scales[page, 0, layer, o] = s[0]
    return cache, tokens, want_blocks, want_scales


@pytest.mark.parametrize("page_size", [1, 3, 64])
@pytest.mark.parametrize("fmt", FORMATS)
def test_store_gather_paged(gen, fmt, page_size):
    cache, tokens, want_blocks, want_scales = fill_cache(gen, fmt, page_size)
    inp, p = cache.inputs, cache.params
    # Every byte outside the written tokens keeps its poison (other pages, offsets, layers).
    assert torch.equal(inp.kv_blocks, want_blocks)
    if want_scales is not None:
        assert torch.equal(bits(inp.kv_scales), bits(want_scales))
    for layer in range(p.num_layers):
        for b, x in enumerate(tokens[layer]):
            k, v = gather_kv(inp, p, layer, b, x.shape[0])
            assert v is None and k.shape == x.shape
            assert torch.equal(k, unpack(fmt, *pack(fmt, x)))
            lat, s, G = latent_and_scales(fmt, x)
            assert_e4m3_bound(k[..., : p.head_dim - 64], lat, s, G)


# FlashMLA interop ---------------------------------------------------------------------------
def decode_flashmla(k_cache: torch.Tensor, fmt: str) -> torch.Tensor:
    """float64 [blocks, block_size, d_qk] from FlashMLA's k_cache, following its README and
    tests/quant.py layouts (written for this test)."""
    nb, bs, h, bpt = k_cache.shape
    assert h == 1 and k_cache.dtype == torch.uint8 and k_cache.stride(1) == bpt
    out = []
    for blk in range(nb):
        rows = k_cache[blk, :, 0]  # [bs, bpt]
        if fmt == "flashmla_v32":
            q = rows[:, :512].contiguous().view(E4M3).double().view(bs, 4, 128)
            s = rows[:, 512:528].contiguous().view(F32).double()
            lat = (q * s[:, :, None]).view(bs, 512)
            rope = rows[:, 528:656].contiguous().view(BF16).double()
        else:
            flat = rows.reshape(-1)  # block bytes: bs * 576 data, then bs * 8 scales
            data = flat[: bs * 576].view(bs, 576)
            sc = flat[bs * 576 :].view(bs, 8)[:, :7].contiguous().view(E8M0).double()
            q = data[:, :448].contiguous().view(E4M3).double().view(bs, 7, 64)
            lat = (q * sc[:, :, None]).view(bs, 448)
            rope = data[:, 448:].contiguous().view(BF16).double()
        out.append(torch.cat([lat, rope], -1))
    return torch.stack(out)


@pytest.mark.parametrize("page_size", [1, 3, 64])
@pytest.mark.parametrize("fmt", ["flashmla_v32", "flashmla_model1"])
def test_to_flashmla_cache(gen, fmt, page_size):
    cache, tokens, _, _ = fill_cache(gen, fmt, page_size)
    inp, p = cache.inputs, cache.params
    lut = inp.lookup_table.tolist()
    for layer in range(p.num_layers):
        block_bytes = page_size * p.row_elems
        aligned = (layer * block_bytes) % 16 == 0 and (2 * block_bytes) % 16 == 0
        views = [to_flashmla_cache(inp.kv_blocks, p, layer, copy=True)]
        if aligned:
            views.append(to_flashmla_cache(inp.kv_blocks, p, layer))
            assert (
                views[1].untyped_storage().data_ptr() == inp.kv_blocks.untyped_storage().data_ptr()
            )
        else:  # odd MODEL1 blocks: FlashMLA's 16-byte loads need copy=True
            assert fmt == "flashmla_model1" and page_size % 2
            with pytest.raises(InvalidArgumentError, match="copy=True"):
                to_flashmla_cache(inp.kv_blocks, p, layer)
        cp = views[0]
        assert cp.untyped_storage().data_ptr() != inp.kv_blocks.untyped_storage().data_ptr()
        if fmt == "flashmla_model1":
            assert cp.stride(0) % 576 == 0 and cp.stride(0) >= page_size * 584
        for kc in views:
            assert kc.shape == (inp.kv_blocks.shape[0], page_size, 1, p.row_elems)
            assert kc.stride(1) == p.row_elems and kc.stride(3) == 1
            dec = decode_flashmla(kc, fmt)
            for b, x in enumerate(tokens[layer]):
                k, _ = gather_kv(inp, p, layer, b, x.shape[0])
                t = torch.arange(x.shape[0])
                pages = torch.tensor(lut[b])[t // page_size]
                assert torch.equal(dec[pages, t % page_size], k[:, 0].double())


def encode_flashmla(x: torch.Tensor, fmt: str) -> torch.Tensor:
    """FlashMLA k_cache from x [blocks, block_size, d_qk] with the float64 oracle, laid out
    like FlashMLA's tests/quant.py allocates it (V32: one spare token per block; MODEL1: block
    padded to a multiple of 576 bytes). Returns (k_cache, float64 dequantized values)."""
    nb, bs, d = x.shape
    lat_d, G = (512, 128) if fmt == "flashmla_v32" else (448, 64)
    s = oracle_scales(x[..., :lat_d], G, pow2=True)
    deq = torch.cat([oracle_dequant(x[..., :lat_d], s, G), x[..., lat_d:].double()], -1)
    q = (deq[..., :lat_d].unflatten(-1, (-1, G)) / s[..., None]).flatten(-2)
    qb = q.to(E4M3).view(torch.uint8)
    rope = x[..., lat_d:].to(BF16).view(torch.uint8)
    if fmt == "flashmla_v32":
        buf = torch.full((nb, bs + 1, 656), 0xEE, dtype=torch.uint8)[:, :bs]
        buf[..., :512] = qb
        buf[..., 512:528] = s.float().view(torch.uint8)
        buf[..., 528:] = rope
        return buf.view(nb, bs, 1, 656), deq
    padded = -(-bs * 584 // 576) * 576
    buf = torch.full((nb, padded), 0xEE, dtype=torch.uint8)
    data = buf[:, : bs * 576].view(nb, bs, 576)
    data[..., :448], data[..., 448:] = qb, rope
    sc = buf[:, bs * 576 : bs * 584].view(nb, bs, 8)
    sc[..., :7] = s.to(E8M0).view(torch.uint8)
    sc[..., 7] = 0
    return buf[:, : bs * 584].view(nb, bs, 1, 584), deq


@pytest.mark.parametrize("page_size", [1, 3, 64])
@pytest.mark.parametrize("fmt", ["flashmla_v32", "flashmla_model1"])
def test_from_flashmla_cache(gen, fmt, page_size):
    p = mla_params(fmt, page_size)
    cache = make_paged_cache(p, [2 * page_size], generator=gen)
    inp = cache.inputs
    before = inp.kv_blocks.clone()
    P = inp.kv_blocks.shape[0]
    x = rand_tokens(gen, P * page_size, p.head_dim, BF16).view(P, page_size, p.head_dim)
    k_cache, deq = encode_flashmla(x, fmt)
    for dtype in (torch.uint8, E4M3):
        from_flashmla_cache(k_cache.view(dtype), inp.kv_blocks, p, 1)
        op = PagedOperand(inp, p, 1)
        rows = (torch.arange(P)[:, None] * op.page_stride_rows + torch.arange(page_size)).view(-1)
        got = op.load_rows(rows).view(P, page_size, p.head_dim)
        assert torch.equal(got.double(), deq)
    assert torch.equal(inp.kv_blocks[:, :, 0], before[:, :, 0])  # layer 0 untouched
    # And back out: the same bytes FlashMLA gave us.
    out = to_flashmla_cache(inp.kv_blocks, p, 1, copy=True)
    assert torch.equal(out, k_cache)


def test_flashmla_unquantized_view(gen):
    p = KVCacheParams(BF16, 2, 1, 576, 64, is_mla=True, num_q_heads=8)
    cache = make_paged_cache(p, [70], generator=gen)
    x = rand_tokens(gen, 70, 576, BF16)
    prefill = dataclasses.replace(cache.inputs, cache_lengths=torch.zeros(1, dtype=torch.int32))
    store_kv(x, None, prefill, p, 1, ragged_offsets([70]), backend="reference")
    kc = to_flashmla_cache(cache.inputs.kv_blocks, p, 1)
    assert kc.dtype == BF16 and kc.shape == (cache.inputs.kv_blocks.shape[0], 64, 1, 576)
    lut = cache.inputs.lookup_table[0].long()
    t = torch.arange(70)
    assert torch.equal(kc[lut[t // 64], t % 64], x)
    fresh = torch.randn(kc.shape, generator=gen).to(BF16)
    from_flashmla_cache(fresh, cache.inputs.kv_blocks, p, 0)
    assert torch.equal(cache.inputs.kv_blocks[:, 0, 0], fresh)


# Argument checking --------------------------------------------------------------------------
def test_invalid_arguments(gen):
    x = rand_tokens(gen, 2, 576)
    with pytest.raises(InvalidArgumentError, match="x.shape"):
        mf.pack_v32(x[..., :512])
    with pytest.raises(InvalidArgumentError, match="rope_dim"):
        mf.pack_rope_aware(x, rope_dim=576)
    with pytest.raises(InvalidArgumentError, match="raw"):
        mf.unpack_v32(torch.zeros(2, 1, 656))
    raw, s = mf.pack_rope_aware(x)
    with pytest.raises(InvalidArgumentError, match="scales"):
        mf.unpack_rope_aware(raw, s.double())
    with pytest.raises(InvalidArgumentError, match="x"):
        mf.pack_model1_tokens(x[..., :512].expand(2, 2, 512))
    d, sb = mf.pack_model1_tokens(rand_tokens(gen, 2, 512))
    with pytest.raises(InvalidArgumentError, match="scale_bytes"):
        mf.unpack_model1_tokens(d, sb[:1])
    # Formats FlashMLA does not read / wrong buffers.
    p = mla_params("mla_rope_aware", 64)
    blocks = allocate_buffers(p, 2).kv_blocks
    with pytest.raises(InvalidArgumentError, match="rope_aware_to_v32"):
        to_flashmla_cache(blocks, p, 0)
    p = mla_params("flashmla_model1", 3)
    blocks = allocate_buffers(p, 2).kv_blocks
    with pytest.raises(InvalidArgumentError, match="layer_idx"):
        to_flashmla_cache(blocks, p, 2)
    with pytest.raises(InvalidArgumentError, match="kv_blocks"):
        to_flashmla_cache(blocks[:, :, :, :2], p, 0)
    with pytest.raises(InvalidArgumentError, match="k_cache"):
        from_flashmla_cache(torch.zeros(2, 3, 1, 656, dtype=torch.uint8), blocks, p, 0)
    strided = torch.zeros(2, 3, 1, 600, dtype=torch.uint8)[..., :584]
    with pytest.raises(InvalidArgumentError, match="stride"):
        from_flashmla_cache(strided, blocks, p, 0)
    # Operands that are not packed MLA / not paged.
    no_lens = torch.zeros(1, dtype=torch.int32)
    dense = DenseOperand(torch.zeros(1, 4, 1, 576), no_lens)
    with pytest.raises(InvalidArgumentError, match="quant_format"):
        store_rows(dense, torch.arange(2), x)
    raw_rows = torch.zeros(4, 1, 584, dtype=torch.uint8)
    unpaged = RowOperand(raw_rows, no_lens, quant_format="flashmla_model1")
    with pytest.raises(InvalidArgumentError, match="page_size"):
        load_model1_rows(unpaged, torch.arange(2))
    p = mla_params("flashmla_v32", 3)
    op = PagedOperand(make_paged_cache(p, [3]).inputs, p, 0)
    with pytest.raises(InvalidArgumentError, match="rows"):
        store_rows(op, torch.arange(3), x)  # 3 rows for 2 tokens


# Blockwise and per-tensor ---------------------------------------------------------------------
@pytest.mark.parametrize("scale_dtype", [F32, E8M0])
@pytest.mark.parametrize("G", [16, 64, 128, 256])
def test_blockwise_quantize(gen, G, scale_dtype):
    D = 256  # G = 256 is one scale per token per head
    x = rand_tokens(gen, 24, 4 * D).view(24, 4, D)  # [tokens, heads, head_dim]
    x[0, 0] = 0.0
    q, s = quantize_blockwise(x, G, scale_dtype)
    assert q.dtype == E4M3 and q.shape == x.shape
    assert s.dtype == scale_dtype and s.shape == (24, 4, D // G)
    out = dequantize_blockwise(q, s, G, F32)
    assert (out[0, 0] == 0).all() and (s[0, 0].float() == FLOOR).all()
    sf = s.float()
    assert_e4m3_bound(out, x, sf, G)
    if scale_dtype == E8M0:
        assert_pow2_scales(sf, x, G)
        assert torch.equal(out.double(), oracle_dequant(x, sf, G))
    else:
        torch.testing.assert_close(sf.double(), oracle_scales(x, G, False), rtol=2**-23, atol=0)
    assert dequantize_blockwise(q, s, G, BF16).dtype == BF16
    with pytest.raises(InvalidArgumentError, match="G"):
        quantize_blockwise(x, 48)
    with pytest.raises(InvalidArgumentError, match="scales"):
        dequantize_blockwise(q, s, 2 * G)  # D // G scales cannot cover groups of 2G


def test_per_tensor(gen):
    x = rand_tokens(gen, 16, 128)
    amax = x.double().abs().max()
    scale = torch.tensor(amax.item() / 448, dtype=F32)
    q = quantize_per_tensor(x, scale)
    assert q.dtype == E4M3
    out = q.float() * scale
    assert_e4m3_bound(out.view(1, -1), x.view(1, -1), scale.view(1, 1), x.numel())
    # A calibrated scale that is too small saturates at +-448 instead of producing NaN/inf.
    q_small = quantize_per_tensor(x, scale / 4)
    assert torch.isfinite(q_small.float()).all() and q_small.float().abs().max() == 448.0
    assert torch.equal(quantize_per_tensor(x, float(scale)).view(torch.uint8), q.view(torch.uint8))
