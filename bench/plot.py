"""Plot a results JSON: each config's speed as a fraction of the ceiling measured in the run
(copy bandwidth for memory-bound configs, bf16 matmul for compute-bound ones)."""

from __future__ import annotations

import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def plot(path: str) -> str:
    with open(path) as f:
        data = json.load(f)
    recs = data["records"]
    configs = list(dict.fromkeys((r["suite"], r["config"]) for r in recs))
    impls = list(dict.fromkeys(r["impl"] for r in recs))
    fig, ax = plt.subplots(figsize=(12, 0.45 * len(configs) + 1.5))
    h = 0.8 / max(len(impls), 1)
    for i, impl in enumerate(impls):
        ys, xs = [], []
        for j, key in enumerate(configs):
            r = next(
                (r for r in recs if (r["suite"], r["config"]) == key and r["impl"] == impl), None
            )
            if r is None:
                continue
            compute = r["suite"] == "prefill" or "hq128" in r["config"]
            xs.append(r.get("frac_mm", 0) if compute else r.get("frac_copy", 0))
            ys.append(j + i * h)
        ax.barh(ys, xs, height=h, label=impl)
    ax.set_yticks([j + 0.4 - h / 2 for j in range(len(configs))])
    ax.set_yticklabels(
        [f"{s}: {c}" + (" [mm]" if s == "prefill" or "hq128" in c else "") for s, c in configs],
        fontsize=7,
    )
    ax.axvline(1.0, color="k", lw=0.5)
    ax.set_xlabel(
        "fraction of the ceiling measured in the same run (copy bandwidth, or bf16 matmul for [mm])"
    )
    env = data["env"]
    ax.set_title(
        f"{env.get('device', '?')} {env.get('date', '')} torch {env.get('torch', '')} "
        f"triton {env.get('triton', '')} flashinfer {env.get('flashinfer', '-')}",
        fontsize=8,
    )
    ax.invert_yaxis()
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # off the bars
    fig.tight_layout()
    out = path.rsplit(".", 1)[0] + ".png"
    fig.savefig(out, dpi=110, bbox_inches="tight")  # long labels are not cut off
    return out


if __name__ == "__main__":
    print(plot(sys.argv[1]))
