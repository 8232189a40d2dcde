"""Command lines of `rest-lsp bench` (`bench_main`) and `rest-lsp replay` (`replay_main`)."""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from indexer.types import IndexerError
from rest_lsp.engine.history import HistoryError, HistoryFile, history_model_key, load_history, save_history
from rest_lsp.model import PRECISIONS
from rest_lsp.model.verifiers import KINDS as VERIFIER_KINDS
from restbase.storage import write_bytes_atomic

from .methods import METHODS


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, help="model dir, .gguf file or hub id (default: the embedded model)")
    p.add_argument("--device", default="auto")
    p.add_argument("--precision", default="auto", choices=PRECISIONS)
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")


def _data_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--prompts", required=True, help="humaneval, or a JSONL file of {\"prompt\", \"suffix\"?}")
    p.add_argument("--limit", type=int, default=None, help="the first N prompts (after --offset)")
    p.add_argument("--offset", type=int, default=0, help="skip the first N prompts")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--datastore", default=None, help="corpus datastore directory (rest-index build)")
    p.add_argument("--repo", default=None, help="a repository directory, indexed into a temporary datastore")


def _load(args):
    import torch

    from rest_lsp.model.host import load_model

    if args.threads:
        torch.set_num_threads(args.threads)
    t = time.perf_counter()
    lm = load_model(args.model, device=args.device, precision=args.precision)
    _log(f"model {lm.name} ({lm.precision}, {lm.device}) loaded in {time.perf_counter() - t:.1f} s")
    return lm


def recorded_tokenizer(header: dict) -> str:
    """The tokenizer a replay record was made with (records before it was kept: the embedded model's)."""
    from rest_lsp.model.host import EMBEDDED_NAME

    tok = header.get("tokenizer")
    if tok:
        return tok
    if header.get("model") == EMBEDDED_NAME:
        return "embedded"
    raise ValueError(f"the record names no tokenizer for model {header.get('model')!r}; record it again "
                     "(--rerecord) to use --datastore or --repo with it")


def _datastores(args, tok, tmp: Path):
    """(corpus, repository): the --datastore corpus and the --repo index, the datastores of the policy's
    `corpus` and `repository` sources (as the daemon has the corpus and the workspace apart), both in the
    model's tokenizer `tok` (the loaded model's own, or the name a replay record keeps)."""
    from indexer.store import Datastore

    corpus = repo = None
    if args.datastore:
        corpus = Datastore.open(Path(args.datastore).expanduser(), tokenizer=tok, verify=False)
        corpus.prefault()  # as the daemon does: no page faults in the first prompts' drafting times
    if args.repo:
        t = time.perf_counter()
        repo = Datastore.build([Path(args.repo).expanduser()], tmp / "repo-index", tokenizer=tok)
        _log(f"indexed --repo {args.repo} in {time.perf_counter() - t:.1f} s")
    return corpus, repo


def _write_json(path: str, obj) -> None:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    write_bytes_atomic(p, json.dumps(obj, indent=1).encode())


def _history(path: str | None, lm):
    """A HistorySource, warmed from a saved history when `path` is given."""
    from rest_lsp.engine.sources import HistorySource

    history = HistorySource()
    if path:
        n = HistoryFile(Path(path).expanduser(), history_model_key(lm), history).load()
        _log(f"history: {n} tokens of earlier output from {path}")
    return history


# ---------------------------------------------------------------------------------------- bench
def bench_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="rest-lsp bench",
                                description="ar, pld, pld-hf, rest-paper, rest (and rest-history) on the same "
                                            "model, one JSON report")
    _data_args(p)
    p.add_argument("--methods", default=None,
                   help=f"comma-separated, from {','.join(METHODS)} (default: all; rest-paper only with --datastore, "
                        "rest-history only with --history)")
    p.add_argument("--rest-policy", default="rest", help="the rest method's draft sources (see docs/bench.md)")
    p.add_argument("--draft-budget", type=int, default=None,
                   help="rest: draft nodes per step (default: calibrated per step from c(q))")
    p.add_argument("--verifier", default="auto", choices=list(VERIFIER_KINDS),
                   help="the verifier ar, pld, rest-paper and rest share (default auto: the fast one where it supports "
                        "the model, else eager, as the daemon); pld-hf always runs transformers' generate")
    p.add_argument("--history", default=None,
                   help="rest-history: start with this saved history of the model's earlier output (--save-history "
                        "of an earlier run, or the daemon's), as a daemon that ran before does")
    p.add_argument("--save-history", default=None,
                   help="save rest's history (the model's output in this run) here; rest-history's without rest")
    p.add_argument("--no-warmup", action="store_true")
    p.add_argument("--json", default=None, help="write the report here")
    p.add_argument("--plot", default=None, help="write a PNG of tokens/s and mean accepted tokens per method")
    _model_args(p)
    return p


