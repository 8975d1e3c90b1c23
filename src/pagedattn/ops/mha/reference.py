"""Reference MHA/GQA/MQA attention over any operand: plain torch, fp32 accumulation, any device.

The semantics are those of `docs/ops.md` (`mha`). For each request b (a Python loop over
requests; everything inside is vectorised over queries, heads and keys):

- its `q_len(b)` queries sit at absolute positions `cache_length(b) + i`;
- its keys are positions `0 .. cache_length(b) + q_len(b) - 1`, read through the operands
  (`RowOperand.rows_for` / `load_rows`, which dequantize FP8 blockwise, per-token and
  per-tensor caches to float32);
- only the contiguous key range that some query of the block can see is gathered, so no slot
  outside a request's valid positions (NaN pools, sentinel page ids) is ever read;
- split-K: the keys `[0, n)` are cut into `P` contiguous chunks of `ceil(n / P)` keys, each chunk
  gives a partial (output, LSE), and `ops.combine.combine_partials` merges them and applies the
  sink. `P = 1` takes the same path, so every `P` agrees up to float32 rounding.

NaN and inf (docs/ops.md, "NaN and inf"; the Triton kernels follow the same rule): a NaN or
+inf score at a key the query attends makes its (query, head) output row and LSE NaN (a NaN or
inf in q's row, or in an attended K row); a -inf score weighs 0, as a mask does; a NaN or inf
in an attended V reaches its column by IEEE arithmetic (the LSE stays finite). Masked scores
are replaced by -inf whatever K holds, and slots outside the gathered range are never read. A
row that attends nothing gets out 0 and LSE -inf whatever its sink; a NaN sink makes the other
rows of its head NaN. A NaN partial LSE propagates through `combine_partials`, so NaN positions
do not depend on P.

This path synchronises with the host (per-request lengths); it is the CPU path and the oracle
the Triton kernels are tested against, not a CUDA-graph path.
"""

from __future__ import annotations

import math

import torch

from ...errors import check
from ...operands import RowOperand
from ..combine import combine_partials
from ..masks import Mask, causal

# Upper bound on the float32 score elements ([heads, query block, keys]) held at once; queries
# of a long prefill are processed in blocks to stay under it (64 MiB of scores).
SCORE_BUDGET = 1 << 24


def _check_offsets(offs: list[int], total_q: int) -> None:
    check(
        offs[0] == 0 and offs[-1] == total_q and all(a <= b for a, b in zip(offs, offs[1:])),
        "q_row_offsets",
        f"non-decreasing prefix sums from 0 to total_q={total_q}",
        offs if len(offs) <= 16 else f"{offs[:8]} ... {offs[-4:]}",
    )


def _key_rows(op: RowOperand, name: str, b: int, lo: int, hi: int) -> torch.Tensor:
    """Physical rows of key positions [lo, hi) of request b, checked against the operand."""
    if op.page_size:
        cols = op.lut.shape[1]
        check(
            hi <= cols * op.page_size,
            name,
            f"request {b}'s {hi} keys within its lookup table ({cols} pages of "
            f"{op.page_size} tokens)",
            f"{hi} keys",
        )
    rows = op.rows_for(b, hi)[lo:hi]
    if rows.numel():
        rmin, rmax = int(rows.min()), int(rows.max())
        check(
            rmin >= 0 and rmax < op.num_kv_rows(),
            name,
            f"request {b}'s key positions [{lo}, {hi}) to map to rows in [0, "
            f"{op.num_kv_rows()}) (unallocated lookup-table entry or offset past the end?)",
            f"rows in [{rmin}, {rmax}]",
        )
    return rows


