"""Split-K combine (reference): merge partial attention results by their log-sum-exps.

A partition p of a query's keys gives `o_p` (normalised over its keys) and `lse_p` (natural
log of its softmax denominator; -inf when it saw no key, NaN when a NaN or +inf score reached
it). The full result is
    lse = logsumexp_p(lse_p),   o = sum_p exp(lse_p - lse) * o_p,
and a sink logit s (joining the denominator only) scales it by 1 / (1 + exp(s - lse)).

NaN (docs/ops.md, "NaN and inf"): a partition with lse_p NaN makes the row's output and LSE
NaN; NaN in the `o_p` of a partition that saw keys propagates to its elements; partitions with
lse_p = -inf are skipped (their `o_p` is never read). A row no partition saw gets out 0 and
lse -inf whatever the sink (a NaN sink included); otherwise a NaN sink makes the output NaN
(the LSE leaves the sink out). The Triton combines (`ops/mha/triton_combine.py`,
`ops/mla/triton_mla_combine.py`) follow the same rule.
"""

from __future__ import annotations

import math

import torch


def combine_partials(
    partial_out: torch.Tensor, partial_lse: torch.Tensor, sinks: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """partial_out [P, tokens, heads, d] f32, partial_lse [P, tokens, heads] f32,
    sinks [heads] f32 or None -> (out [tokens, heads, d] f32, lse [tokens, heads] f32).

    The returned LSE leaves the sink out. A query no partition saw gets out 0, lse -inf; a
    NaN partial LSE gives out NaN, lse NaN (module docstring).
    """
    lse = torch.logsumexp(partial_lse, dim=0)  # NaN if any lse_p is NaN
    empty = lse == -math.inf
    safe = torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse))
    seen = partial_lse != -math.inf  # NaN counts as seen: it must reach the row
    w = torch.exp(partial_lse - safe).unsqueeze(-1)  # [P, tokens, heads, 1]; NaN stays NaN
    out = torch.where(seen.unsqueeze(-1), w * partial_out, 0.0).sum(0)
    if sinks is not None:
        # 1 / (1 + exp(sink - lse)): sink=+inf -> 0, sink=NaN -> NaN (rows that saw a key).
        factor = torch.sigmoid(safe - sinks.float().view(1, -1))
        out = torch.where(empty.unsqueeze(-1), 0.0, out * factor.unsqueeze(-1))
    return out, lse
