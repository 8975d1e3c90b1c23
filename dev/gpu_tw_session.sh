#!/bin/bash
# One device call (issue 5, rope-aware FP8 MLA, gluon_mla_tw): graph replays of launch VARIANTS
# (regex, default: the producer's addressing variants) from HBM and L2, then the tw GPU tests
# matching K (pytest -k). Run from the repo root on the GPU machine; results under $OUT.
. bench/probe_env.sh >/dev/null 2>&1; export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu --format=csv,noheader
timeout ${T:-150} python3 bench/gpu_mla_dev.py --checks none --cases "rope-fp8 h16 (4k|8k)$" \
    --variants "${VARIANTS:-sm90tw|sm90tw_old|sm90tw_psc|sm90tw_a}" --shared L2 --out $OUT \
    > $OUT/dev.log 2>&1; tail -17 $OUT/dev.log
timeout ${TEST_S:-300} python3 -m pytest -q -m gpu -p no:cacheprovider -n 14 tests/test_triton_mla.py \
    -k "${K:-rope_aware_tile_boundaries}" 2>&1 | tee $OUT/tests.log | grep -E "passed|failed|FAILED|Error" | tail -12
