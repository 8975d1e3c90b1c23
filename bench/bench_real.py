"""Real workloads (issue 56): skewed decode batches, one long request among many short ones,
mixed steps (decodes + prefill chunks), sparse MLA with skewed top-k lengths, and the eager
host cost of one call; pagedattn against FlashInfer on the same bytes (same pages, page tables
and lengths), each case against its roofline.

- Lengths come from a seeded numpy generator (`--seed`, recorded with each case): lognormal
  (median per case, sigma `SIGMA`, clipped to `CLIP`), or one long request at a random slot
  among short ones. The same (distribution, batch, seed) gives the same lengths, so the MLA
  h_q 16 and h_q 128 cases read the same lengths. The uniform cases are controls.
- Caches: `pagedattn.testing.make_paged_cache` (random page permutation, sentinel ids in the
  unused lookup-table columns), every slot then filled with random bf16. FlashInfer's page lists
  (indptr / indices / last-page lengths) are cut from the same lookup table.
- Bytes: what attention must read, sum over requests of valid tokens x kv heads x (d_k + d_v)
  (MLA: the 576-wide latent row once) x 2 B, + q + out. FLOPs: 2 x sum over queries of the
  keys they see (causal counted exactly) x h_q x (d_qk + d_v). Roofline time: max(bytes / copy
  bandwidth, FLOPs / bf16 matmul), both measured in the same process (`common`).
- Each case is checked once before it is timed: the outputs (poisoned with NaN first) against a
  float32 torch reference that reads the cache through FlashInfer's page lists (so it also
  checks the peer's arguments), and FlashInfer's against both; cosine >= `MIN_COS`, else the
  case records an error and that implementation is not timed.
- Host cost: wall time per call of a loop of N eager calls and one synchronize (b1 and b8),
  for `mha` beside FlashInfer's decode run() (planned once) and torch SDPA on the same shapes,
  and for `mla_decode` beside FlashInfer's MLA run().

Usage:
  python bench/run_all.py --suite real      # GPU: ceilings + this suite, JSON + PNG + tables
  python bench/bench_real.py [--seed 0] [--out PATH.json]   # the same, alone
  python bench/bench_real.py --dry-run      # CPU: every case at tiny sizes, reference backend,
                                            # no timing claims and no FlashInfer
Targets (bench/targets.py, `real_target_rows`) read each record's extra["group"].
"""

from __future__ import annotations

import math
import os
import sys
import time
from dataclasses import dataclass, replace

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import (
    Record,
    flashinfer,
    roofline_ms,
    save_and_report,
    selected,
    suite_main,
    time_ms,
)

from pagedattn import KVCacheParams, PagedOperand, StepPlan, mha, mla_decode
from pagedattn.testing import make_paged_cache, poison_, ragged_offsets

SUITE = "real"
SIGMA = 1.0  # lognormal sigma of the context lengths
CLIP = (32, 32768)  # lognormal lengths are clipped to this range
MIN_COS = 0.999  # cosine similarity an output must reach against the reference / peer
H_KV, D = 8, 128  # GQA 32/8 d128
D_QK, D_V = 576, 512  # MLA (DeepSeek V2/V3 latent)
HOST_CALLS = 200  # eager calls per host-cost loop
WS_BYTES = 256 * 2**20  # FlashInfer workspace


@dataclass(frozen=True)
class Case:
    """One workload. lengths: ("lognormal", median) | ("onelong", long, short) |
    ("uniform", n): the context lengths (keys each decode sees, its new token included) of the
    `b` requests (mixed: of the decodes; sparse: of the requests whose top-k is taken)."""

    name: str
    kind: str  # gqa | mla | mixed | sparse | host-mha | host-mla
    group: str  # what targets.py judges it by
    b: int
    lengths: tuple
    h_q: int = 32
    page: int = 16
    chunks: int = 0  # mixed: prefill chunks after the decodes
    chunk: int = 0  # mixed: new tokens of each chunk
    chunk_cached: int = 0  # mixed: tokens cached before each chunk
    topk: int = 0  # sparse: index row stride (top-k)


