"""benchmarks/typist.py: the simulated person's rhythm (its distributions, where it pauses, what accepting costs),
and bench_typing's person using it, without a server."""
import asyncio
import math
import random
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import bench_typing as T  # noqa: E402
from scripted_editor import ScriptedEditor  # noqa: E402
import typist as P  # noqa: E402

N = 20_000


def draws(person, prev, seed=0, n=N):
    rng = random.Random(seed)
    return [P.interval(person, prev, rng) for _ in range(n)]


def test_a_key_inside_a_word_has_the_published_mean_and_a_right_skewed_lognormal_spread():
    for person, mean in ((P.HUMAN, 0.240), (P.FAST, 0.120)):
        xs = draws(person, "a")
        assert min(xs) > 0
        assert abs(statistics.mean(xs) / mean - 1) < 0.03, statistics.mean(xs)
        median = statistics.median(xs)
        expected_median = mean * math.exp(-person.key_sigma ** 2 / 2)  # lognormal: mean = median * e^(s^2/2)
        assert abs(median / expected_median - 1) < 0.03, (median, expected_median)
        p95 = sorted(xs)[int(0.95 * N)]
        assert 1.9 < p95 / median < 2.3  # a long right tail: e^(1.645 * 0.45) = 2.10
        assert median < statistics.mean(xs)


def test_people_pause_longer_after_a_word_a_bracket_and_longest_at_a_line_end():
    means = {where: statistics.mean(draws(P.HUMAN, prev)) for where, prev in
             (("key", "a"), ("word", " "), ("bracket", "("), ("line", "\n"))}
    assert means["key"] < means["word"] < means["bracket"] < means["line"], means
    assert abs(means["line"] / P.HUMAN.line_mean_s - 1) < 0.03
    assert [P.boundary(c) for c in "a. (\n,)"] == ["key", "key", "word", "bracket", "line", "word", "bracket"]


def test_a_seed_gives_the_same_rhythm_again_and_another_seed_another():
    text = "def f(a, b):\n    return a + b\n"
    one = [P.interval(P.HUMAN, c, rng) for rng in [random.Random(7)] for c in text]
    again = [P.interval(P.HUMAN, c, rng) for rng in [random.Random(7)] for c in text]
    other = [P.interval(P.HUMAN, c, rng) for rng in [random.Random(8)] for c in text]
    assert one == again and one != other


def test_the_old_rhythm_keeps_its_two_gaps():
    assert all(0.3 <= x <= 0.7 for x in draws(P.OLD, "\n", n=2000))
    after_key = draws(P.OLD, "a", n=2000)
    assert all(0.06 <= x <= 0.14 for x in after_key)
    after_space = draws(P.OLD, " ", n=4000)
    long_share = sum(x >= 0.3 for x in after_space) / len(after_space)
    assert 0.2 < long_share < 0.3  # one space in four
    assert P.DEFAULT == "human" and set(P.RHYTHMS) == {"human", "fast", "old"}


def test_taking_a_suggestion_costs_a_key_and_reading():
    assert P.accept_keys("return total", "return total") == 1              # Tab
    assert P.accept_keys("return ", "return totally") == 1                 # one accept-word
    assert P.accept_keys("x = foo(", "x = foo(a)\n") == 4                  # x, =, foo, (
    assert P.accept_keys("", "anything") == 0
    assert P.reading_s(P.HUMAN, "return total") == 2 * P.HUMAN.read_s_per_word
    assert P.reading_s(P.HUMAN, "(") == P.HUMAN.read_s_per_word            # at least a word's glance
    rng = random.Random(0)
    whole = [P.accept_s(P.HUMAN, "return total", "return total", rng) for _ in range(2000)]
    words = [P.accept_s(P.HUMAN, "x = foo(", "x = foo(a)\n", rng) for _ in range(2000)]
    assert min(whole) > P.reading_s(P.HUMAN, "return total")               # the Tab takes time on top
    assert statistics.mean(words) - P.reading_s(P.HUMAN, "x = foo(") > \
        statistics.mean(whole) - P.reading_s(P.HUMAN, "return total")     # four presses take longer than one
    assert P.accept_s(P.OLD, "return total", "return total", rng) == 0.0
    # a part must spare more keys than it costs; the old person took anything
    assert not P.worth_taking(P.HUMAN, ")", 1, 1) and P.worth_taking(P.HUMAN, "total", 5, 1)
    assert P.worth_taking(P.OLD, ")", 1, 1)


def run_person(monkeypatch, person, editor, text):
    monkeypatch.setattr(T, "interval", lambda who, ch, rng: 0.2 if ch == " " else 0.01)  # a request after spaces
    monkeypatch.setattr(T, "START_S", 0.0)
    tally = T.new_tally()
    asyncio.run(T.type_body(editor, T.Body(Path("x.py"), 0, 0, text), random.Random(0), True, False, tally,
                            person=person))
    assert "\n".join(editor.lines) == text
    return tally


def test_the_person_reads_a_suggestion_and_presses_a_key_before_it_is_taken(monkeypatch):
    text = "alpha beta gamma delta"
    person = P.Typist("quick", key_mean_s=0.01, read_s_per_word=0.05)
    ed = ScriptedEditor(text)
    tally = run_person(monkeypatch, person, ed, text)
    assert tally["accepted"] == len("beta") + len("gamma") + len("delta")
    assert tally["accepts"] == tally["accept_keys"] == 3                   # each a whole suggestion: one Tab
    taken = [t for t, edit in ed.edits if len(edit) > 1]
    assert len(taken) == len(ed.answers) == 3
    for answered, inserted in zip(ed.answers, taken):
        assert inserted - answered >= person.read_s_per_word - 0.005       # read (one word) before the Tab


def test_a_one_character_suggestion_is_typed_by_the_human_and_taken_by_the_old_person(monkeypatch):
    text = "alpha beta gamma"
    human = run_person(monkeypatch, P.Typist("quick", key_mean_s=0.01, read_s_per_word=0.01),
                       ScriptedEditor(text, one_char=True), text)
    old = run_person(monkeypatch, P.OLD, ScriptedEditor(text, one_char=True), text)
    assert human["shown"] == old["shown"] == 2
    assert human["accepted"] == 0 and human["typed"] == len(text)
    assert old["accepted"] == 2 and old["accept_keys"] == 2
