"""Verification cost c(q) on this machine: one forward of q new tokens after a `past`-token KV cache.

Prints, per verifier kind, the median milliseconds for q = 1..64 and the ratio c(q)/c(1), and optionally the
torch.profiler per-operator breakdown of one verification forward. Same model, same precision for every kind.

    .venv/bin/python benchmarks/cost_curve.py --quick --plain 24            # a few minutes: eager, packed, screened
    .venv/bin/python benchmarks/cost_curve.py --kinds eager,packed,compiled --json cost.json
    .venv/bin/python benchmarks/cost_curve.py --kinds packed --profile 8     # where the time goes at q=8
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

FULL_QS = (1, 2, 3, 4, 5, 6, 8, 12, 16, 24, 32, 48, 64)
QUICK_QS = (1, 2, 4, 8, 16)


def random_tree(q: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """A random draft tree of q nodes in topological order: (depths [q], mask [q, q] bool)."""
    from rest_lsp.engine.tree import DraftTree

    parents = [-1] + [int(torch.randint(0, i, (1,), generator=gen)) for i in range(1, q)]
    depths = [0] * q
    for i in range(1, q):
        depths[i] = depths[parents[i]] + 1
    _, depth_t, mask = DraftTree([0] * q, parents, depths, [1.0] * q, [""] * q).tensors()
    return depth_t, mask


def prefill(verifier, context: torch.Tensor) -> None:
    past = len(context)
    verifier.truncate(0)
    verifier.forward(context, torch.arange(past), torch.ones(past, past, dtype=torch.bool).tril_(), prompt=True)


@torch.inference_mode()
def cost_curves(verifiers: dict, vocab: int, qs, past: int, repeats: int,
                clock=time.perf_counter, sync=lambda: None) -> dict[str, dict[int, float]]:
    """Median ms of a q-token forward per verifier and q. Every round visits every q and every verifier in
    turn, so a burst of load from other processes spreads over all cells instead of spoiling one. sync: waits
    for the device (a GPU runs asynchronously: torch.cuda.synchronize)."""
    gen = torch.Generator().manual_seed(0)
    context = torch.randint(0, vocab, (past,), generator=gen)
    for v in verifiers.values():
        prefill(v, context)
    trees = {q: random_tree(q, gen) for q in qs}
    times: dict[str, dict[int, list[float]]] = {k: {q: [] for q in qs} for k in verifiers}
    for r in range(repeats + 1):  # round 0 is a warm-up (and compiles the buckets)
        for q in qs:
            depths, mask = trees[q]
            tokens = torch.randint(0, vocab, (q,), generator=gen)
            for k, v in verifiers.items():
                sync()
                t = clock()
                v.forward(tokens, depths, mask)
                sync()
                dt = clock() - t
                v.truncate(past)
                if r:
                    times[k][q].append(dt * 1e3)
        print(f"  round {r}/{repeats} done", flush=True)
    out = {k: {q: statistics.median(times[k][q]) for q in qs} for k in verifiers}
    for q in qs:
        print(f"  q={q:3d}  " + "  ".join(
            f"{k} {out[k][q]:7.1f} ms (min {min(times[k][q]):.1f})" for k in verifiers), flush=True)
    return out


@torch.inference_mode()
def profile_forward(verifier, vocab: int, q: int, past: int, top: int = 20) -> list[dict]:
    """Per-operator self CPU time of one q-token forward (median-ish: the third of three calls)."""
    from torch.profiler import ProfilerActivity, profile

    gen = torch.Generator().manual_seed(1)
    prefill(verifier, torch.randint(0, vocab, (past,), generator=gen))
    depths, mask = random_tree(q, gen)
    for _ in range(2):
        verifier.forward(torch.randint(0, vocab, (q,), generator=gen), depths, mask)
        verifier.truncate(past)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        verifier.forward(torch.randint(0, vocab, (q,), generator=gen), depths, mask)
    verifier.truncate(past)
    rows = []
    events = sorted(prof.key_averages(group_by_input_shape=True), key=lambda e: e.self_cpu_time_total,
                    reverse=True)
    total = sum(e.self_cpu_time_total for e in events)
    for e in events[:top]:
        rows.append({"op": e.key, "shapes": str(e.input_shapes)[:60], "calls": e.count,
                     "self_ms": e.self_cpu_time_total / 1e3, "share": e.self_cpu_time_total / max(total, 1)})
    return rows


PLAIN_PROMPT = 'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n'


def plain_prompt(tokenizer, vocab: int, past: int = 0) -> list[int]:
    """PLAIN_PROMPT's ids, after random ids up to `past` tokens in all: a step's attention then spans what
    llama-bench's `-d past` gives its decoding (the cost of a step grows with the cached tokens)."""
    ids = tokenizer.encode(PLAIN_PROMPT)
    filler = torch.randint(0, vocab, (max(0, past - len(ids)),), generator=torch.Generator().manual_seed(2))
    return filler.tolist() + ids


