"""The FP8 decode fast loop's launch knobs (`selection.fast_flags`) and the prefill grid order,
each against the float64 oracle of test_triton_mha.py (CPU: under the interpreter)."""

import pytest
import test_triton_mha as T
import torch
import triton
import triton.language as tl

from pagedattn.cache.params import KVQuantConfig
from pagedattn.ops import masks
from pagedattn.ops.mha.selection import MHATuning
from pagedattn.ops.mha.triton_decode import e4m3_to_f16_lo

E8M0 = torch.float8_e8m0fnu
# Every knob off (the general loop); each case below sets some on top.
OFF = dict(fast=False, addr=1, clamp=False, v_delta=False, v_sel=True, v_perm=False, gp_min=16,
           trans=False, k_cvt="tl", v_cvt="tl", num_stages=5)  # fmt: skip
FAST = [
    dict(fast=True),
    dict(fast=True, clamp=True),
    dict(fast=True, addr=2),
    dict(fast=True, addr=2, clamp=True, v_delta=True),
    dict(fast=True, v_delta=True, k_cvt="int", v_cvt="int", v_sel=False),
    dict(
        fast=True, addr=2, clamp=True, v_delta=True, k_cvt="int", v_cvt="int", v_sel=False, gp_min=1
    ),
    dict(gp_min=1),
    dict(fast=True, addr=2, clamp=True, v_delta=True, v_sel=False, v_perm=True, gp_min=4),
    dict(fast=True, clamp=True, v_delta=True, v_sel=False, v_perm=True, v_cvt="int"),
    dict(
        fast=True,
        addr=2,
        clamp=True,
        v_delta=True,
        v_sel=False,
        v_perm=True,
        v_cvt="asm",
        k_cvt="asm",
        num_warps=4,
    ),
    dict(
        fast=True,
        addr=2,
        clamp=True,
        v_delta=True,
        v_sel=False,
        v_perm=True,
        v_cvt="asm",
        gp_min=4,
        trans=True,
    ),
    dict(
        fast=True,
        clamp=True,
        v_delta=True,
        v_sel=False,
        v_perm=True,
        trans=True,
        v_cvt="int",
        k_cvt="int",
        num_warps=1,
    ),
    dict(fast=True, trans=True, gp_min=16),
    dict(fast=True, BLOCK_N=16, addr=2, clamp=True, gp_min=8),
    dict(),  # the general loop
]
QUANTS = [KVQuantConfig.per_token(), KVQuantConfig.per_token(E8M0), KVQuantConfig.per_tensor()]


@pytest.fixture
def gen():
    return torch.Generator().manual_seed(0)


@pytest.mark.parametrize("knobs", FAST, ids=lambda k: "-".join(f"{a}{b}" for a, b in k.items()))
@pytest.mark.parametrize("quant", QUANTS, ids=lambda c: f"{c.format}-{c.scale_dtype}")
@pytest.mark.parametrize("page,parts", [(16, 2), (4, 1), (1, 3)])
def test_fast_decode(knobs, quant, page, parts, gen):
    cache_lens = [45, 8, 19, 70]
    k, v, ks, vs = T.build_paged(page, 2, 64, cache_lens, [1] * 4, quant=quant, gen=gen)
    q = T.rand_q(4, 8, 64, gen)
    sinks = torch.randn(8, generator=gen).to(T.DEV)
    T.check(
        q,
        k,
        v,
        ks,
        vs,
        cache_lens,
        [0, 1, 2, 3, 4],
        num_partitions=parts,
        sinks=sinks if parts == 1 else None,
        config=MHATuning(decode={**OFF, **knobs}),
    )


@pytest.mark.parametrize(
    "knobs",
    [FAST[3], FAST[5], FAST[7], FAST[10], FAST[11]],
    ids=["addr2clamp", "all", "perm", "trans", "trans_w1"],
)
@pytest.mark.parametrize(
    "mask", [masks.sliding_window_causal(10), masks.chunked_causal(16)], ids=["swa", "chunk"]
)
def test_fast_decode_masks(knobs, mask, gen):
    cache_lens = [45, 8, 19, 70]
    k, v, ks, vs = T.build_paged(16, 2, 64, cache_lens, [1] * 4, quant=QUANTS[0], gen=gen)
    q = T.rand_q(4, 8, 64, gen)
    tuning = MHATuning(decode={**OFF, **knobs})
    T.check(
        q, k, v, ks, vs, cache_lens, [0, 1, 2, 3, 4], num_partitions=2, mask=mask, config=tuning
    )


def test_e4m3_integer_upcast_all_codes():
    """Every e4m3 byte: the plain-tl integer upcast equals value * 2^-8 (NaN codes -> +-1.875)."""

    @triton.jit
    def k(X, Y):
        o = tl.arange(0, 256)
        x = tl.load(X + o)
        tl.store(Y + o, e4m3_to_f16_lo(x, False))

    x = torch.arange(256, dtype=torch.uint8, device=T.DEV).view(torch.float8_e4m3fn)
    y = torch.empty(256, dtype=torch.float16, device=T.DEV)
    k[(1,)](x, y)
    x, y = x.cpu(), y.cpu()
    ref = x.float() * 2.0**-8
    nan = torch.isnan(ref)
    assert torch.equal(y.float()[~nan], ref[~nan])
    assert torch.equal(y.float()[nan].abs(), torch.full((2,), 1.875 * 2**-8 * 256))


@pytest.mark.parametrize(
    "knobs", [dict(blocks_fastest=True), dict(blocks_fastest=True, BLOCK_M=16, BLOCK_N=16)]
)
@pytest.mark.parametrize("h_q,h_kv", [(4, 2), (2, 2)])
def test_prefill_blocks_fastest(knobs, h_q, h_kv, gen):
    cache_lens, q_lens = [20, 0, 5], [13, 30, 1]
    k, v, ks, vs = T.build_paged(16, h_kv, 64, cache_lens, q_lens, gen=gen)
    q = T.rand_q(sum(q_lens), h_q, 64, gen)
    tuning = MHATuning(prefill=knobs)
    T.check(q, k, v, ks, vs, cache_lens, T.offsets_of(q_lens), tol=T.PREFILL_TOL, config=tuning)


@pytest.mark.parametrize(
    "knobs",
    [FAST[7], FAST[10], FAST[11], FAST[12]],
    ids=["perm", "trans", "trans_w1", "trans_gp16"],
)
@pytest.mark.parametrize("h_q,h_kv", [(2, 2), (16, 2), (6, 2)])
def test_fast_decode_groups(knobs, h_q, h_kv, gen):
    cache_lens = [45, 8, 19]
    k, v, ks, vs = T.build_paged(16, h_kv, 64, cache_lens, [1] * 3, quant=QUANTS[0], gen=gen)
    q = T.rand_q(3, h_q, 64, gen)
    tuning = MHATuning(decode={**OFF, **knobs})
    T.check(q, k, v, ks, vs, cache_lens, [0, 1, 2, 3], num_partitions=1, config=tuning)
