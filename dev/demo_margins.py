"""How close the demo's attention checks come to their bounds: the worst absolute error, the
worst element's relative error and the worst cosine difference of each run (python3
dev/demo_margins.py [runs] [device]); used to set `pagedattn.demo`'s bounds."""

from __future__ import annotations

import io
import sys

from rich.console import Console

import pagedattn.demo as D
from pagedattn.testing import cos_diff, element_errors


def main() -> None:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    device = sys.argv[2] if len(sys.argv) > 2 else "cpu"
    worst = {}

    def record(out, ref, **_kw):
        err, rel = element_errors(out.double().cpu(), ref.double().cpu())
        worst["abs"] = max(worst["abs"], float(err.max()))
        worst["rel_at_abs_1e-3"] = max(worst["rel_at_abs_1e-3"], float(rel[err > 1e-3].max())
                                       if (err > 1e-3).any() else 0.0)  # fmt: skip
        worst["cos"] = max(worst["cos"], cos_diff(out, ref))

    D.assert_close = record
    for seed in range(runs):
        worst.update({"abs": 0.0, "rel_at_abs_1e-3": 0.0, "cos": 0.0})
        D.run_demo(D.DemoConfig(seed=seed, device=device), Console(file=io.StringIO()))
        print(seed, device, {k: f"{v:.3e}" for k, v in worst.items()}, flush=True)


if __name__ == "__main__":
    main()
