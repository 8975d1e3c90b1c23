#!/usr/bin/env bash
# One device call for the MLA contiguous runs: the GPU tests that take the balanced paths, then
# bench_real's MLA cases as shipped, forced onto the runs, and on the item list. Logs and
# records under $OUT; the short tables last.
#   bash dev/gpu_mla_runs.sh
set -uo pipefail
. dev/probe_env.sh
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv > "$OUT/gpu.txt"
timeout "${TEST_S:-300}" python3 -m pytest -v -m gpu --maxfail=20 -p no:cacheprovider \
    tests/test_mla_worklist.py tests/test_prepared_mla.py tests/test_mla_dims.py \
    "tests/test_nan_semantics.py::test_gpu_mla_dense" \
    "tests/test_triton_mla.py::test_gpu_cuda_graph_replay_with_changing_lengths" \
    ${MORE_TESTS:-} > "$OUT/gpu_tests.log" 2>&1
echo "tests: $(grep -c PASSED "$OUT/gpu_tests.log") passed, $(grep -c SKIPPED "$OUT/gpu_tests.log") skipped, $(grep -c FAILED "$OUT/gpu_tests.log") failed"; grep -E "FAILED|^E " "$OUT/gpu_tests.log" | head -10
run() {  # name, tuning json, --only filter
    PAGEDATTN_MLA_TUNING="$2" timeout "${BENCH_S:-150}" python3 bench/bench_real.py \
        --only "$3" --out "$OUT/real_$1.json" > "$OUT/bench_$1.log" 2>&1
    echo "== $1 ($2)"; grep -E "^mla|^sparse" "$OUT/bench_$1.log" | sed 's/  */ /g'
}
run default '{}' "${ONLY:-mla}"
[ -n "${FORCED:-}" ] && run forced_runs '{"wl_one_wave": false}' "mla hq16"
[ -n "${ITEMS:-}" ] && run items '{"wl_runs": false}' "mla hq16"
