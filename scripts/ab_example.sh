#!/usr/bin/env bash
# ab-rev on the row of a repository made by `perfsuite init` (issue 55): RUNS runs against HEAD~1
# (an empty commit), the candidate's extra pytest argument ARG (e.g. --perf-inject-slowdown=20) or
# `none`; prints each run's exit status, time, verdict line and pair lines.
#   PY=.venv/bin/python bash scripts/ab_example.sh DIR RUNS ARG
set -uo pipefail
py=${PY:-python}; dir=$1; runs=$2; arg=$3
if [ ! -d "$dir" ]; then
    mkdir -p "$dir" && cd "$dir" && git init -q && "$py" -m perfsuite init >/dev/null && git add -A
    git -c user.email=ab@example -c user.name=ab commit -qm init
    git -c user.email=ab@example -c user.name=ab commit -q --allow-empty -m unchanged
fi
cd "$dir"
for i in $(seq 1 "$runs"); do
    start=$(date +%s)
    if [ "$arg" = none ]; then "$py" -m perfsuite ab-rev HEAD~1 --json "ab$i.json" >"ab$i.log" 2>&1
    else "$py" -m perfsuite ab-rev HEAD~1 "--candidate-arg=$arg" --json "ab$i.json" >"ab$i.log" 2>&1; fi
    echo "run $i rc $? $(($(date +%s) - start)) s: $(grep -E '^example' "ab$i.log" | head -1)"
    grep -E "^pair|waited" "ab$i.log" | sed 's/^/   /'
done
