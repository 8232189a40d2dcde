"""Which files are documents: roots walked with .gitignore/.ignore (pathspec), default excluded folders,
a secrets deny-list, a size limit, a language filter by extension, and no symlink leaving a root."""
from __future__ import annotations

import os
import stat as stat_mod
from dataclasses import dataclass, field
from pathlib import Path

import pathspec

# extension (lower case, with dot) -> language
LANGUAGES: dict[str, tuple[str, ...]] = {
    "python": (".py", ".pyi", ".pyx", ".pxd"),
    "javascript": (".js", ".jsx", ".mjs", ".cjs"),
    "typescript": (".ts", ".tsx", ".mts", ".cts"),
    "java": (".java",),
    "kotlin": (".kt", ".kts"),
    "scala": (".scala", ".sc"),
    "c": (".c", ".h"),
    "cpp": (".cc", ".cpp", ".cxx", ".c++", ".hh", ".hpp", ".hxx", ".h++", ".ipp", ".inl", ".cu", ".cuh"),
    "csharp": (".cs",),
    "go": (".go",),
    "rust": (".rs",),
    "ruby": (".rb",),
    "php": (".php",),
    "swift": (".swift",),
    "objc": (".m", ".mm"),
    "shell": (".sh", ".bash", ".zsh", ".fish"),
    "lua": (".lua",),
    "r": (".r",),
    "julia": (".jl",),
    "dart": (".dart",),
    "haskell": (".hs",),
    "ocaml": (".ml", ".mli"),
    "elixir": (".ex", ".exs"),
    "erlang": (".erl", ".hrl"),
    "clojure": (".clj", ".cljs", ".cljc"),
    "perl": (".pl", ".pm"),
    "sql": (".sql",),
    "zig": (".zig",),
    "nim": (".nim",),
    "fortran": (".f", ".f90", ".f95"),
    "web": (".html", ".css", ".scss", ".vue", ".svelte"),
    "powershell": (".ps1",),
}
DEFAULT_LANGUAGES = tuple(LANGUAGES)

EXCLUDED_DIRS = frozenset({
    ".git", ".hg", ".svn", ".bzr", "node_modules", "bower_components", ".venv", "venv", ".env",
    "__pycache__", ".mypy_cache", ".pytest_cache", ".ruff_cache", ".hypothesis", ".tox", ".nox", ".eggs",
    "build", "dist", "target", "out", ".gradle", ".idea", ".vscode", ".next", ".nuxt", ".cache",
    ".terraform", ".direnv", "site-packages", ".ipynb_checkpoints", ".DS_Store",
})
# secrets: never indexed whatever the language filter says
SECRET_PATTERNS = [
    ".env", ".env*", "*.pem", "*.key", "*.p12", "*.pfx", "*.jks", "*.keystore", "*.kdbx", "id_rsa*",
    "id_dsa*", "id_ecdsa*", "id_ed25519*", "credentials", "credentials.*", "*credentials*.json",
    "service-account*.json", ".netrc", ".pgpass", ".npmrc", ".pypirc", ".htpasswd", "secrets.*",
    "*.secret", "*.secrets", ".git-credentials",
]
_SECRETS = pathspec.GitIgnoreSpec.from_lines(SECRET_PATTERNS)
MAX_FILE_SIZE = 1 << 20


def is_secret_name(name: str) -> bool:
    """Is a file of this name never indexed, whatever the filters (the deny-list above, and key material
    by name: indexer/secrets.py)? Open buffers are checked with it too."""
    from .secrets import is_key_material_name

    return bool(_SECRETS.match_file(name)) or is_key_material_name(name)


