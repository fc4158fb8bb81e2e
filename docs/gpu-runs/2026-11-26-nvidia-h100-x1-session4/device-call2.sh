#!/usr/bin/env bash
set -u
export PYTHONUNBUFFERED=1
KIT=.kit OUT=$OUT bash scripts/gpu-bootstrap.sh 190s --levels 0 --trials 2 \
  -k "mixed_precision or (graph_optimization and not ort and not compile)"
echo "bootstrap exit $?"
prefix=$(mktemp -d /tmp/kit2.XXXXXX)
python3 -m pip install -q --no-index --no-deps --no-compile --target "$prefix" .kit/*.whl
start=$(date +%s)
PYTHONPATH=$prefix:build timeout --kill-after=10 110 python3 -m pytest bench_tests/test_model_state_sharding.py \
  -p capplugin -k ddp_fp32 --perf-profile cuda-32gb --perf-op-profiles=auto --perf-artifacts build/oom-art \
  -p no:cacheprovider -rA > "$OUT/oom.log" 2>&1
echo "oom check exit $? in $(( $(date +%s) - start ))s" | tee -a "$OUT/oom.log"
ls -la build/oom-art >> "$OUT/oom.log" 2>&1
tar czf "$OUT/oom-art.tar.gz" build/oom-art 2>/dev/null
tail -30 "$OUT/oom.log"
