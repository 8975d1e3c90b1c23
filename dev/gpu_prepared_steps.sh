#!/usr/bin/env bash
# One device call for prepared `mha` calls of every plan (mixed steps, step plans, prefill):
# the GPU tests that take them (the prepared-call files in full on CUDA, mixed steps, step
# plans, the engine's graphs and its no-compile stream), then dev/host_cost_gpu.py's engine
# layer calls and MHA decode rows, then bench_model's 1B case (its eager step). Logs and
# records under $OUT; the short tables last.
#   bash dev/gpu_prepared_steps.sh
set -uo pipefail
. dev/probe_env.sh
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv > "$OUT/gpu.txt"
timeout "${TEST_S:-300}" python3 -m pytest -v -p no:cacheprovider -n "${WORKERS:-8}" \
    -W ignore::pytest.PytestWarning tests/test_prepared_steps.py tests/test_prepared_launch.py \
    tests/test_mha_mixed.py tests/test_mha_step_plan.py \
    "tests/test_engine_cuda_graphs.py::test_serving_compiles_no_kernel_after_start_up" \
    "tests/test_engine_cuda_graphs.py::test_cuda_graphs_match_eager_on_cuda" \
    ${MORE_TESTS:-} > "$OUT/gpu_tests.log" 2>&1
echo "tests: $(grep -c ' PASSED ' "$OUT/gpu_tests.log") passed," \
    "$(grep -c ' SKIPPED ' "$OUT/gpu_tests.log") skipped," \
    "$(grep -cE ' (FAILED|ERROR) ' "$OUT/gpu_tests.log") failed"
grep -E "^(FAILED|ERROR)|^E " "$OUT/gpu_tests.log" | head -12
timeout "${HOST_S:-150}" python3 dev/host_cost_gpu.py --op step > "$OUT/host_step.log" 2>&1
echo "host_cost_gpu --op step rc $?"; grep -E "step \(|FAILED|checks" "$OUT/host_step.log"
timeout "${HOST_S:-150}" python3 dev/host_cost_gpu.py --op mha > "$OUT/host_mha.log" 2>&1
echo "host_cost_gpu --op mha rc $?"; sed -n '/host cost per eager call/,$p' "$OUT/host_mha.log"
if [ -n "${MODEL:-}" ]; then
    timeout "${MODEL_S:-200}" python3 bench/bench_model.py --only "$MODEL" \
        --out "$OUT/model.json" > "$OUT/model.log" 2>&1
    echo "bench_model rc $?"; tail -12 "$OUT/model.log"
fi
