"""Decoding speed in the team server, one engine (vLLM, CPU build), four proposers: none, vLLM's `ngram`,
vLLM's `suffix` (Arctic Inference's suffix decoding: scripts/team_venv.sh with TEAM_SUFFIX=1) and REST
(rest_lsp.team.proposer). Each server starts in turn with the same model and settings; every prompt
is sent alone (greedy, temperature 0) and timed from the request to its last streamed token.

    python benchmarks/team_bench.py [--model M] [--prompts humaneval|FILE.jsonl] [--limit 5] [--max-tokens 128]
                                    [--repo DIR]... [--specs none,ngram,suffix,rest] [--k 8] [--json OUT]

Reports per proposer: tokens/s (sum of tokens / sum of times), vLLM's accepted tokens per draft and per
draft token (its /metrics counters), and whether each output equals the `none` run's (the engine's own greedy
output). Run it under `flock /tmp/rest-cpu.lock` on a shared machine: each server start loads the model.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "team"))


def load_prompts(spec: str, limit: int, offset: int) -> list[str]:
    """The bench's prompts (rest_lsp/bench/prompts.py: humaneval or a JSONL file), as plain prompts."""
    from rest_lsp.bench.prompts import load_prompts as bench_prompts

    return [p.prefix for p in bench_prompts(spec, limit=limit, offset=offset)]


def suffix_ready(team_python: Path) -> str | None:
    """None when the team venv has arctic-inference's suffix tree (vLLM's `suffix` method); else why not."""
    lib = team_python.parent.parent / "lib"
    if not any(lib.glob("python3*/site-packages/arctic_inference/suffix_decoding/_C*.so")):
        return (f"--specs suffix: the team venv ({team_python}) has no arctic-inference "
                "(TEAM_SUFFIX=1 bash scripts/team_venv.sh)")
    return None


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default=None)
    p.add_argument("--prompts", default="humaneval")
    p.add_argument("--offset", type=int, default=0)
    p.add_argument("--limit", type=int, default=5)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--repo", action="append", default=[])
    p.add_argument("--specs", default="none,ngram,rest", help="a comma list of none, ngram, suffix, rest")
    p.add_argument("--k", type=int, default=8)
    p.add_argument("--min-prob", type=float, default=0.0, help="REST's chain cut (team-server --min-prob)")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    from harness import spec_metrics, team_python, team_server, team_venv_ready

    specs = args.specs.split(",")
    unknown = set(specs) - {"none", "ngram", "suffix", "rest"}
    if unknown:
        p.error(f"--specs: unknown {', '.join(sorted(unknown))}")
    why = team_venv_ready() or ("suffix" in specs and suffix_ready(team_python())) or None
    if why:
        print(why, file=sys.stderr)
        return 2
    from rest_lsp.service.team_client import TeamClient
    from rest_lsp.team.server import resolve_model

    model_dir, _ = resolve_model(args.model)
    prompts = load_prompts(args.prompts, args.limit, args.offset)
    report, outputs = {"model": model_dir, "prompts": len(prompts), "max_tokens": args.max_tokens, "k": args.k,
                       "min_prob": args.min_prob, "runs": {}}, {}
    for spec in specs:
        t0 = time.monotonic()
        team_args = ("--min-prob", str(args.min_prob)) if spec == "rest" else ()
        with team_server(model_dir, key="bench", spec=spec, repos=tuple(args.repo), k=args.k,
                         team_args=team_args) as (url, stats, log):
            up = time.monotonic() - t0
            c = TeamClient(url, key="bench")
            c.complete("def warm_up():\n", max_tokens=8)   # first-request costs out of the timing
            m0 = spec_metrics(url)
            texts, tokens, secs = [], 0, 0.0
            for prompt in prompts:
                t = time.perf_counter()
                s = c.stream(prompt, max_tokens=args.max_tokens)
                while s.next_text() is not None:
                    pass
                secs += time.perf_counter() - t
                tokens += (s.usage or {}).get("completion_tokens", 0)
                texts.append(s.text)
            m1 = spec_metrics(url)
        d = {k: m1.get(k, 0) - m0.get(k, 0) for k in ("num_drafts", "num_draft_tokens", "num_accepted_tokens")}
        outputs[spec] = texts
        report["runs"][spec] = {
            "server_start_s": round(up, 1), "tokens": tokens, "seconds": round(secs, 2),
            "tokens_per_s": round(tokens / secs, 2) if secs else None,
            "drafts": d["num_drafts"], "draft_tokens": d["num_draft_tokens"], "accepted": d["num_accepted_tokens"],
            "accepted_per_draft": round(d["num_accepted_tokens"] / d["num_drafts"], 3) if d["num_drafts"] else None,
            "acceptance_rate": round(d["num_accepted_tokens"] / d["num_draft_tokens"], 3) if d["num_draft_tokens"] else None,
        }
        print(spec, json.dumps(report["runs"][spec]), flush=True)
    base = outputs.get("none")
    if base is not None:
        for spec, texts in outputs.items():
            report["runs"][spec]["same_as_none"] = sum(a == b for a, b in zip(texts, base))
    print(json.dumps(report, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
