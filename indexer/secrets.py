"""Secrets by content: lines that carry one are masked before tokenization; key material is never indexed.

Detection is detect-secrets' (Yelp): its default plugins (AWS, GitHub, GitLab, Slack, Stripe, private keys,
basic-auth URLs, secret-sounding keywords, high-entropy strings, ...) and its false-positive filters. Its
line-by-line scan runs about 0.2 MB/s here, too slow for a corpus or a buffer on every edit, so each
plugin's own patterns are first run over the whole text at regex speed to find the lines that could carry a
secret, and only those lines go through detect-secrets' scan. The prefilter is a superset by construction:
every plugin reports only what its patterns match (the keyword plugin only lines holding one of its
keywords, the entropy plugins only quoted strings long enough to reach their entropy limit), and a plugin
of an unknown kind makes every line a candidate. tests/indexer/test_idx_secrets.py checks the superset on
real sources with generated secrets.

A masked line keeps its line break and loses its text, so line numbers and the rest of the file stay as
they were. A text in which detect-secrets finds a private key (PEM, OpenSSH, PGP, PuTTY) is key material as
a whole: the body of a key block is base64 that no line-based rule recognises, so such a file or buffer is
skipped, not masked. So are files whose name marks them as key material (`KEY_MATERIAL_NAMES`, on top of
the deny-list in indexer/discover.py).
"""
from __future__ import annotations

import bisect
import math
import re
import threading
from dataclasses import dataclass

KEY_MATERIAL = "key_material"   # the skip reason

# names that hold keys or infrastructure secrets whatever their content (gitignore syntax)
KEY_MATERIAL_NAMES = [
    "*_key", "*_key.txt", "*.ppk", "*.tfstate", "*.tfstate.*", "*.tfvars", "*.tfvars.json", "*.asc",
    "*_rsa", "*_dsa", "*_ecdsa", "*_ed25519", "*.gpg", "*.age", "*.kubeconfig", "kubeconfig",
]

# An IP address is not a credential, and code is full of them (tests, docs, defaults).
_DISABLED_PLUGINS = {"IPPublicDetector"}

_lock = threading.Lock()
_state: "_Detector | None" = None


@dataclass(frozen=True)
class Cleaned:
    text: str                  # the text with every line that carries a secret emptied ("" when skipped)
    masked_lines: int          # how many lines were emptied
    skip: str | None = None    # KEY_MATERIAL when the whole text must not be indexed


class _Detector:
    """detect-secrets configured once for this process (its settings are global), plus the prefilter."""

    def __init__(self) -> None:
        from detect_secrets.core.plugins.util import get_mapping_from_secret_type_to_class
        from detect_secrets.plugins.base import RegexBasedDetector
        from detect_secrets.plugins.high_entropy_strings import HighEntropyStringsPlugin
        from detect_secrets.plugins.keyword import DENYLIST, KeywordDetector
        from detect_secrets.plugins.private_key import PrivateKeyDetector
        from detect_secrets.settings import get_plugins, get_settings

        names = [cls.__name__ for cls in get_mapping_from_secret_type_to_class().values()
                 if cls.__name__ not in _DISABLED_PLUGINS]
        get_settings().configure_plugins([{"name": n} for n in names])
        self.private_key_type = PrivateKeyDetector.secret_type
        self.patterns: list[re.Pattern] = []
        self.lower_patterns: list[re.Pattern] = []   # case-insensitive ones, run on the lower-cased text
        self.entropy: list[tuple[re.Pattern, object]] = []
        self.every_line = False
        for plugin in get_plugins():
            if isinstance(plugin, RegexBasedDetector):
                # ^ and $ mean a line's start and end in the plugin's per-line use: MULTILINE keeps that
                self.patterns += [re.compile(p.pattern, p.flags | re.MULTILINE) for p in plugin.denylist]
            elif isinstance(plugin, HighEntropyStringsPlugin):
                self.entropy.append((plugin.regex, plugin))
            elif isinstance(plugin, KeywordDetector):
                # every keyword rule needs one of these (lower-case) words in the line; Python's re is
                # ~15x faster matching them case-sensitively in the lower-cased text than with IGNORECASE
                self.lower_patterns.append(re.compile("|".join(DENYLIST)))
            else:  # a plugin this prefilter does not know: scan every line with it
                self.every_line = True

    def candidate_lines(self, text: str, starts: list[int]) -> set[int]:
        """Indices of the lines (split on "\\n"; `starts` holds their start offsets) that may hold a secret."""
        if self.every_line:
            return set(range(len(starts)))
        out: set[int] = set()

        def mark(a: int, b: int) -> None:
            i = bisect.bisect_right(starts, a) - 1
            j = bisect.bisect_right(starts, max(a, b - 1)) - 1
            out.update(range(i, j + 1))

        for pat in self.patterns:
            for m in pat.finditer(text):
                mark(m.start(), m.end())
        low = text.lower()
        for pat in self.lower_patterns:
            if len(low) != len(text):   # a character whose lower case is longer: offsets would shift
                pat = re.compile(pat.pattern, re.IGNORECASE)
                low = text
            for m in pat.finditer(low):
                mark(m.start(), m.end())
        for pat, plugin in self.entropy:
            limit = plugin.entropy_limit
            for m in pat.finditer(text):
                s = m.group(2)
                # Shannon entropy never exceeds log2(len): shorter strings cannot pass the plugin's limit
                if math.log2(max(len(s), 1)) > limit and plugin.calculate_shannon_entropy(s) > limit:
                    mark(m.start(), m.end())
        return out

    def scan(self, lines: list[tuple[int, str]], filename: str):
        """detect-secrets' own per-line scan (plugins and filters) of the candidate lines (1-based numbers).
        Its context for a line is the candidates around it, not the file's lines: that only affects the
        `pragma: allowlist nextline` comment, which at worst masks a line the author allowed."""
        from detect_secrets.core.scan import _process_line_based_plugins

        return _process_line_based_plugins(lines=lines, filename=filename)


def _detector() -> _Detector:
    global _state
    with _lock:
        if _state is None:
            _state = _Detector()
        return _state


def clean(text: str, filename: str = "") -> Cleaned:
    """Mask the lines of `text` that carry a secret (detect-secrets decides); `filename` (a name or path)
    selects its file-type rules. Key material (a private key anywhere) is skipped whole."""
    det = _detector()
    parts = text.split("\n")
    starts, pos = [], 0
    for p in parts:
        starts.append(pos)
        pos += len(p) + 1
    cand = det.candidate_lines(text, starts)
    if not cand:
        return Cleaned(text, 0)
    name = filename.rsplit("/", 1)[-1] or "buffer"
    masked: set[int] = set()
    with _lock:  # detect-secrets keeps global state (settings, caches)
        for s in det.scan([(i + 1, parts[i]) for i in sorted(cand)], name):
            if s.type == det.private_key_type:
                return Cleaned("", 0, KEY_MATERIAL)
            masked.add(s.line_number - 1)
    if not masked:
        return Cleaned(text, 0)
    for i in masked:
        parts[i] = "\r" if parts[i].endswith("\r") else ""
    return Cleaned("\n".join(parts), len(masked))


_KEY_NAMES = None


def is_key_material_name(name: str) -> bool:
    """Does a file name (not a path) mark the file as key material (`KEY_MATERIAL_NAMES`)?"""
    global _KEY_NAMES
    if _KEY_NAMES is None:
        import pathspec

        _KEY_NAMES = pathspec.GitIgnoreSpec.from_lines(KEY_MATERIAL_NAMES)
    return bool(_KEY_NAMES.match_file(name))
