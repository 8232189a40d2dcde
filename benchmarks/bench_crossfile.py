"""Cross-file context measured on what a person would see: the suggestion the daemon's prompt gives with no
other file, with each selector alone, and with all of them (rest_lsp/service/crossfile.py), on real code that
is in no corpus.

    .venv/bin/python benchmarks/bench_crossfile.py [--projects humanize==4.17.0,marshmallow==4.4.0,boltons==26.2.0]
        [--bodies 8] [--files 4] [--configs none,definitions,similar,recent,all] [--tokens 512] [--cross-only] [--count-only]
        [--model PATH] [--json OUT]
    .venv/bin/python benchmarks/bench_crossfile.py --projects sqlglot==30.30.0 --whole-file sqlglot/dialects/drill.py
        [--whole-file PATH ...] [--configs none,all]

Per project (benchmarks/realcode.py), bodies of some files are removed as `bench_typing.py` removes them (the
workspace is the project with those bodies gone: what is on disk while a person writes them), and the workspace
is indexed as the daemon indexes it. Cases, per body: the first body line with nothing typed (a multi-line
suggestion: is the whole body right?), and every line of it with the lines above typed (the cursor after the
line's indentation: is the line right?). Every configuration completes every case through the daemon's own
path (EngineBackend: the line layout with the body as the prompt's middle, greedy, drafts on); the recent-files
ring holds the places of the cases before it in other files, as a person moving between files would leave it.
Reported per configuration: first-line exact (also on the `cross` lines alone: a line that uses a name another
file of the workspace defines and its own file does not, CrossCodeEval's kind of line), whole-body exact,
characters of the line right, the block's tokens, accepted tokens per step by draft source, and the
distribution of accepted runs.

`--whole-file PATH` (one project): the issue's new module among its siblings, as `bench_typing.py --whole-file`
types it. The file is in the workspace but empty (just created); cases are its lines, each with the lines above
typed and nothing below (the cursor after the line's indentation), while the document fits the prompt's prefix
window: where `crossFile: "auto"` (the default) gives a document a block, so every configuration's line past it
would be the same prompt.
"""
from __future__ import annotations

import argparse
import builtins
import keyword
import random
import re
import sys
import tempfile
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's packages, not an editable install's
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_typing import prepare, prepare_whole  # noqa: E402
from realcode import fetch_project  # noqa: E402
from report import write_json  # noqa: E402

PROJECTS = "humanize==4.17.0,marshmallow==4.4.0,boltons==26.2.0"
CONFIGS = {"none": (), "definitions": ("definitions",), "similar": ("similar",), "recent": ("recent",),
           "siblings": ("siblings",), "all": ("definitions", "similar", "recent", "siblings")}


def cases_of(files, bodies_per_project: int, seed: int) -> list[dict]:
    """Per body: the body case and its line cases, bodies in a shuffled order across files. A file's bodies are
    typed top-down (as in bench_typing.py): the bodies above one are there, the ones below it still removed."""
    bodies = []
    for path, opened, bs in files:
        lines = opened.split("\n")
        for body in bs:  # in file order: `body.line` is its line once the bodies above are typed
            body_lines = (" " * body.indent + body.text).split("\n")
            bodies.append((path, list(lines), body, body_lines))
            lines[body.line:body.line + 1] = body_lines
    random.Random(seed).shuffle(bodies)
    out = []
    for path, lines, body, body_lines in bodies[:bodies_per_project]:
        for i in range(len(body_lines)):
            typed = lines[:body.line] + body_lines[:i]
            cur = body_lines[i]
            indent = len(cur) - len(cur.lstrip())
            if not cur.strip():
                continue
            doc = "\n".join(typed + [cur[:indent]] + lines[body.line + 1:])
            case = {"file": path, "line": body.line + i, "col": indent, "doc": doc, "target": cur[indent:].rstrip(),
                    "body_start": len("\n".join(lines[:body.line])) + 1 if body.line else 0, "kind": "line"}
            out.append(case)
            if i == 0:
                out.append({**case, "kind": "body", "target": "\n".join(ln.rstrip() for ln in body_lines)[indent:]
                            .rstrip()})
    return out


