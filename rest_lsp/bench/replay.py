"""`rest-lsp replay`: evaluate draft policies offline, exactly, in seconds.

Greedy speculative decoding emits exactly the greedy sequence. So the tokens a step accepts are the longest
path of its draft tree that matches the true greedy continuation, and replaying recorded greedy outputs
gives every step of a real run without the model: the draft tree built from the same context (prompt plus
output so far), the accepted path, the emitted tokens, hence M (tokens per model step), the tree sizes q,
and a projected speedup from a cost table c(q):

    projected speedup = (decoded tokens * c(1)) / sum over steps of (c(q_step) + retrieval ms)

Recording runs the model once (greedy, the engine's own verifier, one token per forward) and stores the
prompt ids, the output ids and the model's top-k after each output token (for the recycling source, which
in the replay sees only the rows of the true path; a real run also sees the rejected draft rows).
The drafts come from the engine's own `Drafter` (rest_lsp/engine/drafter.py), driven as the engine drives it
(begin, draft, record, observe_forward, observe, finish), so for deterministic sources the replayed steps
equal a real run's steps (tests assert it).
"""
from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

import numpy as np

from rest_lsp.filenames import safe_filename
from restbase.storage import atomic_file

if TYPE_CHECKING:
    from rest_lsp.engine.drafter import Drafter

RECORD_KIND = "rest-lsp-replay"
RECORD_VERSION = 1
# c(q) in ms on the 2-core development CPU, Qwen2.5-Coder-0.5B fp32 through the `screened` verifier (the fast
# CPU path), 300-token cache, median of 5, idle (benchmarks/cost_curve.py; the README's c(q) table): the
# default cost table when a record carries no measured one.
DEFAULT_CPU_COST = {"qs": [1, 2, 4, 5, 8, 12, 16, 24, 32, 48, 64],
                    "ms": [101.0, 104.0, 101.0, 84.0, 115.0, 119.0, 143.0, 208.0, 264.0, 351.0, 478.0]}


@dataclass
class Record:
    """One prompt's greedy run. `output_ids` runs LOOKAHEAD tokens past `max_new_tokens` (unless an end
    token came first, kept in `end_token`): a real run's last step accepts drafts past the limit before its
    output is cut, and the engine learns from those too, so the replay needs them to stay exact."""

    id: str
    prompt_ids: list[int]
    output_ids: list[int]  # greedy tokens, end token excluded
    topk: list[list[int]] = field(default_factory=list)  # [len(output), k]: top-k after each output token
    stop_reason: str = "max_tokens"
    max_new_tokens: int | None = None  # the run's length limit (None: all of output_ids)
    end_token: int | None = None  # the end token that stopped greedy decoding, if one did
    # the requester's stop rules (not saved): given the output so far, how many of its tokens a run keeps once
    # a rule fires (the engine's StopChecker with the daemon's max_lines, stop_text, stop_fn), else None
    stop: Callable[[list[int]], int | None] | None = field(default=None, repr=False, compare=False)

    @property
    def greedy(self) -> list[int]:
        """What plain greedy decoding returns for this prompt."""
        return self.output_ids[: self.max_new_tokens]


def stop_rules(config, tokenizer) -> Callable[[list[int]], int | None]:
    """`Record.stop` for a requester's GenerationConfig (its max_new_tokens, max_lines, stop_text, stop_fn),
    checked by the engine's own StopChecker: given the output so far, the tokens a run keeps once a rule
    fires, else None. tokenizer: anything with `decode(ids, skip_special_tokens=False)`."""
    from rest_lsp.engine.stops import StopChecker

    checker = StopChecker(config, tokenizer, set(), 0.0)

    def stop(out: list[int]) -> int | None:
        return len(checker.final_tokens) if checker.check(out, None) else None

    return stop


# ---------------------------------------------------------------------------------------- recording
LOOKAHEAD = 16  # more than a draft path's depth (draft_len 10) plus the model's own next token


