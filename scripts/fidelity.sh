#!/usr/bin/env bash
# Fidelity (issue 55): ROUNDS rounds of one row, each a perfsuite launch with warm ranks (the cpu
# default), one with exec'd ranks, and the independent loop (scripts/independent_loop.py), in an
# order rotated round by round; prints each samples/s and, at the end, medians and per-round ratios.
#   PY=.venv/bin/python bash scripts/fidelity.sh NODE ROW ROUNDS OUTDIR
# NODE: the row's pytest node id; ROW: its name in independent_loop.py.
set -uo pipefail
py=${PY:-python}; node=$1; row=$2; rounds=$3; out=$4
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"
run() {  # $1 method, $2 round
    local f="$out/$1-$2"
    if [ "$1" = loop ]; then
        "$py" -m torch.distributed.run --standalone --nproc-per-node 2 "$here/independent_loop.py" "$row" \
            2>"$f.log" | tail -1 >"$f.json"
    else
        "$py" -m pytest "$node" -q -p no:cacheprovider --perf-profile=cpu --perf-rank-start="$1" \
            --perf-json "$f.json" >"$f.log" 2>&1
    fi
}
methods=(warm exec loop)
for r in $(seq 1 "$rounds"); do
    for k in 0 1 2; do
        m=${methods[$(( (r + k) % 3 ))]}
        run "$m" "$r"
    done
    echo "round $r done"
done
"$py" - "$out" "$rounds" <<'PYEOF'
import json, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
def rate(method, r):
    doc = json.load(open(f"{out}/{method}-{r}.json"))
    if method == "loop":
        return doc["samples_per_s"]
    return doc["results"][0]["metrics"]["samples_per_s"]["mean"]
values = {m: [rate(m, r) for r in range(1, rounds + 1)] for m in ("warm", "exec", "loop")}
for m, v in values.items():
    print(f"{m}: median {statistics.median(v):.2f} samples/s; per round {', '.join(f'{x:.1f}' for x in v)}")
for a, b in (("warm", "exec"), ("warm", "loop"), ("exec", "loop")):
    ratios = [x / y - 1 for x, y in zip(values[a], values[b])]
    mean = statistics.mean(ratios); se = statistics.stdev(ratios) / len(ratios) ** 0.5
    print(f"{a} / {b} - 1: median {statistics.median(ratios):+.1%}, mean {mean:+.1%} +- {se:.1%} (standard error), {len(ratios)} rounds")
PYEOF
