"""Greedy speculative decoding emits exactly what plain greedy decoding emits, whatever the drafts."""
import pytest
import torch

from rest_lsp.engine import ContextSource, Engine, GenerationConfig

from ._models import VOCAB, ScriptedSource, plain_greedy, random_prompt, tiny_model

N = 40


def _reference(model, prompt, n=N):
    ref = plain_greedy(model, prompt, n)
    assert len(set(ref)) >= 8, "degenerate tiny model: exactness would not discriminate"
    return ref


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_no_draft_is_plain_greedy_and_hf_generate(kind, seed):
    model = tiny_model(kind, seed)
    prompt = random_prompt(seed, 5 + 9 * seed)
    ref = _reference(model, prompt)
    ids = torch.tensor([prompt])
    hf = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=N, do_sample=False,
                        pad_token_id=VOCAB - 1)
    assert hf[0, len(prompt):].tolist() == ref
    res = Engine(model, eos_token_ids=[]).generate(prompt, GenerationConfig(max_new_tokens=N))
    assert res.tokens == ref
    assert res.steps == N and res.accepted == [1] * N and res.stop_reason == "max_tokens"


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("corrupt_at", [None, 0, 3])  # right, wrong from the first token, partially right
@pytest.mark.parametrize("budget", [1, 5, 16])
def test_scripted_drafts_keep_output_exact(kind, seed, corrupt_at, budget):
    model = tiny_model(kind, seed)
    prompt = random_prompt(seed, 11 + seed)
    ref = _reference(model, prompt)
    source = ScriptedSource(prompt + ref, corrupt_at=corrupt_at, wrong_branch=0.7)
    engine = Engine(model, [(source, 1.0)], eos_token_ids=[])
    res = engine.generate(prompt, GenerationConfig(max_new_tokens=N, draft_budget=budget))
    assert res.tokens == ref
    assert sum(res.accepted) == N == len(res.tokens)
    assert source.observed[: N] == ref  # sources see every emitted token
    if corrupt_at != 0:
        assert res.steps < N  # multi-token acceptance was exercised
        assert res.accepted_sources.get("oracle", 0) > 0
    else:
        assert res.steps == N


@pytest.mark.parametrize("seed", [0, 3])
def test_context_source_drafts_from_an_open_buffer(kind, seed):
    model = tiny_model(kind, seed)
    base = random_prompt(seed, 10)
    ref = _reference(model, base, 60)
    source = ContextSource()
    source.set_buffer("other.py", base + ref)  # another open buffer holds the text being written
    prompt = base + ref[:5]
    res = Engine(model, [(source, 1.0)], eos_token_ids=[]).generate(
        prompt, GenerationConfig(max_new_tokens=N, draft_budget=8))
    assert res.tokens == ref[5 : 5 + N]
    assert res.steps < N / 2 and res.accepted_sources.get("context", 0) >= N / 2
    source.drop_buffer("other.py")
    res = Engine(model, [(source, 1.0)], eos_token_ids=[]).generate(
        prompt, GenerationConfig(max_new_tokens=N, draft_budget=8))
    assert res.tokens == ref[5 : 5 + N]


def test_prefix_reuse_across_calls_and_cache_lengths(kind):
    model = tiny_model(kind, 4)
    prompt = random_prompt(4, 30)
    engine = Engine(model, [(ScriptedSource([], name="none"), 0.5), (ContextSource(), 0.5)], eos_token_ids=[])
    cfg = GenerationConfig(max_new_tokens=20, draft_budget=6)
    first = engine.generate(prompt, cfg)
    assert first.tokens == _reference(model, prompt, 20) and first.reused_tokens == 0
    # the user accepted 7 tokens and typed on: the prompt extends the previous output
    longer = prompt + first.tokens[:7] + [5, 6]
    res = engine.generate(longer, cfg)
    assert res.reused_tokens == len(prompt) + 7
    assert res.tokens == plain_greedy(model, longer, 20)
    # an edit in the middle: only the shared prefix is reused
    edited = prompt[:12] + [1, 2, 3] + prompt[12:]
    res = engine.generate(edited, cfg)
    assert res.reused_tokens == 12
    assert res.tokens == plain_greedy(model, edited, 20)
    # the same prompt again: all of it comes from the cache, its last row too (the first step computed it)
    res = engine.generate(edited, cfg)
    assert res.reused_tokens == len(edited) and res.tokens == plain_greedy(model, edited, 20)
    # a shorter prompt than the cache
    res = engine.generate(prompt[:5], cfg)
    assert res.reused_tokens == 4 and res.tokens == plain_greedy(model, prompt[:5], 20)


def test_long_prompt_is_cut_from_the_left():
    model = tiny_model("qwen2", 5)
    engine = Engine(model, eos_token_ids=[])
    prompt = random_prompt(5, 600)  # the tiny model has 512 positions
    res = engine.generate(prompt, GenerationConfig(max_new_tokens=8))
    kept = prompt[-res.prompt_tokens:]
    assert res.prompt_tokens < 512 - 8 and res.tokens == plain_greedy(model, kept, 8)


