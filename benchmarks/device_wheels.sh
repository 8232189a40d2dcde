#!/usr/bin/env bash
# Wheels for a GPU machine with no network: the packages this project imports that such a machine's image
# lacks, at the versions tested here, for its Python (3.12, x86-64 manylinux), into .whl/ (ignored by git).
# gpu_check.sh installs them (into a temporary folder on PYTHONPATH) when it finds .whl/*.whl.
#
#   bash benchmarks/device_wheels.sh [DIR]        # here, where PyPI is reachable; then carry DIR to the machine
#
# The image seen on the lent H200 machines (Python 3.12, torch 2.11 + CUDA 13, transformers 5.17, numba,
# msgpack, tokenizers, safetensors, numpy 2.5) lacks pydivsufsort, watchdog, platformdirs, detect-secrets,
# gguf, pygls, lsprotocol and cattrs; transformers comes along at the version tested here.
set -euo pipefail
cd "$(dirname "$0")/.."
dest=${1:-.whl}
py=${PYTHON:-.venv/bin/python}
mkdir -p "$dest"
version() { "$py" -c "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))" "$1"; }
specs=()
for name in pydivsufsort watchdog platformdirs detect-secrets gguf pygls lsprotocol cattrs transformers; do
    specs+=("$name==$(version "$name")")
done
"$py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d "$dest" "${specs[@]}"
ls -1 "$dest"
du -sh "$dest"
