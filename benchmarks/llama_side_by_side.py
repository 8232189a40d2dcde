"""llama.cpp and this project side by side, in one run, on the same GGUF and the same machine.

    bash benchmarks/llama_server.sh                      # llama-server, llama-bench, llama-lookup-create (once)
    .venv/bin/python benchmarks/llama_side_by_side.py --model qwen2.5-coder-1.5b --precision int4w \\
        --limit 20 --json side.json

What it runs, in this order (each part names the command it ran in the report):
1. per-token costs, llama.cpp then ours then llama.cpp again (so a drift of the machine shows as two llama.cpp
   figures that disagree): c(q), one forward of q new tokens after a 300-token cache, for q = 1, 2, 4, 8, 16
   and the 64-token prompt chunk (`llama-bench -p Q -n 0 -d 300`; ours `benchmarks/cost_curve.py --kinds auto`,
   the verifier the daemon and `rest-lsp bench` build), and decoding at one row (`llama-bench -n 32 -d 300`;
   ours: plain decoding's median ms per token after a 300-token prompt, `--plain-past`; before 2026-12-06 22:30
   UTC after a 15-token one, a shorter attention than llama.cpp's);
2. HumanEval, ours bracketed by llama.cpp: `llama-server` plain, then with llama.cpp's lookup decoding
   (`--spec-type ngram-cache` with a static n-gram cache that `llama-lookup-create` builds from the text of the
   same corpus's files), then `rest-lsp bench --methods ar,rest` with the corpus datastore, then llama.cpp's
   lookup and plain passes again, all on the same prompt token ids (read first from a one-token `rest-lsp
   bench` pass, checked against the full run's), greedy. Each llama.cpp figure pools its two passes (tokens
   over time), so a machine that drifts during the run moves both sides alike; the passes' own rates are in
   the report (on a 2-core virtualized Xeon two runs an hour apart, unbracketed, put `rest` at 1.27x and 1.41x
   llama.cpp plain). Tokens per second count the tokens after the first over the time after the prompt, for
   both engines (llama.cpp's `predicted_n - 1` over `predicted_ms`; ours `rest-lsp bench`'s tokens_per_s), and
   each output is compared with ours under `ar` (llama.cpp's kernels round differently, so its greedy text may
   part from ours).

The corpus: `--corpus DIR`, a datastore (built when missing with `rest-index build --corpus-from-env
--max-tokens N` in the model's tokenizer); llama.cpp's static cache is built from the files that datastore
indexed, read back from disk (secrets the indexer masked are in llama.cpp's text and not in ours).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from llama_peer import LlamaServer  # noqa: E402

from rest_lsp.model.precision import cpu_name  # noqa: E402

QS = (1, 2, 4, 8, 16, 64)
PAST = 300


def _cache() -> Path:
    from restbase.storage import cache_root

    return cache_root()


def run(cmd: list[str], log) -> str:
    """Runs `cmd`, its output to the log; returns stdout."""
    log(f"$ {' '.join(map(str, cmd))}")
    t = time.perf_counter()
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True)
    if r.returncode:
        hint = ""
        if r.returncode < 0 and "llama" in Path(str(cmd[0])).name:
            hint = ("\n(killed by a signal: on a machine with AMX, llama.cpp's AMX kernels can crash (its issue 20824); "
                    "rebuild without them: LLAMA_AMX=off bash benchmarks/llama_server.sh)")
        raise SystemExit(f"{cmd[0]} failed ({r.returncode}):\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}{hint}")
    log(f"  ({time.perf_counter() - t:.0f} s)")
    return r.stdout


# ------------------------------------------------------------------------------------------- costs
def llama_costs(bench: Path, gguf: Path, threads: int, repeats: int, log) -> dict:
    """{"c_ms": {q: ms}, "decode_ms": ms per token at one row}: llama-bench at a PAST-token depth."""
    out = run([bench, "-m", gguf, "-t", threads, "-p", ",".join(map(str, QS)), "-n", "32", "-d", PAST,
               "-r", repeats, "-o", "json"], log)
    rows = json.loads(out)
    return {**costs_from_rows(rows), "build": rows[0].get("build_commit"), "cpu": rows[0].get("cpu_info"),
            "rows": rows}


def costs_from_rows(rows: list[dict]) -> dict:
    """The median of each llama-bench test's repetitions (as cost_curve.py takes ours: one burst of load from
    elsewhere moves a mean, not a median)."""
    def ms(r: dict) -> float:
        samples = r.get("samples_ns") or [r["avg_ns"]]
        return statistics.median(samples) / 1e6

    tg = next(r for r in rows if r["n_prompt"] == 0)
    return {"c_ms": {r["n_prompt"]: ms(r) for r in rows if r["n_gen"] == 0}, "decode_ms": ms(tg) / tg["n_gen"]}


def our_costs(model: str, precision: str, threads: int, repeats: int, tmp: Path, log) -> dict:
    out = tmp / "cost_curve.json"
    run([sys.executable, ROOT / "benchmarks" / "cost_curve.py", "--model", model, "--precision", precision,
         "--kinds", "auto", "--qs", ",".join(map(str, QS)), "--past", PAST, "--repeats", repeats,
         "--threads", threads, "--plain", 48, "--plain-past", PAST, "--json", out], log)
    rep = json.loads(out.read_text())
    kind = rep["kinds"]["auto"]
    return {"c_ms": {int(q): ms for q, ms in kind["ms"].items()}, "decode_ms": kind["plain_ms_per_token"],
            "precision": rep["precision"]}


# ------------------------------------------------------------------------------------------- corpus
def ensure_corpus(corpus: Path, gguf: Path, max_tokens: int, log) -> None:
    from indexer.manifest import MANIFEST

    if (corpus / MANIFEST).exists():
        return
    run([ROOT / ".venv" / "bin" / "rest-index", "build", "--corpus-from-env", "--max-tokens", max_tokens,
         "--tokenizer", gguf, "--out", corpus, "--no-progress"], log)


def lookup_cache(corpus: Path, gguf: Path, create: Path, threads: int, tmp: Path, log) -> tuple[Path, dict]:
    """llama.cpp's static n-gram cache from the text of the files the corpus datastore indexed."""
    from indexer.store import Datastore

    store = Datastore.open(corpus, verify=False, auto_refresh=False)
    try:
        paths = sorted(store.documents)
        tokens = sum(d.end - d.start for d in store.documents.values())
    finally:
        store.close()
    text, files, chars = tmp / "corpus.txt", 0, 0
    with text.open("w", encoding="utf-8") as f:
        for p in paths:
            try:
                body = Path(p).read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError):
                continue
            f.write(body if body.endswith("\n") else body + "\n")
            files, chars = files + 1, chars + len(body)
    out = tmp / "corpus.lcs"
    run([create, "-m", gguf, "-t", threads, "-f", text, "-lcs", out], log)
    return out, {"files": files, "of_indexed": len(paths), "chars": chars, "datastore_tokens": tokens}


