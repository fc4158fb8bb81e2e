#!/usr/bin/env bash
# perfsuite bisect in a repository made by `perfsuite init` (issue 55): 6 commits after GOOD, the
# 4th runs the example model's first two blocks twice (6 blocks' work instead of 4; one block twice
# measured +12-20%, too close to cpu's 10% minimum effect for the issue's planted 20%);
# RUNS bisects of GOOD..HEAD, each printing its first bad commit against the planted one.
#   PY=.venv/bin/python bash scripts/bisect_example.sh DIR RUNS
set -uo pipefail
py=${PY:-python}; dir=$1; runs=$2
commit() { git -c user.email=b@example -c user.name=b commit -qam "$1"; }
if [ ! -d "$dir" ]; then
    mkdir -p "$dir" && cd "$dir" && git init -q && "$py" -m perfsuite init >/dev/null && git add -A
    git -c user.email=b@example -c user.name=b commit -qm good
    for i in 1 2 3 4 5 6; do
        echo "# change $i" >>perf_models/example.py
        if [ "$i" = 4 ]; then
            sed -i 's/        for block in self.blocks:/        x = self.blocks[1](self.blocks[0](x))  # planted: two blocks twice\n        for block in self.blocks:/' perf_models/example.py
        fi
        commit "change $i"
    done
fi
cd "$dir"
planted=$(git log --format=%H --grep='change 4$')
for i in $(seq 1 "$runs"); do
    start=$(date +%s)
    "$py" -m perfsuite bisect HEAD~6 HEAD --json "bisect$i.json" >"bisect$i.log" 2>&1
    rc=$?
    found=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1])).get('first_bad'))" "bisect$i.json" 2>/dev/null)
    echo "run $i rc $rc $(($(date +%s) - start)) s: first bad ${found:0:12}, planted ${planted:0:12} $([ "$found" = "$planted" ] && echo FOUND || echo MISSED)"
    grep -E "^step|waited|contention" "bisect$i.log" | sed 's/^/   /'
done
