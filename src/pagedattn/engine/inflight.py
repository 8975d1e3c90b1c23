"""`InFlightStep`: a committed step whose sampled tokens are still on the device.

The engine's overlapped mode (`LLMEngine(async_scheduling=True)`, llm_engine.py) commits a step
with its samples deferred and schedules the next one before the tokens reach the host. This
object holds what links the two:
- `seqs`: the requests that sample, in the order of `sampled` ([len(seqs)] int64 on the step's
  device);
- at construction, on CUDA, a non-blocking copy of `sampled` into pinned host memory and an
  event after it, so reading the tokens (`tokens()`) waits for this step's work only, not for a
  step queued after it;
- `feed(inputs, seqs, device)`: the next step's input tokens that are deferred (a decode whose
  input is this step's sample, `Sequence.has_deferred`) are written into its device
  `input_ids` from `sampled` (one index copy on the stream, after this step's sampling), so the
  next step never waits for the host.
"""

from __future__ import annotations

import numpy as np
import torch

from ..cache.buffers import host_to_device
from .sequence import Sequence
from .step_inputs import StepInputs


class InFlightStep:
    def __init__(self, seqs: list[Sequence], sampled: torch.Tensor) -> None:
        self.seqs = seqs
        self.sampled = sampled
        self._host = sampled
        self._event = None
        if sampled.device.type == "cuda":
            self._host = torch.empty(sampled.shape, dtype=sampled.dtype, pin_memory=True)
            self._host.copy_(sampled, non_blocking=True)
            self._event = torch.cuda.Event()
            self._event.record()

    def tokens(self) -> list[int]:
        """The sampled tokens on the host (waits for them)."""
        if self._event is not None:
            self._event.synchronize()
        return self._host.tolist()

    def feed(self, inputs: StepInputs, seqs: list[Sequence], device: torch.device) -> None:
        """Fill `inputs.input_ids` at the rows of `seqs` (the next step's batch, in order)
        whose input token is deferred: each one is the last (and only) new token of a decode,
        at its row offset, and takes this step's sample of the same request."""
        row = {s.request_id: k for k, s in enumerate(self.seqs)}
        offsets = inputs.host.q_row_offsets
        dst = [int(offsets[i]) for i, s in enumerate(seqs) if s.has_deferred]
        if not dst:
            return
        src = [row[s.request_id] for s in seqs if s.has_deferred]
        idx = host_to_device(np.asarray(dst + src, np.int64), device)
        n = len(dst)
        inputs.input_ids.index_copy_(0, idx[:n], self.sampled[idx[n:]])


__all__ = ["InFlightStep"]
