"""The team server (rest_lsp/team, rest_lsp/service/remote.py, docs/team.md).

Without vLLM (always): the configuration file, the proposer as vLLM's model runner calls it (rows, chains,
prefilling rows, the datastore's continuation proposed), `rest-lsp team-server`'s key rule, the streaming
client and the remote backend against a small fake OpenAI server (stream, early close, 401, server down).

With the team venv (scripts/team_venv.sh; skipped without it): `rest-lsp team-server` on a tiny model in vLLM,
a streamed completion, REST's drafts accepted by vLLM (its /metrics), a wrong or missing key refused, an early
closed stream aborting the request."""
from __future__ import annotations

import json
import os
import stat
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from rest_lsp.team.config import ENV_VAR, TeamConfig, TeamConfigError

HERE = Path(__file__).resolve().parent


# ---------------------------------------------------------------------------------------- configuration
def test_config_round_trip_private_file(tmp_path, monkeypatch):
    cfg = TeamConfig(tokenizer="/m", repositories=["/s/a", "/s/b"], corpus=None, max_nodes=32)
    path = cfg.write(tmp_path / "team" / "config.json")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600          # datastore paths are the team's business
    assert TeamConfig.read(path) == cfg
    monkeypatch.delenv(ENV_VAR, raising=False)
    with pytest.raises(TeamConfigError, match=ENV_VAR):
        TeamConfig.from_env()
    monkeypatch.setenv(ENV_VAR, str(path))
    assert TeamConfig.from_env().repositories == ["/s/a", "/s/b"]
    path.write_text(json.dumps({"version": 1, "tokenizer": "/m", "shares": {"paper": 1.0}}))
    with pytest.raises(TeamConfigError, match="unknown draft sources"):
        TeamConfig.read(path)


# ---------------------------------------------------------------------------------------- the proposer
def test_best_path_follows_the_likeliest_child():
    from rest_lsp.engine.tree import DraftTree
    from rest_lsp.team.proposer import best_path

    #        0(root)
    #       /       \
    #   1:a .9     2:b .3
    #     |            |
    #   3:c .8       4:d .2
    #   /    \
    # 5:e .1  6:f .7
    tree = DraftTree(tokens=[9, 1, 2, 3, 4, 5, 6], parents=[-1, 0, 0, 1, 2, 3, 3], depths=[0, 1, 1, 2, 2, 3, 3],
                     probs=[1, .9, .3, .8, .2, .1, .7], sources=[""] * 7)
    assert best_path(tree, 8) == [1, 3, 6]
    assert best_path(tree, 2) == [1, 3]
    assert best_path(tree, 8, min_prob=0.75) == [1, 3]         # cut before f (0.7)
    assert best_path(tree, 8, min_prob=0.95) == []
    assert best_path(DraftTree.single(5), 8) == []


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    from testmodels.tiny import make_tiny_model_dir

    return make_tiny_model_dir(tmp_path_factory.mktemp("team-tiny") / "model", seed=0)


@pytest.fixture(scope="module")
def repo_store(tmp_path_factory, tiny_dir):
    """A repository datastore in the tiny model's tokenizer: one file with a distinctive line."""
    from indexer.build import build_datastore

    root = tmp_path_factory.mktemp("team-repo")
    (root / "colors.py").write_text("def paint(canvas):\n    canvas.fill(red=1, green=2, blue=3, alpha=4)\n"
                                    "    return canvas\n")
    out = root.parent / (root.name + "-store")
    build_datastore([root], out, tokenizer=str(tiny_dir))
    return out


def _vllm_config(k=6, max_len=4096, vocab=512):
    return SimpleNamespace(speculative_config=SimpleNamespace(num_speculative_tokens=k),
                           model_config=SimpleNamespace(max_model_len=max_len, get_vocab_size=lambda: vocab))


