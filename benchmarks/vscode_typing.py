"""What a VS Code user feels: the time from a keystroke to rest-lsp's ghost text being visible, in a real
VS Code (code-server in headless chromium, the packaged extension, `rest-lsp --stdio`), over a scripted
typing run.

    .venv/bin/python benchmarks/vscode_typing.py [--model DIR] [--json OUT] [--screenshot OUT.png]

Needs what scripts/test_editors.sh installs (code-server, chromium, playwright). The default model is the
embedded Qwen2.5-Coder-0.5B with the server's default settings, as a user gets them.

The workspace is a copy of examples/inventory.py; the run types two methods at its end (12 lines) key by key
through the browser's keyboard, at a seeded human cadence: 60-140 ms between characters, 300-700 ms after a
word, and a pause of --line-pause-ms (default 3 s) at each line's end, where a person reads the suggestion.
VS Code's own suggest widget, auto-closing and auto-indentation are off, so the keys typed are exactly the
text (indentation typed as spaces) and Tab is never pressed: nothing is accepted.

Measured in the page: every keydown (capture phase) and every change of the ghost text in the DOM (a
MutationObserver), both with performance.now(). For each keystroke, the latency is the time from it to the
first ghost text shown before the next keystroke; a keystroke whose suggestion never showed before the next
one counts as not shown. A ghost text that was already on screen and only shortened by a typed character
that matched it ("typed through", answered without the server) is counted apart.
"""
from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's packages, not an editable install's
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "editors"))

from editor_harness import SERVER  # noqa: E402
from restbase.storage import cache_root  # noqa: E402
sys.path.insert(0, str(Path(__file__).resolve().parent))
from report import pct  # noqa: E402
from vscode_harness import GHOST_JS, CodeServer, Workbench, find_tools, package_extension, wait_until  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
SOURCE = REPO / "examples" / "inventory.py"
# Typed at the end of the file, whose last line is total_value()'s empty body line (8 spaces, the cursor
# after them): the first line's indentation is already there.
TYPED = '''        total = 0.0
        for item in self.items.values():
            total += item.price * item.quantity
        return total

    def most_valuable(self) -> Item | None:
        best = None
        for item in self.items.values():
            if best is None or item.price > best.price:
                best = item
        return best
'''

RECORDER_JS = """(ghostJs) => {
  const ghost = eval(ghostJs);
  const rec = { keys: [], ghosts: [] };
  window.__restTyping = rec;
  document.addEventListener('keydown', (e) => rec.keys.push([performance.now(), e.key]), true);
  let last = ghost();
  new MutationObserver(() => {
    const g = ghost();
    if (g !== last) { last = g; rec.ghosts.push([performance.now(), g]); }
  }).observe(document.body, { subtree: true, childList: true, characterData: true });
}"""


def keystrokes(text: str, line_pause_ms: float, seed: int) -> list[tuple[str, float]]:
    """(key, pause after it in ms) for typing `text`: Enter between lines, indentation as spaces."""
    rng = random.Random(seed)
    keys: list[tuple[str, float]] = []
    for i, line in enumerate(text.rstrip("\n").split("\n")):
        if i > 0:
            keys.append(("Enter", rng.uniform(60, 140)))
        chars = line.lstrip(" ") if i == 0 else line
        for j, ch in enumerate(chars):
            after_word = ch == " " and j > 0 and chars[j - 1] != " "
            keys.append((ch, rng.uniform(300, 700) if after_word else rng.uniform(60, 140)))
        if chars:
            keys[-1] = (keys[-1][0], line_pause_ms)
    return keys


