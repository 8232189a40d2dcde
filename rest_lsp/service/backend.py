"""The real backend: the model host, the REST engine and its draft sources, owned by the inference thread.

Draft sources, mixed by share (rest_lsp/engine/policy.py, the policy the bench measures): the prompt itself (`ContextSource`), the
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
from rest_lsp.model.prompts import RepoContext
from restbase.storage import cache_root

from .config import ModelLimits, ServerConfig, prompt_windows
from .datastores import DatastoreSet
from .layout import PromptParts, prompt_parts, resolve_layout, strip_lead
from .prompt import CompletionContext, block_end_cut

if TYPE_CHECKING:  # the engine (and torch) load with the model, not with the server
    from rest_lsp.engine.generate import Run
    from rest_lsp.engine.history import HistoryFile

log = logging.getLogger(__name__)

HISTORY_SAVE_S = 60.0  # the history is written at most this often (and when the daemon closes)
# Prompt tokens per forward when warming the cache: a completion that arrives meanwhile waits at most one such
# chunk (the embedded model on 2 cores: 0.2-0.4 s; 0.36 s in bf16 after a 1,200-token cache on a Zen4 EPYC,
# benchmarks/cost_curve.py), at a small loss of throughput against 256; 16-token chunks for a new cross-file
# block were tried and gave the person nothing (docs/results/crossfile.md, 2026-12-05).
WARM_CHUNK = 64
# The text whose tokens the load-time tree check verifies (any text would do; code reads like the daemon's input)
TREE_PROBE_TEXT = "def area(width, height):\n    return width * height\n"


def history_path(cache_dir: Path, model_key: str) -> Path:
    """Where the daemon keeps the model's output: one file per model (token ids are the tokenizer's)."""
    return cache_dir / "history" / f"{safe_filename(model_key)}.msgpack"


class EngineBackend:
    """Implements rest_lsp.service.core.Backend with rest_lsp.engine."""

    def __init__(self, loaded, repository: DatastoreSet, corpus_path: str | None = None,
                 history_file: Path | None = None, kv_pool_bytes: int = 0):
        from rest_lsp.engine.generate import Engine
        from rest_lsp.engine.history import HistoryFile, history_model_key
        from rest_lsp.engine.policy import make_sources
        from rest_lsp.engine.sources import ContextSource, HistorySource, SnippetSource

        self.loaded = loaded
        self.name = loaded.name
        # the model's size in fp32, for the memory check of a re-measurement (its tensors may be released later)
        self.fp32_bytes = 4 * sum(t.numel() for t in (*loaded.model.parameters(), *loaded.model.buffers()))
        self.repository = repository
        self.corpus = None
        self.corpus_error: str | None = None
        if corpus_path:
            try:
                from indexer.store import Datastore
                self.corpus = Datastore.open(Path(corpus_path).expanduser(), tokenizer=self.tokenizer_spec())
                self.corpus.prefault()  # the first completions' searches would fault its pages in one by one
            except Exception as exc:  # noqa: BLE001 - completions work without the corpus
                self.corpus_error = f"{type(exc).__name__}: {exc}"
                log.warning("corpus datastore %s not used: %s", corpus_path, self.corpus_error)
        self.context = ContextSource()
        self.snippets = SnippetSource()  # the cross-file blocks' snippets, one buffer per document
        self.history = HistorySource()
        self.history_file: HistoryFile | None = None
        self.history_error: str | None = None
        self._history_saved = time.monotonic()
        if history_file is not None:
            self._load_history(HistoryFile(history_file, history_model_key(loaded), self.history))
        # the policy `rest-lsp bench --methods rest` measures (rest_lsp/engine/policy.py)
        sources = make_sources("rest", context=self.context, history=self.history, repository=repository,
                               corpus=self.corpus, snippets=self.snippets)
        from rest_lsp.model.verifiers import attention_kind, choose_verifier

        # which verifier runs here and whether its tree rows are exact: checked on this device and CPU, through
        # the verifier chosen, rather than assumed per kind (rest_lsp/model/verifiers.py)
        chosen = choose_verifier(loaded, self.encode(TREE_PROBE_TEXT))
        verifier = chosen.verifier
        self.verifier_kind = chosen.kind
        self.attention = attention_kind(verifier)  # how its tree rows attend: kernel, float64, ...
        self.tree_check = chosen.trees
        self.trees_exact = self.tree_check.exact
        if not self.trees_exact:
            log.warning("draft trees refused, completions decode plainly (a draftBudget setting overrides): %s",
                        self.tree_check.reason)
        # one engine, one KV cache: plain decoding is the same engine with draft_budget 0, so REST and
        # plain run the same forward and share the reuse of the prompt's prefix
        self.engine = Engine(loaded, sources, verifier=verifier, kv_pool_bytes=kv_pool_bytes)
        self.precision_choice: dict | None = None  # what `precision: auto` measured on this CPU
        self._snippet_texts: dict[str, list[str]] = {}
        # the live steps held to that measurement (rest_lsp/model/precision.py LiveCheck), and how to load the
        # model again in fp32 to measure once more when they disagree
        self.precision_check = None
        self.model_spec: str | None = None
        self.config_seen: ServerConfig | None = None
        # `model: auto` (rest_lsp/model/choice.py): what it chose and why, and a larger model it measures when
        # idle (once per daemon: a failed or postponed measurement is tried again by the next daemon)
        self.model_choice: dict | None = None
        self.model_auto_precision = "auto"
        self._model_measured = False

    def warm_up(self) -> None:
        """One short generation at load time: the first request must not pay for the one-time
        calibration of the verification cost c(q) (cached on disk) and the first-call overheads."""
        from rest_lsp.engine.generate import GenerationConfig

        # a forced start builds the vocabulary's prefix index too (token healing, rest_lsp/engine/vocab.py)
        self.engine.generate(self.encode("def main():\n   "), GenerationConfig(max_new_tokens=4, forced_text=" "))
        self.engine.reset_cache()

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

    def tokenizer_spec(self):
        """The model's own tokenizer, for every datastore (workspace and its live buffers, corpus): a copy with
        the model tokenizer's vocabulary (LoadedModel.indexer_tokenizer), whichever way the model was named
        (directory, hub id, .gguf, embedded). A store built in another vocabulary is refused by its fingerprint."""
        return getattr(self.loaded, "indexer_tokenizer", None) or self.loaded.tokenizer

    def encode(self, text: str) -> list[int]:
        return list(self.loaded.tokenizer.encode(text, add_special_tokens=False))

    def decode(self, ids: Sequence[int]) -> str:
        return self.loaded.tokenizer.decode(list(ids))

    # -- runs (the service drives them one forward at a time on the inference thread) ----------------
    @property
    def prompt_device(self) -> str:
        """The device class whose prompt windows this backend's prompts use (config.prompt_windows)."""
        return self.loaded.device.type

    def prompt_parts(self, ctx: CompletionContext, config: ServerConfig, anchor: int | None = None) -> PromptParts:
        max_prefix, max_suffix = prompt_windows(config, self.prompt_device)
        orders = tuple(getattr(self.loaded.fim, "orders", ("psm",)) or ("psm",))
        return prompt_parts(ctx, resolve_layout(config.layout, orders), max_prefix, max_suffix, anchor)

    def start(self, key: str, ctx: CompletionContext, config: ServerConfig, *, purpose: str = "predict",
              temperature: float = 0.0, seed: int | None = None, anchor: int | None = None,
              repo: RepoContext | None = None) -> CompletionRun:
        """purpose: "warm" computes the prompt only (in small chunks, so a completion pre-empts it soon);
        "predict" decodes greedily past the cursor's line to the end of its block (what the next pauses show);
        "typing" is "predict" with the prompt in a warm-up's small chunks (started by a key, not a request);
        "ahead" is "predict" for a prompt holding a suggestion as if taken, whose forwards a key contradicting
        it interrupts (engine `Run.speculative`); "sample" is "predict" at a temperature (an Invoked request's
        alternatives). `repo`: the cross-file block the prompt starts with (rest_lsp/service/crossfile.py); its
        snippets draft too."""
        from rest_lsp.engine.generate import GenerationConfig

        self.config_seen = config
        parts = self.prompt_parts(ctx, config, anchor)
        prompt = self.loaded.build_prompt(parts.prefix, parts.suffix, middle=parts.middle, order=parts.order,
                                          max_new_tokens=config.max_tokens, repo=repo)
        self.set_snippets(key, repo)
        if purpose == "warm":
            return CompletionRun(self.engine.start(prompt, GenerationConfig(max_new_tokens=0), key=key,
                                                   chunk=WARM_CHUNK))
        lines = 1 if ctx.infill_in_line() else config.max_lines
        gen = GenerationConfig(
            max_new_tokens=config.max_tokens,
            # automatic budget where trees verify exactly; plain decoding where they do not (choose_verifier)
            draft_budget=config.draft_budget if config.draft_budget is not None or self.trees_exact else 0,
            max_lines=lines,
            stop_text=ctx.stop_text() if lines > 1 else None,
            stop_fn=partial(block_end_cut, block_indent=ctx.ahead_indent()) if lines > 1 else None,
            temperature=temperature, seed=seed, forced_text=parts.lead)
        return CompletionRun(self.engine.start(prompt, gen, key=key, chunk=WARM_CHUNK if purpose == "typing" else None,
                                               speculative=purpose == "ahead"), parts.lead)

    def set_snippets(self, key: str, repo: RepoContext | None) -> None:
        """The snippets a document's prompts hold, as the snippet source's buffer of that document."""
        texts = [text for _, text in repo.files] if repo is not None else []
        if not texts:
            self.snippets.drop_buffer(key)
        elif self._snippet_texts.get(key) != texts:
            self.snippets.set_buffer(key, self.encode("\n".join(texts)))
        self._snippet_texts.pop(key, None)
        self._snippet_texts[key] = texts
        if len(self._snippet_texts) > 16:  # the documents used last
            old = next(iter(self._snippet_texts))
            self._snippet_texts.pop(old)
            self.snippets.drop_buffer(old)

    def clear_snippets(self) -> None:
        """No document's snippets draft any more (a benchmark's configurations start alike)."""
        for key in list(self._snippet_texts):
            self.snippets.drop_buffer(key)
        self._snippet_texts.clear()

    def advance(self, run: CompletionRun, interrupt: Callable[[], bool] | None = None) -> None:
        self.engine.advance(run.run, interrupt)

    def stop(self, run: CompletionRun, reason: str) -> None:
        if not run.done:
            self.engine.stop(run.run, reason)
        if self.precision_check is not None and not run.observed:
            run.observed = True
            self.precision_check.observe(run.run.result.forward_ms, run.run.result.draft_sizes, self.engine.cost)
        if run.run.config.max_new_tokens:
            self.save_history(force=False)

    def idle_work(self):
        """What the inference worker runs, one forward per step, once it has been idle a while
        (rest_lsp/service/worker.py): the precision measured again when the live steps disagreed with it;
        else, under `model: auto`, a larger embedded model in the cache that has no trusted measurement."""
        check = self.precision_check
        if check is None or not check.due:
            return self._model_auto_work()
        from rest_lsp.model import precision
        from rest_lsp.model.host import load_model

        busy = precision.machine_allows(self.fp32_bytes)
        if busy is not None:
            check.reason = f"re-measurement postponed: {busy}"
            return None  # asked again after the next job

        spec = self.model_spec
        return check.remeasure(lambda: load_model(spec, device="cpu", precision="fp32"))

    def _model_auto_work(self):
        choice = self.model_choice
        name = choice.get("pending") if choice else None
        if not name or self._model_measured:
            return None
        from rest_lsp.model import choice as model_choice
        from rest_lsp.model import precision

        busy = precision.machine_allows(model_choice.fp32_bytes(name))
        if busy is not None:
            choice["measuring"] = f"{name}: postponed ({busy})"
            return None  # asked again after the next job
        self._model_measured = True
        choice["measuring"] = f"{name}: measuring"
        return self._measure_model(name)

    def _measure_model(self, name: str):
        from rest_lsp.model import choice as model_choice

        try:
            after = yield from model_choice.measure(name, self.model_auto_precision)
        except Exception as exc:
            self.model_choice["measuring"] = f"{name}: failed ({type(exc).__name__}: {exc})"
            raise
        self.model_choice["measuring"] = f"{name}: measured"
        self.model_choice["next_start"] = {k: after[k] for k in ("choice", "reason", "measured")}
        log.info("model auto: %s measured (%s); the next start chooses %s (%s)", name, after["measured"],
                 after["choice"], after["reason"])

    def figures(self, crun: CompletionRun) -> dict:
        run = crun.run
        r = run.result
        tokens = len(run.tokens)
        return {"tokens": tokens, "steps": r.steps,
                "accepted_per_step": round(tokens / r.steps, 3) if r.steps else None,
                "prefill_ms": round(r.prefill_s * 1000, 2), "decode_ms": round(r.decode_s * 1000, 2),
                "retrieval_ms": round(sum(r.retrieval_ms), 2), "forward_ms": round(sum(r.forward_ms), 2),
                "draft_nodes": sum(r.draft_sizes),
                "stop_reason": r.stop_reason if run.done else None, "prompt_tokens": r.prompt_tokens,
                "reused_tokens": r.reused_tokens, "computed_tokens": run.computed, "forwards": run.forwards,
                "interrupted_forwards": run.interrupted, "accepted_sources": dict(r.accepted_sources)}

    def limits(self) -> ModelLimits:
        context = self.engine.max_positions or self.loaded.context_length
        return ModelLimits(context=int(context) if context else None, tree_reserve=self.engine.tree_reserve,
                           fim=self.loaded.fim is not None, exact_trees=self.trees_exact,
                           trees_reason=self.tree_check.reason)

    def reset_kv_cache(self) -> None:
        """Start the next run from an empty KV cache (fair timing in `complete --compare`)."""
        self.engine.reset_cache()

    def describe(self) -> dict:
        lm = self.loaded
        return {"name": lm.name, "device": str(lm.device), "precision": lm.precision, "verifier": self.verifier_kind,
                "trees": self.tree_check.describe() | {"exact": self.trees_exact, "attention": self.attention},
                "layout": resolve_layout(self.config_seen.layout) if self.config_seen else None,
                "precision_choice": self.precision_choice,
                # a copy: the inference thread adds to it (an idle measurement) while the stats are serialised
                "model_choice": dict(self.model_choice) if self.model_choice is not None else None,
                "precision_check": self.precision_check.snapshot() if self.precision_check is not None else None,
                "kv_cache": self.engine.pool.snapshot() | {"active_tokens": self.engine.cached_tokens},
                "prompt_windows": prompt_windows(self.config_seen, self.prompt_device) if self.config_seen else None,
                "fim": getattr(lm.fim, "name", None), "corpus": "loaded" if self.corpus is not None
                else self.corpus_error,
                "history": {"file": str(self.history_file.path) if self.history_file else None,
                            "tokens": int((self.history.tokens() >= 0).sum()), "error": self.history_error}}


