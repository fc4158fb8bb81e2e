#!/usr/bin/env bash
# Builds the environment where onnxruntime-training's ORTModule works (the
# graph_optimization group's ORT rows): a venv (default .venv-ort) with
# torch 2.6.0, the newest torch ORTModule 1.19.2 runs with unmodified (2.7-2.8:
# one of its extensions fails to load; 2.9+: the TorchScript ONNX exporter it
# uses moved), plus what perfsuite's ranks import. perfsuite itself is not
# installed: the ranks get its source on their path.
#
# Costs (2-core machine): ~3.2 GB downloaded (the registry's torch 2.6 is a CUDA
# build and pulls the nvidia-* wheels), a 6.3 GB venv, ~4 min to install and
# ~2 min to build ORTModule's C++ extensions.
#
# Usage: scripts/env_ort.sh [VENV]   (PYTHON=python3.11 picks the interpreter)
set -euo pipefail
venv="${1:-.venv-ort}"
python="${PYTHON:-python3}"

if [ ! -x "$venv/bin/python" ]; then
    "$python" -m venv "$venv"
fi
"$venv/bin/python" -m pip install -q \
    torch==2.6.0 onnxruntime-training==1.19.2 onnx==1.16.2 transformers==4.57.6 \
    "psutil>=5.9" "nvidia-ml-py>=12" "setuptools>=68" packaging

# ORTModule's C++ extensions are built once per environment. The stock
# installer also builds the CUDA extension whenever torch is a CUDA build,
# which fails without the CUDA toolkit (no cuda_runtime_api.h) and is of no use
# without a GPU; on a machine without one it is run with torch.version.cuda
# seen as None: CPU extensions only.
built="$venv/.ortmodule-extensions-built"
if [ -f "$built" ]; then
    :
elif "$venv/bin/python" -c 'import sys, torch; sys.exit(not torch.cuda.is_available())' 2>/dev/null; then
    "$venv/bin/python" -m onnxruntime.training.ortmodule.torch_cpp_extensions.install
else
    "$venv/bin/python" -c '
import torch
torch.version.cuda = None  # no CUDA toolkit here: build the CPU extensions only
from onnxruntime.training.ortmodule.torch_cpp_extensions.install import build_torch_cpp_extensions
build_torch_cpp_extensions()
'
fi
touch "$built"

# Proof it works: ORTModule imports and trains one step.
"$venv/bin/python" -c '
import torch
from onnxruntime.training.ortmodule import ORTModule
model = ORTModule(torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1)))
model(torch.randn(4, 8)).sum().backward()
print("ORTModule trains with torch", torch.__version__)
'
echo "built $venv: run the ORT rows with --perf-env ort=$venv/bin/python"