def test_bad_input_is_a_clear_error_and_the_engine_stays_usable():
    model = tiny_model()
    engine = Engine(model, eos_token_ids=[])
    with pytest.raises(ValueError, match="empty prompt"):
        engine.generate([], GenerationConfig(max_new_tokens=4))
    with pytest.raises(ValueError, match="vocabulary"):
        engine.generate([1, 2, VOCAB + 5], GenerationConfig(max_new_tokens=4))
    with pytest.raises(ValueError, match="top_p"):
        engine.generate([1, 2], GenerationConfig(temperature=0.5, top_p=0.0))
    prompt = random_prompt(9, 10)
    assert engine.generate(prompt, GenerationConfig(max_new_tokens=6)).tokens == plain_greedy(model, prompt, 6)


def test_zero_new_tokens_only_prefills():
    model = tiny_model()
    engine = Engine(model, eos_token_ids=[])
    prompt = random_prompt(10, 15)
    res = engine.generate(prompt, GenerationConfig(max_new_tokens=0))
    assert res.tokens == [] and res.stop_reason == "max_tokens"
    res = engine.generate(prompt + [3], GenerationConfig(max_new_tokens=5))  # the warmed prompt is reused
    assert res.reused_tokens == 15 and res.tokens == plain_greedy(model, prompt + [3], 5)


def test_failed_forward_leaves_no_stale_cache():
    model = tiny_model("qwen2", 6)
    engine = Engine(model, eos_token_ids=[])
    prompt = random_prompt(6, 20)
    engine.generate(prompt, GenerationConfig(max_new_tokens=5))
    real = engine.verifier.forward

    def interrupted(*args, **kw):  # the cache took the new entries, then the forward failed
        real(*args, **kw)
        raise RuntimeError("interrupted")

    engine.verifier.forward = interrupted
    with pytest.raises(RuntimeError):
        engine.generate(prompt + [1], GenerationConfig(max_new_tokens=5))
    engine.verifier.forward = real
    res = engine.generate(prompt + [1], GenerationConfig(max_new_tokens=5))
    assert res.reused_tokens == 0 and res.tokens == plain_greedy(model, prompt + [1], 5)


def test_an_exception_between_forwards_keeps_the_cache_exact():
    model = tiny_model("qwen2", 6)
    engine = Engine(model, eos_token_ids=[])
    prompt = random_prompt(6, 20)

    def boom():
        raise RuntimeError("the caller failed between two forwards")

    with pytest.raises(RuntimeError):
        engine.generate(prompt, GenerationConfig(max_new_tokens=5), should_stop=boom)
    res = engine.generate(prompt, GenerationConfig(max_new_tokens=5))
    assert res.reused_tokens == len(prompt) and res.tokens == plain_greedy(model, prompt, 5)


def test_sliding_window_model_stays_inside_its_window():
    from transformers import MistralConfig, MistralForCausalLM

    torch.manual_seed(0)
    model = MistralForCausalLM(MistralConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=4096, sliding_window=128, initializer_range=0.3)).eval()
    prompt = random_prompt(8, 150)
    ref_prompt_len = 128 - 1 - 8 - 10 - 8 - 1  # window - 1 - max_new - draft_len - max_draft_nodes - 1
    kept = prompt[-ref_prompt_len:]
    ref = plain_greedy(model, kept, 8)
    source = ScriptedSource(kept + ref)
    engine = Engine(model, [(source, 1.0)], max_draft_nodes=8, eos_token_ids=[])
    res = engine.generate(prompt, GenerationConfig(max_new_tokens=8, draft_budget=8))
    assert res.prompt_tokens == ref_prompt_len and res.steps < 8
    assert res.tokens == ref


def test_int8_per_row_speculates_and_stays_exact():
    """Per-row int8 (rest_lsp/model/int8row.py) is batch-invariant: the engine keeps its drafts for an int8
    model, and its output is that model's plain greedy decoding (a full recomputation every token)."""
    import copy
    from types import SimpleNamespace

    from rest_lsp.model.int8row import quantize_model

    qmodel = quantize_model(copy.deepcopy(tiny_model("qwen2", 5)))
    prompt = random_prompt(5, 12)
    ref = plain_greedy(qmodel, prompt, N)
    loaded = SimpleNamespace(model=qmodel, tokenizer=None, precision="int8", name="tiny-int8", stop_ids=[])
    source = ScriptedSource(prompt + ref, wrong_branch=0.7)
    engine = Engine(loaded, [(source, 1.0)], eos_token_ids=[])
    assert engine.sources
    res = engine.generate(prompt, GenerationConfig(max_new_tokens=N, draft_budget=8))
    assert res.tokens == ref
    assert res.steps < N / 2  # drafts verified as trees and accepted