def greedy_record(loaded, prompt_ids: Sequence[int], max_new_tokens: int, k: int = 8,
                  lookahead: int = LOOKAHEAD) -> Record:
    """Plain greedy decoding through the engine's verifier, keeping the top-k of every output row."""
    import torch

    from rest_lsp.engine.verifier import HFVerifier, chain_mask

    v = HFVerifier(loaded.model, loaded.device)
    stop = set(loaded.stop_ids)
    n = len(prompt_ids)
    with torch.inference_mode():
        row = v.forward(torch.tensor(list(prompt_ids)), torch.arange(n), chain_mask(n))[-1]
        out: list[int] = []
        topk: list[list[int]] = []
        reason, end = "max_tokens", None
        while len(out) < max_new_tokens + lookahead:
            tok = int(row.argmax())
            if tok in stop:
                reason = "eos" if len(out) < max_new_tokens else reason
                end = tok
                break
            out.append(tok)
            row = v.forward(torch.tensor([tok]), torch.zeros(1, dtype=torch.long), chain_mask(1))[-1]
            topk.append(row.topk(k).indices.tolist())
    return Record("", list(prompt_ids), out, topk, reason, max_new_tokens, end)


def record_prompts(loaded, prompts, max_new_tokens: int, path: Path, *, prompts_spec: str, k: int = 8,
                   cost: dict | None = None, tokenizer: str | None = None,
                   log: Callable[[str], None] | None = None) -> list[Record]:
    """Record greedy outputs for every prompt into a JSONL file (written atomically)."""
    log = log or (lambda s: None)
    records = []
    for i, p in enumerate(prompts):
        t = time.perf_counter()
        ids = loaded.build_prompt(p.prefix, p.suffix, max_new_tokens=max_new_tokens)
        rec = greedy_record(loaded, ids, max_new_tokens, k)
        rec.id = p.id
        records.append(rec)
        log(f"recorded [{i + 1}/{len(prompts)}] {p.id}: {len(rec.output_ids)} tokens, {time.perf_counter() - t:.1f} s")
    header = {"kind": RECORD_KIND, "version": RECORD_VERSION, "model": loaded.name,
              "precision": loaded.precision, "device": str(loaded.device), "prompts": prompts_spec,
              "n_prompts": len(prompts), "max_new_tokens": max_new_tokens, "topk": k, "cost_ms": cost,
              "tokenizer": tokenizer}
    write_records(path, header, records)
    return records


def write_records(path: Path, header: dict, records: Sequence[Record]) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_file(path, text=True) as f:
        f.write(json.dumps(header) + "\n")
        for r in records:
            f.write(json.dumps({"id": r.id, "prompt_ids": r.prompt_ids, "output_ids": r.output_ids,
                                "topk": r.topk, "stop_reason": r.stop_reason,
                                "max_new_tokens": r.max_new_tokens, "end_token": r.end_token}) + "\n")


def read_records(path: Path) -> tuple[dict, list[Record]]:
    path = Path(path)
    with path.open(encoding="utf-8") as f:
        lines = [ln for ln in f if ln.strip()]
    if not lines:
        raise ValueError(f"{path} is empty")
    header = json.loads(lines[0])
    if header.get("kind") != RECORD_KIND:
        raise ValueError(f"{path} is not a rest-lsp replay record")
    recs = []
    for ln in lines[1:]:
        o = json.loads(ln)
        recs.append(Record(o["id"], o["prompt_ids"], o["output_ids"], o.get("topk") or [],
                           o.get("stop_reason", "max_tokens"), o.get("max_new_tokens"), o.get("end_token")))
    return header, recs


def record_key(model_name: str, precision: str, prompts_spec: str, limit, max_new_tokens: int) -> str:
    """A file name for the default record of this model, precision, prompts, limit and length."""
    p = Path(prompts_spec)
    ident = prompts_spec
    if p.is_file():  # a prompts file: its content decides
        ident = hashlib.sha256(p.read_bytes()).hexdigest()[:16]
    raw = f"{model_name}|{precision}|{ident}|{limit}|{max_new_tokens}"
    safe = safe_filename(Path(model_name).name)[:40]
    return f"{safe}-{precision}-{hashlib.sha256(raw.encode()).hexdigest()[:16]}"


