"""The staged rows' layout: where a decode step's host arrays sit in the int64 staging buffer
that `unpack_step_rows` reads (`StagedRows`)."""

from __future__ import annotations

from dataclasses import dataclass

from ...errors import check_int

#: Header words: [0] n, the step's rows (negative: unpack nothing), [1] w, the staged lookup
#: width; the rest 0.
HEADER = 8

#: A staged input id that leaves the row's id as it is (a token written on the device before
#: the unpack); any other negative id -1 - j takes the unpack's `tokens[j]`.
KEEP = -(2**63)


@dataclass(frozen=True)
class StagedRows:
    """The int64 staging buffer of a decode step of at most `max_rows` (M) rows, static lookup
    tables `cols` (C) wide, `meta` (K) metadata words. Word offsets:

    - [0, HEADER): n, w (`HEADER`);
    - cache lengths [M], input ids [M] (`KEEP`: the row keeps its buffer value; -1 - j:
      the unpack's `tokens[j]`), positions [M], from `rows_at`;
    - the metadata words [K], from `meta_at`;
    - the deferred tokens' pairs [2 M] (the engine's: d rows, then their d sources), from
      `deferred_at`; not read by the unpack;
    - the lookup rows [n, w] row-major, from `lut_at`.

    `words(n, w)`: the staged prefix of a step (what one host-to-device copy moves); `size`
    the buffer's (n = M, w = C)."""

    max_rows: int
    cols: int
    meta: int = 0

    def __post_init__(self) -> None:
        check_int("max_rows", self.max_rows, 1)
        check_int("cols", self.cols, 1)
        check_int("meta", self.meta, 0)

    @property
    def rows_at(self) -> int:
        return HEADER

    @property
    def meta_at(self) -> int:
        return HEADER + 3 * self.max_rows

    @property
    def deferred_at(self) -> int:
        return self.meta_at + self.meta

    @property
    def lut_at(self) -> int:
        return self.deferred_at + 2 * self.max_rows

    def words(self, n: int, w: int) -> int:
        return self.lut_at + n * w

    @property
    def size(self) -> int:
        return self.words(self.max_rows, self.cols)
