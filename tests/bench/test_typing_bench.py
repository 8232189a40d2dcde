"""benchmarks/bench_typing.py without a server or a download: the bodies it types sit where they were removed,
and typing them all in order gives back the original files."""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import bench_typing as T  # noqa: E402
from scripted_editor import ScriptedEditor  # noqa: E402

OLD = T.RHYTHMS["old"]  # these tests are about the client: its person takes a suggestion free, as it did


def module(tag: str) -> str:
    out = []
    for i in range(5):
        out.append(f"def {tag}_{i}(a, b):\n    \"\"\"Doc {i}.\"\"\"\n" +
                   "".join(f"    x{j} = a + {j} * b\n" for j in range(3 + i % 3)) + "    return x0\n\n")
    out.append("def outer(v):\n    def inner(w):\n        y = w + 1\n        z = y * 2\n        return z\n"
               "    return inner(v)\n")
    return "\n".join(out)


def type_all(opened: str, bodies: list) -> str:
    lines = opened.split("\n")
    for b in bodies:  # the order bench_typing types them in
        assert lines[b.line] == " " * b.indent, (b.line, lines[b.line])
        cur = lines[b.line]
        lines[b.line:b.line + 1] = (cur[:b.indent] + b.text + cur[b.indent:]).split("\n")
    return "\n".join(lines)


def prepared(tmp_path):
    """A two-file project and bench_typing's workspace of it: (project root, workspace, files)."""
    root = tmp_path / "proj"
    (root / "pkg").mkdir(parents=True)
    for tag in ("alpha", "beta"):
        (root / "pkg" / f"{tag}.py").write_text(module(tag))
    work = tmp_path / "work"
    work.mkdir()
    return (root, *T.prepare(root, n_files=2, limit=12, seed=3, work=work))


def test_bodies_are_typed_where_they_were_removed(tmp_path):
    root, ws, files = prepared(tmp_path)
    assert len(files) == 2
    assert sum(len(bodies) for _, _, bodies in files) >= 8  # several bodies per file: the case that went wrong
    for path, opened, bodies in files:
        assert path.read_text() == opened  # the workspace holds the file as opened
        original = (root / path.relative_to(ws)).read_text()
        assert opened != original
        assert type_all(opened, bodies) == original


def test_a_whole_file_is_typed_from_an_empty_file_among_its_untouched_siblings(tmp_path):
    root, _, _ = prepared(tmp_path)
    work = tmp_path / "work-whole"
    work.mkdir()
    ws, files = T.prepare_whole(root, ["pkg/beta.py"], work)
    [(path, opened, [body])] = files
    assert path == ws / "pkg" / "beta.py" and path.read_text() == opened == ""   # a new module, not missing
    assert (ws / "pkg" / "alpha.py").read_text() == (root / "pkg" / "alpha.py").read_text()
    assert type_all(opened, [body]) == (root / "pkg" / "beta.py").read_text()
    # indentation after a newline is the editor's, not typed
    assert sum(body.typed_mask) == len(body.text) - sum(len(ln) - len(ln.lstrip(" ")) for ln in body.text.split("\n"))
    with pytest.raises(SystemExit, match="no-such.py"):
        T.prepare_whole(root, ["pkg/no-such.py"], tmp_path / "work-bad")


def test_acceptable_cuts_at_a_word_boundary():
    assert T.acceptable("return total", "return total\n") == "return total"
    assert T.acceptable("return totally", "return total_sum\n") == "return "  # not half a word
    assert T.acceptable("return tot", "return total\n") == "return tot"  # all of it matches: taken
    assert T.acceptable("x", "y") == ""


def test_a_patient_person_waits_for_a_late_answer_and_an_impatient_one_does_not(monkeypatch):
    import asyncio
    import random
    monkeypatch.setattr(T, "interval", lambda person, ch, rng: 0.2 if ch == " " else 0.01)  # pauses after spaces
    monkeypatch.setattr(T, "START_S", 0.0)
    text = "alpha beta gamma delta"
    body = T.Body(Path("x.py"), 0, 0, text)
    tallies = {}
    for patient in (False, True):
        tally = T.new_tally()
        asyncio.run(T.type_body(ScriptedEditor(text, delay=0.3), body, random.Random(0), True, False, tally,
                                patient=patient, person=OLD))
        tallies[patient] = tally
    assert tallies[False]["shown"] == 0 and tallies[False]["accepted"] == 0  # each answer came after the next key
    assert tallies[True]["shown"] == tallies[True]["pauses"] == 3
    assert tallies[True]["accepted"] == len("beta") + len("gamma") + len("delta")


