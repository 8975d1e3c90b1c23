"""NaN and inf semantics of the attention ops (docs/ops.md, "NaN and inf") on both backends.

Every case builds a small adversarial batch (`make_paged_cache`: shuffled non-contiguous pages,
sentinel page ids, NaN in every slot no token occupies; ragged K/V with NaN gaps between
requests), injects a value (NaN, +inf or -inf) into q, into K and into V at keys that queries
attend, and NaN into K at keys no query attends (outside a sliding window, past a query's causal
limit, where a tensor mask is False, sparse entries past topk_length and invalid indices). Each
backend is checked against `rule`, a float64 oracle of the rule:
  - a (query, head) row with a NaN or +inf score at a key it attends is NaN, its LSE NaN (a
    -inf score gives the key weight 0, as a mask would);
  - otherwise a NaN or inf in an attended key's V reaches that column by IEEE arithmetic and the
    LSE stays finite (an infinite V may come out NaN instead: there only the positions of the
    non-finite elements are checked);
  - keys a row does not attend never matter; a row that attends nothing is 0 with LSE -inf,
    whatever its sink; a NaN sink makes the rows of its head NaN (not their LSE);
  - none of it depends on num_partitions (split-K partials are merged NaN-preserving).
NaN positions must match exactly (output and LSE), finite values within tolerance. Where the
NaN rows are known a priori (NaN injections) the test also asserts that the oracle names exactly
those, so the oracle cannot drift from the rule.

CPU: the reference and the Triton kernels (in the interpreter) at tiny shapes. `@pytest.mark.gpu`:
the same cases at serving sizes with the default backend on CUDA (the fast kernels: the Gluon
sm_90 MLA decodes and MHA prefill, the FP8 MHA decode loop, split-K combines).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os

import torch

ON_GPU = torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1"
if not ON_GPU:
    os.environ["TRITON_INTERPRET"] = "1"  # CPU CI: before triton is imported

import pytest  # noqa: E402
from oracles import LAYER, decode_pool  # noqa: E402

from pagedattn import (  # noqa: E402
    KVCacheParams,
    KVQuantConfig,
    PagedOperand,
    RaggedOperand,
    masks,
    store_kv,
)
from pagedattn.ops.combine import combine_partials  # noqa: E402
from pagedattn.ops.linear import make_freqs_cis, quantize_weight_blocks  # noqa: E402
from pagedattn.ops.mha import mha  # noqa: E402
from pagedattn.ops.mla import mla_decode  # noqa: E402
from pagedattn.ops.mla_branch import mla_decode_branch_fp8  # noqa: E402
from pagedattn.testing import (  # noqa: E402
    assert_close,
    cos_diff,
    make_paged_cache,
    poison_,
    ragged_offsets,
)

BF16, F64 = torch.bfloat16, torch.float64
DEV = "cuda" if ON_GPU else "cpu"
NAN, INF = math.nan, math.inf
VALUES = {"nan": NAN, "inf": INF, "-inf": -INF}
CPU_BACKENDS = ["reference", "triton"]
# Loose bounds: other tests check the numerics; these check where NaN and inf go. Outputs are
# bf16 (prefill rounds P to bf16 as well); FP8 caches here dequantize exactly.
TOL = dict(abs_tol=3e-2, rel_tol=2 / 128, cos_tol=1e-4)
LSE_TOL = dict(abs_tol=3e-3, rel_tol=1e-4, cos_tol=1e-6)
# Blockwise FP8 with float32 scales is dequantized to bf16 once (test_triton_mla's TOL_DEQ)
TOL_DEQ = dict(abs_tol=8e-2, rel_tol=4 / 128, cos_tol=1e-4)
LSE_TOL_DEQ = dict(abs_tol=3e-2, rel_tol=1e-4, cos_tol=5e-6)
E4M3_NAN = 0x7F
# The interpreter's NumPy warns on every NaN / inf it computes with
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")


@dataclasses.dataclass(frozen=True)
class Size:
    """Shapes of a case: CPU (interpreter) or GPU (serving-like, the fast kernels)."""

    grow: int  # cache lengths and prompt lengths are multiplied by this
    page: int
    h_kv: int = 2  # MHA
    group: int = 2  # MHA
    d: int = 16  # MHA head dim
    h_q: int = 4  # MLA query heads
    stride: int = 8  # sparse index width


CPU = Size(grow=1, page=3)
GPU_MHA = Size(grow=10, page=16, group=4, d=128)


def mla_size(h_q: int) -> Size:
    return Size(grow=10, page=64, h_q=h_q, stride=128)


# --------------------------------------------------------------------------------------------
# The rule (float64 oracle)
# --------------------------------------------------------------------------------------------
def rule(q, k, v, scale, sink=None):
    """One query token: q [h, d], k [N, h, d], v [N, h, d_v] float64, the N keys it attends
    (per query head) -> (out [h, d_v], lse [h]) as docs/ops.md prescribes."""
    h, d_v = q.shape[0], v.shape[-1]
    if k.shape[0] == 0:
        return torch.zeros(h, d_v, dtype=F64), torch.full((h,), -INF, dtype=F64)
    s = (k * q[None]).sum(-1) * scale  # [N, h], elementwise IEEE
    bad = (torch.isnan(s) | (s == INF)).any(0)
    m = torch.where(bad[None], 0.0, s).amax(0)
    m = torch.where(m == -INF, 0.0, m)
    e = torch.exp(s - m)  # 0 for -inf scores
    den = e.sum(0)
    num = (e[..., None] * v).sum(0)  # [h, d_v]
    full = den if sink is None else den + torch.exp(sink.double().cpu() - m)
    out = num / torch.where(den != 0, full, 1.0)[:, None]
    lse = m + torch.log(den)
    out[bad] = NAN
    lse[bad] = NAN
    return out, lse


def check(
    out, lse, exp_out, exp_lse, name: str, v_inf: bool = False, tol=TOL, lse_tol=LSE_TOL
) -> None:
    """Both tensors against the rule: NaN (and inf) positions exactly, finite values within
    tol. v_inf: V held an infinity, which may come out as inf or NaN (only finiteness is
    compared element by element)."""
    out, lse = out.double().cpu(), lse.double().cpu()
    if v_inf:
        fin, exp_fin = torch.isfinite(out), torch.isfinite(exp_out)
        assert torch.equal(fin, exp_fin), (
            f"{name}: non-finite positions differ ({int((~fin).sum())} vs {int((~exp_fin).sum())})"
        )
        out, exp_out = torch.where(fin, out, 0.0), torch.where(exp_fin, exp_out, 0.0)
    assert_close(out, exp_out, **tol, name=f"{name} out")
    assert_close(lse, exp_lse, **lse_tol, name=f"{name} lse")


def nan_rows(t: torch.Tensor) -> torch.Tensor:
    return torch.isnan(t.double().cpu()).any(-1)


# --------------------------------------------------------------------------------------------
# The reference combine (split-K)
# --------------------------------------------------------------------------------------------
def test_combine_partials_propagates_nan():
    """Rows (tokens 0..3 of one head): a NaN partial among finite ones; a NaN partial beside
    unseen ones; unseen partials only (0, -inf) with a NaN sink; finite partials with a NaN
    sink. NaN in the output of an unseen partial (lse -inf) is never read."""
    po = torch.randn(3, 4, 2, 5)
    pl = torch.randn(3, 4, 2)
    pl[1, 0], po[1, 0] = NAN, NAN
    pl[:, 1], pl[0, 1] = -INF, NAN
    pl[:, 2], po[:, 2] = -INF, NAN
    sinks = torch.tensor([NAN, 0.5])
    out, lse = combine_partials(po, pl, sinks)
    assert torch.isnan(out[0]).all() and torch.isnan(lse[0]).all()
    assert torch.isnan(out[1]).all() and torch.isnan(lse[1]).all()
    assert torch.equal(out[2], torch.zeros(2, 5)) and (lse[2] == -INF).all()
    assert torch.isnan(out[3, 0]).all() and torch.isfinite(out[3, 1]).all()
    assert torch.isfinite(lse[3]).all()


# --------------------------------------------------------------------------------------------
# MHA
# --------------------------------------------------------------------------------------------
@dataclasses.dataclass
class MHACase:
    q: torch.Tensor
    k: object
    v: object
    offsets: list[int]
    mask: object
    exp_out: torch.Tensor
    exp_lse: torch.Tensor
    named: torch.Tensor | None  # [total_q, h_q] rows the rule names NaN (NaN injections)


def mha_expect(q, k_op, v_op, cache_lens, offsets, mask, sinks=None):
    """The rule over a batch: keys read back (dequantized) through the operands."""
    total_q, h_q, d = q.shape
    g = h_q // k_op.num_heads
    out = torch.zeros(total_q, h_q, v_op.head_dim, dtype=F64)
    lse = torch.full((total_q, h_q), -INF, dtype=F64)
    tmask = mask.tensor.cpu() if mask.kind == "tensor" else None
    m = masks.tensor_mask(tmask) if tmask is not None else mask
    for b in range(len(offsets) - 1):
        n = cache_lens[b] + offsets[b + 1] - offsets[b]
        ks = k_op.gather(b, n).double().cpu() if n else torch.zeros(0, k_op.num_heads, d)
        vs = v_op.gather(b, n).double().cpu() if n else torch.zeros(0, 1, v_op.head_dim)
        for t in range(offsets[b], offsets[b + 1]):
            pos = torch.tensor([[cache_lens[b] + t - offsets[b]]])
            seen = m.allowed(pos, torch.arange(n)[None], torch.tensor([[t]]))[0]
            k = ks[seen].repeat_interleave(g, dim=1)
            v = vs[seen].repeat_interleave(g, dim=1)
            out[t], lse[t] = rule(q[t].double().cpu(), k, v, 1 / math.sqrt(d), sinks)
    return out, lse


def paged_mha(size: Size, cache_lens, q_lens, gen, quant=None):
    """A paged MHA cache (layer LAYER of 2) holding cache_len + q_len random tokens a request;
    returns (params, inputs, k_op, v_op)."""
    params = KVCacheParams(
        BF16, num_layers=2, n_kv_heads=size.h_kv, head_dim=size.d, page_size=size.page,
        quantization=quant, devices=(DEV,),
    )  # fmt: skip
    pc = make_paged_cache(params, cache_lens, q_lens, generator=gen, device=DEV)
    if params.quant_format == "per_tensor":
        pc.inputs.kv_scales[:, LAYER] = 0.05
    seq = pc.seq_lens
    x = [torch.randn(sum(seq), size.h_kv, size.d, generator=gen) * s for s in (2.0, 1.0)]
    zero = dataclasses.replace(
        pc.inputs, cache_lengths=torch.zeros(len(seq), dtype=torch.int32, device=DEV)
    )
    k_new, v_new = (t.to(BF16).to(DEV) for t in x)
    store_kv(k_new, v_new, zero, params, LAYER, ragged_offsets(seq, DEV), backend="reference")
    ops = (PagedOperand(pc.inputs, params, LAYER, kv) for kv in ("k", "v"))
    return (params, pc.inputs, *ops)


def poke_paged(inputs, params, kv: int, b: int, tok: int, head: int, dim: int, val) -> None:
    """Element (tok, head, dim) of request b's K (kv 0) or V (kv 1): the value (a bf16 cache)
    or, in an FP8 cache, the e4m3 NaN byte."""
    lut, ps = inputs.lookup_table, params.page_size
    page, slot = int(lut[b, tok // ps]), tok % ps
    blocks = inputs.kv_blocks
    if params.quant_format is None:
        blocks[page, kv, LAYER, slot, head, dim] = val
    else:
        assert math.isnan(val), "an e4m3 cache holds no infinity"
        blocks.view(torch.uint8)[page, kv, LAYER, slot, head, dim] = E4M3_NAN


def mha_decode_case(size: Size, val: float, gen, quant=None, sinks=None) -> MHACase:
    """Six decode requests under a sliding window of 40 (positions x grow):
    r1: q = val (one element, the first head of KV head 1); K NaN at key 2 of KV head 0,
        outside the window (unattended);
    r2: K = val at key 10, KV head 0 (attended; the first split-K partition of three);
    r3: V = val at key 30, KV head 1, column 4; K NaN at key 3 (outside the window);
    (an FP8 cache holds the e4m3 NaN byte where K or V would hold val)
    r0, r4 (no cached tokens), r5: clean."""
    gr = size.grow
    cache_lens = [45 * gr, 50 * gr, 38 * gr, 47 * gr, 0, 20 * gr]
    q_lens = [1] * 6
    params, inputs, k, v = paged_mha(size, cache_lens, q_lens, gen, quant)
    h_q, g = size.h_kv * size.group, size.group
    q = torch.randn(6, h_q, size.d, generator=gen)
    q[1, g, 5] = val
    q = q.to(BF16).to(DEV)
    kv_val = val if quant is None else NAN  # e4m3 holds no infinity
    poke_paged(inputs, params, 0, 1, 2 * gr, 0, 0, NAN)
    poke_paged(inputs, params, 0, 2, 10 * gr, 0, 3, kv_val)
    poke_paged(inputs, params, 1, 3, 30 * gr, 1, 4, kv_val)
    poke_paged(inputs, params, 0, 3, 3 * gr, 1, 0, NAN)
    mask = masks.sliding_window_causal(40 * gr)
    offsets = [0, 1, 2, 3, 4, 5, 6]
    exp_out, exp_lse = mha_expect(q, k, v, cache_lens, offsets, mask, sinks)
    named = None
    if math.isnan(val) and sinks is None:
        named = torch.zeros(6, h_q, dtype=torch.bool)
        named[1, g] = True  # q
        named[2, :g] = True  # K, KV head 0
        named[3, g:] = True  # V column 4, KV head 1
    return MHACase(q, k, v, offsets, mask, exp_out, exp_lse, named)


def mha_prefill_case(size: Size, val: float, gen, paged: bool) -> MHACase:
    """Three requests of 5, 3, 4 new tokens (x grow), causal; ragged K/V (NaN gaps between
    requests) or paged over cached prefixes of 4, 7, 0 tokens (x grow):
    r0: q = val at its query 2, head 1;
    r1: K = val at key 0, KV head 1 (every query attends it); K NaN at its last key, KV head 0
        (only its last query attends it);
    r2: V = val at key 0, KV head 0, column 5 (every query attends it)."""
    gr = size.grow
    q_lens = [5 * gr, 3 * gr, 4 * gr]
    cache_lens = [4 * gr, 7 * gr, 0] if paged else [0, 0, 0]
    h_q, g = size.h_kv * size.group, size.group
    if paged:
        params, inputs, k, v = paged_mha(size, cache_lens, q_lens, gen)

        def poke(kv, b, tok, head, dim, x):
            poke_paged(inputs, params, kv, b, tok, head, dim, x)

    else:
        starts, pos = [], 0
        for n in q_lens:
            starts.append(pos)
            pos += n + 3  # 3 NaN rows after each request
        x = {kv: torch.full((pos, size.h_kv, size.d), NAN) for kv in "kv"}
        for b, n in enumerate(q_lens):
            for kv, s in (("k", 2.0), ("v", 1.0)):
                x[kv][starts[b] : starts[b] + n] = (
                    torch.randn(n, size.h_kv, size.d, generator=gen) * s
                )
        bufs = {kv: t.to(BF16).to(DEV) for kv, t in x.items()}

        def poke(kv, b, tok, head, dim, x):
            bufs["kv"[kv]][starts[b] + tok, head, dim] = x

        row_offsets = torch.tensor(starts + [pos], dtype=torch.int32, device=DEV)
        k, v = RaggedOperand(bufs["k"], row_offsets), RaggedOperand(bufs["v"], row_offsets)
    offsets = ragged_offsets(q_lens).tolist()
    q = torch.randn(offsets[-1], h_q, size.d, generator=gen)
    q[2, 1, 3] = val
    q = q.to(BF16).to(DEV)
    poke(0, 1, 0, 1, 2, val)
    poke(0, 1, cache_lens[1] + q_lens[1] - 1, 0, 0, NAN)
    poke(1, 2, 0, 0, 5, val)
    mask = masks.causal()
    exp_out, exp_lse = mha_expect(q, k, v, cache_lens, offsets, mask)
    named = None
    if math.isnan(val):
        named = torch.zeros(offsets[-1], h_q, dtype=torch.bool)
        named[2, 1] = True
        named[offsets[1] : offsets[2], g:] = True
        named[offsets[2] - 1, :g] = True
        named[offsets[2] : offsets[3], :g] = True  # column 5 of V
    return MHACase(q, k, v, offsets, mask, exp_out, exp_lse, named)


def mha_sinks_case(size: Size, gen, prefill: bool) -> tuple[MHACase, torch.Tensor]:
    """Sinks [0.5, NaN, +inf, -inf] (repeated over the heads) under a tensor mask whose row 0
    is all False (that row attends nothing: 0 and -inf whatever the sink); K NaN at a key the
    mask hides from every query of its request."""
    gr = size.grow
    cache_lens = [30 * gr, 9 * gr, 44 * gr]
    q_lens = [1, 1, 1] if not prefill else [1, 3 * gr, 2]
    params, inputs, k, v = paged_mha(size, cache_lens, q_lens, gen)
    offsets = ragged_offsets(q_lens).tolist()
    h_q = size.h_kv * size.group
    q = (torch.randn(offsets[-1], h_q, size.d, generator=gen)).to(BF16).to(DEV)
    keys = max(c + n for c, n in zip(cache_lens, q_lens))
    t = torch.rand(offsets[-1], keys, generator=gen) > 0.3
    t[0] = False
    hidden = 5 * gr
    t[offsets[2] : offsets[3], hidden] = False
    poke_paged(inputs, params, 0, 2, hidden, 0, 1, NAN)
    mask = masks.tensor_mask(t.to(DEV))
    sinks = torch.tensor([0.5, NAN, INF, -INF]).repeat(h_q // 4 + 1)[:h_q]
    exp_out, exp_lse = mha_expect(q, k, v, cache_lens, offsets, mask, sinks)
    named = torch.zeros(offsets[-1], h_q, dtype=torch.bool)
    named[1:, 1::4] = True  # the NaN sink's heads, except row 0 (no key)
    assert torch.equal(nan_rows(exp_out), named)
    assert not torch.isnan(exp_lse).any()
    return MHACase(q, k, v, offsets, mask, exp_out, exp_lse, named), sinks.to(DEV)


def run_mha(case: MHACase, backend, **kw):
    out = poison_(torch.empty(case.q.shape[0], case.q.shape[1], case.v.head_dim,
                              dtype=BF16, device=DEV))  # fmt: skip
    offs = torch.tensor(case.offsets, dtype=torch.int32, device=DEV)
    res, lse = mha(case.q, case.k, case.v, offs, mask=case.mask, return_lse=True, out=out,
                   backend=backend, **kw)  # fmt: skip
    assert res is out
    return res, lse


def check_mha(case: MHACase, backend, name, v_inf=False, tols=(TOL, LSE_TOL), **kw):
    if case.named is not None:
        assert torch.equal(nan_rows(case.exp_out), case.named), "the oracle strays from the rule"
    out, lse = run_mha(case, backend, **kw)
    check(out, lse, case.exp_out, case.exp_lse, name, v_inf, *tols)


@pytest.mark.parametrize("parts", [1, 3])
@pytest.mark.parametrize("val", list(VALUES))
@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_mha_decode(backend, val, parts, gen):
    """Paged GQA decode: q, attended K and V hold NaN / +inf / -inf; K outside the window and
    unowned slots hold NaN. parts=3: the poisoned key lies in the first of the partitions."""
    case = mha_decode_case(CPU, VALUES[val], gen)
    check_mha(case, backend, f"{backend} decode {val}", v_inf=val != "nan", num_partitions=parts)


@pytest.mark.parametrize("parts", [1, 3])
@pytest.mark.parametrize("val", ["nan", "inf"])
@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_mha_decode_fp8(backend, val, parts, gen):
    """The same over an FP8 per-token cache whose K and V hold the e4m3 NaN byte (fp16 MMAs:
    q is scaled into fp16 range by its largest finite element, so an inf in one head's q
    leaves the other heads of its KV group alone)."""
    case = mha_decode_case(CPU, VALUES[val], gen, quant=KVQuantConfig.per_token())
    check_mha(case, backend, f"{backend} decode fp8 {val}", num_partitions=parts)


@pytest.mark.parametrize(
    "paged,val", [(False, "nan"), (False, "inf"), (False, "-inf"), (True, "nan")]
)
@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_mha_prefill(backend, paged, val, gen):
    """Ragged prefill (K/V passed directly) and paged chunked prefill, causal: a K NaN at a
    request's last key reaches its last query only."""
    case = mha_prefill_case(CPU, VALUES[val], gen, paged)
    check_mha(case, backend, f"{backend} prefill {val}", v_inf=val != "nan")


