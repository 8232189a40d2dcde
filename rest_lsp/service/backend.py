"""The real backend: the model host, the REST engine and its draft sources, owned by the inference thread.

Draft sources, mixed by share (SHARES; the engine normalises them): the prompt itself (`ContextSource`), the
model's earlier output (`HistorySource`, kept in the cache directory across restarts unless `persist_history`
is off), the workspace datastores with their live shards of open buffers (`DatastoreSource` over
`DatastoreSet`), the configured corpus datastore, and the model's own recent top-k (`RecyclingSource`).
Plain decoding (`use_retrieval=False`, or draft_budget 0) runs the same engine with no drafts.
"""
from __future__ import annotations

import logging
import time
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

from rest_lsp.filenames import safe_filename

from .config import ServerConfig, prompt_windows
from .core import Attempt
from .datastores import DatastoreSet
from .prompt import CompletionContext, block_end_cut

if TYPE_CHECKING:  # the engine (and torch) load with the model, not with the server
    from rest_lsp.engine.history import HistoryFile

log = logging.getLogger(__name__)

SHARES = {"context": 0.5, "history": 0.2, "repository": 0.3, "corpus": 0.2, "recycle": 0.05}
HISTORY_SAVE_S = 60.0  # the history is written at most this often (and when the daemon closes)


def history_path(cache_dir: Path, model_key: str) -> Path:
    """Where the daemon keeps the model's output: one file per model (token ids are the tokenizer's)."""
    return cache_dir / "history" / f"{safe_filename(model_key)}.msgpack"


