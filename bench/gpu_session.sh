#!/usr/bin/env bash
# One device call: the GPU test suite, then the benchmark suite. Results under $OUT.
#   bash bench/gpu_session.sh [pytest -k expr]
set -uo pipefail
. bench/probe_env.sh
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv | tee "$OUT/gpu.txt"
timeout 300 python3 -m pytest -q -m gpu -x -p no:cacheprovider tests ${1:+-k "$1"} 2>&1 \
    | tee "$OUT/gpu_tests.log" | tail -15
timeout 280 python3 bench/run_all.py --out "$OUT/results.json" 2>&1 | tee "$OUT/bench.log" \
    | grep -v "^\[bench\] {" | tail -40