@pytest.mark.parametrize("prefill,parts", [(False, 1), (False, 3), (True, 1)])
@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_mha_sinks(backend, prefill, parts, gen):
    case, sinks = mha_sinks_case(CPU, gen, prefill)
    check_mha(case, backend, f"{backend} sinks", sinks=sinks, num_partitions=parts)


# --------------------------------------------------------------------------------------------
# MLA decode
# --------------------------------------------------------------------------------------------
MLA_FORMATS = {"bf16": None, "rope_aware": KVQuantConfig.mla_rope_aware()}


@dataclasses.dataclass
class MLACase:
    q: torch.Tensor
    kv: PagedOperand
    q_lens: list[int]
    kw: dict
    exp_out: torch.Tensor
    exp_lse: torch.Tensor
    named: torch.Tensor | None


def mla_cache(fmt: str, size: Size, cache_lens, q_lens, gen):
    """An MLA cache (d_qk 576, layer LAYER of 2) holding cache_len + q_len random tokens a
    request, written by store_kv in the format; NaN everywhere else."""
    params = KVCacheParams(
        BF16, 2, 1, 576, size.page, is_mla=True, num_q_heads=size.h_q,
        quantization=MLA_FORMATS[fmt], mla_rope_dim=64, devices=(DEV,),
    )  # fmt: skip
    pc = make_paged_cache(params, cache_lens, q_lens, generator=gen, device=DEV)
    seq = pc.seq_lens
    x = (torch.randn(sum(seq), 1, 576, generator=gen).clamp(-5, 5)).to(BF16).to(DEV)
    zero = dataclasses.replace(
        pc.inputs, cache_lengths=torch.zeros(len(seq), dtype=torch.int32, device=DEV)
    )
    store_kv(x, None, zero, params, LAYER, ragged_offsets(seq, DEV), backend="reference")
    return params, pc.inputs


