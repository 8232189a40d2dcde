#!/usr/bin/env bash
# Installs rest-lsp into ./.venv: the CPU build of torch first (a bare `torch` requirement would pull a
# multi-GB CUDA build), then the project. `--dev` adds the test tools. Idempotent and quiet on reruns.
# TORCH_SPEC overrides the torch requirement (e.g. TORCH_SPEC=torch on a CUDA machine).
set -euo pipefail
cd "$(dirname "$0")/.."
extras=""
[ "${1:-}" = "--dev" ] && extras="[dev]"
[ -x .venv/bin/python ] || python3 -m venv .venv
py=.venv/bin/python
$py -m pip install -q --disable-pip-version-check "${TORCH_SPEC:-torch==2.13.0}"
$py -m pip install -q --disable-pip-version-check -e ".${extras}"
