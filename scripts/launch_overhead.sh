#!/usr/bin/env bash
# Launch overhead, warm against exec (docs/lab/launch-overhead.md): ROUNDS interleaved
# pytest sessions of each row, each recording into a fresh baselines folder (the committed
# ones are never touched). The warm sessions share one warm parent per import set, as the
# launches of one gate run do: this script's owner process keeps them (PERFSUITE_WARM_PARENTS).
#   scripts/launch_overhead.sh OUT [ROUNDS] [NODE...]
# PYTHON (default .venv/bin/python) runs it; PROFILE (default: the machine's) is the profile.
set -euo pipefail
out=${1:?usage: scripts/launch_overhead.sh OUT [ROUNDS] [NODE...]}
rounds=${2:-5}
shift $(( $# >= 2 ? 2 : 1 ))
nodes=("$@")
if [ ${#nodes[@]} -eq 0 ]; then
  nodes=('bench_tests/test_mixed_precision.py::test_mixed_precision[mixed_precision.amp]'
         'bench_tests/test_parallel_3d.py::test_parallel_3d[parallel_3d.tp1_pp1]')
fi
mkdir -p "$out"
py=${PYTHON:-.venv/bin/python}
export NODES="${nodes[*]}" ROUNDS=$rounds OUT=$out PY=$py PROFILE=${PROFILE:-}
exec "$py" - <<'PY'
import os, subprocess, tempfile
from perfsuite.launch import warm

warm.share_with_children()
py, out = os.environ["PY"], os.environ["OUT"]
for n, node in enumerate(os.environ["NODES"].split()):
    for i in range(int(os.environ["ROUNDS"])):
        for start in ("warm", "exec"):
            profile = [f"--perf-profile={os.environ['PROFILE']}"] if os.environ["PROFILE"] else []
            cmd = [py, "-m", "pytest", node, *profile, f"--perf-baselines={tempfile.mkdtemp()}",
                   "--perf-update-baselines", "--perf-op-profiles=off", "--perf-confirm=0", f"--perf-rank-start={start}",
                   f"--perf-json={out}/row{n}-{start}{i}.json", "-p", "no:cacheprovider", "-q"]
            subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
PY