def config_of(name: str, tokens: int) -> tuple[tuple[str, ...], int]:
    """A configuration's selectors and block budget: `all`, or `all@1024` for another budget than --tokens."""
    base, _, budget = name.partition("@")
    if base not in CONFIGS or (budget and not budget.isdigit()):
        raise ValueError(f"unknown configuration {name!r}; one of {', '.join(CONFIGS)}, optionally @TOKENS")
    return CONFIGS[base], int(budget) if budget else tokens


def whole_file_cases(files, fits: Callable[[int], bool], seed: int = 0) -> list[dict]:
    """A new module's line cases (`prepare_whole`'s files, each one body from an empty document): every line
    with the lines above typed and nothing below, while `fits(characters of the document)`; no whole-file case."""
    return [c for c in cases_of(files, len(files), seed) if c["kind"] == "line" and fits(len(c["doc"]))]


def project_cases(args, root: Path, work: Path, device: str = "cpu") -> tuple[Path, list, list[dict]]:
    """The workspace, the typed files and their cases: bodies removed from files (`prepare`), or with
    --whole-file new modules' lines while the document fits `device`'s prefix window (`whole_file_cases`)."""
    from rest_lsp.service.config import ServerConfig, cross_file_on

    if args.whole_file:
        ws, files = prepare_whole(root, args.whole_file, work)
        cfg = ServerConfig()
        return ws, files, whole_file_cases(files, lambda chars: cross_file_on(cfg, device, chars), args.seed)
    ws, files = prepare(root, args.files, args.bodies, args.seed, work)
    return ws, files, cases_of(files, args.bodies, args.seed)


def run(args, log) -> dict:
    from indexer.store import Datastore
    from rest_lsp.service.backend import load_backend
    from rest_lsp.service.blocks import text_codec
    from rest_lsp.service.config import ServerConfig
    from rest_lsp.service.crossfile import Cursor, RecentRing, RepoView, select
    from rest_lsp.service.prompt import build_context, shape_completion

    cfg = ServerConfig(model=args.model, precision=args.precision, persist_history=False,
                       index_workspace=False, max_tokens=args.max_tokens)
    t0 = time.perf_counter()
    backend = load_backend(cfg)
    encode, decode = text_codec(backend)
    log(f"model {backend.name} ({backend.loaded.precision}, {backend.verifier_kind}) loaded in "
        f"{time.perf_counter() - t0:.1f} s")
    configs = args.configs.split(",")
    rows: dict[str, list] = {c: [] for c in configs}
    report: dict = {"command": " ".join(sys.argv), "model": backend.name, "precision": backend.loaded.precision,
                    "tokens": args.tokens, "projects": {}}
    for spec in args.projects.split(","):
        root = fetch_project(spec)
        with tempfile.TemporaryDirectory() as tmp:
            ws, files, todo = project_cases(args, root, Path(tmp), getattr(backend, "prompt_device", "cpu"))
            store = Datastore.build([ws], Path(tmp) / "ds", tokenizer=backend.tokenizer_spec())
            view = RepoView(ws, store, encode, decode)
            mark_cross(todo, ws)
            if args.cross_only:
                todo = [c for c in todo if c["kind"] == "line" and c["cross"]]
            report["projects"][spec] = {"cases": len(todo), "files": [str(p.relative_to(ws)) for p, _, _ in files]}
            log(f"{spec}: {len(todo)} cases, {len(store.documents)} files indexed")
            for conf in configs:
                selectors, budget = config_of(conf, args.tokens)
                backend.history.reset([])  # each configuration drafts from its own output and snippets only
                backend.clear_snippets()
                ring = RecentRing()
                prev = None
                for k, case in enumerate(todo):
                    if prev is not None and prev["file"] != case["file"]:
                        ring.add(str(prev["file"]), prev["doc"], prev["line"])
                    prev = case
                    ctx = build_context(case["doc"], case["line"], case["col"])
                    repo, block = None, []
                    if selectors:
                        sel = select([view], Cursor(str(case["file"]), ctx.prefix, ctx.suffix.split("\n", 1)[0],
                                                    case["doc"]), budget=budget, selectors=selectors,
                                     ring=ring, encode=encode)
                        repo, block = sel.repo, sel.describe()
                    body = case["kind"] == "body"
                    c = replace(cfg, max_lines=12 if body else 1, max_tokens=args.body_tokens if body else args.max_tokens)
                    r = backend.start(f"{spec}:{conf}", ctx, c, anchor=case["body_start"], repo=repo)
                    while not r.done:
                        backend.advance(r)
                    shown = shape_completion(r.text, ctx, max_lines=c.max_lines, truncated=False)
                    f = backend.figures(r)
                    target = case["target"]
                    n = 0
                    while n < min(len(shown), len(target)) and shown[n] == target[n]:
                        n += 1
                    rows[conf].append({"project": spec, "kind": case["kind"], "cross": case["cross"],
                                       "exact": shown.rstrip() == target,
                                       "chars_right": n, "target_chars": len(target), "block_tokens":
                                       sum(b["tokens"] for b in block), "snippets": block,
                                       "prompt_tokens": f["prompt_tokens"], "steps": f["steps"],
                                       "tokens": f["tokens"], "runs": list(r.run.result.accepted),
                                       "by_source": f["accepted_sources"], "shown": shown, "target": target})
                done = [x for x in rows[conf] if x["project"] == spec]
                log(f"  {conf}: line exact {sum(x['exact'] for x in done if x['kind'] == 'line')} / "
                    f"{sum(x['kind'] == 'line' for x in done)}, body exact "
                    f"{sum(x['exact'] for x in done if x['kind'] == 'body')} / {sum(x['kind'] == 'body' for x in done)}")
    report["configs"] = {c: summary(rs) for c, rs in rows.items()}
    if args.keep_cases:
        report["cases"] = rows
    return report


