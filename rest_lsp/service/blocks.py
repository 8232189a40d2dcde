"""Each document's cross-file block over time: where the person is, when to select again, and the switch to a
new block only once its prompt is computed.

    blocks = Blocks(settings, repository, stats, worker, scheduler)
    blocks.placed(uri, text, ctx)     # every edit and request: a file switch or a new name at the cursor asks
                                      # for a selection (on the selection thread; the latest per document)
    blocks.saved(uri)                 # a save: the place joins the recent-files ring, and a selection
                                      # (a keystroke's or a save's changes the block only with a new definition)
    blocks.current(uri)               # the block every prompt of the document starts with now (None: none/off;
                                      # `crossFile: "auto"` gives a document a block while it is short)

What a selection holds and when it counts as changed is rest_lsp/service/crossfile.py (`select`,
`ContextKeeper`); a changed block's prompt is computed by the scheduler behind everything else
(`Scheduler.warm_block`) and only then becomes current, so no keystroke waits for it.
"""
from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Optional

from .config import ServerConfig, cross_file_budget, cross_file_on, fits_prefix_window
from .crossfile import ContextKeeper, Cursor, RepoView, Selection, select
from .datastores import DatastoreSet
from .prompt import CompletionContext, PositionError, build_context
from .scheduler import Scheduler
from .stats import Stats
from .worker import InferenceWorker
from .workspace import uri_to_path

log = logging.getLogger(__name__)

PLACES_KEPT = 64  # documents whose last place is remembered (for the ring when the person leaves them)


