"""RemoteBackend: the daemon's backend (rest_lsp.service.core.Backend) when the model runs on a team server.

Under the `server` setting the daemon keeps everything editor-side (LSP, documents, the prompt layout and
windows, the cross-file block, the workspace index that block reads) and replaces only the decoding: each run
renders the prompt exactly as the local backend would (the same FIM format, markers as token ids) with the
model's tokenizer loaded alone (no weights), streams it to the team server's /v1/completions (read on a thread
of the run's own, `_Reader`, so a step never blocks the worker for long) and applies the daemon's stop rules
(lines, the infill's suffix, the block's end) to the text as it arrives. A run the
scheduler stops (the request superseded or cancelled, a rule met) closes its stream, and vLLM aborts the
request when its connection closes. Warm-ups compute nothing here (the server's prefix cache does that work
when the request comes).

What a remote run does not do: token healing (the open end of the cursor's line, `lead`, is put in the prompt
as text instead of being forced token by token) and the per-step figures (retrieval, forward): the server's
/metrics has vLLM's speculative-decoding counters instead.

A server that cannot be reached or refuses the key fails the run with a TeamServerError whose message the
service shows; the daemon stays up and tries again at the next request.
"""
from __future__ import annotations

import logging
import os
import queue
import threading
import time
from functools import partial
from pathlib import Path
from typing import Callable, Sequence

from rest_lsp.engine.stops import lines_cut, suffix_cut
from .config import ModelLimits, ServerConfig, prompt_windows
from .layout import prompt_parts, resolve_layout, strip_lead

from .prompt import block_end_cut
from .team_client import TeamClient, TeamServerError, client_from_setting

log = logging.getLogger(__name__)


class _NoBuffers:
    """The local backend's ContextSource takes open buffers; remote drafting happens on the server."""

    def set_buffer(self, name, tokens) -> None:
        pass

    def drop_buffer(self, name) -> None:
        pass


class RemoteRun:
    """One streamed completion, read one server-sent event per `advance`."""

    def __init__(self, prompt: list[int], lead: str, *, max_tokens: int, temperature: float = 0.0,
                 seed: int | None = None, max_lines: int | None = None, stop_text: str | None = None,
                 stop_fn=None, warm: bool = False):
        self.prompt, self.lead = prompt, lead
        self.max_tokens, self.temperature, self.seed = max_tokens, temperature, seed
        self.max_lines, self.stop_text, self.stop_fn = max_lines, stop_text, stop_fn
        self.stream = None       # the CompletionStream, once the reader opened it
        self.reader: _Reader | None = None
        self.raw = lead          # the output as the prompt's continuation: the lead, then what the server sent
        self.done = warm or max_tokens <= 0
        self.prefilled = self.done
        self.stop_reason: str | None = "warm" if warm else None
        self.events = 0
        self.started = time.perf_counter()
        self.first_event_s: float | None = None
        self.ended_s: float | None = None
        self.error: str | None = None

    @property
    def text(self) -> str:
        return strip_lead(self.raw, self.lead)

    def feed(self, piece: str) -> None:
        self.raw += piece
        self.events += 1
        text, reason = self.raw, None
        if self.stop_text and (cut := suffix_cut(text, self.stop_text)) is not None:
            text, reason = text[:cut], "stop_text"
        if self.max_lines is not None and (cut := lines_cut(text, self.max_lines)) is not None:
            text, reason = text[:cut], "max_lines"
        if self.stop_fn is not None and (cut := self.stop_fn(text)) is not None:
            text, reason = text[:cut], "stop_fn"
        if reason is not None:
            self.raw = text
            self.finish(reason)

    def finish(self, reason: str) -> None:
        if self.reader is not None:
            self.reader.close()
        if not self.done or self.stop_reason is None:
            self.stop_reason = reason
        self.done = self.prefilled = True
        self.ended_s = self.ended_s or time.perf_counter()


STEP_WAIT_S = 0.05   # the longest a worker step waits for the server's next event


