"""Starting and stopping `rest-lsp team-server` for the team tests and benchmarks/team_bench.py."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def team_python() -> Path:
    """The team venv's interpreter, where `rest-lsp team-server` looks for it."""
    if os.environ.get("REST_LSP_TEAM_PYTHON"):
        return Path(os.environ["REST_LSP_TEAM_PYTHON"])
    from restbase.storage import cache_root

    return cache_root() / "team-venv" / "bin" / "python"


def team_venv_ready() -> str | None:
    """None when the team venv has vllm (by its files: importing it takes seconds); else why not."""
    py = team_python()
    if not py.is_file():
        return f"no team venv at {py} (bash scripts/team_venv.sh)"
    lib = py.parent.parent / "lib"
    if not any(lib.glob("python3*/site-packages/vllm/__init__.py")):
        return f"the team venv at {py} has no vllm"
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url: str, key: str | None = None, timeout: float = 5.0) -> tuple[int, bytes]:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {key}"} if key else {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def spec_metrics(url: str, body: bytes | None = None) -> dict[str, float]:
    """vLLM's speculative-decoding counters from /metrics (not behind the key), or from `body`, a /metrics
    reply already read."""
    if body is None:
        body = get(url + "/metrics")[1]
    out = {}
    for line in body.decode().splitlines():
        for name in ("num_drafts", "num_draft_tokens", "num_accepted_tokens"):
            if line.startswith(f"vllm:spec_decode_{name}_total{{"):
                out[name] = float(line.rsplit(" ", 1)[1])
    return out


@contextmanager
def team_server(model: str, *, key: str | None, port: int | None = None, spec: str = "rest",
                repos: tuple[str, ...] = (), extra: tuple[str, ...] = (), team_args: tuple[str, ...] = (),
                log_path: Path | None = None,
                start_timeout: float = 600.0, k: int = 8):
    """`rest-lsp team-server` as a child process (its own process group); yields (url, stats_file, log_path)
    once /health answers; stopped with SIGTERM (SIGKILL after 30 s) at the end."""
    port = port or free_port()
    env = dict(os.environ)
    env.pop("VLLM_API_KEY", None)
    if key:
        env["REST_LSP_TEAM_KEY"] = key
    else:
        env.pop("REST_LSP_TEAM_KEY", None)
    cmd = [sys.executable, "-m", "rest_lsp.cli", "team-server", "--model", str(model), "--port", str(port),
           "--spec", spec, "--num-speculative-tokens", str(k), "--max-model-len", "2048"]
    for r in repos:
        cmd += ["--repo", str(r)]
    cmd += list(team_args)
    if not key:
        cmd.append("--no-auth")
    if extra:
        cmd += ["--", *extra]
    log_path = Path(log_path or f"/tmp/team-server-{port}.log")
    log = open(log_path, "w")
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    from restbase.storage import cache_root

    stats = cache_root() / "team" / f"127.0.0.1-{port}" / "proposer-stats.json"
    try:
        t0 = time.monotonic()
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"team server exited ({proc.returncode}) before serving; log {log_path}:\n"
                                   + log_path.read_text()[-3000:])
            try:
                if get(url + "/health", timeout=2)[0] == 200:
                    break
            except OSError:
                pass
            if time.monotonic() - t0 > start_timeout:
                raise RuntimeError(f"team server not up after {start_timeout:.0f} s; log {log_path}")
            time.sleep(1.0)
        yield url, stats, log_path
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        log.close()


def read_stats(path: Path, wait_s: float = 3.0) -> dict:
    """The proposer's stats file (written at most every 0.5 s)."""
    time.sleep(wait_s)
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return {}
