"""Cross-file context: which code of the repository the model reads before the current file.

The prompt of a completion starts with a block of other files' snippets and the current file's path
(rest_lsp/model/prompts.py `repo_block`: Qwen2.5-Coder's `<|repo_name|>`/`<|file_sep|>` layout, path comments
for other families). Four selectors fill it, each from what the daemon already holds:

    definitions  the names used near the cursor (called, read, imported; not defined in the current file) looked
                 up by exact token search in the workspace datastore's suffix arrays (indexer/locate.py); the
                 files holding them give the definition (`def name`, `class name`: a class as its outline of
                 members, a function as its first lines, `name = ...` at module level), or a use when no file
                 defines it (a call site shows the call convention)
    similar      the repository's code most like the cursor's window: every n-gram of the window's tokens
                 searched in the suffix arrays, each occurrence voting for its file and line with the weight
                 1/occurrences (a rare shared n-gram says more than a common one), the best-voted lines' region
    recent       llama.vim's ring: the region around where the person was, in files they edited, saved or
                 left (up to RING chunks; a chunk that repeats one already held replaces it)
    siblings     the head of a file beside the current one (the same folder): the module a new file is most
                 like, its imports and first definitions, which show the folder's pattern before the new file
                 holds any name to look up: the sibling sharing the most identifiers with the current document,
                 blended, while the document holds few, with the folder's most typical file

Snippets that repeat the current file's text are dropped, overlapping ones merged, and the best fill the token
budget; the best goes last, next to the current file, except that a changed block keeps the files it shares with
the block before it first, in their old order (`in_old_order`: their KV cache survives the change). All text
comes from the workspace datastore (files the index admitted, secret lines masked) or, for the ring, from an
indexed file's buffer masked the same way: an excluded file or a secret never enters a prompt.

The block must stay put while the person types (the KV cache of everything after it is reused only then): a
`ContextKeeper` holds one block per document and offers a new one only when the selection changes materially
(another file, a save, a new name at the cursor); the service computes the new block's prompt in the background
and switches to it only when that is done (rest_lsp/service/blocks.py).
"""
from __future__ import annotations

import builtins
import functools
import keyword
import os
import re
import threading
from collections import OrderedDict
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from indexer.secrets import clean
from rest_lsp.model.prompts import RepoContext

SELECTORS = ("definitions", "similar", "recent", "siblings")
WINDOW_LINES = 24          # the cursor's window: the lines before the cursor (and its line) the selectors read
MAX_NAMES = 8              # names near the cursor looked up, the nearest first
FILES_PER_NAME = 6         # files searched for one name's definition
DEF_LINES = 18             # a function's definition: its signature and first lines
CLASS_LINES = 40           # a class's outline: header, members and method signatures
SIMILAR_N = 6              # tokens per n-gram of the similarity vote
SIMILAR_MAX_COUNT = 32     # an n-gram found more often is boilerplate: it does not vote
SIMILAR_LINES = 16         # lines of a similar region
SIMILAR_BEFORE = 4         # of them, lines before the place that corresponds to the cursor (the rest: what follows)
SIMILAR_SLACK = 3          # places this many lines apart vote together (lines inserted or dropped in between)
SIMILAR_MIN_VOTES = 3.0    # a region needs about three rare shared n-grams: one shared phrase is chance
RING = 16                  # chunks kept in the recent-files ring
RING_LINES = 16            # lines of a ring chunk
SIBLING_LINES = 40         # lines of a sibling's head
SIBLINGS_MAX = 48          # files of a folder compared (the first by name): a huge folder is not read whole
SIBLING_MIN_NAMES = 12     # identifiers from which the document's likeness alone picks the sibling
SNIPPET_OVERHEAD = 8       # tokens of a snippet's path line in the block
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# `from MODULE import NAMES` (1: module, 2: names) or `import MODULES` (3)
_IMPORT = re.compile(r"^\s*from\s+([\w.]+)\s+import\s+\(?([\w\s,]+)\)?|^\s*import\s+([\w., ]+)", re.M)
# the builtin types' methods too: `li.sort()` says nothing about the repository
_COMMON = set(keyword.kwlist) | set(keyword.softkwlist) | set(dir(builtins)) | {
    m for t in (str, list, dict, set, tuple, bytes, int, float) for m in dir(t) if not m.startswith("_")} | {
    "self", "cls", "args", "kwargs", "None", "True", "False", "i", "j", "k", "x", "y", "n", "s", "e", "f", "os",
    "re", "sys", "np", "typing", "Any", "Optional", "List", "Dict", "Tuple", "Callable", "Path"}