def mark_cross(cases: list[dict], ws: Path, window: tuple[int, int] = (3000, 300)) -> None:
    """Flag what a case's line needs that its prompt may lack. `cross`: the line uses a name that another file
    of the workspace defines and that the case's own document never mentions (CrossCodeEval's kind of line: what
    only another file can tell the model). `unseen`: the line uses a name (not a builtin, 3+ characters) that
    the prompt's window of the document (`window`: characters before and after the cursor, the daemon's CPU
    defaults) does not hold; `unseen_repo`: one of those is defined somewhere in the workspace; `unseen_own`: one
    of those the document itself defines or imports, outside the window (what an outline of the current file
    would show)."""
    from rest_lsp.service.crossfile import defined_names, imported_all

    ident = re.compile(r"[A-Za-z_]\w*")
    # a method of a builtin type (`get`, `items`) or a builtin says nothing about the repository
    common = set(dir(builtins)) | set(keyword.kwlist) | {m for t in (str, list, dict, set, tuple, bytes, int, float)
                                                          for m in dir(t)}
    defs = {p: defined_names(p.read_text(encoding="utf-8", errors="replace")) - common for p in ws.rglob("*.py")}
    everywhere = set().union(*defs.values())
    for case in cases:
        used = set(ident.findall(case["target"])) - common
        elsewhere = set().union(*(d for p, d in defs.items() if p != case["file"]))
        case["cross"] = bool((elsewhere - set(ident.findall(case["doc"]))) & used)
        lines = case["doc"].split("\n")
        at = len("\n".join(lines[:case["line"]])) + (1 if case["line"] else 0) + case["col"]
        seen = set(ident.findall(case["doc"][max(0, at - window[0]):at + window[1]]))
        unseen = {n for n in used - seen if len(n) > 2}
        case["unseen"], case["unseen_repo"] = bool(unseen), bool(unseen & everywhere)
        case["unseen_own"] = bool(unseen & (defined_names(case["doc"]) | set(imported_all(case["doc"]))))


def count_needs(args) -> dict:
    """Per project, how many lines need what their prompt window lacks (`mark_cross`); no model is loaded."""
    out = {}
    for spec in args.projects.split(","):
        with tempfile.TemporaryDirectory() as tmp:
            ws, _, cases = project_cases(args, fetch_project(spec), Path(tmp))
            lines = [c for c in cases if c["kind"] == "line"]
            mark_cross(lines, ws)
            out[spec] = {"lines": len(lines), **{k: sum(c[k] for c in lines)
                                                 for k in ("cross", "unseen", "unseen_repo", "unseen_own")}}
    return out


