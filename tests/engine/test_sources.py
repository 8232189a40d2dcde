"""Draft sources: suffix matching, context and open buffers, history, the datastore wrapper, recycling."""
from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np
import pytest

from rest_lsp.engine import ContextSource, DatastoreSource, Engine, GenerationConfig, HistorySource, RecyclingSource
from rest_lsp.engine.sources import suffix_matches
from rest_lsp.engine.trie import padded_rows

from ._models import plain_greedy, random_prompt, tiny_model


def test_suffix_matches_longest_then_latest():
    text = np.array([1, 2, 3, 9, 2, 3, 8, 7, 3, 5, 2, 3])
    found = suffix_matches(text, np.array([1, 2, 3]), n_max=8, max_len=4, limit=10, exclude_end=False)
    assert found[0] == (3, 2)  # "1 2 3" at 0..2
    assert found[1] == (2, 5)  # "2 3" at 4..5
    assert (1, 8) in found
    # the context searched in itself: its own end is no match
    ctx = suffix_matches(text, text[-2:], 8, 4, 10, exclude_end=True)
    assert all(end < len(text) - 1 for _, end in ctx)


def test_context_source_prefers_long_matches_and_reads_buffers():
    src = ContextSource(n_max=8)
    ctx = [5, 1, 2, 3, 40, 41, 9, 3, 50, 7, 1, 2, 3]
    props = dict(src.propose(ctx, 3))
    assert props[(40, 41, 9)] > props[(50, 7, 1)]  # "1 2 3" beats "3"
    assert src.last_match_len == 3
    src.set_buffer("b.py", [0, 7, 1, 2, 3, 60, 61])
    props = dict(src.propose(ctx, 2))
    assert props[(60, 61)] > props[(40, 41)]  # the buffer matches "7 1 2 3", the context only "1 2 3"
    assert src.last_match_len == 4
    src.drop_buffer("b.py")
    assert (60, 61) not in dict(src.propose(ctx, 2))
    assert src.propose([1], 4) == [] and src.last_match_len == 0


def test_prompt_lookup_source_drafts_one_chain_after_the_longest_latest_match():
    from rest_lsp.engine import Drafter, make_sources
    from rest_lsp.engine.sources import PromptLookupSource

    a, b, c, d, e, f = range(10, 16)
    src = PromptLookupSource()
    assert src.propose([a, b, c, d, b, c, e, f, b, c], 4) == [((e, f, b, c), 4.0)]  # the docstring's example
    assert src.last_match_len == 2
    # the longest suffix (up to 3 tokens) wins over a more recent shorter one; beyond 3 nothing counts
    assert src.propose([a, c, d, e, 1, 2, d, e, 3, a, c, d, e], 2) == [((1, 2), 9.0)]
    assert src.last_match_len == 3
    assert src.propose([a, b, c, d], 4) == [] and src.last_match_len == 0
    # the pld policy drafts that one chain, each node the previous one's child
    tree = Drafter(make_sources("pld")).draft([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 1, 2, 3], 10)
    assert tree.tokens == [3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13] and tree.parents == list(range(-1, 10))


def test_pld_policy_output_is_exact():
    from rest_lsp.engine import make_sources

    model = tiny_model("qwen2", 2)
    base = random_prompt(21, 12)
    ref = plain_greedy(model, base, 60)
    res = Engine(model, make_sources("pld"), eos_token_ids=[]).generate(
        base, GenerationConfig(max_new_tokens=60, draft_budget=10))
    assert res.tokens == ref
    # whole 10-token chains were verified, some rejected and some accepted (a random model rarely repeats)
    assert max(res.draft_sizes) == 10 and res.accepted_sources.get("lookup", 0) >= 1 and res.steps < 60


def test_history_source_remembers_earlier_generations():
    src = HistorySource()
    src.begin([0])
    src.observe([10, 11, 12, 13, 14])
    src.begin([0])
    src.observe([20, 21])
    assert dict(src.propose([99, 11, 12], 2)) == {(13, 14): 4.0}
    assert src.propose([14], 3) == []  # a generation's end never runs into the next one


@dataclass(frozen=True)
class Continuation:
    tokens: tuple
    count: int
    weight: float


@dataclass(frozen=True)
class SearchResult:
    match_len: int
    count: int
    continuations: list


