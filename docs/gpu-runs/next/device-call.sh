#!/usr/bin/env bash
# The next GPU session's one call (issue 37), prepared on CPU on 2026-11-27 (no GPU lent), in the
# issue's order: every engine on CUDA, the card-to-card panel, the launch overhead. From the repo
# root, after `make gpu-kit`:
#   run  command="bash docs/gpu-runs/next/device-call.sh"  carry=[".kit"]  kind=nvidia-h100-x1  timeout_s=540
# Then commit what comes back (extract call.tar.gz at the repo root: the baselines it recorded are at
# their tracked paths, the panel table over docs/gpu-runs/panel.csv) and write the run page.
#  1. Engines, 200 s: record engines_1gpu (every engine at world size 1: ZeRO-1/2/3, ZeRO-3 with
#     offload, FSDP2, fairscale OSS/ShardedDDP/FSDP, ZeroRedundancyOptimizer, DDP) and
#     parallel_3d.tp1_pp1_mcore, one launch each, no op profile. None of these has ever run on a
#     GPU: a row that fails keeps its rank, cause and stderr tail in engines-results.json and
#     engines.log. Their calibration (cv) is the bootstrap's next step in a later session.
#  2. The panel, 150 s (panel.sh): re-records its rows with card UUIDs the first time, then gates them.
#     The same recording counts each row's step work on CUDA (--perf-work, on by default): device
#     kernels by name and host syncs, printed to engines-work.txt (issue 56's GPU side).
#  3. Warm against exec launches (issues 41, 46), 150 s: mixed_precision.amp and microbench.device_copy,
#     three exec'd and three warm launches each, interleaved, same card, into scratch baselines folders
#     (scripts/launch_overhead.sh; the warm ones share one parent per import set, as a gate run's do).
#     scripts/launch_overhead_summary.py reads max_allocated (equal to the MiB?), throughput (within
#     +-1%?) and the overhead (goal <= 3 s a training row, from 14.9 s); `explain --launch` prints each
#     breakdown (docs/lab/launch-overhead.md). A warm launch that crashes naming CUDA re-initialisation,
#     or starts `fork` with a note, means the parent touched CUDA: the note says how.
# At most 8 files come back from $OUT: everything is packed into call.tar.gz beside call.log.
name=device-call
log=call.log
# shellcheck source=docs/gpu-runs/next/call-start.sh
source docs/gpu-runs/next/call-start.sh
here=docs/gpu-runs/next
python3 -m perfsuite doctor --no-smoke > "$work/doctor.txt" 2>&1
grep -E "^profile|engine|megatron|deepspeed|fairscale" "$work/doctor.txt" | head -20

stage "1 engines on CUDA"
engines=(bench_tests/test_engines_1gpu.py "bench_tests/test_parallel_3d.py::test_parallel_3d[parallel_3d.tp1_pp1_mcore]")
timeout --kill-after=10 200 python3 -m pytest "${engines[@]}" -p no:cacheprovider -rA \
  --perf-update-baselines --perf-op-profiles=off --perf-confirm=0 --perf-json "$work/engines-results.json" \
  > "$work/engines.log" 2>&1
echo "engines exit $?"
grep -E "^(PASSED|FAILED|SKIPPED|ERROR)|perfsuite coverage" "$work/engines.log"
python3 -m perfsuite explain "$work/engines-results.json" > "$work/engines-explain.txt" 2>&1
# Step work on CUDA (issue 56): device kernels by name and host syncs, counted with the recording.
python3 - "$work/engines-results.json" <<'PY' | tee "$work/engines-work.txt"
import json, sys
from perfsuite.core.protocol import work_count_of
for r in json.load(open(sys.argv[1]))["results"]:
    count = work_count_of(r)
    if count is None:
        print(f"{r['id']}: {r['verdict']}; no step work counted")
        continue
    top = sorted(count.kernels.items(), key=lambda kv: -kv[1])[:3]
    print(f"{r['id']}: {r['verdict']}; steady {count.steady}; op calls {count.calls:g}; kernels "
          f"{sum(count.kernels.values()):g} ({len(count.kernels)} names; {top}); syncs {count.syncs}")
PY

stage "2 panel"
OUT="$work/panel" PANEL_S=150 KIT="$KIT" bash "$here/panel.sh" > "$work/panel.log" 2>&1
echo "panel exit $?"
tail -20 "$work/panel.log"

stage "3 warm against exec"
rows=("bench_tests/test_mixed_precision.py::test_mixed_precision[mixed_precision.amp]"
      "bench_tests/test_microbench.py::test_microbench[microbench.device_copy]")
PYTHON=python3 timeout --kill-after=10 150 bash scripts/launch_overhead.sh "$work/warm" 3 "${rows[@]}" \
  > "$work/warm.log" 2>&1
echo "warm against exec exit $?"
python3 scripts/launch_overhead_summary.py "$work/warm" 2>&1 | tee "$work/warm-summary.txt"
for f in "$work"/warm/*.json; do python3 -m perfsuite explain --launch "$f"; done > "$work/warm-explain.txt" 2>&1

stage "pack"
profile=$(python3 -m perfsuite profile 2>/dev/null)
tar czf "$OUT/call.tar.gz" "$work" "baselines/$profile" docs/gpu-runs/panel.csv 2>/dev/null
[ -f "$work/panel/panel.csv" ] && cp "$work/panel/panel.csv" "$OUT/panel.csv"
stage "done"
ls -la "$OUT"
