"""`rest-lsp`: the language server, a one-shot completion, and the benchmark entry points.

    rest-lsp [--stdio]                         serve LSP over stdin/stdout (the flag vscode-languageclient adds)
    rest-lsp --tcp [--host 127.0.0.1] [--port 2087]
    rest-lsp complete PATH:LINE:COL [--workspace DIR] [--json] [--compare]   (LINE and COL count from 1)
    rest-lsp bench ... / rest-lsp replay ...   (rest_lsp.bench.cli; see docs/bench.md)
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from rest_lsp.service.config import PRECISIONS  # the settings check's list (rest_lsp.model, torch-free)

SUBCOMMANDS = ("complete", "bench", "replay")


def _add_model_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", help="model directory, .gguf file or hub id (default: the embedded "
                                   "Qwen2.5-Coder-0.5B)")
    p.add_argument("--device", default=None, help="auto | cpu | cuda[:N] | mps (default auto)")
    p.add_argument("--precision", default=None, help=f"{' | '.join(PRECISIONS)} (default auto)")
    p.add_argument("--corpus", default=None, help="a datastore built with rest-index")
    p.add_argument("--cache-dir", default=None, help="where workspace datastores go (default: user cache)")


def _settings(args: argparse.Namespace) -> dict:
    keys = ("model", "device", "precision", "corpus", "cache_dir", "max_tokens", "max_lines",
            "time_budget_ms", "draft_budget")
    out = {k: getattr(args, k) for k in keys if getattr(args, k, None) is not None}
    if getattr(args, "where", None) is not None:  # the one-shot completion waits for its whole answer
        out.update(prompt_budget_ms=0, predict_budget_ms=0, warm_up=False, predict_ahead=False)
    return out


def serve(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="rest-lsp", description="REST inline-completion language server. "
                                "Subcommands: complete, bench, replay (rest-lsp SUBCOMMAND --help).")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--stdio", action="store_true", help="serve over stdin/stdout (the default)")
    mode.add_argument("--tcp", action="store_true", help="serve over TCP")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=2087)
    p.add_argument("--log-file", default=None, help="write the server's Python log here")
    p.add_argument("--log-level", default="INFO")
    p.add_argument("--max-message-bytes", type=int, default=None,
                   help="largest LSP message accepted (default 64 MiB); larger ones are skipped, not read")
    _add_model_options(p)
    # vscode-languageclient may also pass --clientProcessId=N; accept and ignore unknown flags of that kind
    args, unknown = p.parse_known_args(argv)
    bad = [u for u in unknown if not u.startswith("--clientProcessId")]
    if bad:
        p.error(f"unrecognized arguments: {' '.join(bad)}")
    # stdout carries the protocol: the log goes to a file or stderr
    target = {"filename": args.log_file} if args.log_file else {"stream": sys.stderr}
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        **target)
    if logging.getLogger().level <= logging.INFO:
        logging.getLogger("pygls").setLevel(logging.WARNING)   # pygls logs every message at INFO
    from . import transport
    from .server import close_all, create_server
    from .service.config import ServerConfig, merge

    config, _, problems = merge(ServerConfig(), _settings(args))
    if problems:
        p.error("; ".join(problems))
    server = create_server(config)
    # our reader, not pygls' (rest_lsp/transport.py says why); the history is saved when the stream ends
    options = {"max_body": args.max_message_bytes or transport.MAX_BODY, "on_end": lambda why: close_all(server),
               "warn": transport.RateLimited(server.show_warning)}
    if args.tcp:
        return transport.serve_tcp(server, args.host, args.port, **options)
    return transport.serve_stdio(server, **options)


def complete(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="rest-lsp complete",
                                description="Print the completion the daemon would serve at PATH:LINE:COL.")
    p.add_argument("where", metavar="PATH:LINE:COL", help="LINE and COL count from 1, as editors show them")
    p.add_argument("--workspace", default=None, help="index this folder first (its files feed the drafts)")
    p.add_argument("--json", action="store_true", help="one JSON object on stdout")
    p.add_argument("--compare", action="store_true", help="also time plain decoding of the same completion")
    p.add_argument("--invoked", action="store_true", help="as an explicit request (may give alternatives)")
    p.add_argument("--max-tokens", type=int, default=None)
    p.add_argument("--max-lines", type=int, default=None)
    p.add_argument("--draft-budget", type=int, default=None)
    p.add_argument("--time-budget-ms", type=int, default=0, help="0 (default here): no time budget")
    _add_model_options(p)
    args = p.parse_args(argv)
    from .service.oneshot import OneShotError, run_complete

    try:
        path, line, col = _parse_where(args.where)
        result = run_complete(path, line, col, settings=_settings(args), workspace=args.workspace,
                              compare=args.compare, invoked=args.invoked,
                              progress=None if args.json else lambda m: print(m, file=sys.stderr, flush=True))
    except OneShotError as exc:
        print(f"rest-lsp complete: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(_human(result))
    return 0


def _parse_where(where: str) -> tuple[Path, int, int]:
    from .service.oneshot import OneShotError

    parts = where.rsplit(":", 2)
    if len(parts) != 3 or not parts[1].isdigit() or not parts[2].isdigit():
        raise OneShotError(f"expected PATH:LINE:COL (numbers from 1), got {where!r}")
    line, col = int(parts[1]), int(parts[2])
    if line < 1 or col < 1:
        raise OneShotError(f"LINE and COL count from 1, got {line}:{col}")
    return Path(parts[0]), line - 1, col - 1


def _human(r: dict) -> str:
    out = [r["completion"] if r["completion"] else "(no completion)", "--"]
    f = r["figures"]
    apt = f"{f['accepted_per_step']:.2f}" if f.get("accepted_per_step") else "-"
    out.append(f"{r['path']}:{r['line']}:{r['column']} ({r['mode']}-line) · model {r['model']} · "
               f"{f['tokens']} tokens in {f['steps']} model steps ({apt} accepted per step) · "
               f"{f['decode_ms']:.0f} ms (prefill {f['prefill_ms']:.0f} ms, retrieval {f['retrieval_ms']:.0f} ms, "
               f"forward {f['forward_ms']:.0f} ms; answered in {f['time_ms']:.0f} ms) · stop: {f['stop_reason']}")
    if r.get("workspace"):
        w = r["workspace"]
        out.append(f"workspace {w['folder']}: {w.get('state')} ({w.get('detail', '')})")
    if r.get("plain"):
        pl = r["plain"]
        out.append(f"plain decoding: {pl['time_ms']:.0f} ms, {pl['steps']} model steps, "
                   f"speedup {pl['speedup']:.2f}x, same text: {'yes' if pl['same_text'] else 'no'}")
    return "\n".join(out)


def _bench(name: str, argv: list[str]) -> int:
    from .bench import cli as bench_cli

    fn = getattr(bench_cli, f"{name}_main", None) or getattr(bench_cli, name, None)
    if fn is None:
        print(f"rest-lsp {name}: rest_lsp.bench.cli has no {name}_main", file=sys.stderr)
        return 2
    return int(fn(argv) or 0)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in SUBCOMMANDS:
        cmd, rest = argv[0], argv[1:]
        code = complete(rest) if cmd == "complete" else _bench(cmd, rest)
    else:
        code = serve(argv)
    return code


if __name__ == "__main__":
    sys.exit(main())
