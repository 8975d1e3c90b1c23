"""Split-K combine (reference): merge partial attention results by their log-sum-exps.

A partition p of a query's keys gives `o_p` (normalised over its keys) and `lse_p` (natural
log of its softmax denominator; -inf when it saw no key). The full result is
    lse = logsumexp_p(lse_p),   o = sum_p exp(lse_p - lse) * o_p,
and a sink logit s (joining the denominator only) scales it by 1 / (1 + exp(s - lse)).
"""

from __future__ import annotations

import torch


def combine_partials(
    partial_out: torch.Tensor, partial_lse: torch.Tensor, sinks: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """partial_out [P, tokens, heads, d] f32, partial_lse [P, tokens, heads] f32,
    sinks [heads] f32 or None -> (out [tokens, heads, d] f32, lse [tokens, heads] f32).

    The returned LSE leaves the sink out. A query no partition saw gets out 0, lse -inf.
    """
    lse = torch.logsumexp(partial_lse, dim=0)
    safe = torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse))
    w = torch.exp(partial_lse - safe)  # [P, tokens, heads]; 0 for empty partitions
    w = torch.where(torch.isfinite(lse), w, torch.zeros_like(w))
    # Empty partitions (w == 0) may hold NaN from 0/0; NaN from real keys must propagate.
    out = torch.where(w.unsqueeze(-1) > 0, w.unsqueeze(-1) * partial_out, 0.0).sum(0)
    if sinks is not None:
        # 1 / (1 + exp(sink - lse)); sink=+inf -> 0, lse=-inf -> 0 (out is 0 there anyway).
        factor = torch.sigmoid(safe - sinks.float().view(1, -1))
        out = out * factor.unsqueeze(-1)
    return out, lse