class LateEditor(ScriptedEditor):
    """Its server answers the first request at each place empty (the prompt past its budget) and sends
    rest/suggestionReady 50 ms later; asked again, it answers with what is about to be typed."""

    def __init__(self, text: str):
        super().__init__(text, delay=0.01)
        self.notices, self.asked = {}, set()

    def notice(self, version, line, col):
        import asyncio
        return self.notices.setdefault((version, line, col), asyncio.Event())

    def request(self, line, col, msg_id):
        import asyncio
        from types import SimpleNamespace
        place = (self.version, line, col)
        if place in self.asked:
            return super().request(line, col, msg_id)
        self.asked.add(place)
        asyncio.get_running_loop().call_later(0.05, self.notice(*place).set)

        async def empty():
            await asyncio.sleep(self.delay)
            return SimpleNamespace(items=[])
        return asyncio.ensure_future(empty())


def test_an_empty_answer_is_asked_again_at_the_servers_notice(monkeypatch):
    import asyncio
    import random
    monkeypatch.setattr(T, "interval", lambda person, ch, rng: 0.4 if ch == " " else 0.01)
    monkeypatch.setattr(T, "START_S", 0.0)
    text = "alpha beta gamma delta"
    tally = T.new_tally()
    asyncio.run(T.type_body(LateEditor(text), T.Body(Path("x.py"), 0, 0, text), random.Random(0), True, False,
                            tally, person=OLD))
    assert tally["pauses"] == tally["empty"] == tally["asked_again"] == tally["shown"] == 3
    assert tally["accepted"] == len("beta") + len("gamma") + len("delta")
    assert all(60 <= ms < 400 for ms in tally["shown_latency"]), tally["shown_latency"]


def test_methods_take_turns_body_by_body_in_alternating_order():
    order = T.interleaved(["b0", "b1", "b2"], ["rest", "plain"])
    assert order == [(0, "rest"), (0, "plain"), (1, "plain"), (1, "rest"), (2, "rest"), (2, "plain")]


def test_the_paired_summary_counts_bodies_each_method_won():
    rest = [{"accepted": a} for a in (10, 0, 5, 8)]
    plain = [{"accepted": a} for a in (4, 3, 5, 1)]
    line = T.paired(rest, plain)
    assert "mean +2.5" in line and "REST more in 2, plain more in 1, equal in 1" in line, line
    assert "4 bodies" in line


def test_the_paired_summary_of_one_body_has_no_standard_error():
    line = T.paired([{"accepted": 7}], [{"accepted": 3}], name="llama.cpp")
    assert "mean +4.0 (1 body: no standard error)" in line and "nan" not in line, line
    assert "REST more in 1, llama.cpp more in 0, equal in 0" in line


def test_the_patient_person_is_named_for_what_it_is_and_ceiling_is_gone():
    assert T.method_options("patient", {}) == ("patient", {"draftBudget": None, "predictBudgetMs": 0})
    with pytest.raises(SystemExit, match="now `patient`"):
        T.method_options("ceiling", {})


def test_a_shorter_suggestion_can_take_more_so_waiting_for_the_whole_one_is_no_bound():
    # why `patient` is not a ceiling: the full suggestion goes wrong inside a word and is cut back to its start
    coming = "return total_sum\n"
    assert len(T.acceptable("return tot", coming)) > len(T.acceptable("return totally", coming))


def test_a_method_may_carry_its_precision():
    assert T.method_options("rest@int8w", {"maxTokens": 16}) == \
        ("rest", {"draftBudget": None, "maxTokens": 16, "precision": "int8w"})
    assert T.method_options("plain", {}) == ("plain", {"draftBudget": 0})
    assert T.method_options("rest+qwen2.5-coder-1.5b@bf16", {}) == \
        ("rest", {"draftBudget": None, "precision": "bf16", "model": "qwen2.5-coder-1.5b"})
    with pytest.raises(SystemExit, match="unknown method"):
        T.method_options("fast@fp32", {})


