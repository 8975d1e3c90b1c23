#!/usr/bin/env bash
# One device call for the routed experts (`ops.moe`): GPU tests, sweeps (dev/sweep_moe.py) and
# model steps (bench_model), logs and JSON under $OUT. Environment:
#   TESTS   pytest arguments (default: the routed experts' and MoE models' GPU tests: bf16 logits
#           against transformers, the FP8 branch, CUDA graphs against eager for every family
#           and FP8 DeepSeek); TESTS=- skips them
#   SWEEPS  "SHAPE:VARIANTS;..." (dev/sweep_moe.py --only SHAPE --variants VARIANTS), e.g.
#           "b64:shipped,n32;v3 b64 fp8:shipped,fp8"; default none
#   MODELS  bench_model cases (default "deepseek-v2-lite deepseek-v3-slice"); MODELS=- none
#   [TESTS=...] [SWEEPS=...] [MODELS=...] bash dev/gpu_moe.sh
set -uo pipefail
. dev/probe_env.sh
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
DEFAULT_TESTS="tests/test_moe.py tests/test_moe_experts.py
 tests/test_models_deepseek.py::test_gpu_bfloat16_logits_close_to_hf
 tests/test_models_deepseek.py::test_fp8_decode_goes_through_the_fused_branch
 tests/test_models_hf.py::test_gpu_bfloat16_logits_close_to_hf[gpt_oss]
 tests/test_engine_cuda_graphs.py::test_cuda_graphs_match_eager_on_cuda"
TESTS=${TESTS:-$DEFAULT_TESTS}
if [ "$TESTS" != "-" ]; then
    # shellcheck disable=SC2086
    timeout "${TEST_S:-200}" python3 -m pytest -q -m gpu -p no:cacheprovider $TESTS 2>&1 \
        | tee "$OUT/tests.log" | grep -E "passed|failed|FAILED|Error" | tail -8
fi
i=0
IFS=';' read -ra sweeps <<< "${SWEEPS:-}"
for sw in "${sweeps[@]}"; do
    i=$((i + 1))
    timeout "${SWEEP_S:-120}" python3 dev/sweep_moe.py "$OUT/sweep_$i.json" --only "${sw%%:*}" \
        --variants "${sw#*:}" 2>&1 | tee "$OUT/sweep_$i.log" | grep -v "^$"
done
MODELS=${MODELS:-deepseek-v2-lite deepseek-v3-slice}
if [ "$MODELS" != "-" ]; then
    for m in $MODELS; do
        timeout "${MODEL_S:-230}" python3 bench/bench_model.py --only "$m" \
            --out "$OUT/model_$m.json" 2>&1 | tee "$OUT/model_$m.log" | grep -v "^\[bench\] {" \
            | tail -20
    done
fi
