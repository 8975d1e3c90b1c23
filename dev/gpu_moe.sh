#!/usr/bin/env bash
# One device call for the routed experts (`ops.moe`): their GPU tests and the MoE models' (bf16
# logits against transformers, the FP8 branch, CUDA graphs against eager for every family and
# FP8 DeepSeek), the DeepSeek-V2-Lite and V3-slice model steps (bench_model). Logs and JSON under
# $OUT. SWEEP=b64 adds dev/sweep_moe.py's shapes matching it (launch-shape variants).
#   [SWEEP=b64] bash dev/gpu_moe.sh
set -uo pipefail
. dev/probe_env.sh
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
timeout "${TEST_S:-200}" python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_moe.py \
    tests/test_moe_experts.py \
    "tests/test_models_deepseek.py::test_gpu_bfloat16_logits_close_to_hf" \
    "tests/test_models_deepseek.py::test_fp8_decode_goes_through_the_fused_branch" \
    "tests/test_models_hf.py::test_gpu_bfloat16_logits_close_to_hf[gpt_oss]" \
    "tests/test_engine_cuda_graphs.py::test_cuda_graphs_match_eager_on_cuda" 2>&1 \
    | tee "$OUT/tests.log" | grep -E "passed|failed|FAILED|Error" | tail -8
if [ -n "${SWEEP:-}" ]; then
    timeout 200 python3 dev/sweep_moe.py "$OUT/sweep_moe.json" --only "$SWEEP" 2>&1 \
        | tee "$OUT/sweep.log" | grep -v "^$"
fi
for m in deepseek-v2-lite deepseek-v3-slice; do
    timeout 230 python3 bench/bench_model.py --only "$m" --out "$OUT/model_$m.json" 2>&1 \
        | tee "$OUT/model_$m.log" | grep -v "^\[bench\] {" | tail -20
done
