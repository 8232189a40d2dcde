"""Trie mixing, node ranking, flattening, greedy acceptance, the cost-based draft size."""
import json

import pytest
import torch

from rest_lsp.engine.cost import Calibration, CostModel, best_size, load_or_measure, measure_cost
from rest_lsp.engine.tree import DraftTree, accept_greedy, flatten, rank_nodes
from rest_lsp.engine.trie import match_strength, mix
from rest_lsp.engine.verifier import HFVerifier

from ._models import tiny_model


def test_mix_normalises_within_each_source_then_applies_shares():
    corpus = [((1, 2), 5000.0), ((3,), 5000.0)]  # raw counts in the thousands
    context = [((4, 5, 6), 1.0)]
    trie = mix(9, [("corpus", 0.5, 1.0, corpus), ("context", 0.5, 1.0, context)])
    kids = trie.children[0]
    mass = {tok: trie.mass[i] for tok, i in kids.items()}
    assert mass == pytest.approx({1: 0.25, 3: 0.25, 4: 0.5})
    assert trie.mass[0] == pytest.approx(1.0)
    # a source with nothing leaves its share unclaimed: estimates stay below certainty
    alone = mix(9, [("corpus", 0.5, 1.0, []), ("context", 0.5, 1.0, context)])
    assert alone.mass[alone.children[0][4]] == pytest.approx(0.5)


def test_longer_matches_are_trusted_more():
    assert match_strength(0) == 0.0
    assert match_strength(1) < match_strength(2) < match_strength(8) < 1.0
    assert match_strength(None) == 1.0
    weak = mix(0, [("a", 1.0, match_strength(1), [((7,), 1.0)])])
    strong = mix(0, [("a", 1.0, match_strength(6), [((7,), 1.0)])])
    assert weak.mass[1] < strong.mass[1]


def test_rank_nodes_is_best_first_and_connected():
    trie = mix(0, [("s", 1.0, 1.0, [((1, 2, 3), 0.6), ((1, 4), 0.3), ((5, 6), 0.1)])])
    order = rank_nodes(trie, 10)
    masses = [trie.mass[n] for n in order]
    assert [trie.tokens[n] for n in order][:3] == [1, 2, 3]
    assert len(order) == 6
    seen = {0}
    for n in order:
        assert trie.parents[n] in seen  # every prefix of the ranking is a tree
        seen.add(n)
    assert max(masses[3:]) <= masses[0]
    assert len(rank_nodes(trie, 2)) == 2


def test_flatten_builds_ancestor_mask_and_depths():
    trie = mix(0, [("s", 1.0, 1.0, [((1, 2), 0.6), ((3, 4), 0.4)])])
    tree = flatten(trie, rank_nodes(trie, 10))
    tokens, depths, mask = tree.tensors()
    assert tokens.tolist()[0] == 0 and sorted(tokens.tolist()[1:]) == [1, 2, 3, 4]
    for i, p in enumerate(tree.parents):
        expected = {i}
        while p >= 0:
            expected.add(p)
            p = tree.parents[p]
        assert set(torch.nonzero(mask[i]).flatten().tolist()) == expected
        assert depths[i] == len(expected) - 1
    assert tree.sources[1:] == ["s"] * 4


def test_nodes_are_credited_to_the_source_of_their_heaviest_continuation():
    trie = mix(0, [("a", 0.5, 1.0, [((1, 2), 1.0)]), ("b", 0.5, 1.0, [((1, 3), 3.0), ((4,), 1.0)])])
    by_token = {trie.tokens[n]: trie.source[n] for n in range(1, len(trie))}
    assert by_token == {1: "a", 2: "a", 3: "b", 4: "b"}  # 1: a adds 0.5, b's heaviest adds 0.375
    assert trie.mass[trie.children[0][1]] == pytest.approx(0.875)


