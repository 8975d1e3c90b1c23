"""Tokenizers for text prompts: the checkpoint folder's own, through transformers'
`AutoTokenizer` when it is installed, else the `tokenizers` library on `tokenizer.json`.

`load_tokenizer(source)` returns a `Tokenizer` (encode / decode / eos_token_id) or None when
the source has no tokenizer files. `source` may also be a ready tokenizer object with
`encode(text) -> list[int]` and `decode(ids, skip_special_tokens=...) -> str` (a transformers
tokenizer), which is wrapped as it is.
"""

from __future__ import annotations

import os
from pathlib import Path

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")


class Tokenizer:
    """What the engine needs of a tokenizer."""

    def __init__(self, impl: object, eos_token_id: int | None = None) -> None:
        self.impl = impl
        self.eos_token_id = eos_token_id

    def encode(self, text: str) -> list[int]:
        out = self.impl.encode(text)
        return list(getattr(out, "ids", out))  # tokenizers.Encoding or a list

    def decode(self, ids: list[int]) -> str:
        return self.impl.decode(ids, skip_special_tokens=True)


def _from_folder(path: Path) -> Tokenizer | None:
    if not any((path / f).is_file() for f in TOKENIZER_FILES):
        return None
    try:
        from transformers import AutoTokenizer
    except ImportError:
        AutoTokenizer = None
    if AutoTokenizer is not None:
        tok = AutoTokenizer.from_pretrained(str(path))
        return Tokenizer(tok, tok.eos_token_id)
    if not (path / "tokenizer.json").is_file():
        return None
    from tokenizers import Tokenizer as RawTokenizer

    return Tokenizer(RawTokenizer.from_file(str(path / "tokenizer.json")))


def load_tokenizer(source: object) -> Tokenizer | None:
    """A `Tokenizer` from a folder (str / PathLike) or a tokenizer object; None for None or a
    folder without tokenizer files."""
    if source is None:
        return None
    if isinstance(source, Tokenizer):
        return source
    if isinstance(source, (str, os.PathLike)):
        return _from_folder(Path(source))
    return Tokenizer(source, getattr(source, "eos_token_id", None))


__all__ = ["TOKENIZER_FILES", "Tokenizer", "load_tokenizer"]
