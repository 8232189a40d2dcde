"""A client that sends whole-text changes (legal LSP, what simple clients do) gets the warm-up and the
prediction while typing as this project's clients do: the server locates the edit against the text before it
(rest_lsp/documents.py edit_end; the pure function is tested in test_documents.py). A real `rest-lsp --stdio`
process with the tiny model."""
from __future__ import annotations

from lsprotocol import types

from e2e_common import SOURCE, wait_for


async def test_a_whole_text_change_warms_and_predicts_as_an_incremental_one(session, tiny_model, tmp_path):
    await session.initialize({"model": str(tiny_model), "timeBudgetMs": 0, "maxTokens": 24, "draftBudget": 4,
                              "persistHistory": False, "cacheDir": str(tmp_path / "cache")})
    await session.wait_ready(workspace=False, timeout=120)
    inc, whole = (tmp_path / "inc.py").as_uri(), (tmp_path / "whole.py").as_uri()
    session.open(inc, SOURCE)
    session.open(whole, SOURCE)
    typed = SOURCE.replace("def main():\n    ", "def main():\n    r")
    st = await session.stats()
    assert st["totals"]["typing_predictions"] == 0      # opening a document says nothing about a cursor

    session.edit(inc, 2, (10, 4), (10, 4), "r")         # this project's clients: an incremental change
    await wait_for(session, lambda st: st["totals"]["typing_predictions"] == 1, "the incremental change's prediction")
    session.client.text_document_did_change(types.DidChangeTextDocumentParams(   # a plain client: the whole text
        types.VersionedTextDocumentIdentifier(uri=whole, version=2),
        [types.TextDocumentContentChangeWholeDocument(text=typed)]))
    await wait_for(session, lambda st: st["totals"]["typing_predictions"] == 2, "the whole-text change's prediction")
    session.client.text_document_did_change(types.DidChangeTextDocumentParams(   # the same text again: no edit
        types.VersionedTextDocumentIdentifier(uri=whole, version=3),
        [types.TextDocumentContentChangeWholeDocument(text=typed)]))

    # the pause after the key is answered from what was predicted at the guessed cursor, without a model call
    r = await session.complete(whole, 10, 5)
    st = await session.stats()
    last = st["recent"][-1]
    assert last["outcome"] in ("reused", "cache") and not last["model_call"], last
    assert r.items and r.items[0].range.start == types.Position(10, 5)
    assert st["totals"]["typing_predictions"] == 2 and st["totals"]["model_calls"] == 0