def test_accept_greedy_walks_the_matching_path():
    # root 0 -> a(5) -> b(6); root -> c(7)
    tree = DraftTree([0, 5, 7, 6], [-1, 0, 0, 1], [0, 1, 1, 2], [1.0, 0.5, 0.4, 0.5], ["", "s", "s", "s"])
    assert accept_greedy(tree, [5, 6, 9, 8]) == ([0, 1, 3], 8)
    assert accept_greedy(tree, [7, 0, 3, 0]) == ([0, 2], 3)
    assert accept_greedy(tree, [9, 0, 0, 0]) == ([0], 9)


def test_best_size_stops_where_cost_outgrows_acceptance():
    flat = CostModel([1, 64], [10.0, 10.0])
    assert best_size([0.9, 0.5, 0.1, 0.01], flat) == 4  # a flat cost takes every node with any chance
    cpu = CostModel([1, 2, 4, 8], [100.0, 140.0, 250.0, 280.0])  # c(2)/c(1) = 1.4
    assert best_size([0.3, 0.1], cpu) == 0  # 1.3 tokens for 1.4x the cost: a loss
    assert best_size([0.9, 0.8, 0.05], cpu) == 2
    assert best_size([], cpu) == 0
    assert cpu(3) == pytest.approx(195.0) and cpu(16) == pytest.approx(280.0 + 7.5 * 8)


def test_measure_and_cache_cost(tmp_path):
    model = tiny_model("qwen2", 0)
    v = HFVerifier(model)
    cost = measure_cost(v, model.config.vocab_size, qs=(1, 4), past=16, repeats=1)
    assert cost.qs == [1, 4] and all(m > 0 for m in cost.ms) and v.past_len == 0
    first = load_or_measure(v, model.config.vocab_size, "k", tmp_path, qs=(1, 2), past=8, repeats=1)
    stored = json.loads((tmp_path / "k.json").read_text())
    assert stored["qs"] == [1, 2]
    again = load_or_measure(v, model.config.vocab_size, "k", tmp_path, qs=(1, 2, 3))  # read, not measured
    assert again == first


class SleepyVerifier:
    """Costs 2 ms per token, plus one burst of load on the first measured q = 2 call."""

    past_len = 0

    def __init__(self):
        self.calls = 0

    def forward(self, tokens, depths, tree_mask, *, rows=None, prompt=False):
        import time

        q = len(tokens)
        self.calls += 1
        time.sleep(0.002 * q + (0.05 if q == 2 and self.calls == 5 else 0.0))
        self.past_len += q
        self._q = q
        return torch.zeros(q, 4)

    def keep(self, indices):
        self.past_len -= self._q - len(indices)

    def truncate(self, n):
        self.past_len = min(self.past_len, n)


def test_measured_cost_ignores_load_bursts_and_never_decreases():
    cost = measure_cost(SleepyVerifier(), 4, qs=(1, 2, 4, 8), past=1, repeats=2)
    assert all(a <= b for a, b in zip(cost.ms, cost.ms[1:]))
    assert cost(2) < 20  # the 50 ms burst was not taken for the cost of q = 2
    assert cost(8) > cost(1)


def test_calibration_scales_estimates_toward_observed_acceptance():
    cal = Calibration()
    assert cal.scale() == 1.0
    for _ in range(50):
        cal.update(predicted=2.0, actual=0)  # the trie promised 2 tokens a step, the model took none
    assert cal.scale() == 0.25
    for _ in range(200):
        cal.update(predicted=1.0, actual=1)
    assert cal.scale() == pytest.approx(1.0, abs=0.05)


def test_automatic_budget_follows_the_cost_curve():
    from rest_lsp.engine import Engine, GenerationConfig

    from ._models import ScriptedSource, plain_greedy, random_prompt

    model = tiny_model("qwen2", 1)
    prompt = random_prompt(21, 40)  # longer than FIRST_STEP_TOKENS: prefilled, every tree in a step of its own
    ref = plain_greedy(model, prompt, 30)
    steep = CostModel([1, 2, 64], [10.0, 40.0, 5000.0])  # a second token costs 4x: never worth it
    flat = CostModel([1, 64], [10.0, 10.0])
    for cost, drafts in ((steep, False), (flat, True)):
        engine = Engine(model, [(ScriptedSource(prompt + ref, corrupt_at=4), 1.0)], cost=cost, eos_token_ids=[])
        res = engine.generate(prompt, GenerationConfig(max_new_tokens=30))  # draft_budget None: automatic
        assert res.tokens == ref
        assert (max(res.draft_sizes) > 0) == drafts
        assert (res.steps < 30) == drafts