class _Reader:
    """Opens a run's stream and reads it on a thread, handing pieces over through a queue; closing it closes
    the connection (which unblocks the read and makes vLLM abort the request)."""

    _END = object()

    def __init__(self, client: TeamClient, run: RemoteRun):
        self.client, self.run = client, run
        self.queue: queue.Queue = queue.Queue()
        self.closed = False
        self.thread = threading.Thread(target=self._read, name="team-stream", daemon=True)
        self.thread.start()

    def _read(self) -> None:
        run = self.run
        try:
            stream = self.client.stream(run.prompt, max_tokens=run.max_tokens, temperature=run.temperature,
                                        seed=run.seed)
            run.stream = stream
            if self.closed:            # stopped while the request was being sent
                stream.close()
                return
            while (piece := stream.next_text()) is not None:
                self.queue.put(piece)
            self.queue.put(self._END)
        except TeamServerError as exc:
            self.queue.put(exc if not self.closed else self._END)
        except Exception as exc:  # noqa: BLE001 - the run fails with it, the daemon does not
            self.queue.put(TeamServerError(f"team server {self.client.url}: {type(exc).__name__}: {exc}"))

    def take(self, wait_s: float) -> tuple[list[str], bool]:
        """The pieces that arrived (waiting up to wait_s for the first), and whether the stream ended."""
        out: list[str] = []
        try:
            item = self.queue.get(timeout=wait_s)
            while True:
                if item is self._END:
                    return out, True
                if isinstance(item, TeamServerError):
                    raise item
                out.append(item)
                item = self.queue.get_nowait()
        except queue.Empty:
            return out, False

    def close(self) -> None:
        self.closed = True
        if self.run.stream is not None:
            self.run.stream.close()


class RemoteBackend:
    """Implements rest_lsp.service.core.Backend over a team server (see the module's docstring)."""

    def __init__(self, loaded, client: TeamClient):
        self.loaded = loaded                  # tokenizer, FIM format and name; no weights (model is None)
        self.client = client
        self.name = f"{loaded.name} @ {client.url}"
        self.context = _NoBuffers()
        self.config_seen: ServerConfig | None = None
        self.served: str | None = None
        self.last_error: str | None = None
        self.runs = self.closed_early = 0

    # -- what the service asks of any backend ------------------------------------------------------
    def tokenizer_spec(self):
        return getattr(self.loaded, "indexer_tokenizer", None) or self.loaded.tokenizer

    def encode(self, text: str) -> list[int]:
        return list(self.loaded.tokenizer.encode(text, add_special_tokens=False))

    def decode(self, ids: Sequence[int]) -> str:
        return self.loaded.tokenizer.decode(list(ids))

    def warm_up(self) -> None:
        pass

    def idle_work(self):
        return None

    def reset_kv_cache(self) -> None:
        pass

    def close(self) -> None:
        pass

    prompt_device = "remote"   # the server's prompt windows: not a laptop CPU's

    def prompt_parts(self, ctx, config: ServerConfig, anchor: int | None = None):
        max_prefix, max_suffix = prompt_windows(config, self.prompt_device)
        orders = tuple(getattr(self.loaded.fim, "orders", ("psm",)) or ("psm",))
        return prompt_parts(ctx, resolve_layout(config.layout, orders), max_prefix, max_suffix, anchor)

    def start(self, key: str, ctx, config: ServerConfig, *, purpose: str = "predict", temperature: float = 0.0,
              seed: int | None = None, anchor: int | None = None, repo=None) -> RemoteRun:
        self.config_seen = config
        parts = self.prompt_parts(ctx, config, anchor)
        # the open end of the line goes into the prompt as text (no token healing on the server)
        prompt = self.loaded.build_prompt(parts.prefix, parts.suffix, middle=parts.middle + parts.lead,
                                          order=parts.order, max_new_tokens=config.max_tokens, repo=repo)
        if purpose == "warm":
            return RemoteRun(prompt, parts.lead, max_tokens=0, warm=True)
        lines = 1 if ctx.infill_in_line() else config.max_lines
        self.runs += 1
        return RemoteRun(prompt, parts.lead, max_tokens=config.max_tokens, temperature=temperature, seed=seed,
                         max_lines=lines, stop_text=ctx.stop_text() if lines > 1 else None,
                         stop_fn=partial(block_end_cut, block_indent=ctx.ahead_indent()) if lines > 1 else None)

    def advance(self, run: RemoteRun, interrupt: Callable[[], bool] | None = None) -> None:
        """The stream is opened and read by a thread of the run's own (`_Reader`); a step takes what arrived
        and waits at most STEP_WAIT_S for more, so the worker stays free to stop the run or start another
        (which is why `interrupt` is not needed here)."""
        if run.done:
            return
        if run.reader is None:
            run.reader = _Reader(self.client, run)
        try:
            pieces, ended = run.reader.take(STEP_WAIT_S)
        except TeamServerError as exc:
            run.error = self.last_error = str(exc)
            run.finish("error")
            raise
        if pieces and run.first_event_s is None:
            run.first_event_s = time.perf_counter()
            run.prefilled = True
        for piece in pieces:
            self.last_error = None
            run.feed(piece)
            if run.done:
                return
        if ended:
            run.finish("max_tokens" if run.stream is not None and run.stream.finish_reason == "length" else "eos")

    def stop(self, run: RemoteRun, reason: str) -> None:
        if not run.done:
            if run.reader is not None:
                self.closed_early += 1
            run.finish(reason)

    def figures(self, run: RemoteRun) -> dict:
        usage = run.stream.usage if run.stream is not None else None
        end = run.ended_s or time.perf_counter()
        return {"tokens": (usage or {}).get("completion_tokens", run.events), "steps": run.events,
                "accepted_per_step": None,
                "prefill_ms": round(((run.first_event_s or end) - run.started) * 1000, 2),
                "decode_ms": round((end - (run.first_event_s or end)) * 1000, 2),
                "retrieval_ms": 0.0, "forward_ms": 0.0, "draft_nodes": 0,
                "stop_reason": run.stop_reason if run.done else None, "prompt_tokens": len(run.prompt),
                "reused_tokens": 0, "computed_tokens": len(run.prompt), "forwards": run.events,
                "accepted_sources": {}, "remote": True, "error": run.error}

    def limits(self) -> ModelLimits:
        return ModelLimits(context=self.loaded.context_length, tree_reserve=0, fim=self.loaded.fim is not None,
                           exact_trees=True)

    def describe(self) -> dict:
        return {"name": self.name, "device": "remote", "precision": None, "verifier": "team-server",
                "server": {"url": self.client.url, "model": self.client.model, "key": bool(self.client.key),
                           "runs": self.runs, "closed_early": self.closed_early, "last_error": self.last_error},
                "layout": resolve_layout(self.config_seen.layout) if self.config_seen else None,
                "fim": getattr(self.loaded.fim, "name", None)}


