"""Where a drafting step's time goes: each source's `propose_rows` and the compiled rest of the step (the trie,
the acceptance estimate, the ranking, the budget and the flattening: `draft_arrays`), per step, over a replay
record (no model needed).

    .venv/bin/python benchmarks/profile_drafting.py --record REPLAY.jsonl --datastore corpus \
        [--policy rest] [--budget auto] [--cost FILE] [--repeat 1] [--thrash-mb 0]

REPLAY.jsonl: a record of `rest-lsp replay` (it prints the path: `<cache>/replay/*.jsonl`). The steps are the
replay's (rest_lsp/bench/replay.py), the drafting the engine's own Drafter; each part is timed by wrapping
it, so the total is a little above the replay's own `retrieval_ms`. Prints p50 / p99 / mean ms per step.
`--thrash-mb N` reads N MB before every step, outside the timers, as a CPU forward pass streams the model's
weights through the caches between two drafts in `rest-lsp bench`: the drafting then runs cold, as there.
"""
from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's packages, not an editable install's


def _timed(name: str, fn, times: dict):
    def wrapper(*a, **kw):
        t = time.perf_counter()
        try:
            return fn(*a, **kw)
        finally:
            times[name][-1] += (time.perf_counter() - t) * 1000

    return wrapper


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--record", required=True)
    p.add_argument("--datastore", default=None)
    p.add_argument("--repo", default=None, help="a repository directory, indexed into a temporary datastore")
    p.add_argument("--policy", default="rest")
    p.add_argument("--budget", default="auto")
    p.add_argument("--cost", default=None)
    p.add_argument("--repeat", type=int, default=1, help="replay the records this many times (more steps)")
    p.add_argument("--thrash-mb", type=int, default=0, help="MB read before each step (a forward pass's traffic)")
    args = p.parse_args(argv)

    import tempfile

    from indexer.store import Datastore
    import rest_lsp.engine.drafter as drafter_mod
    from rest_lsp.bench.cli import recorded_tokenizer
    from rest_lsp.bench.replay import cost_model, read_records, replay_one
    from rest_lsp.engine.drafter import Drafter
    from rest_lsp.engine.policy import make_sources

    header, records = read_records(Path(args.record))
    tok = recorded_tokenizer(header)
    corpus = Datastore.open(Path(args.datastore), tokenizer=tok, verify=False) if args.datastore else None
    if corpus is not None:
        corpus.prefault()  # as the daemon and `rest-lsp replay` do
    tmp = tempfile.TemporaryDirectory(prefix="rest-profile.")
    repo = Datastore.build([Path(args.repo)], Path(tmp.name) / "repo", tokenizer=tok) if args.repo else None
    cost = cost_model(args.cost, header)
    budget = None if args.budget == "auto" else int(args.budget)

    times: dict[str, list[float]] = defaultdict(list)
    # the engine's drafter cuts ids past the model's vocabulary (here the datastores' tokenizer's size)
    store = corpus if corpus is not None else repo
    vocab = store.fingerprint.get("vocab_size") if store is not None else None
    drafter = Drafter(make_sources(args.policy, corpus=corpus, repository=repo), vocab_size=vocab)
    for s, _ in drafter.sources:  # the drafter asks for rows (`propose_rows`)
        s.propose_rows = _timed(f"propose {s.name}", s.propose_rows, times)
    # the rest of the step is one compiled call: clip, trie, estimate, ranking, budget, flattening
    drafter_mod.draft_arrays = _timed("draft_arrays", drafter_mod.draft_arrays, times)
    keys = [f"propose {s.name}" for s, _ in drafter.sources] + ["draft_arrays"]
    draft = drafter.draft
    junk = np.ones(args.thrash_mb << 18, dtype=np.float32)  # 2^18 float32 = 1 MB

    def timed_draft(*a, **kw):
        junk.sum()
        for k in keys + ["draft"]:
            times[k].append(0.0)
        return _timed("draft", draft, times)(*a, **kw)

    drafter.draft = timed_draft
    steps = 0
    for _ in range(args.repeat):
        for rec in records:
            steps += len(replay_one(rec, drafter, budget, cost))
    print(f"{steps} steps over {len(records)} records x {args.repeat}; policy {args.policy}, budget {args.budget}, "
          f"{args.thrash_mb} MB read before each step")
    print(f"{'part':<24} {'p50 ms':>8} {'p99 ms':>8} {'mean ms':>8}")
    for k in keys + ["draft"]:
        v = np.asarray(times[k])
        print(f"{k:<24} {np.percentile(v, 50):8.3f} {np.percentile(v, 99):8.3f} {v.mean():8.3f}")
    # what the tail is made of: the p99 of the whole step is not the sum of the parts' p99s
    total = np.asarray(times["draft"])
    slow = total >= np.percentile(total, 95)
    print(f"the slowest 5% of steps ({int(slow.sum())}), median ms per part: " + ", ".join(
        f"{k} {np.median(np.asarray(times[k])[slow]):.3f}" for k in keys + ["draft"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
