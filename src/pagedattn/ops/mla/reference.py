"""Reference MLA decode: plain torch, fp32 accumulation, any device (docs/ops.md, `mla_decode`).

It reads K only through the operand: `rows_for` (dense keys of a request), the operand's
`get_tma_row` rule (sparse indices, vectorised in `RowOperand.tma_rows`) and `load_rows`, which
dequantizes every FP8 layout. V is the first `d_v` dims of K.

Keys of request b form one softmax over up to two segments, in this order:
  1. main: dense, the `cache_length(b) + q_len(b)` tokens of `kv` (causal: query i sees keys
     `< cache_length(b) + i + 1`), or sparse, the entries of `indices[token]`;
  2. extra (optional): the entries of `extra_indices[token]` in `extra_kv`.
A sparse entry is valid iff its position is `< topk_lengths[b]` (all positions when None; a
negative length means none) and `0 <= encoded < operand.num_sparse_slots()`. Invalid entries
are never loaded: their slot may hold NaN and must not reach the output.

Split-K: the concatenated key axis of each request is cut into `num_partitions` contiguous
chunks of `ceil(num_keys / P)` keys; each chunk yields a partial (out, lse) and
`ops.combine.combine_partials` merges them and applies the sink.

NaN and inf (docs/ops.md, "NaN and inf"; the Triton kernels follow the same rule): a NaN or
+inf score at a key the query attends (a NaN or inf in q's row, a NaN anywhere in an attended
key, since V is part of K, or an inf in its rope whose score is +inf) makes the (token, head)
output row and LSE NaN; a -inf score weighs 0, as a mask does. Scores of keys a query does not
see are replaced by -inf whatever the slot holds, and invalid sparse entries are never loaded.
A row that attends nothing gets out 0 and LSE -inf whatever its sink; a NaN sink makes the
other rows of its head NaN. A NaN partial LSE propagates through `combine_partials`, so NaN
positions do not depend on P.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ...errors import InvalidArgumentError, check
from ...operands import RowOperand
from ..combine import combine_partials

MAX_Q_PER_REQUEST = 8  # MTP / speculative verify: at most 8 query tokens a request


@dataclass
class _Segment:
    """Keys of one request seen by its n queries.

    keys: [1 or n, length, d_qk] float32 (1 when every query sees the same keys, as in dense
      mode); invalid sparse entries are zero, never loaded. visible: [n, length] bool.
    """

    keys: torch.Tensor
    visible: torch.Tensor


def _dense_segment(kv: RowOperand, b: int, n: int, causal: bool, device: torch.device) -> _Segment:
    cl = kv.cache_length(b)
    if cl < 0:
        raise InvalidArgumentError(f"kv.cache_lengths[{b}]: expected a value >= 0, got {cl}")
    total = cl + n
    if kv.page_size:
        cols = -(-total // kv.page_size)
        check(
            cols <= kv.lut.shape[1],
            f"kv.lookup_table[{b}]",
            f"at least {cols} columns to cover cache_length + q_len = {total} tokens",
            f"{kv.lut.shape[1]} columns",
        )
        pages = kv.lut[b, :cols].long()
        num_pages = kv.num_sparse_slots() // kv.page_size
        bad = (pages < 0) | (pages >= num_pages)
        if bool(bad.any()):
            c = int(torch.nonzero(bad)[0])
            raise InvalidArgumentError(
                f"kv.lookup_table[{b}, {c}]: expected a page id in [0, {num_pages}) for a token "
                f"the request reads, got {int(pages[c])}"
            )
    rows = kv.rows_for(b, total)
    if not kv.page_size and total:
        check(
            int(rows[-1]) < kv.num_kv_rows() and int(rows[0]) >= 0,
            f"kv rows of request {b}",
            f"rows in [0, {kv.num_kv_rows()})",
            f"[{int(rows[0])}, {int(rows[-1])}]",
        )
    keys = kv.load_rows(rows, torch.float32)[:, 0, :].unsqueeze(0)  # [1, total, d]
    if causal:
        j = torch.arange(total, device=device)[None, :]
        i = torch.arange(n, device=device)[:, None]
        visible = j < cl + i + 1
    else:
        visible = torch.ones(n, total, dtype=torch.bool, device=device)
    return _Segment(keys, visible)


def _sparse_segment(op: RowOperand, idx: torch.Tensor, length: int | None, d_qk: int) -> _Segment:
    """idx: [n, stride] int32 encoded indices of one request's queries."""
    n, stride = idx.shape
    enc = idx.long()
    slots = op.num_sparse_slots()
    valid = (enc >= 0) & (enc < slots)
    if length is not None:
        pos = torch.arange(stride, device=idx.device)[None, :]
        valid &= pos < length
    keys = torch.zeros(n, stride, d_qk, dtype=torch.float32, device=idx.device)
    if bool(valid.any()):
        rows = op.tma_rows(enc[valid])
        keys[valid] = op.load_rows(rows, torch.float32)[:, 0, :]
    return _Segment(keys, valid)


