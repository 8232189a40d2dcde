"""`rest-lsp team-server`: vLLM's OpenAI-compatible server on one model, with REST as its speculative proposer.

    rest-lsp team-server [--model M] [--repo DIR]... [--corpus DIR] [--host 127.0.0.1] [--port 8000]
                         [--api-key-file F | --api-key-env VAR | --no-auth] [--spec rest|ngram|suffix|none]
                         [--num-speculative-tokens 8] [--max-model-len 4096] [--team-python PY] [--dry-run]
                         [-- VLLM_ARGS...]

What it does, in the project's venv (torch, no vllm):
1. resolves the model to a local Hugging Face directory vLLM can load: an embedded model's converted
   safetensors copy in the cache (converted once from its GGUF, as the daemon does), a .gguf converted the
   same way, a directory as it is, or a hub id passed through;
2. builds or syncs one datastore per --repo in the model's tokenizer (<cache>/team/stores/);
3. writes the proposer's configuration (rest_lsp/team/config.py) to <cache>/team/<host>-<port>/config.json;
4. replaces itself with `PY -m vllm.entrypoints.openai.api_server ...` in the team venv (scripts/team_venv.sh)
   with REST_LSP_TEAM_CONFIG naming that file and VLLM_API_KEY holding the key (the key never appears on a
   command line, where `ps` would show it).

The key: --api-key-file (first line), else the variable named by --api-key-env (default REST_LSP_TEAM_KEY),
else VLLM_API_KEY. Without one it refuses to start; --no-auth (loopback addresses only) serves without a key.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from pathlib import Path

from rest_lsp.transport import is_loopback

KEY_ENV = "REST_LSP_TEAM_KEY"
PYTHON_ENV = "REST_LSP_TEAM_PYTHON"
PROPOSER = "rest_lsp.team.proposer.RestProposer"


def team_dir() -> Path:
    from restbase.storage import cache_root

    return cache_root() / "team"


def default_python() -> Path:
    """The team venv's interpreter: $REST_LSP_TEAM_PYTHON, else <cache>/team-venv (scripts/team_venv.sh)."""
    if os.environ.get(PYTHON_ENV):
        return Path(os.environ[PYTHON_ENV])
    from restbase.storage import cache_root

    return cache_root() / "team-venv" / "bin" / "python"


def read_key(args) -> str | None:
    if args.api_key_file:
        try:
            key = Path(args.api_key_file).expanduser().read_text().splitlines()[0].strip()
        except (OSError, IndexError) as exc:
            raise SystemExit(f"rest-lsp team-server: cannot read a key from {args.api_key_file}: {exc}")
        return key or None
    return os.environ.get(args.api_key_env) or os.environ.get("VLLM_API_KEY") or None


def resolve_model(spec: str | None) -> tuple[str, str]:
    """-> (what vLLM loads: a directory or a hub id, the served model name)."""
    from rest_lsp.model import host
    from restbase.assets import lookup

    embedded = lookup(spec) if spec not in (None, "", "auto") else None
    if spec in (None, "", "auto") or embedded is not None:
        name = embedded.name if embedded is not None else None
        path = host.embedded_model_dir(name)
        return str(path), (name or _default_name())
    p = Path(spec).expanduser()
    if p.suffix.lower() == ".gguf":
        return str(host.convert_gguf(p)), p.stem
    if p.is_dir():
        return str(p.resolve()), p.name
    return spec, spec  # a hub id: vLLM fetches it (or reads the HF cache offline)


def _default_name() -> str:
    from restbase.assets import DEFAULT_MODEL

    return getattr(DEFAULT_MODEL, "name", str(DEFAULT_MODEL))


def repo_stores(repos: list[str], tokenizer: str, say) -> list[str]:
    """One datastore per repository, built (or synced) in the model's tokenizer."""
    from indexer.watch import open_or_build
    from rest_lsp.filenames import safe_filename

    out = []
    for r in repos:
        root = Path(r).expanduser().resolve()
        if not root.is_dir():
            raise SystemExit(f"rest-lsp team-server: --repo {r}: not a directory")
        key = hashlib.sha256(f"{root}\0{tokenizer}".encode()).hexdigest()[:12]
        dest = team_dir() / "stores" / f"{safe_filename(root.name)[:40]}-{key}"
        store = open_or_build([root], dest, tokenizer=tokenizer, log_fn=say)
        say(f"repository {root}: {store.stats().get('documents')} documents -> {dest}")
        store.close()
        out.append(str(dest))
    return out


def speculative_config(spec: str, k: int) -> str | None:
    if spec == "rest":
        return json.dumps({"model": PROPOSER, "num_speculative_tokens": k})
    if spec == "ngram":
        return json.dumps({"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_max": 5,
                           "prompt_lookup_min": 2})
    if spec == "suffix":   # Arctic Inference's suffix decoding (scripts/team_venv.sh: TEAM_SUFFIX=1), its defaults
        return json.dumps({"method": "suffix", "num_speculative_tokens": k})
    return None


def vllm_dtype(dtype: str) -> str:
    """`auto`: bfloat16 where the CPU has native bf16 dot products (half the bytes a step streams: with one
    typist on the 2-core AVX-512 EPYC, suggestions shown at 17% of pauses against 1.8% in float32, docs/team.md),
    else float32 (vLLM's CPU build has no fast bf16 path without them); anything else is vLLM's own."""
    if dtype != "auto":
        return dtype
    from rest_lsp.model.probes import cpu_has_bf16   # torch: only when choosing

    return "bfloat16" if cpu_has_bf16() else "float32"


