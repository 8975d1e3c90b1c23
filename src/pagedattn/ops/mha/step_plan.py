"""`StepPlan`: the decode work plans of one step, shared by its layers (`mha(plan=...)`;
the plan's layout and rule: `work_plan`, docs/ops.md "The step's plan")."""

from __future__ import annotations

import numpy as np
import torch

from ...errors import Lazy, check
from .._checks import describe


class StepPlan:
    """The decode work plans of one step (`work_plan`): pass the same object to `mha` in every
    layer of the step; the first decode launch of each kind plans, the others read its buffer.
    Make a new one for each step (a plan of older lengths stays correct but is balanced for
    those lengths). A host plan of the one-wave list in row order (a uniform batch) is not used:
    the kernels derive that list themselves, without the plan's loads. Any other one-wave list
    goes through the plan, whose rows come longest items first (`work_plan`; the kernels' own
    list sorts them into 8 buckets of size: H200, the suite's skewed b32 74.1 us on it, 70.9-
    71.6 through the plan; docs/kernels/mha_decode.md, "Longest items first").

    cache_lengths: the step's cache lengths on the host (a sequence or CPU tensor of ints,
      batch order, as the manager holds them), or None. With them the plan is made on the host
      (`plan_work_host`) and copied to the device without a sync, and the launch knows its item
      count: its grid is the list. Without them one planner launch makes it on the device
      (`plan_work`) and the grid is the plan's capacity, programs past the items exiting: that
      suits lengths that live only on the device and a plan made inside a captured CUDA graph,
      but the idle programs cost a step whose one-wave list is short (H200, uniform b64 x 4k:
      249 us with the list's grid, 282 with the capacity's; docs/kernels/mha_decode.md).

    Host lengths shorter than a launch's rows fall back to the device planner.

    `plans`: {(rows, BLOCK_N, target, min_blocks): (int32 device buffer or None, items or
    None)}."""

    __slots__ = ("host_lengths", "plans")

    def __init__(self, cache_lengths=None) -> None:
        self.plans: dict[tuple[int, int, int, int], tuple[torch.Tensor | None, int | None]] = {}
        self.host_lengths = None
        if cache_lengths is not None:
            if isinstance(cache_lengths, torch.Tensor):
                ok = cache_lengths.device.type == "cpu" and not (
                    cache_lengths.dtype.is_floating_point or cache_lengths.dtype == torch.bool
                )
                a = cache_lengths.numpy() if ok else None
            else:
                a = np.asarray(cache_lengths)
                ok = a.dtype.kind in "iu"
            check(
                ok and a.ndim == 1,
                "cache_lengths",
                "a 1-D host sequence of ints (the step's cache lengths) or None",
                Lazy(lambda: describe(cache_lengths)),
            )
            self.host_lengths = a

    def get(
        self, cache_lens: torch.Tensor, rows: int, *, block_n: int, target: int, min_blocks: int
    ) -> tuple[torch.Tensor | None, int | None]:
        """(plan, its item count or None) of a decode launch over requests [0, rows) of
        cache_lens (planned at the first call of its key; the item count where the plan was
        made on the host), or (None, None) where the launch should derive its own list."""
        key = (rows, block_n, target, min_blocks)
        got = self.plans.get(key)
        if got is None or got[0] is not None and got[0].device != cache_lens.device:
            kw = dict(block_n=block_n, target=target, min_blocks=min_blocks)
            host = self.host_lengths
            if host is not None and host.shape[0] >= rows:
                from ...cache.buffers import host_to_device
                from .work_plan import plan_work_host

                buf = plan_work_host(host, rows, **kw)
                if int(buf[1]) == 1 and not int(buf[4]):  # the kernels' own list, in order
                    got = (None, None)
                else:
                    got = (host_to_device(buf.numpy(), cache_lens.device), int(buf[0]))  # no sync
            else:
                from .work_plan import plan_work  # (Triton: imported at the first plan)

                got = (plan_work(cache_lens, rows, **kw), None)
            self.plans[key] = got
        return got

    def __repr__(self) -> str:
        where = "host" if self.host_lengths is not None else "device"
        return f"StepPlan({len(self.plans)} plans, {where} lengths)"


__all__ = ["StepPlan"]
