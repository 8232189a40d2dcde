"""`rest-lsp bench`: every method on every prompt, one model, one JSON report.

Prompts run in order and, within a prompt, the methods run one after another, so drift in machine load
(other processes) spreads over all methods alike. Each method first runs once, untimed, on a short warm-up
prompt (first-call overheads, c(q) calibration).

JSON (tools outside the project read these keys):
    {"methods": {NAME: {"tokens", "seconds", "prefill_seconds", "tokens_per_s", "speedup_vs_ar", "steps",
                        "mean_accepted", "retrieval_ms_p50", "retrieval_ms_p99", "identical_to_ar",
                        "per_prompt": [...], ...}},
     "model", "precision", "device", "prompts", "n_prompts", "max_new_tokens", ...}
"""
from __future__ import annotations

import platform
import sys
import time
from typing import Callable, Sequence

import numpy as np
import torch

from .methods import Run, SharedVerifier, make_method
from .prompts import BenchPrompt

WARMUP_TEXT = "def warm_up(x):\n    return"


def _pct(values: Sequence[float], q: float) -> float | None:
    return float(np.percentile(np.asarray(values, dtype=np.float64), q)) if len(values) else None


def _rate(tokens: int, seconds: float) -> float | None:
    return tokens / seconds if seconds > 0 else None


def prompt_row(p: BenchPrompt, run: Run, ar: Run | None, prompt_ids: Sequence[int] = ()) -> dict:
    # the first forward (a prefill, or a first step: rest_lsp/engine/generate.py) yields the first token(s),
    # counted with the prefill's time
    decode_tokens = max(0, len(run.tokens) - run.first_tokens)
    decode_steps = max(0, run.steps - 1)
    return {
        "id": p.id,
        "tokens": len(run.tokens),
        "seconds": run.seconds,
        "prefill_seconds": run.prefill_seconds,
        "tokens_per_s": _rate(decode_tokens, run.seconds - run.prefill_seconds),
        "steps": run.steps,
        "mean_accepted": decode_tokens / decode_steps if decode_steps else None,
        "retrieval_ms_p50": _pct(run.retrieval_ms, 50),
        "retrieval_ms_p99": _pct(run.retrieval_ms, 99),
        "retrieval_ms": [round(ms, 4) for ms in run.retrieval_ms],  # every step's, for the tail's shape
        "mean_draft_nodes": float(np.mean(run.draft_nodes)) if run.draft_nodes else None,
        "accepted_sources": run.accepted_sources,
        "identical_to_ar": None if ar is None else run.tokens == ar.tokens,
        "stop_reason": run.stop_reason,
        "output_ids": run.tokens,
        "prompt_ids": list(prompt_ids),  # what a peer engine is given to decode the same prompt (llama_side_by_side)
    }


def summarize(rows: list[dict], runs: list[Run]) -> dict:
    tokens = sum(r["tokens"] for r in rows)
    seconds = sum(r["seconds"] for r in rows)
    prefill = sum(r["prefill_seconds"] for r in rows)
    decode_tokens = sum(max(0, r["tokens"] - 1) for r in rows)
    decode_steps = sum(max(0, r["steps"] - 1) for r in rows)
    retrieval = [ms for run in runs for ms in run.retrieval_ms]
    nodes = [n for run in runs for n in run.draft_nodes]
    same = [r["identical_to_ar"] for r in rows if r["identical_to_ar"] is not None]
    sources: dict[str, int] = {}
    for run in runs:
        for k, v in run.accepted_sources.items():
            sources[k] = sources.get(k, 0) + v
    return {
        "tokens": tokens,
        "seconds": seconds,
        "prefill_seconds": prefill,
        "tokens_per_s": _rate(decode_tokens, seconds - prefill),
        "speedup_vs_ar": None,  # filled in once ar's rate is known
        "steps": sum(r["steps"] for r in rows),
        "mean_accepted": decode_tokens / decode_steps if decode_steps else None,
        "retrieval_ms_p50": _pct(retrieval, 50),
        "retrieval_ms_p99": _pct(retrieval, 99),
        "identical_to_ar": (sum(same) / len(same)) if same else None,
        "mean_draft_nodes": float(np.mean(nodes)) if nodes else None,
        "accepted_sources": sources,
        "per_prompt": rows,
    }


