#!/usr/bin/env bash
# Trials of the sequential A/B on this machine: ab-rev of this checkout against HEAD, one row,
# with a slowdown planted in the candidate's steps (--perf-inject-slowdown). Each trial writes
# its ab-rev JSON to OUT/level-<L>-trial-<i>.json and prints a line: verdict, pairs spent,
# measured slowdown with the decision's interval, wall time. Counts per level at the end.
#   bash scripts/ab_trials.sh OUT "LEVEL:TRIALS ..." [NODE] [extra ab-rev args]
#   e.g. bash scripts/ab_trials.sh build/ab-trials "0:20 10:10"
set -euo pipefail
cd "$(dirname "$0")/.."
out=$1; plan=$2; shift 2
node=${1:-"bench_tests/test_parallel_3d.py::test_parallel_3d[parallel_3d.tp1_pp1]"}; shift || true
py=${PYTHON:-.venv/bin/python}
mkdir -p "$out"
summary='import json, sys
for r in json.load(open(sys.argv[1]))["ab"]:
    h = r.get("headline") or {}
    nan = float("nan")
    print(r["verdict"], r["pairs"], "{:+.1%} {:+.1%}..{:+.1%}".format(h.get("slowdown", nan), h.get("low", nan), h.get("high", nan)))'
for part in $plan; do
    level=${part%%:*}; trials=${part##*:}
    for i in $(seq 1 "$trials"); do
        json="$out/level-$level-trial-$i.json"
        start=$(date +%s)
        code=0
        "$py" -m perfsuite ab-rev HEAD "$node" --perf-profile=cpu --json "$json" \
            --candidate-arg="--perf-inject-slowdown=$level" "$@" >"$out/level-$level-trial-$i.log" 2>&1 || code=$?
        echo "level $level trial $i exit $code $(( $(date +%s) - start ))s $("$py" -c "$summary" "$json" 2>/dev/null || echo no-json)"
    done
done | tee "$out/trials.txt"
echo "per level: regression / pass / undecided / other, mean pairs"
awk '{n[$2]++; v[$2" "$8]++; p[$2]+=$9} END {for (l in n) printf "level %s: %d / %d / %d of %d, mean pairs %.2f\n", l, v[l" regression"], v[l" pass"], v[l" undecided"], n[l], p[l]/n[l]}' "$out/trials.txt"
