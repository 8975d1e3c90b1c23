"""`Sequence`: the engine's record of one request, from arrival to finish.

A sequence is WAITING (not in the cache manager: never admitted, or preempted), RUNNING (claimed
in the manager: prefilling or decoding) or FINISHED. Its tokens are the prompt then the
generated tokens; `num_computed` mirrors the manager's cache length while it runs. After a
preemption the manager forgets it; it is admitted again with all its tokens as the "prompt"
(recompute; the prefix cache usually serves most of it), and generated tokens are never redrawn.

A step's sample is committed before its value is known (`DEFERRED` holds its place, the
manager's deferred token): the last token, at most one, between the step's commit and its
resolution (`fill_deferred`). Outputs show `known_output_token_ids` (without it).
"""

from __future__ import annotations

import enum
import time

from ..cache.manager import DEFERRED
from .outputs import RequestMetrics
from .sampling_params import SamplingParams


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class Sequence:
    def __init__(
        self,
        request_id: int,
        prompt_token_ids: list[int],
        params: SamplingParams,
        seed: int,
        prompt: str | None = None,
    ) -> None:
        self.request_id = request_id
        self.prompt = prompt
        self.prompt_token_ids = list(prompt_token_ids)
        self.output_token_ids: list[int] = []
        self._known: list[int] = []  # output_token_ids without a trailing DEFERRED
        self._tokens = list(prompt_token_ids)  # prompt + outputs, kept by `append_token`
        self.params = params
        self.seed = seed  # the sampler's per-request key (params.seed or one the engine drew)
        self.status = SequenceStatus.WAITING
        self.num_computed = 0  # tokens whose K/V is cached (the manager's cache_length)
        self.finish_reason: str | None = None
        self.stop_reason: int | str | None = None  # the stop token or stop string
        self.text_end: int | None = None  # where a stop string cuts the output text
        self.metrics = RequestMetrics(
            arrival_time=time.perf_counter(), num_prompt_tokens=len(prompt_token_ids)
        )
        self.text_sent = ""  # detokenized text returned so far (streaming deltas)
        self.text_held = ""  # decoded after text_sent, held back (`SamplingParams.stop_hold`)
        # incremental detokenization: the window [start, read) of output tokens decoded for
        # the previous delta (llm_engine.py, `_text_delta`)
        self.detok_offsets = (0, 0)

    @property
    def tokens(self) -> list[int]:
        """Every known token: the prompt, then the generated ones (the sequence's own list,
        not a copy: read it, do not change it)."""
        return self._tokens

    @property
    def num_tokens(self) -> int:
        return len(self._tokens)

    def append_token(self, tok: int) -> None:
        """A generated token (the scheduler's commit of a sample; `DEFERRED` before its value
        is known)."""
        self.output_token_ids.append(tok)
        self._tokens.append(tok)
        if tok != DEFERRED:
            self._known.append(tok)

    def fill_deferred(self, tok: int) -> None:
        """The value of the deferred last token."""
        self.output_token_ids[-1] = tok
        self._tokens[-1] = tok
        self._known.append(tok)

    @property
    def has_deferred(self) -> bool:
        return self._tokens[-1] == DEFERRED

    @property
    def known_output_token_ids(self) -> list[int]:
        """The generated tokens whose values are known: the sequence's own list, which only
        grows (not a copy: an output of every step shares it, so a step costs no copy of a
        long generation; read it, do not change it)."""
        return self._known

    @property
    def num_pending(self) -> int:
        """Known tokens not cached yet: a prompt's rest, or 1 (the last sample) when decoding."""
        return len(self._tokens) - self.num_computed

    @property
    def is_decode(self) -> bool:
        return len(self._tokens) - self.num_computed == 1 and bool(self.output_token_ids)

    @property
    def finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    def __repr__(self) -> str:
        return (
            f"Sequence({self.request_id}, {self.status.value}, prompt={len(self.prompt_token_ids)}"
            f", out={len(self.output_token_ids)}, computed={self.num_computed})"
        )


__all__ = ["Sequence", "SequenceStatus"]
