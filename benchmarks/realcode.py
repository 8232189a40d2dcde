"""Real code for the user-level benchmarks: a project taken from PyPI that no corpus of this project holds.

    root = fetch_project("boltons==26.2.0")      # downloaded once (pip download, sdist), cached, extracted
    bodies = function_bodies(path.read_text())   # (first body line, last line, indent) per function

The default is boltons: a pure-Python utility library with a strong house style, not installed with
rest-lsp (so not in the site-packages corpus `rest-index build --corpus-from-env` makes). The download goes
into the user cache (`$REST_LSP_CACHE/bench-data`), extracted into a temporary folder and renamed into place,
so an interrupted run never leaves a half-extracted project that a later run trusts.
"""
from __future__ import annotations

import ast
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

DEFAULT_PROJECT = "boltons==26.2.0"


def cache_dir() -> Path:
    from restbase.storage import cache_root

    return cache_root() / "bench-data"


def fetch_project(spec: str = DEFAULT_PROJECT, cache: Path | None = None) -> Path:
    """The extracted source tree of a PyPI sdist (the folder holding its top-level package or modules)."""
    cache = Path(cache) if cache is not None else cache_dir()
    dest = cache / spec.replace("==", "-").replace("/", "_")
    if (dest / ".complete").is_file():
        return _source_root(dest)
    from restbase.storage import atomic_dir

    with atomic_dir(dest) as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check", "--no-deps",
                        "--no-binary", ":all:", "-d", str(tmp / "dl"), spec], check=True, timeout=600)
        archive = next((tmp / "dl").iterdir())
        if archive.name.endswith(".zip"):
            with zipfile.ZipFile(archive) as z:
                z.extractall(tmp / "src")
        else:
            with tarfile.open(archive) as t:
                t.extractall(tmp / "src", filter="data")
        shutil.rmtree(tmp / "dl")
        (tmp / ".complete").write_text(spec + "\n")
    return _source_root(dest)


def _source_root(dest: Path) -> Path:
    (top,) = [p for p in (dest / "src").iterdir() if p.is_dir()]  # the sdist's one top folder
    return top


def python_files(root: Path) -> list[Path]:
    """The project's own modules (no tests, docs or setup scripts), sorted."""
    skip = {"tests", "test", "docs", "doc", "examples", "misc", "tools"}
    out = []
    for p in sorted(root.rglob("*.py")):
        rel = p.relative_to(root).parts
        if any(part in skip or part.startswith(".") for part in rel[:-1]) or p.name in ("setup.py", "conftest.py"):
            continue
        if p.name.startswith("test_"):
            continue
        out.append(p)
    return out


def function_bodies(text: str, min_lines: int = 2, max_lines: int = 12) -> list[tuple[int, int, int]]:
    """(first body line, last body line, indent) of functions whose body (docstring excluded) has
    min_lines..max_lines lines (0-based line numbers)."""
    out = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            body = node.body
            if isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant):
                body = body[1:]  # the docstring stays in the prefix
            if not body:
                continue
            first, last = body[0].lineno - 1, node.end_lineno - 1
            if min_lines <= last - first + 1 <= max_lines:
                out.append((first, last, body[0].col_offset))
    return sorted(out)
