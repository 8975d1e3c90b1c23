"""cuBLAS (torch's F.linear) at a decode step's projection shapes, weights streamed from HBM (R
copies in turn inside one CUDA graph), us a call and its fraction of the copy roofline; run
under different cuBLAS settings (e.g. CUBLASLT_WORKSPACE_SIZE in KiB, set before the process
starts, or BLAS=cublaslt: torch.backends.cuda.preferred_blas_library) to see whether the
library's choice changes; HOT=1 times one L2-resident weight instead. MODES (comma list, in one
process): linear (F.linear), addmm (torch.addmm with a zero bias: cuBLASLt's bias epilogue),
lt (F.linear with cuBLASLt preferred, then the default again).
    python dev/cublas_shapes.py [M ...]
"""

from __future__ import annotations

import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import copy_bandwidth  # noqa: E402
from devtools import graph_us_per_call  # noqa: E402

SHAPES = {  # (N, K): Llama-3.2-1B and Llama-3-8B projections
    "1b_qkv": (3072, 2048), "1b_o": (2048, 2048), "1b_gate_up": (16384, 2048),
    "1b_down": (2048, 8192), "8b_qkv": (6144, 4096), "8b_o": (4096, 4096),
    "8b_gate_up": (28672, 4096), "8b_down": (4096, 14336),
}  # fmt: skip
MORE = {  # SHAPES=more: other checkpoints' MLP projections (Qwen3-8B, Qwen2.5-7B, a 70B TP-2 slice)
    "q3_8b_down": (4096, 12288), "q3_8b_gate_up": (24576, 4096), "q25_7b_down": (3584, 18944),
    "70b_tp2_down": (8192, 14336), "70b_tp2_gate_up": (28672, 8192),
}  # fmt: skip


def main() -> None:
    ms = [int(m) for m in sys.argv[1:]] or [64]
    dev = torch.device("cuda")
    bw = copy_bandwidth()
    tag = os.environ.get("CUBLASLT_WORKSPACE_SIZE", "default")
    if os.environ.get("BLAS"):
        torch.backends.cuda.preferred_blas_library(os.environ["BLAS"])
        tag = os.environ["BLAS"]
    shapes = {**SHAPES, **MORE} if os.environ.get("SHAPES") == "more" else SHAPES
    for name, (N, K) in shapes.items():
        R = max(2, -(-512 * 2**20 // (N * K * 2)))
        ws = [torch.randn(N, K, device=dev, dtype=torch.bfloat16) for _ in range(R)]
        if os.environ.get("HOT"):  # one weight R times: L2-resident after its first call
            ws = ws[:1] * R
        zero = torch.zeros(N, device=dev, dtype=torch.bfloat16)
        for M in ms:
            x = torch.randn(M, K, device=dev, dtype=torch.bfloat16)
            floor = (N * K + M * K + M * N) * 2 / bw / 1e3
            tag = f"{tag} hot" if os.environ.get("HOT") and not tag.endswith("hot") else tag
            for mode in os.environ.get("MODES", "linear").split(","):
                if mode == "addmm":
                    fn = lambda w, x=x: torch.addmm(zero, x, w.t())  # noqa: E731
                else:
                    fn = lambda w, x=x: F.linear(x, w)  # noqa: E731
                if mode == "lt":
                    torch.backends.cuda.preferred_blas_library("cublaslt")
                us = graph_us_per_call(fn, ws, rounds=11)
                if mode == "lt":
                    torch.backends.cuda.preferred_blas_library("default")
                print(f"workspace {tag:>8} {mode:6s} {name:11s} M{M:<4d} {us:7.2f} us  "
                      f"{floor / us:.2f} of copy")  # fmt: skip
        del ws


if __name__ == "__main__":
    main()
