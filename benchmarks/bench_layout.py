"""Prompt layouts compared on what a person would see: the first line the model suggests, against the rest of
the line the person was about to type, on real code that is in no corpus (a PyPI project, benchmarks/realcode.py).

    .venv/bin/python benchmarks/bench_layout.py [--project boltons==26.2.0] [--limit 80] [--layouts psm,line]
        [--precision auto] [--json OUT]

Each case is a line of a function body being typed top-down: the lines below it in that body are gone, the
cursor sits either right after the line's indentation or inside the line (the rest of the line gone, as while
typing). Every layout completes every case through the daemon's own path (EngineBackend: the prompt layout,
the engine, greedy, drafts on), one line at most. Reported per layout: exact first-line matches, suggestions
that are a correct start of the line (what a person would accept), empty suggestions, characters of the
line given correctly, mean prompt tokens.
"""
from __future__ import annotations

import argparse
import random
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's packages, not an editable install's
sys.path.insert(0, str(Path(__file__).resolve().parent))

from realcode import DEFAULT_PROJECT, fetch_project, function_bodies, python_files  # noqa: E402
from report import write_json  # noqa: E402


def cases(root: Path, limit: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    out = []
    for path in python_files(root):
        text = path.read_text(encoding="utf-8")
        lines = text.split("\n")
        for first, last, _ in function_bodies(text):
            for i in range(first, last + 1):
                line = lines[i]
                body = line.strip()
                if not body or body.startswith(("#", '"', "'")):
                    continue
                indent = len(line) - len(line.lstrip())
                cols = [indent]
                if len(body) >= 8:
                    cols.append(rng.randint(indent + 2, len(line) - 3))
                for col in cols:
                    doc = "\n".join(lines[:i] + [line[:col]] + lines[last + 1:])
                    body_start = len("\n".join(lines[:first])) + 1 if first else 0
                    out.append({"file": path.name, "line": i, "col": col, "doc": doc, "target": line[col:].rstrip(),
                                "at": "line start" if col == indent else "mid-line", "body_start": body_start})
    rng.shuffle(out)
    return out[:limit]


def common_prefix(a: str, b: str) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def run(args) -> dict:
    from rest_lsp.service.backend import load_backend
    from rest_lsp.service.config import ServerConfig
    from rest_lsp.service.prompt import build_context, shape_completion

    root = fetch_project(args.project)
    todo = cases(root, args.limit, args.seed)
    cfg = ServerConfig(model=args.model, precision=args.precision, persist_history=False, max_lines=1,
                       max_tokens=args.max_tokens, index_workspace=False)
    t0 = time.perf_counter()
    backend = load_backend(cfg)
    print(f"model {backend.name} ({backend.loaded.precision}, {backend.verifier_kind}) loaded in "
          f"{time.perf_counter() - t0:.1f} s; {len(todo)} cases from {args.project}", file=sys.stderr)
    layouts = args.layouts.split(",")
    rows = {lay: [] for lay in layouts}
    for k, case in enumerate(todo):
        ctx = build_context(case["doc"], case["line"], case["col"])
        for lay in layouts:
            # line@body: the middle holds the body typed so far (the prompt the daemon builds while a body is
            # typed top-down), not only the cursor line
            c = replace(cfg, layout=lay.split("@")[0])
            r = backend.start(f"case{k}", ctx, c, anchor=case["body_start"] if lay.endswith("@body") else None)
            while not r.done:
                backend.advance(r)
            shown = shape_completion(r.text, ctx, max_lines=1, truncated=False)
            target = case["target"]
            good = common_prefix(shown, target)
            rows[lay].append({"exact": shown == target, "correct_start": bool(shown) and target.startswith(shown),
                              "empty": not shown, "chars_right": good if target.startswith(shown[:good]) else 0,
                              "target_chars": len(target), "prompt_tokens": backend.figures(r)["prompt_tokens"],
                              "at": case["at"], "shown": shown, "target": target})
        if (k + 1) % 10 == 0:
            print(f"[{k + 1}/{len(todo)}] " + ", ".join(
                f"{lay}: exact {sum(x['exact'] for x in rows[lay])}" for lay in layouts), file=sys.stderr)
    report = {"project": args.project, "cases": len(todo), "model": backend.name,
              "precision": backend.loaded.precision, "command": " ".join(sys.argv), "layouts": {}}
    for lay in layouts:
        rs = rows[lay]
        summary = {}
        for part in ("all", "line start", "mid-line"):
            sel = [x for x in rs if part == "all" or x["at"] == part]
            if not sel:
                continue
            summary[part] = {
                "n": len(sel),
                "exact": round(sum(x["exact"] for x in sel) / len(sel), 3),
                "correct_start": round(sum(x["correct_start"] for x in sel) / len(sel), 3),
                "empty": round(sum(x["empty"] for x in sel) / len(sel), 3),
                "chars_right": round(sum(x["chars_right"] for x in sel) / max(1, sum(x["target_chars"] for x in sel)), 3),
                "prompt_tokens": round(sum(x["prompt_tokens"] for x in sel) / len(sel), 1),
            }
        report["layouts"][lay] = {"summary": summary, "cases": rs if args.keep_cases else None}
    return report


def table(report: dict) -> str:
    out = [f"{'layout':<6} {'cases':<10} {'n':>4} {'exact':>6} {'correct start':>13} {'empty':>6} {'chars right':>11} "
           f"{'prompt tok':>10}"]
    for lay, d in report["layouts"].items():
        for part, s in d["summary"].items():
            out.append(f"{lay:<6} {part:<10} {s['n']:>4} {s['exact']:>6.3f} {s['correct_start']:>13.3f} "
                       f"{s['empty']:>6.3f} {s['chars_right']:>11.3f} {s['prompt_tokens']:>10.1f}")
    return "\n".join(out)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--project", default=DEFAULT_PROJECT)
    p.add_argument("--limit", type=int, default=80)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--layouts", default="psm,line")
    p.add_argument("--model", default=None)
    p.add_argument("--precision", default="auto")
    p.add_argument("--max-tokens", type=int, default=24)
    p.add_argument("--keep-cases", action="store_true", help="every case's suggestion and target in the JSON")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    report = run(args)
    print(table(report))
    if args.json:
        write_json(args.json, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
