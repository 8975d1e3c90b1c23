"""The engine's typed errors (each a `PagedAttnError`, so `except PagedAttnError` catches them)."""

from __future__ import annotations

from ..errors import InvalidArgumentError, MaxLengthExceededError, PagedAttnError


class PromptTooLongError(MaxLengthExceededError):
    """A prompt longer than the engine's `max_model_len` (the KV cache could never hold it).
    Raised by `add_request` / `generate` before anything is enqueued: other requests go on."""


class NotSupportedYetError(PagedAttnError, NotImplementedError):
    """A documented feature that this version does not implement yet (tensor parallelism)."""


class NoTokenizerError(InvalidArgumentError):
    """A text prompt (or text output) without a tokenizer: give `{"prompt_token_ids": [...]}` or
    a checkpoint folder with tokenizer files (or `LLM(..., tokenizer=...)`)."""


__all__ = ["NoTokenizerError", "NotSupportedYetError", "PromptTooLongError"]
