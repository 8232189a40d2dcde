import json

import numpy as np
import pytest

from rest_lsp.bench.cli import replay_main
from rest_lsp.bench.prompts import load_prompts
from rest_lsp.bench.replay import LOOKAHEAD, evaluate, greedy_record, read_records, replay_one
from rest_lsp.engine.cost import CostModel
from rest_lsp.engine.drafter import Drafter
from rest_lsp.engine.policy import SHARES, PolicyError, make_sources, parse_policy

COST = CostModel([1, 2, 4, 8, 16, 64], [10.0, 11.0, 13.0, 20.0, 35.0, 120.0])


@pytest.fixture(scope="module")
def records(tiny_lm, prompts_file):
    recs = []
    for p in load_prompts(str(prompts_file)):
        r = greedy_record(tiny_lm, tiny_lm.build_prompt(p.prefix, p.suffix), 40)
        r.id = p.id
        recs.append(r)
    return recs


def test_record_is_plain_greedy(tiny_lm, records):
    import torch

    rec = records[0]
    with torch.no_grad():
        out = tiny_lm.model.generate(torch.tensor([rec.prompt_ids]), max_new_tokens=len(rec.output_ids),
                                     do_sample=False, eos_token_id=None, pad_token_id=0)
    assert out[0, len(rec.prompt_ids):].tolist() == rec.output_ids
    assert len(rec.topk) == len(rec.output_ids) and all(len(t) == 8 for t in rec.topk)
    # the top-1 after output token i is the next output token
    assert [t[0] for t in rec.topk[:-1]] == rec.output_ids[1:]
    assert rec.max_new_tokens == 40 and rec.greedy == rec.output_ids[:40]
    assert len(rec.output_ids) == 40 + LOOKAHEAD or rec.end_token is not None


@pytest.mark.parametrize("policy,budget", [("rest", 4), ("rest", None), ("context=1,corpus=1", 16),
                                           ("paper", 64), ("context=0.6,history=0.4", None), ("pld", 10)])
def test_replay_equals_a_real_engine_run(tiny_lm, records, corpus_dir, policy, budget):
    """The replayed steps are the steps a real speculative run takes (deterministic sources): the records
    go in order through one engine, and through one drafter, as prompts through a long-running daemon."""
    from indexer.store import Datastore
    from rest_lsp.engine import Engine, GenerationConfig

    corpus = Datastore.open(corpus_dir, tokenizer=str(tiny_lm.path))
    policy_sources = policy if policy != "rest" else "context=0.5,history=0.2,corpus=0.25"  # no recycle:
    # in a replay it sees only the true path's rows, a real run also the rejected ones
    drafter = Drafter(make_sources(policy_sources, corpus=corpus))
    engine = Engine(tiny_lm, make_sources(policy_sources, corpus=corpus), cost=COST,
                    eos_token_ids=tiny_lm.stop_ids)
    replayed, real, sizes = [], [], []
    for rec in records:
        steps = replay_one(rec, drafter, budget, COST)
        res = engine.generate(rec.prompt_ids, GenerationConfig(max_new_tokens=rec.max_new_tokens,
                                                               draft_budget=budget))
        assert res.tokens == rec.greedy
        real.append(list(res.accepted[1:]))
        replayed.append([s.emitted for s in steps])
        assert res.draft_sizes[: len(steps)] == [s.q - 1 for s in steps]
        sizes += res.draft_sizes
    assert replayed == real
    assert engine.drafter.calibration == drafter.calibration
    assert max(sizes) > 0, "the check should cover steps with drafts"
    if policy != "paper":  # the random tiny model never continues like the corpus, but it repeats itself
        assert any(max(r) > 1 for r in real), "the check should cover steps that accept drafts"


