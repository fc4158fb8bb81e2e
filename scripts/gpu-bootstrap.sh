#!/usr/bin/env bash
# Bootstrap a bare GPU machine within BUDGET (e.g. 7m), install and packing included:
# install the kit (make gpu-kit) into a temporary prefix with no index, run
# `python -m perfsuite bootstrap`, and leave under $OUT what is worth keeping:
#   bootstrap.tar.gz  baselines/<profile>/ (with bootstrap-costs.json), results.json,
#                     summary.md, bootstrap.md, report.html, doctor.{json,txt}, state.json,
#                     selftest table, logs/, pip-freeze.txt (the image's own packages)
#   bootstrap.log     everything this script printed
#   bootstrap.md      the markdown summary
# Run from the repo root. KIT (default .kit), PYTHON (default python3: the image's
# CUDA torch), OUT (default build/gpu-bootstrap-out). Further arguments go to the
# bootstrap command. Exit status: the bootstrap's (0 complete, 3 budget ran out, 1 failure).
set -uo pipefail

budget=${1:?usage: scripts/gpu-bootstrap.sh BUDGET (e.g. 7m) [bootstrap arguments]}
shift
start=$(date +%s)
KIT=${KIT:-.kit}
PYTHON=${PYTHON:-python3}
OUT=${OUT:-build/gpu-bootstrap-out}
# Seconds kept back for pip freeze and the tarball after the bootstrap ends.
PACK_S=${PACK_S:-15}
WORK=build/bootstrap

case $budget in
  *h) total=$(awk "BEGIN{print int(${budget%h}*3600)}") ;;
  *m) total=$(awk "BEGIN{print int(${budget%m}*60)}") ;;
  *s) total=$(awk "BEGIN{print int(${budget%s})}") ;;
  *) total=$(awk "BEGIN{print int($budget)}") ;;
esac
if [ "${total:-0}" -le "$PACK_S" ]; then
  echo "gpu-bootstrap: budget '$budget' is too small (needs more than ${PACK_S}s)" >&2
  exit 2
fi

mkdir -p "$OUT" "$WORK"
exec > >(tee -a "$OUT/bootstrap.log") 2>&1
echo "gpu-bootstrap: budget ${total}s, kit $KIT, python $PYTHON ($("$PYTHON" -c 'import sys; print(sys.version.split()[0])'))"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv

shopt -s nullglob
wheels=("$KIT"/*.whl)
if [ ${#wheels[@]} -eq 0 ]; then
  echo "gpu-bootstrap: no wheels in $KIT: build the kit first (make gpu-kit) and carry it" >&2
  exit 1
fi
prefix=$(mktemp -d /tmp/perfsuite-kit.XXXXXX)
"$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$prefix" "${wheels[@]}" || {
  echo "gpu-bootstrap: installing the kit failed" >&2
  exit 1
}
export PYTHONPATH="$prefix${PYTHONPATH:+:$PYTHONPATH}"
echo "gpu-bootstrap: kit installed in $(( $(date +%s) - start ))s"

left=$(( total - ($(date +%s) - start) - PACK_S ))
# A safety net only: the bootstrap keeps its own budget and stops its steps itself.
timeout --signal=TERM --kill-after=20 $(( left + 30 )) \
  "$PYTHON" -m perfsuite bootstrap --budget "${left}s" --out "$WORK" "$@"
code=$?

# The image's own packages (without the kit), for the next kit's constraints.
env -u PYTHONPATH "$PYTHON" -m pip freeze > "$WORK/pip-freeze.txt" 2>/dev/null
read -r profile folder < <("$PYTHON" -c "import json,sys; s = json.load(open(sys.argv[1]))
print(s['profile'], s['facts'].get('baselines', ''))" "$WORK/state.json" 2>/dev/null)
keep=("$WORK")
[ -n "${folder:-}" ] && [ -d "$folder" ] && keep+=("$(realpath --relative-to=. "$folder")")
tar czf "$OUT/bootstrap.tar.gz" --exclude='*.lock' "${keep[@]}"
[ -f "$WORK/bootstrap.md" ] && cp "$WORK/bootstrap.md" "$OUT/bootstrap.md"
echo "gpu-bootstrap: profile ${profile:-unknown}, exit $code, $(( $(date +%s) - start ))s of ${total}s; kept: ${keep[*]} -> $OUT/bootstrap.tar.gz"
exit $code
