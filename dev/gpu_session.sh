#!/usr/bin/env bash
# One device call: the GPU test suite, then the benchmark suite. Results under $OUT (each
# test's seconds and Triton compiles in test_times.jsonl).
#   [TEST_S=290] [BENCH_S=300] bash dev/gpu_session.sh [extra pytest args]
# (Its pytest runs in one process, so it suits a selection, e.g. -k "ragged or graph". For
# every GPU test use dev/gpu_tests_multi.sh, which spreads xdist workers over the GPUs: on an
# H200 x4 host all 2096 passed in 177 s, 2026-11-28, 78% of the workers' time in Triton
# compiles. On any machine, `pytest tests/test_sm90_compile.py` puts the grid's kernels
# through the front end in ~1 min.)
set -uo pipefail
. dev/probe_env.sh
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv | tee "$OUT/gpu.txt"
PAGEDATTN_TEST_TIMES="$OUT/test_times.jsonl" timeout "${TEST_S:-290}" python3 -m pytest -q -m gpu --maxfail=30 -p no:cacheprovider tests "$@" \
    2>&1 | tee "$OUT/gpu_tests.log" | grep -E "passed|failed|FAILED|Error" | tail -25
timeout "${BENCH_S:-300}" python3 bench/run_all.py --out "$OUT/results.json" 2>&1 \
    | tee "$OUT/bench.log" | grep -v "^\[bench\] {" | tail -45