@dataclass
class Filters:
    max_file_size: int = MAX_FILE_SIZE
    languages: tuple[str, ...] | None = DEFAULT_LANGUAGES  # None: every extension
    extensions: tuple[str, ...] = ()  # extra extensions (".txt")
    exclude_dirs: frozenset = EXCLUDED_DIRS
    exclude_paths: tuple[str, ...] = ()  # gitignore-style patterns relative to each root
    use_gitignore: bool = True

    def __post_init__(self):
        exts = set(e.lower() if e.startswith(".") else "." + e.lower() for e in self.extensions)
        if self.languages is not None:
            for lang in self.languages:
                if lang not in LANGUAGES:
                    raise ValueError(f"unknown language {lang!r} (known: {', '.join(sorted(LANGUAGES))})")
                exts.update(LANGUAGES[lang])
            self._exts = frozenset(exts)
        else:
            self._exts = None
        self._extra = pathspec.GitIgnoreSpec.from_lines(self.exclude_paths) if self.exclude_paths else None

    def to_dict(self) -> dict:
        return {"max_file_size": self.max_file_size,
                "languages": list(self.languages) if self.languages is not None else None,
                "extensions": list(self.extensions), "exclude_dirs": sorted(self.exclude_dirs),
                "exclude_paths": list(self.exclude_paths), "use_gitignore": self.use_gitignore}

    @classmethod
    def from_dict(cls, d: dict | None) -> "Filters":
        if not d:
            return cls()
        langs = d.get("languages")
        return cls(max_file_size=int(d.get("max_file_size", MAX_FILE_SIZE)),
                   languages=tuple(langs) if langs is not None else None,
                   extensions=tuple(d.get("extensions", ())),
                   exclude_dirs=frozenset(d.get("exclude_dirs", EXCLUDED_DIRS)),
                   exclude_paths=tuple(d.get("exclude_paths", ())),
                   use_gitignore=bool(d.get("use_gitignore", True)))

    def name_ok(self, name: str) -> bool:
        if is_secret_name(name):
            return False
        if self._exts is None:
            return True
        dot = name.rfind(".")
        return dot > 0 and name[dot:].lower() in self._exts


@dataclass
class Candidate:
    path: Path  # absolute, under its root (not symlink-resolved)
    root: Path
    size: int
    mtime_ns: int


@dataclass
class Report:
    skipped: dict = field(default_factory=dict)  # reason -> count
    errors: list = field(default_factory=list)  # messages for a person

    def skip(self, reason: str, n: int = 1):
        self.skipped[reason] = self.skipped.get(reason, 0) + n


class IgnoreRules:
    """.gitignore / .ignore files per directory (cached by mtime); deeper files take precedence."""

    def __init__(self, filters: Filters):
        self.filters = filters
        self._cache: dict[Path, tuple[tuple, object]] = {}

    def spec_for(self, d: Path):
        if not self.filters.use_gitignore:
            return None
        sig = []
        lines: list[str] = []
        for n in (".gitignore", ".ignore"):
            f = d / n
            try:
                st = f.stat()
            except OSError:
                continue
            sig.append((n, st.st_mtime_ns, st.st_size))
        sig_t = tuple(sig)
        hit = self._cache.get(d)
        if hit is not None and hit[0] == sig_t:
            return hit[1]
        spec = None
        if sig:
            for n, _, _ in sig:
                try:
                    lines += (d / n).read_text(encoding="utf-8", errors="replace").splitlines()
                except OSError:
                    pass
            spec = pathspec.GitIgnoreSpec.from_lines(lines)
        self._cache[d] = (sig_t, spec)
        return spec

    def chain(self, root: Path, dir_parts: tuple[str, ...]) -> list:
        """[(depth, spec)] of the ignore files from root down to root/dir_parts."""
        out = []
        for depth in range(len(dir_parts) + 1):
            spec = self.spec_for(root.joinpath(*dir_parts[:depth]))
            if spec is not None:
                out.append((depth, spec))
        return out

    def ignored(self, root: Path, rel_parts: tuple[str, ...], is_dir: bool, chain: list | None = None) -> bool:
        """Is root/rel ignored by the ignore files of its ancestors (the deepest deciding one wins)?
        `chain`: the parent folder's `chain()`, when the caller walks and already has it."""
        rel = "/".join(rel_parts) + ("/" if is_dir else "")
        if self.filters._extra is not None:
            r = self.filters._extra.check_file(rel)
            if r.include:
                return True
        if chain is None:
            chain = self.chain(root, rel_parts[:-1])
        for depth, spec in reversed(chain):
            sub = "/".join(rel_parts[depth:]) + ("/" if is_dir else "")
            r = spec.check_file(sub)
            if r.include is not None:
                return bool(r.include)
        return False


def _is_venv(d: Path) -> bool:
    return (d / "pyvenv.cfg").exists() or (d / "conda-meta").is_dir()


def _within(path: str, root_real: str) -> bool:
    return path == root_real or path.startswith(root_real.rstrip(os.sep) + os.sep)