def bench_main(argv: list[str] | None = None) -> int:
    args = bench_parser().parse_args(argv)
    from .harness import format_table, plot, run_bench
    from rest_lsp.engine.policy import PolicyError, parse_policy
    from .prompts import PromptsError, load_prompts

    if args.methods is None:
        methods = [m for m in METHODS if (m != "rest-paper" or args.datastore) and (m != "rest-history" or args.history)]
        if not args.datastore:
            _log("rest-lsp bench: no --datastore, so no rest-paper (and rest without the corpus)")
    else:
        methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    try:
        bad = [m for m in methods if m not in METHODS]
        if bad or not methods:
            raise PolicyError(f"unknown method(s) {', '.join(bad) or '(none)'}; one of {', '.join(METHODS)}")
        if "rest-paper" in methods and not args.datastore:
            raise PolicyError("method rest-paper needs a corpus datastore (--datastore DIR)")
        if "rest-history" in methods and not args.history:
            raise PolicyError("method rest-history needs a saved history (--history FILE)")
        parse_policy(args.rest_policy)
        prompts = load_prompts(args.prompts, args.limit, args.offset)
    except (PolicyError, PromptsError) as e:
        _log(f"rest-lsp bench: {e}")
        return 2
    lm = _load(args)
    try:
        histories = {"rest": _history(None, lm), "rest-history": _history(args.history, lm)}
    except HistoryError as e:
        _log(f"rest-lsp bench: --history: {e}")
        return 2
    with tempfile.TemporaryDirectory(prefix="rest-lsp-bench.") as tmp:
        try:
            corpus, repo = _datastores(args, lm.indexer_tokenizer, Path(tmp))
        except IndexerError as e:
            _log(f"rest-lsp bench: {e}")
            return 2
        report = run_bench(lm, prompts, methods, max_new_tokens=args.max_new_tokens, corpus=corpus,
                           repository=repo, rest_policy=args.rest_policy, rest_budget=args.draft_budget,
                           histories=histories, verifier=args.verifier, warmup=not args.no_warmup, log=_log)
    if args.save_history:
        kept = histories["rest" if "rest" in methods else "rest-history"].tokens()
        save_history(Path(args.save_history).expanduser(), kept, history_model_key(lm))
        _log(f"saved the history ({int((kept >= 0).sum())} tokens) to {args.save_history}")
    report["history"] = args.history
    report["prompts"] = args.prompts
    report["offset"] = args.offset
    report["datastore"] = args.datastore
    report["repo"] = args.repo
    report["command"] = "rest-lsp bench " + " ".join(argv if argv is not None else sys.argv[1:])
    print(format_table(report))
    if args.json:
        _write_json(args.json, report)
        _log(f"wrote {args.json}")
    if args.plot:
        plot(report, args.plot)
        _log(f"wrote {args.plot}")
    return 0


# ---------------------------------------------------------------------------------------- replay
def replay_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="rest-lsp replay",
        description="Record greedy outputs once, then evaluate draft policies offline (exact M, tree sizes, "
                    "projected speedup from c(q), accepted-length histogram, sources)")
    _data_args(p)
    p.add_argument("--record", default=None,
                   help="the greedy-output cache (JSONL); reused when it exists, recorded otherwise "
                        "(default: one per model/prompts/limit/tokens in the user cache)")
    p.add_argument("--rerecord", action="store_true", help="record again even if the cache exists")
    p.add_argument("--measure-cost", action="store_true",
                   help="measure c(q) with the model while recording (without it, the engine's cached "
                        "calibration is stored when there is one)")
    p.add_argument("--policy", action="append", default=None,
                   help="draft policy, repeatable: a preset (rest, paper, pld) or source=share,... "
                        "(sources: context, history, repository, corpus, recycle, paper, lookup); default: rest")
    p.add_argument("--history", default=None,
                   help="start the history source with this saved history (rest-lsp bench --save-history)")
    p.add_argument("--budgets", default="4,8,16,64,auto", help="draft nodes per step, comma-separated; auto = "
                   "chosen per step from c(q) as the engine does")
    p.add_argument("--cost", default=None,
                   help="c(q) table: cpu, flat, record, or a JSON file (a bench report's cost_ms works)")
    p.add_argument("--draft-len", type=int, default=10)
    p.add_argument("--acceptance-lr", type=float, default=None,
                   help="how fast the node ranking learns online (default: the engine's; 0: rank by trie mass)")
    p.add_argument("--json", default=None)
    _model_args(p)
    return p


