"""bench-serve on a real model shape (issue 57): `pagedattn bench-serve`'s workload (1,000
requests, lognormal prompt and output lengths around 600 and 200 tokens, seeded; random token
ids, end-of-sequence ignored, all requests at once unless a rate is given) served by the
engine over a random-weight checkpoint of one of `bench_model.py`'s shapes.

The checkpoint: the shape's config.json (`bench_model.hf_config_dict`, a Llama architecture
unless the shape names one) and one `model.safetensors` of every tensor transformers would
save (`random_model.checkpoint_shapes`, a tied lm_head left out), each drawn as the model
benchmarks draw it (`random_model.random_tensor`: seeded by its name), written once into
`--ckpt` (kept: a later run reuses a folder whose config.json matches). Then
`pagedattn.demo.run_bench_serve` serves the workload on it: tokens/s (output tokens and all
tokens), TTFT and TPOT p50 / p99, the prefix hit rate and the pages used; the JSON record and
its plot go to `--out`.

Usage:
  python bench/bench_serve.py [--shape llama3.2-1b] [--ckpt DIR] [--requests 1000]
                              [--out PATH.json] [--seed 0]                      # GPU
  python bench/bench_serve.py --dry-run [--out PATH.json]                       # CPU

`--dry-run`: the shape's toy sizes (`bench_model.DRY_SHAPE`), float32, on the CPU, 12 requests
of ~24-token prompts and ~8-token outputs: the same code path and record.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import bench_model as bm  # noqa: E402
import random_model as rm  # noqa: E402

from pagedattn import demo  # noqa: E402

LLAMA = dict(architectures=["LlamaForCausalLM"], model_type="llama")


def checkpoint_config(shape: str, dry: bool, dtype: torch.dtype) -> dict:
    """The config.json of the shape's random checkpoint."""
    return LLAMA | bm.hf_config_dict(shape, dry) | {"torch_dtype": str(dtype)[6:]}


@torch.no_grad()
def write_checkpoint(folder: Path, cfg: dict, device, dtype: torch.dtype, seed: int) -> bool:
    """Write the random checkpoint of `cfg` into `folder` unless it already holds it (a
    config.json equal to cfg and a model.safetensors); returns whether it wrote."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    cfg_path, weights = folder / "config.json", folder / "model.safetensors"
    if weights.exists() and cfg_path.exists() and json.loads(cfg_path.read_text()) == cfg:
        return False
    tied = bool(cfg.get("tie_word_embeddings"))
    tensors = {
        name: rm.random_tensor(name, shape, device, dtype, seed).cpu()
        for name, shape in rm.checkpoint_shapes(cfg).items()
        if not (tied and name == "lm_head.weight")
    }
    save_file(tensors, str(weights))
    cfg_path.write_text(json.dumps(cfg, indent=1))
    return True


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="llama3.2-1b", choices=list(bm.SHAPES))
    ap.add_argument("--ckpt", default=None, help="the checkpoint folder (default: a temp one)")
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--prompt-mean", type=int, default=600)
    ap.add_argument("--output-mean", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--top-p", type=float, default=1.0, help="every request's nucleus mass")
    ap.add_argument("--out", default="bench-serve.json")
    ap.add_argument("--dry-run", action="store_true")
    a = ap.parse_args(argv)
    dry = a.dry_run
    device = "cpu" if dry else "cuda"
    dtype = torch.float32 if dry else torch.bfloat16
    cfg = checkpoint_config(a.shape, dry, dtype)
    folder = Path(a.ckpt or tempfile.mkdtemp(prefix=f"pagedattn-{a.shape}-"))
    wrote = write_checkpoint(folder, cfg, device, dtype, a.seed)
    print(f"[serve] {a.shape} checkpoint {'written to' if wrote else 'reused at'} {folder}")
    work = dict(num_requests=12, prompt_mean=24, output_mean=8) if dry else dict(
        num_requests=a.requests, prompt_mean=a.prompt_mean, output_mean=a.output_mean
    )  # fmt: skip
    bench = demo.BenchConfig(model=folder, device=device, seed=a.seed, out=a.out, top_p=a.top_p,
                             **work)  # fmt: skip
    return demo.run_bench_serve(bench)


if __name__ == "__main__":
    main()
