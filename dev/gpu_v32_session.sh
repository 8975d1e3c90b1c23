#!/bin/bash
# One device call (issue 5, sparse V32): seesaw checks of CHECK variants (comma list), two
# timing passes of the VARIANTS regex over the CASES regex, then the tile trace of TILE
# variants. EXTRA: more gpu_mla_dev.py arguments (--cold: the suite's cold-L2 times); T1, T2: the
# passes' time limits (s). Run from the repo root on the GPU machine; logs and JSON under $OUT.
. bench/probe_env.sh >/dev/null 2>&1; export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu --format=csv,noheader
CASES=${CASES:-sparse v32 h128 sq2}
ck=(--checks none); [ -n "$CHECK" ] && ck=(--checks ss --ss-variants "$CHECK")
timeout ${T1:-300} python3 bench/gpu_mla_dev.py "${ck[@]}" --cases "$CASES" --variants "$VARIANTS" \
    $EXTRA --out /tmp/d1 > $OUT/dev1.log 2>&1; echo rc1 $?
cp /tmp/d1/mla_dev.json $OUT/mla_dev1.json
timeout ${T2:-200} python3 bench/gpu_mla_dev.py --checks none --cases "$CASES" --variants "$VARIANTS" \
    $EXTRA --out /tmp/d2 > $OUT/dev2.log 2>&1; echo rc2 $?
cp /tmp/d2/mla_dev.json $OUT/mla_dev2.json
if [ -n "$TILE" ]; then
    timeout 100 python3 bench/gpu_mla_dev.py --checks none --cases "^none$" --tile-trace "$TILE" \
        --tile-shared "" --out /tmp/d3 > $OUT/tile.log 2>&1; echo rc3 $?
fi
grep -E "^check|FAIL|Error|error" $OUT/dev1.log | sed 's/{.max_abs.*cos/cos/' | cut -c1-150 | tail -30
for f in dev1 dev2; do grep -A60 "^copy" $OUT/$f.log | grep -v "^check" | cut -c1-100; done
grep tiletrace $OUT/tile.log 2>/dev/null | cut -c1-500; tail -2 $OUT/tile.log 2>/dev/null
