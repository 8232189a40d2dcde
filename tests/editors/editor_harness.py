"""Shared by the editor tests: paths, the test file, and a minimal msgpack-RPC client for `nvim --embed`: enough to type keys as a user would (`nvim_input`, which
goes through Neovim's real input loop, so insert mode, autocommands and mappings all run) and to inspect
state with `nvim_exec_lua`."""
from __future__ import annotations

import os
import select
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, NoReturn

import msgpack
import pytest


REPO = Path(__file__).resolve().parents[2]
SERVER = Path(sys.executable).parent / "rest-lsp"
# The server command the editors run (REST_LSP_TEST_SERVER_CMD overrides it, e.g. to debug a client).
SERVER_CMD = shlex.split(os.environ.get("REST_LSP_TEST_SERVER_CMD", "")) or [str(SERVER), "--stdio"]
PLUGIN = REPO / "editors" / "neovim"

CALC = "def add(a, b):\n    return a + b\n\n\ndef mul(a, b):\n    \n"


def wait_until(what: str, f: Callable[[], Any], timeout: float, interval: float = 0.1) -> Any:
    """f()'s first truthy value, asked every `interval` seconds; TimeoutError after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        v = f()
        if v:
            return v
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


def make_workspace(tmp: Path) -> Path:
    """The small project the editor tests open: a git root with calc.py (the file typed into) and util.py."""
    ws = tmp / "ws"
    ws.mkdir()
    (ws / ".git").mkdir()
    (ws / "calc.py").write_text(CALC)
    (ws / "util.py").write_text("def sub(a, b):\n    return a - b\n")
    return ws


def missing_editor(why: str) -> NoReturn:
    """A test's editor is not installed: a failure under scripts/test.sh, which installed the editors
    (REST_LSP_REQUIRE_EDITORS=1), else a skip."""
    if os.environ.get("REST_LSP_REQUIRE_EDITORS"):
        pytest.fail(why, pytrace=False)
    pytest.skip(why, allow_module_level=True)


NVIM_012 = PLUGIN / ".nvim-test" / "bin" / "nvim"   # fetched by scripts/test_editors.sh


def neovims() -> list[str]:
    """Debian's nvim (the one the tests require), the Neovim 0.12 build scripts/test_editors.sh unpacks (the
    native inline completion path), and any in REST_LSP_TEST_NVIM (os.pathsep-separated)."""
    found = [p for p in [shutil.which("nvim")] if p]
    if NVIM_012.is_file() and os.access(NVIM_012, os.X_OK):
        found.append(str(NVIM_012))
    found += [p for p in os.environ.get("REST_LSP_TEST_NVIM", "").split(os.pathsep) if p]
    return list(dict.fromkeys(found))


def server_env(tmp: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["XDG_CACHE_HOME"] = str(tmp / "cache")   # per-workspace datastores of the test stay in tmp
    env["OMP_NUM_THREADS"] = "1"
    return env


class NvimError(RuntimeError):
    pass


class Nvim:
    def __init__(self, argv: list[str], *, env: dict[str, str], cwd: str):
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, env=env, cwd=cwd)
        # Buffer/window handles arrive as msgpack ext types whose payload is the handle as msgpack.
        self._unpacker = msgpack.Unpacker(raw=False, strict_map_key=False,
                                          ext_hook=lambda code, data: msgpack.unpackb(data))
        self._next_id = 0
        self.notifications: list[Any] = []

    def request(self, method: str, *args: Any, timeout: float = 30.0) -> Any:
        self._next_id += 1
        msgid = self._next_id
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(msgpack.packb([0, msgid, method, list(args)], use_bin_type=True))
        self.proc.stdin.flush()
        deadline = time.monotonic() + timeout
        fd = self.proc.stdout.fileno()
        while True:
            for msg in self._unpacker:
                if msg[0] == 1 and msg[1] == msgid:
                    if msg[2] is not None:
                        raise NvimError(f"{method}: {msg[2]}")
                    return msg[3]
                if msg[0] == 2:
                    self.notifications.append(msg[1:])
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"nvim did not answer {method} within {timeout} s")
            ready, _, _ = select.select([fd], [], [], left)
            if ready:
                data = os.read(fd, 1 << 16)
                if not data:
                    err = self.proc.stderr.read().decode(errors="replace") if self.proc.stderr else ""
                    raise NvimError(f"nvim exited during {method}: {err[-2000:]}")
                self._unpacker.feed(data)

    def lua(self, code: str, *args: Any) -> Any:
        return self.request("nvim_exec_lua", code, list(args))

    def input(self, keys: str) -> None:
        """Keys as typed by a user (`<Tab>`, `<Esc>` notation)."""
        self.request("nvim_input", keys)

    def command(self, cmd: str) -> None:
        self.request("nvim_command", cmd)

    def lines(self) -> list[str]:
        return self.lua("return vim.api.nvim_buf_get_lines(0, 0, -1, false)")

    def wait_for(self, lua_expr: str, *, timeout: float = 60.0, what: str = "", interval: float = 0.05) -> Any:
        """Poll `return <lua_expr>` until it is truthy; returns its value."""
        deadline = time.monotonic() + timeout
        while True:
            value = self.lua(f"return {lua_expr}")
            if value:
                return value
            if time.monotonic() > deadline:
                raise TimeoutError(f"timed out after {timeout} s waiting for {what or lua_expr}")
            time.sleep(interval)

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write(msgpack.packb([2, "nvim_command", ["qa!"]], use_bin_type=True))
                self.proc.stdin.flush()
                self.proc.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()


def version(nvim: str) -> tuple[int, int]:
    out = subprocess.run([nvim, "--version"], capture_output=True, text=True, timeout=30).stdout
    major, minor = out.split()[1].lstrip("v").split(".")[:2]
    return int(major), int(minor)