# ------------------------------------------------------------------------------------------- HumanEval
def rest_bench(model: str, precision: str, limit: int, max_new: int, out: Path, log, *args) -> dict:
    """`rest-lsp bench` on the first `limit` HumanEval prompts; its JSON report."""
    run([ROOT / ".venv" / "bin" / "rest-lsp", "bench", "--model", model, "--precision", precision,
         "--prompts", "humaneval", "--limit", limit, "--max-new-tokens", max_new, *args, "--json", out], log)
    return json.loads(out.read_text())


def ours_humaneval(model: str, precision: str, corpus: Path, limit: int, max_new: int, tmp: Path, log) -> dict:
    return rest_bench(model, precision, limit, max_new, tmp / "bench.json", log,
                      "--methods", "ar,rest", "--datastore", corpus)


def humaneval_prompt_ids(model: str, precision: str, limit: int, tmp: Path, log) -> list[list[int]]:
    """The prompts' token ids as `rest-lsp bench` builds them (one new token each: a load and the prefills), so
    llama.cpp's first passes can run before ours."""
    report = rest_bench(model, precision, limit, 1, tmp / "prompts.json", log, "--methods", "ar", "--no-warmup")
    return [r["prompt_ids"] for r in report["methods"]["ar"]["per_prompt"]]


