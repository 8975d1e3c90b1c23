"""The main job: the engine serving a small real language model, with text on the screen.

`run_demo(cfg)` loads the checkpoint shipped in `pagedattn/assets/tiny-stdlib` (a 3.5 M
parameter Llama trained on the Python standard library by scripts/train_tiny_model.py; any
folder the engine loads works) into `pagedattn.engine.LLM` on the GPU when there is one (bf16),
else on the CPU (float32). Requests arrive one per engine step. Every prompt is the same module
header (docstring and imports, several KV pages) followed by the start of a different function
or class, so later requests find the header in the prefix cache. A live display shows each
running request's text as its tokens stream in, with a progress bar. Then each completion is
printed, and a table of the run: requests, generated tokens, tokens/s, TTFT and TPOT p50/p99,
prefix hit rate, pages used and their peak.

`check_config(cfg)` checks a `DemoConfig` before anything runs (`run_demo` calls it) and raises
`InvalidArgumentError` naming the first bad field; `pages_needed(cfg)` is the pool the demo
derives when `num_pages` is None.

`run_bench_serve(BenchConfig(...))` is `pagedattn bench-serve`: a seeded synthetic workload
(lognormal prompt and output lengths, random token ids, all at once or Poisson arrivals)
through the same engine; it prints tokens/s and TTFT/TPOT p50/p99 and writes JSON and a PNG
plot (`write_plot`, matplotlib). docs/demo.md describes both.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from rich.console import Console, Group
from rich.live import Live
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from .errors import InvalidArgumentError, PagedAttnError

#: The checkpoint the demo and the CLI serve by default (package data).
DEFAULT_MODEL = Path(__file__).resolve().parent / "assets" / "tiny-stdlib"

#: Every demo prompt starts with this header (shared prefix: several full KV pages).
HEADER = '''"""Helpers for files, paths and processes."""

import os
import re
import sys
from collections import namedtuple

__all__ = ["read_text", "walk", "run", "Reader", "Error"]


'''

#: What follows the header in each prompt (request i takes STARTS[i % len(STARTS)]). Each ends
#: inside a line: a prompt that ends in a newline splits the newline from the indentation
#: after it, which the byte-level BPE merged in training, and the model then tends to dedent.
STARTS = (
    'def read_text(path, encoding=None):\n    """Return the contents of the file."""\n'
    "    with open(path",
    "class Reader:\n    def __init__(self, path):\n        self.path = path\n        self",
    "def walk(top):\n    for name in os.listdir(top):\n        path = os.path.join(",
    'class Error(Exception):\n    """',
    'def run(args, *, check=True):\n    """Run',
    "def main(argv=None):\n    if argv is None:\n        argv = sys",
    "def is_hidden(name):\n    return name",
    "class Cache(dict):\n    def __getitem__(self, key):\n        try",
    "def copy_file(src, dst):\n    with open(src, 'rb') as f:\n        data",
    "def format_size(n):\n    if n <",
    "def _check(value):\n    if not isinstance(value, str):\n        raise TypeError(",
    "def join_lines(lines):\n    result = []\n    for line in lines:\n        result",
    "def parse_args(argv):\n    import argparse\n    parser =",
    "class Point(namedtuple('Point', 'x y')):\n    def __repr__(self):\n        return",
    "def split_path(path):\n    head, tail = os.path",
    "if __name__ == '__main__':\n    main",
)

MAX_COUNT = 2**31 - 1
MAX_SEED = 2**63 - 1  # the engine's request seeds are int64


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


@dataclass
class DemoConfig:
    """The demo's knobs. `num_pages` None means `pages_needed(cfg)`; `device` is "cpu", "cuda"
    or "cuda:N"; counts are ints in [1, 2**31 - 1]; `temperature` 0 is greedy."""

    num_requests: int = 16
    max_tokens: int = 48
    batch_size: int = 16
    page_size: int = 16
    num_pages: int | None = None
    seed: int = 0
    temperature: float = 0.7
    top_p: float = 0.95
    device: str = "cpu"
    model: str | Path = field(default=DEFAULT_MODEL)
    enforce_eager: bool = False  # True: no CUDA graphs (every step eager)