@pytest.mark.parametrize("budget", [4, None])
def test_replay_with_stop_rules_equals_a_real_engine_run(tiny_lm, records, budget):
    """A requester's stop rules (the daemon's max_lines, stop_text, stop_fn) in the replay: checked where the
    engine checks them, so the steps, the tokens each keeps and the output are a real run's."""
    import dataclasses

    from rest_lsp.bench.replay import stop_rules
    from rest_lsp.engine import Engine, GenerationConfig

    policy = "context=0.6,history=0.4"
    drafter = Drafter(make_sources(policy))
    engine = Engine(tiny_lm, make_sources(policy), cost=COST, eos_token_ids=tiny_lm.stop_ids)
    cut = []
    for rec, frac in [(rec, frac) for frac in (0.5, 0.3, 0.7, 0.85) for rec in records]:
        text = tiny_lm.tokenizer.decode(rec.greedy, skip_special_tokens=False)
        at = int(len(text) * frac)  # a rule that fires inside the output, at times inside a step
        config = GenerationConfig(max_new_tokens=rec.max_new_tokens, draft_budget=budget,
                                  stop_fn=lambda t, at=at: at if len(t) >= at else None)
        res = engine.generate(rec.prompt_ids, config)
        steps = replay_one(dataclasses.replace(rec, stop=stop_rules(config, tiny_lm.tokenizer)), drafter,
                           budget, COST)
        assert res.stop_reason == "stop_fn" and len(res.tokens) < len(rec.greedy)
        assert res.tokens == rec.greedy[: len(res.tokens)]
        assert [s.emitted for s in steps] == res.accepted[1:]
        assert [s.q - 1 for s in steps] == res.draft_sizes
        cut.append(sum(s.accepted for s in steps) + len(steps) + 1 > len(res.tokens))  # a step's tokens cut
    assert engine.drafter.calibration == drafter.calibration
    assert any(cut), "the check should cover a step whose tokens the rule cut"


def test_evaluate_reports(records, corpus_dir, tiny_lm):
    from indexer.store import Datastore

    corpus = Datastore.open(corpus_dir, tokenizer=str(tiny_lm.path))
    none = evaluate(records, "rest", 0, COST, corpus=corpus)
    assert none["mean_accepted"] == 1.0 and none["mean_tree_nodes"] == 0.0
    assert none["projected_speedup_no_retrieval"] == pytest.approx(1.0)
    r = evaluate(records, "rest", 16, COST, corpus=corpus)
    assert r["tokens"] == sum(len(x.greedy) - 1 for x in records)
    assert r["mean_accepted"] == pytest.approx(r["tokens"] / r["steps"])
    assert sum(r["accepted_histogram"].values()) == r["steps"]
    assert sum(int(k) * v for k, v in r["accepted_histogram"].items()) == sum(r["accepted_tokens_by_source"].values())
    assert set(r["accepted_tokens_by_source"]) <= {"context", "history", "corpus", "recycle"}
    assert r["mean_accepted"] > 1.0
    # projected speedup uses c(q): more tokens per step, each step costing c(q)
    assert r["projected_speedup_no_retrieval"] > 0
    flat = evaluate(records, "rest", 16, CostModel.flat(), corpus=corpus)
    assert flat["projected_speedup_no_retrieval"] == pytest.approx(flat["mean_accepted"])
    # coverage: what the full trie held; never below what the step accepted, and with one node per step it
    # shows the ceiling the ranking left behind
    one = evaluate(records, "rest", 1, COST, corpus=corpus)
    assert one["covered_mean_accepted"] > 1 + sum(int(k) * v for k, v in one["accepted_histogram"].items()) / one["steps"]
    assert none["covered_mean_accepted"] == 1.0  # no sources asked, no trie


def test_covered_walks_the_full_trie(records):
    drafter = Drafter(make_sources("context=1"))
    rec = records[0]
    context = rec.prompt_ids + rec.output_ids[:30]
    tree = drafter.draft(context, 1, COST)
    trie = drafter.last_trie
    assert trie is not None and len(trie) > len(tree)  # ranking kept one node of many
    # the trie's own paths are covered to their full depth, anything else not at all
    leaf = max(range(len(trie)), key=lambda n: trie.depths[n])
    path = []
    while leaf:
        path.insert(0, trie.tokens[leaf])
        leaf = trie.parents[leaf]
    assert drafter.covered(path + [10**9]) == len(path)
    assert drafter.covered([10**9] + path) == 0


