#!/usr/bin/env bash
# The sequential A/B on one card (issue 45, step 2; issue 47), prepared on CPU on 2026-11-28 (no GPU
# lent). Its own call, after device-call.sh has run (the next session with time left, or a later
# one). From the repo root, after `make gpu-kit`:
#   run  command="bash docs/gpu-runs/next/ab-call.sh"  carry=[".kit"]  kind=nvidia-h100-x1  timeout_s=540
# Two rows, a microbenchmark and a training row. Each trial is `selftest --ab current,twin`: this
# interpreter against itself, with 0% or 2% more real work planted in the candidate's steps
# (--perf-ab-inject-slowdown), minimum effect 2% (the GPU profiles'), at most 8 pairs. selftest
# writes each level's verdicts, pairs spent and measured slowdowns (--json). The model's prediction
# for the same rows is printed last (selftest --simulate), to set beside them in docs/trust.md:
#   - microbench.device_copy, 2 trials a level, at most 230 s;
#   - mixed_precision.amp, 1 trial a level, at most 230 s.
# At most 8 files come back from $OUT: everything is packed into ab.tar.gz beside ab.log.
name=ab-call
log=ab.log
# shellcheck source=docs/gpu-runs/next/call-start.sh
source docs/gpu-runs/next/call-start.sh
twin=(--ab current,twin --perf-env "twin=$(command -v python3)" --perf-min-effect=0.02 --levels 0,2)

stage "1 device copy"
timeout --kill-after=10 230 python3 -m perfsuite selftest bench_tests/test_microbench.py -k "microbench.device_copy" \
  "${twin[@]}" --trials 2 --json "$work/ab-device-copy.json"
echo "device copy exit $?"

stage "2 BERT AMP"
timeout --kill-after=10 230 python3 -m perfsuite selftest bench_tests/test_mixed_precision.py -k "mixed_precision.amp" \
  "${twin[@]}" --trials 1 --json "$work/ab-amp.json"
echo "amp exit $?"

stage "3 the model's prediction"
python3 -m perfsuite selftest --simulate --draws 20000 2>&1 \
  | grep -E "^== |sequential A/B|minimum effect|device_copy|mixed_precision.amp" | tee "$work/simulate.txt"

stage "done"
tar -czf "$OUT/ab.tar.gz" -C "$work" .
ls -la "$OUT"
