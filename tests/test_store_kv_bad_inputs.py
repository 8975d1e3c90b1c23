"""store_kv / gather_kv on bad inputs (issue 55).

Host values (index tensors on the CPU, the manager's CPU path): every bad argument or index
value raises a typed error naming it, before any byte of the cache is written.
Device values (what a GPU call keeps on the device): both backends skip every token whose
target lies outside the pages the lookup table gives, by the rules of
`ops/store_kv/reference.py`; checked here through the backend functions on the CPU (the
Triton kernel under the interpreter) against an independent Python oracle, byte for byte over
the whole pool and its scales.
"""

from __future__ import annotations

import os

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported

from bad_inputs import assert_rejected, bad_ints, fingerprint, tensor_variants  # noqa: E402

from pagedattn import (  # noqa: E402
    KVCacheParams,
    KVQuantConfig,
    PagedKVCacheManager,
    PagedOperand,
    gather_kv,
    store_kv,
)
from pagedattn.ops.store_kv.reference import store_kv_reference, write_rows  # noqa: E402
from pagedattn.ops.store_kv.triton_store import store_kv_triton  # noqa: E402
from pagedattn.testing import make_paged_cache, ragged_offsets  # noqa: E402

BF16 = torch.bfloat16
E8M0 = torch.float8_e8m0fnu
LAYER = 1
HYP = settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

FORMATS = {
    "bf16": lambda: KVCacheParams(BF16, 2, 2, 32, 3),
    "blockwise16": lambda: KVCacheParams(
        BF16, 2, 2, 32, 3, quantization=KVQuantConfig.blockwise(16)
    ),
    "token_e8m0": lambda: KVCacheParams(
        BF16, 2, 2, 32, 3, quantization=KVQuantConfig.per_token(E8M0)
    ),
    "per_tensor": lambda: KVCacheParams(BF16, 2, 2, 32, 3, quantization=KVQuantConfig.per_tensor()),
    "rope_aware": lambda: KVCacheParams(
        BF16, 2, 1, 576, 3, is_mla=True, num_q_heads=4, quantization=KVQuantConfig.mla_rope_aware()
    ),
    "v32": lambda: KVCacheParams(
        BF16, 2, 1, 576, 3, is_mla=True, num_q_heads=4, quantization=KVQuantConfig.flashmla_v32()
    ),
    "model1": lambda: KVCacheParams(
        BF16, 2, 1, 512, 3, is_mla=True, num_q_heads=4, quantization=KVQuantConfig.flashmla_model1()
    ),
}