def _attend(
    q: torch.Tensor, segments: list[_Segment], lo: int, hi: int, scale: float, d_v: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of q [n, h, d_qk] (f32) over keys [lo, hi) of the concatenated segments.
    Returns (out [n, h, d_v] normalised over those keys, lse [n, h]); out 0 / lse -inf when
    no key there is visible."""
    n, h, _ = q.shape
    pieces = []
    off = 0
    for seg in segments:
        length = seg.visible.shape[1]
        a, z = max(lo, off), min(hi, off + length)
        if a < z:
            k = seg.keys[:, a - off : z - off]
            vis = seg.visible[:, a - off : z - off]
            s = torch.matmul(q, k.transpose(-1, -2)) * scale  # [n, h, l]
            s = torch.where(vis[:, None, :], s, float("-inf"))
            pieces.append((s, k[..., :d_v]))
        off += length
    out = torch.zeros(n, h, d_v, dtype=torch.float32, device=q.device)
    if not pieces:
        return out, torch.full((n, h), float("-inf"), device=q.device)
    m = torch.stack([s.amax(dim=-1) for s, _ in pieces]).amax(dim=0)  # [n, h]; NaN, +inf stay
    m_safe = torch.where(m == float("-inf"), torch.zeros_like(m), m)
    denom = torch.zeros(n, h, dtype=torch.float32, device=q.device)
    for s, v in pieces:
        e = torch.exp(s - m_safe[..., None])  # 0 where not visible; NaN from NaN / +inf scores
        denom += e.sum(dim=-1)
        out += torch.matmul(e, v)
    lse = m_safe + torch.log(denom)  # -inf where no key is seen, NaN stays NaN
    # as the kernels: divide where a key was seen (denom != 0 holds for NaN too)
    out = out / torch.where(denom != 0, denom, torch.ones_like(denom))[..., None]
    return out, lse


def host_offsets(
    q_row_offsets: torch.Tensor, tokens: int, name: str = "q_row_offsets"
) -> list[int]:
    """Host copy of the row offsets, checked: start 0, end `tokens`, non-decreasing, at most
    MAX_Q_PER_REQUEST queries a request (`name` is the argument's name in errors)."""
    offs = q_row_offsets.tolist()
    check(offs[0] == 0, f"{name}[0]", "0", offs[0])
    check(
        offs[-1] == tokens,
        f"{name}[-1]",
        f"q.shape[0] = {tokens} (total query tokens)",
        offs[-1],
    )
    for b in range(len(offs) - 1):
        n = offs[b + 1] - offs[b]
        check(
            0 <= n <= MAX_Q_PER_REQUEST,
            name,
            f"non-decreasing prefix sums with at most {MAX_Q_PER_REQUEST} query tokens a request",
            f"{n} tokens for request {b}",
        )
    return offs


def mla_decode_reference(
    q: torch.Tensor,
    kv: RowOperand,
    q_row_offsets: torch.Tensor,
    *,
    d_v: int = 512,
    scale: float | None = None,
    causal: bool = True,
    indices: torch.Tensor | None = None,
    topk_lengths: torch.Tensor | None = None,
    extra_kv: RowOperand | None = None,
    extra_indices: torch.Tensor | None = None,
    extra_topk_lengths: torch.Tensor | None = None,
    attn_sink: torch.Tensor | None = None,
    num_partitions: int | None = None,
    out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """MLA decode in plain torch (fp32 math). Same contract as `pagedattn.ops.mla.mla_decode`
    (whose metadata checks it assumes); checks the values that need the host here.

    Returns (out [tokens, h_q, d_v] in q.dtype, lse [tokens, h_q] float32).
    """
    tokens, h_q, d_qk = q.shape
    scale = 1.0 / math.sqrt(d_qk) if scale is None else float(scale)
    P = 1 if num_partitions is None else int(num_partitions)
    offs = host_offsets(q_row_offsets, tokens)
    batch = len(offs) - 1
    topk = None if topk_lengths is None else topk_lengths.tolist()
    extra_topk = None if extra_topk_lengths is None else extra_topk_lengths.tolist()
    res = torch.zeros(tokens, h_q, d_v, dtype=torch.float32, device=q.device)
    lse = torch.full((tokens, h_q), float("-inf"), dtype=torch.float32, device=q.device)
    sinks = None if attn_sink is None else attn_sink.float()
    for b in range(batch):
        t0, t1 = offs[b], offs[b + 1]
        n = t1 - t0
        if n == 0:
            continue
        if indices is None:
            segments = [_dense_segment(kv, b, n, causal, q.device)]
        else:
            segments = [
                _sparse_segment(kv, indices[t0:t1], None if topk is None else topk[b], d_qk)
            ]
        if extra_kv is not None:
            length = None if extra_topk is None else extra_topk[b]
            segments.append(_sparse_segment(extra_kv, extra_indices[t0:t1], length, d_qk))
        qb = q[t0:t1].float()
        num_keys = sum(s.visible.shape[1] for s in segments)
        chunk = -(-num_keys // P)
        parts_out = torch.empty(P, n, h_q, d_v, dtype=torch.float32, device=q.device)
        parts_lse = torch.empty(P, n, h_q, dtype=torch.float32, device=q.device)
        for p in range(P):
            lo, hi = p * chunk, min((p + 1) * chunk, num_keys)
            parts_out[p], parts_lse[p] = _attend(qb, segments, lo, hi, scale, d_v)
        res[t0:t1], lse[t0:t1] = combine_partials(parts_out, parts_lse, sinks)
    if out is None:
        out = torch.empty(tokens, h_q, d_v, dtype=q.dtype, device=q.device)
    out.copy_(res)
    return out, lse
