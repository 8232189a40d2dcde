"""Runs advanced one forward at a time: warm-ups, interleaving, the pool of KV states, exactness throughout."""
import pytest

from rest_lsp.engine import ContextSource, Engine, GenerationConfig
from rest_lsp.engine.drafter import Drafter
from rest_lsp.engine.kvpool import KVPool, common_prefix

from ._models import ScriptedSource, plain_greedy, random_prompt, tiny_model

N = 12
MB = 1 << 20


@pytest.mark.parametrize("fast", [False, True], ids=["eager", "packed"])
def test_a_warm_up_leaves_nothing_to_compute_for_the_same_prompt(fast):
    model = tiny_model("qwen2", 1)
    verifier = None
    if fast:
        from rest_lsp.model.verifiers import make_verifier

        verifier = make_verifier(model, "packed", max_len=512)
    engine = Engine(model, [(ContextSource(), 1.0)], verifier=verifier, eos_token_ids=[])
    prompt = random_prompt(1, 90)
    warm = engine.start(prompt, GenerationConfig(max_new_tokens=0), chunk=32)
    forwards = 0
    while not warm.done:
        engine.advance(warm)
        forwards += 1
    assert forwards == 3 and warm.result.tokens == [] and engine.cached_tokens == 90  # 32 + 32 + 26
    res = engine.generate(prompt, GenerationConfig(max_new_tokens=N, draft_budget=4))
    assert res.reused_tokens == 90  # the warm-up kept the last token's logits: no forward before decoding
    assert res.tokens == plain_greedy(model, prompt, N)
    # typing on: a longer prompt reuses the whole earlier one
    longer = prompt + [3, 4]
    res = engine.generate(longer, GenerationConfig(max_new_tokens=N, draft_budget=4))
    assert res.reused_tokens == 90 and res.tokens == plain_greedy(model, longer, N)


def test_interleaved_runs_of_two_documents_are_each_exact():
    """A run set aside for another document's run resumes from its pooled state, with no recomputation."""
    model = tiny_model("qwen2", 2)
    engine = Engine(model, [(ContextSource(), 1.0)], eos_token_ids=[], kv_pool_bytes=64 * MB)
    a, b = random_prompt(21, 60), random_prompt(22, 70)
    cfg = GenerationConfig(max_new_tokens=N, draft_budget=4)
    ra, rb = engine.start(a, cfg, key="a"), engine.start(b, cfg, key="b")
    forwards = 0
    while not (ra.done and rb.done):
        for run in (ra, rb):
            if not run.done:
                engine.advance(run)
                forwards += 1
    assert ra.result.tokens == plain_greedy(model, a, N)
    assert rb.result.tokens == plain_greedy(model, b, N)
    # every forward decided tokens: switching documents brought each state back whole
    assert forwards == ra.result.steps + rb.result.steps
    assert engine.pool.hits >= ra.result.steps + rb.result.steps - 3


def test_without_a_pool_an_interleaved_run_recomputes_its_context_and_stays_exact():
    model = tiny_model("qwen2", 2)
    engine = Engine(model, [(ContextSource(), 1.0)], eos_token_ids=[])  # no pool: states are lost
    a, b = random_prompt(23, 40), random_prompt(24, 40)
    cfg = GenerationConfig(max_new_tokens=N, draft_budget=4)
    ra, rb = engine.start(a, cfg, key="a"), engine.start(b, cfg, key="b")
    while not (ra.done and rb.done):
        for run in (ra, rb):
            if not run.done:
                engine.advance(run)
    assert ra.result.tokens == plain_greedy(model, a, N) and rb.result.tokens == plain_greedy(model, b, N)


def test_the_pool_brings_back_a_document_after_another_took_the_cache():
    model = tiny_model("qwen2", 3)
    engine = Engine(model, eos_token_ids=[], kv_pool_bytes=64 * MB)
    a, b = random_prompt(31, 120), random_prompt(32, 100)
    cfg = GenerationConfig(max_new_tokens=4)
    engine.generate(a, cfg, key="a")
    engine.generate(b, cfg, key="b")
    res = engine.generate(a + [7], cfg, key="a")
    assert res.reused_tokens == 120 and res.tokens == plain_greedy(model, a + [7], 4)
    snap = engine.pool.snapshot()
    assert snap["states"] == 1 and 0 < snap["bytes"] <= snap["budget_bytes"]  # b's state waits there now


