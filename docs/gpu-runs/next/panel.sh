#!/usr/bin/env bash
# The card-to-card panel stage of a GPU call (issue 37, item 2), about 3 minutes. From the repo
# root, after `make gpu-kit`, alone or after the call's other stages:
#   run  command="bash docs/gpu-runs/next/panel.sh"  carry=[".kit"]  timeout_s=240
# Each session launches the panel rows once. The table counts a pair as cross-card only when both
# sides carry a card UUID, and the committed H100 baselines predate UUIDs. So:
#  - some row's baseline has no UUID: re-record the rows (--perf-update-baselines, one launch
#    each; calibrated tolerances are kept) so the next session's pairs have two known cards. The
#    updated group files go to $OUT/baselines/<profile>/, to be committed. The run is also one
#    any-card row per scenario: the new launch against the baselines as they were.
#  - otherwise: one gate run against the committed baselines.
# Either way, scripts/card_panel.py appends the run to a copy of docs/gpu-runs/panel.csv in $OUT
# (commit it over the table) and prints sigma_card from it into $OUT/sigma.txt.
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-build/panel-out}
KIT=${KIT:-.kit}
PANEL_S=${PANEL_S:-180}
# The H100 profile's calibrated rows (a tolerance from 3 launches) except the Trainer's, whose
# launches spread 10% and would measure that noise alone. Then three uncalibrated rows already
# measured in two sessions, and the quietest training row (0.3% per-step CV). Eight of them took
# 113 s in the fourth session's call 3 (device-call3.sh).
PANEL_ROWS="microbench.device_copy microbench.bert_layer_fwd_bwd microbench.gpt2_layer_fwd_bwd
microbench.t5_decoder_layer_fwd graph_optimization.amp mixed_precision.amp
microbench.matmul_best_fp16 microbench.bert_layer_fwd microbench.gpt2_layer_fwd mixed_precision.fp32"

start=$(date +%s)
mkdir -p "$OUT"
exec > >(tee -a "$OUT/panel.log") 2>&1
nvidia-smi --query-gpu=name,uuid,serial,pci.bus_id,clocks.sm,temperature.gpu,power.draw --format=csv
prefix=$(mktemp -d /tmp/panel-kit.XXXXXX)
python3 -m pip install -q --no-index --no-deps --no-compile --target "$prefix" "$KIT"/*.whl || {
  echo "panel: installing the kit from $KIT failed" >&2
  exit 1
}
export PYTHONPATH="$prefix${PYTHONPATH:+:$PYTHONPATH}"
profile=$(python3 -m perfsuite profile)
SESSION=${SESSION:-$(date -u +%Y-%m-%dT%H%MZ)-$profile}

# Node ids, not -k: a -k of these names also selects amp_best, fwd_bwd twins and relations,
# which would launch rows outside the panel.
nodes=()
groups=()
for id in $PANEL_ROWS; do
  group=${id%%.*}
  nodes+=("bench_tests/test_${group}.py::test_${group}[$id]")
  [[ " ${groups[*]} " == *" $group "* ]] || groups+=("$group")
done

# The panel rows whose stored baseline names no card (or that have none here).
without_uuid=$(python3 - "$profile" $PANEL_ROWS <<'EOF'
import json
import sys
from pathlib import Path

profile, rows = sys.argv[1], sys.argv[2:]
for sid in rows:
    path = Path("baselines") / profile / f"{sid.split('.')[0]}.json"
    entry = json.loads(path.read_text())["scenarios"].get(sid) if path.exists() else None
    gpus = ((entry or {}).get("fingerprint") or {}).get("gpus") or [{}]
    if not all(g.get("uuid") for g in gpus):
        print(sid)
EOF
)

old=$(mktemp -d /tmp/panel-baselines.XXXXXX)
mkdir -p "$old/$profile"
cp baselines/"$profile"/*.json "$old/$profile/" 2>/dev/null
mode=gate
extra=()
if [ -n "$without_uuid" ]; then
  mode=record
  extra=(--perf-update-baselines)
  echo "panel: baselines without a card UUID: $(echo $without_uuid); re-recording the panel rows"
fi

# One launch per row: no confirmation launch, no op profile (a stored one stays as it is).
left=$(( PANEL_S - ($(date +%s) - start) - 15 ))
timeout --kill-after=10 "$left" python3 -m pytest "${nodes[@]}" -p no:cacheprovider -q \
  --perf-op-profiles=off --perf-confirm=0 "${extra[@]}" --perf-json "$OUT/panel-results.json"
echo "panel: $mode run exit $? in $(( $(date +%s) - start ))s, session $SESSION"

if [ "$mode" = record ]; then
  mkdir -p "$OUT/baselines/$profile"
  for group in "${groups[@]}"; do
    cp "baselines/$profile/$group.json" "$OUT/baselines/$profile/" 2>/dev/null
  done
fi
cp docs/gpu-runs/panel.csv "$OUT/panel.csv"
python3 scripts/card_panel.py append "$OUT/panel-results.json" --table "$OUT/panel.csv" --session "$SESSION" \
  --source "panel.sh $mode run, panel-results.json" --baselines "$old"
{
  python3 scripts/card_panel.py sigma --table "$OUT/panel.csv"
  echo
  python3 scripts/card_panel.py sigma --any-card --table "$OUT/panel.csv"
} > "$OUT/sigma.txt" 2>&1
cat "$OUT/sigma.txt"
echo "panel: done in $(( $(date +%s) - start ))s"
ls -la "$OUT"
