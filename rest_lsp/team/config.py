"""The team server's configuration, as vLLM's worker process receives it.

vLLM builds the proposer as `cls(vllm_config)` inside its engine-core process; nothing of ours can be passed
through that call. `rest-lsp team-server` therefore writes one JSON file (0600) and sets the environment
variable ENV_VAR to its path before starting vLLM; the worker inherits the environment and the proposer reads
the file in its constructor. Torch-free and vllm-free: both venvs import it.

    {"version": 1,
     "tokenizer": "/path/to/model-dir",        # the model's tokenizer: every datastore is opened with it
     "repositories": ["/cache/team/stores/…"], # datastores of the team's repositories (rest-index build)
     "corpus": "/path/to/corpus" | null,       # a corpus datastore (optional)
     "shares": {"context": 0.5, "repository": 0.3, "corpus": 0.2},
     "max_nodes": 64,                          # trie nodes ranked per step; the best path of them is proposed
     "min_prob": 0.0,                          # ... cut before a node whose estimated acceptance is below it
     "stats_file": "/cache/team/…/proposer-stats.json" | null}
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

ENV_VAR = "REST_LSP_TEAM_CONFIG"
VERSION = 1
# the draft sources a team server mixes: the request's own text (prompt and output so far), the team's
# repositories, the corpus; the shares of the daemon's "rest" policy (rest_lsp/engine/policy.py)
DEFAULT_SHARES = {"context": 0.5, "repository": 0.3, "corpus": 0.2}


class TeamConfigError(ValueError):
    """A missing, unreadable or malformed team configuration."""


@dataclass
class TeamConfig:
    tokenizer: str
    repositories: list[str] = field(default_factory=list)
    corpus: str | None = None
    shares: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_SHARES))
    max_nodes: int = 64
    min_prob: float = 0.0      # the chain ends before a node whose estimated acceptance is below this
    stats_file: str | None = None
    version: int = VERSION

    def write(self, path: Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(asdict(self), f, indent=1)
        os.replace(tmp, path)
        return path

    @classmethod
    def read(cls, path: str | Path) -> "TeamConfig":
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, ValueError) as exc:
            raise TeamConfigError(f"team configuration {path}: {exc}") from exc
        if not isinstance(data, dict) or data.get("version") != VERSION or not isinstance(data.get("tokenizer"), str):
            raise TeamConfigError(f"team configuration {path}: not a version-{VERSION} file with a tokenizer")
        known = {k: data[k] for k in ("tokenizer", "repositories", "corpus", "shares", "max_nodes", "min_prob",
                                      "stats_file")
                 if k in data}
        cfg = cls(**known)
        unknown = set(cfg.shares) - set(DEFAULT_SHARES)
        if unknown:
            raise TeamConfigError(f"team configuration {path}: unknown draft sources {sorted(unknown)}")
        if not isinstance(cfg.max_nodes, int) or not 1 <= cfg.max_nodes <= 256:
            raise TeamConfigError(f"team configuration {path}: max_nodes must be 1-256")
        if not isinstance(cfg.min_prob, (int, float)) or not 0 <= cfg.min_prob < 1:
            raise TeamConfigError(f"team configuration {path}: min_prob must be in [0, 1)")
        return cfg

    @classmethod
    def from_env(cls) -> "TeamConfig":
        path = os.environ.get(ENV_VAR)
        if not path:
            raise TeamConfigError(f"{ENV_VAR} is not set: start the team server with `rest-lsp team-server`, "
                                  "which writes the configuration and sets it")
        return cls.read(path)
