"""Sampling on the device: greedy, temperature, top-k, top-p, reproducible per request.

For row i of `logits [n, V]` with the request's parameters:
- temperature 0: argmax of the logits (greedy; ties go to the lowest token id);
- otherwise l = logits / temperature; top-k keeps the k largest of l (k = 0: all); top-p then
  keeps token j iff the probability mass (softmax over the tokens top-k kept) of the tokens
  with a larger l is < top_p (the smallest head of the ranking whose mass reaches top_p; the
  most likely token always stays); tokens of equal l are kept or dropped together
  (`ops.fused.reference.top_k_top_p_keep`); the token is drawn from softmax(l) over the kept
  tokens.

The draw is the Gumbel-max trick, argmax_j(l_j + g_j), with g_j = -log(-log(u_j)) and u_j a
counter-based uniform: a hash of (the request's 64-bit seed, the index of the token being
generated, j). No generator state exists anywhere, so a request's samples depend only on its
seed and its own logits: the same seed gives the same tokens whatever else shares the batch,
after a preemption, and on any device (integer math only; the hash is murmur3's 32-bit
finalizer, with products kept below 2**63 by 16-bit halves so int64 never overflows).

On CUDA a call is one fused pass over [n, V] (`ops.fused.sample_rows`: scaling, noise and
argmax; H200, 64 x 128256 logits, measured in docs/performance.md), after a launch that finds
each row's top-k / top-p threshold without sorting it when some row uses them (a sort of
every row before: docs/performance.md); all-greedy batches are a single argmax. The CPU runs
the reference's passes. No host sync, no data-dependent shape.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from ..ops.fused import argmax_rows, sample_rows, warm_up_sampling
from ..ops.fused.reference import uniform_noise
from .sampling_params import SamplingParams


@dataclass
class SamplingTensors:
    """Per-row sampling parameters on the device (one row per logits row)."""

    # None when every row is greedy (`all_greedy`): no host-to-device copies for them.
    temperature: torch.Tensor | None  # [n] float32, 0 = greedy
    top_k: torch.Tensor | None  # [n] int64, in [1, V] (V: off)
    top_p: torch.Tensor | None  # [n] float32, inf = off
    seeds: torch.Tensor | None  # [n] int64
    counters: torch.Tensor | None  # [n] int64: index of the token being generated
    all_greedy: bool
    any_top_k: bool
    any_top_p: bool

    @classmethod
    def build(
        cls,
        params: Sequence[SamplingParams],
        seeds: Iterable[int],
        counters: Iterable[int],
        vocab: int,
        device: str | torch.device,
        stage: Callable[[list[np.ndarray]], list[torch.Tensor]] | None = None,
    ) -> SamplingTensors:
        """From each row's SamplingParams, its request's seed (an int in [0, 2**63)) and the
        number of tokens the request generated so far (`seeds` and `counters` may be lazy
        iterables: an all-greedy batch never reads them). stage: puts host arrays on
        `device` (the engine's `cache.buffers.StagingRing.stage`: one pinned, non-blocking
        copy); None: a copy each (`Tensor.to`, which on CUDA waits for the stream's queued
        work: the overlapped engine's next step would wait for the one running)."""
        temp = [p.temperature for p in params]
        if not any(t > 0 for t in temp):  # all greedy: `sample` takes the argmax alone
            return cls(None, None, None, None, None, True, False, False)
        top_k = [p.top_k if 0 < p.top_k < vocab else vocab for p in params]
        top_p = [p.top_p if p.top_p < 1.0 else float("inf") for p in params]
        sampled = [t > 0 for t in temp]
        host = [
            np.array(temp, np.float32),
            np.array(top_k, np.int64),
            np.array(top_p, np.float32),
            np.fromiter(seeds, np.int64, len(temp)),
            np.fromiter(counters, np.int64, len(temp)),
        ]
        if stage is not None:
            dev = stage(host)
        else:
            dev = [torch.from_numpy(a).to(device) for a in host]
        return cls(
            *dev,
            all_greedy=not any(sampled),
            any_top_k=any(k < vocab for k, s in zip(top_k, sampled) if s),
            any_top_p=any(p != float("inf") for p, s in zip(top_p, sampled) if s),
        )


def warm_up(vocab: int, device: str | torch.device) -> None:
    """Compile `sample`'s kernels for logits of `vocab` columns on `device` (the engine's
    start-up on CUDA: its first served step compiled the argmax otherwise, a stall of seconds
    in the middle of serving): `ops.fused.warm_up_sampling`, whose kernels every float32
    [n, vocab] logits of a step share (contiguous rows; n in the grid)."""
    warm_up_sampling(vocab, device)


def sample(logits: torch.Tensor, st: SamplingTensors) -> torch.Tensor:
    """One token per row of `logits` [n, V] (float32) -> [n] int64, on logits' device: one
    `ops.fused.sample_rows` call (on CUDA one pass over the logits: scaling, noise and argmax
    fused; with top-k / top-p a launch finding each row's keep threshold before it), or the
    argmax alone when every row is greedy."""
    if st.all_greedy or logits.shape[0] == 0:
        return argmax_rows(logits)  # torch.argmax's rule; one pass over the rows on CUDA
    # both or neither (rows without them pass k = V, p = inf): one kernel form to compile
    filt = st.any_top_k or st.any_top_p
    return sample_rows(
        logits,
        st.temperature,
        st.seeds,
        st.counters,
        top_k=st.top_k if filt else None,
        top_p=st.top_p if filt else None,
    )


__all__ = ["SamplingTensors", "sample", "uniform_noise"]
