"""Plot a results JSON: each config's speed as a fraction of the ceiling measured in the run
(copy bandwidth for memory-bound configs, bf16 matmul for compute-bound ones). A real suite's
JSON (`bench/bench_real.py`) gets its own figure (`plot_real`): each case's fraction of its
roofline for pagedattn and FlashInfer, and a panel of the host cost per eager call."""

from __future__ import annotations

import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def plot(path: str) -> str:
    with open(path) as f:
        data = json.load(f)
    if data.get("suite") == "real":
        return plot_real(path)
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


REAL_IMPLS = ("pagedattn", "flashinfer", "torch-sdpa")
HOST_GOAL_US = 20.0  # issue 56: wall time per eager call


def plot_real(path: str) -> str:
    """The real suite's figure: top, each case's roofline time over its time (pagedattn and
    FlashInfer, bars labelled with ms); bottom, wall us per eager call of the host cases."""
    with open(path) as f:
        data = json.load(f)
    recs = [r for r in data["records"] if r.get("suite") == "real"]
    roof = list(dict.fromkeys(r["config"] for r in recs if "roofline_ms" in r["extra"]))
    host = list(dict.fromkeys(r["config"] for r in recs if "us_per_call" in r["extra"]))
    by = {(r["config"], r["impl"]): r for r in recs}
    n_r, n_h = max(len(roof), 1), max(len(host), 1)
    fig, (ax, ax2) = plt.subplots(
        2,
        1,
        figsize=(12, 0.42 * (n_r + n_h) + 3),
        gridspec_kw={"height_ratios": [n_r + 1, n_h + 1]},
    )
    impls = [i for i in REAL_IMPLS if any(k[1] == i for k in by)]
    roof_impls = [i for i in impls if i != "torch-sdpa"]
    h = 0.8 / max(len(roof_impls), 1)
    for i, impl in enumerate(roof_impls):
        ys, xs, ms = [], [], []
        for j, cfg in enumerate(roof):
            r = by.get((cfg, impl))
            if r is not None:
                ys.append(j + i * h)
                xs.append(r["extra"]["frac_roofline"])
                ms.append(r["ms"])
        bars = ax.barh(ys, xs, height=h, label=impl)
        for bar, m in zip(bars, ms):
            ax.text(bar.get_width(), bar.get_y() + bar.get_height() / 2, f" {m:.3f} ms",
                    va="center", fontsize=6)  # fmt: skip

    def bound(cfg: str) -> str:
        r = by.get((cfg, "pagedattn")) or by.get((cfg, "flashinfer")) or {"extra": {}}
        return r["extra"].get("bound", "?")

    ax.set_yticks([j + 0.4 - h / 2 for j in range(len(roof))])
    ax.set_yticklabels([f"{c} [{bound(c)}]" for c in roof], fontsize=7)
    ax.axvline(1.0, color="k", lw=0.5)
    ax.set_xlabel("roofline time / time (roofline: max(bytes / copy, FLOPs / bf16 matmul), "
                  "both measured in the same run; [copy] or [mm] names the bound)")  # fmt: skip
    ax.invert_yaxis()
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    h = 0.8 / max(len(impls), 1)
    for i, impl in enumerate(impls):
        ys, xs = [], []
        for j, cfg in enumerate(host):
            r = by.get((cfg, impl))
            if r is not None:
                ys.append(j + i * h)
                xs.append(r["extra"]["us_per_call"])
        bars = ax2.barh(ys, xs, height=h, label=impl)
        for bar, x in zip(bars, xs):
            ax2.text(bar.get_width(), bar.get_y() + bar.get_height() / 2, f" {x:.1f}",
                     va="center", fontsize=6)  # fmt: skip
    ax2.set_yticks([j + 0.4 - h / 2 for j in range(len(host))])
    ax2.set_yticklabels(host, fontsize=7)
    ax2.axvline(HOST_GOAL_US, color="r", lw=0.7, ls="--", label=f"goal {HOST_GOAL_US:g} us")
    ax2.set_xlabel("wall us per eager call (a loop of calls, one synchronize)")
    ax2.invert_yaxis()
    ax2.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    env = data["env"]
    ax.set_title(
        f"real workloads: {env.get('device', '?')} {env.get('date', '')} torch "
        f"{env.get('torch', '')} triton {env.get('triton', '')} flashinfer "
        f"{env.get('flashinfer', '-')}, seed {data.get('seed')}"
        + (" [CPU dry run: no timing claims]" if data.get("dry_run") else ""),
        fontsize=8,
    )
    fig.tight_layout()
    out = path.rsplit(".", 1)[0] + ".png"
    fig.savefig(out, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return out


if __name__ == "__main__":
    print(plot(sys.argv[1]))
