#!/usr/bin/env bash
# One device call: the GPU test suite, then the benchmark suite. Results under $OUT (each
# test's seconds and Triton compiles in test_times.jsonl).
#   [TEST_S=290] [BENCH_S=300] bash bench/gpu_session.sh [extra pytest args]
# (The full MLA GPU grid, 1920 cases (a test each since 2026-11-28; 160 tests of 12 before),
# takes ~18 min at -n 15 on an H100 host: split it over calls with -k (e.g. "test_gpu_grid
# and dense", then "... and sparse"), with TRITON_CACHE_DIR in an ignored folder of the repo
# carried between the calls so that a warm machine keeps its compiled kernels. Its ~800
# kernel specializations are not all of that time: an offline sm_90 compile of one takes
# 1.5-3 s on a 2-core CPU machine (2026-11-28), and test_times.jsonl says how much of each
# test is compiles. On any machine, `pytest tests/test_sm90_compile.py` puts the grid's
# kernels through the front end in ~1 min.)
set -uo pipefail
. bench/probe_env.sh
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv | tee "$OUT/gpu.txt"
PAGEDATTN_TEST_TIMES="$OUT/test_times.jsonl" timeout "${TEST_S:-290}" python3 -m pytest -q -m gpu --maxfail=30 -p no:cacheprovider tests "$@" \
    2>&1 | tee "$OUT/gpu_tests.log" | grep -E "passed|failed|FAILED|Error" | tail -25
timeout "${BENCH_S:-300}" python3 bench/run_all.py --out "$OUT/results.json" 2>&1 \
    | tee "$OUT/bench.log" | grep -v "^\[bench\] {" | tail -45
