#!/bin/bash
# One device call (issue 5, rope-aware FP8 MLA): `mla_fp8_cvt_probe.py` in each of MODES
# (default: the library's kernel, its V upcast as before, both upcasts swapped, K's, V's, the
# library's again), one process a mode; a table of graph-replay times last. Run from the repo
# root on the GPU machine; JSON under $OUT.
. bench/probe_env.sh >/dev/null 2>&1; export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu --format=csv,noheader
for m in ${MODES:-f2fp old prmt_kv prmt_k prmt_v f2fp}; do
    timeout ${T:-120} python3 bench/mla_fp8_cvt_probe.py --mode $m --out /tmp/cvt >> $OUT/cvt.log 2>&1
    echo "$m rc $?"; cp /tmp/cvt/cvt_$m.json $OUT/cvt_${m}_$((++i)).json 2>/dev/null
done
python3 - <<'PY'
import glob, json, os
for f in sorted(glob.glob(os.environ["OUT"] + "/cvt_*.json"), key=lambda p: int(p.rsplit("_", 1)[1][:-5])):
    for r in json.load(open(f))["rows"]:
        print(f"{r['mode']:8s} s_k {r['s_k']:5d} {r['shared']:4s} {r['ms']:.4f} ms  ({' '.join(f'{t:.4f}' for t in r['ms_all'])})")
PY
grep -iE "error|Traceback" $OUT/cvt.log | head -5