@dataclass(frozen=True)
class Snippet:
    path: str       # relative to the repository root
    start: int      # first line, 0-based
    end: int        # the line after the last
    text: str
    selector: str   # definitions | uses | similar | recent
    score: float
    tokens: int = 0

    @property
    def key(self) -> tuple[str, int, int]:
        return self.path, self.start, self.end

    def describe(self) -> dict:
        return {"file": self.path, "lines": [self.start + 1, self.end], "selector": self.selector,
                "score": round(self.score, 3), "tokens": self.tokens}


@dataclass(frozen=True)
class Selection:
    """A chosen block: what the prompt gets (`repo`), what it was chosen from (`names`), and why (`snippets`)."""
    repo: RepoContext
    snippets: tuple[Snippet, ...]
    names: frozenset[str]
    tokens: int

    @property
    def keys(self) -> frozenset:
        return frozenset(s.key for s in self.snippets)

    def describe(self) -> list[dict]:
        return [s.describe() for s in self.snippets]


# ---------------------------------------------------------------------------------------------- text helpers
def _indent(line: str) -> int:
    return len(line.expandtabs(4)) - len(line.expandtabs(4).lstrip())


def names_near(prefix: str, line_text: str = "", window: int = WINDOW_LINES) -> list[str]:
    """Names used in the cursor's window, the nearest to the cursor first, without keywords, builtins and
    one-letter names; names imported anywhere in the prefix come after them."""
    lines = prefix.split("\n")
    near = "\n".join(lines[-window:]) + line_text
    seen: OrderedDict[str, None] = OrderedDict()
    for m in reversed(list(_IDENT.finditer(near))):
        name = m.group(0)
        if name not in _COMMON and len(name) > 1:
            seen.setdefault(name, None)
    for name in imported_all(prefix):
        if name not in _COMMON:
            seen.setdefault(name, None)
    return list(seen)


def defined_names(text: str) -> set[str]:
    """Names the text itself defines (def, class, top-level assignment): the prompt already shows them."""
    out = set(re.findall(r"^\s*(?:async\s+def|def|class)\s+([A-Za-z_]\w*)", text, re.M))
    out |= set(re.findall(r"^([A-Za-z_]\w*)\s*(?::[^=\n]*)?=[^=]", text, re.M))
    return out


def block_of(lines: list[str], at: int, limit: int) -> tuple[int, int]:
    """[at, end): the line `at` and the lines indented deeper than it that follow (blank lines inside kept),
    at most `limit` lines."""
    base = _indent(lines[at])
    end = at + 1
    while end < len(lines) and end - at < limit:
        ln = lines[end]
        if ln.strip() and _indent(ln) <= base:
            break
        end += 1
    while end > at + 1 and not lines[end - 1].strip():
        end -= 1
    return at, end


def class_outline(lines: list[str], at: int, limit: int) -> str:
    """A class as its header, docstring's first line and members: the method signatures and class-level
    statements, not the method bodies (what a caller needs of it, in few tokens)."""
    start, end = block_of(lines, at, 10 * limit)
    base = _indent(lines[start])
    member = None
    out = [lines[start]]
    i = start + 1
    while i < end and len(out) < limit:
        ln = lines[i]
        if ln.strip():
            ind = _indent(ln)
            if member is None and ind > base:
                member = ind
            if ind == member:
                out.append(ln)
                # a signature over several lines: keep it whole
                if re.match(r"\s*(async\s+def|def)\b", ln):
                    while not ln.rstrip().endswith(":") and i + 1 < end and len(out) < limit:
                        i += 1
                        ln = lines[i]
                        out.append(ln)
        i += 1
    return "\n".join(out)


