#!/usr/bin/env bash
set -u
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,pci.bus_id,serial,clocks.sm,clocks.max.sm,clocks.mem,temperature.gpu,power.draw,power.limit,clocks_throttle_reasons.active --format=csv
prefix=$(mktemp -d /tmp/kit2.XXXXXX)
python3 -m pip install -q --no-index --no-deps --no-compile --target "$prefix" .kit/*.whl
PYTHONPATH=$prefix timeout --kill-after=10 150 python3 -m pytest bench_tests -p no:cacheprovider --perf-op-profiles=off \
  -k "graph_optimization.amp or mixed_precision.amp or device_copy or bert_layer_fwd_bwd or gpt2_layer_fwd_bwd" \
  --perf-json "$OUT/diag.json" > "$OUT/diag.log" 2>&1
echo "diag exit $?" >> "$OUT/diag.log"
nvidia-smi --query-gpu=clocks.sm,temperature.gpu,power.draw,clocks_throttle_reasons.active --format=csv >> "$OUT/diag.log"
tail -25 "$OUT/diag.log"