# ---------------------------------------------------------------------------------------- cost tables
def cost_model(spec: str | None, header: dict | None = None):
    """'cpu' (the table measured on the development CPU), 'flat' (a GPU-like curve), 'record' (the
    c(q) measured while recording), or a JSON file {"qs": [...], "ms": [...]} (e.g. a bench report's cost_ms)."""
    from rest_lsp.engine.cost import CostModel

    if spec in (None, "auto"):
        spec = "record" if header and header.get("cost_ms") else "cpu"
    if spec == "cpu":
        d = DEFAULT_CPU_COST
    elif spec == "flat":
        return CostModel.flat()
    elif spec == "record":
        d = (header or {}).get("cost_ms")
        if not d:
            raise ValueError("the record carries no measured c(q) (record with --measure-cost)")
    else:
        obj = json.loads(Path(spec).read_text())
        d = obj.get("cost_ms", obj) if isinstance(obj, dict) else None
        if not d or "qs" not in d:
            raise ValueError(f"{spec}: expected {{\"qs\": [...], \"ms\": [...]}} or a bench report with cost_ms")
    return CostModel([int(q) for q in d["qs"]], [float(m) for m in d["ms"]])


# ---------------------------------------------------------------------------------------- replay
@dataclass
class Step:
    q: int  # tokens verified (root + draft nodes)
    emitted: int  # tokens this step emits (accepted draft tokens + the model's next token)
    accepted: int  # accepted draft tokens
    retrieval_ms: float
    sources: list[str]  # the source of each accepted node
    covered: int = 0  # true tokens the step's full trie held (>= accepted)


def replay_one(rec: Record, drafter, budget: int | None, cost) -> list[Step]:
    """Every decoding step of a greedy speculative run on this record (the prefill not included), its prompt
    prefilled in full: a prompt the engine's cache holds but for at most FIRST_STEP_TOKENS tokens starts with a
    first step that drafts too (rest_lsp/engine/generate.py), which a replay does not model.

    Mirrors `Engine.advance` (drafter: a rest_lsp.engine.Drafter; cost: c(q) for an automatic budget): stop
    before a step once the output holds the end token or the length
    limit; a step's emitted tokens are cut at the end token and at the limit (`Step.emitted`), while its
    accepted count and what the sources and the calibration see are the step's full outcome. `rec.stop`
    is checked where the engine checks its stop rules (after the first token and after every step); the
    tokens it cuts come off the last steps' counts, as the engine trims them."""
    out = list(rec.output_ids) + ([rec.end_token] if rec.end_token is not None else [])
    limit = rec.max_new_tokens if rec.max_new_tokens is not None else len(rec.output_ids)
    if not out or limit <= 0:
        return []
    drafter.begin(rec.prompt_ids)
    drafter.observe([out[0]])
    context = list(rec.prompt_ids) + [out[0]]
    i = 0  # out[i] is the pending root: i + 1 tokens are out
    steps: list[Step] = []
    keep = rec.stop(out[:1]) if rec.stop is not None else None
    while keep is None and i + 1 < limit and i + 1 < len(out) and out[i] != rec.end_token:
        t0 = time.perf_counter()
        tree = drafter.draft(context, budget, cost)
        ms = (time.perf_counter() - t0) * 1000
        kids = tree.children()
        path = [0]
        while i + len(path) < len(out) and (c := kids[path[-1]].get(out[i + len(path)])) is not None:
            path.append(c)
        new = out[i + 1: i + len(path) + 1]  # the accepted nodes, then the model's own next token
        kept = new[: max(0, limit - i - 1)]
        if rec.end_token is not None and rec.end_token in kept:
            kept = kept[: kept.index(rec.end_token)]
        steps.append(Step(len(tree), len(kept), len(path) - 1, ms, [tree.sources[c] for c in path[1:]],
                          drafter.covered(out[i + 1:])))
        drafter.record(tree, path)
        if drafter.topk and rec.topk:  # the recorded top-k of the true path's rows (a chain)
            rows = [rec.topk[i + d] for d in range(len(path)) if i + d < len(rec.topk)]
            for s, _ in drafter.sources:
                if s.topk:
                    s.observe_forward([tree.tokens[c] for c in path][: len(rows)], rows)
        drafter.observe(new)
        context += new
        i += len(new)
        keep = rec.stop(out[: i + 1]) if rec.stop is not None else None
    if keep is not None:
        excess = 1 + sum(x.emitted for x in steps) - max(1, keep)  # the first token is the prefill's
        for x in reversed(steps):
            take = min(excess, x.emitted)
            x.emitted -= take
            excess -= take
    drafter.finish()
    return steps


