"""The first step: a prompt that lacks a few tokens (a key typed) has them computed in the forward that verifies
the first draft tree, so the first tokens come after one forward; exact against plain greedy decoding."""
import pytest

from rest_lsp.engine import ContextSource, Engine, GenerationConfig
from rest_lsp.engine.generate import FIRST_STEP_TOKENS
from rest_lsp.engine.verifier import HFVerifier

from ._models import Recording, ScriptedSource, plain_greedy, random_prompt, tiny_model

N = 12


def warmed(model, sources, before):
    """An engine whose cache holds `before` (a warm-up: prefill only), its forwards recorded from then on."""
    rec = Recording(HFVerifier(model))
    engine = Engine(model, sources, eos_token_ids=[], verifier=rec)
    engine.generate(before, GenerationConfig(max_new_tokens=0))
    rec.calls.clear()
    return engine, rec


@pytest.mark.parametrize("budget", [6, None])
def test_a_key_typed_is_answered_by_one_forward_with_its_drafts(kind, budget):
    model = tiny_model(kind, 4)
    before = random_prompt(21, 80)
    typed = before + random_prompt(22, 5)
    ref = plain_greedy(model, typed, N)
    engine, rec = warmed(model, [(ScriptedSource(typed + ref), 1.0)], before)
    run = engine.start(typed, GenerationConfig(max_new_tokens=N, draft_budget=budget))
    first = engine.advance(run)
    q, prompt = rec.calls[0]
    assert len(rec.calls) == 1 and not prompt  # one forward, on the exact path of tree rows
    assert q == 4 + len(first)  # the 4 tokens before the last, the root (the last), the drafted nodes accepted
    assert len(first) >= 3 and first == ref[:len(first)]  # the drafts of the first step were accepted
    while not run.done:
        engine.advance(run)
    assert run.result.tokens == ref and run.result.reused_tokens == 80 and run.computed == 5


def test_plain_decoding_takes_the_same_first_forward_without_drafts(kind):
    model = tiny_model(kind, 5)
    before = random_prompt(23, 60)
    typed = before + random_prompt(24, 7)
    ref = plain_greedy(model, typed, N)
    engine, rec = warmed(model, [(ContextSource(), 1.0)], before)
    res = engine.generate(typed, GenerationConfig(max_new_tokens=N, draft_budget=0))
    assert res.tokens == ref
    assert rec.calls[0] == (7, False) and rec.calls[1:] == [(1, False)] * (N - 1)


def test_a_prompt_lacking_more_is_prefilled_first(kind):
    model = tiny_model(kind, 6)
    before = random_prompt(25, 40)
    typed = before + random_prompt(26, FIRST_STEP_TOKENS + 1)
    ref = plain_greedy(model, typed, N)
    engine, rec = warmed(model, [(ScriptedSource(typed + ref), 1.0)], before)
    res = engine.generate(typed, GenerationConfig(max_new_tokens=N, draft_budget=4))
    assert res.tokens == ref
    assert rec.calls[0] == (FIRST_STEP_TOKENS + 1, True)  # a prompt chunk; its last row gives the first token
    assert res.accepted[0] == 1


def test_a_whole_prompt_cached_without_its_logits_computes_its_last_token_with_the_tree(kind):
    model = tiny_model(kind, 7)
    prompt = random_prompt(27, 50)
    ref = plain_greedy(model, prompt, N)
    # the cache holds the prompt inside a longer text a prefill computed: no row of the prompt's last token
    engine, rec = warmed(model, [(ScriptedSource(prompt + ref), 1.0)], prompt + random_prompt(28, 20))
    run = engine.start(prompt, GenerationConfig(max_new_tokens=N, draft_budget=5))
    first = engine.advance(run)
    assert rec.calls == [(len(first), False)] and len(first) == 6 and first == ref[:6]
    while not run.done:
        engine.advance(run)
    assert run.result.tokens == ref and run.result.reused_tokens == 49
