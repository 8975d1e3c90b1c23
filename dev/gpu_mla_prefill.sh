#!/usr/bin/env bash
# One device call for MLA's expanded prefill (issue 58): bench_mha's DeepSeek-V3 case (128
# heads, d_qk 192 / d_v 128, causal, 8 x 2048 over 2048) against FlashInfer's ragged prefill,
# then (FORMS=1) bench_mla_forms' absorbed / expanded crossover. Logs and records under $OUT.
#   bash dev/gpu_mla_prefill.sh
set -uo pipefail
. dev/probe_env.sh
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
cd bench
timeout "${PREFILL_S:-150}" python3 -c "
import bench_mha, json
from common import flashinfer
recs = []
bench_mha.bench_mla_prefill(recs, flashinfer())
for r in recs:
    print(r.impl, r.config, round(float(r.ms), 4), 'ms', round(r.flops / float(r.ms) / 1e9, 1), 'TFLOP/s')
json.dump([r.__dict__ for r in recs], open('$OUT/mla_prefill.json', 'w'), default=str, indent=1)
" > "$OUT/mla_prefill.log" 2>&1
tail -4 "$OUT/mla_prefill.log"
if [ -n "${FORMS:-}" ]; then
    timeout "${FORMS_S:-200}" python3 bench_mla_forms.py --out "$OUT/mla_forms.json" > "$OUT/mla_forms.log" 2>&1
    tail -14 "$OUT/mla_forms.log"
fi