def summary(rs: list[dict]) -> dict:
    lines = [x for x in rs if x["kind"] == "line"]
    cross = [x for x in lines if x["cross"]]
    bodies = [x for x in rs if x["kind"] == "body"]
    steps = sum(x["steps"] for x in rs) or 1
    by_source: Counter = Counter()
    for x in rs:
        by_source.update(x["by_source"])
    runs = Counter(min(a, 8) for x in rs for a in x["runs"])
    return {"lines": len(lines), "line_exact": round(sum(x["exact"] for x in lines) / max(1, len(lines)), 3),
            "cross_lines": len(cross),
            "cross_line_exact": round(sum(x["exact"] for x in cross) / max(1, len(cross)), 3),
            "line_chars_right": round(sum(x["chars_right"] for x in lines) / max(1, sum(x["target_chars"] for x in lines)), 3),
            "bodies": len(bodies), "body_exact": round(sum(x["exact"] for x in bodies) / max(1, len(bodies)), 3),
            "body_chars_right": round(sum(x["chars_right"] for x in bodies) / max(1, sum(x["target_chars"] for x in bodies)), 3),
            "block_tokens": round(sum(x["block_tokens"] for x in rs) / max(1, len(rs)), 1),
            "accepted_per_step": round(sum(x["tokens"] for x in rs) / steps, 3),
            "accepted_per_step_by_source": {k: round(v / steps, 3) for k, v in sorted(by_source.items())},
            "accepted_runs": {("8+" if k == 8 else str(k)): v for k, v in sorted(runs.items())}}


def table(report: dict) -> str:
    out = [f"{'config':<12} {'lines':>5} {'line exact':>10} {'cross':>11} {'chars':>6} {'bodies':>6} {'body exact':>10} "
           f"{'block tok':>9} {'acc/step':>8}  by source"]
    for c, s in report["configs"].items():
        cross = f"{s['cross_line_exact']:.3f} ({s['cross_lines']})"
        out.append(f"{c:<12} {s['lines']:>5} {s['line_exact']:>10.3f} {cross:>11} {s['line_chars_right']:>6.3f} {s['bodies']:>6} "
                   f"{s['body_exact']:>10.3f} {s['block_tokens']:>9.1f} {s['accepted_per_step']:>8.3f}  "
                   f"{s['accepted_per_step_by_source']}")
    return "\n".join(out)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--projects", default=PROJECTS)
    p.add_argument("--files", type=int, default=4, help="files per project whose bodies are removed")
    p.add_argument("--bodies", type=int, default=8, help="bodies per project")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--configs", default=",".join(CONFIGS), help="NAME or NAME@TOKENS (a block budget of its own)")
    p.add_argument("--tokens", type=int, default=512, help="the cross-file block's token budget")
    p.add_argument("--model", default=None)
    p.add_argument("--precision", default="auto")
    p.add_argument("--max-tokens", type=int, default=24)
    p.add_argument("--body-tokens", type=int, default=96)
    p.add_argument("--cross-only", action="store_true",
                   help="only the lines that use a name another file defines (take more --bodies and --files)")
    p.add_argument("--count-only", action="store_true",
                   help="count the lines that need another file or text outside the prompt window (no model)")
    p.add_argument("--whole-file", action="append", default=[], metavar="PATH",
                   help="a file of the (one) project typed as a new module: its lines while it fits the window")
    p.add_argument("--keep-cases", action="store_true")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    if args.whole_file and "," in args.projects:
        p.error("--whole-file takes one project (--projects NAME==VERSION)")
    for c in args.configs.split(","):
        try:
            config_of(c, args.tokens)
        except ValueError as e:
            p.error(str(e))
    if args.count_only:
        for spec, n in count_needs(args).items():
            print(f"{spec}: {n['lines']} lines; a name only another file defines: {n['cross']}; a name outside "
                  f"the prompt window: {n['unseen']} (defined in the workspace: {n['unseen_repo']}; defined or "
                  f"imported by the line's own file: {n['unseen_own']})")
        return 0
    report = run(args, lambda msg: print(msg, file=sys.stderr, flush=True))
    print(table(report))
    if args.json:
        write_json(args.json, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
