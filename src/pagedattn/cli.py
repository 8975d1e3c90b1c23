"""Command line: `pagedattn demo` (the main job), `generate`, `bench-serve` and `info`;
`python -m pagedattn` and `python -m pagedattn.cli` run the same `main`.

    pagedattn demo [--device cpu] [--requests 16] [--max-tokens 48] ...
    pagedattn generate [--model DIR] --prompt "def " [--max-tokens 64] [--temperature 0.7] ...
    pagedattn bench-serve [--model DIR] [--requests 1000] [--prompt-mean 600] [--output-mean 200]
                          [--request-rate R] [--out bench-serve.json] ...

`--model` defaults to the checkpoint shipped in the package (`demo.DEFAULT_MODEL`).

Errors print one line on stderr, "pagedattn: error: <message> (hint: ...)", and exit non-zero:
2 for a bad option (argparse's own usage errors, and the options checked against each other
before anything runs), 1 for any other pagedattn error or an unexpected exception, 130 on
Ctrl-C (quietly). The global `--traceback` prints the full traceback instead of the one line.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
import traceback
from collections.abc import Callable

import torch

from . import __version__
from .errors import (
    CapacityError,
    InvalidArgumentError,
    MaxLengthExceededError,
    OutOfPagesError,
    PagedAttnError,
)

PROG = "pagedattn"

# Each command's options: config field -> option (the checks' messages name the option).
DEMO_OPTIONS = {
    "device": "--device",
    "num_requests": "--requests",
    "max_tokens": "--max-tokens",
    "batch_size": "--batch-size",
    "page_size": "--page-size",
    "num_pages": "--pages",
    "seed": "--seed",
    "temperature": "--temperature",
    "top_p": "--top-p",
    "model": "--model",
}
BENCH_OPTIONS = {
    "model": "--model",
    "device": "--device",
    "num_requests": "--requests",
    "prompt_mean": "--prompt-mean",
    "output_mean": "--output-mean",
    "request_rate": "--request-rate",
    "page_size": "--page-size",
    "num_pages": "--pages",
    "max_num_seqs": "--max-num-seqs",
    "max_num_batched_tokens": "--max-num-batched-tokens",
    "seed": "--seed",
    "out": "--out",
    "top_p": "--top-p",
}

# A hint for a bad option, by the option its message names first.
OPTION_HINTS = {
    "--pages": "leave --pages out to derive it from the other options",
    "--device": "use --device cpu, or leave --device out for cuda when available, else cpu",
    "--model": "leave --model out for the shipped checkpoint, or give a Hugging Face "
    "checkpoint folder",
    "--max-tokens": "lower --max-tokens",
}

# A hint for each pagedattn error a command may raise past its option checks (most specific
# first).
HINTS = (
    (OutOfPagesError, "raise --pages or lower --batch-size"),
    (MaxLengthExceededError, "use a shorter prompt, lower --max-tokens, or raise --pages"),
    (CapacityError, "lower --batch-size"),
    (PagedAttnError, "run with --traceback for details"),
)


class UsageError(Exception):
    """A bad option value, found after argparse (exit 2)."""

    def __init__(self, message: str, hint: str) -> None:
        super().__init__(message)
        self.hint = hint


class _Formatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows each option's default, except None (whose help says what it derives from)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        if action.default is None:
            return action.help or ""
        return super()._get_help_string(action)


def _default_model() -> str:
    from .demo import DEFAULT_MODEL

    return str(DEFAULT_MODEL)


def build_parser() -> argparse.ArgumentParser:
    """The parser: global --version and --traceback; commands demo, generate, bench-serve and
    info."""
    ap = argparse.ArgumentParser(
        prog=PROG,
        description="Paged KV cache and attention ops, and an engine that serves models on them.",
        formatter_class=_Formatter,
    )
    ap.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    ap.add_argument(
        "--traceback",
        action="store_true",
        help="on an error, print the full traceback instead of one line",
    )
    sub = ap.add_subparsers(dest="cmd", required=True, metavar="COMMAND")

    def command(name: str, help: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help, description=help, formatter_class=_Formatter)
        # Also accepted after the command; SUPPRESS keeps the global value when absent.
        p.add_argument(
            "--traceback",
            action="store_true",
            default=argparse.SUPPRESS,
            help="on an error, print the full traceback instead of one line",
        )
        return p

    def device(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--device",
            default=None,
            help="cpu, cuda or cuda:N (default: cuda when available, else cpu)",
        )
        p.add_argument(
            "--enforce-eager",
            action="store_true",
            help="run every step eagerly (on CUDA, decode steps replay CUDA graphs by default)",
        )

    def model(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--model",
            default=None,
            metavar="DIR",
            help="a Hugging Face checkpoint folder (default: the tiny Llama shipped in "
            "pagedattn/assets/tiny-stdlib, trained on the Python standard library)",
        )

    def sampling(p: argparse.ArgumentParser, seed_help: str) -> None:
        p.add_argument(
            "--temperature", type=float, default=0.7, help="sampling temperature (0: greedy)"
        )
        p.add_argument("--top-p", type=float, default=0.95, help="nucleus sampling mass in (0, 1]")
        p.add_argument("--seed", type=int, default=0, help=seed_help)

    d = command(
        "demo",
        "the main job: the engine streams code from a small language model for requests that "
        "share a prefix, then prints throughput, TTFT/TPOT, prefix hit rate and pages",
    )
    device(d)
    model(d)
    d.add_argument("--requests", type=int, default=16, help="how many requests to serve (>= 1)")
    d.add_argument("--max-tokens", type=int, default=48, help="tokens to generate per request")
    d.add_argument(
        "--batch-size", type=int, default=16, help="most requests running at once (max_num_seqs)"
    )
    d.add_argument("--page-size", type=int, default=16, help="tokens per KV cache page (>= 1)")
    d.add_argument(
        "--pages",
        type=int,
        default=None,
        help="pages in the KV cache (default: enough for --batch-size requests of the longest "
        "prompt plus --max-tokens, nothing shared)",
    )
    sampling(d, "seed of the requests' samples (>= 0)")

    g = command("generate", "stream a completion of one prompt from a checkpoint")
    model(g)
    g.add_argument("--prompt", required=True, help="the text to continue")
    g.add_argument("--max-tokens", type=int, default=64, help="most tokens to generate")
    sampling(g, "seed of the samples (>= 0)")
    g.add_argument(
        "--top-k", type=int, default=0, help="sample from the k likeliest tokens (0: all)"
    )
    g.add_argument(
        "--stop",
        action="append",
        default=[],
        help="end the completion before this text (repeatable)",
    )
    g.add_argument(
        "--no-echo",
        action="store_true",
        help="print only the completion, not the prompt before it",
    )
    device(g)

    b = command(
        "bench-serve",
        "serve a synthetic workload (seeded lognormal prompt and output lengths, random token "
        "ids) and report tokens/s, TTFT and TPOT p50/p99; writes JSON and a PNG plot",
    )
    model(b)
    device(b)
    b.add_argument("--requests", type=int, default=1000, help="number of requests")
    b.add_argument("--prompt-mean", type=int, default=600, help="mean prompt length in tokens")
    b.add_argument("--output-mean", type=int, default=200, help="mean output length in tokens")
    b.add_argument(
        "--request-rate",
        type=float,
        default=math.inf,
        help="Poisson arrival rate in requests/s (inf: all requests at once)",
    )
    b.add_argument("--page-size", type=int, default=16, help="tokens per KV cache page")
    b.add_argument(
        "--pages",
        type=int,
        default=None,
        help="pages in the KV cache (default: 90%% of the GPU's memory; on the CPU the "
        "workload's tokens, at most 65536)",
    )
    b.add_argument("--max-num-seqs", type=int, default=256, help="most requests running at once")
    b.add_argument(
        "--max-num-batched-tokens", type=int, default=2048, help="token budget of one step"
    )
    b.add_argument("--seed", type=int, default=0, help="seed of the workload (>= 0)")
    b.add_argument(
        "--top-p", type=float, default=1.0, help="nucleus mass of every request's samples"
    )
    b.add_argument(
        "--out",
        default="bench-serve.json",
        metavar="FILE.json",
        help="where to write the results (the plot goes beside it, as .png)",
    )
    b.add_argument("--no-plot", action="store_true", help="write the JSON only, no PNG plot")

    command("info", "print the versions and the CUDA devices")
    return ap


def main(argv: list[str] | None = None) -> int:
    """Run the command line on `argv` (default: sys.argv[1:]); returns the exit status."""
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as e:  # --help, --version, or a usage error argparse already printed
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 2)
    run = {"info": _info, "demo": _demo, "generate": _generate, "bench-serve": _bench_serve}
    try:
        return run[args.cmd](args)
    except KeyboardInterrupt:
        return 130
    except Exception as e:
        if args.traceback:
            traceback.print_exc()
            return 2 if isinstance(e, UsageError) else 1
        if isinstance(e, UsageError):
            _error(str(e), e.hint)
            return 2
        if isinstance(e, PagedAttnError):
            _error(str(e), _hint(e))
            return 1
        _error(f"{type(e).__name__}: {e}", "run with --traceback for details")
        return 1


def _hint(e: PagedAttnError) -> str:
    from .demo import MissingDependencyError

    if isinstance(e, MissingDependencyError):
        return "install it, or pass --no-plot"
    return next(h for cls, h in HINTS if isinstance(e, cls))


def _error(message: str, hint: str) -> None:
    one_line = " ".join(message.split())  # a multi-line message on one line
    print(f"{PROG}: error: {one_line} (hint: {hint})", file=sys.stderr)


def _checked(check: Callable[[], object], command: str) -> None:
    """Run an option check; its InvalidArgumentError becomes a UsageError (exit 2)."""
    try:
        check()
    except InvalidArgumentError as e:
        option = str(e).split(maxsplit=1)[0].rstrip(":")
        hint = OPTION_HINTS.get(option, f"see `{PROG} {command} --help`")
        raise UsageError(str(e), hint) from e


def _device(args: argparse.Namespace) -> str:
    return args.device or ("cuda" if torch.cuda.is_available() else "cpu")


def _info(args: argparse.Namespace) -> int:
    print(f"{PROG} {__version__}, torch {torch.__version__}")
    print(f"cuda: {torch.cuda.is_available()}")
    for i in range(torch.cuda.device_count() if torch.cuda.is_available() else 0):
        print(f"  cuda:{i}: {torch.cuda.get_device_name(i)}")
    return 0


def _demo(args: argparse.Namespace) -> int:
    from . import demo

    cfg = demo.DemoConfig(
        num_requests=args.requests,
        max_tokens=args.max_tokens,
        batch_size=args.batch_size,
        page_size=args.page_size,
        num_pages=args.pages,
        seed=args.seed,
        temperature=args.temperature,
        top_p=args.top_p,
        device=_device(args),
        model=args.model or _default_model(),
        enforce_eager=args.enforce_eager,
    )
    _checked(lambda: demo.check_config(cfg, DEMO_OPTIONS), "demo")
    demo.run_demo(cfg)
    return 0


def _generate(args: argparse.Namespace) -> int:
    from . import demo

    dev = _device(args)
    model = args.model or _default_model()

    def check() -> None:
        demo.check_model_dir(model, "--model")
        demo.check_device(dev, "--device")
        if not args.prompt:
            raise InvalidArgumentError("--prompt: expected some text, got ''")
        demo.check_count(args.max_tokens, "--max-tokens")
        demo.check_float(args.temperature, "--temperature", 0.0, 100.0, low_open=False)
        demo.check_float(args.top_p, "--top-p", 0.0, 1.0, low_open=True)
        demo.check_count(args.top_k, "--top-k", -1)
        demo.check_count(args.seed, "--seed", 0, demo.MAX_SEED)
        if "" in args.stop:
            raise InvalidArgumentError("--stop: expected some text, got ''")

    _checked(check, "generate")
    from .engine import LLM, SamplingParams

    device = torch.device(dev)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    from .models import ModelConfig

    # One request of the model's whole length (the default pool on a GPU is most of its memory).
    pages = math.ceil(ModelConfig.from_hf(model).max_position_embeddings / 16)
    llm = LLM(model, device=device, dtype=dtype, page_size=16, num_pages=pages, seed=args.seed,
              enforce_eager=args.enforce_eager)  # fmt: skip
    params = SamplingParams(
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        seed=args.seed,
        stop=args.stop,
    )
    out = sys.stdout
    if not args.no_echo:
        out.write(args.prompt)
        out.flush()
    last = None
    t0 = time.perf_counter()
    for last in llm.stream([args.prompt], params):
        out.write(last.outputs[0].new_text or "")
        out.flush()
    wall = time.perf_counter() - t0
    out.write("\n")
    out.flush()
    if last is not None:
        m, n = last.metrics, len(last.outputs[0].token_ids)
        tpot = f", TPOT {1e3 * m.tpot:.1f} ms" if m.tpot is not None else ""
        print(
            f"[{n} tokens ({last.outputs[0].finish_reason}) in {wall:.2f} s on {device}: "
            f"TTFT {1e3 * (m.ttft or 0):.1f} ms{tpot}, {n / wall:.1f} tokens/s]",
            file=sys.stderr,
        )
    return 0


def _bench_serve(args: argparse.Namespace) -> int:
    from . import demo

    cfg = demo.BenchConfig(
        model=args.model or _default_model(),
        device=_device(args),
        num_requests=args.requests,
        prompt_mean=args.prompt_mean,
        output_mean=args.output_mean,
        request_rate=args.request_rate,
        page_size=args.page_size,
        num_pages=args.pages,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        seed=args.seed,
        out=args.out,
        plot=not args.no_plot,
        enforce_eager=args.enforce_eager,
        top_p=args.top_p,
    )
    _checked(lambda: demo.check_bench_config(cfg, BENCH_OPTIONS), "bench-serve")
    demo.run_bench_serve(cfg)
    return 0


if __name__ == "__main__":
    sys.exit(main())
