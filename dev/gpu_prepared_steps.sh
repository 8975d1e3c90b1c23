#!/usr/bin/env bash
# One device call for prepared `mha` calls of every plan (mixed steps, step plans, prefill)
# and the small ops' cached launches: the GPU tests that take them (the prepared-call, cached
# launch, fused-op and store files in full on CUDA, mixed steps, step plans, the engine's
# graphs and its no-compile stream; MODEL_TESTS=1: the models' GPU tests), then
# dev/host_cost_gpu.py's engine layer calls and MHA decode rows, then (MODEL=1b) bench_model's
# case (its eager step). Logs and records under $OUT; the short tables last.
#   bash dev/gpu_prepared_steps.sh
set -uo pipefail
. dev/probe_env.sh
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv > "$OUT/gpu.txt"
timeout "${TEST_S:-300}" python3 -m pytest -v -p no:cacheprovider -n "${WORKERS:-8}" \
    -W ignore::pytest.PytestWarning tests/test_prepared_steps.py tests/test_prepared_launch.py \
    tests/test_mha_mixed.py tests/test_mha_step_plan.py tests/test_cached_launch.py \
    tests/test_fused_ops.py tests/test_triton_store.py \
    "tests/test_engine_cuda_graphs.py::test_serving_compiles_no_kernel_after_start_up" \
    "tests/test_engine_cuda_graphs.py::test_cuda_graphs_match_eager_on_cuda" \
    ${MORE_TESTS:-} > "$OUT/gpu_tests.log" 2>&1
echo "tests: $(grep -c ' PASSED ' "$OUT/gpu_tests.log") passed," \
    "$(grep -c ' SKIPPED ' "$OUT/gpu_tests.log") skipped," \
    "$(grep -cE ' (FAILED|ERROR) ' "$OUT/gpu_tests.log") failed"
grep -E "^(FAILED|ERROR)|^E " "$OUT/gpu_tests.log" | head -12
if [ -n "${MODEL_TESTS:-}" ]; then  # the models' GPU tests (HF logits and tokens, DeepSeek)
    timeout "${MODEL_TEST_S:-200}" python3 -m pytest -v -m gpu -p no:cacheprovider \
        -n "${WORKERS:-8}" -W ignore::pytest.PytestWarning tests/test_models_hf.py \
        tests/test_models_deepseek.py tests/test_engine.py > "$OUT/gpu_model_tests.log" 2>&1
    echo "model tests: $(grep -c ' PASSED ' "$OUT/gpu_model_tests.log") passed," \
        "$(grep -cE ' (FAILED|ERROR) ' "$OUT/gpu_model_tests.log") failed"
    grep -E "^(FAILED|ERROR)|^E " "$OUT/gpu_model_tests.log" | head -12
fi
timeout "${HOST_S:-150}" python3 dev/host_cost_gpu.py --op step > "$OUT/host_step.log" 2>&1
echo "host_cost_gpu --op step rc $?"; grep -E "step \(|FAILED|checks" "$OUT/host_step.log"
if [ -z "${NO_HOST_MHA:-}" ]; then
    timeout "${HOST_S:-150}" python3 dev/host_cost_gpu.py --op mha > "$OUT/host_mha.log" 2>&1
    echo "host_cost_gpu --op mha rc $?"; sed -n '/host cost per eager call/,$p' "$OUT/host_mha.log"
fi
if [ -n "${MODEL:-}" ]; then
    timeout "${MODEL_S:-200}" python3 bench/bench_model.py --only "$MODEL" \
        --out "$OUT/model.json" > "$OUT/model.log" 2>&1
    echo "bench_model rc $?"; tail -12 "$OUT/model.log"
fi