def definition_at(lines: list[str], name: str) -> tuple[int, int, str] | None:
    """(start, end, text) of the first definition of `name` in a file's lines, or None."""
    pat = re.compile(rf"^\s*(?:async\s+def|def|class)\s+{re.escape(name)}\b|^{re.escape(name)}\s*(?::[^=\n]*)?=[^=]")
    for i, ln in enumerate(lines):
        if pat.match(ln):
            if ln.lstrip().startswith("class"):
                return i, block_of(lines, i, 10 * CLASS_LINES)[1], class_outline(lines, i, CLASS_LINES)
            start, end = block_of(lines, i, DEF_LINES)
            # decorators above a definition are part of how it is used
            while start > 0 and lines[start - 1].lstrip().startswith("@"):
                start -= 1
            return start, end, "\n".join(lines[start:end])
    return None


def use_of(lines: list[str], name: str, span: int = 2) -> tuple[int, int, str] | None:
    """A call (else any use) of `name` with `span` lines around it."""
    call = re.compile(rf"\b{re.escape(name)}\s*\(")
    word = re.compile(rf"\b{re.escape(name)}\b")
    for pat in (call, word):
        for i, ln in enumerate(lines):
            if pat.search(ln) and not ln.lstrip().startswith(("import ", "from ", "#")):
                start, end = max(0, i - span), min(len(lines), i + span + 1)
                return start, end, "\n".join(lines[start:end])
    return None


def repeats(text: str, known: set[str], share: float = 0.5) -> bool:
    """Most of the snippet's non-blank lines are lines of the current file: nothing new to read."""
    ls = [ln.strip() for ln in text.split("\n") if ln.strip()]
    return not ls or sum(ln in known for ln in ls) >= share * len(ls)


# ---------------------------------------------------------------------------------------------- the repository
class RepoView:
    """One workspace folder's indexed files, read through its datastore (indexer/locate.py) and the model's
    tokenizer: which files hold a token sequence, a file's text as indexed (secrets masked), its lines."""

    def __init__(self, root: Path, store, encode: Callable[[str], list[int]], decode: Callable[[list[int]], str]):
        from indexer.locate import Locator

        self.root = Path(root)
        self.locator = Locator(store)
        self.store = store
        self.encode, self.decode = encode, decode
        self._texts: OrderedDict[tuple, tuple[str, np.ndarray]] = OrderedDict()
        self._newlines: dict[int, int] = {}
        self._lock = threading.Lock()

    def rel(self, path: str) -> str:
        try:
            return Path(path).relative_to(self.root).as_posix()
        except ValueError:
            return Path(path).name

    def indexed(self, path: str) -> bool:
        return path in self.store.documents

    def text(self, path: str) -> tuple[str, np.ndarray] | None:
        """(the file's text as indexed, the line each of its tokens starts on); cached per indexed version."""
        doc = self.store.documents.get(path)
        if doc is None:
            return None
        key = (path, doc.shard, doc.start, doc.end)
        with self._lock:
            hit = self._texts.get(key)
            if hit is not None:
                self._texts.move_to_end(key)
                return hit
        ids = self.locator.tokens(path)
        if ids is None:
            return None
        ids = ids.tolist()
        text = self.decode(ids)
        lines_at = self.token_lines(ids)
        with self._lock:
            self._texts[key] = (text, lines_at)
            while len(self._texts) > 256:
                self._texts.popitem(last=False)
        return text, lines_at

    def token_lines(self, ids: list[int]) -> np.ndarray:
        """The line (from 0) each token of a text starts on."""
        if not ids:
            return np.zeros(0, np.int64)
        return np.concatenate([[0], np.cumsum(self._newline_counts(ids))[:-1]])

    def _newline_counts(self, ids: list[int]) -> np.ndarray:
        """Line breaks in each token's text (a byte-level token never splits "\\n")."""
        table = self._newlines
        for t in set(ids) - table.keys():
            table[t] = self.decode([t]).count("\n")
        return np.fromiter((table[t] for t in ids), dtype=np.int64, count=len(ids))

    def files_with(self, name: str, limit: int = 64) -> list[str]:
        """Files that hold the name as a whole token sequence (after a space, or starting a line), most
        occurrences first."""
        counts: dict[str, int] = {}
        for form in (" " + name, name):
            ids = self.encode(form)
            if not ids:
                continue
            for path, _ in self.locator.occurrences(ids, limit)[1]:
                counts[path] = counts.get(path, 0) + 1
        return sorted(counts, key=lambda p: -counts[p])


