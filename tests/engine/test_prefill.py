"""Chunked prefill: the same tokens as one forward over the prompt, and cancellable between chunks."""
from rest_lsp.engine import ContextSource, Engine, GenerationConfig
from rest_lsp.engine.generate import PREFILL_CHUNK

from ._models import Recording, plain_greedy, random_prompt, tiny_model

N = 12


def test_chunked_prefill_gives_the_tokens_of_one_chunk(kind):
    model = tiny_model(kind, 1)
    prompt = random_prompt(11, 300)  # longer than PREFILL_CHUNK: the default already takes two forwards
    assert len(prompt) > PREFILL_CHUNK
    ref = plain_greedy(model, prompt, N)
    one = Engine(model, eos_token_ids=[])
    one.prefill_chunk = 10_000
    assert one.generate(prompt, GenerationConfig(max_new_tokens=N)).tokens == ref
    for chunk in (PREFILL_CHUNK, 37):  # 37: an uneven last chunk, with drafts after the prefill
        engine = Engine(model, [(ContextSource(), 1.0)], eos_token_ids=[])
        engine.prefill_chunk = chunk
        res = engine.generate(prompt, GenerationConfig(max_new_tokens=N, draft_budget=4))
        assert res.tokens == ref and res.prompt_tokens == len(prompt)


def test_should_stop_during_prefill_cancels_and_keeps_the_cache_exact():
    model = tiny_model("qwen2", 2)
    prompt = random_prompt(12, 200)
    ref = plain_greedy(model, prompt, N)
    engine = Engine(model, eos_token_ids=[])
    engine.prefill_chunk = 50
    polls = []

    def should_stop():  # false before the 2nd chunk, true before the 3rd
        polls.append(1)
        return len(polls) >= 2

    res = engine.generate(prompt, GenerationConfig(max_new_tokens=N), should_stop=should_stop)
    assert res.stop_reason == "cancelled" and res.tokens == [] and res.text == ""
    assert len(polls) == 2 and engine.verifier.past_len == 100  # two chunks computed, then stopped
    res = engine.generate(prompt, GenerationConfig(max_new_tokens=N))
    assert res.reused_tokens == 100 and res.tokens == ref and res.stop_reason == "max_tokens"
    # a prompt sharing 70 tokens reuses them, is cancelled after one more chunk, then resumes from there
    other = prompt[:70] + random_prompt(13, 80)
    res = engine.generate(other, GenerationConfig(max_new_tokens=N), should_stop=lambda: True)
    assert res.stop_reason == "cancelled" and res.reused_tokens == 70 and engine.verifier.past_len == 120
    res = engine.generate(other, GenerationConfig(max_new_tokens=N))
    assert res.reused_tokens == 120 and res.tokens == plain_greedy(model, other, N)


def test_prefill_chunks_are_sent_as_prompt_chunks_and_steps_are_not():
    """Only the prefill may take a verifier's faster, not row-invariant path (`prompt=True`): every decoding
    step and draft tree is sent without it, so its rows round as plain decoding's do."""
    from rest_lsp.engine.verifier import HFVerifier

    model = tiny_model("qwen2", 3)
    prompt = random_prompt(14, 150)  # three chunks of 50, the last longer than FIRST_STEP_TOKENS
    recorder = Recording(HFVerifier(model))
    engine = Engine(model, [(ContextSource(), 1.0)], eos_token_ids=[], verifier=recorder)
    engine.prefill_chunk = 50
    res = engine.generate(prompt, GenerationConfig(max_new_tokens=N, draft_budget=4))
    assert res.tokens == plain_greedy(model, prompt, N)
    assert recorder.calls[:3] == [(50, True), (50, True), (50, True)]
    steps = recorder.calls[3:]
    assert steps and not any(p for _, p in steps)
    assert any(q > 1 for q, _ in steps)  # draft trees were verified, not only single rows