def test_first_k_is_suffix_array_order(tiny_lm, corpus_dir):
    """rest-paper's sample: the first k occurrences in suffix-array order, checked by brute force."""
    from indexer.store import Datastore

    ds = Datastore.open(corpus_dir, tokenizer=str(tiny_lm.path))
    (sh,) = ds._snapshot
    stored = np.asarray(sh.tok, dtype=np.int64)[: sh.n]  # as stored (ids, or ranks when compacted)
    # no trailing space: the model's encoding attaches a space to the word after it
    context = tiny_lm.tokenizer.encode("        if", add_special_tokens=False)
    r = ds.search(context, n_max=16, n_min=1, k=5, max_len=3, first_k=True)
    n, conts = r.match_len, [(c.tokens, c.count) for c in r.continuations]
    encoded = sh.encode(np.asarray(context, dtype=np.int64))
    pat = np.frombuffer(encoded, dtype=">u2" if sh.width == 2 else ">u4").astype(np.int64)[-n:].tolist()
    hits = [i for i in range(len(stored) - n) if stored[i:i + n].tolist() == pat]
    assert len(hits) > 5  # the sample is a real subset
    first = sorted(hits, key=lambda i: stored[i:i + 64].tolist())[:5]  # suffix-array order
    alpha = getattr(sh, "alpha", None)
    expect = {}
    for i in first:
        c = []
        for t in stored[i + n:i + n + 3].tolist():
            if t == sh.sentinel:
                break
            c.append(int(alpha[t]) if alpha is not None else t)
        if c:
            expect[tuple(c)] = expect.get(tuple(c), 0) + 1
    assert dict((t, int(w)) for t, w in conts) == expect
    assert ds.search(context, n_max=16, n_min=1, k=5, max_len=3).match_len == n  # the same match as search


def test_policy_parsing():
    assert parse_policy("rest") == list(SHARES.items())
    assert parse_policy("context,recycle=2") == [("context", 1.0), ("recycle", 2.0)]
    for bad in ("nope=1", "context=x", "context=0"):
        with pytest.raises(PolicyError):
            parse_policy(bad)
    with pytest.raises(PolicyError, match="needs a corpus"):
        make_sources("paper")
    assert "corpus" not in [s.name for s, _ in make_sources("rest")]  # no datastore: no corpus source
    # the drafter normalises the shares of the sources present, once
    assert abs(sum(w for _, w in Drafter(make_sources("rest")).sources) - 1.0) < 1e-9


def test_replay_cli_records_once(tiny_dir, prompts_file, corpus_dir, tmp_path, monkeypatch, capsys):
    rec, out = tmp_path / "rec.jsonl", tmp_path / "rp.json"
    base = ["--prompts", str(prompts_file), "--max-new-tokens", "24", "--record", str(rec)]
    assert replay_main(base + ["--model", str(tiny_dir), "--policy", "pld", "--budgets", "4"]) == 0
    header, recs = read_records(rec)
    assert header["model"] == "model" and len(recs) == 3 and header["tokenizer"] == str(tiny_dir)
    # the second run replays from the record alone: no model is loaded
    import rest_lsp.model.host as host

    monkeypatch.setattr(host, "load_model", lambda *a, **k: pytest.fail("replay must reuse the record"))
    assert replay_main(base + ["--datastore", str(corpus_dir), "--policy", "rest", "--policy", "paper",
                               "--policy", "context=0.5,recycle=0.5", "--budgets", "4,auto",
                               "--cost", "flat", "--json", str(out)]) == 0
    r = json.loads(out.read_text())
    assert [(x["policy"], x["budget"]) for x in r["results"]] == [
        ("rest", 4), ("rest", "auto"), ("paper", 4), ("paper", "auto"),
        ("context=0.5,recycle=0.5", 4), ("context=0.5,recycle=0.5", "auto")]
    for x in r["results"]:
        assert {"mean_accepted", "mean_tree_nodes", "projected_speedup", "accepted_histogram",
                "runs_by_source", "accepted_tokens_by_source"} <= set(x)
    assert "runs_by_source" in r["results"][0] and r["cost_ms"] == {"qs": [1], "ms": [1.0]}
    assert "budget" in capsys.readouterr().out
    assert replay_main(base + ["--policy", "bogus"]) == 2
    assert replay_main(base + ["--cost", str(tmp_path / "missing.json")]) == 2
    assert replay_main(base + ["--acceptance-lr", "-1"]) == 2
    frozen = tmp_path / "frozen.json"  # lr 0: the trie's mass ranks, as evaluate(acceptance_lr=0) does
    assert replay_main(base + ["--datastore", str(corpus_dir), "--budgets", "4", "--cost", "flat",
                               "--acceptance-lr", "0", "--json", str(frozen)]) == 0
    from indexer.store import Datastore

    corpus = Datastore.open(corpus_dir, tokenizer=str(tiny_dir))
    want = evaluate(recs, "rest", 4, CostModel.flat(), corpus=corpus, acceptance_lr=0)
    got = json.loads(frozen.read_text())["results"][0]
    assert (got["steps"], got["accepted_histogram"]) == (want["steps"], want["accepted_histogram"])


