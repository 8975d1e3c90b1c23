"""Hot SASS instructions of an Nsight Compute report (collected with --section SourceCounters):
the instructions with the most warp-stall samples and each one's main stall reasons, offsets
from the kernel's first instruction (as in `cuobjdump -sass`), and for a wait loop's branch the
mbarrier it polls.

    ncu --section SourceCounters --import-source no -f -o REP python3 ...

    ncu --import REP --page source --csv --print-source sass > SRC.csv
    python3 dev/ncu_sass_hot.py SRC.csv [TOP]
"""

from __future__ import annotations

import csv
import sys


def _num(v: str) -> float:
    try:
        return float(v.replace(",", ""))
    except ValueError:
        return 0.0


def main() -> None:
    path = sys.argv[1]
    top = int(sys.argv[2]) if len(sys.argv) > 2 else 40
    with open(path, newline="") as fh:
        rows = [r for r in csv.reader(fh) if r]
    hi = next(i for i, r in enumerate(rows) if "Address" in r or "# Address" in r)
    hdr = rows[hi]
    body = [r for r in rows[hi + 1 :] if len(r) == len(hdr)]
    col = {h: i for i, h in enumerate(hdr)}
    samp = next(h for h in hdr if h.startswith("Warp Stall Sampling (All"))
    src = next(h for h in hdr if h == "Source")
    addr = next(h for h in hdr if "Address" in h)
    reasons = [h for h in hdr if h.startswith("stall_") or "issue_stalled" in h]
    total = sum(_num(r[col[samp]]) for r in body)
    print(f"{len(body)} instructions, {total:.0f} samples; reasons: {len(reasons)} columns")
    agg = {h: sum(_num(r[col[h]]) for r in body) for h in reasons}
    print(
        "by reason:",
        ", ".join(
            f"{h} {v / total:.1%}" for h, v in sorted(agg.items(), key=lambda x: -x[1])[:10] if v
        ),
    )
    base = min(int(r[col[addr]], 16) for r in body)  # offsets as in an offline SASS listing
    by_addr = sorted(body, key=lambda r: int(r[col[addr]], 16))
    pos = {id(r): i for i, r in enumerate(by_addr)}
    body.sort(key=lambda r: -_num(r[col[samp]]))
    for r in body[:top]:
        if "BRA" in r[col[src]]:  # a wait loop's branch: name the barrier it polls
            i = pos[id(r)]
            near = [
                x[col[src]] for x in by_addr[max(0, i - 12) : i] if "SYNCS.PHASECHK" in x[col[src]]
            ]
            if near:
                print(f"        polls: {near[-1].strip()[:70]}")
        why = sorted(((_num(r[col[h]]), h) for h in reasons), reverse=True)[:3]
        why_s = " ".join(f"{h.replace('stall_', '')}:{v:.0f}" for v, h in why if v)
        off = int(r[col[addr]], 16) - base
        print(f"{off:#07x} {_num(r[col[samp]]) / total:6.2%} {r[col[src]][:60]:60s} {why_s}")


if __name__ == "__main__":
    main()
