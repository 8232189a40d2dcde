"""A real VS Code driven as a person would drive it, for tests/editors/test_vscode_real.py and
benchmarks/vscode_typing.py: code-server (a stock VS Code served to a browser) in Debian's chromium, driven
by Playwright with that chromium. scripts/test_editors.sh installs the pieces into the user cache and
records where they are in <cache>/editors/vscode-real.json.

Everything VS Code and the server write (profile, extensions, logs, caches) stays in one temporary folder:
HOME and the XDG directories point into it."""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from editor_harness import wait_until
from restbase.storage import cache_root

REPO = Path(__file__).resolve().parents[2]
EXTENSION_DIR = REPO / "editors" / "vscode"
TOOLS_FILE = cache_root() / "editors" / "vscode-real.json"
CHROMIUM_ARGS = [
    "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run", "--disable-quic",
    # without these, chromium keeps trying hosts this machine cannot reach
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]

# The text of the ghost text on screen, read from the DOM: the part on the cursor line, then the lines
# VS Code shows below it. None when no suggestion is shown.
GHOST_JS = """() => {
  const ed = document.querySelector('.monaco-editor.focused') || document.querySelector('.editor-instance .monaco-editor');
  if (!ed) return null;
  const first = [...ed.querySelectorAll('.ghost-text-decoration')].map((e) => e.textContent).join('');
  const rest = [...ed.querySelectorAll('.ghost-text .view-line')]
    .sort((a, b) => parseFloat(a.style.top || 0) - parseFloat(b.style.top || 0))
    .map((e) => e.textContent.replace(/\\u00a0/g, ' '));
  if (!first && rest.length === 0) return null;
  return [first.replace(/\\u00a0/g, ' '), ...rest].join('\\n');
}"""


@dataclass(frozen=True)
class Tools:
    node: str
    code_server: str   # code-server's entry script, run with `node`
    chromium: str


def find_tools() -> Tools | str:
    """The installed tools, or why they are not usable."""
    if not TOOLS_FILE.is_file():
        return f"{TOOLS_FILE} is missing: run scripts/test_editors.sh (it installs code-server and chromium)"
    tools = Tools(**json.loads(TOOLS_FILE.read_text()))
    for path in (tools.node, tools.code_server, tools.chromium):
        if not Path(path).exists():
            return f"{path} (named in {TOOLS_FILE}) is missing: run scripts/test_editors.sh again"
    try:
        import playwright  # noqa: F401
    except ImportError:
        return "the playwright package is missing: run scripts/test_editors.sh (it pip-installs it)"
    return tools


def package_extension(dest: Path) -> Path:
    """The .vsix exactly as docs/editors.md builds it (`npm run package`), copied to `dest`."""
    subprocess.run(["npm", "run", "-s", "package"], cwd=EXTENSION_DIR, check=True, capture_output=True,
                   timeout=300)
    out = dest / "rest-lsp.vsix"
    shutil.copy(EXTENSION_DIR / "rest-lsp.vsix", out)
    return out


