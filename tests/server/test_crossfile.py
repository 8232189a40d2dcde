"""Cross-file context: the block's format per model family, what the selectors find (and never find: excluded
files, secrets, the current file's own text), a block that stays put while typing, and REST exact with it."""
from __future__ import annotations

from pathlib import Path

import pytest

from indexer.discover import Filters
from indexer.locate import Locator
from indexer.store import Datastore
from rest_lsp.model.prompts import REPO_TOKENS, RepoContext, build_prompt, detect_fim, repo_block
from testmodels.tiny import train_tokenizer
from rest_lsp.service.crossfile import (ContextKeeper, Cursor, RecentRing, RepoView, Selection, Snippet,
                                        class_outline, in_old_order, names_near, new_definitions,
                                        select)

SECRET = "sk-live-" + "q8Zr3VwXk2LmN7pT4sHy6JbC9dFgA1eU"

REGISTRY = '''"""The plugin registry."""
_PLUGINS = {}


def register(name, *, priority=0, tags=()):
    """Register a plugin class under a name."""
    def deco(cls):
        _PLUGINS[name] = (cls, priority, tuple(tags))
        return cls
    return deco


class Context:
    """What a plugin gets."""

    def __init__(self, config, logger):
        self.config = config
        self.logger = logger

    def emit_event(self, kind, payload=None):
        self.logger.info("%s %s", kind, payload)

    def lookup_setting(self, key, default=None):
        return self.config.get(key, default)

    def fail_with(self, message):
        raise RuntimeError(message)
'''

PLUGIN = '''from pkg.registry import Context, register


@register("{name}", priority={p}, tags=("core",))
class {cls}:
    def run(self, ctx: Context):
        level = ctx.lookup_setting("{name}.level", 1)
        ctx.emit_event("{name}.start", {{"level": level}})
        return level
'''

CURRENT = '''from pkg.registry import Context, register


@register("gamma", priority=3, tags=("core",))
class Gamma:
    def run(self, ctx: Context):
        ctx.'''


@pytest.fixture(scope="module")
def tok():
    t = train_tokenizer(512)
    t.add_tokens(list(REPO_TOKENS), special_tokens=True)
    return t


@pytest.fixture(scope="module")
def plain_tok():
    return train_tokenizer(512)


def make_repo(root: Path) -> Path:
    (root / "pkg" / "plugins").mkdir(parents=True)
    (root / "pkg" / "registry.py").write_text(REGISTRY)
    for name, cls, p in (("alpha", "Alpha", 2), ("beta", "Beta", 1)):
        (root / "pkg" / "plugins" / f"{name}.py").write_text(PLUGIN.format(name=name, cls=cls, p=p))
    (root / "pkg" / "plugins" / "gamma.py").write_text(CURRENT)
    # a secret on a line of an indexed file, and an excluded file that defines a name the cursor uses
    (root / "pkg" / "settings.py").write_text(f'API_TOKEN = "{SECRET}"\nDEFAULT_LEVEL = 3\n')
    (root / "generated").mkdir()
    (root / "generated" / "lookup.py").write_text("def lookup_setting_fast(key):\n    return SECRET_TABLE[key]\n")
    return root


def index(root: Path, ds: Path, tok, filters: Filters) -> tuple:
    """The folder's datastore, a RepoView of it and the encoder the selectors take."""
    store = Datastore.build([root], ds, tokenizer=tok, filters=filters)
    enc = lambda t: tok.encode(t, add_special_tokens=False)  # noqa: E731
    return store, RepoView(root, store, enc, lambda ids: tok.decode(ids)), enc


@pytest.fixture
def repo(tmp_path, plain_tok):
    root = make_repo(tmp_path / "proj")
    store, view, enc = index(root, tmp_path / "ds", plain_tok, Filters(exclude_paths=("generated/",)))
    yield root, store, view, enc
    store.close()


def cursor(root: Path, text: str = CURRENT, rel: str = "pkg/plugins/gamma.py") -> Cursor:
    return Cursor(str(root / rel), text, "", text)