def tokenizer_only(spec: str | None):
    """A LoadedModel with the model's tokenizer and FIM format and no weights: what prompts need. The model is
    named as for a local one (an embedded model is its converted directory in the cache, made once)."""
    import torch

    from rest_lsp.model import host
    from rest_lsp.model.prompts import context_limit, decode_as_continuation, resolve_fim, stop_token_ids

    embedded = host.embedded_model(None if spec in (None, "", "auto") else spec)
    p = Path(os.fspath(spec)).expanduser() if spec not in (None, "", "auto") else None
    if embedded is not None and (p is None or not p.exists()):
        kind, location, name = "embedded", host.embedded_model_dir(embedded.name), embedded.title
    elif p is not None and p.suffix.lower() == ".gguf":
        kind, location, name = "dir", host.convert_gguf(p), p.name
    elif p is not None and p.is_dir():
        kind, location, name = "dir", p, p.name
    else:
        kind, location, name = "hub", str(spec), str(spec)
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(str(location))
    except Exception as exc:  # noqa: BLE001
        raise host.ModelLoadError(f"the tokenizer of {name}: {type(exc).__name__}: {exc}") from exc
    decode_as_continuation(tokenizer)
    fim = resolve_fim("auto", tokenizer)
    return host.LoadedModel(model=None, tokenizer=tokenizer, device=torch.device("cpu"), dtype=torch.float32,
                            precision="remote", name=name, fim=fim, path=None if kind == "hub" else Path(location),
                            context_length=context_limit(tokenizer), stop_ids=stop_token_ids(tokenizer, fim),
                            tokenizer_source="embedded" if kind == "embedded" and name == host.EMBEDDED_NAME
                            else str(location))


def load_remote_backend(config: ServerConfig, repository=None) -> RemoteBackend:
    """The backend factory under the `server` setting: the tokenizer of `model`, the server checked once
    (reachable, the key accepted, the model it serves)."""
    client = client_from_setting(config.server)
    loaded = tokenizer_only(config.model)
    backend = RemoteBackend(loaded, client)
    try:
        backend.served = client.model_name()
        limit = client.max_model_len()   # prompts are fitted to the server's context, not the tokenizer's
        if limit and (loaded.context_length is None or limit < loaded.context_length):
            loaded.context_length = limit
    except TeamServerError as exc:   # the daemon still starts; each request tries again and says why
        backend.last_error = str(exc)
        log.warning("team server: %s", exc)
    return backend