def _partials(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    allowed: torch.Tensor,
    scale: float,
    bounds: list[tuple[int, int, int]],
    num_partitions: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Partial attention of one query block over one key span.

    q [nq, h_kv, g, d] f32, k [span, h_kv, d] f32, v [span, h_kv, d_v] f32,
    allowed [nq, span] bool, bounds: (partition, start, end) slices of the span.
    Returns (out [P, nq, h_kv * g, d_v] f32 normalised per partition, lse [P, nq, h_kv * g] f32);
    partitions not in `bounds`, or that see no key, keep out 0 and lse -inf. A NaN or +inf
    score at an allowed key makes the partition's row NaN (out and lse); masked scores are
    replaced by -inf whatever K holds (module docstring, NaN and inf).
    """
    nq, h_kv, g, _ = q.shape
    d_v = v.shape[-1]
    out = q.new_zeros(num_partitions, nq, h_kv, g, d_v)
    lse = q.new_full((num_partitions, nq, h_kv, g), -math.inf)
    s = torch.einsum("qhgd,khd->qhgk", q, k) * scale
    s = s.masked_fill(~allowed[:, None, None, :], -math.inf)
    for p, a, e in bounds:
        sp = s[..., a:e]
        m = sp.amax(dim=-1, keepdim=True)  # NaN / +inf propagate
        m = torch.where(m == -math.inf, torch.zeros_like(m), m)
        w = torch.exp(sp - m)  # exactly 0 at masked keys; NaN from a NaN or +inf score
        denom = w.sum(dim=-1)
        o = torch.einsum("qhgk,khd->qhgd", w, v[a:e])
        # as the kernels: divide where a key was seen (denom != 0 holds for NaN too)
        out[p] = o / torch.where(denom != 0, denom, torch.ones_like(denom))[..., None]
        lse[p] = m.squeeze(-1) + torch.log(denom)  # -inf where nothing is seen, NaN stays
    return out.flatten(2, 3), lse.flatten(2, 3)


def mha_reference(
    q: torch.Tensor,
    k: RowOperand,
    v: RowOperand,
    q_row_offsets: torch.Tensor,
    *,
    mask: Mask | None = None,
    scale: float | None = None,
    sinks: torch.Tensor | None = None,
    num_partitions: int | None = None,
    return_lse: bool = False,
    out: torch.Tensor | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Reference `mha` (see `pagedattn.ops.mha.mha` for the contract).

    q: [total_q, h_q, d_qk]; k, v: operands with h_kv heads (h_q % h_kv == 0), head dims d_qk
    and d_v; q_row_offsets: [batch + 1] int32 prefix sums of queries per request.
    Returns out [total_q, h_q, d_v] in q.dtype (written into `out` when given), and with
    `return_lse` the float32 [total_q, h_q] natural-log LSE over keys (sink excluded).
    """
    mask = causal() if mask is None else mask
    total_q, h_q, d_qk = q.shape
    h_kv, d_v = k.num_heads, v.head_dim
    g = h_q // h_kv
    scale = 1.0 / math.sqrt(d_qk) if scale is None else float(scale)
    P = 1 if num_partitions is None else int(num_partitions)
    device = q.device

    offs = q_row_offsets.tolist()
    _check_offsets(offs, total_q)
    cache_lens = k.cache_lengths.tolist()
    check(
        all(c >= 0 for c in cache_lens),
        "k.cache_lengths",
        "non-negative cache lengths",
        cache_lens if len(cache_lens) <= 16 else f"{cache_lens[:16]} ...",
    )

    acc = torch.zeros(total_q, h_q, d_v, dtype=torch.float32, device=device)
    lse = torch.full((total_q, h_q), -math.inf, dtype=torch.float32, device=device)
    sinks32 = None if sinks is None else sinks.to(device=device, dtype=torch.float32)

    for b in range(len(offs) - 1):
        q0, q1 = offs[b], offs[b + 1]
        if q1 == q0:
            continue
        cl = cache_lens[b]
        n = cl + (q1 - q0)  # keys of this request
        chunk = -(-n // P)  # keys per split-K partition
        k_pos = torch.arange(n, device=device)
        block = max(1, min(q1 - q0, SCORE_BUDGET // max(h_q * n, 1)))
        for r0 in range(q0, q1, block):
            r1 = min(r0 + block, q1)
            rows = torch.arange(r0, r1, device=device)
            q_pos = cl + rows - q0
            allowed = mask.allowed(q_pos[:, None], k_pos[None, :], rows[:, None])
            visible = torch.nonzero(allowed.any(dim=0)).flatten()
            if visible.numel() == 0:
                continue  # out 0, lse -inf
            lo, hi = int(visible[0]), int(visible[-1]) + 1
            kf = k.load_rows(_key_rows(k, "k", b, lo, hi))
            vf = v.load_rows(_key_rows(v, "v", b, lo, hi))
            bounds = [
                (p, max(p * chunk, lo) - lo, min((p + 1) * chunk, hi) - lo)
                for p in range(lo // chunk, (hi - 1) // chunk + 1)
            ]
            qf = q[r0:r1].float().reshape(r1 - r0, h_kv, g, d_qk)  # q may be strided
            po, pl = _partials(qf, kf, vf, allowed[:, lo:hi], scale, bounds, P)
            o, l = combine_partials(po, pl, sinks32)
            acc[r0:r1] = o
            lse[r0:r1] = l

    if out is None:
        out = torch.empty(total_q, h_q, d_v, dtype=q.dtype, device=device)
    out.copy_(acc)
    return (out, lse) if return_lse else out