# ---------------------------------------------------------------------------------------------- selectors
@dataclass
class Cursor:
    """What the selectors read of the current document."""
    path: str | None        # absolute path of the current file (None: not a file)
    prefix: str             # the text before the cursor
    line_text: str = ""     # the cursor line's text after the cursor (names there count too)
    text: str = ""          # the whole document (its lines are never repeated by a snippet)


def imported_names(text: str, root: Path | None = None) -> set[str]:
    """Names the text imports from the repository itself (a relative import, or a module whose top-level
    package or module is in `root`): its own API, whose definition and uses show how it is called. A standard
    library or third-party module's name says nothing about the repository."""
    out: set[str] = set()
    for m in _IMPORT.finditer(text):
        if m.group(1) is not None:
            if _in_repo(m.group(1), root):
                out |= set(_IDENT.findall(m.group(2))) - {"as"}
        else:
            out |= {n for n in _IDENT.findall(m.group(3)) if n != "as" and _in_repo(n, root)}
    return out


def imported_all(text: str) -> list[str]:
    """Every name the text's import statements bring in (from any module), in the order they come."""
    out: dict[str, None] = {}
    for m in _IMPORT.finditer(text):
        for name in _IDENT.findall(m.group(2) or m.group(3) or ""):
            if name not in ("as", "import"):
                out.setdefault(name, None)
    return list(out)


def _in_repo(module: str, root: Path | None) -> bool:
    if module.startswith("."):
        return True
    top = module.split(".")[0]
    return root is not None and ((root / top).is_dir() or (root / f"{top}.py").is_file())


def lookup_names(cur: "Cursor", root: Path | None, near: list[str] | None = None) -> list[str]:
    """The names near the cursor worth a definition: imported from the repository, called (`f(`, `obj.f(`), or
    read as another object's attribute (`obj.name`, not `self.name`: the current class is in the prompt), nearest
    first. A plain local name (`data`, `extra`) would find another file's unrelated namesake."""
    window = "\n".join(cur.prefix.split("\n")[-WINDOW_LINES:]) + cur.line_text
    wanted = imported_names(cur.prefix, root) | looked_up(window)
    near = near if near is not None else names_near(cur.prefix, cur.line_text)
    return [n for n in near if n in wanted]


def looked_up(text: str) -> set[str]:
    """The names of `text` that the `definitions` selector looks up besides imported ones: called (`f(`,
    `obj.f(`) or read as another object's attribute (`obj.name`)."""
    out = set(re.findall(r"\b([A-Za-z_]\w*)\s*\(", text))
    out |= {m.group(2) for m in re.finditer(r"\b(\w+)\.([A-Za-z_]\w*)", text) if m.group(1) not in ("self", "cls")}
    return out


def select_definitions(view: RepoView, cur: Cursor, *, names: list[str] | None = None) -> list[Snippet]:
    names = names if names is not None else lookup_names(cur, view.root)
    own = defined_names(cur.text)
    api = imported_names(cur.prefix, view.root)
    out: list[Snippet] = []
    rank = 0
    for name in names:
        if name in own:
            continue
        found = None
        use = None
        for path in view.files_with(name)[:FILES_PER_NAME]:
            if path == cur.path:
                continue
            got = view.text(path)
            if got is None:
                continue
            lines = got[0].split("\n")
            d = definition_at(lines, name)
            if d is not None:
                found = (path, d)
                break
            if use is None and name in api:
                u = use_of(lines, name)
                if u is not None:
                    use = (path, u)
        if found is None and use is None:
            continue
        score = 1.0 / (1 + rank)
        rank += 1
        if found is not None:
            path, (a, b, text) = found
            out.append(Snippet(view.rel(path), a, b, text, "definitions", 2.0 * score))
        elif use is not None:
            path, (a, b, text) = use
            out.append(Snippet(view.rel(path), a, b, text, "uses", score))
        if rank >= MAX_NAMES:
            break
    return out