def test_replay_default_record_in_cache(tiny_dir, prompts_file, tmp_path, monkeypatch):
    monkeypatch.setenv("REST_LSP_CACHE", str(tmp_path / "cache"))
    argv = ["--model", str(tiny_dir), "--prompts", str(prompts_file), "--limit", "1", "--max-new-tokens", "8",
            "--policy", "pld", "--budgets", "4"]
    assert replay_main(argv) == 0
    (rec,) = (tmp_path / "cache" / "replay").iterdir()
    assert rec.suffix == ".jsonl" and len(read_records(rec)[1]) == 1
    import rest_lsp.model.host as host

    monkeypatch.setattr(host, "load_model", lambda *a, **k: pytest.fail("the cached record should be reused"))
    assert replay_main(argv) == 0
    monkeypatch.undo()
    monkeypatch.setenv("REST_LSP_CACHE", str(tmp_path / "cache"))
    assert replay_main(argv + ["--offset", "1"]) == 0  # other prompts: a record of their own
    recs = {p.name: read_records(p)[1] for p in (tmp_path / "cache" / "replay").iterdir()}
    assert len(recs) == 2 and sorted(r[0].id for r in recs.values()) == ["dumps", "fim"]


def test_replay_exact_when_an_end_token_stops_the_run(tiny_lm, records, corpus_dir):
    """A token of the greedy output made an end token: both runs stop there, the last step is cut alike."""
    import dataclasses

    from rest_lsp.engine import Engine, GenerationConfig

    rec0 = records[0]
    end = rec0.output_ids[20]
    lm = dataclasses.replace(tiny_lm, stop_ids=[end])
    rec = greedy_record(lm, rec0.prompt_ids, 40)
    assert rec.end_token == end and rec.stop_reason == "eos" and len(rec.output_ids) <= 20
    spec = "context=0.7,history=0.3"
    drafter = Drafter(make_sources(spec))
    engine = Engine(lm, make_sources(spec), cost=COST, eos_token_ids=[end])
    for _ in range(2):  # the second time the history source knows the whole output
        steps = replay_one(rec, drafter, None, COST)
        engine.reset_cache()  # a prompt prefilled in full, as replays mirror (not the first step of a cached one)
        res = engine.generate(rec.prompt_ids, GenerationConfig(max_new_tokens=40))
        assert res.tokens == rec.greedy and res.stop_reason == "eos"
        assert [s.emitted for s in steps] == res.accepted[1:]
        assert [s.q - 1 for s in steps] == res.draft_sizes
    assert engine.drafter.calibration == drafter.calibration
    assert max(res.accepted) > 1


def test_replay_starts_from_a_saved_history(records, tiny_dir, prompts_file, tmp_path):
    """`evaluate(history=...)` and `rest-lsp replay --history`: the history source starts with earlier
    output (here the records' own output, so it drafts more) and refuses another model's history file."""
    from rest_lsp.engine.history import save_history

    earlier = [t for r in records for t in r.output_ids + [-1]]
    cold = evaluate(records, "history=1", 4, COST)
    warm = evaluate(records, "history=1", 4, COST, history=earlier)
    assert warm["mean_accepted"] > cold["mean_accepted"] and warm["steps"] < cold["steps"]

    rec, out = tmp_path / "rec.jsonl", tmp_path / "rp.json"
    from rest_lsp.bench.replay import write_records

    write_records(rec, {"kind": "rest-lsp-replay", "version": 1, "model": "model", "n_prompts": len(records),
                        "max_new_tokens": 40, "topk": 8, "cost_ms": None, "tokenizer": str(tiny_dir)}, records)
    hist = tmp_path / "h.msgpack"
    save_history(hist, np.asarray(earlier), "model/999")
    base = ["--prompts", str(prompts_file), "--record", str(rec), "--policy", "history=1", "--budgets", "4",
            "--cost", "flat"]
    assert replay_main(base + ["--history", str(hist), "--json", str(out)]) == 0
    got = json.loads(out.read_text())
    assert got["history"] == str(hist)
    assert got["results"][0]["steps"] == evaluate(records, "history=1", 4, CostModel.flat(),
                                                  history=earlier)["steps"]
    save_history(hist, np.asarray(earlier), "another-model/999")
    assert replay_main(base + ["--history", str(hist)]) == 2