def poke_mla(params, inputs, slot: int, dim: int, val) -> None:
    """Element `dim` of the token in encoded slot `slot` (page * page_size + offset): the value,
    or in the latent of an FP8 cache the e4m3 NaN byte (the rope stays bf16)."""
    page, off = divmod(slot, params.page_size)
    row = inputs.kv_blocks[page, 0, LAYER, off, 0]
    if params.quant_format is None:
        row[dim] = val
    elif dim < 512:
        assert math.isnan(val), "an e4m3 latent holds no infinity"
        row.view(torch.uint8)[dim] = E4M3_NAN
    else:
        row[512:].view(BF16)[dim - 512] = val


def mla_expect(q, pool, keys_of, sink=None):
    """keys_of(t) -> list of encoded slots query token t attends."""
    tokens, h_q, d = q.shape
    out = torch.zeros(tokens, h_q, 512, dtype=F64)
    lse = torch.full((tokens, h_q), -INF, dtype=F64)
    ps = pool.shape[1]
    for t in range(tokens):
        slots = keys_of(t)
        keys = torch.stack([pool[s // ps, s % ps] for s in slots]) if slots else pool[0, :0]
        k = keys[:, None, :].expand(-1, h_q, -1)
        out[t], lse[t] = rule(q[t].double().cpu(), k, k[..., :512], 1 / math.sqrt(d), sink)
    return out, lse


def mla_dense_case(fmt: str, size: Size, val: float, gen) -> MLACase:
    """Four requests, causal, query tokens 1, 2, 1, 1 (x grow cached tokens 20, 40, 9, 33;
    FP8: 70, 90, 9, 75, so that 64-key tiles split too):
    t1 (r1's first query): q = val at head 1;
    r1: K NaN in the rope of its last key, which only its second query (t2) attends (a rope
        dim: V, the latent, stays finite, so t1 must not see it);
    r2: key 4 holds val (NaN: in the latent, also V; +-inf: in the rope, a +-inf score)."""
    gr = size.grow
    base = [20, 40, 9, 33] if fmt == "bf16" else [70, 90, 9, 75]
    cache_lens, q_lens = [c * gr for c in base], [1, 2, 1, 1]
    params, inputs = mla_cache(fmt, size, cache_lens, q_lens, gen)
    lut, ps = inputs.lookup_table.tolist(), size.page

    def enc(b, j):
        return lut[b][j // ps] * ps + j % ps

    h_q = size.h_q
    q = torch.randn(5, h_q, 576, generator=gen) * 2
    q[1, 1, 3] = val
    q = q.to(BF16).to(DEV)
    poke_mla(params, inputs, enc(1, cache_lens[1] + 1), 540, NAN)
    poke_mla(params, inputs, enc(2, 4), 10 if math.isnan(val) else 530, val)
    pool = decode_pool(params, inputs)
    offs = ragged_offsets(q_lens).tolist()

    def keys_of(t):
        b = max(i for i in range(4) if offs[i] <= t)
        return [enc(b, j) for j in range(cache_lens[b] + t - offs[b] + 1)]

    exp_out, exp_lse = mla_expect(q, pool, keys_of)
    named = None
    if math.isnan(val):
        named = torch.zeros(5, h_q, dtype=torch.bool)
        named[1, 1] = True
        named[2] = True
        named[3] = True
    kv = PagedOperand(inputs, params, LAYER, "k")
    return MLACase(q, kv, q_lens, dict(causal=True), exp_out, exp_lse, named)


def mla_sparse_case(size: Size, val: float, gen) -> MLACase:
    """Three tokens (one a request) with `stride` sparse indices and topk_lengths 5, 6, 4
    (x stride / 8): valid entries of the request's keys mixed with invalid ones of every kind;
    past topk_length, valid encodings of NaN slots and of r1's poisoned key.
    t0: q = val at head 0; t1: its entry 1 points to a key holding val (as in the dense case)."""
    gr, w = size.grow, size.stride
    cache_lens, q_lens = [12 * gr, 20 * gr, 8 * gr], [1, 1, 1]
    params, inputs = mla_cache("bf16", size, cache_lens, q_lens, gen)
    lut, ps = inputs.lookup_table.tolist(), size.page
    slots = inputs.kv_blocks.shape[0] * ps
    owned = {lut[b][j // ps] * ps + j % ps for b, n in enumerate(cache_lens) for j in range(n + 1)}
    nan_slots = [s for s in range(slots) if s not in owned]
    bad = [-1, -(2**31), slots, 2**31 - 1, slots + 7, -5]  # invalid of every kind
    topk = [5 * w // 8, 6 * w // 8, 4 * w // 8]
    rows, attended = [], []
    for b in range(3):
        n = cache_lens[b] + 1
        row, ok = [], []
        for j in range(w):
            if j >= topk[b]:
                row.append(nan_slots[j % len(nan_slots)])
            elif j % 3 == 2:
                row.append(bad[j % len(bad)])
            else:
                key = j * 7 % n
                row.append(lut[b][key // ps] * ps + key % ps)
                ok.append(row[-1])
        rows.append(row)
        attended.append(ok)
    poisoned = rows[1][1]
    rows[2][-1] = poisoned  # past r2's topk_length: never read
    h_q = size.h_q
    q = torch.randn(3, h_q, 576, generator=gen) * 2
    q[0, 0, 7] = val
    q = q.to(BF16).to(DEV)
    poke_mla(params, inputs, poisoned, 10 if math.isnan(val) else 530, val)
    pool = decode_pool(params, inputs)
    exp_out, exp_lse = mla_expect(q, pool, lambda t: attended[t])
    named = None
    if math.isnan(val):
        named = torch.zeros(3, h_q, dtype=torch.bool)
        named[0, 0] = True
        named[1] = True
    kw = dict(
        indices=torch.tensor(rows, dtype=torch.int32, device=DEV),
        topk_lengths=torch.tensor(topk, dtype=torch.int32, device=DEV),
    )
    kv = PagedOperand(inputs, params, LAYER, "k")
    return MLACase(q, kv, q_lens, kw, exp_out, exp_lse, named)


def check_mla(case: MLACase, backend, name, **kw):
    if case.named is not None:
        assert torch.equal(nan_rows(case.exp_out), case.named), "the oracle strays from the rule"
    out = poison_(torch.empty(case.q.shape[0], case.q.shape[1], 512, dtype=BF16, device=DEV))
    res, lse = mla_decode(case.q, case.kv, ragged_offsets(case.q_lens, DEV), out=out,
                          backend=backend, **case.kw, **kw)  # fmt: skip
    assert res is out
    check(res, lse, case.exp_out, case.exp_lse, name)


@pytest.mark.parametrize("parts", [1, 3, None, "runs"])
@pytest.mark.parametrize("val", list(VALUES))
@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_mla_dense_bf16(backend, val, parts, gen, monkeypatch):
    """parts None: the balanced paths (one wave of items here); "runs": forced onto the
    contiguous runs, which cut r1 (the NaN key's request) between two pieces."""
    if parts == "runs":
        monkeypatch.setenv("PAGEDATTN_MLA_TUNING", json.dumps({"wl_one_wave": False}))
        parts = None
    case = mla_dense_case("bf16", CPU, VALUES[val], gen)
    check_mla(case, backend, f"{backend} mla bf16 {val}", num_partitions=parts)


@pytest.mark.parametrize("parts", [1, 2])
@pytest.mark.parametrize("val", ["nan", "inf"])
@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_mla_dense_fp8(backend, val, parts, gen):
    """Rope-aware FP8: the e4m3 NaN byte in a latent, +inf in a bf16 rope."""
    case = mla_dense_case("rope_aware", CPU, VALUES[val], gen)
    check_mla(case, backend, f"{backend} mla fp8 {val}", num_partitions=parts)


@pytest.mark.parametrize("val", ["nan", "-inf"])
@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_mla_sparse(backend, val, gen):
    case = mla_sparse_case(CPU, VALUES[val], gen)
    check_mla(case, backend, f"{backend} mla sparse {val}", num_partitions=2)


# --------------------------------------------------------------------------------------------
# mla_decode_branch_fp8
# --------------------------------------------------------------------------------------------
def branch_case(size: Size, val: float, gen, nope: int):
    """Four requests of one new token over 5, 9, 3, 6 (x grow) cached tokens, a bf16 cache:
    q = val in q_nope of (token 0, head 1); val in the latent of r1's new token (RMSNorm
    spreads it over the row); NaN in the latent of r2's cached key 1; r3 clean. The rows
    named NaN: (0, 1), every head of tokens 1 and 2."""
    gr, h_q = size.grow, size.h_q
    cache_lens, q_lens = [5 * gr, 9 * gr, 3 * gr, 6 * gr], [1, 1, 1, 1]
    params, inputs = mla_cache("bf16", size, cache_lens, q_lens, gen)
    lut, ps = inputs.lookup_table.tolist(), size.page
    poke_mla(params, inputs, lut[2][0] * ps + 1, 20, NAN)
    rank, v_head = 512, 64
    q = torch.randn(4, h_q, nope + 64, generator=gen)
    q[0, 1, 4] = val
    new_kv = torch.randn(4, 1, 576, generator=gen) * 1.5
    new_kv[1, 0, 7] = val
    w_uk, w_uk_s = quantize_weight_blocks(
        torch.randn(h_q, rank, nope, generator=gen) / math.sqrt(nope), 128, 128
    )
    w_uv, w_uv_s = quantize_weight_blocks(
        torch.randn(h_q, v_head, 512, generator=gen) / math.sqrt(512), 128, 128
    )
    gamma = 1 + 0.2 * torch.randn(rank, generator=gen)
    args = (
        q.to(BF16).to(DEV),
        ragged_offsets(q_lens, DEV),
        make_freqs_cis(64, 4096, device=DEV),
        gamma.to(BF16).to(DEV),
        inputs,
        params,
        LAYER,
    )
    kw = dict(
        scale=1 / math.sqrt(nope + 64), epsilon=1e-6, w_uk=w_uk.to(DEV), w_uk_scale=w_uk_s.to(DEV),
        w_uv=w_uv.to(DEV), w_uv_scale=w_uv_s.to(DEV), new_kv=new_kv.to(BF16).to(DEV),
    )  # fmt: skip
    named = torch.zeros(4, h_q, dtype=torch.bool)
    named[0, 1] = True
    named[1:3] = True
    return args, kw, named


def run_branch(args, kw, backend, **extra):
    q, inputs = args[0], args[4]
    twin = dataclasses.replace(inputs, kv_blocks=inputs.kv_blocks.clone())
    out = poison_(torch.empty(q.shape[0], q.shape[1], kw["w_uv"].shape[1], dtype=BF16, device=DEV))
    res = mla_decode_branch_fp8(*args[:4], twin, *args[5:], **kw, **extra, out=out,
                                backend=backend)  # fmt: skip
    assert res is out
    return res.double().cpu()


def check_branch(outs: dict, named: torch.Tensor) -> None:
    """Each backend's NaN rows are exactly the named ones (whole rows: the second FP8 bmm
    quantizes a row's activations with a shared scale); finite rows agree."""
    for name, o in outs.items():
        assert torch.equal(torch.isnan(o), named[..., None].expand_as(o)), f"{name}: NaN rows"
        assert not torch.isinf(o).any(), f"{name}: inf in the output"
    vals = list(outs.values())
    for o in vals[1:]:
        fin = ~named
        assert cos_diff(o[fin], vals[0][fin]) <= 1e-3


@pytest.mark.parametrize("parts", [1, 2])
@pytest.mark.parametrize("val", ["nan", "inf"])
def test_mla_branch(val, parts, gen):
    args, kw, named = branch_case(Size(grow=1, page=4, h_q=2), VALUES[val], gen, nope=32)
    outs = {b: run_branch(args, kw, b, num_partitions=parts) for b in CPU_BACKENDS}
    check_branch(outs, named)


# --------------------------------------------------------------------------------------------
# GPU: the same cases at serving sizes with the default backend (the fast kernels)
# --------------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("parts", [None, 3])
@pytest.mark.parametrize("val", list(VALUES))
def test_gpu_mha_decode(val, parts, gen):
    case = mha_decode_case(GPU_MHA, VALUES[val], gen)
    check_mha(case, None, f"gpu decode {val}", v_inf=val != "nan", num_partitions=parts)


@pytest.mark.gpu
@pytest.mark.parametrize("quant", ["per_token", "per_tensor", "blockwise"])
@pytest.mark.parametrize("parts", [None, 3])
@pytest.mark.parametrize("val", ["nan", "inf"])
def test_gpu_mha_decode_fp8(val, quant, parts, gen):
    """FP8 decode (per-token / per-tensor: the fast loop; blockwise G=64: the generic loop)
    with e4m3 NaN bytes in K and V, q = val."""
    cfg = {"per_token": KVQuantConfig.per_token(), "per_tensor": KVQuantConfig.per_tensor(),
           "blockwise": KVQuantConfig.blockwise(64)}[quant]  # fmt: skip
    tols = (TOL_DEQ, LSE_TOL_DEQ) if quant == "blockwise" else (TOL, LSE_TOL)
    case = mha_decode_case(GPU_MHA, VALUES[val], gen, quant=cfg)
    check_mha(case, None, f"gpu decode fp8 {quant} {val}", tols=tols, num_partitions=parts)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "paged,val", [(False, "nan"), (False, "inf"), (False, "-inf"), (True, "nan"), (True, "inf")]
)
def test_gpu_mha_prefill(paged, val, gen):
    case = mha_prefill_case(GPU_MHA, VALUES[val], gen, paged)
    check_mha(case, None, f"gpu prefill {val}", v_inf=val != "nan")


@pytest.mark.gpu
@pytest.mark.parametrize("prefill,parts", [(False, None), (False, 3), (True, None)])
def test_gpu_mha_sinks(prefill, parts, gen):
    case, sinks = mha_sinks_case(GPU_MHA, gen, prefill)
    check_mha(case, None, "gpu sinks", sinks=sinks, num_partitions=parts)


@pytest.mark.gpu
@pytest.mark.parametrize("parts", [None, 3])
@pytest.mark.parametrize("val", list(VALUES))
@pytest.mark.parametrize("fmt,h_q", [("bf16", 16), ("bf16", 128), ("rope_aware", 16),
                                     ("rope_aware", 64)])  # fmt: skip
def test_gpu_mla_dense(fmt, h_q, val, parts, gen):
    if fmt == "rope_aware" and val == "-inf":
        pytest.skip("the e4m3 latent holds no infinity; +inf covers the rope")
    case = mla_dense_case(fmt, mla_size(h_q), VALUES[val], gen)
    check_mla(case, None, f"gpu mla {fmt} {val}", num_partitions=parts)


@pytest.mark.gpu
@pytest.mark.parametrize("parts", [None, 1, 2])
@pytest.mark.parametrize("val", ["nan", "-inf", "inf"])
@pytest.mark.parametrize("h_q", [16, 128])
def test_gpu_mla_sparse(h_q, val, parts, gen):
    case = mla_sparse_case(mla_size(h_q), VALUES[val], gen)
    check_mla(case, None, f"gpu mla sparse {val}", num_partitions=parts)


@pytest.mark.gpu
@pytest.mark.parametrize("parts", [None, 2])
@pytest.mark.parametrize("val", ["nan", "inf"])
@pytest.mark.parametrize("h_q", [16, 128])
def test_gpu_mla_branch(h_q, val, parts, gen):
    args, kw, named = branch_case(mla_size(h_q), VALUES[val], gen, nope=128)
    out = run_branch(args, kw, None, num_partitions=parts)
    ref = run_branch(args, kw, "reference", num_partitions=parts)
    check_branch({"gpu": out, "reference": ref}, named)