# ------------------------------------------------------------------------------------------------ format
def test_qwen_repository_format_puts_the_files_and_the_current_path_before_the_fim_prompt(tok):
    repo = RepoContext("proj", "pkg/plugins/gamma.py", (("pkg/registry.py", "class Context:\n    pass"),))
    fim = detect_fim(tok)
    ids = build_prompt(tok, "x = 1\n", "", fim, repo=repo)
    rn, fs = tok.convert_tokens_to_ids(list(REPO_TOKENS))
    assert ids[0] == rn and ids.count(fs) == 2
    text = tok.decode(ids)
    assert text.startswith("<|repo_name|>proj\n<|file_sep|>pkg/registry.py\nclass Context:\n    pass\n"
                           "<|file_sep|>pkg/plugins/gamma.py\n<|fim_prefix|>x = 1\n<|fim_suffix|>")
    # what follows the block is the prompt without one, token for token: the block never changes the
    # tokens after it (so their KV cache is the same whichever block precedes)
    block, _ = repo_block(tok, fim, repo)
    assert ids[len(block):] == build_prompt(tok, "x = 1\n", "", fim)


def test_families_without_repository_tokens_get_path_comments_before_the_prefix(plain_tok):
    repo = RepoContext("proj", "src/app.js", (("src/util.js", "export const f = 1;"), ("tools/x.py", "y = 2")))
    ids = build_prompt(plain_tok, "let a", "", detect_fim(plain_tok), repo=repo)
    text = plain_tok.decode(ids)
    assert text.startswith("<|fim_prefix|>// Path: src/util.js\nexport const f = 1;\n# Path: tools/x.py\ny = 2\n"
                           "// Path: src/app.js\nlet a<|fim_suffix|>")


def test_codellama_block_opens_the_document(tiny_codellama):
    from transformers import AutoTokenizer

    from rest_lsp.model.prompts import FIM_FORMATS

    ctok = AutoTokenizer.from_pretrained(tiny_codellama)
    repo = RepoContext("proj", "a.py", (("b.py", "def g():\n    return 1"),))
    ids = build_prompt(ctok, "x = g()", "", FIM_FORMATS["codellama"], repo=repo)
    pre = ctok.convert_tokens_to_ids("▁<PRE>")
    assert ids[:2] == [ctok.bos_token_id, pre]
    assert ctok.convert_ids_to_tokens(ids[2]).startswith("▁")  # the document's start carries the dummy space
    assert "# Path: b.py\ndef g():\n    return 1\n# Path: a.py\nx = g()" in ctok.decode(ids)


def test_a_block_too_large_for_the_budget_is_left_out(tok):
    repo = RepoContext("proj", "a.py", (("b.py", "z = 1\n" * 200),))
    ids = build_prompt(tok, "x = 1\n", "", detect_fim(tok), max_tokens=120, repo=repo)
    assert ids == build_prompt(tok, "x = 1\n", "", detect_fim(tok), max_tokens=120)


# ------------------------------------------------------------------------------------------------ selection
def test_locator_finds_files_and_offsets_of_a_token_sequence(repo):
    root, store, view, enc = repo
    loc = Locator(store)
    pattern = enc(" lookup_setting")
    total, hits = loc.occurrences(pattern)
    assert {Path(p).relative_to(root).as_posix() for p, _ in hits} == {"pkg/registry.py"}  # `def lookup_setting`
    assert total == len(hits) == 1
    # after a dot too (`ctx.lookup_setting`): the name without its space
    assert {Path(p).relative_to(root).as_posix() for p in view.files_with("lookup_setting")} == {
        "pkg/registry.py", "pkg/plugins/alpha.py", "pkg/plugins/beta.py"}
    for p, off in hits:
        assert loc.tokens(p)[off:off + len(pattern)].tolist() == pattern
    # excluded: never indexed, never found
    assert not loc.occurrences(enc("lookup_setting_fast"))[1]


def test_a_changed_file_is_found_in_its_new_version_only(repo):
    root, store, view, enc = repo
    (root / "pkg" / "plugins" / "beta.py").write_text("from pkg.registry import register\n")
    store.update_paths([root / "pkg" / "plugins" / "beta.py"])
    assert {Path(p).name for p in view.files_with("lookup_setting")} == {"registry.py", "alpha.py"}


