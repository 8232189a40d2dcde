"""Where rest-lsp keeps what outlives a process, and how it writes there without leaving a torn file.

    cache_root() -> Path                       $REST_LSP_CACHE, else platformdirs' user cache dir "rest-lsp"
    file_lock(path)                            an inter-process lock (a sidecar lock file)
    atomic_file(path) / write_bytes_atomic     a file replaced whole or not at all
    atomic_dir(dest)                           a directory built aside and renamed into place when complete

Everything rest-lsp caches lives under the one root: the embedded model (`embedded/`), converted GGUFs
(`converted/`), model tokenizers (`tokenizers/`), the default corpus (`corpus/`), workspace datastores
(`workspaces/`), the history (`history/`), c(q) and precision measurements (`cost/`), int4w's packed layers
(`packed/`), inductor's graphs (`inductor/`), bench recordings (`replay/`), the editor test tools (`editors/`). A `cache_dir` setting
moves the daemon's own part (workspaces, history) elsewhere; the rest stays here.

Imports nothing of the project and never torch: the indexer, which must stay importable without torch,
uses it as much as the model host does.
"""
from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Iterator

CACHE_ENV = "REST_LSP_CACHE"


def cache_root() -> Path:
    """The user cache directory of rest-lsp ($REST_LSP_CACHE overrides), created if missing."""
    env = os.environ.get(CACHE_ENV)
    if env:
        root = Path(env).expanduser()
    else:
        import platformdirs

        root = Path(platformdirs.user_cache_dir("rest-lsp"))
    root.mkdir(parents=True, exist_ok=True)
    return root


class _PathLock:
    def __init__(self) -> None:
        self.threads = threading.RLock()
        self.depth = 0          # nested holds by the thread that has it: one flock for all of them
        self.fd: int | None = None


_LOCKS: dict[str, _PathLock] = {}
_LOCKS_GUARD = threading.Lock()


@contextmanager
def file_lock(path: str | os.PathLike) -> Iterator[None]:
    """Hold the lock file `path` for the `with` block: one holder at a time among this process's threads
    (re-entrant in the holding thread) and across processes (flock, which the kernel releases if the
    holder dies, so a killed process never leaves a stale lock). The file is created, never deleted."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    key = str(path.resolve())
    with _LOCKS_GUARD:
        lock = _LOCKS.setdefault(key, _PathLock())
    with lock.threads:
        if lock.depth == 0:
            fd = os.open(key, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
            except BaseException:
                os.close(fd)
                raise
            lock.fd = fd
        lock.depth += 1
        try:
            yield
        finally:
            lock.depth -= 1
            if lock.depth == 0:
                fd, lock.fd = lock.fd, None
                try:
                    fcntl.flock(fd, fcntl.LOCK_UN)
                finally:
                    os.close(fd)


def fsync_dir(path: Path) -> None:
    """Make a rename in `path` durable (a no-op where directories cannot be opened)."""
    try:
        fd = os.open(str(path), os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory fds
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover
        pass
    finally:
        os.close(fd)


def tmp_name(final: Path) -> Path:
    """The temporary sibling a write of `final` goes through. The `.tmp-` prefix is what a datastore's
    clean-up (indexer/manifest.py remove_unreferenced) recognises as left over from an interrupted write."""
    return final.with_name(f".tmp-{os.getpid()}-{os.urandom(4).hex()}-{final.name}")


@contextmanager
def atomic_file(path: str | os.PathLike, *, text: bool = False, sync_dir: bool = True,
                mode: int = 0o666) -> Iterator[IO]:
    """Write `path` atomically: the `with` block writes a temporary file in the same folder, which is
    fsynced and renamed over `path`, then the folder is fsynced (`sync_dir=False`: the caller does, once
    for several files). On any error, the block's own included (a failed checksum), the temporary file is
    removed and `path` is untouched. `text`: the file object takes str (UTF-8). `mode` (less the umask) is
    the file's from its creation on, so a secret (0o600) is never readable by others, not even briefly."""
    path = Path(path)
    tmp = tmp_name(path)

    def opener(name, flags):
        return os.open(name, flags | os.O_EXCL, mode)
    try:
        with open(tmp, "w", encoding="utf-8", opener=opener) if text else open(tmp, "wb", opener=opener) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    if sync_dir:
        fsync_dir(path.parent)


def write_bytes_atomic(path: str | os.PathLike, data: bytes, *, mode: int = 0o666) -> None:
    with atomic_file(path, mode=mode) as f:
        f.write(data)


@contextmanager
def atomic_dir(dest: str | os.PathLike) -> Iterator[Path]:
    """Build a directory aside and rename it over `dest` when the `with` block completes; on any error
    the partial directory is removed and `dest` is untouched. Hold a `file_lock` around it where several
    processes may build the same `dest`."""
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=dest.name + ".", suffix=".partial", dir=dest.parent))
    try:
        yield tmp
        os.chmod(tmp, 0o755)  # mkdtemp makes it private; the cache is the user's like any other folder
        if dest.exists():     # a damaged or stale entry being replaced
            shutil.rmtree(dest)
        os.replace(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