class FakeDatastore:
    """The shape of indexer's Datastore.search: the longest matching suffix, continuations heaviest first."""

    def __init__(self, corpus):
        self.corpus = corpus
        self.calls = []

    def search(self, context, *, n_max=16, n_min=2, k=5000, max_len=10, limit=None):
        self.calls.append((n_max, n_min, k, max_len))
        text = np.array(self.corpus)
        for n in range(min(n_max, len(context)), n_min - 1, -1):
            found = {}
            for _, end in suffix_matches(text, np.array(context[-n:]), n, max_len, k):
                if _ >= n:
                    cont = tuple(self.corpus[end + 1 : end + 1 + max_len])
                    found[cont] = found.get(cont, 0) + 1
            if found:
                conts = [Continuation(c, m, float(m)) for c, m in sorted(found.items(), key=lambda x: -x[1])]
                return SearchResult(n, sum(found.values()), conts)
        return SearchResult(0, 0, [])

    def search_rows(self, context, *, max_len=10, **kw):
        """`search` as padded rows, what DatastoreSource reads (indexer's SearchRows has the same fields)."""
        r = self.search(context, max_len=max_len, **kw)
        rows, weights = padded_rows([(c.tokens, c.weight) for c in r.continuations], width=max_len)
        return SimpleNamespace(match_len=r.match_len, rows=rows, weights=weights)


def test_datastore_source_wraps_search():
    store = FakeDatastore([1, 2, 3, 4, 5, 9, 2, 3, 4, 6])
    src = DatastoreSource(store, name="repo", n_max=8, k=100)
    props = src.propose([7, 2, 3], 2)
    assert dict(props) == {(4, 5): 2.0, (4, 6): 2.0}  # normalised, times the match length squared
    assert src.last_match_len == 2 and store.calls == [(8, 2, 100, 2)]  # no shorter level to back off to
    assert src.propose([42, 43], 2) == [] and src.last_match_len == 0
    # a length cap (the corpus's CORPUS_MAX_LEN) shortens what is searched for and proposed
    capped = DatastoreSource(store, n_max=8, k=100, max_len=1)
    assert dict(capped.propose([7, 2, 3], 10)) == {(4,): 4.0} and store.calls[-1] == (8, 2, 100, 1)
    assert max(len(c) for c, _ in DatastoreSource(store, n_max=8, k=100).propose([7, 2, 3], 10)) > 1


def test_datastore_source_backs_off_to_short_matches():
    # "1 2 3" occurs once (-> 7), "2 3" five times, mostly -> 4
    store = FakeDatastore([1, 2, 3, 7, 0, 2, 3, 4, 0, 2, 3, 4, 0, 2, 3, 4, 0, 2, 3, 5, 0])
    src = DatastoreSource(store, n_max=8, k=100)
    props = dict(src.propose([1, 2, 3], 1))
    assert src.last_match_len == 3 and [c[:2] for c in store.calls] == [(8, 2), (2, 2)]
    # each level normalised, times its match length squared: "1 2 3" -> 7 (all of it) times 3^2; "2 3" -> 4
    # (3 of 5), 5 (1 of 5), 7 (1 of 5) times 2^2
    assert props == pytest.approx({(7,): 9.0 + 4.0 / 5, (4,): 4.0 * 3 / 5, (5,): 4.0 / 5})
    store.calls.clear()
    assert dict(DatastoreSource(store, n_max=8, backoff=()).propose([1, 2, 3], 1)) == {(7,): 9.0}
    assert len(store.calls) == 1


def test_datastore_drafts_are_accepted_and_output_stays_exact():
    model = tiny_model("llama", 1)
    base = random_prompt(11, 12)
    ref = plain_greedy(model, base, 50)
    store = FakeDatastore(random_prompt(12, 50) + base + ref + random_prompt(13, 50))  # the corpus holds the answer
    engine = Engine(model, [(DatastoreSource(store), 0.6), (ContextSource(), 0.4)], eos_token_ids=[])
    res = engine.generate(base, GenerationConfig(max_new_tokens=40, draft_budget=8))
    assert res.tokens == ref[:40]
    assert res.accepted_sources.get("corpus", 0) > 20 and res.steps < 15
    assert len(res.retrieval_ms) == res.steps - 1