def test_definitions_give_the_class_outline_the_cursor_needs(repo):
    root, store, view, enc = repo
    sel = select([view], cursor(root), budget=1000, selectors=["definitions"], ring=None, encode=enc)
    defs = [s for s in sel.snippets if s.selector == "definitions"]
    ctx_def = next(s for s in defs if s.text.startswith("class Context"))
    assert ctx_def.path == "pkg/registry.py"
    for method in ("emit_event", "lookup_setting", "fail_with"):
        assert f"def {method}(self" in ctx_def.text
    assert "self.logger.info" not in ctx_def.text  # an outline: no method bodies
    assert any(s.text.startswith("def register(") for s in defs)
    # the block: the current file's path last, the registry's snippets in one file entry
    assert sel.repo.path == "pkg/plugins/gamma.py" and sel.repo.name == "proj"
    assert [p for p, _ in sel.repo.files].count("pkg/registry.py") == 1


def test_selection_fits_the_budget_and_never_repeats_the_current_file(repo):
    root, store, view, enc = repo
    for budget in (0, 60, 150, 400):
        sel = select([view], cursor(root), budget=budget, selectors=["definitions", "similar", "recent"],
                     ring=None, encode=enc)
        assert sel.tokens <= budget
        assert sum(len(enc(s.text)) for s in sel.snippets) <= budget
        assert all(s.path != "pkg/plugins/gamma.py" for s in sel.snippets)
    assert select([view], cursor(root), budget=0, selectors=["definitions"], ring=None, encode=enc).snippets == ()
    big = select([view], cursor(root), budget=400, selectors=["definitions", "similar"], ring=None, encode=enc)
    assert big.snippets  # the budget, not a lack of candidates, kept the small ones small


def test_similar_code_comes_from_the_sibling_modules(repo):
    root, store, view, enc = repo
    sel = select([view], cursor(root), budget=1000, selectors=["similar"], ring=None, encode=enc)
    assert sel.snippets and all(s.selector == "similar" for s in sel.snippets)
    assert {s.path for s in sel.snippets} <= {"pkg/plugins/alpha.py", "pkg/plugins/beta.py"}
    assert any("ctx.lookup_setting(" in s.text for s in sel.snippets)


MATCHED = [
    "def load_table(reader, schema):",
    "    rows = reader.fetch_all()",
    "    if not rows:",
    "        raise EmptyTable(schema.name)",
    "    columns = schema.column_names()",
    "    for row in rows:",
    "        check_width(row, columns)",
    "    table = Table(schema, rows)",
    "    table.freeze()",
    "    return table",
]


def test_similar_code_is_what_follows_the_place_that_corresponds_to_the_cursor(tmp_path, plain_tok):
    # the sibling repeats the document's last ten lines at its lines 30-39 and goes on with lines only it has:
    # the snippet is four lines of the match and the twelve after it (lines 36-51), whichever part of the match
    # most n-grams fall in
    root = tmp_path / "proj"
    (root / "pkg").mkdir(parents=True)
    filler = [f"WEIGHT_{k} = {k * 7} + OFFSET_{k % 5}" for k in range(30)]
    after = [f"def step_{k}(table):  # CONTINUES {k}" if k % 3 == 0 else f"    return table.part({k})"
             for k in range(20)]
    (root / "pkg" / "sibling.py").write_text("\n".join(filler + MATCHED + after) + "\n")
    current = "\n".join(MATCHED) + "\n"
    (root / "pkg" / "current.py").write_text(current)
    store, view, enc = index(root, tmp_path / "ds", plain_tok, Filters())
    try:
        sel = select([view], Cursor(str(root / "pkg" / "current.py"), current, "", current), budget=2000,
                     selectors=["similar"], ring=None, encode=enc)
    finally:
        store.close()
    best = max(sel.snippets, key=lambda s: s.score)
    assert (best.path, best.start, best.end) == ("pkg/sibling.py", 36, 52)
    assert best.text.split("\n")[4] == after[0] and "CONTINUES 9" in best.text


ODD = '''"""Helpers that share no plugin pattern."""
import math


def spiral_radius(turns, growth_factor):
    return math.exp(growth_factor * turns)


def spiral_points(turns, growth_factor, samples):
    return [spiral_radius(turns * k / samples, growth_factor) for k in range(samples)]
'''


