"""What `LLM.generate` returns and `LLM.stream` yields (vLLM's shapes).

`RequestOutput.outputs[0]` is a `CompletionOutput`: the generated `token_ids` and their `text`
so far (cumulative; `token_ids` is the request's own list of known tokens, shared by all its
outputs and growing as it generates, so a streaming step copies nothing: read it, copy it to
keep a snapshot), `new_token_ids` / `new_text` (what this step added: the streaming delta),
and `finish_reason` ("stop": a stop or end-of-sequence token, kept as the last token, or a
stop string, which the text ends before (`SamplingParams.stop`); "length":
max_tokens, or max_model_len reached; None while running). `RequestMetrics` times a request
with `time.perf_counter()` seconds.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class RequestMetrics:
    """Timestamps (perf_counter seconds) and counts of one request.

    ttft: arrival -> first generated token; tpot: mean time per output token after the first;
    e2e: arrival -> finish. prefix_hit_tokens: prompt tokens served by the prefix cache at the
    first admission; num_preemptions: how often it was preempted (freed and recomputed).
    """

    arrival_time: float
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    last_token_time: float | None = None
    finish_time: float | None = None
    num_prompt_tokens: int = 0
    num_generated_tokens: int = 0
    prefix_hit_tokens: int = 0
    num_preemptions: int = 0

    @property
    def ttft(self) -> float | None:
        if self.first_token_time is None:
            return None
        return self.first_token_time - self.arrival_time

    @property
    def tpot(self) -> float | None:
        n = self.num_generated_tokens
        if self.first_token_time is None or self.last_token_time is None or n < 2:
            return None
        return (self.last_token_time - self.first_token_time) / (n - 1)

    @property
    def e2e(self) -> float | None:
        return None if self.finish_time is None else self.finish_time - self.arrival_time


@dataclass
class CompletionOutput:
    index: int
    token_ids: list[int]
    text: str | None
    finish_reason: str | None = None
    stop_reason: int | str | None = None  # the stop token or string (finish_reason "stop")
    new_token_ids: list[int] = field(default_factory=list)
    new_text: str | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestOutput:
    request_id: int
    prompt: str | None
    # The request's own list, shared by all its outputs (not copied each step): read it, do
    # not change it.
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    metrics: RequestMetrics


__all__ = ["CompletionOutput", "RequestMetrics", "RequestOutput"]