def test_a_deletion_rolls_the_cache_back_to_the_common_prefix():
    model = tiny_model("llama", 4)
    engine = Engine(model, eos_token_ids=[], kv_pool_bytes=64 * MB)
    prompt = random_prompt(41, 80)
    engine.generate(prompt, GenerationConfig(max_new_tokens=4), key="doc")
    edited = prompt[:50] + prompt[53:]  # three tokens deleted in the middle
    res = engine.generate(edited, GenerationConfig(max_new_tokens=6), key="doc")
    assert res.reused_tokens == 50 and res.tokens == plain_greedy(model, edited, 6)


def test_the_pool_keeps_within_its_budget_least_recently_used_first():
    model = tiny_model("qwen2", 5)
    probe = Engine(model, eos_token_ids=[], kv_pool_bytes=64 * MB)
    probe.generate(random_prompt(50, 100), GenerationConfig(max_new_tokens=1), key="x")
    one = probe.verifier.export_state().nbytes  # the size of one 100-token state
    engine = Engine(model, eos_token_ids=[], kv_pool_bytes=int(2.5 * one))
    prompts = [random_prompt(51 + i, 100) for i in range(4)]
    for i, p in enumerate(prompts):
        engine.generate(p, GenerationConfig(max_new_tokens=1), key=f"d{i}")
    assert len(engine.pool) == 2 and engine.pool.nbytes <= engine.pool.budget_bytes
    assert engine.pool.evicted == 1
    # d1 and d2 are pooled (d3 is in the verifier, d0 went first): d0 comes back from nothing
    assert engine.generate(prompts[0], GenerationConfig(max_new_tokens=1), key="d0").reused_tokens == 0
    assert engine.generate(prompts[2], GenerationConfig(max_new_tokens=1), key="d2").reused_tokens >= 99


def test_pool_put_replaces_a_state_it_extends_and_take_removes():
    pool = KVPool(1 << 30)
    from rest_lsp.engine.verifier import KVState

    st = KVState(3, 10, None)
    pool.put("doc", [1, 2, 3], st, None)
    pool.put("doc", [1, 2, 3, 4, 5], KVState(5, 10, None), None)
    pool.put("other", [1, 2], KVState(2, 10, None), None)
    assert len(pool) == 2
    entry, n = pool.take([1, 2, 3, 4, 9])
    assert entry.key == "doc" and n == 4 and len(pool) == 1
    assert pool.take([1, 2], better_than=2) is None
    assert common_prefix([1, 2, 3], [1, 2, 4, 5]) == 2 and common_prefix([], [1]) == 0


def test_the_drafter_never_proposes_ids_outside_the_vocabulary():
    drafter = Drafter([(ScriptedSource([0, 1, 2, 3, 70, 5]), 1.0)], vocab_size=64)
    tree = drafter.draft([0, 1], budget=8)
    assert tree.tokens == [1, 2, 3]  # cut before 70
    drafter = Drafter([(ScriptedSource([0, 1, 99, 5]), 1.0)], vocab_size=64)
    assert drafter.draft([0, 1], budget=8).tokens == [1]


def test_a_stopped_run_returns_what_it_decided():
    model = tiny_model("qwen2", 6)
    engine = Engine(model, eos_token_ids=[])
    prompt = random_prompt(61, 30)
    run = engine.start(prompt, GenerationConfig(max_new_tokens=N))
    while len(run.out) < 4:
        engine.advance(run)
    engine.stop(run, "superseded")
    assert run.done and run.result.stop_reason == "superseded"
    assert run.result.tokens == plain_greedy(model, prompt, N)[: len(run.result.tokens)]
    assert len(run.result.tokens) == len(run.out) >= 4  # every decided token, the pending one too
    assert engine.advance(run) == []


def test_an_interrupted_decoding_step_leaves_the_run_and_the_cache_and_runs_again_exactly():
    """Every decoding step (a draft tree) interrupted once between layers (a key made it moot; engine `advance`'s
    interrupt): it decides nothing and keeps nothing, the cache keeps what it held, and the same step run again
    gives plain greedy decoding's tokens. A prompt's forwards (prefill chunks, the first step) are never
    interrupted: the next key's prompt needs what they compute."""
    from rest_lsp.model.verifiers import make_verifier

    model = tiny_model("qwen2", 7)
    prompt = random_prompt(71, 72)
    ref = plain_greedy(model, prompt, 32)
    # drafts right for 4 tokens, then wrong: trees accepted in part
    engine = Engine(model, [(ScriptedSource(prompt + ref, corrupt_at=4), 1.0)],
                    verifier=make_verifier(model, "packed", max_len=512), eos_token_ids=[])
    run = engine.start(prompt, GenerationConfig(max_new_tokens=32, draft_budget=4), chunk=16)
    prompt_forwards = decoding = 0
    while not run.done:
        polls = []
        out, cached, prefilled = list(run.out), engine.cached_tokens, run.prefilled

        def interrupt() -> bool:  # true at the 1st, 2nd or 3rd poll: before a layer or before the head
            polls.append(1)
            return len(polls) > decoding % 3

        decided = engine.advance(run, interrupt=interrupt)
        if not prefilled:  # a prompt's forward: never polled, run whole
            assert polls == [] and run.interrupted == decoding and engine.cached_tokens > cached
            prompt_forwards += 1
            continue
        assert decided == [] and run.out == out and engine.cached_tokens == cached and not run.done
        assert run.interrupted == decoding + 1 and len(polls) == decoding % 3 + 1
        engine.advance(run)
        decoding += 1
    assert prompt_forwards == 5 and decoding >= 3  # 16 + 16 + 16 + 16, then the first step with the last 8
    assert run.result.tokens == ref
    assert run.forwards == prompt_forwards + decoding  # the interrupted forwards are not counted as done
    assert sum(run.result.accepted) > run.result.steps  # drafts were accepted: decoding steps with trees