def test_a_new_file_gets_the_head_of_its_folders_most_typical_sibling_then_of_the_one_most_like_it(repo):
    root, store, view, enc = repo
    (root / "pkg" / "plugins" / "odd.py").write_text(ODD)
    store.update_paths([root / "pkg" / "plugins" / "odd.py"])
    new = "pkg/plugins/delta.py"   # a new module: nothing in it names anything yet
    sel = select([view], cursor(root, "", new), budget=400, selectors=["siblings"], ring=None, encode=enc)
    [sib] = sel.snippets
    assert sib.selector == "siblings" and sib.path in ("pkg/plugins/alpha.py", "pkg/plugins/beta.py")
    assert sib.start == 0 and sib.text.startswith("from pkg.registry import Context, register\n\n\n@register(")
    assert sib.tokens <= 200   # half the budget: a definition still fits beside it
    # once the document says what it is like, its likeness decides, and never a folder outside its own
    text = "import math\n\n\ndef spiral_length(turns, growth_factor, samples):\n    radius = spiral_radius("
    sel = select([view], cursor(root, text, new), budget=400, selectors=["siblings"], ring=None, encode=enc)
    assert [s.path for s in sel.snippets] == ["pkg/plugins/odd.py"]
    small = select([view], cursor(root, "", new), budget=40, selectors=["siblings"], ring=None, encode=enc)
    assert small.tokens <= 20 and (not small.snippets or small.snippets[0].text.count("\n") < sib.text.count("\n"))
    alone = select([view], cursor(root, "", "pkg/registry_two.py"), budget=400, selectors=["siblings"], ring=None,
                   encode=enc)
    assert {s.path for s in alone.snippets} <= {"pkg/registry.py", "pkg/settings.py"}


def test_no_secret_and_no_excluded_file_enters_a_block(repo):
    root, store, view, enc = repo
    ring = RecentRing()
    # the person was in the settings file and in the excluded one: the ring holds both places
    ring.add(str(root / "pkg" / "settings.py"), (root / "pkg" / "settings.py").read_text(), 0)
    ring.add(str(root / "generated" / "lookup.py"), (root / "generated" / "lookup.py").read_text(), 0)
    text = CURRENT + "lookup_setting_fast(API_TOKEN, DEFAULT_LEVEL)\n"
    sel = select([view], cursor(root, text), budget=2000, selectors=["definitions", "similar", "recent"],
                 ring=ring, encode=enc)
    # a new file beside the settings file: its head is masked too
    beside = select([view], cursor(root, "DEFAULT_LEVEL = 1\n", "pkg/other.py"), budget=2000, selectors=["siblings"], ring=None,
                    encode=enc)
    assert [s.path for s in beside.snippets] == ["pkg/settings.py"] and SECRET not in "\n".join(t for _, t in beside.repo.files)
    block = "\n".join(t for _, t in sel.repo.files)
    assert "settings.py" in {Path(p).name for p, _ in sel.repo.files}  # the recent place is there ...
    assert "DEFAULT_LEVEL = 3" in block
    assert SECRET not in block                                          # ... without its secret
    assert "SECRET_TABLE" not in block and all(not p.startswith("generated") for p, _ in sel.repo.files)


def test_names_near_the_cursor_nearest_first():
    prefix = "from pkg.registry import Context, register\nimport json\n\nx = load_things()\nctx.emit_event("
    names = names_near(prefix)
    assert names[:3] == ["emit_event", "ctx", "load_things"]
    assert "Context" in names and "register" in names and "import" not in names


def test_class_outline_keeps_multi_line_signatures():
    lines = "class A:\n    x = 1\n\n    def f(self,\n          a, b):\n        return a\n".split("\n")
    assert class_outline(lines, 0, 20) == "class A:\n    x = 1\n    def f(self,\n          a, b):"


