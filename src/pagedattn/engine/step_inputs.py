"""The inputs of one model step, built in one place from the manager's state.

`build_step_inputs(manager, requests, device)` takes, for each request of the step in batch
order, `(request_id, tokens, num_new_tokens)`: every token the request knows (prompt, then
samples) and how many of those after its cached prefix run this step. `alloc` must have
reserved them. It returns a `StepInputs`:

- input_ids [T] int64: the step's tokens, request after request (`tokens[cl : cl + n]`, where
  cl is the request's `cache_length`);
- positions [T] int64: `cl + i`, the same cache lengths `runtime_inputs` puts into kv_inputs
  (RoPE and attention then agree);
- q_row_offsets [b + 1] int32: prefix sums of the new tokens per request;
- slots [T] int64: each new token's row in the paged cache,
  `page * page_size + position % page_size` with page = the request's page `position //
  page_size` (for fused store kernels; the models derive the same rows from kv_inputs);
- logits_rows [n] int64: the last row of each request whose chunk completes its known tokens
  (a decode or a prompt's last chunk), and `sample_index`, the batch index of each such row;
- kv_inputs: `manager.runtime_inputs(request_ids)`, one `KVCacheInputsPerDevice` per device;
- num_decodes: how many requests lead the batch with one new token each (the scheduler
  orders decodes first): the models pass it to `mha` (`num_decodes`), which then runs them on
  the decode kernel and the chunks on the prefill kernel;
- plan: None (`ModelRunner` makes the step's attention `StepPlan` from `host.cache_lengths`
  for an eager step; docs/ops.md, "The step's plan").

The host arrays and the manager's cache inputs are packed into one buffer and copied to the
device once (`manager.runtime_inputs_staged`, staged in pinned memory on CUDA,
`cache.buffers.hosts_to_device`: the host does not wait for the stream). A pure decode step
that the CUDA decode graphs serve is instead staged straight into their static buffers
(`build_step_inputs(..., graphs=)`, `cuda_graphs.GraphRunner.stage_step`: one copy, and the
graph's first kernel unpacks it); its tensors are then views of those buffers and `slots` is
None.
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from ..cache.buffers import hosts_to_device
from ..cache.inputs import KVCacheInputsPerDevice
from ..cache.manager import PagedKVCacheManager
from ..errors import InvalidArgumentError


@dataclass
class HostStepInputs:
    """The step's index arrays on the host (numpy), before the copy to the device."""

    input_ids: np.ndarray
    positions: np.ndarray
    slots: np.ndarray
    q_row_offsets: np.ndarray
    logits_rows: np.ndarray
    cache_lengths: list[int]
    sample_index: list[int]


@dataclass
class StepInputs:
    request_ids: list[Hashable]
    num_new_tokens: list[int]
    input_ids: torch.Tensor
    positions: torch.Tensor
    q_row_offsets: torch.Tensor
    slots: torch.Tensor | None
    logits_rows: torch.Tensor
    sample_index: list[int]
    kv_inputs: list[KVCacheInputsPerDevice]
    host: HostStepInputs
    plan: object | None = None
    # [2 n] int64 on the device: the rows of input_ids whose token is the previous step's
    # sample, then those samples' rows (`InFlightStep.feed`); None: no deferred input
    deferred: torch.Tensor | None = None
    # requests leading the batch with one new token each (the scheduler puts decodes first):
    # `mha`'s num_decodes hint
    num_decodes: int = 0
    # the decode graphs' `StepStaging` where the step was staged into their static buffers
    # (`GraphRunner.stage_step`: the tensors above are views of them, `slots` None); None:
    # the tensors are the step's own
    staged: object | None = None

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def batch_size(self) -> int:
        return len(self.request_ids)


