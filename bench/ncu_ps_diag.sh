#!/usr/bin/env bash
# Where the persistent V32 kernel (gluon_mla_ps) waits longer than gluon_mla_ss: one Nsight
# Compute report a variant (sparse V32 b 128 s_q 2 h_q 128 top-k 2048, one launch, clocks left
# as found) with warp-state samples a SASS instruction, digested by ncu_sass_hot.py.
#   [VARIANTS="ss ss_ps_g256t ss_ps"] bash bench/ncu_ps_diag.sh
# Writes $OUT/<variant>.ncu-rep and $OUT/<variant>_hot.txt (and <variant>.err if ncu failed).
set -u
. bench/probe_env.sh >/dev/null 2>&1
dir=${OUT:-/tmp}
for v in ${VARIANTS:-ss ss_ps_g256t ss_ps}; do
    timeout 240 ncu --clock-control none --kernel-name "regex:_mla_decode_sm90_(ss|ps)" \
        --launch-skip 2 --launch-count 1 --section SourceCounters --section WarpStateStats \
        --section SpeedOfLight --import-source no -f -o "$dir/$v" \
        python3 bench/profile_mla.py sparse v32 128 2 8192 auto "$v" >"$dir/$v.err" 2>&1 \
        || { echo "== $v: ncu failed"; tail -5 "$dir/$v.err"; continue; }
    ncu --import "$dir/$v.ncu-rep" --page source --csv --print-source sass >"$dir/$v.csv" 2>/dev/null
    {
        echo "== $v"
        ncu --import "$dir/$v.ncu-rep" --page raw --csv 2>/dev/null | python3 -c '
import csv, sys
rows = list(csv.reader(sys.stdin))
for h, u, v in zip(rows[0], rows[1], rows[2]):
    if h.startswith(("gpu__time_duration.sum", "sm__cycles_elapsed.avg.per_second",
                     "smsp__average_warp_latency_per_inst_issued")):
        print(f"  {h} = {v} {u}")'
        python3 bench/ncu_sass_hot.py "$dir/$v.csv" 30
    } >"$dir/${v}_hot.txt" 2>&1
    head -60 "$dir/${v}_hot.txt"
    rm -f "$dir/$v.csv" "$dir/$v.err"
done