def test_a_method_may_carry_its_own_settings():
    assert T.method_options("rest@bf16[predictBudgetMs=30;maxLines=1]", {"maxLines": 3, "maxTokens": 16}) == \
        ("rest", {"draftBudget": None, "maxLines": 1, "maxTokens": 16, "predictBudgetMs": 30, "precision": "bf16"})
    assert T.method_options("plain[crossFile=true]", {}) == ("plain", {"draftBudget": 0, "crossFile": True})
    with pytest.raises(SystemExit, match="KEY=VALUE"):
        T.method_options("rest[predictBudgetMs]", {})


def test_a_tree_method_serves_the_trees_code_when_the_benchmark_runs_from_this_checkout(tmp_path):
    """The server's interpreter imports the tree's packages, not this checkout's, from this checkout's root
    (where the benchmarks run: `python -m` would put it first on sys.path)."""
    import os
    import subprocess
    from pathlib import Path

    from lsp_client import python_for

    repo = Path(__file__).resolve().parents[2]
    tree = tmp_path / "tree"
    (tree / "rest_lsp").mkdir(parents=True)
    (tree / "rest_lsp" / "__init__.py").write_text("")
    for given, expected in ((tree, tree), (None, repo)):
        argv, env = python_for(given)
        out = subprocess.run([*argv, "-c", "import rest_lsp; print(rest_lsp.__file__)"], cwd=repo, text=True,
                             env={**os.environ, **env}, capture_output=True, check=True).stdout.strip()
        assert Path(out).parent.parent == expected


def test_a_method_may_carry_the_source_tree_that_serves_it(tmp_path):
    trees = {"before": tmp_path}
    assert T.method_tree("rest@bf16~before", trees) == ("rest@bf16", tmp_path)
    assert T.method_tree("rest:plain~before", trees) == ("rest:plain", tmp_path)
    assert T.method_tree("rest:plain", trees) == ("rest:plain", None)
    with pytest.raises(SystemExit, match="give it as --tree after=DIR"):
        T.method_tree("rest~after", trees)


def test_methods_split_at_commas_outside_a_settings_list():
    names = T.method_names('rest~a,rest[crossFileSelectors=["similar","siblings"];crossFileTokens=256]~b,,rest-nocf')
    assert names == ["rest~a", 'rest[crossFileSelectors=["similar","siblings"];crossFileTokens=256]~b', "rest-nocf"]
    spec, _ = T.method_tree(names[1], {"b": Path("/b")})
    assert T.method_settings(spec) == ("rest", {"crossFileSelectors": ["similar", "siblings"], "crossFileTokens": 256})


def test_the_first_method_is_compared_with_each_other_one_body_by_body():
    per = lambda *a: {"per_body": [{"accepted": x} for x in a]}  # noqa: E731
    base = {"pauses": 1, "shown": 1, "shown_rate": 1.0, "answered_empty": 0, "asked_again": 0,
            "shown_latency_ms_p50": 1, "shown_latency_ms_p95": 1, "keys_typed": 9, "chars_accepted": 3,
            "accepted_share": 0.3, "cpu_s_per_typed_char": 0.1, "server": {}}
    report = {"methods": {"rest@int8w": {**base, **per(5, 9)}, "rest@fp32": {**base, **per(2, 9)},
                          "plain@fp32": {**base, **per(1, 1)}}}
    text = T.table(report)
    assert "characters accepted rest@int8w - rest@fp32: mean +1.5" in text
    assert "rest@int8w more in 1, rest@fp32 more in 0, equal in 1" in text
    assert "characters accepted rest@int8w - plain@fp32: mean +6.0" in text


def test_the_table_says_how_many_cross_file_blocks_were_computed_and_kept():
    base = {"pauses": 1, "shown": 1, "shown_rate": 1.0, "answered_empty": 0, "asked_again": 0,
            "shown_latency_ms_p50": 1, "shown_latency_ms_p95": 1, "keys_typed": 9, "chars_accepted": 3,
            "accepted_share": 0.3, "cpu_s_per_typed_char": 0.1, "per_body": [{"accepted": 3}],
            "prompt_tokens_computed_per_key": 30.0, "prompt_tokens_missed_per_key": 41.5}
    cf = {"selections": 12, "offered": 5, "promoted": 4, "unchanged": 3, "kept": 4}
    report = {"methods": {"rest-cf": {**base, "server": {"context_warm_tokens": 900, "context_selections": 12,
                                                            "context_select_ms": 250},
                                      "cross_file": cf},
                          "rest-nocf": {**base, "server": {}, "cross_file": None}}}
    text = T.table(report)
    assert "rest-cf: 30.0 prompt tokens computed per key typed (900 for 4 new cross-file blocks of 5 offered" in text
    assert "12 selections in 250 ms, 3 unchanged, 4 kept: no new definition" in text
    assert "runs' prompt tokens not in a cache when they started: 41.5 per key" in text
    assert "rest-nocf: 30.0 prompt tokens computed per key typed (0 for 0 new cross-file blocks" in text