def run_bench(loaded, prompts: Sequence[BenchPrompt], methods: Sequence[str], *, max_new_tokens: int = 128,
              corpus=None, repository=None, rest_policy: str = "rest",
              rest_budget: int | None = None, histories: dict | None = None, verifier: str = "auto",
              warmup: bool = True, log: Callable[[str], None] | None = None) -> dict:
    """verifier: the kind (rest_lsp.model.verifiers) that ar, pld, rest-paper and rest share; pld-hf always
    runs transformers' generate. histories: method name -> its HistorySource (see `make_method`)."""
    from rest_lsp.model.verifiers import make_verifier_or_eager

    log = log or (lambda s: None)
    methods = list(dict.fromkeys(methods))
    # ar first: the other methods compare their outputs with its
    order = (["ar"] if "ar" in methods else []) + [m for m in methods if m != "ar"]
    shared = SharedVerifier(make_verifier_or_eager(loaded, verifier))
    log(f"verifier: {shared.kind} (asked: {verifier})")
    runners = {m: make_method(m, loaded, corpus=corpus, repository=repository,
                              rest_policy=rest_policy, rest_budget=rest_budget,
                              history=(histories or {}).get(m), shared=shared) for m in order}
    if warmup:
        ids = loaded.build_prompt(WARMUP_TEXT)
        for m in order:
            t = time.perf_counter()
            runners[m].run(ids, 4)
            log(f"warm-up {m}: {time.perf_counter() - t:.1f} s")
    runs: dict[str, list[Run]] = {m: [] for m in order}
    rows: dict[str, list[dict]] = {m: [] for m in order}
    for i, p in enumerate(prompts):
        ids = loaded.build_prompt(p.prefix, p.suffix, max_new_tokens=max_new_tokens)
        ar_run = None
        for m in order:
            run = runners[m].run(ids, max_new_tokens)
            if m == "ar":
                ar_run = run
            runs[m].append(run)
            rows[m].append(prompt_row(p, run, ar_run, ids))
            r = rows[m][-1]
            log(f"[{i + 1}/{len(prompts)}] {p.id} {m}: {r['tokens']} tokens, {r['seconds']:.2f} s, "
                f"M={r['mean_accepted'] or 0:.2f}" + ("" if r["identical_to_ar"] is not False else ", DIFFERS from ar"))
    out_methods = {m: summarize(rows[m], runs[m]) for m in order}
    ar_rate = out_methods.get("ar", {}).get("tokens_per_s")
    for m, s in out_methods.items():
        if ar_rate and s["tokens_per_s"] is not None:
            s["speedup_vs_ar"] = s["tokens_per_s"] / ar_rate
        s["config"] = runners[m].describe()
    cost = next((r.cost for r in runners.values() if getattr(r, "cost", None) is not None), None)
    return {
        "methods": {m: out_methods[m] for m in methods},
        "model": loaded.name,
        "precision": loaded.precision,
        "device": str(loaded.device),
        "n_prompts": len(prompts),
        "max_new_tokens": max_new_tokens,
        "rest_policy": rest_policy,
        "verifier": shared.kind,
        "cost_ms": None if cost is None else {"qs": list(cost.qs), "ms": list(cost.ms)},
        "torch_threads": torch.get_num_threads(),
        "platform": {"python": sys.version.split()[0], "torch": torch.__version__,
                     "machine": platform.machine(), "processor": platform.processor()},
        "ar_loop": "rest_lsp.engine.Engine without draft sources (the loop the rest methods use)",
    }


def format_table(report: dict) -> str:
    head = f"{'method':<12} {'tokens':>7} {'tok/s':>7} {'speedup':>7} {'M':>5} {'ret p50':>7} {'ret p99':>7} {'same':>5}"
    lines = [head, "-" * len(head)]

    def f(v, fmt):
        return format(v, fmt) if v is not None else format("-", ">" + fmt.split(".")[0])

    for m, s in report["methods"].items():
        lines.append(f"{m:<12} {s['tokens']:>7} {f(s['tokens_per_s'], '7.2f')} {f(s['speedup_vs_ar'], '7.2f')} "
                     f"{f(s['mean_accepted'], '5.2f')} {f(s['retrieval_ms_p50'], '7.2f')} "
                     f"{f(s['retrieval_ms_p99'], '7.2f')} {f(s['identical_to_ar'], '5.2f')}")
    return "\n".join(lines)


def plot(report: dict, path) -> None:
    """Tokens per second and mean accepted tokens per step, one bar per method."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(report["methods"])
    rates = [report["methods"][m]["tokens_per_s"] or 0.0 for m in names]
    accepted = [report["methods"][m]["mean_accepted"] or 0.0 for m in names]
    fig, (a, b) = plt.subplots(1, 2, figsize=(9, 3.6))
    a.bar(names, rates, color="#4C72B0")
    a.set_ylabel("tokens / s (decoding)")
    b.bar(names, accepted, color="#DD8452")
    b.set_ylabel("mean accepted tokens / step (M)")
    for ax, vals in ((a, rates), (b, accepted)):
        for x, v in enumerate(vals):
            ax.text(x, v, f"{v:.2f}", ha="center", va="bottom", fontsize=8)
    fig.suptitle(f"{report['model']} ({report['precision']}, {report['device']}), {report['n_prompts']} prompts, "
                 f"{report['max_new_tokens']} new tokens", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
