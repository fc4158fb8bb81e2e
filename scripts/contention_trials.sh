#!/usr/bin/env bash
# Is a planted slowdown caught when a neighbour keeps the host busy for a while?
# TRIALS runs (default 5) of one scenario with PCT% planted work per step, each
# started while another process spins on a core for SPIN seconds (a neighbour
# job that ends). Counts the verdicts: `regression` (caught), `unreliable`
# (not judged), or anything else, and the exit codes.
#   bash scripts/contention_trials.sh [TRIALS] [extra pytest args]
#   env: KEYWORD (default mixed_precision.amp), PCT (default 150: -60% throughput), SPIN (default 20 s)
# Compare with --perf-contention-retries=0 (measure once, as perfsuite did before it waited).
set -euo pipefail
cd "$(dirname "$0")/.."
trials=${1:-5}; shift || true
py=${PYTHON:-.venv/bin/python}
keyword=${KEYWORD:-mixed_precision.amp}
pct=${PCT:-150}
spin=${SPIN:-20}
out=$(mktemp -d)
caught=0; unjudged=0; green=0
for i in $(seq 1 "$trials"); do
    timeout "$spin" "$py" -c "while True: pass" &
    code=0
    "$py" -m pytest bench_tests -k "$keyword" -q -p no:cacheprovider --perf-profile=cpu \
        --perf-inject-slowdown="$pct" --perf-json "$out/$i.json" "$@" >"$out/$i.log" 2>&1 || code=$?
    wait
    verdict=$("$py" -c "import json,sys; print(' '.join(r['verdict'] for r in json.load(open(sys.argv[1]))['results']))" "$out/$i.json")
    echo "trial $i: exit $code, verdict $verdict"
    case $verdict in
        *regression*) caught=$((caught + 1)) ;;
        *unreliable*) unjudged=$((unjudged + 1)) ;;
    esac
    [ "$code" -eq 0 ] && green=$((green + 1))
done
echo "caught (regression) $caught/$trials, not judged (unreliable) $unjudged/$trials, exit 0 $green/$trials (logs in $out)"