@torch.inference_mode()
def plain_decoding(verifier, prompt_ids: list[int], n: int, clock=time.perf_counter) -> tuple[list[int], float]:
    """Greedy plain decoding (one token per forward): the tokens and the median ms per token."""
    verifier.truncate(0)
    p = len(prompt_ids)
    logits = verifier.forward(torch.tensor(prompt_ids), torch.arange(p), torch.ones(p, p, dtype=torch.bool).tril_())
    out = [int(logits[-1].argmax())]
    one, zero = torch.ones(1, 1, dtype=torch.bool), torch.zeros(1, dtype=torch.long)
    times = []
    while len(out) < n:
        t = clock()
        logits = verifier.forward(torch.tensor(out[-1:]), zero, one)
        out.append(int(logits[-1].argmax()))
        times.append((clock() - t) * 1e3)
    return out, statistics.median(times)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None, help="model spec for load_model (default: the embedded model)")
    p.add_argument("--precision", default="fp32")
    p.add_argument("--kinds", default="eager,packed,screened", help="comma list of make_verifier kinds")
    p.add_argument("--qs", default=None, help="comma list of q (default 1..64 in 13 steps; --quick: 1,2,4,8,16)")
    p.add_argument("--past", type=int, default=300, help="cached tokens before each forward")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    p.add_argument("--quick", action="store_true", help="q in 1,2,4,8,16 and 3 repeats")
    p.add_argument("--profile", type=int, default=None, metavar="Q", help="also profile one forward of Q tokens")
    p.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                   help="wall time, or this process's CPU time (steadier on a shared machine with --threads 1)")
    p.add_argument("--buckets", default=None, help="compiled kind: comma list of q buckets (default 1,2,4,8,16)")
    p.add_argument("--mode", default="max-autotune", help="compiled kind: torch.compile mode")
    p.add_argument("--min-rows", type=int, default=None, help="packed/screened kinds: pad products to this many rows")
    p.add_argument("--plain", type=int, default=0, metavar="N",
                   help="also decode N tokens greedily one at a time per kind (ms/token; same tokens?)")
    p.add_argument("--plain-past", type=int, default=0, metavar="N",
                   help="--plain decodes after a prompt of N tokens (random ids, then the short code prompt), as "
                        "llama-bench -d N does; default: the short prompt alone")
    p.add_argument("--json", default=None, help="write the figures here")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    qs = tuple(int(x) for x in args.qs.split(",")) if args.qs else (QUICK_QS if args.quick else FULL_QS)
    repeats = 3 if args.quick and args.repeats == 5 else args.repeats

    from rest_lsp.model.verifiers import make_verifier
    from rest_lsp.model.host import load_model

    t = time.perf_counter()
    loaded = load_model(args.model, device="cpu", precision=args.precision)
    print(f"model {loaded.name} {loaded.precision}: loaded in {time.perf_counter() - t:.1f} s; "
          f"torch {torch.__version__}, {torch.get_num_threads()} threads, {platform.processor() or platform.machine()}",
          flush=True)
    vocab = loaded.vocab_size
    report = {"clock": args.clock, "model": loaded.name, "precision": loaded.precision, "past": args.past, "repeats": repeats,
              "threads": torch.get_num_threads(), "torch": torch.__version__, "kinds": {}}
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    verifiers = {}
    for kind in args.kinds.split(","):
        extra = {}
        if args.min_rows and kind in ("packed", "screened", "auto"):
            extra["min_rows"] = args.min_rows
        if kind == "compiled":
            extra["mode"] = args.mode
            if args.buckets:
                extra["buckets"] = tuple(int(x) for x in args.buckets.split(","))
        t = time.perf_counter()
        verifier = make_verifier(loaded, kind, max_len=max(args.past + max(qs), args.plain_past + args.plain) + 16, **extra)
        setup = time.perf_counter() - t
        warm = verifier.warm_up() if hasattr(verifier, "warm_up") else {}
        print(f"{kind} ({type(verifier).__name__}): set up in {setup:.1f} s"
              + (f"; compile per bucket {', '.join(f'q{b}: {s:.0f} s' for b, s in warm.items())}" if warm else ""),
              flush=True)
        verifiers[kind] = verifier
        report["kinds"][kind] = {"setup_s": setup, "compile_s": warm}
    curves = cost_curves(verifiers, vocab, qs, args.past, repeats, clock)
    for kind, verifier in verifiers.items():
        entry = report["kinds"][kind]
        ms = curves[kind]
        entry.update(ms=ms, ratio={q: ms[q] / ms[qs[0]] for q in qs})
        if args.plain:
            tokens, per_token = plain_decoding(verifier, plain_prompt(loaded.tokenizer, vocab, args.plain_past),
                                               args.plain, clock)
            entry["plain_ms_per_token"], entry["plain_tokens"] = per_token, tokens
            print(f"  {kind} plain decoding: {per_token:.1f} ms/token over {args.plain} tokens", flush=True)
        if args.profile:
            entry["profile"] = profile_forward(verifier, vocab, args.profile, args.past)

    kinds = list(report["kinds"])
    print(f"\nc(q) in ms after a {args.past}-token cache, median of {repeats} "
          f"({torch.get_num_threads()} threads; ratio to q={qs[0]} in brackets)")
    print("| q | " + " | ".join(kinds) + " |")
    print("|---|" + "---|" * len(kinds))
    for q in qs:
        cells = [f"{report['kinds'][k]['ms'][q]:.0f} ({report['kinds'][k]['ratio'][q]:.2f})" for k in kinds]
        print(f"| {q} | " + " | ".join(cells) + " |")
    if args.plain:
        first = report["kinds"][kinds[0]]["plain_tokens"]
        print(f"\nplain decoding of {args.plain} tokens, ms/token: "
              + ", ".join(f"{k} {report['kinds'][k]['plain_ms_per_token']:.0f}" for k in kinds)
              + "; same tokens as " + kinds[0] + ": "
              + ", ".join(f"{k} {report['kinds'][k]['plain_tokens'] == first}" for k in kinds[1:]))
        print("text:", repr(loaded.tokenizer.decode(first)))
    for k in kinds:
        for row in report["kinds"][k].get("profile", []):
            if row is report["kinds"][k]["profile"][0]:
                print(f"\nprofile of one q={args.profile} forward, {k}: self CPU time by operator")
                print("| operator | input shapes | calls | ms | share |\n|---|---|---|---|---|")
            print(f"| {row['op']} | {row['shapes']} | {row['calls']} | {row['self_ms']:.1f} | {row['share']:.0%} |")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
        print(f"\nwrote {args.json}")


if __name__ == "__main__":
    main()