def test_engine_calibrate_measures_once_and_keeps_decoding_exact(tmp_path, monkeypatch):
    from rest_lsp.engine import ContextSource, Engine, GenerationConfig

    from ._models import plain_greedy, random_prompt

    monkeypatch.setattr("rest_lsp.engine.cost.cache_dir", lambda: tmp_path)
    model = tiny_model("llama", 0)
    prompt = random_prompt(40, 10)
    engine = Engine(model, [(ContextSource(), 1.0)], eos_token_ids=[])
    engine.generate(prompt, GenerationConfig(max_new_tokens=3, draft_budget=2))  # something in the cache
    cost = engine.calibrate(qs=(1, 2, 4), past=8, repeats=1)
    assert engine.cost is cost and len(list(tmp_path.glob("*.json"))) == 1
    assert engine.calibrate(qs=(1, 2, 4, 8)) == cost  # read back, not measured again
    res = engine.generate(prompt, GenerationConfig(max_new_tokens=20))
    assert res.reused_tokens == 0 and res.tokens == plain_greedy(model, prompt, 20)


def test_a_cost_curve_is_not_read_after_the_forward_code_changed(tmp_path, monkeypatch):
    """cost_key carries a digest of the project's modules that run the verifier's forward: a c(q) cached
    before a kernel changed (a slower earlier int4w once) is measured again, not read."""
    import importlib.util
    import sys

    import torch

    from rest_lsp.engine.cost import cost_key, forward_code

    src = tmp_path / "planted_kernel.py"

    def load(body: str):
        src.write_text("import torch\n\nclass Kernel(torch.nn.Module):\n    def forward(self, x):\n"
                       f"        return {body}\n")
        spec = importlib.util.spec_from_file_location("rest_lsp._planted_kernel", src)
        mod = importlib.util.module_from_spec(spec)
        monkeypatch.setitem(sys.modules, "rest_lsp._planted_kernel", mod)
        spec.loader.exec_module(mod)
        verifier = type("V", (), {})()
        verifier.lm = torch.nn.Sequential(mod.Kernel(), torch.nn.Linear(2, 2))
        return verifier

    first = load("x")
    key, code = cost_key("m", "int4w", "cpu", first), forward_code(first)
    assert cost_key("m", "int4w", "cpu", first) == key  # the same code: the same key, the cache is read
    changed = load("x * 2")  # the kernel's file edited (a new version installed)
    assert forward_code(changed) != code
    assert cost_key("m", "int4w", "cpu", changed) != key
    # only this project's modules count: torch's own Linear is the same whatever torch's version says
    bare = type("V", (), {})()
    bare.lm = torch.nn.Sequential(torch.nn.Linear(2, 2))
    assert forward_code(bare) == forward_code(type("V", (), {})())


def test_a_cost_curve_is_keyed_by_the_compiled_kernel_a_module_runs():
    """The same module source runs a compiled kernel on one machine and torch's on another (int4w on AMX or
    not, `kernel_tag`): each has its own c(q)."""
    import torch

    from rest_lsp.engine.cost import forward_code

    class Tagged(torch.nn.Module):
        def __init__(self, tag):
            super().__init__()
            self.kernel_tag = tag

    def verifier(tag):
        v = type("V", (), {})()
        v.lm = torch.nn.Sequential(Tagged(tag))
        return v

    assert forward_code(verifier("int4w-amx-1")) == forward_code(verifier("int4w-amx-1"))
    assert forward_code(verifier("int4w-amx-1")) != forward_code(verifier("int4w-torch"))