def test_the_patient_person_is_compared_body_by_body_and_claims_no_bound():
    per = lambda *a: {"per_body": [{"accepted": x} for x in a]}  # noqa: E731
    base = {"pauses": 1, "shown": 1, "shown_rate": 1.0, "answered_empty": 0, "asked_again": 0,
            "shown_latency_ms_p50": 1, "shown_latency_ms_p95": 1, "keys_typed": 9, "accepts": 1, "accept_keys": 1,
            "keys_saved_share": 0.1, "typing_s": 1.0, "accepted_share": 0.3, "cpu_s_per_typed_char": 0.1,
            "server": {}}
    report = {"rhythm": {"name": "old", "legacy": True},
              "methods": {"rest": {**base, "chars_accepted": 12, **per(5, 7)},
                          "plain": {**base, "chars_accepted": 10, **per(4, 6)},
                          "patient": {**base, "chars_accepted": 11, **per(6, 5)}}}
    text = T.table(report)
    assert "characters accepted REST - patient: mean +0.5" in text
    assert "patient / plain: 1.10x" in text and "not a bound" in text and "most" not in text


def test_a_method_may_carry_its_client():
    assert T.method_client("rest") == ("rest", "project")
    assert T.method_client("rest@int8w:plain") == ("rest@int8w", "plain")
    assert T.method_client("plain", default="plain") == ("plain", "plain")
    assert T.method_client("rest:project", default="plain") == ("rest", "project")
    with pytest.raises(SystemExit, match="unknown client"):
        T.method_client("rest:vim")
    with pytest.raises(SystemExit, match="its own client"):
        T.method_client(f"{T.PEER}:plain")


class RecordingServer:
    """What a client sends, in order; every inline completion is answered empty (no rest/suggestionReady comes)."""

    def __init__(self):
        self.sent: list[tuple[str, object]] = []
        self.client = self
        self.protocol = self

    def text_document_did_open(self, params):
        self.sent.append(("open", params.text_document.text))

    def text_document_did_change(self, params):
        self.sent.append(("change", params.content_changes))

    def notify(self, method, params):
        self.sent.append((method, params))

    def send_request_async(self, method, params, msg_id=None):
        import asyncio
        from types import SimpleNamespace
        fut = asyncio.get_running_loop().create_future()
        fut.set_result(SimpleNamespace(items=[]))
        self.sent.append(("request", params.position))
        return fut


@pytest.mark.parametrize("client", ["project", "plain"])
def test_the_plain_client_sends_whole_texts_and_nothing_of_rest(monkeypatch, client):
    import asyncio
    import random
    from lsprotocol import types
    # long enough for rest/cursor
    monkeypatch.setattr(T, "interval", lambda person, ch, rng: 0.4 if ch == " " else 0.01)
    monkeypatch.setattr(T, "START_S", 0.0)
    opened = "def f(a):\n    \n"
    body = T.Body(Path("x.py"), 1, 4, "return a + 1")
    tally = T.new_tally()
    server = RecordingServer()

    async def run():
        ed = T.CLIENTS[client](server, Path("/w/x.py"), opened)
        await T.type_body(ed, body, random.Random(0), True, True, tally, person=OLD)
        return ed

    ed = asyncio.run(run())
    assert "\n".join(ed.lines) == "def f(a):\n    return a + 1\n"
    changes = [c for kind, cs in server.sent if kind == "change" for c in cs]
    assert len(changes) == len(body.text) and tally["pauses"] == 3 and tally["empty"] == 3   # after each space
    notes = [kind for kind, _ in server.sent if kind.startswith("rest/")]
    if client == "plain":
        assert all(isinstance(c, types.TextDocumentContentChangeWholeDocument) for c in changes)
        assert changes[-1].text == "def f(a):\n    return a + 1\n"      # the whole text after each key
        assert notes == [] and not T.PlainEditor.asks_again
    else:
        assert all(isinstance(c, types.TextDocumentContentChangePartial) for c in changes)
        assert server.sent[1][0] == "rest/cursor"                        # said before the first key
        assert notes.count("rest/cursor") == 4                           # and at each long pause