def analyse(keys: list[list], ghosts: list[list], end: float) -> dict:
    """Per keystroke: the first ghost text shown after it and before the next one, split into new
    suggestions and typed-through ones (the ghost already on screen, shortened by the typed character)."""
    new: list[float] = []
    through: list[float] = []
    not_shown = 0
    for i, (t, key) in enumerate(keys):
        nxt = keys[i + 1][0] if i + 1 < len(keys) else end
        before = [g for g in ghosts if g[0] <= t]
        prev = before[-1][1] if before else None
        after = [g for g in ghosts if t < g[0] < nxt and g[1]]
        if not after:
            not_shown += 1
        elif prev and len(key) == 1 and prev.startswith(key) and after[0][1] == prev[1:]:
            through.append(after[0][0] - t)
        else:
            new.append(after[0][0] - t)
    every = new + through
    return {
        "keystrokes": len(keys),
        "shown_before_next_key": len(every),
        "not_shown_before_next_key": not_shown,
        "latency_ms_p50": pct(every, 50),
        "latency_ms_p95": pct(every, 95),
        "new_suggestions": len(new),
        "new_latency_ms_p50": pct(new, 50),
        "new_latency_ms_p95": pct(new, 95),
        "typed_through": len(through),
        "typed_through_latency_ms_p50": pct(through, 50),
        "typed_through_latency_ms_p95": pct(through, 95),
        "new_latencies_ms": [round(x, 1) for x in new],
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="", help="model directory (default: the embedded model)")
    ap.add_argument("--line-pause-ms", type=float, default=3000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path, help="write the summary and the raw events here")
    ap.add_argument("--screenshot", type=Path, help="a PNG of the editor with the last suggestion shown")
    ap.add_argument("--keep", action="store_true", help="keep the temporary folder (logs, profile)")
    args = ap.parse_args(argv)

    tools = find_tools()
    if isinstance(tools, str):
        print(tools, file=sys.stderr)
        return 2
    tmp = Path(tempfile.mkdtemp(prefix="rest-lsp-vscode-typing-"))
    ws = tmp / "ws"
    ws.mkdir()
    (ws / ".git").mkdir()
    (ws / "inventory.py").write_text(SOURCE.read_text())
    # The user's converted model and its measured cost curve; the rest of the server's cache in tmp.
    cache = tmp / "cache"
    cache.mkdir()
    for sub in ("embedded", "cost"):
        (cache_root() / sub).mkdir(exist_ok=True)
        (cache / sub).symlink_to(cache_root() / sub, target_is_directory=True)
    settings = {
        "restLsp.server.path": str(SERVER),
        "restLsp.server.env": {"REST_LSP_CACHE": str(cache)},
        "restLsp.model": args.model,
        "restLsp.requestLog": str(tmp / "requests.jsonl"),
        "restLsp.stats.intervalMs": 1000,
        "editor.autoIndent": "none",
        "editor.autoClosingBrackets": "never",
        "editor.autoClosingQuotes": "never",
        "editor.autoSurround": "never",
        "editor.stickyScroll.enabled": False,
    }
    server = CodeServer(tools, tmp, ws, settings)
    wb: Workbench | None = None
    t_start = time.monotonic()
    try:
        server.install_extension(package_extension(tmp))
        server.start()
        wb = Workbench(tools, server)
        wb.open()
        wb.open_file("inventory.py")
        wb.press("Control+b")   # the editor alone: no side bar
        lines = SOURCE.read_text().split("\n")
        wb.go_to(len(lines) - 1, len(lines[-2]) + 1)
        # Ready: the model has loaded (the status bar leaves "starting") and the figures show.
        wait_until("the model to load", lambda: "REST" in (s := wb.status_text())
                   and not any(w in s for w in ("starting", "indexing", "error")), timeout=600, interval=0.5)
        print(f"ready after {time.monotonic() - t_start:.0f} s: {wb.status_text()}", file=sys.stderr)
        wb.page.evaluate(RECORDER_JS, GHOST_JS)
        plan = keystrokes(TYPED, args.line_pause_ms, args.seed)
        for key, pause in plan:
            wb.press(key if key != " " else "Space")
            time.sleep(pause / 1000)
        rec = wb.page.evaluate("() => window.__restTyping")
        end = wb.page.evaluate("() => performance.now()")
        summary = analyse(rec["keys"], rec["ghosts"], end)
        wb.press("Escape")
        wb.press("Control+s")
        source = SOURCE.read_text().split("\n")
        expected = "\n".join(source[:-2] + TYPED.split("\n"))
        # the measurement counts only if every key landed as planned
        wait_until("the saved file to hold exactly the typed text",
                   lambda: (ws / "inventory.py").read_text() == expected, timeout=10)
        reqs = [json.loads(l) for l in (tmp / "requests.jsonl").read_text().splitlines()] \
            if (tmp / "requests.jsonl").exists() else []
        outcomes: dict[str, int] = {}
        for r in reqs:
            outcomes[r["outcome"]] = outcomes.get(r["outcome"], 0) + 1
        if args.screenshot:
            # After the measurement: a new method below the typed ones, and its suggestion on screen.
            for key in ["Enter", "Enter", *"    def "]:
                wb.press(key if key != " " else "Space")
                time.sleep(0.1)
            wait_until("a suggestion for the picture", wb.ghost_text, timeout=60)
            wb.screenshot(args.screenshot)
        summary.update(model=args.model or "embedded", line_pause_ms=args.line_pause_ms, seed=args.seed,
                       server_requests=len(reqs), server_outcomes=outcomes)
        print(json.dumps({k: v for k, v in summary.items() if k != "new_latencies_ms"}, indent=2))
        if args.json:
            args.json.write_text(json.dumps({**summary, "keys": rec["keys"], "ghosts": rec["ghosts"],
                                             "requests": reqs}, indent=1))
        return 0
    finally:
        if wb is not None:
            wb.close()
        server.stop()
        if args.keep:
            print(f"kept {tmp}", file=sys.stderr)
        else:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
