"""The simulated person of benchmarks/bench_typing.py: when their keys come, where they pause, and what taking a
suggestion costs them. Pure functions of their arguments and a seeded random.Random, so a seed gives the same
rhythm again (until the server's answers make two runs type different text).

Rhythms (`bench_typing.py --rhythm NAME`):

- `human` (the default): an average typist. The interval before each key is drawn from a lognormal whose mean is
  the mean inter-key interval (IKI) Dhakal et al. report for their 168,000 volunteers, "Observations on Typing
  from 136 Million Keystrokes" (CHI 2018): 51.6 words per minute on average, a mean IKI of about 239 ms, so
  `key_mean_s` 0.240. The figures are as we recall them from the paper; this machine has no internet to check
  them (package registries only), and no keystroke data were fitted here. The lognormal's shape (`key_sigma`
  0.45, the standard deviation of the log interval: median 0.90x the mean, 95th percentile 2.1x the median) is
  our assumption: a positive, right-skewed interval with a long tail, as keystroke timing data are, in two
  parameters that stdlib's seeded random draws.
- `fast`: the same with a 120 ms mean IKI, a fast typist in those data (as recalled; 120 ms per key is 100 words
  per minute at five characters a word).
- `old`: the rhythm every typing table before 2026-12-02 used: 60-140 ms per key (uniform), 300-700 ms after a
  newline and after one space or bracket in four, taking a suggestion free (no reading, in place of the next
  key). Kept to compare with those tables.

Where people pause (human, fast): longer intervals after a word (a space, `,`, `:`, `;`, `=`: the lognormal's
mean times `word_factor` 1.5), after a bracket (times `bracket_factor` 2.0) and at a line's end (after Enter:
its own lognormal, mean `line_mean_s` 1.0 s, sigma 0.6, the same for both typists since it is thinking rather
than moving fingers). Writing research finds that ordering (pauses within a word < between words < between
sentences); these factors and the line pause are our assumptions, not fitted figures, and copy-typing data such
as Dhakal's hold none of a programmer's thinking pauses.

Taking a suggestion (human, fast) is not free: the person reads the part they take, `read_s_per_word` 0.25 s per
word (a word: a run of letters, digits or `_`; at least one), about the 238 words per minute of silent reading
of non-fiction in Brysbaert's meta-analysis ("How many words do we read per minute?", J. Memory and Language
2019; again as recalled; code is likely read slower, so this flatters accepting), then presses keys: Tab once
when they take the whole suggestion, else accept-word (VS Code's Ctrl+Right) once per word of the part taken,
each key an interval drawn like a key's. They take it only when it saves keys (more characters than the keys it
costs); the old rhythm takes any part. The part taken reaches the server as one edit after the last accept
key (an editor sends one per accept-word press).
"""
from __future__ import annotations

import math
import random
import re
from dataclasses import dataclass

WORD_END = set(" \t,:;=")
BRACKETS = set("()[]{}")
WORD_CHARS = re.compile(r"\w+")
ACCEPT_WORD_STEP = re.compile(r"\w+|[^\w\s]+")  # one accept-word press each (with the spaces around it)


@dataclass(frozen=True)
class Typist:
    name: str
    key_mean_s: float = 0.240
    key_sigma: float = 0.45
    word_factor: float = 1.5
    bracket_factor: float = 2.0
    line_mean_s: float = 1.0
    line_sigma: float = 0.6
    read_s_per_word: float = 0.25
    legacy: bool = False  # the old rhythm: uniform gaps, taking a suggestion free


HUMAN = Typist("human")
FAST = Typist("fast", key_mean_s=0.120)
OLD = Typist("old", legacy=True)
RHYTHMS = {t.name: t for t in (HUMAN, FAST, OLD)}
DEFAULT = HUMAN.name


def lognormal(rng: random.Random, mean: float, sigma: float) -> float:
    """A lognormal draw with the given mean (not median): mu = ln(mean) - sigma^2 / 2."""
    return rng.lognormvariate(math.log(mean) - sigma * sigma / 2, sigma)


def boundary(prev: str) -> str:
    """Where the key just typed leaves the person: 'line' (after Enter), 'bracket', 'word' (after a word and
    what ends it) or 'key' (inside a word)."""
    if prev == "\n":
        return "line"
    if prev in BRACKETS:
        return "bracket"
    if prev in WORD_END:
        return "word"
    return "key"


def old_interval(prev: str, rng: random.Random) -> float:
    """The old rhythm's gap after `prev` (kept draw for draw, so its seeds give the old runs' rhythm)."""
    if prev == "\n":
        return rng.uniform(0.3, 0.7)
    if prev in " ([{,:=" and rng.random() < 0.25:
        return rng.uniform(0.3, 0.7)
    return rng.uniform(0.06, 0.14)


def interval(typist: Typist, prev: str, rng: random.Random) -> float:
    """Seconds from the key (or accept) that typed `prev` to the person's next key."""
    if typist.legacy:
        return old_interval(prev, rng)
    where = boundary(prev)
    if where == "line":
        return lognormal(rng, typist.line_mean_s, typist.line_sigma)
    factor = {"bracket": typist.bracket_factor, "word": typist.word_factor}.get(where, 1.0)
    return lognormal(rng, typist.key_mean_s * factor, typist.key_sigma)


def accept_keys(take: str, shown: str) -> int:
    """Keys pressed to take `take` of the suggestion `shown`: Tab once for all of it, else one accept-word press
    per word (a run of word characters or of punctuation, with the spaces around it; at least one)."""
    if not take:
        return 0
    if take == shown:
        return 1
    return max(1, len(ACCEPT_WORD_STEP.findall(take)))


def reading_s(typist: Typist, take: str) -> float:
    """Seconds the person reads the part they take before pressing a key (0 for the old rhythm)."""
    if typist.legacy:
        return 0.0
    return typist.read_s_per_word * max(1, len(WORD_CHARS.findall(take)))


def accept_s(typist: Typist, take: str, shown: str, rng: random.Random) -> float:
    """Seconds from the suggestion appearing to its part taken: reading it, then each accept key's interval
    (0 for the old rhythm, whose person took it in place of the next key)."""
    if typist.legacy:
        return 0.0
    keys = sum(lognormal(rng, typist.key_mean_s, typist.key_sigma) for _ in range(accept_keys(take, shown)))
    return reading_s(typist, take) + keys


def worth_taking(typist: Typist, take: str, typed_chars: int, keys: int) -> bool:
    """Whether the person takes `take`, which spares `typed_chars` key presses for `keys` accept keys."""
    if typist.legacy:
        return bool(take)
    return bool(take) and typed_chars > keys