def vllm_command(python: str, model: str, name: str, args, extra: list[str]) -> list[str]:
    cmd = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", model, "--served-model-name", name,
           "--host", args.host, "--port", str(args.port), "--max-model-len", str(args.max_model_len),
           "--dtype", vllm_dtype(args.dtype)]
    sc = speculative_config(args.spec, args.num_speculative_tokens)
    if sc:
        cmd += ["--speculative-config", sc]
    return cmd + extra


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="rest-lsp team-server", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="an embedded model (default qwen2.5-coder-0.5b), a model "
                                                  "directory, a .gguf file or a hub id")
    p.add_argument("--repo", action="append", default=[], help="a repository the drafts come from (repeatable)")
    p.add_argument("--corpus", default=None, help="a corpus datastore built with rest-index, in the model's tokenizer")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--api-key-file", default=None, help="a file whose first line is the API key")
    p.add_argument("--api-key-env", default=KEY_ENV, help=f"the variable holding the API key (default {KEY_ENV}; "
                                                          "VLLM_API_KEY is read too)")
    p.add_argument("--no-auth", action="store_true", help="serve without a key (loopback addresses only)")
    p.add_argument("--spec", choices=("rest", "ngram", "suffix", "none"), default="rest",
                   help="speculative decoding: REST (default), vLLM's ngram, vLLM's suffix (needs "
                        "arctic-inference in the team venv), or none")
    p.add_argument("--num-speculative-tokens", type=int, default=8)
    p.add_argument("--max-model-len", type=int, default=4096)
    p.add_argument("--dtype", default="auto", help="vLLM's --dtype (default auto: bfloat16 where the CPU has "
                                                   "native bf16 dot products, else float32)")
    p.add_argument("--max-nodes", type=int, default=64, help="REST trie nodes ranked per step")
    p.add_argument("--min-prob", type=float, default=0.0,
                   help="REST: end the proposed chain before a node whose estimated acceptance is below this "
                        "(default 0: the best path up to --num-speculative-tokens)")
    p.add_argument("--team-python", default=None, help=f"the team venv's python (default ${PYTHON_ENV} or "
                                                        "<cache>/team-venv/bin/python: scripts/team_venv.sh)")
    p.add_argument("--dry-run", action="store_true", help="prepare everything, print the command, start nothing")
    return p


def main(argv: list[str]) -> int:
    extra: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, extra = argv[:i], argv[i + 1:]
    p = parser()
    args = p.parse_args(argv)
    say = lambda m: print(f"rest-lsp team-server: {m}", file=sys.stderr, flush=True)  # noqa: E731
    key = None if args.no_auth else read_key(args)
    if args.no_auth:
        if not is_loopback(args.host):
            p.error(f"--no-auth is allowed only on a loopback address, not {args.host!r}")
    elif not key:
        p.error(f"no API key: put it in ${args.api_key_env} (or VLLM_API_KEY) or a file (--api-key-file); "
                "--no-auth serves without one on a loopback address")
    if not 1 <= args.num_speculative_tokens <= 64:
        p.error("--num-speculative-tokens must be 1-64")
    python = Path(args.team_python) if args.team_python else default_python()
    if not args.dry_run and not Path(python).is_file():
        p.error(f"no team venv python at {python}: run `bash scripts/team_venv.sh` (or give --team-python)")
    model, name = resolve_model(args.model)
    say(f"model {name}: {model}")
    from rest_lsp.team.config import ENV_VAR, TeamConfig

    run_dir = team_dir() / f"{args.host.replace(':', '_')}-{args.port}"
    stores = repo_stores(args.repo, model, say)
    corpus = str(Path(args.corpus).expanduser().resolve()) if args.corpus else None
    if not 0 <= args.min_prob < 1:
        p.error("--min-prob must be in [0, 1)")
    cfg = TeamConfig(tokenizer=model, repositories=stores, corpus=corpus, max_nodes=args.max_nodes,
                     min_prob=args.min_prob,
                     stats_file=str(run_dir / "proposer-stats.json"))
    if args.spec == "rest":
        _check_stores(cfg)
    cfg_path = cfg.write(run_dir / "config.json")
    cmd = vllm_command(str(python), model, name, args, extra)
    env = dict(os.environ)
    env[ENV_VAR] = str(cfg_path)
    env.pop("VLLM_API_KEY", None)
    if key:
        env["VLLM_API_KEY"] = key
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")   # GiB of KV cache: vLLM's CPU default is sized for servers
    env.setdefault("VLLM_TARGET_DEVICE", "cpu")
    # arctic-inference (for --spec suffix) registers a vLLM plugin that patches vLLM when this is 1, and on a
    # CPU refuses to start ("requires the cuda platform"); suffix decoding needs only its suffix tree
    env["ARCTIC_INFERENCE_ENABLED"] = "0"
    say(f"configuration {cfg_path} ({ENV_VAR}); REST sources: repositories {len(stores)}, corpus "
        f"{'yes' if corpus else 'no'}; key: {'required' if key else 'NONE (--no-auth)'}")
    say("command: " + " ".join(cmd))
    if args.dry_run:
        return 0
    sys.stdout.flush()
    os.execve(str(python), cmd, env)
    return 0  # not reached


def _check_stores(cfg) -> None:
    """Open the datastores here as the proposer will (vocabulary check), so a mismatch fails before vLLM
    starts rather than inside its worker."""
    from indexer.store import Datastore

    for path in cfg.repositories + ([cfg.corpus] if cfg.corpus else []):
        try:
            Datastore.open(Path(path), tokenizer=cfg.tokenizer).close()
        except Exception as exc:  # noqa: BLE001
            raise SystemExit(f"rest-lsp team-server: datastore {path}: {type(exc).__name__}: {exc}") from None
