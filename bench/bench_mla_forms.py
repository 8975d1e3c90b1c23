"""DeepSeek's two MLA forms on the same data (issue 58's crossover): absorbed (`mla_decode` of
[q_nope @ w_uk | q_pe] over the latent cache, then @ w_uv) against expanded (the cached latent
of the whole context through kv_b_proj into per-head K / V, then `mha` with d_qk 192, d_v 128)
for one DeepSeek-V3-shaped attention layer (128 heads, nope 128, rope 64, v 128, kv_lora_rank
512; `random_model.py` weights, bf16).

A case: `BATCH` requests, each with `prefix` cached tokens and `q` new ones (their rows already
in the cache, as the model's step writes them before attending), q in `QS` (the absorbed form
takes at most `mla_decode`'s 8 queries a request), prefix in `PREFIXES`. Each form is timed
on its own call of the model's layer methods (`DeepseekMLA._absorbed` / `_expanded`, the step
plan built once outside the timing) with `common.time_ms`; the two outputs are compared
(cosine difference, a sanity check). The record names the faster form of each case: the
engine's rule (`MLA_ABSORBED_MAX_Q`, absorbed up to 8 queries) is right where absorbed wins
every case.

Usage:
  python bench/bench_mla_forms.py [--out PATH.json]     # GPU
  python bench/bench_mla_forms.py --dry-run             # CPU: toy dims, no timing claims
Output: JSON (`common.save`, suite "mla_forms") and a table.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import Record, default_out, environment, save, time_ms
from random_model import random_model

from pagedattn import PagedKVCacheManager
from pagedattn.models import deepseek as ds
from pagedattn.models import kv_cache_params
from pagedattn.ops.store_kv import store_kv
from pagedattn.testing import cos_diff, ragged_offsets

SUITE = "mla_forms"
SEED = 0
BATCH = 16
QS = (1, 2, 4, 8)
PREFIXES = (512, 2048, 8192)
PAGE = 64
V3_ATTN = dict(
    architectures=["DeepseekV3ForCausalLM"], model_type="deepseek_v3", vocab_size=1024,
    hidden_size=7168, intermediate_size=2048, moe_intermediate_size=2048, num_hidden_layers=1,
    first_k_dense_replace=1, num_attention_heads=128, num_key_value_heads=128,
    kv_lora_rank=512, q_lora_rank=1536, qk_rope_head_dim=64, qk_nope_head_dim=128,
    v_head_dim=128, n_routed_experts=8, num_experts_per_tok=2, n_group=1, topk_group=1,
    max_position_embeddings=16384, bos_token_id=None, eos_token_id=None, pad_token_id=None,
)  # fmt: skip
DRY = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=32,
           q_lora_rank=None, qk_rope_head_dim=16, qk_nope_head_dim=16, v_head_dim=16,
           intermediate_size=64, moe_intermediate_size=32)  # fmt: skip


def _setup(layer, params, prefix: int, q: int, dev, gen):
    """A manager whose BATCH requests have `prefix` cached rows and `q` new rows written; the
    step's inputs, offsets, q_nope and q_pe."""
    mgr = PagedKVCacheManager(params, total_num_pages=BATCH * (-(-(prefix + q) // PAGE)) + 1)
    rids = list(range(BATCH))
    for r in rids:
        mgr.claim(r, list(range(prefix + q)))
        mgr.alloc(r, prefix)
    inputs = mgr.runtime_inputs(rids)[0]
    d, dt = params.head_dim, params.dtype
    rows = torch.randn(BATCH * prefix, 1, d, generator=gen, device=dev).to(dt)
    store_kv(rows, None, inputs, params, 0, ragged_offsets([prefix] * BATCH, dev))
    mgr.step(rids, [[] for _ in rids])
    for r in rids:
        mgr.alloc(r, q)
    inputs = mgr.runtime_inputs(rids)[0]
    offs = ragged_offsets([q] * BATCH, dev)
    new = torch.randn(BATCH * q, 1, d, generator=gen, device=dev).to(dt)
    store_kv(new, None, inputs, params, 0, offs)
    T, h = BATCH * q, layer.h
    q_nope = torch.randn(T, h, layer.nope, generator=gen, device=dev).to(dt)
    q_pe = torch.randn(T, h, layer.rope, generator=gen, device=dev).to(dt)
    return inputs, offs, q_nope, q_pe


def run(dry: bool) -> tuple[list[Record], dict]:
    dev = torch.device("cpu" if dry else "cuda")
    dtype = torch.float32 if dry else torch.bfloat16
    cfg = V3_ATTN | DRY if dry else V3_ATTN
    model = random_model(cfg, dev, dtype, SEED)
    params = kv_cache_params(model.config, dtype=dtype, page_size=PAGE, devices=[str(dev)])
    model.attach_kv_cache(params)
    layer = model.model.layers[0].self_attn
    gen = torch.Generator(device=dev).manual_seed(SEED)
    records, rows = [], []
    qs, prefixes = (QS[:2], (8, 40)) if dry else (QS, PREFIXES)
    for prefix in prefixes:
        for q in qs:
            inputs, offs, q_nope, q_pe = _setup(layer, params, prefix, q, dev, gen)
            plan = ds.MLAStepPlan.build(inputs, params, offs, absorbed_max_q=0)
            empty = torch.empty(0, device=dev)
            ctx = ds.MLAStepContext(inputs, params, offs, empty, empty, plan)

            def absorbed(q_nope=q_nope, q_pe=q_pe, inputs=inputs, offs=offs):
                return layer._absorbed(q_nope, q_pe, inputs, offs, params)

            def expanded(q_nope=q_nope, q_pe=q_pe, ctx=ctx):
                return layer._expanded(q_nope, q_pe, ctx)

            with torch.inference_mode():
                cd = cos_diff(absorbed().float(), expanded().float())
                times = {}
                for name, fn in (("absorbed", absorbed), ("expanded", expanded)):
                    if dry:
                        t0 = time.perf_counter()
                        fn()
                        times[name] = (time.perf_counter() - t0) * 1e3
                    else:
                        times[name] = float(time_ms(fn))
            best = min(times, key=times.get)
            config = f"q{q} prefix{prefix} b{BATCH}"
            for name, ms in times.items():
                records.append(Record(SUITE, config, name, ms, extra=dict(
                    q=q, prefix=prefix, batch=BATCH, cos_diff=cd, faster=best,
                    dry_run=dry)))  # fmt: skip
            rows.append((config, times["absorbed"], times["expanded"], best, cd))
            a, e = times["absorbed"], times["expanded"]
            print(f"[mla_forms] {config}: absorbed {a:.3f} ms, expanded {e:.3f} ms, "
                  f"faster {best}, cos diff {cd:.1e}", flush=True)  # fmt: skip
    absorbed_always = all(r[3] == "absorbed" for r in rows)
    meta = dict(suite=SUITE, seed=SEED, dry_run=dry, absorbed_wins_every_case=absorbed_always)
    return records, meta


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None)
    ap.add_argument("--dry-run", action="store_true")
    a = ap.parse_args(argv)
    records, meta = run(a.dry_run)
    env = environment(probe_flashinfer=False)
    out = a.out or default_out(env, "_mla_forms")
    save(out, env, {}, records, meta)
    print(f"[mla_forms] wrote {out}; absorbed faster in every case: "
          f"{meta['absorbed_wins_every_case']}")  # fmt: skip


if __name__ == "__main__":
    main()
