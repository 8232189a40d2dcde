"""Who may steer a daemon served over TCP: a secret token in a file that only the user can read.

Any local process can connect to a TCP port, so `rest-lsp --tcp` lets in only a client that presents the
token it wrote at start (rest_lsp/transport.py checks it). The file is the only way to learn the token, and
it is created readable by its owner alone (0600) in one atomic step, so no other user ever sees it.
"""
from __future__ import annotations

import secrets
from pathlib import Path

from rest_lsp.filenames import safe_filename
from restbase.storage import cache_root, write_bytes_atomic


def new_token() -> str:
    return secrets.token_urlsafe(32)


def default_token_file(host: str, port: int) -> Path:
    """<cache>/tcp/HOST-PORT.token: one per address, so two daemons of one user do not overwrite each
    other's token."""
    return cache_root() / "tcp" / f"{safe_filename(host) or 'any'}-{port}.token"


def write_token_file(path: str | Path, token: str) -> Path:
    path = Path(path).expanduser()
    # the folder is private too: a listing of it would say which ports run a daemon
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    write_bytes_atomic(path, (token + "\n").encode(), mode=0o600)
    return path


def read_token_file(path: str | Path) -> str:
    return Path(path).expanduser().read_text(encoding="utf-8").strip()


def remove_token_file(path: str | Path, token: str) -> None:
    """Remove the file if it still holds this server's token (another server may have written it since)."""
    try:
        if read_token_file(path) == token:
            Path(path).expanduser().unlink()
    except OSError:
        pass