def host_step_inputs(
    manager: PagedKVCacheManager, requests: Sequence[tuple[Hashable, Sequence[int], int]]
) -> HostStepInputs:
    """The host half of `build_step_inputs` (no device, no runtime_inputs); array work, one
    pass over the requests in Python (the tokens' slices)."""
    b = len(requests)
    rids = list(map(_RID, requests))
    n = np.fromiter(map(_NUM_NEW, requests), np.int64, b)
    known = np.fromiter(map(len, map(_TOKENS, requests)), np.int64, b)
    low = np.nonzero(n < 1)[0]
    cls = np.zeros(b, np.int64)
    if not low.size:
        cls, slots = manager.new_token_rows(rids, n)
    bad = np.nonzero((n < 1) | (n > known - cls))[0]
    if bad.size:
        i = int(bad[0])
        cl = manager.cache_length(rids[i])
        raise InvalidArgumentError(
            f"requests[{i}]: num_new_tokens {int(n[i])} not in [1, {int(known[i]) - cl}] "
            f"(request {rids[i]!r}: {int(known[i])} tokens known, {cl} cached)"
        )
    offsets = np.zeros(b + 1, np.int64)
    np.cumsum(n, out=offsets[1:])
    total = int(offsets[-1])
    positions = np.arange(total, dtype=np.int64) + np.repeat(cls - offsets[:-1], n)
    cl_list = cls.tolist()
    if total == b:  # one token each (n >= 1 was checked): tokens[cl]
        ids = np.fromiter(map(operator.getitem, map(_TOKENS, requests), cl_list), np.int64, b)
    else:
        ids = np.fromiter(
            itertools.chain.from_iterable(
                r[1][c : c + k] for r, c, k in zip(requests, cl_list, n.tolist())
            ),
            np.int64,
            total,
        )
    done = np.nonzero(cls + n == known)[0]
    return HostStepInputs(
        input_ids=ids,
        positions=positions,
        slots=slots if total else np.zeros(0, np.int64),
        q_row_offsets=offsets,
        logits_rows=offsets[1:][done] - 1,
        cache_lengths=cl_list,
        sample_index=done.tolist(),
    )


def build_step_inputs(
    manager: PagedKVCacheManager,
    requests: Sequence[tuple[Hashable, Sequence[int], int]],
    device: str | torch.device,
    deferred: np.ndarray | Sequence[tuple[int, int]] = (),
    graphs=None,
    deferred_source: torch.Tensor | None = None,
) -> StepInputs:
    """Everything a model step needs for `requests` (module docstring); `deferred`: (batch
    index, source row) of the inputs the previous step's samples fill on the device
    (`InFlightStep.deferred_rows`; staged with the rest as `StepInputs.deferred`). graphs:
    None, or the decode graphs (`cuda_graphs.GraphRunner`): a step they stage (`stages`: a
    pure decode of at most their largest bucket) is staged straight into their buffers
    (`stage_step`, which takes `deferred_source`, the samples `deferred` points into;
    `StepInputs.staged`). Raises InvalidArgumentError for a request without a
    fitting allocation, UnknownRequestError for one the manager does not hold."""
    host = host_step_inputs(manager, requests)
    rids = list(map(_RID, requests))
    if graphs is not None and graphs.stages(host):
        return graphs.stage_step(manager, rids, host, deferred, deferred_source)
    arrays = [host.input_ids, host.positions, host.slots, host.q_row_offsets.astype(np.int32),
              host.logits_rows]  # fmt: skip
    if len(deferred):  # each deferred input's token row (its request's offset), then its source
        pairs = np.asarray(deferred, np.int64).reshape(-1, 2)
        arrays.append(np.concatenate([host.q_row_offsets[pairs[:, 0]], pairs[:, 1]]))
    kv_inputs, staged = manager.runtime_inputs_staged(rids, arrays)
    dev = torch.device(device)
    if not _same_device(staged[0].device, dev):  # the cache lives elsewhere (unusual)
        staged = hosts_to_device(arrays, dev)
    input_ids, positions, slots, offsets, rows = staged[:5]
    return StepInputs(
        request_ids=rids,
        num_new_tokens=list(map(_NUM_NEW, requests)),
        input_ids=input_ids,
        positions=positions,
        q_row_offsets=offsets,
        slots=slots,
        logits_rows=rows,
        sample_index=host.sample_index,
        kv_inputs=kv_inputs,
        host=host,
        num_decodes=_leading_decodes(host.q_row_offsets),
        deferred=staged[5] if len(deferred) else None,
    )


def _same_device(a: torch.device, b: torch.device) -> bool:
    return a.type == b.type and (b.index is None or a.index == b.index)


def _leading_decodes(q_row_offsets: np.ndarray) -> int:
    """How many requests lead the batch with one new token each (from its [b + 1] offsets)."""
    other = np.flatnonzero(np.diff(q_row_offsets) != 1)
    return int(other[0]) if other.size else len(q_row_offsets) - 1


# The fields of a request (request_id, tokens, num_new_tokens).
_RID, _TOKENS, _NUM_NEW = operator.itemgetter(0), operator.itemgetter(1), operator.itemgetter(2)


__all__ = ["HostStepInputs", "StepInputs", "build_step_inputs", "host_step_inputs"]