# ------------------------------------------------------------------------------------------------ stability
def test_the_block_changes_only_when_the_selection_does(repo):
    root, store, view, enc = repo
    keeper = ContextKeeper()
    uri = "file:///proj/pkg/plugins/gamma.py"
    sel = select([view], cursor(root), budget=400, selectors=["definitions"], ring=None, encode=enc)
    assert keeper.offer(uri, sel) and keeper.current(uri) is None   # pending until its prompt is computed
    assert keeper.promote(uri, sel) and keeper.current(uri) is sel
    again = select([view], cursor(root, CURRENT + "emit"), budget=400, selectors=["definitions"], ring=None,
                   encode=enc)
    assert not keeper.offer(uri, again) and keeper.current(uri) is sel  # the same snippets: nothing to redo
    # typing a name the selection was not made for is a reason to select again; a known one is not
    assert not keeper.new_names(uri, CURRENT + "emit", "")  # a word still being typed does not count yet
    assert keeper.new_names(uri, CURRENT + "fail_with(", "")
    # only a name the definitions selector would look up: called, another object's attribute, imported; not a
    # name the line assigns or defines (the current file's own, which no selection looks up)
    body = CURRENT.rsplit("\n", 1)[0] + "\n"
    assert not keeper.new_names(uri, body + "        SUPPORTS_TIMEOUTS = True", "")
    assert not keeper.new_names(uri, body + "    def fetch_all(self, limit", "")
    assert keeper.new_names(uri, body + "        ctx.fetch_all ", "")
    assert keeper.new_names(uri, "from pkg.errors import PluginFailure, ", "")
    # a selection that differs stays pending until promoted; an older pending one cannot be promoted
    other = select([view], cursor(root), budget=400, selectors=["similar"], ring=None, encode=enc)
    assert keeper.offer(uri, other) and keeper.current(uri) is sel
    assert not keeper.promote(uri, again) and keeper.promote(uri, other) and keeper.current(uri) is other
    # a pending block whose prompt was never computed (its job dropped) is offered again by the next selection
    third = select([view], cursor(root), budget=400, selectors=["definitions", "similar"], ring=None, encode=enc)
    assert keeper.offer(uri, third)
    keeper.withdraw(uri, third)
    assert keeper.pending(uri) is None and keeper.offer(uri, third) and keeper.pending(uri) is third


def test_a_keystroke_or_a_save_changes_the_block_only_for_a_new_definition(repo):
    root, store, view, enc = repo
    keeper = ContextKeeper()
    uri = "file:///proj/pkg/plugins/gamma.py"
    defs = select([view], cursor(root), budget=400, selectors=["definitions"], ring=None, encode=enc)
    assert any(s.selector == "definitions" for s in defs.snippets)
    keeper.offer(uri, defs)
    keeper.promote(uri, defs)
    # the same definitions and other similar code (the window slid): a keystroke or a save keeps the block, a
    # file switch takes the change
    similar = Snippet("pkg/plugins/alpha.py", 4, 9, PLUGIN.split("\n", 4)[4], "similar", 0.5, 30)
    more = Selection(defs.repo, defs.snippets + (similar,), defs.names, defs.tokens + 30)
    assert not new_definitions(more, defs)
    assert not keeper.offer(uri, more, in_place=True)
    assert keeper.pending(uri) is None and keeper.current(uri) is defs and keeper.counts["kept"] == 1
    assert keeper.offer(uri, more) and keeper.pending(uri) is more
    # one asked for in place that brings a definition the block lacks is offered
    only_similar = Selection(defs.repo, (similar,), defs.names, 30)
    keeper.set_current(uri, only_similar)
    assert new_definitions(defs, only_similar) and keeper.offer(uri, defs, in_place=True)
    assert keeper.pending(uri) is defs


def test_a_changed_block_keeps_the_files_it_shares_with_the_old_one_first(tok):
    def snip(path, text, selector, score):
        return Snippet(path, 0, text.count("\n") + 1, text, selector, score, 10)

    sib = snip("pkg/plugins/alpha.py", "from pkg.registry import Context, register", "siblings", 1.0)
    reg = snip("pkg/registry.py", "class Context:\n    def emit_event(self, kind): ...", "definitions", 2.0)
    new = snip("pkg/events.py", "def publish(kind, payload):\n    ...", "definitions", 3.0)
    sim = snip("pkg/plugins/beta.py", "ctx.emit_event('beta.start')", "similar", 0.5)

    def selection(*snippets):  # files in the order `select` gives them: the best last
        files = tuple((s.path, s.text) for s in snippets)
        return Selection(RepoContext("proj", "pkg/plugins/gamma.py", files), snippets, frozenset(), 40)

    keeper = ContextKeeper()
    uri = "file:///proj/pkg/plugins/gamma.py"
    old = selection(sib, reg)
    assert keeper.offer(uri, old) is old and keeper.promote(uri, old)
    ranked = selection(sim, reg, sib, new)  # a new definition, and the old files ranked otherwise
    taken = keeper.offer(uri, ranked, in_place=True)
    assert taken is keeper.pending(uri) and taken.keys == ranked.keys
    assert [p for p, _ in taken.repo.files] == ["pkg/plugins/alpha.py", "pkg/registry.py", "pkg/plugins/beta.py",
                                                "pkg/events.py"]
    assert [s.path for s in taken.snippets] == [p for p, _ in taken.repo.files]
    # the prompt after the change starts with the old block's files token for token; in the ranked order it
    # would differ from the first file on
    fim = detect_fim(tok)
    before, changed, ranked_ids = (build_prompt(tok, CURRENT, "", fim, repo=s.repo) for s in (old, taken, ranked))
    old_files, _ = repo_block(tok, fim, RepoContext("proj", "", old.repo.files))
    shared = next(i for i, (a, b) in enumerate(zip(before, changed)) if a != b)
    assert shared >= len(old_files) - 1
    assert next(i for i, (a, b) in enumerate(zip(before, ranked_ids)) if a != b) < shared
    # a file whose snippets changed is a new file; nothing shared: the selection as ranked
    assert in_old_order(ranked, selection(snip("pkg/registry.py", "class Other: ...", "definitions", 2.0))) is ranked
    assert in_old_order(ranked, None) is ranked


