"""`SamplingParams`: how one request generates (vLLM's names and meanings).

- max_tokens: most tokens to generate (an int >= 1; default 16).
- temperature: 0 is greedy (argmax); > 0 samples from softmax(logits / temperature).
- top_k: keep the k most likely tokens (an int >= 1; 0 or -1: all).
- top_p: then keep the smallest set of most likely tokens whose probability (after temperature
  and top-k, renormalized) reaches top_p (a float in (0, 1]; 1: all).
- seed: an int in [0, 2**63) makes the request's samples reproducible whatever else is in the
  batch; None draws one from the engine's seeded generator (reproducible for the same engine
  seed and the same order of requests).
- stop_token_ids: tokens that end the request (kept as its last token, finish_reason "stop").
- ignore_eos: keep generating past the model's end-of-sequence tokens (stop_token_ids still stop).
- stop: strings that end the request once its generated text contains one (a str or a list of
  non-empty strs; the engine needs a tokenizer). The text ends before the earliest match (with
  it, under include_stop_str_in_output); `token_ids` keep every token up to the one that
  completed it; finish_reason "stop", stop_reason the string. A streamed text holds back its
  last len(longest stop) - 1 characters until they cannot start a match (as vLLM does).

Bad values raise `InvalidArgumentError` naming the field ("SamplingParams.<field>").
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..errors import INT64_MAX, check, check_bool, check_int


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = field(default=())
    ignore_eos: bool = False
    stop: tuple[str, ...] = field(default=())
    include_stop_str_in_output: bool = False

    def __post_init__(self) -> None:
        def put(name: str, v: object) -> None:
            object.__setattr__(self, name, v)

        put("max_tokens", check_int("SamplingParams.max_tokens", self.max_tokens, 1))
        for name in ("temperature", "top_p"):
            v = getattr(self, name)
            check(
                isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v),
                f"SamplingParams.{name}",
                "a finite float",
                repr(v),
            )
            put(name, float(v))
        check(self.temperature >= 0, "SamplingParams.temperature", ">= 0", self.temperature)
        check(0 < self.top_p <= 1, "SamplingParams.top_p", "a float in (0, 1]", self.top_p)
        top_k = check_int("SamplingParams.top_k", self.top_k, -1)
        put("top_k", 0 if top_k == -1 else top_k)
        if self.seed is not None:
            put("seed", check_int("SamplingParams.seed", self.seed, 0, INT64_MAX))
        stops = self.stop_token_ids
        check(
            isinstance(stops, (list, tuple, set, frozenset)),
            "SamplingParams.stop_token_ids",
            "a list or tuple of token ids",
            repr(stops),
        )
        put(
            "stop_token_ids",
            tuple(check_int("SamplingParams.stop_token_ids[...]", t, 0) for t in stops),
        )
        put("ignore_eos", check_bool("SamplingParams.ignore_eos", self.ignore_eos))
        stop = (self.stop,) if isinstance(self.stop, str) else self.stop
        check(
            isinstance(stop, (list, tuple)) and all(isinstance(t, str) and t for t in stop),
            "SamplingParams.stop",
            "a non-empty str or a list of them",
            repr(self.stop),
        )
        put("stop", tuple(stop))
        # the longest stop string's length (0: none), read every step of such a request
        put("longest_stop", max(map(len, self.stop), default=0))
        put(
            "include_stop_str_in_output",
            check_bool(
                "SamplingParams.include_stop_str_in_output", self.include_stop_str_in_output
            ),  # fmt: skip
        )

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def stop_hold(self) -> int:
        """Characters a streamed text holds back: the longest stop string's length - 1 (0
        without stop strings, or when they are part of the output)."""
        if not self.stop or self.include_stop_str_in_output:
            return 0
        return self.longest_stop - 1


__all__ = ["SamplingParams"]
