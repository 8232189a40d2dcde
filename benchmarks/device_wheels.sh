#!/usr/bin/env bash
# Wheels for a GPU machine with no network: the packages this project imports that such a machine's image
# lacks, at the versions tested here, for its Python (3.12, x86-64 manylinux), into .whl/ (ignored by git).
# gpu_check.sh installs them (into a temporary folder on PYTHONPATH) when it finds .whl/*.whl.
#
#   bash benchmarks/device_wheels.sh [DIR]        # here, where PyPI is reachable; then carry DIR to the machine
#
# The image seen on the lent H200 machines (Python 3.12, torch 2.11 + CUDA 13, transformers 5.17, numba,
# msgpack, tokenizers, safetensors, numpy 2.5) lacks pydivsufsort, watchdog, platformdirs, detect-secrets,
# gguf, pygls, lsprotocol and cattrs; transformers comes along at the version tested here, with what it needs.
set -euo pipefail
cd "$(dirname "$0")/.."
dest=${1:-.whl}
py=${PYTHON:-.venv/bin/python}
mkdir -p "$dest"
# the closure of what the project imports, less what the image holds at a version new enough: transformers 5.25
# needs huggingface-hub 2.x (the image has 1.33) and kernels, which pull httpx2, typer and pydantic along
mapfile -t specs < <("$py" - <<'PY'
import importlib.metadata as m
from packaging.requirements import Requirement
env = {"python_version": "3.12", "sys_platform": "linux", "platform_machine": "x86_64", "extra": ""}
image = {"numpy", "torch", "tokenizers", "safetensors", "pyyaml", "requests", "tqdm", "wheel", "packaging",
         "typing-extensions", "filelock", "fsspec", "attrs"}
seen, todo = {}, ["pydivsufsort", "watchdog", "platformdirs", "detect-secrets", "gguf", "pygls", "transformers"]
while todo:
    name = todo.pop()
    key = name.lower().replace("_", "-")
    if key in seen or key in image:
        continue
    seen[key] = m.version(name)
    for text in m.requires(name) or []:
        req = Requirement(text)
        if not req.marker or req.marker.evaluate(env):
            todo.append(req.name)
print("\n".join(f"{k}=={v}" for k, v in sorted(seen.items())))
PY
)
"$py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d "$dest" "${specs[@]}"
ls -1 "$dest"
du -sh "$dest"
