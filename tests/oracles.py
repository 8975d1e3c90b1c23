"""Float64 oracles and cache fixtures shared by the MLA decode tests (reference and Triton).

Imported as a plain module (pytest puts tests/ on sys.path): `from oracles import ...`.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from pagedattn import KVCacheParams, PagedOperand

LAYER = 1  # of 2 layers: catches layer-stride mistakes


@dataclasses.dataclass
class Cache:
    """A written MLA cache and the oracle's float64 decoding of its pool."""

    params: KVCacheParams
    inputs: object
    seq_lens: list[int]
    pool: torch.Tensor  # float64 [P, ps, d] decoded by the oracle
    lut: list[list[int]]

    @property
    def ps(self) -> int:
        return self.params.page_size

    @property
    def slots(self) -> int:
        return self.pool.shape[0] * self.ps

    def key(self, b: int, pos: int) -> torch.Tensor:
        """Token `pos` of request b, addressed by the oracle from the lookup table."""
        return self.pool[self.lut[b][pos // self.ps], pos % self.ps]

    def encode(self, b: int, pos: int) -> int:
        return self.lut[b][pos // self.ps] * self.ps + pos % self.ps

    def at(self, enc: int) -> torch.Tensor:
        return self.pool[enc // self.ps, enc % self.ps]

    def operand(self):
        return PagedOperand(self.inputs, self.params, LAYER, "k")


def make_sinks(h_q: int, gen: torch.Generator) -> torch.Tensor:
    """[h_q] float32 sinks on the CPU: +inf for head 0 (output 0), -inf for the last (none)."""
    s = torch.randn(h_q, generator=gen) * 2
    if h_q > 1:
        s[0] = float("inf")  # output 0 for head 0
        s[-1] = float("-inf")  # no effect
    return s


def attend64(q64, keys, d_v, scale, sink):
    """q64 [h, d], keys [N, d] float64 -> (out [h, d_v], lse [h])."""
    h = q64.shape[0]
    if keys.shape[0] == 0:
        return torch.zeros(h, d_v, dtype=torch.float64), torch.full((h,), -math.inf).double()
    s = keys @ q64.T * scale  # [N, h]
    m = s.max(dim=0).values
    e = torch.exp(s - m)
    denom = e.sum(dim=0)
    lse = m + torch.log(denom)
    if sink is not None:
        denom = denom + torch.exp(sink.double().cpu() - m)
    out = (e.T @ keys[:, :d_v]) / denom[:, None]
    return out, lse


def oracle(q, offsets, keys_of, d_v=512, scale=None, sink=None):
    """keys_of(b, i) -> float64 [N, d] keys that query i of request b sees."""
    tokens, h_q, d = q.shape
    scale = 1 / math.sqrt(d) if scale is None else scale
    out = torch.zeros(tokens, h_q, d_v, dtype=torch.float64)
    lse = torch.zeros(tokens, h_q, dtype=torch.float64)
    qc = q.cpu()
    for b in range(len(offsets) - 1):
        for i in range(offsets[b + 1] - offsets[b]):
            t = offsets[b] + i
            out[t], lse[t] = attend64(qc[t].double(), keys_of(b, i), d_v, scale, sink)
    return out, lse


def dense_keys(cache: Cache, cache_lens, q_lens, causal=True):
    """keys_of for dense mode: the first cache_len + (i + 1 or q_len) tokens of request b."""

    def keys_of(b, i):
        n = cache_lens[b] + (i + 1 if causal else q_lens[b])
        if n == 0:
            return torch.zeros(0, cache.params.head_dim, dtype=torch.float64)
        return torch.stack([cache.key(b, j) for j in range(n)])

    return keys_of


def invalid_kinds(cache: Cache) -> list[int]:
    """-1, -2^31, exactly one past the end, huge, and other negatives."""
    return [-1, -(2**31), cache.slots, 2**31 - 1, cache.slots + 7, -5]
