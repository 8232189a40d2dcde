"""What the user's repository adds to the drafts: function bodies of held-out files of real projects from PyPI
with a strong house style, drafted with and without the repository source, in one exact offline replay.

    .venv/bin/python benchmarks/bench_repo_idioms.py --datastore corpus \
        [--projects boltons==26.2.0,toolz==1.0.0] [--functions 30] [--per-file 6] [--max-new-tokens 64] \
        [--budgets 4,8,16,64] [--cost FILE|flat|cpu] [--policy NAME=SPEC ...] [--document context|both]
        [--json OUT]

For each project (downloaded once into the user cache, benchmarks/realcode.py; neither is installed here, so
the site-packages corpus does not hold them), files are held out in a seeded order and up to --per-file of
their function bodies (2-12 lines) taken, until --functions. Each body is replaced by one line holding
its indentation, the cursor at its end (a new line after `def ...:` as an editor leaves it); the request is
what the daemon makes there (rest_lsp/service: the `auto` layout with its token-healing lead, the CPU prompt
windows of 3,000 / 300 characters, a multi-line completion's stop rules: 8 lines, the suffix's next line, the
end of the cursor's block). The model's greedy infill is recorded once through the engine with no drafts
(cached in `<cache>/replay/`, about 15 s per body with the embedded model on 2 cores), then every policy is
replayed over the same records (rest_lsp/bench/replay.py), with the daemon's stop rules, the records of a
project in order through one drafter, as requests through one daemon.

What each prompt's daemon holds, as rest_lsp/service/workspace.py arranges it:
- the repository source: a datastore of the project's other files (the held-out file excluded), built per
  held-out file in the model's tokenizer; the document being edited (the file without the body) is an open
  buffer in that datastore's live shard;
- without the repository, that open buffer goes to the context source instead and the repository source
  searches an empty workspace set (a daemon whose folder is not indexed: the same `rest` policy, the
  repository's share left unclaimed);
- the corpus (--datastore), the history (the model's output on the earlier bodies of the run) and recycle.

Reported per project, with and without the repository: M (tokens per model step) at each draft budget, the
full trie's ceiling (`cover`), drafting time per step (retrieval p50 / p99, the worst over the budgets), and
the accepted draft tokens per source. `--policy NAME=SPEC` adds rows of another policy (a preset or
source=share,...), with and without the repository too.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import random
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's packages, not an editable install's
sys.path.insert(0, str(Path(__file__).resolve().parent))

from realcode import fetch_project, function_bodies, python_files  # noqa: E402
from report import write_json  # noqa: E402

PROJECTS = "boltons==26.2.0,toolz==1.0.0"
# Both rows run the daemon's own policy (rest_lsp/engine/policy.py, preset `rest`): with the project's other
# files as the repository datastore, and without (an empty workspace set, as a daemon with no indexed folder
# runs: the repository source proposes nothing and its share stays unclaimed)
ROWS = ("with repository", "without repository")


@dataclass
class Body:
    """One held-out function body: the document without it, and where the cursor sits."""

    id: str
    file: str  # relative to the project's root
    document: str  # the file with the body removed: one line at the body's indentation, the cursor at its end
    line: int
    column: int


def held_out(root: Path, functions: int, per_file: int, seed: int) -> list[Body]:
    """Bodies of held-out files: files inside the project's packages (not top-level scripts such as a vendored
    versioneer.py) in a seeded order, up to per_file bodies each spread over the file, until `functions`."""
    files = [p for p in python_files(root) if len(p.relative_to(root).parts) >= 2]
    random.Random(seed).shuffle(files)
    out: list[Body] = []
    for path in files:
        text = path.read_text(encoding="utf-8")
        bodies = function_bodies(text)
        if not bodies:
            continue
        take = min(per_file, len(bodies), functions - len(out))
        lines = text.split("\n")
        rel = path.relative_to(root).as_posix()
        for i in range(take):
            first, last, indent = bodies[i * len(bodies) // take]
            # as an editor leaves a new line after `def ...:` (and its docstring): indented, nothing typed yet
            doc = "\n".join(lines[:first] + [" " * indent] + lines[last + 1:])
            out.append(Body(f"{rel}:{first + 1}", rel, doc, first, indent))
        if len(out) >= functions:
            break
    return out


@dataclass
class Request:
    """What the daemon sends the engine for a body: the prompt's text parts and the generation config."""

    id: str
    prefix: str
    suffix: str
    middle: str  # the cursor line before the cursor, less `lead` (the `line` layout)
    lead: str  # text the output must start with (token healing)
    gen: object  # rest_lsp.engine.generate.GenerationConfig


