# Sourced by each prepared call (device-call.sh, ab-call.sh) after it sets `name` (its build
# folder) and `log` (its console log under $OUT): the log, the stage clock, the card's identity,
# and the kit's wheels (`make gpu-kit`, carried as .kit) installed on PYTHONPATH.
set -u
export PYTHONUNBUFFERED=1
KIT=${KIT:-.kit}
OUT=${OUT:-build/$name-out}
work=build/$name
mkdir -p "$OUT" "$work"
exec > >(tee -a "$OUT/$log") 2>&1
start=$(date +%s)
stage() { echo "== $1 at $(( $(date +%s) - start ))s"; }

nvidia-smi --query-gpu=name,uuid,serial,pci.bus_id,driver_version,clocks.sm,temperature.gpu,power.draw --format=csv
prefix=$(mktemp -d /tmp/kit.XXXXXX)
python3 -m pip install -q --no-index --no-deps --no-compile --target "$prefix" "$KIT"/*.whl || exit 1
export PYTHONPATH="$prefix${PYTHONPATH:+:$PYTHONPATH}"
