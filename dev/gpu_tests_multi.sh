#!/usr/bin/env bash
# GPU tests (and the `slow` CPU checks: the full offline sm_90 compiles) in one device call on a
# multi-GPU host (nvidia-h200-x4) or one H200: xdist workers spread over
# GPUS (tests/conftest.py, PAGEDATTN_TEST_GPUS); a line a test in $OUT/gpu_tests.log, and its
# seconds and Triton compiles in $OUT/test_times.jsonl (PAGEDATTN_TEST_TIMES).
#   [GPUS=0,1,2,3] [WORKERS=nproc] [TEST_S=520] [TESTS=tests] bash dev/gpu_tests_multi.sh [pytest args]
# Keep TEST_S below the call's limit: a killed run leaves only the lines of the tests done.
# (2026-11-28, an H200 x4 host at -n 64, each worker with its share of the cores for torch:
# all 2096 GPU tests passed in 177 s, a grid case 1.8 s (median), 78% of the workers' time in
# Triton compiles; record bench/results/h200x4_2026-11-28_gpu_tests.json. Before that share,
# at -n 56-60: ~130 tests in 520-540 s, the grid's tests of 12 cases ~300 s each. Select with
# TESTS and -k.)
set -uo pipefail
. dev/probe_env.sh
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
rm -f "$OUT/test_times.jsonl"
all=$(nvidia-smi --query-gpu=index --format=csv,noheader | paste -sd, -)
export PAGEDATTN_TEST_GPUS=${GPUS:-$all} PAGEDATTN_TEST_TIMES=$OUT/test_times.jsonl
nvidia-smi --query-gpu=index,name,clocks.sm,temperature.gpu --format=csv | tee "$OUT/gpus.txt"
# shellcheck disable=SC2086
timeout "${TEST_S:-520}" python3 -m pytest -v -m "gpu or slow" -rfE -p no:cacheprovider \
    -W ignore::pytest.PytestWarning -n "${WORKERS:-$(nproc)}" --durations=30 \
    ${TESTS:-tests} "$@" >"$OUT/gpu_tests.log" 2>&1
echo "rc $?: $(grep -c ' PASSED ' "$OUT/gpu_tests.log") passed," \
    "$(grep -cE ' (FAILED|ERROR) ' "$OUT/gpu_tests.log") failed"
grep -E " (FAILED|ERROR) |^(FAILED|ERROR) " "$OUT/gpu_tests.log" | head -30
tail -5 "$OUT/gpu_tests.log"
python3 - "$OUT/test_times.jsonl" <<'PY'
import json, sys
try:
    rows = [json.loads(line) for line in open(sys.argv[1])]
except OSError:
    sys.exit()
tot = sum(r["s"] for r in rows)
comp = sum(r["compile_s"] for r in rows)
print(f"{len(rows)} tests: {tot:.0f} worker-s, of which Triton compiles {comp:.0f} s"
      f" ({sum(r['compiles'] for r in rows)} compiles, {sum(r['cache_hits'] for r in rows)} hits)")
for r in sorted(rows, key=lambda r: -r["s"])[:8]:
    print(f"  {r['s']:7.1f} s  compile {r['compile_s']:6.1f} s ({r['compiles']})  {r['test']}")
PY
