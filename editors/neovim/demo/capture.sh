#!/usr/bin/env bash
# Captures ghost text in a terminal: Neovim's TUI inside tmux, editors/neovim with rest-lsp, typing at the
# end of demo.py; prints the screen before and after accepting, and writes OUT.txt (plain), OUT.ansi
# (colours), OUT.cast (asciicast v2) and, when Pillow and DejaVu Sans Mono are there, OUT.png.
#   editors/neovim/demo/capture.sh OUT [MODEL]        (MODEL: a model dir; default: the embedded model)
# REST_LSP_CMD overrides the server command (default: rest-lsp from the project's .venv).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../.." && pwd)
out=${1:?usage: capture.sh OUT [MODEL]}
export REST_LSP_MODEL=${2:-}
export REST_LSP_CMD=${REST_LSP_CMD:-"$root/.venv/bin/rest-lsp --stdio"}
ws=$(mktemp -d)
mkdir "$ws/.git"
cp "$here/demo.py" "$ws/files.py"
sock=rest-lsp-capture-$$
W=88 H=14
tmux -L "$sock" new-session -d -x $W -y $H -c "$ws" \
  "nvim --clean -u '$here/init.lua' files.py"
trap 'tmux -L "$sock" kill-server 2>/dev/null || true; rm -rf "$ws"' EXIT
pane() { tmux -L "$sock" capture-pane -p "$@"; }
frames=()
snap() { frames+=("$(pane -e)"); }

sleep 2; snap
# Go to the empty line in the loop body and append there (insert mode at its end). A request made while the
# server still loads its model may come back empty; like a user, leave insert mode and enter it again.
tmux -L "$sock" send-keys G
shown=""
for _ in $(seq 1 30); do              # up to ~5 minutes: the first start also converts/loads the model
  tmux -L "$sock" send-keys A
  for _ in $(seq 1 20); do
    sleep 0.5
    line=$(pane | grep '^ *8 ' | head -1 || true)
    if [ -n "$(printf '%s' "$line" | sed 's/^ *8 *//')" ]; then shown=1; break; fi
  done
  [ -n "$shown" ] && break
  tmux -L "$sock" send-keys Escape
done
[ -n "$shown" ] || echo "capture: no suggestion appeared" >&2
sleep 1; snap
pane > "$out.txt"
pane -e > "$out.ansi"
tmux -L "$sock" send-keys Tab
sleep 1; snap
{ echo; echo "--- after <Tab> (accepted) ---"; pane; } >> "$out.txt"
cat "$out.txt"

python3 - "$out" $W $H "${frames[@]}" <<'PY'
import json, sys
out, w, h, frames = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4:]
with open(out + ".cast", "w") as f:
    f.write(json.dumps({"version": 2, "width": w, "height": h, "title": "rest-lsp ghost text in Neovim"}) + "\n")
    for i, frame in enumerate(frames):
        f.write(json.dumps([i * 2.0, "o", "\x1b[H\x1b[2J" + frame.replace("\n", "\r\n")]) + "\n")
PY
py=$root/.venv/bin/python
"$py" "$here/ansi_png.py" "$out.ansi" "$out.png" $W $H 2>/dev/null || echo "(no PNG: needs Pillow and DejaVu Sans Mono)"
