#!/usr/bin/env bash
# Profile one kernel launch with Nsight Compute (clocks left as found) and print a short
# digest: speed of light, tensor / MUFU pipe use, L2 and DRAM throughput, stall reasons.
#   [HOT=N] dev/ncu_profile.sh NAME KERNEL_REGEX python3 dev/profile_prefill.py g128n3
# Writes $OUT/NAME.ncu-rep (if OUT is set) and prints the digest. HOT=N: also warp-stall
# samples a SASS instruction (SourceCounters), and the N hottest instructions after the digest
# (dev/ncu_sass_hot.py).
set -u
name=$1; regex=$2; shift 2
dir=${OUT:-/tmp}
hot=()
if [ -n "${HOT:-}" ]; then hot=(--section SourceCounters --import-source no); fi
metrics=sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active
metrics+=,sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active
metrics+=,sm__inst_executed_pipe_fma.avg.pct_of_peak_sustained_active
metrics+=,sm__inst_executed_pipe_alu.avg.pct_of_peak_sustained_active
metrics+=,lts__t_bytes.sum.per_second,dram__bytes_read.sum.per_second
metrics+=,lts__t_sectors.avg.pct_of_peak_sustained_elapsed,smsp__issue_active.avg.pct_of_peak_sustained_active
ncu --clock-control none --kernel-name "regex:$regex" --launch-skip 2 --launch-count 1 \
    --section SpeedOfLight --section WarpStateStats --section LaunchStats --section Occupancy \
    "${hot[@]}" --metrics "$metrics" -f -o "$dir/$name" "$@" >/dev/null 2>"$dir/$name.err" || {
    echo "== $name: ncu failed"; tail -5 "$dir/$name.err"; exit 0; }
echo "== $name"
ncu --import "$dir/$name.ncu-rep" --page raw --csv 2>/dev/null | python3 -c '
import csv, sys
rows = list(csv.reader(sys.stdin))
hdr, units, val = rows[0], rows[1], rows[2]
want = ("gpu__time_duration.sum", "launch__registers_per_thread", "launch__grid_size",
        "sm__pipe_tensor_op_hmma_cycles_active.avg.pct", "sm__inst_executed_pipe_xu",
        "sm__inst_executed_pipe_fma", "sm__inst_executed_pipe_alu", "lts__t_bytes.sum.per_second",
        "dram__bytes_read.sum.per_second", "lts__t_sectors.avg.pct", "smsp__issue_active.avg.pct",
        "sm__warps_active.avg.pct", "smsp__average_warp_latency_per_inst_issued")
for h, u, v in zip(hdr, units, val):
    if h.startswith(want):
        print(f"  {h} = {v} {u}")
st = []
for h, u, v in zip(hdr, units, val):
    if "issue_stalled" in h and h.endswith(("per_issue_active.ratio", "per_warp_active.pct")):
        try:
            st.append((float(v), h.split("issue_stalled_")[1].split("_per_")[0]))
        except ValueError:
            pass
st.sort(reverse=True)
print("  stalls (cycles a issued instruction): " + ", ".join(f"{n} {v:.0f}" for v, n in st[:8]))
'
if [ -n "${HOT:-}" ]; then
    ncu --import "$dir/$name.ncu-rep" --page source --csv --print-source sass >"$dir/$name.csv" \
        2>/dev/null
    python3 "$(dirname "$0")/ncu_sass_hot.py" "$dir/$name.csv" "$HOT"
    rm -f "$dir/$name.csv"
fi