def machine_scoped_settings() -> set[str]:
    """The extension's settings that VS Code reads from the machine's settings in a remote window."""
    props = json.loads((EXTENSION_DIR / "package.json").read_text())["contributes"]["configuration"]["properties"]
    return {k for k, v in props.items() if v.get("scope") in ("machine", "machine-overridable")}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class CodeServer:
    """code-server with a profile of its own under `root`, serving `workspace`, with the extension installed."""

    def __init__(self, tools: Tools, root: Path, workspace: Path, settings: dict[str, Any]):
        self.tools = tools
        self.root = root
        self.workspace = workspace
        self.user_data = root / "user-data"
        self.extensions = root / "extensions"
        self.settings_file = self.user_data / "User" / "settings.json"
        # A VS Code connected to a remote machine, which code-server is, ignores machine-scoped settings in
        # the user's settings: those are the remote machine's (the *Remote* tab of the settings editor).
        self.machine_settings_file = self.user_data / "Machine" / "settings.json"
        self.settings = {
            # a quiet, deterministic workbench: no welcome page, trust prompt, tips or update checks
            "workbench.startupEditor": "none",
            "workbench.tips.enabled": False,
            "workbench.enableExperiments": False,
            "security.workspace.trust.enabled": False,
            "telemetry.telemetryLevel": "off",
            "update.mode": "none",
            "extensions.autoCheckUpdates": False,
            "extensions.autoUpdate": False,
            "editor.minimap.enabled": False,
            "workbench.secondarySideBar.defaultVisibility": "hidden",
            "editor.inlineSuggest.enabled": True,
            # the suggest widget would take Tab for itself: these tests are about inline suggestions
            "editor.quickSuggestions": {"other": "off", "comments": "off", "strings": "off"},
            "editor.suggestOnTriggerCharacters": False,
            "editor.wordBasedSuggestions": "off",
            "files.autoSave": "off",
            "chat.disableAIFeatures": True,
            # each inline-completion fetch in the window's log (browser-console.log): whether VS Code asked
            "editor.inlineSuggest.logFetch": True,
            **settings,
        }
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/?folder={workspace}"
        self.env = dict(os.environ)
        home = root / "home"
        for var, sub in [("HOME", ""), ("XDG_CONFIG_HOME", ".config"), ("XDG_DATA_HOME", ".local/share"),
                         ("XDG_CACHE_HOME", ".cache"), ("XDG_STATE_HOME", ".local/state")]:
            (home / sub).mkdir(parents=True, exist_ok=True)
            self.env[var] = str(home / sub)
        self.proc: subprocess.Popen | None = None

    def _cmd(self, *args: str) -> list[str]:
        return [self.tools.node, self.tools.code_server, "--user-data-dir", str(self.user_data),
                "--extensions-dir", str(self.extensions), *args]

    def install_extension(self, vsix: Path) -> None:
        subprocess.run(self._cmd("--install-extension", str(vsix)), env=self.env, check=True,
                       capture_output=True, timeout=120)

    def write_settings(self, **changes: Any) -> None:
        """Change settings as a person editing settings.json does (VS Code watches the files). What VS Code
        wrote there itself (a command's change) is kept. Seen with code-server 4.139: once VS Code has written
        the user settings itself (Toggle Inline Completions), a change written here was not seen within 400 s
        (in place or renamed over it), so tests that write settings come before those that run such commands."""
        self.settings.update(changes)
        machine_keys = machine_scoped_settings()
        for path, machine in ((self.settings_file, False), (self.machine_settings_file, True)):
            current = json.loads(path.read_text()) if path.exists() else {}
            current.update({k: v for k, v in self.settings.items() if (k in machine_keys) == machine
                            and (k in changes or k not in current)})
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(current, indent=2))

    def user_settings(self) -> dict[str, Any]:
        return json.loads(self.settings_file.read_text())

    def start(self) -> None:
        self.write_settings()
        config = self.root / "config.yaml"
        config.write_text("")
        log = open(self.root / "code-server.log", "wb")
        # Its own process group: the extension host and the language server are stopped with it.
        self.proc = subprocess.Popen(
            self._cmd("--config", str(config), "--auth", "none", "--bind-addr", f"127.0.0.1:{self.port}",
                      "--disable-telemetry", "--disable-update-check", "--disable-workspace-trust",
                      str(self.workspace)),
            env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()

        def healthy() -> bool:
            if self.proc.poll() is not None:
                raise RuntimeError(f"code-server exited: {(self.root / 'code-server.log').read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/healthz", timeout=2) as r:
                    return r.status == 200
            except OSError:
                return False

        wait_until("code-server to listen", healthy, timeout=60, interval=0.2)

    def stop(self) -> None:
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)
        # whatever of the group outlived code-server (the extension host, the language server)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        self.proc = None

    def extension_log(self) -> str:
        """What the extension's output channel holds (the server's stderr included): VS Code keeps a
        LogOutputChannel in a file under the profile's logs."""
        files = sorted((self.user_data / "logs").glob("**/rest-lsp*.log"))
        return "\n".join(f.read_text(errors="replace") for f in files)