def daemon_request(body: Body, max_tokens: int) -> Request:
    """The daemon's request at the cursor (rest_lsp/service/backend.py `start`): its default layout and CPU
    prompt windows, and the stop rules of a multi-line completion (max lines, the suffix's next line, the end
    of the cursor's block)."""
    from functools import partial

    from rest_lsp.engine.generate import GenerationConfig
    from rest_lsp.service.config import ServerConfig, prompt_windows
    from rest_lsp.service.layout import prompt_parts, resolve_layout
    from rest_lsp.service.prompt import block_end_cut, build_context

    config = ServerConfig()
    ctx = build_context(body.document, body.line, body.column)
    parts = prompt_parts(ctx, resolve_layout(config.layout), *prompt_windows(config, "cpu"))
    assert ctx.multiline and not ctx.infill_in_line() and parts.order == "psm", parts
    gen = GenerationConfig(max_new_tokens=max_tokens, max_lines=config.max_lines, stop_text=ctx.stop_text(),
                           stop_fn=partial(block_end_cut, block_indent=ctx.ahead_indent()), forced_text=parts.lead)
    return Request(body.id, parts.prefix, parts.suffix, parts.middle, parts.lead, gen)


class _Tap:
    """A verifier that keeps the model's top-k after the last row of every forward (the replay's recycle input)."""

    def __init__(self, verifier, k: int = 8):
        self.verifier, self.k, self.rows = verifier, k, []

    def forward(self, *a, **kw):
        logits = self.verifier.forward(*a, **kw)
        self.rows.append(logits[-1].topk(self.k).indices.tolist())
        return logits

    def __getattr__(self, name):
        return getattr(self.verifier, name)


def record_request(loaded, req: Request, lookahead: int):
    """Plain greedy decoding of the request through the engine (draft budget 0: one token per forward, the
    forced lead spelled as the daemon spells it), `lookahead` tokens past the limit and without stop rules,
    as the replay needs (rest_lsp/bench/replay.py `Record`)."""
    from dataclasses import replace

    from rest_lsp.bench.replay import Record
    from rest_lsp.engine import Engine
    from rest_lsp.engine.verifier import HFVerifier

    prompt = loaded.build_prompt(req.prefix, req.suffix, middle=req.middle, max_new_tokens=req.gen.max_new_tokens)
    tap = _Tap(HFVerifier(loaded.model, loaded.device))
    engine = Engine(loaded, (), verifier=tap, eos_token_ids=loaded.stop_ids)
    cfg = replace(req.gen, max_new_tokens=req.gen.max_new_tokens + lookahead, max_lines=None, stop_text=None,
                  stop_fn=None, draft_budget=0)
    res = engine.generate(prompt, cfg)
    out = list(res.tokens)
    # decoding forwards: one per output token after the first, and one more that produced the end token
    end = res.stop_reason == "eos"
    topk = tap.rows[len(tap.rows) - (len(out) - 1 + end):]
    end_token = topk[-1][0] if end else None
    return Record(req.id, prompt, out, topk[: len(out) - 1], "eos" if end and len(out) < req.gen.max_new_tokens else "max_tokens",
                  req.gen.max_new_tokens, end_token)


def records_for(project: str, bodies: list[Body], args, log):
    """The recorded greedy infills of these bodies (recorded once, then read from the cache)."""
    from indexer.embedded import cache_root

    from rest_lsp.bench.replay import LOOKAHEAD, read_records, write_records

    reqs = [daemon_request(b, args.max_new_tokens) for b in bodies]
    key = hashlib.sha256(json.dumps([args.model or "embedded", args.precision, args.max_new_tokens, LOOKAHEAD] +
                                    [[r.id, r.prefix, r.suffix, r.middle, r.lead] for r in reqs]).encode())
    path = cache_root() / "replay" / f"idioms-{project.replace('==', '-')}-{key.hexdigest()[:16]}.jsonl"
    if not path.is_file():
        from rest_lsp.model.host import load_model

        if args.loaded is None:
            t = time.perf_counter()
            args.loaded = load_model(args.model, device="cpu", precision=args.precision)
            log(f"model {args.loaded.name} ({args.loaded.precision}) loaded in {time.perf_counter() - t:.1f} s")
        lm, records = args.loaded, []
        for i, req in enumerate(reqs):
            t = time.perf_counter()
            records.append(record_request(lm, req, LOOKAHEAD))
            log(f"recorded [{i + 1}/{len(reqs)}] {req.id}: {len(records[-1].output_ids)} tokens, "
                f"{time.perf_counter() - t:.1f} s")
        header = {"kind": "rest-lsp-replay", "version": 1, "model": lm.name, "precision": lm.precision,
                  "device": str(lm.device), "prompts": f"{project} held-out bodies", "n_prompts": len(reqs),
                  "max_new_tokens": args.max_new_tokens, "topk": 8, "cost_ms": None,
                  "tokenizer": lm.tokenizer_source}
        write_records(path, header, records)
    header, records = read_records(path)
    if [r.id for r in records] != [b.id for b in bodies]:
        raise SystemExit(f"{path} holds other prompts; delete it to record again")
    return header, records, reqs