def _cases() -> list[Case]:
    skew_g, skew_m = ("lognormal", 1536), ("lognormal", 3072)
    cases = [Case(f"gqa skew b{b} p16", "gqa", "skew-gqa", b, skew_g) for b in (32, 64, 128, 256)]
    cases += [
        Case("gqa onelong 32k+63x200 p16", "gqa", "onelong-gqa", 64, ("onelong", 32768, 200)),
        Case("gqa onelong 32k+255x200 p16", "gqa", "onelong-gqa", 256, ("onelong", 32768, 200)),
        Case("gqa uniform b64 ctx4096 p16 (control)", "gqa", "control", 64, ("uniform", 4096)),
    ]
    cases += [
        Case(f"mla hq16 skew b{b} p64", "mla", "skew-mla-h16", b, skew_m, 16, 64)
        for b in (64, 128, 256)
    ]
    cases += [
        Case("mla hq128 skew b64 p64", "mla", "skew-mla-h128", 64, skew_m, 128, 64),
        Case("mla hq128 skew b128 p64", "mla", "skew-mla-h128", 128, skew_m, 128, 64),
        Case("mla hq16 onelong 32k+63x300 p64", "mla", "onelong-mla", 64,
             ("onelong", 32768, 300), 16, 64),
        Case("mla hq128 onelong 32k+63x300 p64", "mla", "onelong-mla-h128", 64,
             ("onelong", 32768, 300), 128, 64),
        Case("mla hq16 uniform b128 sk4096 p64 (control)", "mla", "control", 128,
             ("uniform", 4096), 16, 64),
        Case("mla hq128 uniform b128 sk4096 p64 (control)", "mla", "control", 128,
             ("uniform", 4096), 128, 64),
        Case("mixed 56 dec + 8x512 over 1k p16", "mixed", "mixed", 56, skew_g,
             chunks=8, chunk=512, chunk_cached=1024),
        Case("mixed 248 dec + 8x512 over 1k p16", "mixed", "mixed", 248, skew_g,
             chunks=8, chunk=512, chunk_cached=1024),
        Case("mixed 120 dec + 4x2048 over 4k p16", "mixed", "mixed", 120, skew_g,
             chunks=4, chunk=2048, chunk_cached=4096),
        Case("sparse mla hq128 b128 topk<=2048 p64", "sparse", "sparse", 128, skew_g,
             128, 64, topk=2048),
        Case("sparse mla hq16 b128 topk<=2048 p64", "sparse", "sparse", 128, skew_g,
             16, 64, topk=2048),
    ]  # fmt: skip
    for b in (1, 8):
        cases.append(Case(f"host mha b{b} ctx1024 p16", "host-mha", "host", b, ("uniform", 1024)))
    for b in (1, 8):
        cases.append(
            Case(f"host mla hq16 b{b} sk1024 p64", "host-mla", "host", b, ("uniform", 1024), 16, 64)
        )
    return cases


CASES = _cases()
DRY_CLIP = (4, 128)


def shrink(c: Case) -> Case:
    """The case at CPU dry-run size (same kind, heads and head dims; tiny batch and lengths)."""
    kind = c.lengths[0]
    lengths = {"lognormal": ("lognormal", 24), "onelong": ("onelong", 100, 6)}.get(
        kind, ("uniform", 40)
    )
    b = min(c.b, 2 if c.kind.startswith("host") else 3)
    return replace(
        c,
        b=b,
        lengths=lengths,
        chunks=min(c.chunks, 2),
        chunk=min(c.chunk, 8),
        chunk_cached=min(c.chunk_cached, 16),
        topk=min(c.topk, 32),
    )


# --- lengths -------------------------------------------------------------------------------


def draw_lengths(spec: tuple, b: int, seed: int, clip: tuple[int, int] = CLIP) -> list[int]:
    """Context lengths of b requests from a generator seeded with `seed` alone."""
    rng = np.random.default_rng(seed)
    if spec[0] == "lognormal":
        x = rng.lognormal(math.log(spec[1]), SIGMA, size=b)
        return [int(v) for v in np.clip(np.rint(x), clip[0], clip[1])]
    if spec[0] == "onelong":
        lens = [int(spec[2])] * b
        lens[int(rng.integers(b))] = int(spec[1])
        return lens
    return [int(spec[1])] * b


def summary(lens: list[int]) -> dict:
    a = np.asarray(lens, dtype=np.float64)
    return dict(
        n=len(lens),
        min=int(a.min()),
        median=float(np.median(a)),
        mean=round(float(a.mean()), 1),
        p99=float(np.percentile(a, 99)),
        max=int(a.max()),
        sum=int(a.sum()),
    )