def test_proposer_called_as_vllm_calls_it(tmp_path, monkeypatch, tiny_dir, repo_store):
    """propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu): one chain per row; a prefilling row
    (nothing sampled) gets none; a row whose tail the repository holds gets the repository's continuation."""
    from transformers import AutoTokenizer

    from rest_lsp.team.proposer import RestProposer

    tok = AutoTokenizer.from_pretrained(str(tiny_dir))
    cfg = TeamConfig(tokenizer=str(tiny_dir), repositories=[str(repo_store)], stats_file=str(tmp_path / "s.json"),
                     shares={"repository": 1.0})
    monkeypatch.setenv(ENV_VAR, str(cfg.write(tmp_path / "config.json")))
    prop = RestProposer(_vllm_config(k=6))                     # from the environment, as inside vLLM
    prop.load_model(None)
    assert prop.opened["sources"] == ["repository"]
    text = "def paint(canvas):\n    canvas.fill(red=1, green=2, blue=3, alpha=4)\n"
    ids = tok.encode(text, add_special_tokens=False)
    cut = len(tok.encode("def paint(canvas):\n    canvas.fill(red=1, green", add_special_tokens=False))
    batch = np.zeros((3, 4096), dtype=np.int32)                 # vLLM's token_ids_cpu: [max_reqs, max_len]
    batch[0, :cut] = ids[:cut]
    batch[1, :cut] = ids[:cut]
    batch[2, :5] = [7, 8, 9, 10, 11]
    chains = prop.propose([[ids[cut - 1]], [], [11]], np.array([cut, cut, 5]), batch)
    assert len(chains) == 3
    assert chains[1] == []                                      # still prefilling: nothing sampled
    assert 1 <= len(chains[0]) <= 6
    assert chains[0] == ids[cut:cut + len(chains[0])]           # what the repository says comes next
    assert all(isinstance(t, int) for c in chains for t in c)
    # at the end of the model's length: no room for drafts
    assert prop.propose([[5]], np.array([4095]), batch[:1]) == [[]]
    assert prop.stats["proposals"] >= 1 and prop.stats["by_source"].get("repository", 0) >= 1


def test_proposer_refuses_a_store_of_another_vocabulary(tmp_path, repo_store):
    from rest_lsp.team.proposer import RestProposer
    from testmodels.tiny import make_tiny_codellama_dir

    other = make_tiny_codellama_dir(tmp_path / "codellama")
    cfg = TeamConfig(tokenizer=str(other), repositories=[str(repo_store)])
    with pytest.raises(Exception, match="(?i)tokenizer"):
        RestProposer(_vllm_config(), config=cfg)


# ---------------------------------------------------------------------------------------- the command
def test_team_server_needs_a_key(tmp_path, monkeypatch, capsys, tiny_dir):
    from rest_lsp.team import server

    monkeypatch.setenv("REST_LSP_CACHE", str(tmp_path / "cache"))
    for var in ("REST_LSP_TEAM_KEY", "VLLM_API_KEY"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(SystemExit) as e:
        server.main(["--model", str(tiny_dir), "--dry-run"])
    assert e.value.code == 2 and "no API key" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        server.main(["--model", str(tiny_dir), "--host", "0.0.0.0", "--no-auth", "--dry-run"])
    assert "only on a loopback" in capsys.readouterr().err
    monkeypatch.setenv("REST_LSP_TEAM_KEY", "s3cret-key")
    assert server.main(["--model", str(tiny_dir), "--port", "8999", "--dry-run"]) == 0
    err = capsys.readouterr().err
    assert "rest_lsp.team.proposer.RestProposer" in err and "--served-model-name" in err
    assert "s3cret-key" not in err                              # the key goes by environment, never argv
    cfg = TeamConfig.read(tmp_path / "cache" / "team" / "127.0.0.1-8999" / "config.json")
    assert cfg.tokenizer == str(tiny_dir)
    assert server.main(["--model", str(tiny_dir), "--no-auth", "--spec", "ngram", "--dry-run"]) == 0
    assert '"method": "ngram"' in capsys.readouterr().err
    assert server.main(["--model", str(tiny_dir), "--no-auth", "--spec", "suffix", "--dry-run"]) == 0
    assert '"method": "suffix"' in capsys.readouterr().err
    from rest_lsp.model.probes import cpu_has_bf16

    want = "bfloat16" if cpu_has_bf16() else "float32"   # --dtype auto, the default
    assert server.main(["--model", str(tiny_dir), "--no-auth", "--dry-run"]) == 0
    assert f"--dtype {want}" in capsys.readouterr().err
    assert server.main(["--model", str(tiny_dir), "--no-auth", "--dtype", "half", "--dry-run"]) == 0
    assert "--dtype half" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------- client side
class FakeOpenAI:
    """/v1/models and a streamed /v1/completions (one event per word of `reply`), key `good`; records the
    requests and whether a stream's client went away before its end."""

    def __init__(self, reply: str, delay: float = 0.0):
        self.reply, self.delay = reply, delay
        self.requests: list[dict] = []
        self.aborted = threading.Event()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def _auth(self) -> bool:
                if self.headers.get("Authorization") != "Bearer good":
                    body = b'{"error":"Unauthorized"}'
                    self.send_response(401)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                    return False
                return True

            def do_GET(self):
                if not self._auth():
                    return
                body = json.dumps({"data": [{"id": "tiny"}]}).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self):
                req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if not self._auth():
                    return
                fake.requests.append(req)
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                try:
                    for i, w in enumerate(fake.reply.split(" ")):
                        piece = w if i == 0 else " " + w
                        ev = {"choices": [{"index": 0, "text": piece, "finish_reason": None}]}
                        self.wfile.write(b"data: " + json.dumps(ev).encode() + b"\n\n")
                        self.wfile.flush()
                        time.sleep(fake.delay)
                    self.wfile.write(b'data: {"choices":[{"index":0,"text":"","finish_reason":"length"}]}\n\n'
                                     b"data: [DONE]\n\n")
                    self.wfile.flush()
                except (BrokenPipeError, ConnectionResetError):
                    fake.aborted.set()

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def test_client_streams_refuses_and_closes():
    from rest_lsp.service.team_client import TeamClient, TeamServerError, client_from_setting

    fake = FakeOpenAI("alpha beta gamma delta")
    try:
        c = TeamClient(fake.url, key="good")
        s = c.stream([1, 2, 3], max_tokens=8)
        pieces = []
        while (p := s.next_text()) is not None:
            pieces.append(p)
        assert pieces[:4] == ["alpha", " beta", " gamma", " delta"] and s.text == "alpha beta gamma delta"
        assert s.finish_reason == "length"
        req = fake.requests[-1]
        assert req["prompt"] == [1, 2, 3] and req["stream"] is True and req["model"] == "tiny"
        with pytest.raises(TeamServerError) as e:
            TeamClient(fake.url, key="bad", model="tiny").complete([1], max_tokens=2)
        assert e.value.status == 401 and "key was refused" in str(e.value)
        os.environ["REST_LSP_TEAM_TEST_KEY"] = "good"
        try:
            c2 = client_from_setting({"url": fake.url, "key_env": "REST_LSP_TEAM_TEST_KEY"})
            assert c2.complete([4], max_tokens=2) == "alpha beta gamma delta"
        finally:
            del os.environ["REST_LSP_TEAM_TEST_KEY"]
        # a stream closed before its end: the server sees the client go
        fake.reply, fake.delay = " ".join(["w"] * 200), 0.02
        s = c.stream([1], max_tokens=200)
        s.next_text()
        s.close()
        assert fake.aborted.wait(10)
    finally:
        fake.close()
    with pytest.raises(TeamServerError, match="unreachable"):
        TeamClient(fake.url, key="good", model="tiny").complete([1], max_tokens=2)


