"""Daemon latency: request-to-response p50/p95 (single- and multi-line, with and without REST), and a replayed
typing session at a 150 ms debounce.

    .venv/bin/python benchmarks/bench_latency.py [--model DIR] [--file PATH] [--workspace DIR] [--n 12]
        [--time-budget-ms 1500] [--json OUT] [--skip-latency] [--skip-typing] [--no-cancel]

It drives rest_lsp.service.CompletionService in-process, exactly as the LSP handler does (same worker
thread, queue, cache, supersession; only the JSON-RPC framing, about a millisecond, is left out).

Latency: cold Invoked requests (one item: no sampled alternatives), each in a document whose first line is
its own, so that no KV state of an earlier request holds its prompt. Positions come from a real file (default: the standard library's textwrap.py). Multi-line: a
function's body is removed and the cursor sits on its first, empty line. Single-line: a code line is cut
after a few characters and the cursor sits at the cut (the rest of the line is gone, as while typing).
"with REST" uses the daemon's draft sources (the document itself, the indexed workspace, open buffers);
"plain" is the same engine with draft_budget 0. Every request gets a fresh document URI, so the completion
cache never answers here.

Typing replay: a function body of the file is typed character by character with human-like gaps (a seeded
mix: 60-140 ms between characters, 300-700 ms pauses after a line or a word), an editor-like client sends a
request once 150 ms pass without a keystroke and (VS Code style, unless --no-cancel: Neovim style) cancels
the request in flight when the next key arrives. Reported: model calls per keystroke, cache-hit rate,
cancelled/superseded work, and the latency of each suggestion that reached the screen before the next key.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's packages, not an editable install's
sys.path.insert(0, str(Path(__file__).resolve().parent))

from rest_lsp.service.config import ServerConfig  # noqa: E402
from rest_lsp.service.core import CompletionRequest, CompletionService  # noqa: E402
from rest_lsp.service.workspace import WorkspaceIndex  # noqa: E402
from realcode import function_bodies  # noqa: E402
from report import pct, write_json  # noqa: E402


def multi_line_cases(text: str, n: int, rng: random.Random) -> list[tuple[str, int, int]]:
    lines = text.split("\n")
    cases = []
    for first, last, indent in function_bodies(text):
        doc = "\n".join(lines[:first] + [" " * indent] + lines[last + 1:])
        cases.append((doc, first, indent))
    rng.shuffle(cases)
    return cases[:n]


def single_line_cases(text: str, n: int, rng: random.Random) -> list[tuple[str, int, int]]:
    lines = text.split("\n")
    cands = [i for i, ln in enumerate(lines) if len(ln.strip()) >= 20 and not ln.strip().startswith(("#", '"', "'"))
             and not ln.rstrip().endswith(":")]
    rng.shuffle(cands)
    cases = []
    for i in cands[:n]:
        ln = lines[i]
        indent = len(ln) - len(ln.lstrip())
        cut = indent + rng.randint(4, max(5, min(12, len(ln.strip()) - 8)))
        doc = "\n".join(lines[:i] + [ln[:cut]] + lines[i + 1:])
        cases.append((doc, i, cut))
    return cases


def mark(doc: str, line: int, tag: str, every: int = 20) -> tuple[str, int]:
    """The document with a comment of its own every `every` lines above the cursor, so that whatever window the
    prompt takes, no KV state of an earlier request holds more than a few lines of it: a cold request. Invoked
    requests (below), so that the time budget, not the Automatic prompt budget, decides when it answers."""
    lines = doc.split("\n")
    out = []
    for i, ln in enumerate(lines):
        if i < line and i % every == 0:
            out.append(f"# {tag}")
        out.append(ln)
    return "\n".join(out), line + (line + every - 1) // every


async def measure_latency(svc: CompletionService, cases, tag: str) -> dict:
    lat, tokens, steps, outcomes = [], 0, 0, {}
    for k, (doc, line, col) in enumerate(cases):
        uri = f"file:///bench/{tag}/{k}.py"
        doc, line = mark(doc, line, f"{tag} {k}")
        t0 = time.perf_counter()
        r = await svc.complete(CompletionRequest(uri, doc, line, col, automatic=False, language="python"))
        lat.append((time.perf_counter() - t0) * 1000)
        rec = r.record
        tokens += rec.get("tokens", 0)
        steps += rec.get("steps", 0)
        outcomes[rec["stop_reason"] if rec.get("stop_reason") else rec["outcome"]] = \
            outcomes.get(rec.get("stop_reason") or rec["outcome"], 0) + 1
    return {"n": len(lat), "p50_ms": pct(lat, 50), "p95_ms": pct(lat, 95), "mean_ms": round(statistics.mean(lat), 1),
            "tokens": tokens, "steps": steps, "accepted_per_step": round(tokens / steps, 3) if steps else None,
            "stop_reasons": outcomes}


def keystroke_gaps(text: str, rng: random.Random) -> list[float]:
    gaps = []
    for i, ch in enumerate(text):
        prev = text[i - 1] if i else "\n"
        if prev == "\n":
            g = rng.uniform(0.3, 0.7)
        elif prev in " (.,:=" and rng.random() < 0.35:
            g = rng.uniform(0.3, 0.6)
        else:
            g = rng.uniform(0.06, 0.14)
        gaps.append(g)
    return gaps


async def typing_session(svc: CompletionService, text: str, debounce_s: float, cancel: bool, rng) -> dict:
    bodies = function_bodies(text)
    lines = text.split("\n")
    first, last, indent = max(bodies, key=lambda b: b[1] - b[0])
    typed_part = "\n".join(lines[first:last + 1])[indent:]
    before = "\n".join(lines[:first]) + "\n" + " " * indent
    after = "\n" + "\n".join(lines[last + 1:])
    gaps = keystroke_gaps(typed_part, rng)
    uri = "file:///bench/typing.py"
    shown_latency: list[float] = []
    answered_latency: list[float] = []     # every request that ran to its end (not stopped by a newer one)
    state = {"inflight": None, "n_requests": 0, "shown": 0, "stale": 0, "accepted_chars": 0}
    base = dict(svc.stats.totals)
    suggestion = ""

    async def request(doc: str, line: int, col: int, key_index: int):
        nonlocal suggestion
        t0 = time.perf_counter()
        state["n_requests"] += 1
        try:
            r = await svc.complete(CompletionRequest(uri, doc, line, col, automatic=True, language="python"))
        except asyncio.CancelledError:
            return
        if r.record["outcome"] in ("completed", "empty", "cache"):
            answered_latency.append(r.record["latency_ms"])
        if r.items and typed_count[0] == key_index:      # still on screen: nobody typed since
            shown_latency.append((time.perf_counter() - t0) * 1000)
            state["shown"] += 1
            suggestion = r.items[0].text
        elif r.items:
            state["stale"] += 1

    typed_count = [0]
    debounce_task = None
    for i, ch in enumerate(typed_part):
        typed_count[0] = i + 1
        if suggestion.startswith(ch):
            state["accepted_chars"] += 1     # the character was what the suggestion showed
            suggestion = suggestion[1:]
        else:
            suggestion = ""
        if debounce_task is not None:
            debounce_task.cancel()
        if cancel and state["inflight"] is not None and not state["inflight"].done():
            state["inflight"].cancel()
        doc_text = before + typed_part[: i + 1] + after
        prefix = before + typed_part[: i + 1]
        line = prefix.count("\n")
        col = len(prefix) - prefix.rfind("\n") - 1

        async def fire(doc=doc_text, line=line, col=col, k=i + 1):
            await asyncio.sleep(debounce_s)
            state["inflight"] = asyncio.ensure_future(request(doc, line, col, k))

        debounce_task = asyncio.ensure_future(fire())
        await asyncio.sleep(gaps[i])
    await asyncio.sleep(debounce_s + 0.05)
    if state["inflight"] is not None:
        try:
            await asyncio.wait_for(asyncio.shield(state["inflight"]), 30)
        except (asyncio.TimeoutError, asyncio.CancelledError):
            pass
    for _ in range(200):                               # let the worker finish stopped jobs (wasted work)
        if not svc.worker.snapshot()["running"]:
            break
        await asyncio.sleep(0.05)
    t = svc.stats.totals
    d = {k: t[k] - base.get(k, 0) for k in ("requests", "model_calls", "cache_hits", "cancelled", "superseded",
                                            "wasted_tokens", "wasted_steps", "tokens")}
    keys = len(typed_part)
    return {"keystrokes": keys, "requests": d["requests"], "model_calls": d["model_calls"],
            "model_calls_per_keystroke": round(d["model_calls"] / keys, 3),
            "cache_hits": d["cache_hits"], "cache_hit_rate": round(d["cache_hits"] / d["requests"], 3) if d["requests"] else None,
            "cancelled": d["cancelled"], "superseded": d["superseded"],
            "wasted_tokens": d["wasted_tokens"], "decoded_tokens": d["tokens"],
            "suggestions_shown": state["shown"], "stale_responses": state["stale"],
            "shown_latency_p50_ms": pct(shown_latency, 50), "shown_latency_p95_ms": pct(shown_latency, 95),
            "answered": len(answered_latency), "answered_latency_p50_ms": pct(answered_latency, 50),
            "answered_latency_p95_ms": pct(answered_latency, 95),
            "chars_typed_as_suggested": state["accepted_chars"], "debounce_ms": debounce_s * 1000,
            "cancel_on_keystroke": cancel, "typed_lines": typed_part.count("\n") + 1}


async def main_async(args) -> dict:
    text = Path(args.file).read_text()
    rng = random.Random(args.seed)
    report: dict = {"file": args.file, "model": args.model or "embedded", "time_budget_ms": args.time_budget_ms,
                    "command": " ".join(sys.argv)}
    # a cold start, as the figures say: no history from earlier daemons, and none left behind
    cfg = ServerConfig(model=args.model, time_budget_ms=args.time_budget_ms, max_tokens=args.max_tokens,
                       cache_dir=args.cache_dir, persist_history=False, alternatives=1)
    svc = CompletionService(cfg, notify=lambda level, msg: print(f"[{level}] {msg}", file=sys.stderr))
    t0 = time.perf_counter()
    svc.start()
    svc.worker.wait_loaded()
    if svc.worker.state != "ready":
        raise SystemExit(f"model failed to load: {svc.worker.error}")
    report["load_s"] = round(time.perf_counter() - t0, 1)
    index = None
    if args.workspace:
        index = WorkspaceIndex(svc, lambda level, msg: print(f"[{level}] {msg}", file=sys.stderr))
        index.start([args.workspace])
        index.wait_idle(3600)
        report["workspace"] = index.snapshot()["folders"]
    if not args.skip_latency:
        multi = multi_line_cases(text, args.n, rng)
        single = single_line_cases(text, args.n, rng)
        lat = {}
        for method, budget in (("rest", None), ("plain", 0)):
            svc.configure({"draft_budget": budget})
            lat[f"multi_{method}"] = await measure_latency(svc, multi, f"m-{method}")
            lat[f"single_{method}"] = await measure_latency(svc, single, f"s-{method}")
            print(method, json.dumps({k: v for k, v in lat.items() if k.endswith(method)}), file=sys.stderr)
        svc.configure({"draft_budget": None})
        report["latency"] = lat
    if not args.skip_typing:
        report["typing"] = await typing_session(svc, text, 0.150, not args.no_cancel, random.Random(args.seed))
    if index is not None:
        index.close()
    svc.close()
    return report


def main(argv=None) -> int:
    import textwrap

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None, help="model spec (default: the embedded Qwen2.5-Coder-0.5B)")
    p.add_argument("--file", default=textwrap.__file__, help="the real source file to complete in")
    p.add_argument("--workspace", default=None, help="index this folder for the repository drafts")
    p.add_argument("--cache-dir", default=None)
    p.add_argument("--n", type=int, default=12, help="requests per latency cell")
    p.add_argument("--time-budget-ms", type=int, default=1500)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None, help="write the report here")
    p.add_argument("--skip-latency", action="store_true")
    p.add_argument("--skip-typing", action="store_true")
    p.add_argument("--no-cancel", action="store_true", help="Neovim-style client: never cancels")
    args = p.parse_args(argv)
    report = asyncio.run(main_async(args))
    out = json.dumps(report, indent=2)
    print(out)
    if args.json:
        write_json(args.json, report, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
