"""Host-side split-K planning: how many KV partitions a decode launch uses.

This is pure host arithmetic so that `PagedKVCacheManager.runtime_inputs` can fill
`attention_dispatch_metadata` and `mla_num_partitions` before a (captured) launch; the kernels
read the same numbers, so a CUDA graph and the kernel always agree.

Heuristic (both MHA and MLA): a decode launch has `units` independent tiles (batch x KV-head
groups); split K until there are about `WAVES` x the SM count of them, while each partition keeps
at least `MIN_TOKENS_PER_PARTITION` keys so that the combine pass stays cheap. The constants come
from the H100 sweep recorded in `bench/results/partitions_h100.json` (see docs/heuristics.md).
"""

from __future__ import annotations

import math

import torch

DEFAULT_NUM_SMS = 132  # H100 SXM; used when no CUDA device is visible (CPU, graph planning)
WAVES = 2  # tiles per SM wanted: >= 2 hides the tail of uneven lengths
MIN_TOKENS_PER_PARTITION = 256  # below this, the combine pass costs more than it saves
MAX_PARTITIONS = 64
MLA_HEADS_PER_TILE = 64  # query heads of one MLA tile (one wgmma M)


def num_sms(device: torch.device | str | None = None) -> int:
    """Multiprocessor count of a CUDA device, or DEFAULT_NUM_SMS elsewhere."""
    d = torch.device(device) if device is not None else None
    if d is not None and d.type == "cuda" and torch.cuda.is_available():
        return torch.cuda.get_device_properties(d).multi_processor_count
    return DEFAULT_NUM_SMS


def choose_num_partitions(units: int, max_cache_len: int, sms: int = DEFAULT_NUM_SMS) -> int:
    """Split-K partitions for `units` independent tiles over `max_cache_len` keys."""
    units = max(int(units), 1)
    if max_cache_len <= MIN_TOKENS_PER_PARTITION:
        return 1
    want = math.ceil(WAVES * sms / units)
    cap = max(1, max_cache_len // MIN_TOKENS_PER_PARTITION)
    return int(max(1, min(want, cap, MAX_PARTITIONS)))


def mha_num_partitions(
    batch: int, n_kv_heads: int, max_prompt_len: int, max_cache_len: int, sms: int
) -> int:
    """MHA: one tile per (request, KV head); prefill (prompt > 1) is not split."""
    if max_prompt_len > 1:
        return 1
    return choose_num_partitions(batch * n_kv_heads, max_cache_len, sms)


def mla_num_partitions(
    batch: int, num_q_heads: int, q_max_seq_len: int, max_cache_len: int, sms: int
) -> int:
    """MLA: one tile per (request, 64 query rows); query rows are heads x query tokens."""
    rows = num_q_heads * max(q_max_seq_len, 1)
    units = batch * math.ceil(rows / MLA_HEADS_PER_TILE)
    return choose_num_partitions(units, max_cache_len, sms)