async def llama_humaneval(server: LlamaServer, prompts: list[list[int]], max_new: int, log) -> dict:
    await server.start()
    try:
        await server.wait_ready()
        body = {"n_predict": max_new, "temperature": 0.0, "top_k": 1, "samplers": ["top_k"],
                "cache_prompt": False, "return_tokens": True, "stream": False}
        await asyncio.to_thread(server.post, "/completion", {**body, "prompt": prompts[0], "n_predict": 8})
        rows = []
        for i, ids in enumerate(prompts):
            r = await asyncio.to_thread(server.post, "/completion", {**body, "prompt": ids})
            t = r["timings"]
            rows.append({"tokens": r["tokens"], "predicted_n": t["predicted_n"], "predicted_ms": t["predicted_ms"],
                         "prompt_ms": t["prompt_ms"], "draft_n": t.get("draft_n", 0),
                         "draft_accepted": t.get("draft_n_accepted", 0)})
            log(f"  [{i + 1}/{len(prompts)}] {t['predicted_n']} tokens in {t['predicted_ms']:.0f} ms"
                + (f", drafts {t.get('draft_n_accepted', 0)}/{t.get('draft_n', 0)}" if "draft_n" in t else ""))
        return {"per_prompt": rows}
    finally:
        await server.close()


def pooled(passes: list[dict]) -> dict:
    """Two passes of one llama.cpp arm as one: the first pass's outputs, tokens over time across both (the
    passes' own rates kept)."""
    def total(key: str) -> float:
        return sum(p[key] for p in passes)

    steps = total("tokens") - total("draft_accepted")
    return {"tokens": passes[0]["tokens"], "identical_to_ours_ar": passes[0]["identical_to_ours_ar"],
            "tokens_per_s": total("rate_tokens") / total("rate_ms") * 1e3 if total("rate_ms") else None,
            "passes_tokens_per_s": [p["tokens_per_s"] for p in passes],
            "draft_n": total("draft_n"), "draft_accepted": total("draft_accepted"),
            "accepted_per_step": round(total("tokens") / steps, 2) if steps else ""}


def summarize_llama(rows: list[dict], ar_outputs: list[list[int]]) -> dict:
    tokens = sum(max(0, r["predicted_n"] - 1) for r in rows)
    ms = sum(r["predicted_ms"] for r in rows)
    same = sum(r["tokens"] == ar for r, ar in zip(rows, ar_outputs))
    drafted = sum(r["draft_n"] for r in rows)
    return {"tokens": sum(r["predicted_n"] for r in rows), "tokens_per_s": tokens / ms * 1e3 if ms else None,
            "identical_to_ours_ar": same, "draft_n": drafted, "draft_accepted": sum(r["draft_accepted"] for r in rows),
            "rate_tokens": tokens, "rate_ms": ms}