def select_similar(view: RepoView, cur: Cursor, *, limit: int = 4) -> list[Snippet]:
    """The places of other files that correspond to the cursor, and what follows them there.

    Every 6-token n-gram of the window is searched in the suffix arrays; an occurrence votes 1/count (a rare
    shared n-gram says more; one found more than 32 times is boilerplate and does not vote) for the line of
    its file where the cursor would be: its own line plus the window's lines from the n-gram to the cursor.
    The n-grams of a region that the window repeats agree on that place wherever they sit in the window: a
    place's score is the votes within 3 lines of it, and the snippet starts from the most voted line there.
    Example: the ten lines before the cursor's (empty) line equal lines 30-39 of a sibling; each of their
    n-grams votes for the sibling's line 40, and the snippet is lines 36-51: four lines of the match, then the
    twelve that follow it, what the cursor may continue with.
    """
    lines_w = cur.prefix.split("\n")[-WINDOW_LINES:]
    ids = view.encode("\n".join(lines_w))
    if len(ids) < SIMILAR_N:
        return []
    to_cursor = (len(lines_w) - 1) - view.token_lines(ids)
    votes: dict[str, dict[int, float]] = {}
    for i in range(len(ids) - SIMILAR_N + 1):
        total, hits = view.locator.occurrences(ids[i:i + SIMILAR_N], SIMILAR_MAX_COUNT + 1)
        if not hits or total > SIMILAR_MAX_COUNT:
            continue
        for path, off in hits:
            if path == cur.path:
                continue
            got = view.text(path)
            if got is None or off >= len(got[1]):
                continue
            at = votes.setdefault(path, {})
            place = int(got[1][off]) + int(to_cursor[i])
            at[place] = at.get(place, 0.0) + 1.0 / total
    places = sorted(((sum(at.get(c + d, 0.0) for d in range(-SIMILAR_SLACK, SIMILAR_SLACK + 1)), path, c)
                     for path, at in votes.items() for c in at), key=lambda t: (-t[0], t[1], t[2]))
    out: list[Snippet] = []
    taken: list[tuple[str, int, int]] = []
    best = places[0][0] if places else 0.0
    for v, path, c in places:
        if len(out) >= limit or v < max(0.25 * best, SIMILAR_MIN_VOTES):
            break
        at = votes[path]  # the place itself: the most voted line near the best neighbourhood's centre
        place = max(range(c - SIMILAR_SLACK, c + SIMILAR_SLACK + 1), key=lambda p: (at.get(p, 0.0), -abs(p - c)))
        lines = view.text(path)[0].split("\n")
        start = max(0, min(place - SIMILAR_BEFORE, len(lines) - SIMILAR_LINES))
        end = min(len(lines), start + SIMILAR_LINES)
        if any(p == path and a < end and start < b for p, a, b in taken):
            continue
        taken.append((path, start, end))
        text = "\n".join(lines[start:end]).rstrip()
        if text.strip():
            out.append(Snippet(view.rel(path), start, end, text, "similar", v / best))
    return out


@dataclass
class _Chunk:
    path: str      # absolute
    start: int
    end: int
    text: str
    when: int


