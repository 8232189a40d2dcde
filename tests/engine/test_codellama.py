"""REST with a CodeLlama-layout model: FIM prompts in both orders, a workspace datastore in the model's own
tokenizer, the `<EOT>` stop; output identical to an independent plain greedy run (no KV cache: the whole
sequence recomputed for every token)."""
import copy
import dataclasses

import numpy as np
import pytest
import torch

from rest_lsp.engine import ContextSource, Engine, GenerationConfig
from rest_lsp.engine.sources import DatastoreSource
from rest_lsp.engine.trie import padded_rows, row_tuples
from rest_lsp.engine.vocab import clip_rows

from ._models import plain_greedy

PREFIX = 'import json\n\n\ndef load(path):\n    """Read a JSON file."""\n    with open(path) as f:\n        '
SUFFIX = "\n\n\ndef save(obj, path):\n    pass\n"
EOT = 32010
N = 40


@pytest.fixture(scope="module")
def lm(tmp_path_factory):
    from rest_lsp.model.host import load_model
    from testmodels.tiny import make_tiny_codellama_dir

    return load_model(make_tiny_codellama_dir(tmp_path_factory.mktemp("cl") / "model"), device="cpu")


@pytest.mark.parametrize("kind", ["eager", "auto"])
@pytest.mark.parametrize("order", ["psm", "spm"])
def test_rest_with_a_workspace_is_plain_greedy(lm, tmp_path, order, kind):
    from indexer.store import Datastore

    from rest_lsp.model.verifiers import make_verifier_or_eager

    ids = lm.build_prompt(PREFIX, SUFFIX, middle="retu", order=order, max_new_tokens=N)
    assert ids[:3] == ([1, 32007, 32008] if order == "spm" else [1, 32007, ids[2]])
    want = plain_greedy(lm.model, ids, N, set(lm.stop_ids))
    assert len(want) == N and len(set(want)) >= 6, "degenerate tiny model: exactness would not discriminate"
    # the workspace already holds this completion (accepted earlier): its drafts run long and get accepted
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "done.py").write_text(PREFIX + "retu" + lm.tokenizer.decode(want) + SUFFIX)
    store = Datastore.build([ws], tmp_path / "ds", tokenizer=lm.indexer_tokenizer)
    assert store.fingerprint["vocab_size"] == 32017 and store.manifest["width"] == 2
    engine = Engine(lm, [(ContextSource(), 0.5), (DatastoreSource(store, name="repository"), 0.5)],
                    verifier=make_verifier_or_eager(lm, kind))
    r = engine.generate(ids, GenerationConfig(max_new_tokens=N, draft_budget=8))
    assert r.tokens == want and r.stop_reason == "max_tokens"
    assert r.accepted_sources.get("repository", 0) > N // 2 and r.steps < N // 2
    # a second call on a longer middle reuses the prompt's KV cache and stays exact
    ids2 = lm.build_prompt(PREFIX, SUFFIX, middle="return", order=order, max_new_tokens=N)
    r2 = engine.generate(ids2, GenerationConfig(max_new_tokens=16, draft_budget=8))
    assert r2.tokens == plain_greedy(lm.model, ids2, 16, set(lm.stop_ids)) and r2.reused_tokens > 0


def test_eot_ends_the_infill_exactly(lm):
    ids = lm.build_prompt(PREFIX, SUFFIX, order="spm", max_new_tokens=N)
    free = plain_greedy(lm.model, ids, 12, set())
    model = copy.deepcopy(lm.model)
    with torch.no_grad():   # <EOT>'s logit: 1.5x that of the 8th token's, so the model ends its infill
        model.lm_head.weight[EOT] = 1.5 * model.lm_head.weight[free[7]]
    eot_lm = dataclasses.replace(lm, model=model)
    want = plain_greedy(model, ids, N, set())
    cut = want.index(EOT)
    source = ContextSource()
    source.set_buffer("earlier", ids + want)   # drafts that run through the <EOT>
    r = Engine(eot_lm, [(source, 1.0)]).generate(ids, GenerationConfig(max_new_tokens=N, draft_budget=8))
    assert EOT in lm.stop_ids and r.stop_reason == "eos"
    assert r.tokens == want[:cut] and EOT not in r.tokens


def test_ids_past_the_embedding_are_clipped_from_drafts(lm, tmp_path):
    from indexer.store import Datastore

    fill = lm.tokenizer.convert_tokens_to_ids("<FILL_ME>")
    assert fill == 32016 and fill >= lm.vocab_size   # in the tokenizer, not in the model
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "t.py").write_text("PLACEHOLDER = '<FILL_ME>'  # marker\n")
    store = Datastore.build([ws], tmp_path / "ds", tokenizer=lm.indexer_tokenizer)
    context = lm.tokenizer.encode("PLACEHOLDER =", add_special_tokens=False)
    drafts = DatastoreSource(store).propose(context, 6)
    quote = lm.tokenizer.convert_tokens_to_ids("▁'")
    assert [c[:2] for c, _ in drafts] == [(quote, fill)]   # the datastore holds the id, as the tokenizer gave it
    clipped = row_tuples(*clip_rows(*padded_rows(drafts), lm.vocab_size))
    assert [c for c, _ in clipped] == [(quote,)]   # cut before it
    rows = np.array([[fill, 5], [7, fill], [-2, -1]])  # -1 pads a row's end; any other negative id is cut
    assert row_tuples(*clip_rows(rows, np.array([1.0, 2.0, 1.0]), 32016)) == [((7,), 2.0)]
    for bad in (32016, -2):   # the compiled check's bounds: the last id and -1 stay, one past either is cut
        rows, weights = np.array([[32015, -1], [bad, 3]]), np.array([1.0, 2.0])
        assert clip_rows(rows, weights, 32016)[0].tolist() == [[32015, -1]]
        rows[1, 0] = 3
        assert clip_rows(rows, weights, 32016)[0] is rows   # nothing outside: the rows themselves
    with pytest.raises(IndexError):   # why: the embedding has no row for it
        lm.model(torch.tensor([[1, fill]]))
