"""Float64 oracles and cache fixtures shared by the MLA decode tests (reference and Triton).

Imported as a plain module (pytest puts tests/ on sys.path): `from oracles import ...`.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from pagedattn import KVCacheParams, PagedOperand

LAYER = 1  # of 2 layers: catches layer-stride mistakes
# The persistent V32 kernel's GPU cases (test_triton_mla, tests/sm90_compile.py): batch, s_q
# (0: ragged 1-3), index width
PS_CASES = [(40, 2, 300), (7, 4, 200), (70, 1, 520), (50, 0, 260)]


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


# --------------------------------------------------------------------------------------------
# An independent float64 decoder of one layer's raw cache bytes
# --------------------------------------------------------------------------------------------
def _as(b: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return b.contiguous().view(dtype).double()


def _e8m0(b: torch.Tensor) -> torch.Tensor:
    """e8m0 byte e encodes 2^(e - 127)."""
    return torch.pow(2.0, b.double() - 127.0)


def decode_pool(params: KVCacheParams, inputs, layer: int = LAYER) -> torch.Tensor:
    """float64 [total_num_pages, page_size, head_dim]: every slot of one layer, decoded (on
    the CPU) from the buffers' documented layouts."""
    blocks = inputs.kv_blocks[:, 0, layer, :, 0, :].cpu()  # [P, ps, row_elems]
    P, ps, _ = blocks.shape
    lat = params.head_dim - params.mla_rope_dim
    fmt = params.quant_format
    if fmt is None:
        return blocks.double()
    if fmt == "blockwise":
        s = inputs.kv_scales[:, 0, layer, :, 0, :].cpu()
        s = _e8m0(s.view(torch.uint8)) if s.dtype == torch.float8_e8m0fnu else s.double()
        return blocks.double() * s.repeat_interleave(params.scale_granularity, dim=-1)
    if fmt == "per_tensor":
        return blocks.double() * float(inputs.kv_scales[0, layer])
    raw = blocks.view(torch.uint8)
    e4m3, bf16 = torch.float8_e4m3fn, torch.bfloat16
    if fmt == "mla_rope_aware":
        s = inputs.kv_scales[:, 0, layer, :, 0, :].cpu().double()  # [P, ps, 1]
        return torch.cat([_as(raw[..., :lat], e4m3) * s, _as(raw[..., lat:], bf16)], dim=-1)
    if fmt == "flashmla_v32":
        s = _as(raw[..., 512:528], torch.float32)  # [P, ps, 4]
        x = _as(raw[..., :512], e4m3).reshape(P, ps, 4, 128) * s[..., None]
        return torch.cat([x.reshape(P, ps, 512), _as(raw[..., 528:656], bf16)], dim=-1)
    assert fmt == "flashmla_model1"
    page = inputs.kv_blocks[:, 0, layer].cpu().reshape(P, ps * 584)  # one block a page
    data = page[:, : ps * 576].reshape(P, ps, 576)
    s = _e8m0(page[:, ps * 576 :].reshape(P, ps, 8)[..., :7])
    x = _as(data[..., :448], e4m3).reshape(P, ps, 7, 64) * s[..., None]
    return torch.cat([x.reshape(P, ps, 448), _as(data[..., 448:], bf16)], dim=-1)