class Workbench:
    """The VS Code window in chromium, used through the keyboard as a person would."""

    def __init__(self, tools: Tools, server: CodeServer, viewport: tuple[int, int] = (1200, 720)):
        from playwright.sync_api import sync_playwright

        self.server = server
        self._pw = sync_playwright().start()
        self.browser = self._pw.chromium.launch(executable_path=tools.chromium, headless=True,
                                                args=CHROMIUM_ARGS)
        self.page = self.browser.new_page(viewport={"width": viewport[0], "height": viewport[1]})
        # The window's own log (VS Code's renderer logs to the console): what it fetched, what failed
        self.console_log = open(server.root / "browser-console.log", "a", buffering=1, errors="replace")
        self.page.on("console", lambda m: self.console_log.write(
            f"{time.strftime('%H:%M:%S')} {m.type}: {m.text[:2000]}\n"))

    def open(self) -> None:
        self.page.goto(self.server.url)
        self.page.wait_for_selector(".monaco-workbench", timeout=90_000)
        # A brand-new profile's first window asked for no inline completion; a reload fixed it every time.
        self.page.wait_for_selector(".statusbar", timeout=60_000)
        self.page.reload()
        self.page.wait_for_selector(".monaco-workbench .statusbar", timeout=90_000)

    def close(self) -> None:
        try:
            self.browser.close()
        finally:
            self._pw.stop()
            self.console_log.close()

    def press(self, keys: str) -> None:
        self.page.keyboard.press(keys)

    def edit_user_settings(self, **changes: Any) -> None:
        """Change user settings as a person does in VS Code: Preferences: Open User Settings (JSON), the text
        replaced, saved, the editor closed. VS Code applies what it saved itself; a file written behind its
        back (`CodeServer.write_settings`) was not seen within 400 s once the tests had typed and saved a
        file (code-server 4.139)."""
        current = self.server.user_settings()
        current.update(changes)
        self.server.settings.update(changes)
        self.command("Preferences: Open User Settings (JSON)")
        # a tab, or (VS Code 1.10x) a modal editor titled settings.json; the focus is in its text
        self.page.get_by_text("settings.json", exact=True).first.wait_for(timeout=30_000)
        modal = self.page.locator(".modal-editor-part")
        text = (modal if modal.count() else self.page.locator(".editor-group-container.active")).locator(
            ".monaco-editor .view-lines").first
        text.wait_for(timeout=30_000)
        text.click()   # the focus in its text (it is not always there yet)
        self.press("Control+a")
        # one line (no auto-indent), and whatever the editor closed after it (a bracket) removed
        self.page.keyboard.insert_text(json.dumps(current))
        self.press("Shift+Control+End")
        self.press("Delete")
        self.press("Control+s")

        def saved() -> bool:
            try:
                return self.server.user_settings() == current
            except ValueError:  # read while VS Code writes it
                return False

        wait_until("settings.json saved", saved, timeout=20)
        if modal.count():   # VS Code 1.10x opens it in a modal editor: its close button (Escape did nothing)
            modal.locator('[aria-label^="Close Modal Editor"]').first.click()
        else:
            self.command("View: Close Editor")
        # Once in a full run the editor was dirty again after the save (the file on disk as written) and closing
        # it asked "Do you want to save the changes": what is on disk is what this call checked above
        dont_save = self.page.get_by_role("button", name="Don't Save")

        def closed() -> bool:
            if dont_save.count() and dont_save.first.is_visible():
                dont_save.first.click()
            return not modal.count() and not self.page.locator(".tab", has_text="settings.json").count()

        try:
            wait_until("settings.json closed", closed, timeout=20)
        except TimeoutError:
            self.page.screenshot(path=str(self.server.root / "settings-not-closed.png"))
            raise
        if not saved():
            raise AssertionError("settings.json changed while it was closed")

    def type(self, text: str, delay_ms: float = 0) -> None:
        self.page.keyboard.type(text, delay=delay_ms)

    def quick_input(self, opener: str, text: str, expect: str | None = None) -> None:
        """Open a quick input (Ctrl+P, F1, Ctrl+G), type into it and press Enter (once `expect` shows)."""
        from playwright.sync_api import TimeoutError as PlaywrightTimeout

        self.press(opener)
        box = self.page.locator(".quick-input-widget input")
        box.wait_for(state="visible", timeout=20_000)
        # typed after what the opener put there (">" for commands, ":" for a line)
        self.page.keyboard.type(text)
        if expect is not None:
            # the list refills as results arrive: press Enter once the wanted row is the selected one
            self.page.locator(".quick-input-list .monaco-list-row.focused", has_text=expect).first.wait_for(
                timeout=20_000)
        for _ in range(3):
            self.press("Enter")
            try:
                box.wait_for(state="hidden", timeout=5_000)
                return
            except PlaywrightTimeout:
                pass   # the Enter landed while the list was refilling
        raise TimeoutError(f"the quick input did not accept {text!r}")

    def open_file(self, name: str) -> None:
        self.quick_input("Control+P", name, expect=name)
        self.page.locator(".tab.active", has_text=name).wait_for(timeout=30_000)
        self.page.locator(".editor-instance .monaco-editor").first.wait_for(timeout=30_000)

    def go_to(self, line: int, column: int) -> None:
        """Put the cursor at a 1-based line and column (Ctrl+G, as a person would)."""
        self.quick_input("Control+G", f"{line}:{column}")

    def command(self, title: str) -> None:
        """Run a command from the command palette by its title."""
        self.quick_input("F1", title, expect=title)

    def ghost_text(self) -> str | None:
        return self.page.evaluate(GHOST_JS)

    def wait_ghost_text(self, timeout: float = 120) -> str:
        """The ghost text once it shows. No key is pressed meanwhile: an Automatic request past the server's
        prompt budget (a slow, busy CPU) is answered empty, and the extension asks again by itself when the
        server says the suggestion is there (rest/suggestionReady)."""
        return wait_until("ghost text in the editor", self.ghost_text, timeout=timeout, interval=0.05)

    def status_text(self) -> str:
        """The rest-lsp status bar item's text, "" when it is not shown."""
        items = self.page.locator(".statusbar-item", has_text="REST")
        return items.first.inner_text() if items.count() else ""

    def editor_text(self) -> str:
        """The active editor's lines as rendered (those on screen), top to bottom."""
        return self.page.evaluate("""() => {
          const lines = [...document.querySelectorAll('.editor-group-container.active .editor-instance .view-lines > .view-line')];
          lines.sort((a, b) => parseFloat(a.style.top) - parseFloat(b.style.top));
          return lines.map((e) => e.textContent.replace(/\\u00a0/g, ' ')).join('\\n');
        }""")

    def screenshot(self, path: Path) -> None:
        self.page.screenshot(path=str(path))