# ------------------------------------------------------------------------------------------- report
def _cost_rows(c: dict) -> list[str]:
    lines = ["", f"ours at {c['ours']['precision']}",
             "| cost after a 300-token cache, ms | llama.cpp (1st) | ours | llama.cpp (2nd) | ours / llama.cpp |",
             "|---|---|---|---|---|"]
    for q in QS:
        a, b, o = c["llama_1"]["c_ms"][q], c["llama_2"]["c_ms"][q], c["ours"]["c_ms"][q]
        lines.append(f"| c({q}) | {a:.1f} | {o:.1f} | {b:.1f} | {o / statistics.mean([a, b]):.2f}x |")
    a, b, o = c["llama_1"]["decode_ms"], c["llama_2"]["decode_ms"], c["ours"]["decode_ms"]
    lines.append(f"| decoding, 1 row, per token | {a:.1f} | {o:.1f} | {b:.1f} | {o / statistics.mean([a, b]):.2f}x |")
    a, b, o = (c["llama_1"]["c_ms"][64] / 64, c["llama_2"]["c_ms"][64] / 64, c["ours"]["c_ms"][64] / 64)
    lines.append(f"| prompt, per token (64-token chunk) | {a:.2f} | {o:.2f} | {b:.2f} | {o / statistics.mean([a, b]):.2f}x |")
    return lines


