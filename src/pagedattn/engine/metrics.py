"""`EngineStats`: counters of an engine since it was built (or `LLM.reset_stats()`), for the
demo and benchmarks. Per-request timings are in each `RequestOutput.metrics`."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class EngineStats:
    """num_steps: model steps run (failed ones excluded); step_time_s: their wall time (schedule,
    inputs, forward, sampling, commit); prompt_tokens: prompt (and recomputed) tokens run;
    generated_tokens: tokens sampled; prefix_query_tokens / prefix_hit_tokens: tokens of each
    admission and how many the prefix cache served; preemptions; finished_requests;
    total_pages / used_pages (now) / peak_used_pages of the KV cache; deduplicated_pages:
    prefix pages computed twice in flight and merged at commit (cache/manager.py)."""

    num_steps: int = 0
    step_time_s: float = 0.0
    prompt_tokens: int = 0
    generated_tokens: int = 0
    prefix_query_tokens: int = 0
    prefix_hit_tokens: int = 0
    preemptions: int = 0
    finished_requests: int = 0
    failed_steps: int = 0
    total_pages: int = 0
    used_pages: int = 0
    peak_used_pages: int = 0
    deduplicated_pages: int = 0

    @property
    def prefix_hit_rate(self) -> float:
        q = self.prefix_query_tokens
        return self.prefix_hit_tokens / q if q else 0.0

    @property
    def generation_throughput(self) -> float:
        """Generated tokens per second of step time."""
        return self.generated_tokens / self.step_time_s if self.step_time_s else 0.0

    @property
    def total_throughput(self) -> float:
        """Prompt + generated tokens per second of step time."""
        t = self.step_time_s
        return (self.prompt_tokens + self.generated_tokens) / t if t else 0.0


__all__ = ["EngineStats"]