# ------------------------------------------------------------------------------------------------ the daemon
def _wait(cond, timeout=120.0):
    import time

    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.05)
    return False


@pytest.fixture
def daemon(tmp_path, tiny_model):
    """The service with the tiny model and the repository indexed as the daemon indexes a workspace folder."""
    import asyncio

    from rest_lsp.service.config import ServerConfig
    from rest_lsp.service.core import CompletionService
    from rest_lsp.service.workspace import WorkspaceIndex

    root = make_repo(tmp_path / "proj")
    service = CompletionService(ServerConfig(model=str(tiny_model), cache_dir=str(tmp_path / "cache"),
                                             persist_history=False, exclude=["generated/"], max_tokens=8,
                                             cross_file=True),
                                notify=lambda level, msg: None)
    service.start()
    index = WorkspaceIndex(service, lambda level, msg: None)
    index.start([str(root)])
    assert index.wait_idle(timeout=120)
    loop = asyncio.new_event_loop()
    yield service, root, loop
    loop.close()
    index.close()
    service.close()


def test_the_daemon_selects_in_the_background_and_switches_only_when_the_block_is_computed(daemon):
    from rest_lsp.service.core import CompletionRequest

    service, root, loop = daemon
    uri = (root / "pkg" / "plugins" / "gamma.py").as_uri()
    text = CURRENT
    line, col = text.count("\n"), len(text.split("\n")[-1])
    service.document_changed(uri, text, line, col)
    assert _wait(lambda: service.crossfile.current(uri) is not None and service.crossfile.pending(uri) is None)
    sel = service.crossfile.current(uri)
    assert any(s.text.startswith("class Context") for s in sel.snippets)
    assert service.stats.totals.get("context_warm_tokens", 0) > 0  # its prompt was computed before the switch
    selections = service.crossfile.counts["selections"]
    # keystrokes that bring no new name keep the block: no selection, the same block in every prompt
    for k, ch in enumerate("emit"):
        service.document_changed(uri, text + "emit"[:k + 1], line, col + k + 1)
    resp = loop.run_until_complete(service.complete(CompletionRequest(uri, text + "emit", line, col + 4,
                                                                      automatic=False)))
    assert service.crossfile.counts["selections"] == selections and service.crossfile.current(uri) is sel
    rec = resp.record
    assert rec["context"]["snippets"] == sel.describe() and rec["context"]["tokens"] == sel.tokens
    assert service.snapshot()["cross_file"]["documents"][uri]["current"] == sel.describe()
    # off: no block in the prompt, and the record says so
    service.configure({"crossFile": False})
    resp = loop.run_until_complete(service.complete(CompletionRequest(uri, text + "emit_", line, col + 5,
                                                                      automatic=False)))
    assert resp.record["context"] is None


def test_rest_with_the_block_is_exact(daemon):
    """REST decoding of a prompt that starts with a cross-file block emits what plain greedy decoding of the
    same prompt emits (the snippets draft, the verifier decides)."""
    from dataclasses import replace

    from rest_lsp.service.prompt import build_context

    service, root, loop = daemon
    uri = (root / "pkg" / "plugins" / "gamma.py").as_uri()
    backend = service.worker.backend
    ctx = build_context(CURRENT, CURRENT.count("\n"), len(CURRENT.split("\n")[-1]))
    sel = service.selection_for(backend, uri, CURRENT, ctx)
    assert sel.snippets
    cfg = replace(service.config, max_tokens=24, max_lines=4)

    def decode(budget):
        def job(b):
            b.reset_kv_cache()
            run = b.start(uri, ctx, replace(cfg, draft_budget=budget), repo=sel.repo)
            while not run.done:
                b.advance(run)
            return run.run.tokens[:], b.figures(run)
        return service.worker.run_sync(job)

    plain, pf = decode(0)
    rest, rf = decode(None)
    assert rest == plain and len(plain) > 0
    assert pf["prompt_tokens"] == rf["prompt_tokens"] > sel.tokens