class Workspace:
    """The repository datastore the daemon would search for each record: the project's other files, with the
    edited document as an open buffer. One store per held-out file, built on first use."""

    def __init__(self, root: Path, bodies: list[Body], tokenizer: str, tmp: Path):
        self.root, self.tmp, self.tokenizer = root, tmp, tokenizer
        self.by_id = {b.id: b for b in bodies}
        self.stores: dict = {}
        self.current = None

    def store(self, rel: str):
        from indexer.discover import Filters
        from indexer.store import Datastore

        if rel not in self.stores:
            out = self.tmp / f"repo-{len(self.stores)}"
            self.stores[rel] = Datastore.build([self.root], out, tokenizer=self.tokenizer,
                                               filters=Filters(exclude_paths=(rel,)))
        return self.stores[rel]

    def search_rows(self, context, **kw):
        """What the drafter's DatastoreSource asks: the current record's store answers."""
        if self.current is None:  # no indexed folder: the daemon's empty DatastoreSet
            from indexer.types import SearchRows

            return SearchRows.empty(max_len=kw.get("max_len", 10))
        return self.current.search_rows(context, **kw)

    def prepare(self, rec, drafter, indexed: bool = True, document: str = "repository") -> None:
        """Before a record: its file's store, and the document as the open buffer of the source that would
        hold it (rest_lsp/service/workspace.py: the repository's live shard when the folder is indexed, the
        context source's buffers when it is not). `document` (indexed only): where the open buffer goes,
        `repository` (the daemon), `context` or `both` (alternatives measured with --document)."""
        body = self.by_id[rec.id]
        self.current = self.store(body.file) if indexed else None
        tok = self.store(body.file).tokenizer
        ids = tok.encode(body.document, add_special_tokens=False).ids
        names = {s.name: s for s, _ in drafter.sources}
        context = names.get("context")
        if context is not None:
            context.buffers = {}
        for ds in self.stores.values():
            for name in ds.live_names():
                ds.drop_live(name)
        in_repository = indexed and "repository" in names and document in ("repository", "both")
        if in_repository:
            self.current.set_live("edited", ids)
        if context is not None and (not in_repository or document == "both"):
            context.set_buffer("edited", ids)