def walk(roots, filters: Filters | None = None, report: Report | None = None, rules: IgnoreRules | None = None):
    """Yield Candidates under the roots (files that pass every filter except content checks)."""
    filters = filters or Filters()
    report = report if report is not None else Report()
    rules = rules or IgnoreRules(filters)
    for root in roots:
        root = Path(root).expanduser().absolute()
        if not root.exists():
            report.errors.append(f"root {root} does not exist")
            report.skip("missing_root")
            continue
        if root.is_file():
            try:
                st = root.stat()
            except OSError as e:
                report.errors.append(f"{root}: {e.strerror}")
                continue
            if filters.name_ok(root.name) and st.st_size <= filters.max_file_size:
                yield Candidate(root, root.parent, st.st_size, st.st_mtime_ns)
            continue
        root_real = os.path.realpath(root)
        stack = [(root, (), rules.chain(root, ()))]
        while stack:
            d, parts, chain = stack.pop()
            try:
                entries = sorted(os.scandir(d), key=lambda e: e.name)
            except OSError as e:
                report.errors.append(f"cannot list {d}: {e.strerror}")
                report.skip("unreadable_dir")
                continue
            dirs = []
            for e in entries:
                name = e.name
                rel = parts + (name,)
                try:
                    is_link = e.is_symlink()
                    is_dir = e.is_dir(follow_symlinks=True)
                except OSError:
                    report.skip("unreadable")
                    continue
                if is_link:
                    # never out of the root; inside it the target is indexed under its own path
                    real = os.path.realpath(e.path)
                    if not _within(real, root_real):
                        report.skip("symlink_outside_root")
                    elif is_dir and _within(os.path.dirname(e.path), real):
                        report.skip("symlink_loop")
                    else:
                        report.skip("symlink_inside_root")
                    continue
                if is_dir:
                    if name in filters.exclude_dirs or name.endswith(".egg-info"):
                        report.skip("excluded_dir")
                        continue
                    if rules.ignored(root, rel, True, chain):
                        report.skip("ignored")
                        continue
                    p = Path(e.path)
                    if _is_venv(p):
                        report.skip("excluded_dir")
                        continue
                    spec = rules.spec_for(p)
                    dirs.append((p, rel, chain + [(len(rel), spec)] if spec is not None else chain))
                    continue
                if not filters.name_ok(name):  # before the stat: most files fail here
                    report.skip("filtered")
                    continue
                if rules.ignored(root, rel, False, chain):
                    report.skip("ignored")
                    continue
                try:
                    st = e.stat(follow_symlinks=True)
                except OSError:
                    report.skip("vanished")
                    continue
                if not stat_mod.S_ISREG(st.st_mode):
                    report.skip("not_regular")
                    continue
                if st.st_size > filters.max_file_size:
                    report.skip("too_large")
                    continue
                yield Candidate(Path(e.path), root, st.st_size, st.st_mtime_ns)
            stack.extend(reversed(dirs))


def is_document(path: Path, roots, filters: Filters, rules: IgnoreRules) -> tuple[bool, Path | None]:
    """Would `walk` yield this file? (for single-file updates). Returns (ok, root)."""
    path = Path(path).absolute()
    for root in roots:
        root = Path(root).absolute()
        if root.is_file() or path == root:
            if path == root:
                return filters.name_ok(path.name), root.parent
            continue
        try:
            rel = path.relative_to(root)
        except ValueError:
            continue
        parts = rel.parts
        if not parts:
            return False, None
        for i in range(len(parts) - 1):
            n = parts[i]
            if n in filters.exclude_dirs or n.endswith(".egg-info"):
                return False, root
            if rules.ignored(root, parts[: i + 1], True) or _is_venv(root.joinpath(*parts[: i + 1])):
                return False, root
        if not filters.name_ok(parts[-1]) or rules.ignored(root, parts, False):
            return False, root
        for i in range(1, len(parts) + 1):  # walk() follows no symlink: neither does this
            if os.path.islink(root.joinpath(*parts[:i])):
                return False, root
        return True, root
    return False, None


def read_text(path: Path, max_size: int) -> tuple[str | None, bytes, int, str | None]:
    """(text, raw bytes, replaced characters, skip reason). Binary files (a NUL in the first 8 KiB) and
    files over the limit are skipped; undecodable bytes are replaced with U+FFFD and counted."""
    with open(path, "rb") as f:
        # read() preallocates what it is asked for: ask for the file's size, not the limit (1e12 with a
        # raised --max-file-size was a MemoryError), and read on only if the file grew meanwhile
        size = os.fstat(f.fileno()).st_size
        raw = f.read(min(max_size, size) + 1)
        while size < len(raw) <= max_size:
            more = f.read(min(1 << 20, max_size + 1 - len(raw)))
            if not more:
                break
            raw += more
    if len(raw) > max_size:
        return None, b"", 0, "too_large"
    if b"\0" in raw[:8192]:
        return None, raw, 0, "binary"
    if raw.startswith(b"\xef\xbb\xbf"):
        raw_t = raw[3:]
    else:
        raw_t = raw
    try:
        return raw_t.decode("utf-8"), raw, 0, None
    except UnicodeDecodeError:
        text = raw_t.decode("utf-8", errors="replace")
        bad = text.count("\ufffd") - raw_t.count("\ufffd".encode())
        return text, raw, max(bad, 1), None