class Blocks:
    def __init__(self, settings: Callable[[], ServerConfig], repository: DatastoreSet, stats: Stats,
                 worker: InferenceWorker, scheduler: Scheduler):
        self._settings = settings
        self.repository = repository
        self.stats = stats
        self.worker = worker
        self.scheduler = scheduler
        self.keeper = ContextKeeper()
        self._views: dict[str, RepoView] = {}
        self._places: OrderedDict[str, tuple[str, int, int]] = OrderedDict()  # uri -> (text, line, column)
        self._active: str | None = None
        self._long: set[str] = set()   # documents past the prefix window ("auto": no block; cross_file_on)
        self._born_short: dict[str, bool] = {}   # uri -> whether it fitted the window when first seen
        self._selecting: dict[str, tuple] = {}   # uri -> the latest (text, ctx) to select for
        self._selecting_lock = threading.Lock()
        self._selector = ThreadPoolExecutor(1, thread_name_prefix="rest-lsp-context")

    def current(self, uri: str) -> Optional[Selection]:
        """The block the document's prompts start with now (None: none yet, or cross-file context is off for it)."""
        place = self._places.get(uri)
        return self.keeper.current(uri) if place is not None and self._on(uri, place[0]) else None

    def _device(self, backend=None) -> str:
        # the device whose prompt windows and block budget apply: the backend that builds the prompts (a team
        # server's, not this CPU's)
        return getattr(backend or self.worker.backend, "prompt_device", "cpu")

    def _on(self, uri: str, text: str) -> bool:
        config, device = self._settings(), self._device()
        if uri not in self._born_short:
            self._born_short[uri] = fits_prefix_window(config, device, len(text))
        on = cross_file_on(config, device, len(text), was_long=uri in self._long, born_short=self._born_short[uri])
        if on:
            self._long.discard(uri)
        else:
            self._long.add(uri)
        return on

    def placed(self, uri: str, text: str, ctx: CompletionContext) -> None:
        """Where the person is. Leaving a file puts its place into the recent-files ring; a file switch or a new
        name at the cursor asks for a new selection (a keystroke otherwise keeps the block)."""
        if not self._settings().cross_file:
            return
        prev = self._active
        if prev is not None and prev != uri and prev in self._places:
            ptext, pline, _ = self._places[prev]
            self._remember(prev, ptext, pline)
        self._active = uri
        self._set_place(uri, text, ctx)
        if not self._on(uri, text):  # a long document: its place feeds the ring, it selects no block of its own
            return
        line_after = ctx.suffix.split("\n", 1)[0]
        if prev != uri or self.keeper.new_names(uri, ctx.prefix, line_after):
            self._request_selection(uri, text, ctx, in_place=prev == uri)

    def saved(self, uri: str) -> None:
        """A save: the place joins the recent-files ring (for the other documents' blocks) and the document's
        block is selected again; it changes only with a new definition (with autosave, every pause is a save)."""
        place = self._places.get(uri)
        if place is None or not self._settings().cross_file:
            return
        text, line, column = place
        self._remember(uri, text, line)
        if not self._on(uri, text):
            return
        try:
            self._request_selection(uri, text, build_context(text, line, column), in_place=True)
        except PositionError:
            pass

    def closed(self, uri: str) -> None:
        self.keeper.forget(uri)
        self._places.pop(uri, None)
        self._long.discard(uri)
        self._born_short.pop(uri, None)

    def use_now(self, uri: str, text: str, ctx: CompletionContext) -> Optional[Selection]:
        """Select the document's block here and use it from the next prompt on (a one-shot completion, the
        benchmarks: nothing to keep warm). The model must be loaded."""
        backend = self.worker.backend
        if not self._settings().cross_file or backend is None:
            return None
        self._active = uri
        self._set_place(uri, text, ctx)
        if not self._on(uri, text):
            return None
        sel = self.selection_for(backend, uri, text, ctx)
        if sel is not None:
            self.keeper.set_current(uri, sel)
        return sel

    def selection_for(self, backend, uri: str, text: str, ctx: CompletionContext) -> Optional[Selection]:
        """The cross-file block for a cursor, from the workspace datastores the service holds now."""
        encode, decode = text_codec(backend)
        views = []
        for key in self.repository.keys():
            store = self.repository.get(key)
            if store is None or not hasattr(store, "documents"):
                continue
            view = self._views.get(key)
            if view is None or view.store is not store:
                view = self._views[key] = RepoView(Path(key), store, encode, decode)
            views.append(view)
        path = uri_to_path(uri)
        cur = Cursor(str(path) if path is not None else None, ctx.prefix, ctx.suffix.split("\n", 1)[0], text)
        cfg = self._settings()
        return select(views, cur, budget=cross_file_budget(cfg, self._device(backend)),
                      selectors=cfg.cross_file_selectors, ring=self.keeper.ring, encode=encode)

    def snapshot(self) -> dict:
        return self.keeper.snapshot()

    def close(self) -> None:
        self._selector.shutdown(wait=False, cancel_futures=True)

    # -- the selection thread -------------------------------------------------------------------------
    def _set_place(self, uri: str, text: str, ctx: CompletionContext) -> None:
        self._places[uri] = (text, ctx.line, ctx.column)
        self._places.move_to_end(uri)
        while len(self._places) > PLACES_KEPT:
            self._long.discard(self._places.popitem(last=False)[0])

    def _remember(self, uri: str, text: str, line: int) -> None:
        path = uri_to_path(uri)
        if path is not None:
            self.keeper.ring.add(str(path), text, line)

    def _request_selection(self, uri: str, text: str, ctx: CompletionContext, in_place: bool = False) -> None:
        """Select the document's block on the selection thread; only the latest request of a document runs (as
        asked in place, a keystroke's or a save's, only when every request it replaced was too)."""
        with self._selecting_lock:
            first = uri not in self._selecting
            if not first:
                in_place = in_place and self._selecting[uri][2]
            self._selecting[uri] = (text, ctx, in_place)
        if first:
            try:
                self._selector.submit(self._select, uri)
            except RuntimeError:  # shut down
                self._selecting.pop(uri, None)

    def _select(self, uri: str) -> None:
        with self._selecting_lock:
            text, ctx, in_place = self._selecting.pop(uri, (None, None, False))
        backend = self.worker.backend
        if text is None or backend is None:
            return
        try:
            t0 = time.perf_counter()
            sel = self.selection_for(backend, uri, text, ctx)
            self.stats.count("context_selections")
            self.stats.count("context_select_ms", round((time.perf_counter() - t0) * 1000))
        except Exception:  # noqa: BLE001 - completions go on with the block they have
            log.exception("cross-file selection failed for %s", uri)
            return
        taken = self.keeper.offer(uri, sel, in_place=in_place) if sel is not None else None
        if taken is not None:
            # stopped or dropped before the block was computed: it is not pending any more, so that the next
            # selection offers it again instead of finding it "unchanged"
            self.scheduler.warm_block(uri, ctx, taken, promote=lambda: self.keeper.promote(uri, taken),
                                      withdraw=lambda: self.keeper.withdraw(uri, taken))


def text_codec(backend) -> tuple[Callable[[str], list[int]], Callable[[list[int]], str]]:
    """encode/decode with the model's tokenizer for threads other than the inference thread (the datastores'
    `tokenizers` copy where the backend has one)."""
    from tokenizers import Tokenizer

    tok = backend.tokenizer_spec() if hasattr(backend, "tokenizer_spec") else None
    if isinstance(tok, Tokenizer):
        return (lambda t: tok.encode(t, add_special_tokens=False).ids), \
            (lambda ids: tok.decode(ids, skip_special_tokens=False))
    return backend.encode, backend.decode
