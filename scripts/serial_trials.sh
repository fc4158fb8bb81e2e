#!/usr/bin/env bash
# The serial self-tests RUNS times in a row (issue 55, "no flaky test"), every other run beside a
# neighbour busy DUTY ms of every 10 ms (default 2: 0.2 of a core, under cpu's 0.25 foreign-load
# limit, so the gate still judges). Prints each run's outcome, time and load; counts at the end.
# Run it from a frozen worktree (git worktree add --detach DIR HEAD) so edits do not leak in.
# FIRST=loaded starts with a loaded run.
#   PY=.venv/bin/python bash scripts/serial_trials.sh RUNS [DUTY]
set -uo pipefail
py=${PY:-python}; runs=$1; duty=${2:-2}
passed=(0 0); total=(0 0)
for i in $(seq 1 "$runs"); do
    loaded=$(( (i + 1) % 2 ))  # runs 2, 4, ... loaded
    [ "${FIRST:-quiet}" = loaded ] && loaded=$(( i % 2 ))
    pid=
    if [ "$loaded" = 1 ]; then
        "$py" -c "
import time
while True:
    end = time.perf_counter() + $duty / 1000
    while time.perf_counter() < end: pass
    time.sleep((10 - $duty) / 1000)" &
        pid=$!
    fi
    start=$(date +%s)
    "$py" -m pytest tests -m "serial and not slow" -q -p no:cacheprovider >"serial$i.log" 2>&1
    rc=$?
    [ -n "$pid" ] && kill "$pid" && wait "$pid" 2>/dev/null
    total[$loaded]=$(( ${total[$loaded]} + 1 ))
    [ "$rc" = 0 ] && passed[$loaded]=$(( ${passed[$loaded]} + 1 ))
    echo "run $i $([ "$loaded" = 1 ] && echo loaded || echo quiet) rc $rc $(($(date +%s) - start)) s: $(tail -1 "serial$i.log")"
    grep -E "^FAILED|^ERROR" "serial$i.log" | sed 's/^/   /'
done
echo "quiet ${passed[0]}/${total[0]} passed, loaded ${passed[1]}/${total[1]} passed"
