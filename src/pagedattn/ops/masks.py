"""Attention masks. Positions are absolute: a ragged query i of request b sits at
`cache_length(b) + i`, and key j at j.

| kind                         | key j visible to query at position q          |
|------------------------------|-----------------------------------------------|
| null                         | always (j < number of keys)                   |
| causal                       | j <= q                                        |
| sliding_window_causal(W)     | q - W < j <= q          (W keys, itself too)  |
| sliding_window_noncausal(W)  | |q - j| < W                                   |
| chunked_causal(C)            | j <= q and j // C == q // C                    |
| tensor(t)                    | t[query row, j] (bool [total_q, max_keys])    |
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import INT32_MAX, check, check_int

MASK_CODES = {
    "null": 0,
    "causal": 1,
    "sliding_window_causal": 2,
    "sliding_window_noncausal": 3,
    "chunked_causal": 4,
    "tensor": 5,
}


@dataclass(frozen=True, eq=False)
class Mask:
    """A mask kind with its parameter. Build with the module's constructors."""

    kind: str = "causal"
    window: int = 0
    chunk: int = 0
    tensor: torch.Tensor | None = None

    def __post_init__(self) -> None:
        check(self.kind in MASK_CODES, "mask.kind", f"one of {list(MASK_CODES)}", self.kind)
        if self.kind.startswith("sliding"):
            object.__setattr__(self, "window", check_int("mask.window", self.window, 1, INT32_MAX))
        if self.kind == "chunked_causal":
            object.__setattr__(self, "chunk", check_int("mask.chunk", self.chunk, 1, INT32_MAX))
        if self.kind == "tensor":
            t = self.tensor
            check(
                isinstance(t, torch.Tensor) and t.ndim == 2 and t.dtype == torch.bool,
                "mask.tensor",
                "a bool [total_q, max_keys] tensor",
                None if t is None else f"{tuple(t.shape)} {t.dtype}",
            )

    @property
    def code(self) -> int:
        """Integer id for kernels (a constexpr)."""
        return MASK_CODES[self.kind]

    @property
    def param(self) -> int:
        """W or C for kernels (0 when unused)."""
        return self.window or self.chunk

    def allowed(
        self, q_pos: torch.Tensor, k_pos: torch.Tensor, q_rows: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Bool [..., Nq, Nk] from absolute positions q_pos [Nq, 1] and k_pos [1, Nk].
        `q_rows` ([Nq, 1] global query rows) is needed for a tensor mask."""
        k = self.kind
        if k == "null":
            return torch.ones(
                torch.broadcast_shapes(q_pos.shape, k_pos.shape),
                dtype=torch.bool,
                device=q_pos.device,
            )
        if k == "causal":
            return k_pos <= q_pos
        if k == "sliding_window_causal":
            return (k_pos <= q_pos) & (k_pos > q_pos - self.window)
        if k == "sliding_window_noncausal":
            return (k_pos - q_pos).abs() < self.window
        if k == "chunked_causal":
            return (k_pos <= q_pos) & (k_pos // self.chunk == q_pos // self.chunk)
        t = self.tensor
        kk = k_pos.clamp(max=t.shape[1] - 1)
        return t[q_rows, kk] & (k_pos < t.shape[1])


def null() -> Mask:
    return Mask("null")


def causal() -> Mask:
    return Mask("causal")


def sliding_window_causal(window: int) -> Mask:
    return Mask("sliding_window_causal", window=window)


def sliding_window_noncausal(window: int) -> Mask:
    return Mask("sliding_window_noncausal", window=window)


def chunked_causal(chunk: int) -> Mask:
    return Mask("chunked_causal", chunk=chunk)


def tensor_mask(t: torch.Tensor) -> Mask:
    return Mask("tensor", tensor=t)
