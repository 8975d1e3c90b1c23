"""`LLM`: the vLLM-shaped offline API over `LLMEngine`.

    from pagedattn.engine import LLM, SamplingParams
    llm = LLM("ckpt/", page_size=16, max_num_batched_tokens=2048)
    outs = llm.generate(["Hello", {"prompt_token_ids": [1, 2, 3]}], SamplingParams(max_tokens=32))
    outs[0].outputs[0].text, outs[1].outputs[0].token_ids
    for out in llm.stream(prompts, params):   # one RequestOutput per request and step
        print(out.request_id, out.outputs[0].new_text, out.finished)

Both validate (and tokenize) every prompt before queuing any: a bad one raises with nothing
queued. If a step raises, or the caller stops iterating a stream, the call's own unfinished
requests are aborted (pages freed) and the engine stays usable. Other requests in the engine
(`add_request`) advance with the call's steps; their outputs come from `step()` only.
"""

from __future__ import annotations

from collections.abc import Iterator
from collections.abc import Sequence as SequenceABC

from ..errors import InvalidArgumentError
from .llm_engine import LLMEngine, Prompt
from .outputs import RequestOutput
from .sampling_params import SamplingParams
from .sequence import Sequence


class LLM(LLMEngine):
    """`LLMEngine` plus `generate` and `stream` (module docstring; arguments: LLMEngine)."""

    def _queue_all(
        self,
        prompts: Prompt | SequenceABC[Prompt],
        sampling_params: SamplingParams | SequenceABC[SamplingParams] | None,
    ) -> list[Sequence]:
        if isinstance(prompts, (str, dict)) or (
            isinstance(prompts, (list, tuple)) and prompts and isinstance(prompts[0], int)
        ):
            prompts = [prompts]
        prompts = list(prompts)
        if sampling_params is None or isinstance(sampling_params, SamplingParams):
            params = [sampling_params] * len(prompts)
        else:
            params = list(sampling_params)
            if len(params) != len(prompts):
                raise InvalidArgumentError(
                    f"sampling_params: expected one SamplingParams or {len(prompts)} of them, "
                    f"got {len(params)}"
                )
        seqs = [self._new_sequence(p, sp) for p, sp in zip(prompts, params)]  # may raise
        for s in seqs:
            self._enqueue(s)
        return seqs

    def _abort_unfinished(self, seqs: list[Sequence]) -> None:
        for s in seqs:
            if not s.finished and s.request_id in self._seqs:
                self.abort_request(s.request_id)

    def generate(
        self,
        prompts: Prompt | SequenceABC[Prompt],
        sampling_params: SamplingParams | SequenceABC[SamplingParams] | None = None,
    ) -> list[RequestOutput]:
        """Every prompt's finished output, in the order of `prompts`."""
        seqs = self._queue_all(prompts, sampling_params)
        try:
            while any(not s.finished for s in seqs):
                self._step()
        except BaseException:
            self._abort_unfinished(seqs)
            raise
        return [self._output(s, delta=False) for s in seqs]

    def stream(
        self,
        prompts: Prompt | SequenceABC[Prompt],
        sampling_params: SamplingParams | SequenceABC[SamplingParams] | None = None,
    ) -> Iterator[RequestOutput]:
        """Yield, after each step, a `RequestOutput` for each of these requests that got a
        token: `outputs[0].new_token_ids` / `new_text` are the step's delta, `token_ids` /
        `text` the output so far, `finished` marks its last one. The prompts are queued at
        the call (not at the first `next`)."""
        seqs = self._queue_all(prompts, sampling_params)
        return self._stream(seqs)

    def _stream(self, seqs: list[Sequence]) -> Iterator[RequestOutput]:
        mine = {s.request_id for s in seqs}
        try:
            while any(not s.finished for s in seqs):
                for s in self._step():
                    if s.request_id in mine:
                        yield self._output(s, delta=True)
        finally:
            self._abort_unfinished(seqs)


__all__ = ["LLM"]