def test_every_selector_is_a_setting_and_the_default_takes_them_all():
    from rest_lsp.service import config
    from rest_lsp.service.crossfile import SELECTORS

    assert config.CROSS_FILE_SELECTORS == SELECTORS   # the daemon's settings name what select() knows
    assert config.ServerConfig().cross_file_selectors == list(SELECTORS)
    assert config._coerce("cross_file_selectors", ["siblings"], None) == ["siblings"]
    with pytest.raises(ValueError, match="siblings"):   # the error lists what is allowed
        config._coerce("cross_file_selectors", ["neighbours"], None)


def test_auto_puts_a_block_before_a_document_that_fits_the_prefix_window_only(daemon):
    """`crossFile: "auto"` (the default): other files' code while the whole document fits the prompt's prefix
    window (a new or short file); a longer document selects nothing and its prompts hold no block; a short one
    that grows past the window keeps its block (a new module being written), and a long one cut under the
    window gets one only well under it."""
    from rest_lsp.service.config import ServerConfig
    from rest_lsp.service.core import CompletionRequest

    assert ServerConfig().cross_file == "auto"
    service, root, loop = daemon
    window = len(CURRENT) + 40
    service.configure({"crossFile": "auto", "maxPrefixChars": window})

    def ask(uri, text):
        line, col = text.count("\n"), len(text.split("\n")[-1])
        service.document_changed(uri, text, line, col)
        return loop.run_until_complete(service.complete(CompletionRequest(uri, text, line, col, automatic=False)))

    short = (root / "pkg" / "plugins" / "gamma.py").as_uri()
    service.document_changed(short, CURRENT, CURRENT.count("\n"), len(CURRENT.split("\n")[-1]))
    assert _wait(lambda: service.crossfile.current(short) is not None and service.crossfile.pending(short) is None)
    # (a text no prediction started before the block was computed already covers)
    assert ask(short, CURRENT + "em").record["context"]["snippets"] == service.crossfile.current(short).describe()

    long_text = "# " + "a long module's header line\n# " * 3 + "\n" + CURRENT  # longer than the window
    assert len(long_text) > window
    long_uri = (root / "pkg" / "plugins" / "delta.py").as_uri()
    selections = service.crossfile.counts["selections"]
    assert ask(long_uri, long_text).record["context"] is None
    assert ask(long_uri, long_text + "run").record["context"] is None
    assert service.crossfile.current(long_uri) is None and service.crossfile.pending(long_uri) is None
    assert service.crossfile.counts["selections"] == selections   # nothing selected for it

    grown = CURRENT + "run()\n        " + "x = 1\n        " * 4  # the short document grows past the window
    assert len(grown) > window
    assert ask(short, grown).record["context"]["snippets"] == service.crossfile.current(short).describe()
    # the long one cut to just under the window: still none (each switch costs the whole prompt, so no switch at
    # every line edited around the limit); well under it, a block
    near, back = CURRENT + "em" + " " * 30, CURRENT + "ctx"   # (texts no earlier prediction covers)
    assert window * 0.9 < len(near) <= window and len(back) <= window * 0.9
    assert ask(long_uri, near).record["context"] is None
    ask(short, grown + "x")   # away and back: a file switch selects
    ask(long_uri, back)
    assert _wait(lambda: service.crossfile.current(long_uri) is not None and service.crossfile.pending(long_uri) is None)
    assert ask(long_uri, back + "em").record["context"]["snippets"] == service.crossfile.current(long_uri).describe()


