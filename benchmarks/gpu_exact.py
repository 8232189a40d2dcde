"""Exactness on a device: REST emits what plain greedy decoding emits, with the tiny models (no download).

For the tiny Qwen2 and CodeLlama-layout models (built here), each precision and verifier: fill-in-the-middle
prompts in every order the family supports (psm; CodeLlama also spm), plain decoding through the verifier, then
REST through a fresh engine on the same verifier kind with drafts from the context (holding the model's
earlier answer, so long drafts get verified and accepted), a corpus datastore in the model's own tokenizer and
the model's recycled top-k, the tree size chosen per step from c(q) calibrated on the device. In fp32 the
plain output is also checked against transformers' forward recomputed without a cache (independent code).

    python benchmarks/gpu_exact.py --device cuda --json exact.json        (benchmarks/gpu_check.sh runs it)

Exit status 1 when REST through the `static` verifier (the daemon's on a GPU) differs from plain decoding
through it, or its fp32 plain output from transformers'; `eager` (transformers' forward) is reported, not
required: its kernels differ per batch shape, so in bf16 its tree rows need not round as its plain rows do.
"""
from __future__ import annotations

import argparse
import inspect
import json
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def fim_cases(n: int) -> list[tuple[str, str]]:
    """(prefix, suffix) cut out of real code at line starts inside function bodies."""
    import argparse as m1
    import json.decoder as m2

    cases = []
    for mod in (m2, m1, textwrap):
        lines = inspect.getsource(mod).split("\n")
        for i in range(40, len(lines) - 40, 97):
            if lines[i].startswith("        ") and lines[i].strip():
                indent = lines[i][: len(lines[i]) - len(lines[i].lstrip())]
                cases.append(("\n".join(lines[max(0, i - 40): i]) + "\n" + indent,
                              "\n" + "\n".join(lines[i + 1: i + 12]) + "\n"))
            if len(cases) >= n:
                return cases
    return cases


@torch.no_grad()
def recompute(model, prompt: list[int], n: int, stop: set[int]) -> list[int]:
    """Plain greedy decoding by transformers' forward over the whole sequence, every token (no KV cache)."""
    seq = list(prompt)
    dev = next(model.parameters()).device
    for _ in range(n):
        t = int(model(torch.tensor([seq], device=dev)).logits[0, -1].argmax())
        if t in stop:
            break
        seq.append(t)
    return seq[len(prompt):]


