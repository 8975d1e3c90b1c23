"""Routed experts (`ops.moe`) at the MoE models' decode and prefill shapes: pagedattn's layer
(the plan, the gate_up product with silu(gate) * up in its epilogue, the down product with the
routing weights, the token sums) against torch's grouped matmuls (`torch._grouped_mm` around a
sort and an expert-order sum: the models' path before `ops.moe`, and their CPU path), each
against the roofline max(bytes / copy, FLOPs / matmul) of the same run.

Cases (`CASES`): a top-k layer of T tokens over E experts of hidden H and intermediate I,
random weights N(0, 1 / fan_in) (FP8: each expert drawn, then e4m3 with random float32 128 x
128 block scales), each token's k experts distinct and random (seed `--seed`), routing
weights U(0, 1). Bytes: the weights of the experts the routing hits (FP8: 1 byte an element
and the scales), read once; FLOPs: 2 T k (2 I H + H I). FP8 has no grouped-matmul peer.
Both outputs are checked against the float32 reference (`backend="reference"`; cosine
difference in the record; a case whose output is off is not timed). Times: `common.time_ms`
(the faster of eager calls and graph replays).

Usage:
  python bench/bench_moe.py [--only v2-lite,...] [--out PATH.json]   # GPU
  python bench/bench_moe.py --dry-run                                # CPU: toy sizes
Output: JSON (`common.save`, suite "moe"), its plot, and `common.ratio_table`.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, replace

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import Record, ratio_table, save_and_report, selected, suite_main, time_ms

from pagedattn.models.layers import sort_by_expert, sum_in_expert_order
from pagedattn.ops.fused import silu_mul
from pagedattn.ops.moe import MoETuning, expert_matmul, moe_block_m, moe_plan, moe_sum
from pagedattn.testing import cos_diff

SUITE = "moe"
MAX_COS_DIFF = 1e-3  # bf16 products: ~1e-5 measured (dev/sweep_moe.py); a wrong kernel ~1


@dataclass(frozen=True)
class Case:
    name: str
    T: int
    k: int
    E: int
    H: int
    inter: int
    fp8: bool = False


CASES = [
    Case("deepseek-v2-lite b64 decode", 64, 6, 64, 2048, 1408),
    Case("deepseek-v2-lite b256 decode", 256, 6, 64, 2048, 1408),
    Case("gpt-oss-20b shape b64 decode (bf16, silu)", 64, 4, 32, 2880, 2880),
    Case("deepseek-v3 b64 decode (fp8 weights)", 64, 8, 256, 7168, 2048, fp8=True),
    Case("deepseek-v2-lite prefill 2048", 2048, 6, 64, 2048, 1408),
]


def shrink(c: Case) -> Case:
    """The case at CPU dry-run size."""
    return replace(c, T=min(c.T, 9), E=min(c.E, 6), k=min(c.k, 3), H=128, inter=64)


def weights(E: int, n: int, k: int, fp8: bool, dev, g: torch.Generator):
    """[E, n, k] bf16, or e4m3 with float32 [E, n / 128, k / 128] block scales (per expert, so
    no float32 copy of the whole tensor exists at once)."""
    if not fp8:
        return (torch.randn(E, n, k, device=dev, generator=g) / k**0.5).bfloat16(), None
    w = torch.empty(E, n, k, device=dev, dtype=torch.float8_e4m3fn)
    for e in range(E):
        w[e] = (torch.randn(n, k, device=dev, generator=g) * 4).to(torch.float8_e4m3fn)
    s = torch.rand(E, -(-n // 128), -(-k // 128), device=dev, generator=g) / (32 * k**0.5)
    return w, s + 1e-4


def ops_moe_layer(x, ids, rw, wgu, sgu, wd, sd, *, tuning=None, backend=None):
    """The routed experts through `ops.moe`: [T, H] bf16 (the models' CUDA path)."""
    T, k = ids.shape
    E = wgu.shape[0]
    plan = moe_plan(ids, E, block_m=(tuning or MoETuning.current()).block_m(T * k, E),
                    backend=backend)  # fmt: skip
    h = expert_matmul(x, wgu, plan, w_scale=sgu, activation="silu_mul", backend=backend,
                      tuning=tuning)  # fmt: skip
    y = expert_matmul(h, wd, plan, w_scale=sd, row_weights=rw, out_dtype=torch.float32,
                      backend=backend, tuning=tuning)  # fmt: skip
    return moe_sum(y, k, out_dtype=torch.bfloat16, backend=backend)


def grouped_mm_layer(x, ids, rw, wgu, wd):
    """The same layer as torch's grouped matmuls around a sort (the models' path before
    `ops.moe`): `layers.sort_by_expert`, `torch._grouped_mm`, `layers.sum_in_expert_order`."""
    k = ids.shape[1]
    order, _, offs = sort_by_expert(ids, wgu.shape[0])
    gu = torch._grouped_mm(x[order // k], wgu.transpose(1, 2), offs=offs)
    h = torch._grouped_mm(silu_mul(gu), wd.transpose(1, 2), offs=offs)
    return sum_in_expert_order(h * rw.flatten()[order, None], order, ids, x.dtype)


def run_case(c: Case, dev, dry: bool, seed: int) -> tuple[list[Record], dict]:
    g = torch.Generator(device=dev).manual_seed(seed)
    wgu, sgu = weights(c.E, 2 * c.inter, c.H, c.fp8, dev, g)
    wd, sd = weights(c.E, c.H, c.inter, c.fp8, dev, g)
    x = torch.randn(c.T, c.H, device=dev, generator=g).bfloat16()
    ids = torch.stack([torch.randperm(c.E, device=dev, generator=g)[: c.k] for _ in range(c.T)])
    rw = torch.rand(c.T, c.k, device=dev, generator=g)

    def ours(backend=None):
        return ops_moe_layer(x, ids, rw, wgu, sgu, wd, sd, backend=backend)

    def grouped():
        return grouped_mm_layer(x, ids, rw, wgu, wd)

    impls = {"pagedattn": ours}
    if not c.fp8 and hasattr(torch, "_grouped_mm"):
        impls["torch-grouped_mm"] = grouped
    hit = int(torch.unique(ids).numel())
    per_expert = sum(t[0].numel() * t.element_size() for t in (wgu, wd))
    per_expert += sum(t[0].numel() * 4 for t in (sgu, sd) if t is not None)
    nbytes = float(hit * per_expert)
    flops = float(2 * c.T * c.k * (3 * c.inter * c.H))
    with torch.inference_mode():
        ref = ours("reference").float()
        records, errors = [], []
        for impl, fn in impls.items():
            cd = cos_diff(fn().float(), ref)
            if not cd <= MAX_COS_DIFF:
                errors.append(f"{c.name}: {impl} off the reference (cosine diff {cd:.2e})")
                continue
            if dry:
                t0 = time.perf_counter()
                fn()
                ms = (time.perf_counter() - t0) * 1e3
            else:
                ms = time_ms(fn)
            extra = dict(T=c.T, k=c.k, E=c.E, H=c.H, I=c.inter, fp8=c.fp8, experts_hit=hit,
                         block_m=moe_block_m(c.T * c.k, c.E), cos_diff=cd, seed=seed,
                         dry_run=dry)  # fmt: skip
            records.append(Record(SUITE, c.name, impl, ms, nbytes, flops, extra))
    return records, dict(errors=errors)


def run_and_save(out: str, env: dict, ceilings: dict, seed: int = 0, dry: bool = False,
                 only: str | None = None) -> list[Record]:  # fmt: skip
    dev = "cpu" if dry else "cuda"
    t0 = time.perf_counter()
    records: list[Record] = []
    errors: list[str] = []
    for c in CASES:
        if not selected(c.name, only):
            continue
        c = shrink(c) if dry else c
        try:
            recs, meta = run_case(c, dev, dry, seed)
        except Exception as e:  # noqa: BLE001 - the other cases' numbers are kept
            errors.append(f"{c.name}: {type(e).__name__}: {str(e)[:200]}")
            continue
        records += recs
        errors += meta["errors"]
        if not dry:
            torch.cuda.empty_cache()
    meta = dict(suite=SUITE, seed=seed, dry_run=dry, errors=errors,
                total_seconds=round(time.perf_counter() - t0, 1))  # fmt: skip

    def draw() -> str:
        from plot import plot

        return plot(out)

    save_and_report(SUITE, out, env, ceilings, records, meta, draw)
    print(ratio_table(records, ceilings))
    return records


def main(argv: list[str] | None = None) -> None:
    suite_main(argv, __doc__, SUITE, run_and_save, probe_flashinfer=False)


if __name__ == "__main__":
    main()