def test_remote_backend_runs_stop_rules_and_supersession(tiny_dir):
    """The daemon's backend under `server`: the rendered FIM prompt goes as ids, the text is cut by the
    daemon's line rule, a stopped run closes its stream, a server that is down fails the run (not the daemon)."""
    from rest_lsp.service.config import ServerConfig
    from rest_lsp.service.prompt import build_context
    from rest_lsp.service.remote import RemoteBackend, tokenizer_only
    from rest_lsp.service.team_client import TeamClient, TeamServerError

    fake = FakeOpenAI("x = 1\n    y = 2\n    z = 3\n")
    try:
        loaded = tokenizer_only(str(tiny_dir))
        assert loaded.model is None and loaded.fim is not None
        backend = RemoteBackend(loaded, TeamClient(fake.url, key="good"))
        text = "def f():\n    \n    return 0\n"
        ctx = build_context(text, 1, 4)
        cfg = ServerConfig(max_lines=2, layout="psm")
        run = backend.start("doc", ctx, cfg)
        while not run.done:
            backend.advance(run)
        prompt = fake.requests[-1]["prompt"]
        assert prompt == run.prompt and loaded.tokenizer.convert_tokens_to_ids("<|fim_middle|>") in prompt
        assert run.text == "x = 1\n    y = 2" and run.stop_reason == "max_lines"   # two lines, cut here
        warm = backend.start("doc", ctx, cfg, purpose="warm")
        assert warm.done and warm.stream is None                 # warm-ups send nothing
        fake.reply, fake.delay = " ".join(["w"] * 200), 0.02
        run = backend.start("doc", ctx, ServerConfig(max_lines=8, max_tokens=200, layout="psm"))
        while run.stream is None or not run.text:
            backend.advance(run)
        backend.stop(run, "superseded")
        assert run.done and run.stream.closed and fake.aborted.wait(10)
        assert backend.describe()["server"]["closed_early"] == 1
    finally:
        fake.close()
    run = backend.start("doc", ctx, cfg)
    with pytest.raises(TeamServerError, match="unreachable"):
        for _ in range(100):       # the reader thread's connection attempt fails within a few steps
            backend.advance(run)
    assert run.done and run.stop_reason == "error" and "unreachable" in backend.describe()["server"]["last_error"]