def run_family(family: str, model_dir: Path, device: str, precision: str, kinds, cases, n: int, corpus_src: Path,
               tmp: Path) -> list[dict]:
    from indexer.store import Datastore

    from rest_lsp.engine import ContextSource, Engine, GenerationConfig
    from rest_lsp.engine.sources import DatastoreSource, RecyclingSource
    from rest_lsp.model.host import load_model
    from rest_lsp.model.verifiers import make_verifier_or_eager, verifier_kind

    lm = load_model(model_dir, device=device, precision=precision)
    corpus = Datastore.build([corpus_src], tmp / f"corpus-{family}-{precision}", tokenizer=lm.indexer_tokenizer)
    prompts = [(order, lm.build_prompt(pre, suf, order=order, max_new_tokens=n))
               for pre, suf in cases for order in lm.fim.orders]
    rows = []
    for kind in kinds:
        plain_engine = Engine(lm, (), verifier=make_verifier_or_eager(lm, kind))
        context = ContextSource()
        rest_engine = Engine(lm, [(context, 0.5), (DatastoreSource(corpus), 0.3), (RecyclingSource(), 0.2)],
                             verifier=make_verifier_or_eager(lm, kind))
        rest_engine.calibrate()   # c(q) measured on the device (cached), before any timing
        same = hf_same = hf_checked = steps = tokens = plain_tokens = 0
        plain_s = rest_s = 0.0
        mismatches = []
        for i, (order, ids) in enumerate(prompts):
            t = time.perf_counter()
            plain = plain_engine.generate(ids, GenerationConfig(max_new_tokens=n))
            plain_s += time.perf_counter() - t
            plain_tokens += len(plain.tokens)
            context.buffers = {}
            context.set_buffer("earlier answer", ids + plain.tokens)
            t = time.perf_counter()
            rest = rest_engine.generate(ids, GenerationConfig(max_new_tokens=n))   # tree size from c(q)
            rest_s += time.perf_counter() - t
            same += rest.tokens == plain.tokens
            if rest.tokens != plain.tokens:
                mismatches.append({"prompt": i, "order": order,
                                   "at": next((j for j, (a, b) in enumerate(zip(rest.tokens, plain.tokens)) if a != b),
                                              min(len(rest.tokens), len(plain.tokens)))})
            steps += rest.steps
            tokens += len(rest.tokens)
            if precision == "fp32" and i < 2:
                hf_checked += 1
                hf_same += recompute(lm.model, ids, n, set(lm.stop_ids)) == plain.tokens
        cost = rest_engine.cost
        rows.append({"family": family, "precision": precision, "verifier": verifier_kind(rest_engine.verifier),
                     "prompts": len(prompts), "rest_identical_to_plain": same, "mismatches": mismatches,
                     "plain_identical_to_transformers": f"{hf_same}/{hf_checked}" if hf_checked else "-",
                     "mean_accepted": tokens / steps if steps else None,
                     "plain_ms_per_token": 1000 * plain_s / max(1, plain_tokens),
                     "rest_ms_per_token": 1000 * rest_s / max(1, tokens),
                     "cost_ratio": {str(q): round(m / cost.ms[0], 3) for q, m in zip(cost.qs, cost.ms)} if cost else None,
                     "hf_ok": hf_same == hf_checked})
        r = rows[-1]
        print(f"| {family} | {precision} | {r['verifier']} | {same}/{len(prompts)} | {r['plain_identical_to_transformers']} "
              f"| {r['mean_accepted']:.2f} | {r['plain_ms_per_token']:.1f} | {r['rest_ms_per_token']:.1f} |", flush=True)
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--precisions", default="bf16,fp32")
    p.add_argument("--kinds", default="static,eager")
    p.add_argument("--prompts", type=int, default=3, help="FIM cases per family (each in every order it supports)")
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("gpu_exact.py: no CUDA device here (use --device cpu to try the script)", file=sys.stderr)
        return 2
    from testmodels.tiny import make_tiny_codellama_dir, make_tiny_model_dir

    kinds = [k for k in args.kinds.split(",") if k]
    cases = fim_cases(args.prompts)
    rows = []
    with tempfile.TemporaryDirectory(prefix="gpu-exact.") as tmp:
        tmp = Path(tmp)
        dirs = {"qwen2": make_tiny_model_dir(tmp / "qwen2"), "codellama": make_tiny_codellama_dir(tmp / "codellama")}
        print("| model | precision | verifier | REST = plain | plain = transformers (fp32) | M | plain ms/token | "
              "REST ms/token |\n|---|---|---|---|---|---|---|---|", flush=True)
        for family, d in dirs.items():
            for precision in args.precisions.split(","):
                rows += run_family(family, d, args.device, precision, kinds, cases, args.max_new_tokens,
                                   Path(json.__file__).parent, tmp)
    failed = [r for r in rows if r["verifier"] == "static"
              and (r["rest_identical_to_plain"] != r["prompts"] or not r["hf_ok"])]
    report = {"device": torch.cuda.get_device_name() if args.device.startswith("cuda") else args.device,
              "torch": torch.__version__, "max_new_tokens": args.max_new_tokens, "rows": rows,
              "static_exact": not failed}
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
    if failed:
        print(f"gpu_exact.py: the static verifier is NOT exact in {len(failed)} configuration(s): "
              + "; ".join(f"{r['family']} {r['precision']}: {r['mismatches'] or 'plain != transformers'}" for r in failed),
              file=sys.stderr)
        return 1
    print("static verifier: REST identical to plain decoding in every configuration", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