class RecentRing:
    """llama.vim's ring of chunks from where the person was: a chunk per file left, saved or edited (secret lines
    masked), kept newest first; a chunk whose lines mostly repeat one already held replaces it."""

    def __init__(self, size: int = RING):
        self.size = size
        self._chunks: list[_Chunk] = []
        self._clock = 0
        self._lock = threading.Lock()

    def add(self, path: str, text: str, line: int) -> None:
        lines = text.split("\n")
        start = max(0, min(line - RING_LINES // 2, len(lines) - RING_LINES))
        end = min(len(lines), start + RING_LINES)
        # masked once here, not at every selection that reads the ring
        body = clean("\n".join(lines[start:end]), Path(path).name).text
        if not body.strip():
            return
        new = set(ln.strip() for ln in body.split("\n") if ln.strip())
        with self._lock:
            self._clock += 1
            keep = []
            for c in self._chunks:
                old = set(ln.strip() for ln in c.text.split("\n") if ln.strip())
                if c.path == path and len(new & old) > 0.5 * max(1, min(len(new), len(old))):
                    continue
                keep.append(c)
            keep.insert(0, _Chunk(path, start, end, body, self._clock))
            self._chunks = keep[: self.size]

    def chunks(self) -> list[_Chunk]:
        with self._lock:
            return list(self._chunks)


def select_recent(view: RepoView, cur: Cursor, ring: RecentRing, *, limit: int = 3) -> list[Snippet]:
    out = []
    for c in ring.chunks():
        if c.path == cur.path or not view.indexed(c.path):
            continue  # only files the index admitted (not excluded, not key material)
        out.append(Snippet(view.rel(c.path), c.start, c.end, c.text, "recent", 1.0 / (1 + len(out))))
        if len(out) >= limit:
            break
    return out


def _identifiers(text: str) -> frozenset[str]:
    return frozenset(n for n in _IDENT.findall(text) if n not in _COMMON and len(n) > 2)


# the indexed files' only (a file's text is one cached object per indexed version, see RepoView.text): the
# current document is a new text at every selection, and a cache of those would keep hundreds of its versions
_file_identifiers = functools.lru_cache(maxsize=4 * SIBLINGS_MAX)(_identifiers)


def _jaccard(a: frozenset, b: frozenset) -> float:
    return len(a & b) / len(a | b) if a or b else 0.0


def select_siblings(view: RepoView, cur: Cursor, *, budget: int, limit: int = 1) -> list[Snippet]:
    """The head of the sibling most like the current document (see the module's docstring), within half the
    block's budget so that a definition still fits beside it."""
    if not cur.path:
        return []
    folder = str(Path(cur.path).parent) + os.sep
    paths = sorted(p for p in view.store.documents if p.startswith(folder) and os.sep not in p[len(folder):]
                   and p != cur.path and not p.endswith(os.sep + "__init__.py"))[:SIBLINGS_MAX]
    files = {p: got[0] for p in paths if (got := view.text(p)) is not None and got[0].strip()}
    names = {p: _file_identifiers(text) for p, text in files.items()}
    own = _identifiers(cur.text)
    # the document's likeness weighs more with every name it holds; until it holds a few, the folder's
    # typical file (the most shared with the others) is the best guess of what it will be like
    w = min(1.0, len(own) / SIBLING_MIN_NAMES)

    def typical(p: str, n: frozenset) -> float:  # mean likeness to the folder's other files: n^2 set operations
        return sum(_jaccard(n, m) for q, m in names.items() if q != p) / max(1, len(names) - 1)

    likeness = {p: w * _jaccard(own, n) + ((1 - w) * typical(p, n) if w < 1 else 0.0) for p, n in names.items()}
    out = []
    for p in sorted(likeness, key=lambda p: (-likeness[p], p))[:limit]:
        if likeness[p] <= 0:
            break
        head, used = [], SNIPPET_OVERHEAD
        for line in files[p].split("\n")[:SIBLING_LINES]:
            used += len(view.encode(line + "\n"))
            if used > budget // 2:
                break
            head.append(line)
        text = "\n".join(head).rstrip()
        if text:
            out.append(Snippet(view.rel(p), 0, len(head), text, "siblings", 1.0))
    return out


def fit(snippets: Sequence[Snippet], budget: int, encode: Callable[[str], list[int]], known: set[str]) -> list[Snippet]:
    """The best snippets within `budget` tokens, without repeats of the current file or of each other,
    ordered for the prompt (the best last)."""
    ranked = sorted(snippets, key=lambda s: -s.score)
    chosen: list[Snippet] = []
    used = 0
    for s in ranked:
        if repeats(s.text, known):
            continue
        if any(c.path == s.path and c.start < s.end and s.start < c.end for c in chosen):
            continue
        n = len(encode(s.text)) + SNIPPET_OVERHEAD
        if used + n > budget:
            continue
        chosen.append(Snippet(s.path, s.start, s.end, s.text, s.selector, s.score, n))
        used += n
    return chosen[::-1]


# ---------------------------------------------------------------------------------------------- the keeper
@dataclass
class _DocState:
    current: Selection | None = None
    pending: Selection | None = None
    names: frozenset = frozenset()
    selected_at: int = -1
    log: list = field(default_factory=list)


class ContextKeeper:
    """One block per document, changed only when the selection changes materially.

    `select` computes a selection (on the caller's thread: the service runs it on its own); `offer` takes it as
    the document's pending block when its snippets differ from the current one's, and the service promotes it
    (`promote`) once its prompt is computed. `current` is what every prompt of the document uses meanwhile."""

    def __init__(self, ring: RecentRing | None = None):
        self.ring = ring or RecentRing()
        self._docs: OrderedDict[str, _DocState] = OrderedDict()
        self._lock = threading.Lock()
        self.counts = {"selections": 0, "offered": 0, "promoted": 0, "unchanged": 0, "kept": 0}

    def _doc(self, uri: str) -> _DocState:
        st = self._docs.get(uri)
        if st is None:
            st = self._docs[uri] = _DocState()
            while len(self._docs) > 64:
                self._docs.popitem(last=False)
        self._docs.move_to_end(uri)
        return st

    def current(self, uri: str) -> Selection | None:
        with self._lock:
            st = self._docs.get(uri)
            return st.current if st is not None else None

    def pending(self, uri: str) -> Selection | None:
        with self._lock:
            st = self._docs.get(uri)
            return st.pending if st is not None else None

    def new_names(self, uri: str, prefix: str, line_text: str = "") -> bool:
        """A name on the cursor's line that the `definitions` selector would look up (called, another object's
        attribute, imported) and the document's selection was not made for (a keystroke's check: regexes over
        one line). A name only assigned or defined there (`NAME = True`, `def name(`) is the current file's
        own: no selection would look it up, and the window's slide alone changes no definition worth a block."""
        line = prefix[prefix.rfind("\n") + 1:]
        line = re.sub(r"[A-Za-z_]\w*$", "", line) + line_text  # the word still being typed does not count yet
        with self._lock:
            st = self._docs.get(uri)
            if st is None or st.selected_at < 0:
                return True
            names = st.names
        words = looked_up(line) | set(imported_all(line))
        words -= defined_names(line)
        return any(n not in names and n not in _COMMON and len(n) > 2 for n in words)

    def offer(self, uri: str, sel: Selection, *, in_place: bool = False) -> Selection | None:
        """Take a fresh selection: the block to compute when it differs from the one in use (it becomes
        pending, its files in the order `in_old_order` gives), else None. A selection asked for in place (a
        keystroke's new name at the cursor, a save) must bring a definition or use the block lacks: the similar
        code shifts as the window slides, the ring gains only the document's own place (never in its own
        block), and a new block costs the prompt after its first changed file again."""
        with self._lock:
            st = self._doc(uri)
            self.counts["selections"] += 1
            st.names = st.names | sel.names
            st.selected_at = self.counts["selections"]
            base = st.pending or st.current
            if base is not None and base.keys == sel.keys and base.repo.path == sel.repo.path:
                self.counts["unchanged"] += 1
                return None
            if in_place and base is not None and not new_definitions(sel, base):
                self.counts["kept"] += 1
                return None
            if base is None and not sel.snippets:
                st.current = sel   # nothing to compute first: the path line alone
                return None
            st.pending = in_old_order(sel, st.current or base)
            self.counts["offered"] += 1
            return st.pending

    def set_current(self, uri: str, sel: Selection) -> None:
        """Use this block from now on, without a background warm-up (a one-shot completion)."""
        with self._lock:
            st = self._doc(uri)
            st.current, st.pending, st.names, st.selected_at = sel, None, sel.names, 0

    def promote(self, uri: str, sel: Selection) -> bool:
        """The pending block's prompt is computed: it becomes the document's block."""
        with self._lock:
            st = self._doc(uri)
            if st.pending is not sel:
                return False
            st.current, st.pending = sel, None
            self.counts["promoted"] += 1
            return True

    def snapshot(self) -> dict:
        """What `rest/stats` shows: the counts, and each recent document's block (file, lines, selector)."""
        with self._lock:
            docs = {uri: {"current": st.current.describe() if st.current else None,
                          "tokens": st.current.tokens if st.current else 0, "pending": st.pending is not None}
                    for uri, st in list(self._docs.items())[-8:]}
        return {**self.counts, "ring": len(self.ring.chunks()), "documents": docs}

    def withdraw(self, uri: str, sel: Selection) -> None:
        """The pending block's prompt was not computed (its job stopped or was dropped): no longer pending."""
        with self._lock:
            st = self._docs.get(uri)
            if st is not None and st.pending is sel:
                st.pending = None

    def forget(self, uri: str) -> None:
        with self._lock:
            self._docs.pop(uri, None)


def new_definitions(sel: Selection, base: Selection) -> bool:
    """Whether `sel` holds a definition or use (of a name at the cursor) that `base` does not."""
    known = base.keys  # a frozenset built per access: once, not once per snippet
    return any(s.selector in ("definitions", "uses") and s.key not in known for s in sel.snippets)


def in_old_order(sel: Selection, old: Selection | None) -> Selection:
    """`sel` with the files that `old`'s block holds unchanged first, in `old`'s order, and its other files
    after them in its own order (the best last). A prompt's KV cache is reused up to the first token that
    differs, so a block that changes by a new definition recomputes from the first file it adds or drops,
    not from its start: a new file among its siblings changes its block every few lines.

        old: [siblings a.py, def b.py]   sel (ranked): [def c.py, siblings a.py, def b.py, similar d.py]
        ->   [siblings a.py, def b.py, def c.py, similar d.py]      (a.py and b.py stay cached)
    """
    if old is None:
        return sel
    new = sel.repo.files
    kept = [f for f in old.repo.files if f in new]
    files = tuple(kept + [f for f in new if f not in kept])
    if files == new:
        return sel
    at = {path: i for i, (path, _) in enumerate(files)}
    snippets = tuple(sorted(sel.snippets, key=lambda s: at[s.path]))
    return Selection(replace(sel.repo, files=files), snippets, sel.names, sel.tokens)


def files_of(chosen: Sequence[Snippet]) -> tuple[tuple[str, str], ...]:
    """The block's files: a file's snippets together in line order (one path line each), the files in the
    order of their best snippet (the best last)."""
    files: dict[str, list[Snippet]] = {}
    for s in chosen:
        files.setdefault(s.path, []).append(s)
    order = sorted(files, key=lambda p: max(chosen.index(s) for s in files[p]))
    return tuple((p, "\n".join(s.text for s in sorted(files[p], key=lambda s: s.start))) for p in order)


def select(views: Sequence[RepoView], cur: Cursor, *, budget: int, selectors: Sequence[str],
           ring: RecentRing | None, encode: Callable[[str], list[int]]) -> Selection | None:
    """The block for a cursor: the view whose folder holds the current file (else the first), its selectors'
    snippets fitted to `budget` tokens. None without a repository."""
    if not views:
        return None
    view = next((v for v in views if cur.path and Path(cur.path).is_relative_to(v.root)), views[0])
    names = names_near(cur.prefix, cur.line_text)
    found: list[Snippet] = []
    if budget > 0:
        if "definitions" in selectors:
            found += select_definitions(view, cur, names=lookup_names(cur, view.root, names))
        if "similar" in selectors:
            found += select_similar(view, cur)
        if "recent" in selectors and ring is not None:
            found += select_recent(view, cur, ring)
        if "siblings" in selectors:
            found += select_siblings(view, cur, budget=budget)
    known = {ln.strip() for ln in cur.text.split("\n") if ln.strip()}
    chosen = fit(found, budget, encode, known)
    path = view.rel(cur.path) if cur.path else "untitled"
    repo = RepoContext(view.root.name, path, files_of(chosen))
    return Selection(repo, tuple(chosen), frozenset(names), sum(s.tokens for s in chosen))