def test_recycling_source_learns_from_forwards():
    src = RecyclingSource(k=3, depth=2, branching=(2, 1))
    assert src.propose([5], 4) == []
    src.observe_forward([5, 6, 8], [[6, 7, 1], [8, 2, 3], [9, 9, 9]])
    props = dict(src.propose([1, 5], 4))
    assert props == {(6, 8): 1.0, (7,): 0.5}
    model = tiny_model("qwen2", 2)
    prompt = random_prompt(2, 10)
    engine = Engine(model, [(RecyclingSource(), 1.0)], eos_token_ids=[])
    res = engine.generate(prompt, GenerationConfig(max_new_tokens=40, draft_budget=6))
    assert res.tokens == plain_greedy(model, prompt, 40)
    assert engine.sources[0][0].table  # the engine fed it every verified row
    res = engine.generate(prompt, GenerationConfig(max_new_tokens=40, draft_budget=6))  # the same text again
    assert res.tokens == plain_greedy(model, prompt, 40) and res.accepted_sources.get("recycle", 0) > 0


def test_recycling_source_keys_rows_by_the_tokens_before_them():
    src = RecyclingSource(k=2, depth=1, branching=(1,), order=2)
    src.begin([1, 2])  # the context ends "1 2"; 2 is the pending root
    # a tree: root 2, children 3 and 4 (siblings), 5 under 4; each row's key is its own path
    src.observe_forward([2, 3, 4, 5], [[30, 0], [31, 0], [41, 0], [51, 0]], parents=[-1, 0, 0, 2])
    assert src.table[(1, 2)] == (30, 0) and src.table[(2, 3)] == (31, 0)
    assert src.table[(2, 4)] == (41, 0) and src.table[(4, 5)] == (51, 0)
    assert (3, 4) not in src.table  # 4 is 3's sibling, not its child
    src.observe([4, 8])  # the step accepted 4, then the model chose 8: the new root
    src.observe_forward([8, 5], [[80, 0], [55, 0]])  # a chain: 5 after "4 8", keyed "8 5" (and "5")
    assert src.table[(4, 8)] == (80, 0) and src.table[(8, 5)] == (55, 0) and src.table[(5,)] == (55, 0)
    assert dict(src.propose([9, 4, 5], 1)) == {(51,): 1.0}  # "4 5" seen: the longer key beats the latest "5"
    assert dict(src.propose([9, 0, 5], 1)) == {(55,): 1.0}  # "0 5" unseen: back off to "5"
    assert dict(src.propose([4, 8], 1)) == {(80,): 1.0}
    assert src.propose([7, 99], 1) == []
    small = RecyclingSource(k=1, order=1, capacity=2)
    small.observe_forward([1, 2, 3], [[10], [20], [30]])
    assert list(small.table) == [(2,), (3,)]  # the oldest key went first


def test_the_rest_policy_mixes_every_source_given():
    from rest_lsp.engine import make_sources
    from rest_lsp.engine.policy import SHARES, shares

    names = [s.name for s, _ in make_sources("rest", repository=FakeDatastore([4, 5]), corpus=FakeDatastore([1, 2, 3]))]
    assert names == ["context", "history", "repository", "corpus", "recycle"]
    assert [s.name for s, _ in make_sources("rest")] == ["context", "history", "recycle"]  # no datastores
    assert [s.name for s, _ in make_sources("context=1,recycle=0.5")] == ["context", "recycle"]
    # normalised over the sources present, keeping their ratios
    got = shares(make_sources("rest"))
    assert abs(sum(got.values()) - 1) < 1e-3
    assert abs(got["context"] / got["history"] - SHARES["context"] / SHARES["history"]) < 1e-3
    with pytest.raises(ValueError, match="repository"):
        make_sources("repository=1", strict=True)


def test_real_indexer_datastore_drafts():
    from indexer.store import Datastore

    model = tiny_model("qwen2", 3)
    base = random_prompt(31, 12)
    ref = plain_greedy(model, base, 40)
    store = Datastore.memory(vocab_size=64)
    store.set_live("buffer", random_prompt(32, 40) + base + ref + random_prompt(33, 40))
    source = DatastoreSource(store)
    res = Engine(model, [(source, 1.0)], eos_token_ids=[]).generate(
        base, GenerationConfig(max_new_tokens=30, draft_budget=8))
    assert res.tokens == ref[:30]
    assert res.accepted_sources.get("corpus", 0) > 15 and source.last_match_len >= 2


def test_history_source_keeps_the_latest_tokens_when_full():
    src = HistorySource(capacity=8)
    tokens = list(range(50))
    for i in range(0, 50, 3):
        src.observe(tokens[i : i + 3])
    held = src._buf[: src._n].tolist()
    assert held[-8:] == tokens[-8:] and held == tokens[-len(held):] and len(held) <= 16
    assert dict(src.propose([46, 47], 2)) == {(48, 49): 4.0}
    src.observe(list(range(100, 120)))  # more than the capacity at once
    assert src._buf[: src._n].tolist() == list(range(112, 120))
