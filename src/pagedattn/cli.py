"""Command line: `pagedattn demo` (the main job) and `pagedattn info`."""

from __future__ import annotations

import argparse
import sys

import torch


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="pagedattn")
    sub = ap.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("demo", help="serve a stream of requests through the paged cache")
    d.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    d.add_argument("--requests", type=int, default=48)
    d.add_argument("--batch-size", type=int, default=8)
    d.add_argument("--page-size", type=int, default=16)
    d.add_argument("--pages", type=int, default=72)
    d.add_argument("--seed", type=int, default=0)
    sub.add_parser("info", help="versions and devices")
    args = ap.parse_args(argv)
    if args.cmd == "info":
        import pagedattn

        print(f"pagedattn {pagedattn.__version__}, torch {torch.__version__}")
        print(f"cuda: {torch.cuda.is_available()}")
        return 0
    from .demo import DemoConfig, run_demo

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    cfg = DemoConfig(
        num_requests=args.requests,
        batch_size=args.batch_size,
        page_size=args.page_size,
        num_pages=args.pages,
        seed=args.seed,
        device=device,
    )
    run_demo(cfg)
    return 0


if __name__ == "__main__":
    sys.exit(main())