def test_cross_file_setting_is_true_false_or_auto():
    from rest_lsp.service import config

    for value in (True, False, "auto"):
        assert config._coerce("cross_file", value, None) == value
    for bad in ("on", 1, None):
        with pytest.raises(ValueError, match="cross_file"):
            config._coerce("cross_file", bad, None)
    cfg = config.ServerConfig(max_prefix_chars=100)
    assert config.cross_file_on(cfg, "cpu", 100) and not config.cross_file_on(cfg, "cpu", 101)
    assert config.cross_file_on(config.ServerConfig(), "cpu", 3000) and \
        not config.cross_file_on(config.ServerConfig(), "cpu", 3001)            # the CPU's prefix window
    assert config.cross_file_on(config.ServerConfig(), "cuda", 6000)         # a GPU's is larger
    assert config.cross_file_on(cfg, "cpu", 90, was_long=True)
    assert not config.cross_file_on(cfg, "cpu", 91, was_long=True)
    assert config.cross_file_on(cfg, "cpu", 10 ** 6, born_short=True)
    assert not config.cross_file_on(config.ServerConfig(cross_file=False), "cpu", 0, born_short=True)
    assert config.cross_file_on(config.ServerConfig(cross_file=True), "cpu", 10 ** 6)
    assert not config.cross_file_on(config.ServerConfig(cross_file=False), "cpu", 0)


def test_auto_follows_the_prefix_window_of_the_backend_that_builds_the_prompts():
    """A team server's prompts have its own prefix window (6,000 characters), not this CPU's (3,000): `auto`
    gives a 4,000-character document a block there, not here."""
    from types import SimpleNamespace

    from rest_lsp.service.blocks import Blocks
    from rest_lsp.service.config import ServerConfig
    from rest_lsp.service.remote import RemoteBackend

    def on(backend) -> bool:
        blocks = Blocks(ServerConfig, None, None, SimpleNamespace(backend=backend), None)
        try:
            return blocks._on("file:///m.py", "x" * 4000)
        finally:
            blocks.close()

    local_cpu = SimpleNamespace(prompt_device="cpu")
    remote = RemoteBackend.__new__(RemoteBackend)   # its prompt windows only: no tokenizer, no server
    assert not on(local_cpu) and on(remote)


def test_auto_keeps_the_block_of_a_document_first_seen_within_the_window():
    """A new module being written keeps its block past the CPU's 3,000-character window; a document first seen
    past it has none, gets one only under 90% of the window, and loses it again past the window; `true` when
    first seen does not make a long document keep one under `auto` later."""
    from types import SimpleNamespace

    from rest_lsp.service.blocks import Blocks
    from rest_lsp.service.config import ServerConfig

    settings = {"config": ServerConfig()}
    blocks = Blocks(lambda: settings["config"], None, None, SimpleNamespace(backend=SimpleNamespace(prompt_device="cpu")),
                    None)
    try:
        assert blocks._on("file:///new.py", "x" * 100) and blocks._on("file:///new.py", "x" * 5000)
        assert not blocks._on("file:///long.py", "x" * 4000)
        assert not blocks._on("file:///long.py", "x" * 2900)    # under the window, not under 90% of it
        assert blocks._on("file:///long.py", "x" * 2000)
        assert not blocks._on("file:///long.py", "x" * 4000)
        settings["config"] = ServerConfig(cross_file=True)
        assert blocks._on("file:///other.py", "x" * 4000)
        settings["config"] = ServerConfig()
        assert not blocks._on("file:///other.py", "x" * 4000)
        blocks.closed("file:///new.py")   # reopened long: a document first seen past the window
        assert not blocks._on("file:///new.py", "x" * 5000)
    finally:
        blocks.close()


def test_the_block_budget_is_that_of_the_backend_that_builds_the_prompts(monkeypatch):
    """A team server's block holds 2,048 tokens (its prompt windows are a GPU's), this CPU's 512."""
    from types import SimpleNamespace

    from rest_lsp.service import blocks as blocks_mod
    from rest_lsp.service.config import ServerConfig
    from rest_lsp.service.prompt import build_context
    from rest_lsp.service.remote import RemoteBackend

    asked = []
    monkeypatch.setattr(blocks_mod, "text_codec", lambda backend: (str.split, " ".join))
    monkeypatch.setattr(blocks_mod, "select", lambda views, cur, *, budget, **kw: asked.append(budget))

    def budget(backend) -> int:
        blocks = blocks_mod.Blocks(lambda: ServerConfig(), SimpleNamespace(keys=lambda: []), None,
                                   SimpleNamespace(backend=backend), None)
        try:
            blocks.selection_for(backend, "file:///m.py", "x = 1\n", build_context("x = 1\n", 1, 0))
            return asked.pop()
        finally:
            blocks.close()

    assert budget(SimpleNamespace(prompt_device="cpu")) == 512
    assert budget(RemoteBackend.__new__(RemoteBackend)) == 2048