def prompts(n: int) -> list[str]:
    """The demo's first n prompts: HEADER + STARTS[i % len(STARTS)]."""
    return [HEADER + STARTS[i % len(STARTS)] for i in range(n)]


def _raw_tokenizer(model: Path):
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(model / "tokenizer.json"))


def longest_prompt(cfg: DemoConfig) -> int:
    """Tokens of the demo's longest prompt under the model's tokenizer."""
    tok = _raw_tokenizer(Path(cfg.model))
    n = min(cfg.num_requests, len(STARTS))
    return max(len(tok.encode(p).ids) for p in prompts(n))


def pages_for_one(cfg: DemoConfig) -> int:
    """Pages that hold the longest request (prompt + max_tokens) alone."""
    return math.ceil((longest_prompt(cfg) + cfg.max_tokens) / cfg.page_size)


def pages_needed(cfg: DemoConfig) -> int:
    """The derived pool: `min(batch_size, num_requests)` requests of the longest prompt plus
    `max_tokens`, with nothing shared (so no request is ever preempted)."""
    return min(cfg.batch_size, cfg.num_requests) * pages_for_one(cfg)


def check_count(value: object, name: str, low: int = 1, high: int = MAX_COUNT) -> None:
    if not (isinstance(value, int) and not isinstance(value, bool) and low <= value <= high):
        raise InvalidArgumentError(f"{name}: expected an integer in [{low}, {high}], got {value!r}")


def check_device(device: object, name: str = "device") -> None:
    """`device` must be "cpu", "cuda" or "cuda:N" naming a device that exists."""
    if not isinstance(device, str) or not re.fullmatch(r"cpu|cuda(:[0-9]+)?", device):
        raise InvalidArgumentError(f"{name}: expected cpu, cuda or cuda:N, got {device!r}")
    if device == "cpu":
        return
    if not torch.cuda.is_available():
        raise InvalidArgumentError(
            f"{name}: expected cpu (CUDA is not available here), got {device!r}"
        )
    index = int(device[5:]) if ":" in device else 0
    count = torch.cuda.device_count()
    if index >= count:
        raise InvalidArgumentError(
            f"{name}: expected cuda:0 to cuda:{count - 1} ({count} CUDA devices here), "
            f"got {device!r}"
        )


def check_model_dir(model: object, name: str = "model", need_tokenizer: bool = True) -> Path:
    """`model` must be a folder with config.json (and tokenizer.json when text is needed)."""
    if not isinstance(model, (str, Path)) or not str(model):
        raise InvalidArgumentError(f"{name}: expected a checkpoint folder, got {model!r}")
    path = Path(model)
    if not (path / "config.json").is_file():
        raise InvalidArgumentError(
            f"{name}: expected a checkpoint folder with config.json, got {str(model)!r}"
        )
    if need_tokenizer and not (path / "tokenizer.json").is_file():
        raise InvalidArgumentError(
            f"{name}: expected a folder with tokenizer.json (the prompts are text), "
            f"got {str(model)!r}"
        )
    return path


def check_float(value: object, name: str, low: float, high: float, low_open: bool) -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if ok:
        ok = (value > low if low_open else value >= low) and value <= high
    if not ok:
        lo = "(" if low_open else "["
        raise InvalidArgumentError(
            f"{name}: expected a number in {lo}{low}, {high}], got {value!r}"
        )


