#!/usr/bin/env bash
# False alarms of the cpu gate on a busy machine: runs the mixed_precision
# group RUNS times (default 20) against the committed cpu baselines while one
# other process keeps a core busy, and counts the runs that failed.
#   bash scripts/false_alarms.sh [RUNS] [extra pytest args]
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-20}; shift || true
py=${PYTHON:-.venv/bin/python}
out=$(mktemp -d)
"$py" -c "while True: pass" &
busy=$!
trap 'kill $busy 2>/dev/null' EXIT
failed=0
for i in $(seq 1 "$runs"); do
    code=0
    "$py" -m pytest bench_tests -k mixed_precision -q -p no:cacheprovider --perf-profile=cpu \
        --perf-json "$out/$i.json" "$@" >"$out/$i.log" 2>&1 || code=$?
    verdicts=$("$py" -c "import json,sys; d=json.load(open(sys.argv[1])); print(' '.join(r['verdict'] for r in d['results']), max(r.get('metrics',{}).get('contention',{}).get('foreign_cores',0) for r in d['results']))" "$out/$i.json")
    echo "run $i: exit $code, verdicts and max foreign cores: $verdicts"
    [ "$code" -eq 1 ] && failed=$((failed + 1))
done
echo "false alarms: $failed/$runs (logs in $out)"