def replay_main(argv: list[str] | None = None) -> int:
    args = replay_parser().parse_args(argv)
    from restbase.storage import cache_root

    from rest_lsp.engine.policy import PolicyError, parse_policy

    from .prompts import PromptsError, load_prompts
    from .replay import cost_model, evaluate, format_table, read_records, record_key, record_prompts

    policies = args.policy or ["rest"]
    try:
        for pol in policies:
            parse_policy(pol)
        if args.acceptance_lr is not None and not args.acceptance_lr >= 0:
            raise ValueError(f"--acceptance-lr must be >= 0, got {args.acceptance_lr}")
        budgets = []
        for b in args.budgets.split(","):
            b = b.strip()
            if b:
                budgets.append(None if b == "auto" else int(b))
    except (PolicyError, ValueError) as e:
        _log(f"rest-lsp replay: {e}")
        return 2
    lm = None
    if args.record:
        rec_path = Path(args.record).expanduser()
    else:  # keyed by what was asked for, so a cached record is found without loading the model
        model_id = str(Path(args.model).expanduser().resolve()) if args.model and Path(args.model).expanduser().exists() \
            else (args.model or "embedded")
        spec = args.prompts + (f"@{args.offset}" if args.offset else "")
        key = record_key(model_id, f"{args.precision}-{args.device}", spec, args.limit, args.max_new_tokens)
        rec_path = cache_root() / "replay" / f"{key}.jsonl"
    if args.rerecord or not rec_path.is_file():
        try:
            prompts = load_prompts(args.prompts, args.limit, args.offset)
        except PromptsError as e:
            _log(f"rest-lsp replay: {e}")
            return 2
        lm = _load(args)
        cost = _engine_cost(lm, measure=args.measure_cost)
        record_prompts(lm, prompts, args.max_new_tokens, rec_path, prompts_spec=args.prompts, cost=cost,
                       tokenizer=lm.tokenizer_source, log=_log)
        _log(f"recorded greedy outputs into {rec_path}")
    header, records = read_records(rec_path)
    if args.limit is not None:
        records = records[: args.limit]
    _log(f"replaying {len(records)} recorded prompts from {rec_path} ({header.get('model')}, "
         f"{header.get('max_new_tokens')} new tokens)")
    try:
        cost = cost_model(args.cost, header)
        history = load_history(Path(args.history).expanduser(), str(header.get("model"))) if args.history else None
    except (ValueError, OSError) as e:  # HistoryError is a ValueError
        _log(f"rest-lsp replay: {e}")
        return 2
    with tempfile.TemporaryDirectory(prefix="rest-lsp-replay.") as tmp:
        try:
            if args.datastore or args.repo:
                tok = lm.indexer_tokenizer if lm is not None else recorded_tokenizer(header)
                corpus, repo = _datastores(args, tok, Path(tmp))
            else:
                corpus = repo = None
        except (IndexerError, ValueError) as e:
            _log(f"rest-lsp replay: {e}")
            return 2
        results = []
        for pol in policies:
            for b in budgets:
                try:
                    results.append(evaluate(records, pol, b, cost, corpus=corpus, repository=repo,
                                            history=history, draft_len=args.draft_len,
                                            acceptance_lr=args.acceptance_lr))
                except PolicyError as e:
                    _log(f"rest-lsp replay: {e}")
                    return 2
    print(format_table(results))
    if args.json:
        _write_json(args.json, {"record": str(rec_path), "model": header.get("model"), "history": args.history,
                                "n_prompts": len(records), "max_new_tokens": header.get("max_new_tokens"),
                                "cost_ms": {"qs": list(cost.qs), "ms": list(cost.ms)}, "results": results})
        _log(f"wrote {args.json}")
    return 0


def _engine_cost(lm, *, measure: bool) -> dict | None:
    """c(q) for this model: the engine's calibration cache (measured now when `measure`), else None."""
    from rest_lsp.engine.cost import cache_dir, cost_key, load_or_measure
    from rest_lsp.engine.verifier import HFVerifier

    verifier = HFVerifier(lm.model, lm.device)
    key = cost_key(lm.name, lm.precision, str(lm.device), verifier)
    if not measure and not (cache_dir() / f"{key}.json").is_file():
        return None
    c = load_or_measure(verifier, lm.model.config.vocab_size, key)
    return {"qs": list(c.qs), "ms": list(c.ms)}


def main(argv: list[str] | None = None) -> int:
    """`python -m rest_lsp.bench.cli bench|replay ...`"""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in ("bench", "replay"):
        _log("usage: python -m rest_lsp.bench.cli bench|replay ...")
        return 2
    return (bench_main if argv[0] == "bench" else replay_main)(argv[1:])


if __name__ == "__main__":
    sys.exit(main())