def test_a_speculative_runs_prompt_forwards_are_interrupted_too_and_keep_nothing():
    """A prediction ahead's prompt holds a suggestion as if taken (`speculative`): a key contradicting it makes the
    prompt moot, so its prefill chunks and its first step stop between layers as a decoding step does, the cache
    and the run as before; advanced again without the interrupt, the run is plain greedy decoding's."""
    from rest_lsp.model.verifiers import make_verifier

    model = tiny_model("qwen2", 7)
    prompt = random_prompt(72, 72)
    ref = plain_greedy(model, prompt, 16)
    engine = Engine(model, [(ContextSource(), 1.0)], verifier=make_verifier(model, "packed", max_len=512),
                    eos_token_ids=[])
    run = engine.start(prompt, GenerationConfig(max_new_tokens=16, draft_budget=4), chunk=16, speculative=True)
    prompt_forwards = 0
    while not run.prefilled:
        cached, computed, polls = engine.cached_tokens, run.computed, []
        assert engine.advance(run, interrupt=lambda: polls.append(1) or len(polls) > 1) == []
        assert len(polls) == 2 and engine.cached_tokens == cached and run.computed == computed
        assert not run.prefilled and run.interrupted == prompt_forwards + 1
        engine.advance(run)
        prompt_forwards += 1
        assert engine.cached_tokens > cached
    assert prompt_forwards == 5 and run.computed == len(prompt)  # 16 + 16 + 16 + 16, then the first step's 8
    while not run.done:
        engine.advance(run)
    assert run.result.tokens == ref


def test_a_runs_ids_follow_its_prompt_and_output():
    """`Run.ids` (what the drafter reads each step): prompt + out as int64, the buffer grown in place."""
    from rest_lsp.engine.generate import Run

    run = Run(prompt=list(range(1000, 1300)), config=None, key=None, result=None, stops=None, rng=None)
    assert run.ids().tolist() == run.prompt and run.ids().dtype.name == "int64"
    run.out = [7]
    for step in range(200):
        run.out += [step, step + 1][: 1 + step % 2]
        ids = run.ids()
        assert ids.tolist() == run.prompt + run.out
    assert len(run._ids) >= len(ids) and ids.base is run._ids  # a view, not a copy per step


def test_a_run_stopped_mid_prompt_counts_what_it_computed_not_what_it_missed():
    """`computed_prompt_tokens` (rest/stats, bench_typing's prompt tokens per key) is what prefills computed: a
    run stopped after one chunk leaves the rest to the next run, which counts only that rest, while its prompt
    tokens not found in a cache when it started count the first chunk's share twice."""
    from rest_lsp.service.stats import Stats

    model = tiny_model("qwen2", 1)
    engine = Engine(model, [(ContextSource(), 1.0)], eos_token_ids=[])
    prompt = random_prompt(3, 90)
    stats = Stats()
    first = engine.start(prompt, GenerationConfig(max_new_tokens=N), chunk=32)
    engine.advance(first)
    engine.stop(first)
    second = engine.start(prompt, GenerationConfig(max_new_tokens=N), chunk=32)
    while not second.done:
        engine.advance(second)
    for run in (first, second):
        stats.record_run({"prompt_tokens": run.result.prompt_tokens, "reused_tokens": run.result.reused_tokens,
                          "computed_tokens": run.computed})
    assert (first.computed, second.computed, second.result.reused_tokens) == (32, 58, 32)
    assert stats.totals["computed_prompt_tokens"] == 90  # every prompt token computed once
    assert stats.totals["prompt_tokens"] - stats.totals["reused_prompt_tokens"] == 90 + 58
    assert second.result.tokens == plain_greedy(model, prompt, N)
