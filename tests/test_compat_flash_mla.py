"""`pagedattn.compat.flash_mla` against a float64 oracle of FlashMLA's documented semantics.

The caches are built here in FlashMLA's own layouts (its tests' allocators and quantizer rules:
power-of-two tile scales, V32 blocks with a spare token row, MODEL1 blocks padded to a multiple
of 576 bytes) and the oracle decodes their bytes itself. Semantics (FlashMLA's interface and
`tests/ref.py`): dense keys `j < seqlen` (causal: `j <= seqlen - s_q + i`); sparse indices
`block * page_block_size + offset`, -1 (and any out-of-range value) invalid, only the leftmost
`topk_length[b]` used; an extra cache joins the same softmax; LSE natural log without the sink;
the sink scales the output by `1 / (1 + exp(sink - lse))`; a query with no valid key gets
out 0 and lse +inf.

Fresh random data every run, NaN (0xFF bytes) in every slot no valid index reaches, sentinel
block ids in unused block-table columns.
"""

from __future__ import annotations

import math
import os

import pytest
import torch

from pagedattn import InvalidArgumentError
from pagedattn.compat import UnsupportedFeatureError
from pagedattn.compat import flash_mla as fm
from pagedattn.testing import BF16_TOL, assert_close

# The Triton backend on these CPU tensors runs in the interpreter, which conftest turns on only
# without CUDA (tests/test_compat_edge_cases.py's `gpu` duplicates cover the CUDA kernels).
BACKENDS = [
    "reference",
    pytest.param(
        "triton",
        marks=pytest.mark.skipif(
            os.environ.get("TRITON_INTERPRET") != "1", reason="needs TRITON_INTERPRET=1"
        ),
    ),
]

BF16, E4M3 = torch.bfloat16, torch.float8_e4m3fn
LSE_TOL = dict(abs_tol=1e-4, rel_tol=1e-5, cos_tol=1e-10)
INVALID = (-1, -(2**31), None, 2**31 - 1)  # None: exactly one past the end


# --------------------------------------------------------------------------------------------
# Caches in FlashMLA's layouts
# --------------------------------------------------------------------------------------------
def _pow2_quant(x: torch.Tensor, tile: int) -> tuple[torch.Tensor, torch.Tensor]:
    """FlashMLA's quantizer: per tile s = 2^ceil(log2(max(amax / 448, 1e-4))), q = e4m3(x / s)."""
    t = x.float().unflatten(-1, (-1, tile))
    s = torch.pow(2.0, torch.ceil(torch.log2((t.abs().amax(-1) / 448.0).clamp_min(1e-4))))
    return (t / s.unsqueeze(-1)).to(E4M3).flatten(-2), s