def test_server_setting():
    from rest_lsp.service.config import ServerConfig, merge

    cfg, changed, problems = merge(ServerConfig(), {"server": "http://team:8000"})
    assert not problems and cfg.server == {"url": "http://team:8000"} and changed == {"server"}
    cfg, _, problems = merge(ServerConfig(), {"restLsp": {"server": {"url": "https://t", "keyEnv": "K"}}})
    assert not problems and cfg.server == {"url": "https://t", "key_env": "K"}
    for bad in ({"url": "ftp://x"}, {"url": "http://x", "token": "t"}, 5, {"key": "k"}):
        assert merge(ServerConfig(), {"server": bad})[2], bad


# ---------------------------------------------------------------------------------------- with vLLM
def _vllm_skip() -> str | None:
    import sys

    sys.path.insert(0, str(HERE))
    from harness import team_venv_ready

    return team_venv_ready()


@pytest.mark.skipif(_vllm_skip() is not None, reason=str(_vllm_skip()))
def test_team_server_in_vllm(tmp_path):
    """The whole path in vLLM (2-4 minutes on 2 cores, most of it vLLM's start)."""
    import sys

    sys.path.insert(0, str(HERE))
    from harness import get, read_stats, spec_metrics, team_server
    from tiny_vllm import make_tiny_vllm_model
    from transformers import AutoTokenizer

    from rest_lsp.service.team_client import TeamClient, TeamServerError

    model = make_tiny_vllm_model(tmp_path / "tiny64")
    repo = Path(__file__).resolve().parents[2] / "indexer"
    tok = AutoTokenizer.from_pretrained(str(model))
    ids = tok.encode((repo / "store.py").read_text()[:1200])
    with team_server(str(model), key="team-key-1", repos=(str(repo),), log_path=tmp_path / "server.log") as (url, stats, _):
        assert get(url + "/v1/models")[0] == 401                               # no key
        assert get(url + "/v1/models", key="wrong")[0] == 401                  # a wrong one
        c = TeamClient(url, key="team-key-1")
        for bad in ("wrong", None):
            with pytest.raises(TeamServerError) as e:
                TeamClient(url, key=bad, model=c.model_name()).complete(ids, max_tokens=4)
            assert e.value.status == 401
        s = c.stream(ids, max_tokens=64)
        events = 0
        while s.next_text() is not None:
            events += 1
        assert s.usage["completion_tokens"] == 64 and s.finish_reason == "length" and s.text
        m = spec_metrics(url)
        assert m["num_drafts"] > 0 and m["num_accepted_tokens"] > 0           # REST's drafts, accepted by vLLM
        st = read_stats(stats)
        assert st["proposals"] > 0 and st["proposed_tokens"] >= m["num_draft_tokens"] > 0
        # the same prompt again decodes the same text (greedy, drafts or not)
        assert c.complete(ids, max_tokens=64) == s.text
        # the daemon's one-shot completion through the server (`rest-lsp complete --server URL`)
        from rest_lsp.service.oneshot import run_complete

        src = tmp_path / "shapes.py"
        src.write_text("def area(width, height):\n    \n")
        before = _generation_tokens(url)
        os.environ["REST_LSP_TEAM_KEY"] = "team-key-1"
        try:
            r = run_complete(src, 1, 4, settings={"model": str(model), "server": url, "max_tokens": 16,
                                                  "prompt_budget_ms": 0, "predict_budget_ms": 0})
        finally:
            del os.environ["REST_LSP_TEAM_KEY"]
        assert r["verifier"] == "team-server" and isinstance(r["completion"], str)
        assert _generation_tokens(url) > before                                # decoded there, not here
        # a stream closed early: vLLM aborts the request, far fewer than its max_tokens are generated
        before = _generation_tokens(url)
        s = c.stream(ids, max_tokens=1000)
        s.next_text()
        s.close()
        time.sleep(3)
        assert _generation_tokens(url) - before < 1000


def _generation_tokens(url: str) -> float:
    from harness import get

    for line in get(url + "/metrics")[1].decode().splitlines():
        if line.startswith("vllm:generation_tokens_total{"):
            return float(line.rsplit(" ", 1)[1])
    return 0.0
