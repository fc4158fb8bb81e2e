#!/usr/bin/env bash
# The next GPU session's one call, prepared on CPU (fifth session, 2026-11-26, no GPU lent).
# From the repo root, after `make gpu-kit`:
#   run  command="bash docs/gpu-runs/next/device-call.sh"  carry=[".kit"]  kind=nvidia-h100-x1  timeout_s=560
# A rerun on the warm machine: first extract the returned bootstrap.tar.gz at the repo root (it holds
# build/bootstrap and the baselines the call recorded: tracked files travel as they are here), then
# carry [".kit", "build/bootstrap"]. Otherwise give_back.
#  1. The bootstrap, 380 s, on the 15 rows the H100 profile still lacks (compile, the plain-shape
#     matmuls, vector_mul, the Trainer's other batches, tp1_pp1_mcore, ddp_fp32 at 80 GB). At their
#     groups' measured costs (~35-60 s a baseline with its op profile) it records about six of them,
#     cheapest group first; their cv and a 0% selftest (--levels 0: detection at 3/5/10% is measured,
#     the 0% tally is short) run if time is left. tp1_pp1_mcore has never run: megatron-core needs CUDA.
#  2. One CUDA OOM under a 20 GiB cap (oomcheck.py), to see the allocator snapshot's timeline
#     (device_traces) that the fourth session's mend should keep. ~70-150 s.
set -u
export PYTHONUNBUFFERED=1
here=docs/gpu-runs/next
missing="compile or gpu1_bs4 or gpu1_bs8 or gpu1_bs16_fp32 or matmul_fp16 or matmul_bf16 or matmul_fp32"
missing="$missing or matmul_tf32 or matmul_fp8 or vector_mul or tp1_pp1_mcore or ddp_fp32"
KIT=.kit OUT=$OUT bash scripts/gpu-bootstrap.sh 380s --levels 0 --trials 2 -k "$missing"
echo "bootstrap exit $?"

prefix=$(mktemp -d /tmp/kit2.XXXXXX)
python3 -m pip install -q --no-index --no-deps --no-compile --target "$prefix" .kit/*.whl
start=$(date +%s)
PYTHONPATH=$prefix:$here timeout --kill-after=10 150 python3 -m pytest bench_tests/test_model_state_sharding.py \
  -p oomcheck -k ddp_fp32 --perf-profile cuda-20gb-oomcheck --perf-artifacts build/oom-art \
  -p no:cacheprovider -rA > "$OUT/oom.log" 2>&1
echo "oom check exit $? in $(( $(date +%s) - start ))s" | tee -a "$OUT/oom.log"
PYTHONPATH=$prefix python3 "$here/oomcheck.py" build/oom-art | tee "$OUT/oom-check.txt"
tar czf "$OUT/oom-art.tar.gz" build/oom-art 2>/dev/null
tail -25 "$OUT/oom.log"
ls -la "$OUT"