def evaluate(records: Sequence[Record], policy: str, budget: int | None, cost, *, corpus=None,
             repository=None, history: Sequence[int] | None = None, max_draft_nodes: int = 64,
             draft_len: int = 10, acceptance_lr: float | None = None,
             prepare: Callable[[Record, Drafter], None] | None = None) -> dict:
    """M, tree sizes, projected speedup, histogram and sources for one policy at one budget. The records
    run in order through one drafter, as prompts through one long-running engine; `history`: tokens of
    earlier output the history source starts with (`rest_lsp.engine.history.load_history`); `prepare`:
    called before each record with the drafter, to set what a daemon would hold for that prompt (the
    document as an open buffer, the workspace it belongs to)."""
    from rest_lsp.engine.acceptance import DEFAULT_LR
    from rest_lsp.engine.drafter import Drafter
    from rest_lsp.engine.policy import make_sources, shares
    from rest_lsp.engine.sources import HistorySource

    t = time.perf_counter()
    warm = HistorySource()
    if history is not None:
        warm.extend(history)
    sources = make_sources(policy, corpus=corpus, repository=repository, history=warm)
    drafter = Drafter(sources, max_draft_nodes=max_draft_nodes, draft_len=draft_len,
                      acceptance_lr=DEFAULT_LR if acceptance_lr is None else acceptance_lr)
    steps: list[Step] = []
    per_prompt = []
    for rec in records:
        if prepare is not None:
            prepare(rec, drafter)
        s = replay_one(rec, drafter, budget, cost)
        steps += s
        per_prompt.append({"id": rec.id, "steps": len(s), "tokens": sum(x.emitted for x in s),
                           "mean_accepted": (sum(x.emitted for x in s) / len(s)) if s else None})
    tokens = sum(x.emitted for x in steps)
    c1 = cost(1)
    spec_ms = sum(cost(x.q) for x in steps)
    retr = [x.retrieval_ms for x in steps]
    hist: dict[int, int] = {}
    by_token: dict[str, int] = {}
    by_run: dict[str, int] = {}
    for x in steps:
        hist[x.accepted] = hist.get(x.accepted, 0) + 1
        for name in x.sources:
            by_token[name] = by_token.get(name, 0) + 1
        if x.sources:  # a run is credited to the source of its deepest accepted node
            by_run[x.sources[-1]] = by_run.get(x.sources[-1], 0) + 1
    return {
        "policy": policy,
        "sources": shares(drafter.sources),
        "budget": "auto" if budget is None else budget,
        "steps": len(steps),
        "tokens": tokens,
        "mean_accepted": tokens / len(steps) if steps else None,
        # tokens per step had every step taken the best path its sources offered (the same steps): the
        # ceiling of ranking; the gap to mean_accepted is what a better choice of nodes could still win
        "covered_mean_accepted": float(np.mean([1 + x.covered for x in steps])) if steps else None,
        "mean_tree_nodes": float(np.mean([x.q - 1 for x in steps])) if steps else None,
        "projected_speedup": (tokens * c1) / (spec_ms + sum(retr)) if steps else None,
        "projected_speedup_no_retrieval": (tokens * c1) / spec_ms if steps else None,
        "retrieval_ms_p50": float(np.percentile(retr, 50)) if retr else None,
        "retrieval_ms_p99": float(np.percentile(retr, 99)) if retr else None,
        "accepted_histogram": {str(k): hist[k] for k in sorted(hist)},
        "accepted_tokens_by_source": by_token,
        "runs_by_source": by_run,
        "seconds": time.perf_counter() - t,
        "per_prompt": per_prompt,
    }


def format_table(results: Sequence[dict]) -> str:
    head = (f"{'policy':<40} {'budget':>6} {'M':>5} {'cover':>5} {'nodes':>6} {'proj.x':>6} {'no-ret':>6} "
            f"{'ret p99':>7}  sources (accepted runs)")
    lines = [head, "-" * len(head)]

    def f(v, fmt):
        return format(v, fmt) if v is not None else format("-", ">" + fmt.split(".")[0])

    for r in results:
        runs = ", ".join(f"{k} {v}" for k, v in sorted(r["runs_by_source"].items(), key=lambda kv: -kv[1]))
        lines.append(f"{r['policy'][:40]:<40} {str(r['budget']):>6} {f(r['mean_accepted'], '5.2f')} "
                     f"{f(r.get('covered_mean_accepted'), '5.2f')} {f(r['mean_tree_nodes'], '6.1f')} {f(r['projected_speedup'], '6.2f')} "
                     f"{f(r['projected_speedup_no_retrieval'], '6.2f')} {f(r['retrieval_ms_p99'], '7.2f')}  {runs}")
    return "\n".join(lines)
