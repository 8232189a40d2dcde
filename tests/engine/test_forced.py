"""Token healing: an output that must start with a given text, exact against an independent constrained
greedy loop over the transformers model, with drafts, from a warmed cache, and through the fast verifiers."""
import pytest
import torch

from rest_lsp.engine import ContextSource, Engine, GenerationConfig

N = 16


@pytest.fixture(scope="module")
def lm(tmp_path_factory):
    from rest_lsp.model.host import load_model
    from testmodels.tiny import make_tiny_model_dir

    return load_model(make_tiny_model_dir(tmp_path_factory.mktemp("forced") / "m", seed=3), device="cpu",
                      precision="fp32")


def reference(lm, prompt, forced, n):
    """Greedy decoding with no cache, restricted while `forced` is not spelled out to the tokens whose text
    starts with what is left of it or is a start of it (each token's text decoded on its own)."""
    tok = lm.tokenizer
    texts = [tok.decode([i]) for i in range(lm.model.config.vocab_size)]
    special = set(tok.all_special_ids)
    seq, out, left = list(prompt), [], forced
    with torch.no_grad():
        for _ in range(n):
            logits = lm.model(torch.tensor([seq])).logits[0, -1]
            if left:
                ok = [i for i, t in enumerate(texts) if i not in special and t and "\ufffd" not in t
                      and (t.startswith(left) or left.startswith(t))]
                nxt = max(ok, key=lambda i: float(logits[i]))
                t = texts[nxt]
                left = "" if t.startswith(left) else left[len(t):]
            else:
                nxt = int(logits.argmax())
            seq.append(nxt)
            out.append(nxt)
    return out


@pytest.mark.parametrize("forced", [" re", " ", "in", "  def"])
def test_forced_text_is_exact_with_drafts(lm, forced):
    prompt = lm.build_prompt("import json\n\n\ndef load(path):\n    with open(path) as f:\n", "\n")
    ref = reference(lm, prompt, forced, N)
    engine = Engine(lm, [(ContextSource(), 1.0)], eos_token_ids=[])
    res = engine.generate(prompt, GenerationConfig(max_new_tokens=N, draft_budget=4, forced_text=forced))
    assert res.tokens == ref
    assert res.text.startswith(forced)
    # the same engine again, the prompt's KV and its last row kept from the first call: no forward before the
    # first token, the same tokens
    res = engine.generate(prompt, GenerationConfig(max_new_tokens=N, draft_budget=4, forced_text=forced))
    assert res.tokens == ref and res.reused_tokens == len(prompt)


def test_forced_text_after_a_warm_up_uses_the_kept_logits_exactly(lm):
    prompt = lm.build_prompt("class Stack:\n    def push(self, item):\n", "\n")
    ref = reference(lm, prompt, " sel", N)
    engine = Engine(lm, [(ContextSource(), 1.0)], eos_token_ids=[])
    warm = engine.start(prompt, GenerationConfig(max_new_tokens=0), chunk=16)
    while not warm.done:
        engine.advance(warm)
    res = engine.generate(prompt, GenerationConfig(max_new_tokens=N, draft_budget=4, forced_text=" sel"))
    assert res.reused_tokens == len(prompt)  # no forward before the first (constrained) token
    assert res.tokens == ref


@pytest.mark.parametrize("kind", ["packed", "screened"])
def test_forced_text_through_the_fast_verifiers(lm, kind):
    from rest_lsp.model.ops import UnsupportedModel
    from rest_lsp.model.probes import bf16_packing_available
    from rest_lsp.model.verifiers import make_verifier

    if kind == "screened" and not bf16_packing_available():  # an AVX2-only CPU: refused with the reason
        with pytest.raises(UnsupportedModel, match="bf16"):
            make_verifier(lm, kind, max_len=512)
        return
    prompt = lm.build_prompt("def parse(text):\n    for line in text.splitlines():\n", "\n")
    plain = Engine(lm, verifier=make_verifier(lm, kind, max_len=512), eos_token_ids=[])
    want = plain.generate(prompt, GenerationConfig(max_new_tokens=N, draft_budget=0, forced_text=" if")).tokens
    engine = Engine(lm, [(ContextSource(), 1.0)], verifier=make_verifier(lm, kind, max_len=512), eos_token_ids=[])
    got = engine.generate(prompt, GenerationConfig(max_new_tokens=N, draft_budget=4, forced_text=" if"))
    assert got.tokens == want and got.text.startswith(" if")
    assert want == reference(lm, prompt, " if", N)  # fp32: the same as the transformers model


