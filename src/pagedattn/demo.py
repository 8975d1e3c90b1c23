"""The main job: a stream of requests with shared prefixes served through the paged cache.

Each request (a shared "system prompt" + a private suffix, some tenants salted) is prefilled
in chunks and then decoded for a few steps. Every step writes real K/V for its new tokens
(values derived from the whole token prefix, as a model's would be), runs paged attention
over the cache for the step's queries, and checks it against attention over the K/V gathered
back in logical order. At the end every live request's gathered K/V is checked byte for byte
against what was written, and the cache statistics are printed.
"""

from __future__ import annotations

import hashlib
import random
import time
from dataclasses import dataclass

import torch
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from .cache import KVCacheParams, PagedKVCacheManager
from .errors import OutOfPagesError
from .ops.store_kv import gather_kv, store_kv
from .testing import assert_close

# The attention checks' bounds (DESIGN.md section 5's rule), from dev/demo_margins.py (2026-11-22).
# CPU (float32 reference op against float64), 100 runs: worst element 2.1e-6, cosine ~1e-13.
F32_TOL = dict(abs_tol=2e-5, rel_tol=1e-5, cos_tol=1e-10)
# H100 (bf16 kernels; prefill rounds P to bf16; outputs up to ~3), 12 runs: worst element 7.9e-3
# to 1.06e-2, cosine at most 2.7e-6.
BF16_DEMO_TOL = dict(abs_tol=2e-2, rel_tol=2 / 128, cos_tol=1e-5)


@dataclass
class DemoConfig:
    num_requests: int = 48
    batch_size: int = 8
    page_size: int = 16
    num_pages: int = 72
    n_kv_heads: int = 2
    n_q_heads: int = 8
    head_dim: int = 64
    prefill_chunk: int = 48
    decode_steps: int = 12
    seed: int = 0
    device: str = "cpu"


def token_kv(tokens: list[int], salt: str | None, heads: int, dim: int) -> torch.Tensor:
    """Deterministic K (V = -K) for the last token of a prefix: [heads, dim] float32."""
    seed = int.from_bytes(hashlib.sha256(repr((salt, tokens)).encode()).digest()[:8], "little")
    g = torch.Generator().manual_seed(seed)
    return torch.randn(heads, dim, generator=g)


def _attention_check(q, k_all, v_all, positions, group) -> torch.Tensor:
    """Causal attention of q [n, hq, d] at absolute `positions` over gathered K/V (float64)."""
    k = k_all.double().repeat_interleave(group, dim=1)
    v = v_all.double().repeat_interleave(group, dim=1)
    s = torch.einsum("qhd,khd->hqk", q.double(), k) / q.shape[-1] ** 0.5
    kpos = torch.arange(k.shape[0])
    s = s.masked_fill(kpos[None, None, :] > positions[None, :, None], float("-inf"))
    return torch.einsum("hqk,khd->qhd", s.softmax(-1), v)