def run(args, log) -> dict:
    from indexer.store import Datastore
    from indexer.tokenizer import load_tokenizer

    from rest_lsp.bench.cli import recorded_tokenizer
    from rest_lsp.bench.replay import cost_model, evaluate, stop_rules

    policies = {"rest": "rest"}
    for extra in args.policy or []:
        name, _, spec = extra.partition("=")
        policies[name.strip()] = spec.strip()
    budgets = [None if b.strip() == "auto" else int(b) for b in args.budgets.split(",") if b.strip()]
    args.loaded = None
    import datetime
    import platform

    cpu = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                if ln.startswith("model name")), platform.processor()) if Path("/proc/cpuinfo").is_file() else \
        platform.processor()
    report = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "cpu": cpu,
              "cores": __import__("os").cpu_count(), "projects": {}, "policies": policies,
              "max_new_tokens": args.max_new_tokens,
              "datastore": args.datastore, "command": "bench_repo_idioms.py " + " ".join(sys.argv[1:])}
    with tempfile.TemporaryDirectory(prefix="rest-idioms.") as tmp:
        for project in args.projects.split(","):
            root = fetch_project(project)
            bodies = held_out(root, args.functions, args.per_file, args.seed)
            header, records, reqs = records_for(project, bodies, args, log)
            tok = recorded_tokenizer(header)
            decoder = load_tokenizer(tok)
            for rec, req in zip(records, reqs):
                rec.stop = stop_rules(req.gen, decoder)
            corpus = Datastore.open(Path(args.datastore).expanduser(), tokenizer=tok, verify=False) \
                if args.datastore else None
            cost = cost_model(args.cost, header)
            ws = Workspace(root, bodies, tok, Path(tmp) / project.replace("==", "-"))
            # untimed: builds the repository stores and reads the corpus's pages in, as a daemon that has
            # served a while holds them (the first pass's drafting p99 is 10-20 ms of page faults)
            evaluate(records, "rest", budgets[0], cost, corpus=corpus, repository=ws, prepare=ws.prepare)
            results = []
            rows = [(row, row == "with repository", "repository") for row in ROWS] + \
                [(f"with repository, document in {d}", True, d) for d in args.document or []]
            for pname, spec in policies.items():
                for row, indexed, doc in rows:
                    name = row if pname == "rest" else f"{pname}, {row}"
                    for b in budgets:
                        r = evaluate(records, spec, b, cost, corpus=corpus, repository=ws,
                                     prepare=lambda rec, d, i=indexed, doc=doc: ws.prepare(rec, d, i, doc))
                        r["name"] = name
                        r.pop("per_prompt", None)
                        results.append(r)
                        log(f"{project} {name} budget {r['budget']}: M {r['mean_accepted']:.3f}, retrieval "
                            f"p50 {r['retrieval_ms_p50']:.2f} p99 {r['retrieval_ms_p99']:.2f} ms")
            files = sorted({b.file for b in bodies})
            report["projects"][project] = {
                "held_out_files": files, "functions": len(bodies),
                "output_tokens": sum(r.stop(r.output_ids) or len(r.greedy) for r in records), "results": results}
    return report


def format_table(report: dict) -> str:
    lines = []
    for project, p in report["projects"].items():
        budgets = [r["budget"] for r in p["results"] if r["name"] == p["results"][0]["name"]]
        lines.append(f"{project}: {p['functions']} bodies of {len(p['held_out_files'])} held-out files, "
                     f"{p['output_tokens']} tokens")
        head = f"  {'policy':<44}" + "".join(f" {'M@' + str(b):>7}" for b in budgets) + \
            f" {'cover@' + str(budgets[-1]):>9} {'ret p50/p99 ms':>15}  accepted draft tokens by source (at {budgets[-1]})"
        lines.append(head)
        for name in dict.fromkeys(r["name"] for r in p["results"]):
            rows = [r for r in p["results"] if r["name"] == name]
            last = rows[-1]
            srcs = ", ".join(f"{k} {v}" for k, v in sorted(last["accepted_tokens_by_source"].items(),
                                                            key=lambda kv: -kv[1]))
            p50 = max(r["retrieval_ms_p50"] for r in rows)
            p99 = max(r["retrieval_ms_p99"] for r in rows)
            lines.append(f"  {name[:44]:<44}" + "".join(f" {r['mean_accepted']:7.3f}" for r in rows) +
                         f" {last['covered_mean_accepted']:9.3f} {f'{p50:.2f} / {p99:.2f}':>15}  {srcs}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--projects", default=PROJECTS, help="comma-separated PyPI sdists (name==version)")
    p.add_argument("--datastore", default=None, help="the corpus datastore (rest-index build --corpus-from-env)")
    p.add_argument("--functions", type=int, default=30, help="held-out function bodies per project")
    p.add_argument("--per-file", type=int, default=6, help="at most this many bodies per held-out file")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-new-tokens", type=int, default=64, help="per body (the daemon's maxTokens default)")
    p.add_argument("--budgets", default="4,8,16,64", help="draft nodes per step; auto: chosen from --cost")
    p.add_argument("--cost", default="cpu", help="c(q) for auto budgets (as rest-lsp replay --cost)")
    p.add_argument("--policy", action="append", default=None,
                   help="an extra policy NAME=SPEC (a preset or source=share,...), repeatable")
    p.add_argument("--document", action="append", default=None, choices=("context", "both"),
                   help="also a row with the open document in the context source's buffers instead of (context) "
                        "or as well as (both) the repository's live shard, repeatable")
    p.add_argument("--model", default=None)
    p.add_argument("--precision", default="fp32")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    report = run(args, log)
    print(format_table(report))
    if args.json:
        write_json(args.json, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