def table(report: dict) -> str:
    c = report.get("costs")
    lines = [f"model {report['model']} ({report['gguf']}), {report['threads']} threads, {report['cpu']}"]
    if c:
        lines += _cost_rows(c)
    h = report.get("humaneval")
    if h:
        lines += ["", f"HumanEval/0-{h['n'] - 1}, {h['max_new_tokens']} new tokens, greedy, corpus {h['corpus_text']['datastore_tokens']} tokens",
                  "| method | tokens | tokens/s | vs llama.cpp plain | accepted per step | same tokens as ours `ar` |",
                  "|---|---|---|---|---|---|"]
        base = h["llama.cpp"]["tokens_per_s"]
        for name, m in h["methods"].items():
            rate = m["tokens_per_s"]
            lines.append(f"| {name} | {m['tokens']} | {rate:.2f} | {rate / base:.2f}x | {m.get('accepted', '')} | "
                         f"{m['same']}/{h['n']} |")
        passes = {name: m["passes"] for name, m in h["methods"].items() if m.get("passes")}
        if passes:
            lines += ["", "llama.cpp's passes before / after ours, tokens/s: " + "; ".join(
                f"{name} {a:.2f} / {b:.2f}" for name, (a, b) in passes.items())]
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="qwen2.5-coder-1.5b", help="an embedded model's name (its GGUF is what both run)")
    p.add_argument("--precision", default="int4w")
    p.add_argument("--llama-dir", default=None, help="where llama_server.sh put the tools (default <cache>/llama.cpp)")
    p.add_argument("--corpus", default=None, help="corpus datastore (default <cache>/bench-data/corpus-MODEL)")
    p.add_argument("--corpus-tokens", type=int, default=10_000_000, help="tokens of the corpus when it is built")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--limit", type=int, default=20)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--skip-costs", action="store_true")
    p.add_argument("--skip-humaneval", action="store_true")
    p.add_argument("--work", default=None, help="keep intermediate files here (default: a temporary directory)")
    p.add_argument("--json", default=None)
    p.add_argument("--render", default=None, metavar="JSON", help="print the table of an earlier run's report")
    args = p.parse_args(argv)
    if args.render:
        report = json.loads(Path(args.render).read_text())
        for k in ("llama_1", "llama_2") if "costs" in report else ():  # the rows hold the samples
            report["costs"][k].update(costs_from_rows(report["costs"][k]["rows"]))
        if "costs" in report:
            report["costs"]["ours"]["c_ms"] = {int(q): v for q, v in report["costs"]["ours"]["c_ms"].items()}
        print(table(report))
        return 0

    from restbase import assets

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    gguf = assets.gguf_path(args.model)
    tools = Path(args.llama_dir) if args.llama_dir else _cache() / "llama.cpp"
    for tool in ("llama-server", "llama-bench", "llama-lookup-create"):
        if not (tools / tool).exists():
            raise SystemExit(f"{tools / tool} is missing: bash benchmarks/llama_server.sh")
    work = Path(args.work) if args.work else Path(__import__("tempfile").mkdtemp(prefix="side-by-side."))
    work.mkdir(parents=True, exist_ok=True)
    report = {"model": args.model, "gguf": gguf.name, "threads": args.threads, "cpu": cpu_name(),
              "command": " ".join(sys.argv), "started": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    if not args.skip_costs:
        l1 = llama_costs(tools / "llama-bench", gguf, args.threads, args.repeats, log)
        ours = our_costs(args.model, args.precision, args.threads, args.repeats, work, log)
        l2 = llama_costs(tools / "llama-bench", gguf, args.threads, args.repeats, log)
        report["costs"] = {"llama_1": l1, "ours": ours, "llama_2": l2}
        report["cpu"] = l1.get("cpu") or report["cpu"]
    if not args.skip_humaneval:
        corpus = Path(args.corpus) if args.corpus else _cache() / "bench-data" / f"corpus-{args.model}"
        ensure_corpus(corpus, gguf, args.corpus_tokens, log)
        lcs, text = lookup_cache(corpus, gguf, tools / "llama-lookup-create", args.threads, work, log)
        prompts = humaneval_prompt_ids(args.model, args.precision, args.limit, work, log)

        def llama_pass(arm: str, extra: tuple[str, ...] = ()) -> dict:
            server = LlamaServer(tools / "llama-server", gguf, work / arm, threads=args.threads, extra_args=extra)
            return asyncio.run(llama_humaneval(server, prompts, args.max_new_tokens, log))

        lookup_args = ("--spec-type", "ngram-cache", "-lcs", str(lcs))
        plain, lookup = [llama_pass("plain-1")], [llama_pass("lookup-1", lookup_args)]
        ours = ours_humaneval(args.model, args.precision, corpus, args.limit, args.max_new_tokens, work, log)
        lookup.append(llama_pass("lookup-2", lookup_args))
        plain.append(llama_pass("plain-2"))
        ar_rows = ours["methods"]["ar"]["per_prompt"]
        if [r["prompt_ids"] for r in ar_rows] != prompts:
            raise SystemExit("the full run built other prompt ids than the first pass: llama.cpp decoded other prompts")
        ar_out = [r["output_ids"] for r in ar_rows]
        lp = pooled([summarize_llama(p["per_prompt"], ar_out) for p in plain])
        ll = pooled([summarize_llama(p["per_prompt"], ar_out) for p in lookup])
        methods = {}
        for name in ("ar", "rest"):
            m = ours["methods"][name]
            methods[f"ours {name} ({ours.get('precision', args.precision)})"] = {
                "tokens": m["tokens"], "tokens_per_s": m["tokens_per_s"], "accepted": round(m["mean_accepted"] or 0, 2),
                "same": sum(r["output_ids"] == a for r, a in zip(m["per_prompt"], ar_out))}
        methods["llama.cpp plain"] = {"tokens": lp["tokens"], "tokens_per_s": lp["tokens_per_s"], "accepted": 1.0,
                                      "same": lp["identical_to_ours_ar"], "passes": lp["passes_tokens_per_s"]}
        methods["llama.cpp lookup (ngram-cache)"] = {
            "tokens": ll["tokens"], "tokens_per_s": ll["tokens_per_s"],
            "accepted": ll["accepted_per_step"],
            "same": ll["identical_to_ours_ar"], "passes": ll["passes_tokens_per_s"]}
        report["humaneval"] = {"n": len(prompts), "max_new_tokens": args.max_new_tokens, "methods": methods,
                               "llama.cpp": lp, "llama.cpp lookup": ll, "corpus": str(corpus), "corpus_text": text,
                               "ours_command": ours.get("command"),
                               "llama_plain": plain, "llama_lookup": lookup}
    if args.json:  # before the table: a report is never lost to a formatting error
        Path(args.json).write_text(json.dumps(report, indent=1))
        log(f"wrote {args.json}")
    print(table(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