@pytest.mark.parametrize("verifier", ["hf", "packed"])
@pytest.mark.parametrize("forced", [" re", "  def", " "])
def test_forced_text_in_a_first_step_walks_the_drafts_exactly(lm, forced, verifier):
    """A key typed inside a word: the cache holds the prompt but its last tokens, which the first step computes
    with the draft tree; while the forced text is left, each node's token is the constrained pick, and drafts
    that spell it are accepted in that one forward."""
    from rest_lsp.model.verifiers import make_verifier
    from ._models import ScriptedSource

    prompt = lm.build_prompt("import json\n\n\ndef load(path):\n    with open(path) as f:\n", "\n")
    ref = reference(lm, prompt, forced, N)
    engine = Engine(lm, [(ScriptedSource(prompt + ref, vocab=lm.model.config.vocab_size), 1.0)], eos_token_ids=[],
                    verifier=None if verifier == "hf" else make_verifier(lm, verifier, max_len=512))
    engine.generate(prompt[:-3], GenerationConfig(max_new_tokens=0))
    run = engine.start(prompt, GenerationConfig(max_new_tokens=N, draft_budget=6, forced_text=forced))
    first = engine.advance(run)
    assert len(first) == 7 and first == ref[:7]  # the root's row, then the six drafted nodes, then the next
    while not run.done:
        engine.advance(run)
    assert run.result.tokens == ref and run.result.text.startswith(forced)


@pytest.mark.parametrize("text", [" ", "  ", " r", "re", "ret", " self", "x.it", "\n    "])
def test_agreeing_ids_are_the_tokens_that_start_or_begin_the_text_asked_twice(lm, text):
    from rest_lsp.engine.vocab import VocabIndex

    tok = lm.tokenizer
    vocab = VocabIndex(tok, lm.model.config.vocab_size)
    special = set(tok.all_special_ids)
    want = sorted(i for i, t in enumerate(tok.batch_decode([[i] for i in range(lm.model.config.vocab_size)],
                                                          clean_up_tokenization_spaces=False))
                  if i not in special and t and "\ufffd" not in t and (t.startswith(text) or text.startswith(t)))
    assert want  # the tiny tokenizer has tokens for each of these texts
    first, again = vocab.agreeing(text), vocab.agreeing(text)  # short texts are kept from the first time
    assert first.tolist() == want and again.tolist() == want
    assert first.dtype == torch.long


@pytest.mark.parametrize("verifier", ["hf", "packed", "screened"])
@pytest.mark.parametrize("typed", [0, 3])
def test_a_key_typed_against_the_output_takes_its_first_token_from_the_kept_row(lm, verifier, typed):
    """A person types a character the suggestion did not have. In the line layout the new prompt is the old one
    and the output up to the word being typed, and the forced text the word with the key: the run that made the
    suggestion computed that prompt's last row. The first token, the constrained pick among the tokens agreeing
    with the new word, comes from that row with no forward; the output is the constrained greedy one."""
    from rest_lsp.model.ops import UnsupportedModel
    from rest_lsp.model.verifiers import make_verifier

    def make():
        return None if verifier == "hf" else make_verifier(lm, verifier, max_len=512)

    try:
        make()
    except UnsupportedModel:  # screened on an AVX2-only CPU (tested above)
        pytest.skip("no bf16 packing on this CPU")
    prompt = lm.build_prompt("import json\n\n\ndef load(path):\n    with open(path) as f:\n", "\n")
    engine = Engine(lm, [(ContextSource(), 1.0)], eos_token_ids=[], verifier=make())
    # the suggestion's run decodes on past what a person reads (KEPT_ROWS is about its first positions)
    shown = engine.generate(prompt, GenerationConfig(max_new_tokens=3 * N, draft_budget=4, forced_text=" "))
    kept = prompt + shown.tokens[:typed]  # the output typed through, up to the word being typed
    after = lm.tokenizer.decode(shown.tokens[typed:])
    key = next(c for c in "zqxjkv" if not after.startswith(after[:1] + c))  # not what the output had
    forced = (" " if typed == 0 else "") + after[:1].strip() + key
    ref = reference(lm, kept, forced, N)
    run = engine.start(kept, GenerationConfig(max_new_tokens=N, draft_budget=4, forced_text=forced))
    first = engine.advance(run)
    assert (run.forwards, run.result.reused_tokens, first) == (0, len(kept), ref[:1])
    while not run.done:
        engine.advance(run)
    assert run.result.tokens == ref and run.result.text.startswith(forced)
    # an independent engine, plain decoding from an empty cache: the same tokens
    plain = Engine(lm, eos_token_ids=[], verifier=make())
    assert plain.generate(kept, GenerationConfig(max_new_tokens=N, draft_budget=0, forced_text=forced)).tokens == ref