def new_tokens(params, n, seed, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    shape = (n, params.n_kv_heads_per_device, params.head_dim)
    k = (torch.randn(shape, generator=g) * 2).to(BF16).to(device)
    v = None if params.is_mla else torch.randn(shape, generator=g).to(BF16).to(device)
    return k, v


def cache_for(params, cache_lens, q_lens, seed, device="cpu"):
    inp = make_paged_cache(
        params, cache_lens, q_lens, generator=torch.Generator().manual_seed(seed), device=device
    ).inputs
    if params.quant_format == "per_tensor":
        inp.kv_scales[:, LAYER] = torch.tensor([0.013, 0.021])
    return inp


def state(inp, *more):
    return (inp.kv_blocks, inp.kv_scales, inp.cache_lengths, inp.lookup_table, *more)


def copy_inputs(inp):
    return type(inp)(
        inp.kv_blocks.clone(),
        inp.cache_lengths.clone(),
        inp.lookup_table.clone(),
        inp.max_lengths,
        None if inp.kv_scales is None else inp.kv_scales.clone(),
    )


# An independent statement of which tokens are written (ops/store_kv/reference.py) ---------
def oracle_targets(offs, cl, lut, page_size, num_pages, total):
    """[(token, page, slot)] that store_kv writes for host lists of the index values."""
    batch = len(offs) - 1
    out = []
    for t in range(total):
        if t < batch and offs[t] == t and offs[t + 1] == t + 1:
            b = t
        else:
            b = sum(1 for e in offs[1:] if e <= t)
        if b >= batch or not offs[b] <= t < offs[b + 1]:
            continue
        pos = cl[b] + t - offs[b]
        if pos < 0 or pos >= len(lut[b]) * page_size:
            continue
        page = lut[b][pos // page_size]
        if 0 <= page < num_pages:
            out.append((t, page, pos % page_size))
    return out


def host_valid(offs, cl, lut, page_size, num_pages, total):
    """Whether store_kv's host check must accept these index values."""
    if offs[0] != 0 or offs[-1] != total or any(a > b for a, b in zip(offs, offs[1:])):
        return False
    for b, c in enumerate(cl):
        n = offs[b + 1] - offs[b]
        if c < 0 or (n and c + n > len(lut[b]) * page_size):
            return False
        if any(not 0 <= lut[b][p // page_size] < num_pages for p in range(c, c + n)):
            return False
    return True


def oracle_write(inp, params, k, v, targets):
    """Write only the oracle's target tokens (plain index_put, no skipping logic)."""
    if not targets:
        return
    ts = torch.tensor([t for t, _, _ in targets], device=k.device)
    for x, kv in ((k, "k"), (v, "v")):
        if x is None:
            continue
        op = PagedOperand(inp, params, LAYER, kv)
        rows = torch.tensor([p * op.page_stride_rows + s for _, p, s in targets], device=k.device)
        write_rows(op, rows, x[ts])


def assert_same(a, b, what):
    fa, fb = fingerprint(a.kv_blocks, a.kv_scales), fingerprint(b.kv_blocks, b.kv_scales)
    for name, x, y in zip(("kv_blocks", "kv_scales"), fa, fb):
        if x is None:
            continue
        assert torch.equal(x[2], y[2]), f"{what}: {name}: {int((x[2] != y[2]).sum())} bytes differ"


@st.composite
def corrupted(draw, fmt):
    """A small cache and index values with 1-3 corruptions of the kinds the issue names."""
    params = FORMATS[fmt]()
    batch = draw(st.integers(1, 3))
    cache_lens = draw(st.lists(st.integers(0, 7), min_size=batch, max_size=batch))
    q_lens = draw(st.lists(st.integers(0, 4), min_size=batch, max_size=batch))
    seed = draw(st.integers(0, 2**16))
    inp = cache_for(params, cache_lens, q_lens, seed)
    P, ps = inp.kv_blocks.shape[0], params.page_size
    cols = inp.lookup_table.shape[1]
    offs, cl = ragged_offsets(q_lens).tolist(), list(cache_lens)
    lut = inp.lookup_table.tolist()
    extra = 0
    for kind in draw(st.lists(st.sampled_from(range(7)), min_size=1, max_size=3)):
        b = draw(st.integers(0, batch - 1))
        if kind == 0:  # a bad page id where the tokens may land
            c = draw(st.integers(0, cols - 1))
            lut[b][c] = draw(st.sampled_from([-1, -(2**31), P, P + 1, 2**31 - 1]))
        elif kind == 1:  # a negative or huge cache length
            cl[b] = draw(st.sampled_from([-1, -4, -(2**31), 2**31 - 1, 2**31 - 3]))
        elif kind == 2:  # past the table's reach
            cl[b] = cols * ps - draw(st.integers(-2, 2))
        elif kind == 3:  # tokens past q_row_offsets' range
            extra = draw(st.integers(1, 3))
        elif kind == 4:  # a garbage offset
            i = draw(st.integers(0, batch))
            offs[i] = draw(st.integers(-3, offs[-1] + 3))
        elif kind == 5:  # offsets not starting at 0
            offs[0] = draw(st.integers(1, 3))
        else:  # the last offset short of the tokens
            offs[-1] = max(0, offs[-1] - draw(st.integers(1, 3)))
    total = sum(q_lens) + extra
    inp.cache_lengths.copy_(torch.tensor(cl, dtype=torch.int32))
    inp.lookup_table.copy_(torch.tensor(lut, dtype=torch.int32))
    k, v = new_tokens(params, total, seed)
    q_offs = torch.tensor(offs, dtype=torch.int32)
    return params, inp, k, v, q_offs, (offs, cl, lut, ps, P, total)


# Device semantics: both backends skip, byte for byte as the oracle -----------------------
@settings(HYP, max_examples=50)
@given(fmt=st.sampled_from(list(FORMATS)), data=st.data())
def test_device_values_skip_out_of_range_tokens(fmt, data):
    params, inp, k, v, q_offs, host = data.draw(corrupted(fmt))
    want, ref, tri = copy_inputs(inp), copy_inputs(inp), copy_inputs(inp)
    oracle_write(want, params, k, v, oracle_targets(*host))
    ops = [
        (
            PagedOperand(x, params, LAYER, "k"),
            PagedOperand(x, params, LAYER, "v") if v is not None else None,
        )
        for x in (ref, tri)
    ]
    store_kv_reference(k, v, *ops[0], q_offs)
    store_kv_triton(k, v, *ops[1], q_offs)
    assert_same(ref, want, "reference")
    assert_same(tri, want, "triton")


# Host semantics: a typed error before any write, or the oracle's bytes -------------------
@settings(HYP, max_examples=40)
@given(
    fmt=st.sampled_from(["bf16", "blockwise16", "per_tensor", "v32"]),
    data=st.data(),
    backend=st.sampled_from(["reference", "triton"]),
)
def test_host_values_checked_before_any_write(fmt, data, backend):
    params, inp, k, v, q_offs, host = data.draw(corrupted(fmt))
    if host_valid(*host):
        want = copy_inputs(inp)
        oracle_write(want, params, k, v, oracle_targets(*host))
        store_kv(k, v, inp, params, LAYER, q_offs, backend=backend)
        assert_same(inp, want, "valid corrupted input")
        return
    assert_rejected(
        store_kv,
        k,
        v,
        inp,
        params,
        LAYER,
        q_offs,
        backend=backend,
        state=state(inp, k, v, q_offs),
        names=("q_row_offsets", "inputs.cache_lengths", "inputs.lookup_table"),
    )


# The cases -----------------------------------------------------------------------
@pytest.mark.parametrize("fmt", ["bf16", "blockwise16", "v32"])
@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_30_tokens_for_an_allocation_of_10(fmt, backend):
    """Via the manager: a typed error, and no byte of the cache (nor the manager) changes."""
    p = FORMATS[fmt]()
    m = PagedKVCacheManager(p, 16)
    m.claim("a", list(range(10)))
    m.alloc("a", 10)
    (inp,) = m.runtime_inputs(["a"])
    k, v = new_tokens(p, 30, 0)
    assert_rejected(
        store_kv,
        k,
        v,
        inp,
        p,
        LAYER,
        ragged_offsets([30]),
        backend=backend,
        state=state(inp, k, v, m),
        names="q_row_offsets",
    )
    # The 10 allocated tokens still go in.
    store_kv(k[:10], None if v is None else v[:10], inp, p, LAYER, ragged_offsets([10]))
    kk, _ = gather_kv(inp, p, LAYER, 0, 10)
    assert not torch.isnan(kk).any()


@pytest.mark.parametrize("fmt", ["bf16", "token_e8m0", "rope_aware", "model1"])
def test_lookup_entry_minus_one(fmt):
    p = FORMATS[fmt]()
    inp = cache_for(p, [4, 2], [3, 2], 1)
    inp.lookup_table[1, 1] = -1  # request 1 writes positions 2, 3 on page column 0 and 1
    k, v = new_tokens(p, 5, 1)
    offs = ragged_offsets([3, 2])
    for backend in ("reference", "triton"):
        assert_rejected(
            store_kv,
            k,
            v,
            inp,
            p,
            LAYER,
            offs,
            backend=backend,
            state=state(inp, k, v, offs),
            names="inputs.lookup_table",
        )
    # Device semantics: request 1's token at position 3 (column 1) is skipped, the rest land.
    want, got = copy_inputs(inp), copy_inputs(inp)
    lut = inp.lookup_table.tolist()
    oracle_write(
        want, p, k, v, [(0, lut[0][1], 1), (1, lut[0][1], 2), (2, lut[0][2], 0), (3, lut[1][0], 2)]
    )
    kop = PagedOperand(got, p, LAYER, "k")
    vop = None if p.is_mla else PagedOperand(got, p, LAYER, "v")
    store_kv_triton(k, v, kop, vop, offs)
    assert_same(got, want, "lookup entry -1")


@pytest.mark.parametrize("fmt", ["bf16", "blockwise16", "per_tensor", "v32"])
def test_negative_cache_length(fmt):
    p = FORMATS[fmt]()
    inp = cache_for(p, [4, 2], [3, 2], 2)
    inp.cache_lengths[1] = -1
    k, v = new_tokens(p, 5, 2)
    offs = ragged_offsets([3, 2])
    for backend in ("reference", "triton"):
        assert_rejected(
            store_kv,
            k,
            v,
            inp,
            p,
            LAYER,
            offs,
            backend=backend,
            state=state(inp, k, v, offs),
            names="inputs.cache_lengths",
        )
    # Device semantics: request 1's position -1 is skipped, its position 0 lands.
    want, ref, tri = copy_inputs(inp), copy_inputs(inp), copy_inputs(inp)
    lut = inp.lookup_table.tolist()
    targets = [(0, lut[0][1], 1), (1, lut[0][1], 2), (2, lut[0][2], 0), (4, lut[1][0], 0)]
    oracle_write(want, p, k, v, targets)
    for x, fn in ((ref, store_kv_reference), (tri, store_kv_triton)):
        kop = PagedOperand(x, p, LAYER, "k")
        fn(k, v, kop, None if p.is_mla else PagedOperand(x, p, LAYER, "v"), offs)
        assert_same(x, want, fn.__name__)


def test_layer_idx_float():
    p = FORMATS["bf16"]()
    inp = cache_for(p, [2], [1], 3)
    k, v = new_tokens(p, 1, 3)
    offs = ragged_offsets([1])
    for bad in (1.5, True, 1.0, "1", None, 2, -1):
        assert_rejected(
            store_kv, k, v, inp, p, bad, offs, state=state(inp, k, v), names="layer_idx"
        )
        assert_rejected(gather_kv, inp, p, bad, 0, 1, state=state(inp), names="layer_idx")
        assert_rejected(PagedOperand, inp, p, bad, "k", names="layer_idx")


# Random bad arguments --------------------------------------------------------------------
def _good(fmt="blockwise16"):
    p = FORMATS[fmt]()
    inp = cache_for(p, [4, 0], [2, 3], 4)
    k, v = new_tokens(p, 5, 4)
    return p, inp, k, v, ragged_offsets([2, 3])


@HYP
@given(data=st.data())
def test_store_kv_random_bad_arguments(data):
    p, inp, k, v, offs = _good()
    extra = []
    args = {"k_new": k, "v_new": v, "inputs": inp, "params": p, "layer_idx": LAYER}
    args["q_row_offsets"] = offs
    name = data.draw(
        st.sampled_from(
            ["k_new", "v_new", "q_row_offsets", "layer_idx", "backend", "params", "inputs"]
        )
    )
    names = name
    if name == "layer_idx":
        args[name] = data.draw(bad_ints(0, p.num_layers - 1))
    elif name == "backend":
        args["backend"] = data.draw(st.sampled_from(["cuda", "", 1, True, ["triton"], "Triton"]))
    elif name == "params":
        args[name] = data.draw(
            st.sampled_from(
                [
                    None,
                    "params",
                    KVCacheParams(BF16, 2, 2, 32, 4, quantization=KVQuantConfig.blockwise(16)),
                    KVCacheParams(BF16, 3, 2, 32, 3, quantization=KVQuantConfig.blockwise(16)),
                    KVCacheParams(BF16, 2, 2, 32, 3, quantization=KVQuantConfig.blockwise(32)),
                    KVCacheParams(BF16, 2, 2, 32, 3),
                ]
            )
        )
        names = ("params", "inputs.kv_blocks", "inputs.kv_scales", "k_new", "layer_idx")
    elif name == "inputs":
        field = data.draw(
            st.sampled_from(["kv_blocks", "kv_scales", "cache_lengths", "lookup_table"])
        )
        good = getattr(inp, field)
        variants = tensor_variants(good) + [("None", None)]
        if field == "lookup_table":  # one column fewer may still reach every new token
            variants = [(lb, t) for lb, t in variants if lb != "last dim - 1"]
            variants.append(("too narrow", good[:, :1].clone()))
        label, bad = data.draw(st.sampled_from(variants))
        args["inputs"] = copy_inputs(inp)
        setattr(args["inputs"], field, bad)
        names = ("inputs", "q_row_offsets")
        extra = [x for x in state(args["inputs"]) if x is None or x.device.type != "meta"]
    else:
        good = args[name]
        label, bad = data.draw(st.sampled_from(tensor_variants(good) + [("None", None)]))
        if name == "q_row_offsets" and label != "meta device":
            bad = data.draw(
                st.sampled_from(
                    [
                        bad,
                        torch.tensor([0, 2, 6], dtype=torch.int32),
                        torch.tensor([1, 2, 5], dtype=torch.int32),
                        torch.tensor([0, 3, 2], dtype=torch.int32),
                    ]
                )
            )
        args[name] = bad
        names = (name, "v_new")
    assert_rejected(store_kv, **args, state=(*state(inp, k, v, offs), *extra), names=names)


@HYP
@given(data=st.data())
def test_gather_kv_random_bad_arguments(data):
    p, inp, k, v, offs = _good()
    store_kv(k, v, inp, p, LAYER, offs)
    args = [inp, p, LAYER, 1, 3]
    reach = inp.lookup_table.shape[1] * p.page_size
    i = data.draw(st.integers(0, 3))
    if i == 0:
        args[2] = data.draw(bad_ints(0, p.num_layers - 1))
        names = "layer_idx"
    elif i == 1:
        args[3] = data.draw(bad_ints(0, 1))
        names = "batch_idx"
    elif i == 2:
        args[4] = data.draw(bad_ints(0, reach))
        names = "num_tokens"
    else:
        args.append(
            data.draw(
                st.sampled_from([torch.int32, torch.float8_e4m3fn, "float32", None, 1, torch.bool])
            )
        )
        names = "out_dtype"
    assert_rejected(gather_kv, *args, state=state(inp), names=names)


def test_gather_kv_unallocated_page_is_typed_error():
    p, inp, k, v, offs = _good()
    store_kv(k, v, inp, p, LAYER, offs)
    cols = inp.lookup_table.shape[1]
    # Request 1 has 3 tokens on one page; the columns after it hold the sentinel.
    assert_rejected(
        gather_kv, inp, p, LAYER, 1, cols * p.page_size, state=state(inp), names="lookup_table"
    )
    inp.lookup_table[1, 0] = -1
    assert_rejected(gather_kv, inp, p, LAYER, 1, 1, state=state(inp), names="lookup_table")


# The GPU (values on the device: no host check, both backends skip) ------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("fmt", list(FORMATS))
def test_gpu_device_values_skip(fmt):
    p = FORMATS[fmt]()
    inp = cache_for(p, [4, 2, 5], [3, 2, 4], 5, device="cuda")
    lut = inp.lookup_table
    lut[1, 1] = -1
    inp.cache_lengths[2] = -2  # positions -2, -1 skipped, 0 and 1 land
    k, v = new_tokens(p, 11, 5, device="cuda")  # 2 tokens past q_row_offsets' range
    offs = ragged_offsets([3, 2, 4], "cuda")
    host = (
        offs.tolist(),
        inp.cache_lengths.tolist(),
        lut.tolist(),
        p.page_size,
        inp.kv_blocks.shape[0],
        11,
    )
    targets = oracle_targets(*host)
    assert len(targets) == 6
    want = copy_inputs(inp)
    oracle_write(want, p, k, v, targets)
    for backend in ("reference", "triton"):
        got = copy_inputs(inp)
        store_kv(k, v, got, p, LAYER, offs, backend=backend)
        if backend == "triton" and p.quant_format == "blockwise":
            # CUDA's reference quantizer may differ by an ulp (test_triton_store.py): compare
            # the bytes outside the written rows only.
            rows = torch.ones(got.kv_blocks.shape[:4], dtype=torch.bool, device="cuda")
            for _, page, slot in targets:
                rows[page, :, LAYER, slot] = False
            assert torch.equal(
                got.kv_blocks[rows].view(torch.uint8), want.kv_blocks[rows].view(torch.uint8)
            )
            continue
        assert_same(got, want, backend)
    # gather_kv reads a token on a bad page as NaN on the GPU (no sync, no fault): request 1's
    # position 2 was written, position 3 is on lookup-table entry -1.
    kk, _ = gather_kv(want, p, LAYER, 1, 4)
    assert torch.isfinite(kk[2]).all() and torch.isnan(kk[3]).all()
