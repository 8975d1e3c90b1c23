"""`InFlightStep`: a committed step whose sampled tokens are still on the device.

The engine's overlapped mode (`LLMEngine(async_scheduling=True)`, llm_engine.py) commits a step
with its samples deferred and schedules the next one before the tokens reach the host. This
object holds what links the two:
- `seqs`: the requests that sample, in the order of `sampled` ([len(seqs)] int64 on the step's
  device);
- at construction, a copy of `sampled`, which may be a view of the decode graphs' tokens that
  the next replay overwrites: on CUDA a non-blocking copy into pinned host memory, queued
  before that replay (a slot of the engine's `TokenRing`, reused: pinning a fresh buffer a
  step cost the H200 host ~150 us of a 1.5 ms Llama-3.2-1B b64 step,
  `dev/profile_engine_step.py`) and an event after it, so reading the tokens (`tokens()`)
  waits for this step's work only, not for a step queued after it; elsewhere a copy at once;
- where the next step is a decode replay and `sampled` those tokens, the replay's first kernel
  takes its deferred inputs from them (`cuda_graphs.StepStaging`); otherwise:
- `deferred_rows(seqs)` / `feed(inputs)`: the next step's input tokens that are deferred (a
  decode whose input is this step's sample, `Sequence.has_deferred`) are written into its
  device `input_ids` from `sampled` (one index copy on the stream, after this step's sampling;
  the rows travel with the step's other arrays), so the next step never waits for the host.
"""

from __future__ import annotations

from itertools import repeat

import numpy as np
import torch

from .sequence import Sequence
from .step_inputs import StepInputs


class TokenRing:
    """Pinned host buffers and events for the sampled tokens of the steps in flight (CUDA),
    `depth` slots used in turn. A slot is handed to a new step only after its previous step's
    tokens were read: `claim` reads them first (into that step's `tokens()` cache) when they
    were not, so no step's tokens are ever overwritten, whatever the depth."""

    def __init__(self, depth: int = 4) -> None:
        self._slots: list[list] = [[None, None, None] for _ in range(depth)]  # buf, event, owner
        self._next = 0

    def claim(self, owner: InFlightStep, n: int) -> tuple[torch.Tensor, torch.cuda.Event]:
        """(a pinned int64 host buffer of n elements, an event) for `owner`'s tokens."""
        slot = self._slots[self._next]
        self._next = (self._next + 1) % len(self._slots)
        if slot[2] is not None:
            slot[2].tokens()
        if slot[0] is None or slot[0].numel() < n:
            slot[0] = torch.empty(max(n, 256), dtype=torch.int64, pin_memory=True)
            slot[1] = torch.cuda.Event()
        slot[2] = owner
        return slot[0][:n], slot[1]


class InFlightStep:
    def __init__(self, seqs: list[Sequence], sampled: torch.Tensor, ring: TokenRing | None = None):
        """ring: the engine's pinned buffers (on CUDA; None: a fresh pinned buffer)."""
        self.seqs = seqs
        self.sampled = sampled
        # (a copy: `sampled` may be a view of the decode graphs' tokens, which the next
        # replay overwrites; on CUDA the copy is queued before that replay)
        self._host = sampled.clone() if sampled.device.type != "cuda" else sampled
        self._event = None
        self._tokens: list[int] | None = None
        if sampled.device.type == "cuda":
            n = sampled.shape[0]
            if ring is not None and sampled.dtype == torch.int64 and sampled.dim() == 1:
                self._host, self._event = ring.claim(self, n)
            else:
                self._host = torch.empty(sampled.shape, dtype=sampled.dtype, pin_memory=True)
                self._event = torch.cuda.Event()
            self._host.copy_(sampled, non_blocking=True)
            self._event.record()

    def tokens(self) -> list[int]:
        """The sampled tokens on the host (waits for them; read once)."""
        if self._tokens is None:
            if self._event is not None:
                self._event.synchronize()
            self._tokens = self._host.tolist()
        return self._tokens

    def deferred_rows(self, seqs: list[Sequence]) -> np.ndarray:
        """The next step's deferred inputs (its batch `seqs`, in order), [k, 2] int64: (batch
        index in `seqs`, row of `sampled`) for each request whose input token is this step's
        sample (`Sequence.has_deferred`: a decode's last and only new token). Those are the
        requests of `seqs` that sampled in this step (`self.seqs`): until this step is
        resolved, its samples are the only deferred tokens, and each is its request's input
        in the next step (the one token it has not cached)."""
        row = dict(zip(self.seqs, range(len(self.seqs))))
        src = np.fromiter(map(row.get, seqs, repeat(-1)), np.int64, len(seqs))
        idx = np.flatnonzero(src >= 0)
        pairs = np.empty((len(idx), 2), np.int64)
        pairs[:, 0], pairs[:, 1] = idx, src[idx]
        return pairs

    @torch.inference_mode()  # (staged inputs are views of the decode graphs' static buffers)
    def feed(self, inputs: StepInputs) -> None:
        """Fill the next step's device `input_ids` at its deferred rows (`inputs.deferred`,
        staged with its other arrays by `build_step_inputs` from `deferred_rows`) with this
        step's samples: one index copy on the stream, after this step's sampling."""
        idx = inputs.deferred
        if idx is None or idx.shape[0] == 0:
            return
        n = idx.shape[0] // 2
        inputs.input_ids.index_copy_(0, idx[:n], self.sampled[idx[n:]])


__all__ = ["InFlightStep", "TokenRing"]