class CompletionRun:
    """An engine run as the service reads it: its output as text after the cursor (the indentation a prompt
    left out taken off, rest_lsp/service/layout.py)."""

    def __init__(self, run: Run, lead: str = ""):
        self.run, self.lead = run, lead
        self.observed = False  # its steps were given to the precision's live check

    @property
    def done(self) -> bool:
        return self.run.done

    @property
    def prefilled(self) -> bool:
        return self.run.prefilled

    @property
    def text(self) -> str:
        return strip_lead(self.run.text, self.lead)


def load_backend(config: ServerConfig, repository: DatastoreSet | None = None) -> EngineBackend:
    if config.server:   # a team server decodes (rest_lsp/service/remote.py); the prompt is still made here
        from .remote import load_remote_backend

        return load_remote_backend(config, repository)
    from rest_lsp.engine.history import history_model_key
    from rest_lsp.model.host import load_model

    spec, model_choice = config.model, None
    if config.model == "auto":
        from rest_lsp.model.choice import resolve
        from rest_lsp.model.host import resolve_device

        # decided from the cache's measurements, never by fetching or measuring before the first completion
        model_choice = resolve(resolve_device(config.device).type, config.precision)
        spec = model_choice["choice"]
    loaded = load_model(spec, device=config.device, precision=config.precision)
    precision_choice = None
    if config.precision == "auto" and loaded.device.type == "cpu" and loaded.precision == "fp32":
        from rest_lsp.model.precision import as_precision, choose

        # measured once per model and CPU (cached), again where that measurement was noisy or contradicted
        choice, precision_choice = choose(loaded)
        loaded = as_precision(loaded, choice)
    cache = Path(config.cache_dir).expanduser() if config.cache_dir else cache_root()
    history = history_path(cache, history_model_key(loaded)) if config.persist_history else None
    backend = EngineBackend(loaded, repository if repository is not None else DatastoreSet(), config.corpus,
                            history_file=history, kv_pool_bytes=config.kv_cache_mb << 20)
    backend.precision_choice = precision_choice
    backend.model_spec = spec
    backend.model_choice = model_choice
    backend.model_auto_precision = config.precision
    if precision_choice is not None and isinstance(precision_choice.get(precision_choice.get("choice")), dict):
        from rest_lsp.model.precision import LiveCheck

        backend.precision_check = LiveCheck(loaded.name, precision_choice)
    release = getattr(backend.engine.verifier, "release_model_copies", None)
    if release is not None and not getattr(backend.engine.verifier, "compiled", False):
        # one copy of each weight in the daemon: the packed verifier's (nothing here runs the model's own forward)
        from rest_lsp.model.host import return_freed_memory

        freed = release(loaded.model)
        log.info("released %.2f GB of model tensors the verifier holds its own copies of (heap trimmed: %s)",
                 freed / 1e9, return_freed_memory())
    backend.warm_up()
    return backend
