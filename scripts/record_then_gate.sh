#!/bin/bash
# init a fresh repo, record the example row, run the gate right after: recorded vs gated throughput.
PY=${PY:-python}
for i in $(seq 1 $1); do
  d=${TMPDIR:-/tmp}/rec$i; rm -rf $d; mkdir $d; cd $d; git init -q; $PY -m perfsuite init >/dev/null
  t0=$(date +%s)
  $PY -m pytest bench_tests -q -p no:cacheprovider --perf-update-baselines --perf-json rec.json > rec.log 2>&1
  $PY -m pytest bench_tests -q -p no:cacheprovider --perf-json gate.json > gate.log 2>&1; rc=$?
  python3 - <<PYEOF
import json
rec=json.load(open("rec.json"))["results"][0]; gate=json.load(open("gate.json"))["results"][0]
r=rec["metrics"]["samples_per_s"]["mean"]; g=gate["metrics"]["samples_per_s"]["mean"]
tol=[c for c in gate.get("checks",[]) if c.get("metric")=="samples_per_s"]
print(f"repo $i: recorded {r:.1f}, gate {g:.1f} ({g/r-1:+.1%}), verdict {gate['verdict']}, gate rc $rc, tol {tol[0].get('tolerance') if tol else None}, rec contention {rec['metrics'].get('contention')}, gate contention {gate['metrics'].get('contention')}, $(( $(date +%s) - t0 )) s")
PYEOF
  grep -h "caught" rec.log | head -1
done