class Cache:
    """A FlashMLA k_cache [num_blocks, page, 1, d or bytes] with `used` slots written."""

    def __init__(self, gen, fmt: str, num_blocks: int, page: int, used: torch.Tensor) -> None:
        self.fmt, self.P, self.page = fmt, num_blocks, page
        self.d = 512 if fmt.startswith("model1") else 576
        x = torch.randn(num_blocks, page, self.d, generator=gen).to(BF16)
        self.used = used  # bool [P, page]
        blk, off = torch.nonzero(used, as_tuple=True)
        if fmt == "bf16":
            c = torch.full((num_blocks, page, 1, self.d), float("nan"), dtype=BF16)
            c[blk, off, 0] = x[blk, off]
        elif fmt == "v32":  # FlashMLA's allocator: one spare token row per block
            c = torch.full((num_blocks, page + 1, 656), 0xFF, dtype=torch.uint8)[:, :page]
            q, s = _pow2_quant(x[blk, off, :512], 128)
            row = torch.cat(
                [
                    q.view(torch.uint8),
                    s.contiguous().view(torch.uint8),
                    x[blk, off, 512:].contiguous().view(torch.uint8),
                ],
                dim=-1,
            )
            c[blk, off] = row
            c = c.view(num_blocks, page, 1, 656)
        else:  # MODEL1: [page * 576 data | page * 8 scale bytes]; "padded" as FlashMLA allocates
            nbytes = page * 584
            stride = -(-nbytes // 576) * 576 if fmt == "model1_padded" else nbytes
            buf = torch.full((num_blocks, stride), 0xFF, dtype=torch.uint8)[:, :nbytes]
            data = buf[:, : page * 576].view(num_blocks, page, 576)
            scl = buf[:, page * 576 :].view(num_blocks, page, 8)
            q, s = _pow2_quant(x[blk, off, :448], 64)
            data[blk, off] = torch.cat(
                [q.view(torch.uint8), x[blk, off, 448:].contiguous().view(torch.uint8)], dim=-1
            )
            e = (torch.log2(s) + 127).to(torch.uint8)
            scl[blk, off] = torch.cat([e, torch.zeros(len(blk), 1, dtype=torch.uint8)], dim=-1)
            c = buf.view(num_blocks, page, 1, 584)
            if fmt == "model1_padded":
                assert c.stride(0) % 584 != 0  # the layout pagedattn must copy
        self.k_cache = c

    @property
    def is_fp8(self) -> bool:
        return self.fmt != "bf16"

    def token(self, blk: int, off: int) -> torch.Tensor:
        """float64 [d] of one token, decoded from the documented bytes."""
        c = self.k_cache
        if self.fmt == "bf16":
            return c[blk, off, 0].double()
        if self.fmt == "v32":
            r = c[blk, off, 0]
            lat = r[:512].contiguous().view(E4M3).double()
            s = r[512:528].contiguous().view(torch.float32).double()
            rope = r[528:].contiguous().view(BF16).double()
            return torch.cat([(lat.view(4, 128) * s[:, None]).flatten(), rope])
        block = c[blk].reshape(-1)  # page * 584 bytes
        d = block[off * 576 : (off + 1) * 576]
        e = block[self.page * 576 + off * 8 : self.page * 576 + off * 8 + 7].double()
        lat = (
            d[:448].contiguous().view(E4M3).double().view(7, 64) * torch.pow(2.0, e - 127)[:, None]
        )
        return torch.cat([lat.flatten(), d[448:].contiguous().view(BF16).double()])


def oracle(
    q: torch.Tensor,
    keys: list[list[list[torch.Tensor]]],
    d_v: int,
    scale: float,
    sink: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """keys[b][i]: list of float64 [d] keys query (b, i) sees -> (out [b, s_q, h, d_v],
    lse [b, h, s_q]) with FlashMLA's sink and no-key rules."""
    b, s_q, h, d = q.shape
    out = torch.zeros(b, s_q, h, d_v, dtype=torch.float64)
    lse = torch.full((b, h, s_q), math.inf, dtype=torch.float64)
    for bi in range(b):
        for i in range(s_q):
            if not keys[bi][i]:
                continue
            K = torch.stack(keys[bi][i])  # [n, d]
            s = q[bi, i].double() @ K.T * scale  # [h, n]
            l = torch.logsumexp(s, dim=-1)
            o = torch.exp(s - l[:, None]) @ K[:, :d_v]
            if sink is not None:
                o = o / (1 + torch.exp(sink.double() - l))[:, None]
            out[bi, i], lse[bi, :, i] = o, l
    return out, lse


# --------------------------------------------------------------------------------------------
# Dense
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", ["bf16", "v32"])
@pytest.mark.parametrize("causal", [True, False])
def test_dense(gen, fmt, causal):
    """Dense decode over a block table: random block permutation, any page size, s_q = 2."""
    b, s_q, h, page = 3, 2, 4, 16
    seqlens = [2, 37, 70]
    n_blocks = [-(-n // page) for n in seqlens]
    P = sum(n_blocks) + 2
    perm = torch.randperm(P, generator=gen)
    cols = max(n_blocks) + 1
    table = torch.full((b, cols), P, dtype=torch.int32)  # sentinel in unused columns
    used = torch.zeros(P, page, dtype=torch.bool)
    k = 0
    for bi, (n, nb) in enumerate(zip(seqlens, n_blocks)):
        table[bi, :nb] = perm[k : k + nb].int()
        k += nb
        t = torch.arange(n)
        used[table[bi, t // page].long(), t % page] = True
    cache = Cache(gen, fmt, P, page, used)
    q = torch.randn(b, s_q, h, 576, generator=gen).to(BF16)
    meta, none = fm.get_mla_metadata(torch.tensor(seqlens), s_q * h, 1)
    assert none is None and not meta.have_initialized
    out, lse = fm.flash_mla_with_kvcache(
        q,
        cache.k_cache,
        table,
        torch.tensor(seqlens, dtype=torch.int32),
        512,
        meta,
        None,
        causal=causal,
        is_fp8_kvcache=cache.is_fp8,
    )
    assert out.shape == (b, s_q, h, 512) and lse.shape == (b, h, s_q) and lse.is_contiguous()
    keys = []
    for bi, n in enumerate(seqlens):
        toks = [cache.token(int(table[bi, j // page]), j % page) for j in range(n)]
        keys.append([toks[: n - s_q + i + 1] if causal else toks for i in range(s_q)])
    ref_o, ref_l = oracle(q, keys, 512, 576**-0.5, None)
    assert_close(out, ref_o, **BF16_TOL)
    assert_close(lse, ref_l, **LSE_TOL, name="lse")
    # The metadata records the first call's configuration; a different one is refused.
    assert meta.have_initialized and meta.config.causal == causal
    with pytest.raises(InvalidArgumentError, match="causal"):
        fm.flash_mla_with_kvcache(
            q,
            cache.k_cache,
            table,
            torch.tensor(seqlens, dtype=torch.int32),
            512,
            meta,
            causal=not causal,
            is_fp8_kvcache=cache.is_fp8,
        )


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("causal", [True, False])
def test_dense_requests_shorter_than_s_q(gen, backend, causal):
    """FlashMLA accepts cache_seqlens below s_q, 0 included (its tests' `have_zero_seqlen_k`):
    query i sees keys `< seqlen - s_q + i + 1` (causal) or `< seqlen`, and one that sees none
    gets out 0 and lse +inf. The kernels take the negative cache length; the reference
    backend attends the same keys through sparse indices."""
    b, s_q, h, page = 3, 3, 2, 4
    seqlens = [0, 2, 7]
    n_blocks = [-(-n // page) for n in seqlens]
    P = sum(n_blocks) + 1
    perm = torch.randperm(P, generator=gen)
    table = torch.full((b, max(n_blocks) + 1), P, dtype=torch.int32)
    used = torch.zeros(P, page, dtype=torch.bool)
    k = 0
    for bi, (n, nb) in enumerate(zip(seqlens, n_blocks)):
        table[bi, :nb] = perm[k : k + nb].int()
        k += nb
        t = torch.arange(n)
        used[table[bi, t // page].long(), t % page] = True
    cache = Cache(gen, "bf16", P, page, used)
    cache.k_cache.div_(8)  # few keys: keep the Triton kernels' bf16 P @ V inside BF16_TOL
    q = torch.randn(b, s_q, h, 576, generator=gen).to(BF16)
    out, lse = fm.flash_mla_with_kvcache(
        q, cache.k_cache, table, torch.tensor(seqlens, dtype=torch.int32), 512,
        fm.get_mla_metadata()[0], causal=causal, backend=backend,
    )  # fmt: skip
    keys = []
    for bi, n in enumerate(seqlens):
        toks = [cache.token(int(table[bi, j // page]), j % page) for j in range(n)]
        keys.append([toks[: max(n - s_q + i + 1, 0)] if causal else toks for i in range(s_q)])
    ref_o, ref_l = oracle(q, keys, 512, 576**-0.5, None)
    assert_close(out, ref_o, **BF16_TOL)
    assert_close(lse, ref_l, **LSE_TOL, name="lse")
    assert bool((out[0] == 0).all()) and bool((lse[0] == math.inf).all())
    if causal:  # request 1 (2 keys, 3 queries): its first query sees none
        assert bool((out[1, 0] == 0).all()) and bool((lse[1, :, 0] == math.inf).all())


# --------------------------------------------------------------------------------------------
# Sparse (+ extra cache, sink, topk_length)
# --------------------------------------------------------------------------------------------
def _sparse_indices(gen, cache: Cache, b: int, s_q: int, topk: int, lengths: list[int]):
    """[b, s_q, topk] int32: valid indices to written slots within topk_length, one invalid
    kind per query, and (beyond topk_length) valid encodings of NaN slots that must be
    ignored. Returns (indices, keys[b][i] as (block, offset) lists)."""
    P, page = cache.P, cache.page
    written = torch.nonzero(cache.used.flatten()).flatten()
    unwritten = torch.nonzero(~cache.used.flatten()).flatten()
    idx = torch.empty(b, s_q, topk, dtype=torch.int32)
    keys = []
    for bi in range(b):
        per_q = []
        for i in range(s_q):
            pick = written[torch.randint(len(written), (topk,), generator=gen)]
            row = pick.clone()
            bad = INVALID[(bi * s_q + i) % len(INVALID)]
            bad = P * page if bad is None else bad
            row[torch.randint(topk, (2,), generator=gen)] = bad
            row[lengths[bi] :] = unwritten[torch.randint(len(unwritten), (topk,), generator=gen)][
                : topk - lengths[bi]
            ]
            if bi == 0 and i == 1:
                row[:] = -1  # a query with no valid key
            idx[bi, i] = row.int()
            per_q.append(
                [divmod(int(e), page) for e in row[: lengths[bi]] if 0 <= int(e) < P * page]
            )
        keys.append(per_q)
    return idx, keys


@pytest.mark.parametrize("fmt", ["v32", "model1_padded", "model1_compact", "bf16"])
def test_sparse_extra_sink(gen, fmt):
    b, s_q, h, page, topk, x_topk = 3, 2, 4, 8, 12, 6
    main = Cache(gen, fmt, 6, page, torch.rand(6, page, generator=gen) < 0.6)
    x_fmt = "model1_compact" if fmt.startswith("model1") else fmt
    extra = Cache(gen, x_fmt, 4, 4, torch.rand(4, 4, generator=gen) < 0.6)
    d = main.d
    lengths, x_lengths = [topk, 7, 0], [3, x_topk, 2]  # topk_length 0 for request 2
    idx, keys = _sparse_indices(gen, main, b, s_q, topk, lengths)
    x_idx, x_keys = _sparse_indices(gen, extra, b, s_q, x_topk, x_lengths)
    x_idx[0, 1] = -1  # keep query (0, 1) without any valid key
    x_keys[0][1] = []
    sink = torch.randn(h, generator=gen)
    sink[1] = float("inf")
    q = torch.randn(b, s_q, h, d, generator=gen).to(BF16)
    out, lse = fm.flash_mla_with_kvcache(
        q,
        main.k_cache,
        None,
        None,
        512,
        fm.get_mla_metadata()[0],
        softmax_scale=0.05,
        is_fp8_kvcache=main.is_fp8,
        indices=idx,
        attn_sink=sink,
        extra_k_cache=extra.k_cache,
        extra_indices_in_kvcache=x_idx,
        topk_length=torch.tensor(lengths, dtype=torch.int32),
        extra_topk_length=torch.tensor(x_lengths, dtype=torch.int32),
    )
    all_keys = [
        [
            [main.token(*k) for k in keys[bi][i]] + [extra.token(*k) for k in x_keys[bi][i]]
            for i in range(s_q)
        ]
        for bi in range(b)
    ]
    ref_o, ref_l = oracle(q, all_keys, 512, 0.05, sink)
    assert_close(out, ref_o, **BF16_TOL)
    assert_close(lse, ref_l, **LSE_TOL, name="lse")
    assert bool((out[0, 1] == 0).all()) and bool((lse[0, :, 1] == math.inf).all())
    assert bool((out[:, :, 1] == 0).all())  # sink +inf


def test_cache_views_are_zero_copy_where_possible(gen):
    """V32 (spare-row block stride) and compact MODEL1 caches are viewed in place; FlashMLA's
    padded MODEL1 blocks (stride not a multiple of 584 B) are copied to a compact layout."""
    used = torch.ones(3, 8, dtype=torch.bool)
    cl = torch.zeros(1, dtype=torch.int32)
    lut = torch.zeros(1, 1, dtype=torch.int32)
    for fmt, d, shared in (
        ("v32", 576, True),
        ("model1_compact", 512, True),
        ("model1_padded", 512, False),
        ("bf16", 576, True),
    ):
        c = Cache(gen, fmt, 3, 8, used)
        op = fm._mla_operand(c.k_cache, "k_cache", c.is_fp8, d, BF16, cl, lut)
        same = op.rows.untyped_storage().data_ptr() == c.k_cache.untyped_storage().data_ptr()
        assert same == shared, fmt
        assert op.page_size == 8


def test_errors(gen):
    c = Cache(gen, "v32", 2, 4, torch.ones(2, 4, dtype=torch.bool))
    q = torch.randn(1, 1, 2, 576, generator=gen).to(BF16)
    idx = torch.zeros(1, 1, 4, dtype=torch.int32)
    table = torch.zeros(1, 2, dtype=torch.int32)
    seqlens = torch.tensor([4], dtype=torch.int32)
    with pytest.raises(InvalidArgumentError, match="causal"):
        fm.flash_mla_with_kvcache(
            q, c.k_cache, None, None, 512, None, causal=True, indices=idx, is_fp8_kvcache=True
        )
    with pytest.raises(InvalidArgumentError, match="is_fp8_kvcache"):
        fm.flash_mla_with_kvcache(q, c.k_cache, table, seqlens, 512)  # bytes without the flag
    with pytest.raises(InvalidArgumentError, match="576"):
        fm.flash_mla_with_kvcache(q[..., :512], c.k_cache, table, seqlens, 512, is_fp8_kvcache=True)
    with pytest.raises(InvalidArgumentError, match="block_table"):
        fm.flash_mla_with_kvcache(q, c.k_cache, None, seqlens, 512, is_fp8_kvcache=True)
    with pytest.raises(UnsupportedFeatureError, match="8"):
        fm.flash_mla_with_kvcache(
            q.expand(1, 9, 2, 576), c.k_cache, table, seqlens, 512, is_fp8_kvcache=True
        )
    with pytest.raises(InvalidArgumentError, match="extra_indices_in_kvcache"):
        fm.flash_mla_with_kvcache(
            q, c.k_cache, None, None, 512, indices=idx, is_fp8_kvcache=True, extra_k_cache=c.k_cache
        )