def run_demo(cfg: DemoConfig, console: Console | None = None) -> dict:
    """Run the demo; returns the final statistics. Raises AssertionError on any mismatch."""
    console = console or Console()
    rng = random.Random(cfg.seed)
    dev = torch.device(cfg.device)
    params = KVCacheParams(
        torch.bfloat16 if dev.type == "cuda" else torch.float32,
        num_layers=1,
        n_kv_heads=cfg.n_kv_heads,
        head_dim=cfg.head_dim,
        page_size=cfg.page_size,
        num_q_heads=cfg.n_q_heads,
        devices=[dev],
    )
    m = PagedKVCacheManager(params, cfg.num_pages, max_batch_size=cfg.batch_size)
    systems = [[rng.randrange(1000) for _ in range(rng.randrange(20, 90))] for _ in range(4)]
    pending = []
    for i in range(cfg.num_requests):
        prompt = rng.choice(systems) + [rng.randrange(1000) for _ in range(rng.randrange(1, 40))]
        pending.append((i, prompt, rng.choice([None, None, "tenant-b"])))
    salts: dict[int, str | None] = {}
    remaining: dict[int, int] = {}
    active: list[int] = []
    done = attn_checks = 0
    from .ops.mha import mha  # the attention op (Triton on CUDA, reference on CPU)

    group = cfg.n_q_heads // cfg.n_kv_heads
    tol = BF16_DEMO_TOL if params.dtype == torch.bfloat16 else F32_TOL
    gen = torch.Generator().manual_seed(cfg.seed)  # the queries: a run replays from its seed
    t0 = time.perf_counter()
    with Progress(console=console, transient=True) as prog:
        task = prog.add_task("serving requests", total=cfg.num_requests)
        while pending or active:
            while pending and len(active) < cfg.batch_size:
                rid, prompt, salt = pending.pop(0)
                m.claim(rid, prompt, salt=salt)
                salts[rid], remaining[rid] = salt, cfg.decode_steps
                active.append(rid)
            batch, lens = [], []
            for rid in active:
                n = min(cfg.prefill_chunk, len(m.tokens(rid)) - m.cache_length(rid))
                try:
                    m.alloc(rid, n)
                except OutOfPagesError:
                    continue  # waits for pages freed by finishing requests
                batch.append(rid)
                lens.append(n)
            if not batch:
                raise RuntimeError("the pool is too small for a single request")
            (inp,) = m.runtime_inputs(batch)
            offsets = torch.zeros(len(batch) + 1, dtype=torch.int32)
            offsets[1:] = torch.tensor(lens).cumsum(0)
            ks, qs, positions = [], [], []
            for rid, n in zip(batch, lens):
                toks, cl = m.tokens(rid), m.cache_length(rid)
                for i in range(n):
                    ks.append(
                        token_kv(toks[: cl + i + 1], salts[rid], cfg.n_kv_heads, cfg.head_dim)
                    )
                    positions.append(cl + i)
                qs.append(torch.randn(n, cfg.n_q_heads, cfg.head_dim, generator=gen))
            k = torch.stack(ks).to(dev, params.dtype)
            store_kv(k, -k, inp, params, 0, offsets.to(dev))
            q = torch.cat(qs).to(dev, params.dtype)
            out = mha(q, *_operands(inp, params), offsets.to(dev)).float().cpu()
            for b, rid in enumerate(batch):
                lo, hi = int(offsets[b]), int(offsets[b + 1])
                kk, vv = gather_kv(inp, params, 0, b, positions[hi - 1] + 1)
                ref = _attention_check(
                    q[lo:hi].cpu(), kk.cpu(), vv.cpu(), torch.tensor(positions[lo:hi]), group
                )
                assert_close(out[lo:hi], ref, **tol, name=f"request {rid}")
                attn_checks += 1
            new_tokens = []
            for rid, n in zip(batch, lens):
                prompt_done = m.cache_length(rid) + n >= len(m.tokens(rid))
                new_tokens.append([rng.randrange(1000)] if prompt_done else [])
            m.step(batch, new_tokens)
            for rid, nt in zip(batch, new_tokens):
                if nt:
                    remaining[rid] -= 1
                if remaining[rid] == 0:
                    _verify_request(m, params, rid, salts[rid])
                    m.release(rid)
                    active.remove(rid)
                    done += 1
                    prog.advance(task)
    elapsed = time.perf_counter() - t0
    s = m.stats()
    table = Table(title=f"pagedattn demo on {dev} ({elapsed:.1f} s)")
    table.add_column("metric")
    table.add_column("value", justify="right")
    rows = [
        ("requests served", done),
        ("attention checks passed", attn_checks),
        ("pages total", s.total_pages),
        ("pages used now", s.used_pages),
        ("pages cached (reusable)", s.cached_pages),
        ("prefix hit rate", f"{s.hit_rate:.1%}"),
        ("prefix tokens reused", s.prefix_hit_tokens),
        ("evictions", s.evictions),
    ]
    for name, v in rows:
        table.add_row(name, str(v))
    console.print(table)
    return dict(rows)


def _operands(inp, params):
    from .operands import PagedOperand

    return PagedOperand(inp, params, 0, "k"), PagedOperand(inp, params, 0, "v")


def _verify_request(m: PagedKVCacheManager, params, rid, salt) -> None:
    """Gathered K/V of a finished request equals what was written for each prefix."""
    toks, cl = m.tokens(rid), m.cache_length(rid)
    m.alloc(rid, 1)
    (inp,) = m.runtime_inputs([rid])
    k, v = gather_kv(inp, params, 0, 0, cl)
    want = (
        torch.stack(
            [token_kv(toks[: i + 1], salt, params.n_kv_heads, params.head_dim) for i in range(cl)]
        )
        .to(params.dtype)
        .float()
    )
    assert torch.equal(k.cpu(), want) and torch.equal(v.cpu(), -want), f"request {rid}: K/V differ"
