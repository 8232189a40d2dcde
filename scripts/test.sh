#!/usr/bin/env bash
# The whole test suite from a fresh machine: install (CPU torch, the project, test tools, the editors'
# toolchains), then run every test. Fails when any test fails or when no test ran.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh --dev
# Debian neovim + tmux, code-server + chromium + playwright (a real VS Code), node dependencies, and the
# VS Code extension's own tests (npm test)
bash scripts/test_editors.sh
export PYTHONUNBUFFERED=1
# What test_editors.sh installed must be there: the editor tests fail rather than skip without it.
export REST_LSP_REQUIRE_EDITORS=1
set +e
.venv/bin/python -m pytest -q -p no:cacheprovider "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then echo "no tests ran" >&2; exit 1; fi
exit "$rc"