def visible_keys(seq: list[int], new: list[int]) -> int:
    """Sum over queries of the keys each sees, causal: a request of S keys whose last n are
    its queries' own gives n*S - n(n-1)/2."""
    return sum(n * s - n * (n - 1) // 2 for s, n in zip(seq, new))


# --- caches and FlashInfer's page lists ------------------------------------------------------


def gqa_cache(cache_lens, new, page, h_q, dev, seed):
    p = KVCacheParams(torch.bfloat16, 1, H_KV, D, page, num_q_heads=h_q, devices=[dev])
    pc = make_paged_cache(
        p, cache_lens, new, generator=torch.Generator().manual_seed(seed), device=dev
    )
    pc.inputs.kv_blocks.normal_()  # every slot random and finite
    return pc


def mla_cache(cache_lens, new, page, h_q, dev, seed):
    p = KVCacheParams(torch.bfloat16, 1, 1, D_QK, page, is_mla=True, num_q_heads=h_q, devices=[dev])
    pc = make_paged_cache(
        p, cache_lens, new, generator=torch.Generator().manual_seed(seed), device=dev
    )
    pc.inputs.kv_blocks.normal_()
    return pc


def page_lists(lut: torch.Tensor, seq: list[int], page: int):
    """FlashInfer's (indptr, indices, last_page_len) for requests of `seq` keys, cut from the
    same lookup table pagedattn reads (int32, on lut's device)."""
    dev = lut.device
    n = torch.tensor([-(-s // page) for s in seq], dtype=torch.int32, device=dev)
    indptr = torch.zeros(len(seq) + 1, dtype=torch.int32, device=dev)
    indptr[1:] = torch.cumsum(n, 0)
    cols = torch.arange(lut.shape[1], device=dev)
    indices = lut[cols[None, :] < n[:, None]].contiguous()  # row-major: request after request
    last = torch.tensor([(s - 1) % page + 1 for s in seq], dtype=torch.int32, device=dev)
    return indptr, indices, last


# --- float32 torch references over FlashInfer's page lists ------------------------------------


def ref_gqa(q, qo_indptr, indptr, indices, last, pool, page, scale):
    """pool: [P, 2, page, h_kv, d] (FlashInfer's NHD layout). Causal, queries at the end."""
    qo, kp, lp = qo_indptr.tolist(), indptr.tolist(), last.tolist()
    h_q, h_kv, d = q.shape[1], pool.shape[3], q.shape[2]
    g = h_q // h_kv
    out = torch.empty(q.shape, dtype=torch.float32, device=q.device)
    for b in range(len(qo) - 1):
        pages = indices[kp[b] : kp[b + 1]].long()
        L = (len(pages) - 1) * page + lp[b]
        k = pool[pages, 0].flatten(0, 1)[:L].float()  # [L, h_kv, d]
        v = pool[pages, 1].flatten(0, 1)[:L].float()
        qb = q[qo[b] : qo[b + 1]].float()
        n = qb.shape[0]
        s = torch.einsum("nkgd,lkd->kgnl", qb.view(n, h_kv, g, d), k) * scale
        qpos = torch.arange(L - n, L, device=q.device)
        s.masked_fill_(torch.arange(L, device=q.device)[None, :] > qpos[:, None], float("-inf"))
        o = torch.einsum("kgnl,lkd->nkgd", s.softmax(-1), v)
        out[qo[b] : qo[b + 1]] = o.reshape(n, h_q, -1)
    return out


def ref_mla(q, qo_indptr, indptr, indices, kv_len, rows, page, scale):
    """rows: [P, page, 576] latent rows (V its first 512). Causal, queries at the end."""
    qo, kp, kl = qo_indptr.tolist(), indptr.tolist(), kv_len.tolist()
    out = torch.empty(*q.shape[:2], D_V, dtype=torch.float32, device=q.device)
    for b in range(len(qo) - 1):
        pages = indices[kp[b] : kp[b + 1]].long()
        L = kl[b]
        kv = rows[pages].flatten(0, 1)[:L].float()  # [L, 576]
        qb = q[qo[b] : qo[b + 1]].float()
        n = qb.shape[0]
        s = torch.einsum("nhd,ld->nhl", qb, kv) * scale
        qpos = torch.arange(L - n, L, device=q.device)
        s.masked_fill_(
            torch.arange(L, device=q.device)[None, None, :] > qpos[:, None, None], float("-inf")
        )
        out[qo[b] : qo[b + 1]] = torch.einsum("nhl,ld->nhd", s.softmax(-1), kv[:, :D_V])
    return out


def first(x):
    """A peer's output tensor (the first of a tuple, should it return one with the LSE)."""
    return x[0] if isinstance(x, (tuple, list)) else x


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    """Cosine similarity in float64 (NaN anywhere gives NaN, which fails every check)."""
    a, b = a.double().flatten(), b.double().flatten()
    return float((a * b).sum() / ((a * a).sum() * (b * b).sum()).sqrt())


# --- running one case --------------------------------------------------------------------------


class Ctx:
    """What every case needs: device, backend, ceilings, seed, FlashInfer, the records."""

    def __init__(self, records, ceilings, seed, dry, fi):
        self.records, self.ceilings, self.seed, self.dry, self.fi = (
            records, ceilings, seed, dry, fi
        )  # fmt: skip
        self.dev = "cpu" if dry else "cuda"
        self.backend = "reference" if dry else None
        self.errors: list[str] = []
        self.clip = DRY_CLIP if dry else CLIP

    def sync(self) -> None:
        if not self.dry:
            torch.cuda.synchronize()

    def time(self, fn) -> float:
        """GPU: `common.time_ms`. Dry run: the wall time of one call (no claim)."""
        if not self.dry:
            return time_ms(fn)
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3

    def wall_ms(self, fn) -> float:
        """Wall ms per call of a loop of eager calls and one synchronize (best of 3 loops)."""
        n = 1 if self.dry else HOST_CALLS
        for _ in range(1 if self.dry else 20):
            fn()
        self.sync()
        best = float("inf")
        for _ in range(1 if self.dry else 3):
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            self.sync()
            best = min(best, (time.perf_counter() - t0) / n * 1e3)
        return best

    def roofline_ms(self, nbytes: float, flops: float) -> tuple[float, str]:
        return roofline_ms(self.ceilings, nbytes, flops)

    def error(self, case: Case, msg: str) -> None:
        line = f"{case.name}: {msg}"
        print(f"[real] ERROR {line}")
        self.errors.append(line)


def peer(ctx: Ctx, case: Case, setup):
    """FlashInfer's callable from `setup(fi)` (None in the dry run, without FlashInfer, or on
    a failure, which is recorded)."""
    if ctx.dry or ctx.fi is None:
        return None
    try:
        fn = setup(ctx.fi)
        fn()
        torch.cuda.synchronize()
        return fn
    except Exception as e:  # noqa: BLE001 - a peer failure is a record, not the end of the run
        ctx.error(case, f"flashinfer failed: {type(e).__name__}: {str(e)[:300]}")
        return None


def finish(ctx: Ctx, case: Case, *, ours, out, ref, peer_fn, api, nbytes, flops, lens, extra):
    """Check, time and record one roofline case. `ours()` fills the poisoned `out`; `ref` is
    the float32 reference; `peer_fn()` returns FlashInfer's output (or None)."""
    poison_(out)
    ours()
    ctx.sync()
    got = out.float().clone()
    cos_ref = cosine(got, ref)
    roof, bound = ctx.roofline_ms(nbytes, flops)
    base = dict(extra, group=case.group, batch=case.b, seed=ctx.seed, dist=list(case.lengths),
                lengths=summary(lens), roofline_ms=round(roof, 6), bound=bound)  # fmt: skip
    if ctx.dry:
        base["dry_run"] = True
    ms_peer, peer_extra = None, {}
    try:
        if peer_fn is not None:
            res = first(peer_fn()).float()
            ctx.sync()
            cos_p, cos_pr = cosine(res, got), cosine(res, ref)
            peer_extra = dict(cos_vs_ref=round(cos_pr, 6), cos_vs_pagedattn=round(cos_p, 6))
            if cos_pr >= MIN_COS:
                ms_peer = ctx.time(peer_fn)
                e = dict(base, api=api, frac_roofline=round(roof / ms_peer, 4), **peer_extra)
                ctx.records.append(
                    Record(SUITE, case.name, "flashinfer", ms_peer, nbytes, flops, e)
                )
            else:
                ctx.error(case, f"flashinfer output off the reference (cosine {cos_pr:.6f})")
    except Exception as e:  # noqa: BLE001 - as in `peer`
        ctx.error(case, f"flashinfer failed: {type(e).__name__}: {str(e)[:300]}")
        ms_peer = None
    if not cos_ref >= MIN_COS:
        ctx.error(case, f"pagedattn output off the reference (cosine {cos_ref:.6f}): not timed")
        return
    ms = ctx.time(ours)
    e = dict(base, frac_roofline=round(roof / ms, 4), cos_vs_ref=round(cos_ref, 6))
    if ms_peer is not None:
        e.update(flashinfer_ms=round(ms_peer, 5), x_flashinfer=round(ms_peer / ms, 4),
                 cos_vs_flashinfer=peer_extra["cos_vs_pagedattn"], peer=api)  # fmt: skip
    ctx.records.append(Record(SUITE, case.name, "pagedattn", ms, nbytes, flops, e))


def run_gqa(ctx: Ctx, case: Case, lens: list[int], chunks=()) -> None:
    """GQA decode (every request one new token), or a mixed step: decodes of `lens` then
    `chunks` of (cached, new) prefill chunks, all in one `mha` call."""
    seq = list(lens) + [c + n for c, n in chunks]
    new = [1] * len(lens) + [n for _, n in chunks]
    cache_lens = [s - n for s, n in zip(seq, new)]
    pc = gqa_cache(cache_lens, new, case.page, case.h_q, ctx.dev, ctx.seed)
    inp, page, h_q = pc.inputs, case.page, case.h_q
    offs = ragged_offsets(new, ctx.dev)
    q = torch.randn(sum(new), h_q, D, device=ctx.dev, dtype=torch.bfloat16)
    out = torch.empty_like(q)
    k_op, v_op = PagedOperand(inp, pc.params, 0, "k"), PagedOperand(inp, pc.params, 0, "v")
    pool = inp.kv_blocks[:, :, 0]  # [P, 2, page, h_kv, d]: FlashInfer's NHD paged layout
    indptr, indices, last = page_lists(inp.lookup_table, seq, page)
    scale = D**-0.5
    ref = ref_gqa(q, offs, indptr, indices, last, pool, page, scale)
    nbytes = sum(seq) * H_KV * 2 * D * 2 + 2 * q.numel() * 2
    flops = 2 * visible_keys(seq, new) * h_q * 2 * D
    # a mixed step says how many decodes lead it, as a serving engine's batch does (`mha`)
    hint = len(lens) if chunks else None
    # the step's work plan from the host's lengths, made once (at the first call) as
    # FlashInfer's plan() is; a step that plans afresh on the device (lengths on the device
    # only: one more small launch, and the plan's capacity as the grid) goes into the record
    plan = StepPlan(cache_lens)
    ours = lambda: mha(q, k_op, v_op, offs, scale=scale, out=out, backend=ctx.backend,
                       num_decodes=hint, plan=plan)  # fmt: skip
    fresh = lambda: mha(q, k_op, v_op, offs, scale=scale, out=out, backend=ctx.backend,
                        num_decodes=hint, plan=StepPlan())  # fmt: skip

    def setup(fi):
        ws = torch.empty(WS_BYTES, dtype=torch.uint8, device="cuda")
        if chunks:
            w = fi.BatchPrefillWithPagedKVCacheWrapper(ws, "NHD")
            w.plan(offs, indptr, indices, last, h_q, H_KV, D, page, causal=True,
                   q_data_type=torch.bfloat16)  # fmt: skip
        else:
            w = fi.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD", use_tensor_cores=True)
            w.plan(indptr, indices, last, h_q, H_KV, D, page, q_data_type=torch.bfloat16,
                   kv_data_type=torch.bfloat16)  # fmt: skip
        return lambda: w.run(q, pool)

    api = (
        "BatchPrefillWithPagedKVCacheWrapper(causal)"
        if chunks
        else "BatchDecodeWithPagedKVCacheWrapper(use_tensor_cores)"
    )
    extra = dict(page=page, h_q=h_q, h_kv=H_KV, d=D, tokens=int(q.shape[0]))
    extra["device_planned_ms"] = round(float(ctx.time(fresh)), 4)
    if chunks:
        extra.update(decodes=len(lens), chunks=[list(c) for c in chunks], num_decodes=hint)
    finish(ctx, case, ours=ours, out=out, ref=ref, peer_fn=peer(ctx, case, setup), api=api,
           nbytes=nbytes, flops=flops, lens=lens, extra=extra)  # fmt: skip


def mla_peer_setup(q, qo, indptr, indices, kv_len, rows, page, h_q, scale):
    """FlashInfer's MLA (fa3) over copies of the latent rows split into ckv / kpe, as
    bench_mla does; `rows` [P, page, 576]."""

    def setup(fi):
        ws = torch.empty(WS_BYTES, dtype=torch.uint8, device="cuda")
        w = fi.mla.BatchMLAPagedAttentionWrapper(ws, backend="fa3")
        w.plan(qo, indptr, indices, kv_len, h_q, D_V, D_QK - D_V, page, False, scale,
               torch.bfloat16, torch.bfloat16)  # fmt: skip
        ckv, kpe = rows[..., :D_V].contiguous(), rows[..., D_V:].contiguous()
        qn, qp = q[..., :D_V].contiguous(), q[..., D_V:].contiguous()
        return lambda: w.run(qn, qp, ckv, kpe)

    return setup


def run_mla(ctx: Ctx, case: Case, lens: list[int]) -> None:
    """Dense MLA decode, one new token a request (causal False for FlashInfer: one query sees
    every key)."""
    b, page, h_q = len(lens), case.page, case.h_q
    pc = mla_cache([s - 1 for s in lens], [1] * b, page, h_q, ctx.dev, ctx.seed)
    op = PagedOperand(pc.inputs, pc.params, 0, "k")
    offs = ragged_offsets([1] * b, ctx.dev)
    q = torch.randn(b, h_q, D_QK, device=ctx.dev, dtype=torch.bfloat16)
    out = torch.empty(b, h_q, D_V, device=ctx.dev, dtype=torch.bfloat16)
    rows = pc.inputs.kv_blocks[:, 0, 0, :, 0]  # [P, page, 576]
    indptr, indices, _ = page_lists(pc.inputs.lookup_table, lens, page)
    kv_len = torch.tensor(lens, dtype=torch.int32, device=ctx.dev)
    scale = D_QK**-0.5
    ref = ref_mla(q, offs, indptr, indices, kv_len, rows, page, scale)
    nbytes = sum(lens) * D_QK * 2 + q.numel() * 2 + out.numel() * 2
    flops = 2 * sum(lens) * h_q * (D_QK + D_V)
    ours = lambda: mla_decode(q, op, offs, scale=scale, out=out, backend=ctx.backend)
    setup = mla_peer_setup(q, offs, indptr, indices, kv_len, rows, page, h_q, scale)
    finish(ctx, case, ours=ours, out=out, ref=ref, peer_fn=peer(ctx, case, setup),
           api="BatchMLAPagedAttentionWrapper(fa3)", nbytes=nbytes, flops=flops, lens=lens,
           extra=dict(page=page, h_q=h_q, d_qk=D_QK, d_v=D_V))  # fmt: skip


def run_sparse(ctx: Ctx, case: Case, lens: list[int]) -> None:
    """Sparse MLA decode, one token a request: its top-k row holds min(context, topk) random
    distinct positions of its context (encoded block * page + offset), -1 past that.
    FlashInfer's peer: its MLA (fa3) with pages of one token over the same rows."""
    b, page, h_q, topk = len(lens), case.page, case.h_q, case.topk
    pc = mla_cache([s - 1 for s in lens], [1] * b, page, h_q, ctx.dev, ctx.seed)
    op = PagedOperand(pc.inputs, pc.params, 0, "k")
    offs = ragged_offsets([1] * b, ctx.dev)
    tl = [min(s, topk) for s in lens]
    lut = pc.inputs.lookup_table.cpu().long()
    g = torch.Generator().manual_seed(ctx.seed)
    idx = torch.full((b, topk), -1, dtype=torch.int32)
    for r, s in enumerate(lens):
        pos = torch.randperm(s, generator=g)[: tl[r]]
        idx[r, : tl[r]] = (lut[r, pos // page] * page + pos % page).int()
    idx = idx.to(ctx.dev)
    topk_lengths = torch.tensor(tl, dtype=torch.int32, device=ctx.dev)
    q = torch.randn(b, h_q, D_QK, device=ctx.dev, dtype=torch.bfloat16)
    out = torch.empty(b, h_q, D_V, device=ctx.dev, dtype=torch.bfloat16)
    rows1 = pc.inputs.kv_blocks[:, 0, 0, :, 0].reshape(-1, 1, D_QK)  # one token a page
    kv_indptr = ragged_offsets(tl, ctx.dev)
    cols = torch.arange(topk, device=ctx.dev)
    kv_indices = idx[cols[None, :] < topk_lengths[:, None]].contiguous()
    scale = D_QK**-0.5
    ref = ref_mla(q, offs, kv_indptr, kv_indices, topk_lengths, rows1, 1, scale)
    nbytes = sum(tl) * D_QK * 2 + q.numel() * 2 + out.numel() * 2
    flops = 2 * sum(tl) * h_q * (D_QK + D_V)
    ours = lambda: mla_decode(q, op, offs, scale=scale, indices=idx, topk_lengths=topk_lengths,
                              out=out, backend=ctx.backend)  # fmt: skip
    setup = mla_peer_setup(q, offs, kv_indptr, kv_indices, topk_lengths, rows1, 1, h_q, scale)
    finish(ctx, case, ours=ours, out=out, ref=ref, peer_fn=peer(ctx, case, setup),
           api="BatchMLAPagedAttentionWrapper(fa3, page 1, top-k rows as pages)",
           nbytes=nbytes, flops=flops, lens=lens,
           extra=dict(page=page, h_q=h_q, topk=topk, topk_lengths=summary(tl)))  # fmt: skip


def run_host(ctx: Ctx, case: Case, lens: list[int]) -> None:
    """Wall time per eager call (host cost) of pagedattn and its peers on one decode shape."""
    b, page, h_q = len(lens), case.page, case.h_q
    offs = ragged_offsets([1] * b, ctx.dev)
    impls: dict[str, tuple] = {}  # impl -> (fn, its output for the check)
    if case.kind == "host-mha":
        pc = gqa_cache([s - 1 for s in lens], [1] * b, page, h_q, ctx.dev, ctx.seed)
        inp = pc.inputs
        q = torch.randn(b, h_q, D, device=ctx.dev, dtype=torch.bfloat16)
        out = poison_(torch.empty_like(q))
        k_op, v_op = PagedOperand(inp, pc.params, 0, "k"), PagedOperand(inp, pc.params, 0, "v")
        pool = inp.kv_blocks[:, :, 0]
        indptr, indices, last = page_lists(inp.lookup_table, lens, page)
        scale = D**-0.5
        ref = ref_gqa(q, offs, indptr, indices, last, pool, page, scale)
        impls["pagedattn"] = (
            lambda: mha(q, k_op, v_op, offs, scale=scale, out=out, backend=ctx.backend),
            lambda: out,
        )
        # torch SDPA on dense K/V gathered once (the call alone is timed)
        n, kp = lens[0], indptr.tolist()
        kd, vd = (
            torch.stack([pool[indices[kp[r] : kp[r + 1]].long(), j].flatten(0, 1)[:n]
                         for r in range(b)]).transpose(1, 2).contiguous()
            for j in (0, 1)
        )  # fmt: skip
        q4 = q.view(b, h_q, 1, D)
        sdpa = lambda: torch.nn.functional.scaled_dot_product_attention(
            q4, kd, vd, scale=scale, enable_gqa=True
        )
        impls["torch-sdpa"] = (sdpa, lambda: sdpa().view(b, h_q, D))

        def setup(fi):
            ws = torch.empty(WS_BYTES, dtype=torch.uint8, device="cuda")
            w = fi.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD", use_tensor_cores=True)
            w.plan(indptr, indices, last, h_q, H_KV, D, page, q_data_type=torch.bfloat16,
                   kv_data_type=torch.bfloat16)  # fmt: skip
            return lambda: w.run(q, pool)
    else:
        pc = mla_cache([s - 1 for s in lens], [1] * b, page, h_q, ctx.dev, ctx.seed)
        op = PagedOperand(pc.inputs, pc.params, 0, "k")
        q = torch.randn(b, h_q, D_QK, device=ctx.dev, dtype=torch.bfloat16)
        out = poison_(torch.empty(b, h_q, D_V, device=ctx.dev, dtype=torch.bfloat16))
        rows = pc.inputs.kv_blocks[:, 0, 0, :, 0]
        indptr, indices, _ = page_lists(pc.inputs.lookup_table, lens, page)
        kv_len = torch.tensor(lens, dtype=torch.int32, device=ctx.dev)
        scale = D_QK**-0.5
        ref = ref_mla(q, offs, indptr, indices, kv_len, rows, page, scale)
        impls["pagedattn"] = (
            lambda: mla_decode(
                q, op, offs, scale=scale, out=out, backend=ctx.backend, return_lse=False
            ),  # (FlashInfer's run() returns no LSE)
            lambda: out,
        )
        setup = mla_peer_setup(q, offs, indptr, indices, kv_len, rows, page, h_q, scale)
    fi_fn = peer(ctx, case, setup)
    if fi_fn is not None:
        impls["flashinfer"] = (fi_fn, lambda: first(fi_fn()))
    us = {}
    for impl, (fn, result) in impls.items():
        fn()
        ctx.sync()
        c = cosine(result().float(), ref)
        if not c >= MIN_COS:
            ctx.error(case, f"{impl} output off the reference (cosine {c:.6f}): not timed")
            continue
        ms = ctx.wall_ms(fn)
        us[impl] = ms * 1e3
        e = dict(group=case.group, batch=b, seed=ctx.seed, dist=list(case.lengths),
                 lengths=summary(lens), page=page,
                 h_q=h_q, us_per_call=round(ms * 1e3, 2), calls=1 if ctx.dry else HOST_CALLS,
                 cos_vs_ref=round(c, 6))  # fmt: skip
        if ctx.dry:
            e["dry_run"] = True
        if impl == "pagedattn" and not ctx.dry:
            e["gpu_ms"] = round(float(time_ms(fn)), 5)  # device time, for comparison
        ctx.records.append(Record(SUITE, case.name, impl, ms, 0.0, 0.0, e))
    mine = next((r for r in ctx.records[::-1] if r.config == case.name
                 and r.impl == "pagedattn"), None)  # fmt: skip
    if mine is not None:
        for impl, u in us.items():
            if impl != "pagedattn":
                mine.extra[f"{impl}_us"] = round(u, 2)
        # the host's speed moves every wall time of these rows between runs (SDPA's call took
        # 20.4-38.8 us on the lent H200 hosts of 2026-11-30); our time over SDPA's, measured
        # in the same loop, moves less
        if "torch-sdpa" in us and "pagedattn" in us:
            mine.extra["of_sdpa"] = round(us["pagedattn"] / us["torch-sdpa"], 3)


def run_case(ctx: Ctx, case: Case) -> None:
    torch.manual_seed(ctx.seed)
    lens = draw_lengths(case.lengths, case.b, ctx.seed, ctx.clip)
    if case.kind == "gqa":
        run_gqa(ctx, case, lens)
    elif case.kind == "mixed":
        run_gqa(ctx, case, lens, [(case.chunk_cached, case.chunk)] * case.chunks)
    elif case.kind == "mla":
        run_mla(ctx, case, lens)
    elif case.kind == "sparse":
        run_sparse(ctx, case, lens)
    else:
        run_host(ctx, case, lens)


def run(records: list[Record], ceilings: dict, seed: int = 0, dry: bool = False,
        only: str | None = None) -> dict:  # fmt: skip
    """Every case (or those `only` selects: `common.selected`) into
    `records`; returns the run's metadata (seed, errors, seconds per case)."""
    fi = None if dry else flashinfer()
    ctx = Ctx(records, ceilings, seed, dry, fi)
    seconds: dict[str, float] = {}
    t_all = time.perf_counter()
    for case in CASES:
        if not selected(case.name, only):
            continue
        c = shrink(case) if dry else case
        t0 = time.perf_counter()
        try:
            run_case(ctx, c)
        except Exception as e:  # noqa: BLE001 - keep the other cases' numbers
            import traceback

            traceback.print_exc()
            ctx.error(case, f"case failed: {type(e).__name__}: {str(e)[:300]}")
        seconds[case.name] = round(time.perf_counter() - t0, 2)
        print(f"[real] {case.name}: {seconds[case.name]:.1f} s  {_one_line(records, case)}")
        if not dry:
            torch.cuda.empty_cache()
    return dict(
        suite=SUITE,
        seed=seed,
        sigma=SIGMA,
        clip=list(ctx.clip),
        min_cos=MIN_COS,
        dry_run=dry,
        errors=ctx.errors,
        case_seconds=seconds,
        total_seconds=round(time.perf_counter() - t_all, 1),
    )


def _one_line(records: list[Record], case: Case) -> str:
    rs = {r.impl: r for r in records if r.config == case.name}
    o = rs.get("pagedattn")
    if o is None:
        return "(no pagedattn record)"
    if "us_per_call" in o.extra:
        peers = " ".join(f"{k} {v.extra['us_per_call']:.1f} us" for k, v in rs.items()
                         if k != "pagedattn")  # fmt: skip
        rel = f" ({o.extra['of_sdpa']:.2f} of SDPA's)" if "of_sdpa" in o.extra else ""
        return f"ours {o.extra['us_per_call']:.1f} us/call{rel}  {peers}"
    s = f"ours {o.ms:.4f} ms, {o.extra['frac_roofline']:.2f} of roofline ({o.extra['bound']})"
    if "x_flashinfer" in o.extra:
        s += f", FlashInfer {o.extra['flashinfer_ms']:.4f} ms, x{o.extra['x_flashinfer']:.2f}"
    return s


def table(records: list[Record]) -> str:
    """The short table: case, ours, fraction of roofline, FlashInfer, ratio (host cases: us
    per eager call)."""
    lines = [f"{'case':<44} {'ours ms':>9} {'roof ms':>9} {'/roof':>6} {'FI ms':>9} {'x FI':>6}"]
    host = []
    for r in records:
        if r.suite != SUITE or r.impl != "pagedattn":
            continue
        if "us_per_call" in r.extra:
            host.append(r)
            continue
        fi_ms, x = r.extra.get("flashinfer_ms"), r.extra.get("x_flashinfer")
        lines.append(
            f"{r.config:<44} {r.ms:>9.4f} {r.extra['roofline_ms']:>9.4f} "
            f"{r.extra['frac_roofline']:>6.2f} "
            + (f"{fi_ms:>9.4f} {x:>6.2f}" if fi_ms is not None else f"{'-':>9} {'-':>6}")
        )
    if host:
        lines.append(f"{'host cost (wall us per eager call)':<44} {'ours':>9} {'FI':>9} "
                     f"{'SDPA':>9}")  # fmt: skip
        for r in host:
            fi_us, sd = r.extra.get("flashinfer_us"), r.extra.get("torch-sdpa_us")
            lines.append(
                f"{r.config:<44} {r.extra['us_per_call']:>9.1f} "
                + (f"{fi_us:>9.1f}" if fi_us is not None else f"{'-':>9}")
                + (f" {sd:>9.1f}" if sd is not None else f" {'-':>9}")
            )
    return "\n".join(lines)


def run_and_save(out: str, env: dict, ceilings: dict, seed: int = 0, dry: bool = False,
                 only: str | None = None) -> list[Record]:  # fmt: skip
    """Run the suite, write `out` (JSON, with the run's metadata) and its plot beside it, and
    print the targets and the short table last."""
    records: list[Record] = []
    meta = run(records, ceilings, seed, dry, only)

    def draw() -> str:
        from plot import plot

        return plot(out)

    save_and_report("real", out, env, ceilings, records, meta, draw)
    from targets import real_target_table

    print(real_target_table(out))
    print(table(records))
    return records


def main(argv: list[str] | None = None) -> None:
    suite_main(argv, __doc__, "real", run_and_save)


if __name__ == "__main__":
    main()
