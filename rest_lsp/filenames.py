"""Cache file names made from free text (model names, folder names, cache keys)."""
from __future__ import annotations


def safe_filename(text: str) -> str:
    """`text` with every character but letters, digits, '.', '_' and '-' replaced by '_'."""
    return "".join(c if c.isalnum() or c in "._-" else "_" for c in text)
