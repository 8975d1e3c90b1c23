#!/usr/bin/env bash
# Device call: GPU tests of the keys-as-M MLA kernel (h_q 1/16/20, bf16 + rope-aware), then
# timings of it against the 64-row kernel (bench/gpu_mla_dev.py). Results under $OUT.
set -uo pipefail
export PYTHONPATH=$PWD/src:${PYTHONPATH:-}
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_triton_mla.py \
    -k "(bf16-576 or rope_aware-576) and (576-1] or 576-16] or 576-20]) or graph" 2>&1 \
    | tee "$OUT/gpu_tests_mla.log" | grep -E "passed|failed|FAILED|Error|assert" | tail -20
timeout 240 python3 bench/gpu_mla_dev.py --out "$OUT" --cases "h16" 2>&1 | tee "$OUT/mla_dev.log" \
    | grep -v "^{" | tail -40