class EngineBackend:
    """Implements rest_lsp.service.core.Backend with rest_lsp.engine."""

    def __init__(self, loaded, repository: DatastoreSet, corpus_path: str | None = None,
                 history_file: Path | None = None):
        from rest_lsp.engine.generate import Engine
        from rest_lsp.engine.history import HistoryFile, history_model_key
        from rest_lsp.engine.sources import (CORPUS_MAX_LEN, ContextSource, DatastoreSource, HistorySource,
                                             RecyclingSource)

        self.loaded = loaded
        self.name = loaded.name
        self.repository = repository
        self.corpus = None
        self.corpus_error: str | None = None
        if corpus_path:
            try:
                from indexer.store import Datastore
                self.corpus = Datastore.open(Path(corpus_path).expanduser(), tokenizer=self.tokenizer_spec())
            except Exception as exc:  # noqa: BLE001 - completions work without the corpus
                self.corpus_error = f"{type(exc).__name__}: {exc}"
                log.warning("corpus datastore %s not used: %s", corpus_path, self.corpus_error)
        self.context = ContextSource()
        self.history = HistorySource()
        self.history_file: HistoryFile | None = None
        self.history_error: str | None = None
        self._history_saved = time.monotonic()
        if history_file is not None:
            self._load_history(HistoryFile(history_file, history_model_key(loaded), self.history))
        sources = [(self.context, SHARES["context"]), (self.history, SHARES["history"]),
                   (DatastoreSource(repository, name="repository"), SHARES["repository"])]
        if self.corpus is not None:
            sources.append((DatastoreSource(self.corpus, name="corpus", max_len=CORPUS_MAX_LEN), SHARES["corpus"]))
        sources.append((RecyclingSource(), SHARES["recycle"]))
        from rest_lsp.model.verifiers import make_verifier_or_eager, verifier_kind

        # a static KV cache and prepacked weights (rest_lsp/model/fast.py); eager where unsupported
        verifier = make_verifier_or_eager(loaded, "auto")
        self.verifier_kind = verifier_kind(verifier)
        # one engine, one KV cache: plain decoding is the same engine with draft_budget 0, so REST and
        # plain run the same forward and share the reuse of the prompt's prefix
        self.engine = Engine(loaded, sources, verifier=verifier)
        self.config_seen: ServerConfig | None = None

    def warm_up(self) -> None:
        """One short generation at load time: the first request must not pay for the one-time
        calibration of the verification cost c(q) (cached on disk) and the first-call overheads."""
        from rest_lsp.engine.generate import GenerationConfig

        self.engine.generate(self.encode("def main():\n    "), GenerationConfig(max_new_tokens=4))

    def _load_history(self, hf: HistoryFile) -> None:
        from rest_lsp.engine.history import HistoryError, set_aside

        self.history_file = hf
        try:
            hf.load()
        except HistoryError as exc:
            if not hf.path.exists():
                return  # the first run: nothing saved yet
            # keep the unreadable file for inspection instead of writing over it
            try:
                where = f"moved to {set_aside(hf.path)}"
            except OSError:
                self.history_file = None  # never overwrite what could not be moved aside
                where = "left as it is, and this daemon saves no history"
            self.history_error = str(exc)
            log.warning("history not loaded: %s (%s)", exc, where)

    def save_history(self, *, force: bool = True) -> bool:
        """Write the history (atomically, keeping what another daemon of this model saved) when it holds new
        output; unless `force`, at most every HISTORY_SAVE_S."""
        hf = self.history_file
        if hf is None or (self.config_seen is not None and not self.config_seen.persist_history):
            return False
        if not hf.dirty or (not force and time.monotonic() - self._history_saved < HISTORY_SAVE_S):
            return False
        try:
            hf.save()
        except OSError as exc:
            log.warning("history not saved to %s: %s", hf.path, exc)
            return False
        finally:
            if hf.error is not None and hf.error != self.history_error:   # a damaged file found at the save
                self.history_error = hf.error
                log.warning("history file %s could not be read; %s", hf.path, hf.error)
        self._history_saved = time.monotonic()
        return True

    def close(self) -> None:
        """The daemon is closing (the inference thread has stopped): keep the history."""
        self.save_history()

    def forget_kv_cache(self) -> None:
        """Start the next generation from an empty KV cache (fair timing in `complete --compare`)."""
        self.engine._forget_cache()

    def tokenizer_spec(self) -> str | None:
        """What the indexer needs to load the same tokenizer (a model dir; None for the embedded model)."""
        path = getattr(self.loaded, "path", None)
        return str(path) if path is not None else None

    def encode(self, text: str) -> list[int]:
        return list(self.loaded.tokenizer.encode(text, add_special_tokens=False))

    def decode(self, ids: Sequence[int]) -> str:
        return self.loaded.tokenizer.decode(list(ids))

    def generate(self, ctx: CompletionContext, config: ServerConfig, *, time_budget_s: float | None,
                 should_stop: Callable[[], bool], temperature: float = 0.0, seed: int | None = None,
                 use_retrieval: bool = True) -> Attempt:
        from rest_lsp.engine.generate import GenerationConfig

        self.config_seen = config
        max_prefix, max_suffix = prompt_windows(config, self.loaded.device.type)
        prompt = self.loaded.build_prompt(ctx.prompt_prefix(max_prefix), ctx.prompt_suffix(max_suffix),
                                          max_new_tokens=config.max_tokens)
        gen = GenerationConfig(
            max_new_tokens=config.max_tokens,
            draft_budget=config.draft_budget if use_retrieval else 0,
            time_budget_s=time_budget_s,
            max_lines=config.max_lines if ctx.multiline else 1,
            stop_text=ctx.stop_text() if ctx.multiline else None,
            stop_fn=partial(block_end_cut, block_indent=ctx.block_indent()) if ctx.multiline else None,
            temperature=temperature, seed=seed)
        t0 = time.perf_counter()
        r = self.engine.generate(prompt, gen, should_stop=should_stop)
        wall = (time.perf_counter() - t0) * 1000
        self.save_history(force=False)
        return Attempt(text=r.text, stop_reason=r.stop_reason, tokens=len(r.tokens), steps=r.steps,
                       accepted=list(r.accepted), retrieval_ms=float(sum(r.retrieval_ms)),
                       forward_ms=float(sum(r.forward_ms)), prefill_ms=r.prefill_s * 1000,
                       decode_ms=r.decode_s * 1000 if r.decode_s else wall)

    def describe(self) -> dict:
        lm = self.loaded
        return {"name": lm.name, "device": str(lm.device), "precision": lm.precision, "verifier": self.verifier_kind,
                "prompt_windows": prompt_windows(self.config_seen, lm.device.type) if self.config_seen else None,
                "fim": getattr(lm.fim, "name", None), "corpus": "loaded" if self.corpus is not None
                else self.corpus_error,
                "history": {"file": str(self.history_file.path) if self.history_file else None,
                            "tokens": int((self.history.tokens() >= 0).sum()), "error": self.history_error}}


def load_backend(config: ServerConfig, repository: DatastoreSet | None = None) -> EngineBackend:
    from rest_lsp.engine.history import history_model_key
    from rest_lsp.model.host import load_model

    from .workspace import default_cache_dir

    loaded = load_model(config.model, device=config.device, precision=config.precision)
    cache = Path(config.cache_dir).expanduser() if config.cache_dir else default_cache_dir()
    history = history_path(cache, history_model_key(loaded)) if config.persist_history else None
    backend = EngineBackend(loaded, repository if repository is not None else DatastoreSet(), config.corpus,
                            history_file=history)
    backend.warm_up()
    return backend