def check_config(cfg: DemoConfig, names: Mapping[str, str] | None = None) -> None:
    """Raise `InvalidArgumentError` for the first bad field of `cfg`, before anything runs.

    names: how messages name a field (the CLI passes {"num_pages": "--pages", ...}); a field not
    in it is named "cfg.<field>". Checked: every count is an int in [1, 2**31 - 1] (`seed` in
    [0, 2**63 - 1]); `temperature` in [0, 100], `top_p` in (0, 1]; `device` is "cpu", "cuda" or
    "cuda:N" and that CUDA device exists; `model` is a folder with config.json and
    tokenizer.json; the longest prompt plus `max_tokens` fits the model's
    max_position_embeddings; `num_pages`, when given, holds at least that longest request.
    """
    names = names or {}

    def name(f: str) -> str:
        return names.get(f, f"cfg.{f}")

    if not isinstance(cfg, DemoConfig):
        raise InvalidArgumentError(f"cfg: expected a DemoConfig, got {type(cfg).__name__}")
    for f in ("num_requests", "max_tokens", "batch_size", "page_size"):
        check_count(getattr(cfg, f), name(f))
    if cfg.num_pages is not None:
        check_count(cfg.num_pages, name("num_pages"))
    check_count(cfg.seed, name("seed"), 0, MAX_SEED)
    check_float(cfg.temperature, name("temperature"), 0.0, 100.0, low_open=False)
    check_float(cfg.top_p, name("top_p"), 0.0, 1.0, low_open=True)
    check_device(cfg.device, name("device"))
    path = check_model_dir(cfg.model, name("model"))
    from .models import ModelConfig

    max_pos = ModelConfig.from_hf(path).max_position_embeddings
    longest = longest_prompt(cfg)
    if longest + cfg.max_tokens > max_pos:
        raise InvalidArgumentError(
            f"{name('max_tokens')}: expected at most {max_pos - longest} (the longest prompt, "
            f"{longest} tokens, plus it must fit the model's {max_pos} positions), "
            f"got {cfg.max_tokens}"
        )
    if cfg.num_pages is not None:
        need = pages_for_one(cfg)
        if cfg.num_pages < need:
            raise InvalidArgumentError(
                f"{name('num_pages')} {cfg.num_pages} is too small for one request of "
                f"{longest + cfg.max_tokens} tokens ({longest} of prompt + {name('max_tokens')} "
                f"{cfg.max_tokens}) at {name('page_size')} {cfg.page_size}: need at least {need}"
            )


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (linear interpolation); NaN for no values."""
    return float(np.percentile(values, q)) if values else float("nan")


def _tail(text: str, width: int) -> str:
    one_line = text.replace("\n", "⏎ ")
    return one_line if len(one_line) <= width else "…" + one_line[-(width - 1) :]


def _live_view(progress: Progress, states: dict[int, dict], width: int) -> Group:
    table = Table(box=None, show_header=True, pad_edge=False, expand=False)
    table.add_column("req", justify="right", style="cyan", no_wrap=True)
    table.add_column("tok", justify="right", no_wrap=True)
    table.add_column("text so far (prompt start, then generated)", no_wrap=True)
    running = [(rid, st) for rid, st in states.items() if not st["done"]]
    for rid, st in running[-12:]:
        line = Text(_tail(st["start"], 24), style="dim")
        line.append(_tail(st["text"], max(20, width - 40)), style="bold green")
        table.add_row(str(rid), str(st["tokens"]), line)
    return Group(progress, table)


def run_demo(cfg: DemoConfig, console: Console | None = None) -> dict:
    """Run the demo; returns its metrics and completions. Raises InvalidArgumentError for a bad
    `cfg` (`check_config`, before anything runs)."""
    check_config(cfg)
    console = console or Console()
    from .engine import LLM, SamplingParams

    dev = torch.device(cfg.device)
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    num_pages = pages_needed(cfg) if cfg.num_pages is None else cfg.num_pages
    t_load = time.perf_counter()
    llm = LLM(
        str(cfg.model),
        device=dev,
        dtype=dtype,
        page_size=cfg.page_size,
        num_pages=num_pages,
        max_num_seqs=cfg.batch_size,
        seed=cfg.seed,
        enforce_eager=cfg.enforce_eager,
    )
    n_params = sum(p.numel() for p in llm.model.parameters())
    # Warm-up (kernels compile on the GPU): a prompt shorter than a page, so nothing cached.
    llm.generate(["x = 1\n"], SamplingParams(max_tokens=2, temperature=0))
    llm.reset_stats()
    load_s = time.perf_counter() - t_load
    name = Path(cfg.model).name
    console.print(
        f"[bold]pagedattn demo[/]: [cyan]{escape(name)}[/] ({n_params / 1e6:.1f} M parameters, "
        f"{llm.config.num_layers} layers) on [cyan]{dev}[/] ({str(dtype)[6:]}), loaded in "
        f"{load_s:.1f} s. {cfg.num_requests} requests arrive one per step, each a "
        f"{len(llm.tokenizer.encode(HEADER))}-token shared header + its own code start; "
        f"{cfg.max_tokens} new tokens each, temperature {cfg.temperature}, "
        f"{num_pages} pages of {cfg.page_size} tokens, batch {cfg.batch_size}."
    )
    console.print(Text("Every prompt starts with:\n" + HEADER.rstrip("\n") + "\n", style="dim"))
    texts = prompts(cfg.num_requests)
    params = SamplingParams(max_tokens=cfg.max_tokens, temperature=cfg.temperature, top_p=cfg.top_p)
    states: dict[int, dict] = {}
    finals: dict[int, object] = {}
    order: list[int] = []
    progress = Progress(
        TextColumn("[bold]generating"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("tokens"),
        TimeElapsedColumn(),
        console=console,
    )
    total_tokens = cfg.num_requests * cfg.max_tokens
    task = progress.add_task("tokens", total=total_tokens)
    width = console.width
    t0 = time.perf_counter()
    pending = list(enumerate(texts))
    with Live(
        _live_view(progress, states, width), console=console, transient=True, refresh_per_second=8
    ) as live:
        while pending or llm.has_unfinished_requests():
            if pending:  # one new request a step
                i, text = pending.pop(0)
                rid = llm.add_request(text, params)
                order.append(rid)
                start = STARTS[i % len(STARTS)]
                states[rid] = {"start": start, "text": "", "tokens": 0, "done": False}
            for out in llm.step():
                st = states[out.request_id]
                st["text"] = out.outputs[0].text or ""
                st["tokens"] = len(out.outputs[0].token_ids)
                progress.advance(task, len(out.outputs[0].new_token_ids))
                if out.finished:
                    st["done"] = True
                    finals[out.request_id] = out
                    # A request that stopped early (end of text) gives back its unused tokens.
                    progress.update(
                        task, total=progress.tasks[0].total - (cfg.max_tokens - st["tokens"])
                    )
            live.update(_live_view(progress, states, width))
    wall = time.perf_counter() - t0
    stats = llm.stats()

    for n, rid in enumerate(order):
        out = finals[rid]
        comp = out.outputs[0]
        m = out.metrics
        console.rule(
            f"[cyan]request {n}[/]: {len(comp.token_ids)} tokens ({comp.finish_reason}), "
            f"TTFT {1e3 * (m.ttft or 0):.0f} ms, prefix hit {m.prefix_hit_tokens} tokens",
            align="left",
        )
        body = Text("… " + STARTS[n % len(STARTS)], style="dim")
        body.append(comp.text or "", style="bold green")
        console.print(body, soft_wrap=True)

    outs = [finals[rid] for rid in order]
    ttfts = [o.metrics.ttft for o in outs if o.metrics.ttft is not None]
    tpots = [o.metrics.tpot for o in outs if o.metrics.tpot is not None]
    generated = sum(len(o.outputs[0].token_ids) for o in outs)
    rows = [
        ("requests", cfg.num_requests),
        ("generated tokens", generated),
        ("tokens/s (wall)", f"{generated / wall:.1f}"),
        ("engine steps", stats.num_steps),
        (
            "TTFT p50 / p99 (ms)",
            f"{1e3 * percentile(ttfts, 50):.1f} / {1e3 * percentile(ttfts, 99):.1f}",
        ),
        (
            "TPOT p50 / p99 (ms)",
            f"{1e3 * percentile(tpots, 50):.1f} / {1e3 * percentile(tpots, 99):.1f}",
        ),
        ("prefix hit rate", f"{stats.prefix_hit_rate:.1%}"),
        ("prefix tokens reused", stats.prefix_hit_tokens),
        (
            "pages used now / peak / total",
            f"{stats.used_pages} / {stats.peak_used_pages} / {stats.total_pages}",
        ),
        ("preemptions", stats.preemptions),
    ]
    table = Table(title=f"pagedattn demo on {dev} ({wall:.1f} s serving)")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for k, v in rows:
        table.add_row(k, str(v))
    console.print(table)
    return {
        **dict(rows),
        "wall_s": wall,
        "ttft_s": ttfts,
        "tpot_s": tpots,
        "prefix_hit_rate": stats.prefix_hit_rate,
        "peak_used_pages": stats.peak_used_pages,
        "total_pages": stats.total_pages,
        "completions": [o.outputs[0].text for o in outs],
        "prompts": texts,
    }


# bench-serve ---------------------------------------------------------------------------------
#: Shape (sigma of the underlying normal) of the lognormal prompt and output lengths.
LENGTH_SIGMA = 0.7
#: Lengths are clipped to [1, LENGTH_CLIP * mean].
LENGTH_CLIP = 6
#: The CPU's default pool for bench-serve: the workload's tokens, at most this many.
BENCH_CPU_POOL_TOKENS = 65536
#: The warm-up request before the timed run (the GPU compiles its kernels there).
WARMUP_PROMPT, WARMUP_TOKENS = 64, 4


@dataclass
class BenchConfig:
    """`pagedattn bench-serve`: a synthetic workload through the engine. Prompt and output
    lengths are lognormal (sigma LENGTH_SIGMA) with the given means, seeded; prompts are random
    token ids; outputs ignore end-of-sequence tokens so that they reach their lengths.
    request_rate: Poisson arrivals per second (inf: all at once). num_pages None: the engine's
    default on CUDA (gpu_memory_utilization 0.9), on the CPU the workload's tokens up to
    BENCH_CPU_POOL_TOKENS (and at least its longest request)."""

    model: str | Path = field(default=DEFAULT_MODEL)
    device: str = "cpu"
    num_requests: int = 1000
    prompt_mean: int = 600
    output_mean: int = 200
    request_rate: float = math.inf
    page_size: int = 16
    num_pages: int | None = None
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048
    seed: int = 0
    out: str | Path | None = "bench-serve.json"
    plot: bool = True
    enforce_eager: bool = False  # True: no CUDA graphs (every step eager)
    top_p: float = 1.0  # every request samples at temperature 1 with this nucleus mass


def check_bench_config(cfg: BenchConfig, names: Mapping[str, str] | None = None) -> None:
    """Raise `InvalidArgumentError` for the first bad field of `cfg` (named through `names`,
    as `check_config`), before anything runs."""
    names = names or {}

    def name(f: str) -> str:
        return names.get(f, f"cfg.{f}")

    if not isinstance(cfg, BenchConfig):
        raise InvalidArgumentError(f"cfg: expected a BenchConfig, got {type(cfg).__name__}")
    for f in (
        "num_requests",
        "prompt_mean",
        "output_mean",
        "page_size",
        "max_num_seqs",
        "max_num_batched_tokens",
    ):
        check_count(getattr(cfg, f), name(f))
    if cfg.num_pages is not None:
        check_count(cfg.num_pages, name("num_pages"))
    check_count(cfg.seed, name("seed"), 0, MAX_SEED)
    check_float(cfg.top_p, name("top_p"), 0.0, 1.0, low_open=True)
    r = cfg.request_rate
    if not (isinstance(r, (int, float)) and not isinstance(r, bool) and r > 0 and r == r):
        raise InvalidArgumentError(
            f"{name('request_rate')}: expected a number > 0 (inf: all at once), got {r!r}"
        )
    check_device(cfg.device, name("device"))
    check_model_dir(cfg.model, name("model"), need_tokenizer=False)
    if cfg.out is not None and not isinstance(cfg.out, (str, Path)):
        raise InvalidArgumentError(f"{name('out')}: expected a file path, got {cfg.out!r}")
    if cfg.out is not None and Path(cfg.out).is_dir():
        raise InvalidArgumentError(
            f"{name('out')}: expected a file path, got the folder {str(cfg.out)!r}"
        )
    if cfg.num_pages is not None:
        plens, olens = workload_lengths(cfg)
        longest = max(int((plens + olens).max()), WARMUP_PROMPT + WARMUP_TOKENS)
        need = math.ceil(longest / cfg.page_size)
        if cfg.num_pages < need:
            raise InvalidArgumentError(
                f"{name('num_pages')} {cfg.num_pages} is too small for the workload's longest "
                f"request ({longest} tokens) at {name('page_size')} {cfg.page_size}: need at "
                f"least {need}"
            )


def lognormal_lengths(rng: np.random.Generator, n: int, mean: int) -> np.ndarray:
    """n lengths, lognormal with mean `mean` (sigma LENGTH_SIGMA), in [1, LENGTH_CLIP * mean]."""
    mu = math.log(mean) - LENGTH_SIGMA**2 / 2
    x = rng.lognormal(mu, LENGTH_SIGMA, n)
    return np.clip(np.rint(x), 1, LENGTH_CLIP * mean).astype(np.int64)


def workload_lengths(cfg: BenchConfig, rng: np.random.Generator | None = None):
    """(prompt lengths, output lengths) of the seeded workload (the first draws of its rng)."""
    rng = np.random.default_rng(cfg.seed) if rng is None else rng
    plens = lognormal_lengths(rng, cfg.num_requests, cfg.prompt_mean)
    olens = lognormal_lengths(rng, cfg.num_requests, cfg.output_mean)
    return plens, olens


def synthetic_workload(cfg: BenchConfig, vocab_size: int) -> list[dict]:
    """The seeded requests: [{"prompt_token_ids", "output_len", "arrival_s"}]."""
    rng = np.random.default_rng(cfg.seed)
    plens, olens = workload_lengths(cfg, rng)
    if math.isinf(cfg.request_rate):
        arrivals = np.zeros(cfg.num_requests)
    else:
        arrivals = np.cumsum(rng.exponential(1 / cfg.request_rate, cfg.num_requests))
        arrivals -= arrivals[0]
    return [
        {
            "prompt_token_ids": rng.integers(0, vocab_size, int(p)).tolist(),
            "output_len": int(o),
            "arrival_s": float(a),
        }
        for p, o, a in zip(plens, olens, arrivals)
    ]


def _summary(reqs: list[dict], wall: float, stats) -> dict:
    ttft = [r["ttft_s"] for r in reqs if r["ttft_s"] is not None]
    tpot = [r["tpot_s"] for r in reqs if r["tpot_s"] is not None]
    e2e = [r["e2e_s"] for r in reqs if r["e2e_s"] is not None]
    out_tokens = sum(r["output_len"] for r in reqs)
    in_tokens = sum(r["prompt_len"] for r in reqs)
    return {
        "requests": len(reqs),
        "duration_s": wall,
        "prompt_tokens": in_tokens,
        "output_tokens": out_tokens,
        "request_throughput": len(reqs) / wall,
        "output_tokens_per_s": out_tokens / wall,
        "total_tokens_per_s": (in_tokens + out_tokens) / wall,
        "ttft_p50_ms": 1e3 * percentile(ttft, 50),
        "ttft_p99_ms": 1e3 * percentile(ttft, 99),
        "ttft_mean_ms": 1e3 * float(np.mean(ttft)) if ttft else float("nan"),
        "tpot_p50_ms": 1e3 * percentile(tpot, 50),
        "tpot_p99_ms": 1e3 * percentile(tpot, 99),
        "tpot_mean_ms": 1e3 * float(np.mean(tpot)) if tpot else float("nan"),
        "e2e_p50_s": percentile(e2e, 50),
        "e2e_p99_s": percentile(e2e, 99),
        "engine_steps": stats.num_steps,
        "preemptions": stats.preemptions,
        "prefix_hit_rate": stats.prefix_hit_rate,
        "peak_used_pages": stats.peak_used_pages,
        "total_pages": stats.total_pages,
    }


def run_bench_serve(cfg: BenchConfig, console: Console | None = None) -> dict:
    """Serve the synthetic workload; print the results, write JSON (and a PNG plot beside it,
    `cfg.out` with the suffix .png) when `cfg.out` is set; returns the results dict."""
    check_bench_config(cfg)
    if cfg.out is not None and cfg.plot:
        _pyplot()  # fail before the run, not after it
    console = console or Console()
    from .engine import LLM, SamplingParams
    from .models import ModelConfig

    dev = torch.device(cfg.device)
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    mcfg = ModelConfig.from_hf(Path(cfg.model))
    work = synthetic_workload(cfg, mcfg.vocab_size)
    longest = max(len(w["prompt_token_ids"]) + w["output_len"] for w in work)
    # Requests may pass the model's trained positions (RoPE extends; random ids anyway).
    max_len = max(longest, WARMUP_PROMPT + WARMUP_TOKENS)
    num_pages = cfg.num_pages
    if num_pages is None and dev.type != "cuda":
        total = sum(len(w["prompt_token_ids"]) + w["output_len"] for w in work)
        num_pages = math.ceil(max(max_len, min(total, BENCH_CPU_POOL_TOKENS)) / cfg.page_size)
    t_load = time.perf_counter()
    llm = LLM(
        str(cfg.model),
        device=dev,
        dtype=dtype,
        page_size=cfg.page_size,
        num_pages=num_pages,
        max_num_seqs=cfg.max_num_seqs,
        max_num_batched_tokens=cfg.max_num_batched_tokens,
        max_model_len=max_len,
        seed=cfg.seed,
        enforce_eager=cfg.enforce_eager,
    )
    # Warm-up: one prefill and a few decodes (the GPU compiles its kernels here).
    llm.generate([[1] * WARMUP_PROMPT], SamplingParams(max_tokens=WARMUP_TOKENS, ignore_eos=True))
    llm.reset_stats()
    load_s = time.perf_counter() - t_load
    rate = "all at once" if math.isinf(cfg.request_rate) else f"{cfg.request_rate:g} req/s"
    console.print(
        f"[bold]pagedattn bench-serve[/]: {cfg.num_requests} requests ({rate}), lognormal "
        f"prompt/output lengths with means {cfg.prompt_mean}/{cfg.output_mean}, seed "
        f"{cfg.seed}; [cyan]{escape(Path(cfg.model).name)}[/] on {dev} ({str(dtype)[6:]}), "
        f"{llm.manager.total_num_pages} pages of {cfg.page_size}, loaded in {load_s:.1f} s"
    )
    finals: dict[int, object] = {}
    rid_of: list[int] = []
    timeline: list[dict] = []
    progress = Progress(
        TextColumn("[bold]serving"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("requests"),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    )
    next_i = 0
    with progress:
        task = progress.add_task("requests", total=len(work))
        t0 = time.perf_counter()
        while next_i < len(work) or llm.has_unfinished_requests():
            now = time.perf_counter() - t0
            while next_i < len(work) and work[next_i]["arrival_s"] <= now:
                w = work[next_i]
                sp = SamplingParams(max_tokens=w["output_len"], temperature=1.0,
                                    top_p=cfg.top_p, ignore_eos=True, seed=next_i)  # fmt: skip
                rid_of.append(llm.add_request({"prompt_token_ids": w["prompt_token_ids"]}, sp))
                next_i += 1
            if not llm.has_unfinished_requests():
                time.sleep(max(0.0, work[next_i]["arrival_s"] - now))
                continue
            for out in llm.step():
                if out.finished:
                    finals[out.request_id] = out
                    progress.advance(task)
            s = llm.stats()
            timeline.append(
                {
                    "t_s": time.perf_counter() - t0,
                    "generated_tokens": s.generated_tokens,
                    "running": len(llm.scheduler.running),
                    "waiting": len(llm.scheduler.waiting),
                    "used_pages": s.used_pages,
                }
            )
        wall = time.perf_counter() - t0
    stats = llm.stats()
    reqs = []
    for w, rid in zip(work, rid_of):
        o = finals[rid]
        m = o.metrics
        reqs.append(
            {
                "prompt_len": len(w["prompt_token_ids"]),
                "output_len": len(o.outputs[0].token_ids),
                "arrival_s": w["arrival_s"],
                "ttft_s": m.ttft,
                "tpot_s": m.tpot,
                "e2e_s": m.e2e,
                "preemptions": m.num_preemptions,
            }
        )
    summary = _summary(reqs, wall, stats)
    result = {
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in cfg.__dict__.items()}
        | {"request_rate": None if math.isinf(cfg.request_rate) else cfg.request_rate},
        "device": str(dev),
        "device_name": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
        "dtype": str(dtype),
        "torch": torch.__version__,
        "length_sigma": LENGTH_SIGMA,
        "summary": summary,
        "requests": reqs,
        "timeline": timeline,
    }
    table = Table(title=f"bench-serve on {dev} ({wall:.1f} s)")
    table.add_column("metric")
    table.add_column("value", justify="right")
    s = summary
    for k, v in [
        ("requests", s["requests"]),
        ("prompt / output tokens", f"{s['prompt_tokens']} / {s['output_tokens']}"),
        ("requests/s", f"{s['request_throughput']:.2f}"),
        ("output tokens/s", f"{s['output_tokens_per_s']:.1f}"),
        ("total tokens/s", f"{s['total_tokens_per_s']:.1f}"),
        ("TTFT p50 / p99 (ms)", f"{s['ttft_p50_ms']:.1f} / {s['ttft_p99_ms']:.1f}"),
        ("TPOT p50 / p99 (ms)", f"{s['tpot_p50_ms']:.2f} / {s['tpot_p99_ms']:.2f}"),
        ("engine steps", s["engine_steps"]),
        ("preemptions", s["preemptions"]),
        ("pages peak / total", f"{s['peak_used_pages']} / {s['total_pages']}"),
    ]:
        table.add_row(k, str(v))
    console.print(table)
    if cfg.out is not None:
        import json

        out = Path(cfg.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=1, allow_nan=False, default=_json_default) + "\n")
        console.print(f"wrote {out}")
        if cfg.plot:
            png = out.with_suffix(".png")
            write_plot(result, png)
            console.print(f"wrote {png}")
    return result


def _json_default(o):
    raise TypeError(f"not JSON serializable: {type(o).__name__}")


class MissingDependencyError(PagedAttnError):
    """An optional package the command needs is not installed."""


def _pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise MissingDependencyError(
            "the plot needs matplotlib, which is not installed (pip install matplotlib, or "
            "pip install 'pagedattn[bench]')"
        ) from e
    return plt


def write_plot(result: dict, path: str | Path) -> None:
    """A 2x2 PNG of a bench-serve result: the length distributions, TTFT against prompt
    length, the TPOT distribution, and the output throughput over time."""
    plt = _pyplot()
    reqs, s = result["requests"], result["summary"]
    fig, ax = plt.subplots(2, 2, figsize=(11, 7.5))
    pl = [r["prompt_len"] for r in reqs]
    ol = [r["output_len"] for r in reqs]
    ax[0, 0].hist([pl, ol], bins=30, label=["prompt", "output"])
    ax[0, 0].set(xlabel="tokens", ylabel="requests", title="request lengths (lognormal)")
    ax[0, 0].legend()
    pts = [(r["prompt_len"], 1e3 * r["ttft_s"]) for r in reqs if r["ttft_s"] is not None]
    if pts:
        ax[0, 1].scatter(*zip(*pts), s=6, alpha=0.5)
    ax[0, 1].set(
        xlabel="prompt tokens",
        ylabel="TTFT (ms)",
        title=f"TTFT: p50 {s['ttft_p50_ms']:.1f} ms, p99 {s['ttft_p99_ms']:.1f} ms",
    )
    tp = [1e3 * r["tpot_s"] for r in reqs if r["tpot_s"] is not None]
    if tp:
        ax[1, 0].hist(tp, bins=30)
    ax[1, 0].set(
        xlabel="TPOT (ms)",
        ylabel="requests",
        title=f"TPOT: p50 {s['tpot_p50_ms']:.2f} ms, p99 {s['tpot_p99_ms']:.2f} ms",
    )
    tl = result["timeline"]
    if len(tl) >= 2:
        t = np.array([p["t_s"] for p in tl])
        g = np.array([p["generated_tokens"] for p in tl], dtype=float)
        k = max(1, len(t) // 50)  # a rate over windows of k steps
        rate = (g[k:] - g[:-k]) / np.maximum(t[k:] - t[:-k], 1e-9)
        ax[1, 1].plot(t[k:], rate, label="output tokens/s")
        ax2 = ax[1, 1].twinx()
        ax2.plot(t, [p["running"] for p in tl], color="tab:orange", label="running requests")
        ax2.set_ylabel("running requests")
    ax[1, 1].set(
        xlabel="time (s)",
        ylabel="output tokens/s",
        title=f"throughput: {s['output_tokens_per_s']:.0f} output tok/s overall",
    )
    fig.suptitle(
        f"pagedattn bench-serve: {s['requests']} requests on {result['device_name']} "
        f"({result['dtype'][6:]})"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
