"""The LSP layer: registers features with pygls and delegates to rest_lsp.service.

Everything here converts between LSP types (UTF-16 positions, lsprotocol classes, JSON-RPC errors) and the
service's plain values; the per-request logic lives in rest_lsp/service/.
"""
from __future__ import annotations

import asyncio
import logging
import os
import threading
from typing import Any

from lsprotocol import types
from pygls.exceptions import JsonRpcException, JsonRpcInternalError, JsonRpcInvalidParams
from pygls.lsp.server import LanguageServer
from pygls.protocol import LanguageServerProtocol
from pygls.protocol.json_rpc import JsonRPCNotification

from .documents import FastTextDocument
from .documents import install as install_documents
from .service.config import PATH_KEYS, ServerConfig, withhold
from .service.core import CompletionRequest, CompletionService, ServiceError
from .service.prompt import Selected

log = logging.getLogger(__name__)

STATS = "rest/stats"
DRAFTS = "rest/drafts"
CURSOR = "rest/cursor"   # notification from our editor clients: where the cursor rests ({textDocument, position})
# notification to clients that announce `experimental.restLsp.suggestionReady`: an Automatic request answered
# empty for want of time has its suggestion now ({textDocument: {uri, version}, position}); the client asks again
# if the document and cursor are still there
READY = "rest/suggestionReady"
REBUILD_INDEX = "rest-lsp.rebuildIndex"   # workspace/executeCommand: rebuild the workspace datastores
MODEL_UNAVAILABLE = -32001   # a server-defined JSON-RPC error code: the model failed to load
NOT_ALLOWED = -32003         # server-defined: what a client not trusted with paths may not do (rest/drafts)


class _Protocol(LanguageServerProtocol):
    """Answers malformed requests with InvalidParams instead of dropping them (pygls logs and moves on,
    leaving the client waiting forever), keeps Python tracebacks out of error replies (pygls puts them in
    `error.data`; they go to the log instead) and counts every error reply by its reason for `rest/stats`."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.error_replies: dict[str, int] = {}

    def _send_response(self, msg_id, result=None, error=None):
        if error is not None:
            data = getattr(error, "data", None)
            if isinstance(data, dict) and "traceback" in data:
                log.error("request %s failed: %s\n%s", msg_id, error.message, "".join(data["traceback"]))
                error.data = None
            reason = f"{error.code}: {str(error.message).splitlines()[0][:120] if error.message else ''}"
            self.error_replies[reason] = self.error_replies.get(reason, 0) + 1
        super()._send_response(msg_id, result, error)

    def structure_message(self, data: dict[str, Any]):
        if "method" in data and "params" not in data and self.get_message_type(data["method"]) is None:
            # JSON-RPC lets params be omitted; pygls' generic message types require the field
            data = {**data, "params": None}
        try:
            return super().structure_message(data)
        except JsonRpcException as exc:
            if "id" in data and "method" in data and "error" not in data:
                why = exc.__cause__ or exc
                self._send_response(data["id"], error=JsonRpcInvalidParams(
                    f"malformed params for {data['method']}: {str(why).splitlines()[0][:300]}"
                ).to_response_error())
                # a "$/" notification nobody handles: pygls ignores it quietly
                return JsonRPCNotification(method="$/rest-lsp/malformed", jsonrpc="2.0", params=None)
            raise


def _version() -> str:
    try:
        from importlib.metadata import version
        return version("rest-lsp")
    except Exception:  # noqa: BLE001 - running from a source tree
        return "0"


class RestLanguageServer(LanguageServer):
    # Over stdio the client is the editor that started the server as the user, so it may name paths and
    # models and read drafts; a TCP client only with --trust-client (rest_lsp/cli.py).
    trust_client = True
    # False for a TCP daemon that serves the next client after this one's `exit`
    exit_ends_process = True

    def __init__(self, config: ServerConfig | None = None):
        super().__init__("rest-lsp", _version(), protocol_cls=_Protocol,
                         text_document_sync_kind=types.TextDocumentSyncKind.Incremental)
        self.service = CompletionService(config or ServerConfig(), notify=self.notify_log)
        self.indexing = None   # rest_lsp.service.workspace.WorkspaceIndex, after `initialized`
        self.loop: asyncio.AbstractEventLoop | None = None   # captured in `initialize`

    def notify_log(self, level: str, message: str) -> None:
        """window/logMessage from any thread (the inference and indexing threads report through here);
        level "problem" is a warning the user should act on, also shown with window/showMessage."""
        kind = {"error": types.MessageType.Error, "warning": types.MessageType.Warning,
                "problem": types.MessageType.Warning, "info": types.MessageType.Info}.get(level, types.MessageType.Log)
        py_level = "warning" if level == "problem" else level
        getattr(log, py_level if py_level in ("error", "warning", "info") else "debug")(message)
        self._post(self.window_log_message, types.LogMessageParams(type=kind, message=f"rest-lsp: {message}"))
        if level == "problem":
            self._post(self.window_show_message, types.ShowMessageParams(type=kind, message=f"rest-lsp: {message}"))

    def suggestion_ready(self, req: CompletionRequest) -> None:
        """rest/suggestionReady for a request (on the event loop: the service's watch runs there)."""
        doc = self.workspace.text_documents.get(req.uri)
        if doc is None:
            return
        self.protocol.notify(READY, {"textDocument": {"uri": req.uri, "version": req.version},
                                     "position": _from_columns(doc, req.text, req.line, req.column)})

    def show_warning(self, message: str) -> None:
        self.notify_log("problem", message)

    def _post(self, fn, params) -> None:
        loop = getattr(self, "loop", None)
        try:
            if loop is not None and loop.is_running():
                loop.call_soon_threadsafe(fn, params)
        except RuntimeError:
            pass   # the loop is closing


def _to_columns(doc, pos: types.Position) -> tuple[int, int]:
    """A client position (UTF-16 by default) as (line, code-point column); columns past the line stay past."""
    if isinstance(doc, FastTextDocument):
        return doc.columns(pos)
    lines = doc.lines
    if pos.line < len(lines):
        line = lines[pos.line]
        col = doc.position_codec.position_from_client_units(lines, pos).character
        units = doc.position_codec.client_num_units(line.rstrip("\r\n"))
        if pos.character > units:
            col = len(line.rstrip("\r\n")) + (pos.character - units)
        return pos.line, col
    return pos.line, pos.character


def _from_columns(doc, text: str, line: int, col: int) -> types.Position:
    from .service.prompt import line_offsets
    start, _ = line_offsets(text, line)
    units = doc.client_units if isinstance(doc, FastTextDocument) else doc.position_codec.client_num_units
    return types.Position(line=line, character=units(text[start:start + col]))


def _edit_end(doc, changes) -> tuple[int, int] | None:
    """Where the cursor is after an edit: the end of the last change's inserted text. A whole-text change says
    nothing about the cursor, so the document located its edit against the text before it (documents.edit_end:
    common prefix and suffix); None where nothing changed."""
    if not changes:
        return None
    if getattr(changes[-1], "range", None) is None:
        return getattr(doc, "full_change_end", None)
    change = changes[-1]
    start, text = change.range.start, change.text
    lines = text.split("\n")
    codec = doc.position_codec
    if len(lines) == 1:
        end = types.Position(start.line, start.character + codec.client_num_units(text))
    else:
        end = types.Position(start.line + len(lines) - 1, codec.client_num_units(lines[-1]))
    return _to_columns(doc, end)


def _as_dict(params: Any) -> dict:
    """Custom requests' params as a dict (pygls hands them over as dicts or namedtuple-like objects)."""
    if isinstance(params, dict):
        return params
    if hasattr(params, "_asdict"):
        return dict(params._asdict())
    if hasattr(params, "__dict__"):
        return dict(vars(params))
    return {}


def _error(exc: ServiceError) -> JsonRpcException:
    if exc.code == "invalid_params":
        return JsonRpcInvalidParams(str(exc))
    if exc.code == "internal":
        return JsonRpcInternalError(str(exc))
    from pygls.exceptions import JsonRpcServerError
    return JsonRpcServerError(str(exc), MODEL_UNAVAILABLE)


# ---------------------------------------------------------------------------------------- LSP handlers
# One named function per LSP message, a few lines each: LSP types in, the service's plain values out
# (jedi-language-server style). create_server() registers them.
def initialize(ls: RestLanguageServer, params: types.InitializeParams):
    try:
        ls.loop = asyncio.get_running_loop()
    except RuntimeError:
        pass
    install_documents(ls.workspace)   # edits cost what the edit costs (rest_lsp/documents.py)
    # problems are shown (window/showMessage)
    ls.service.configure(_client_settings(ls, params.initialization_options or {}))
    if _announces_ready(params.capabilities):
        ls.service.on_ready = ls.suggestion_ready
    ls.service.start()


def _announces_ready(caps: types.ClientCapabilities | None) -> bool:
    """Whether the client asks again on rest/suggestionReady (ClientCapabilities.experimental.restLsp)."""
    ours = _as_dict(_as_dict(getattr(caps, "experimental", None)).get("restLsp"))
    return ours.get("suggestionReady") is True


def initialized(ls: RestLanguageServer, params: types.InitializedParams):
    from .service.workspace import WorkspaceIndex
    folders = [f.uri for f in (ls.workspace.folders or {}).values()] or \
        ([ls.workspace.root_uri] if ls.workspace.root_uri else [])
    ls.indexing = WorkspaceIndex(ls.service, ls.notify_log, _ProgressReporter(ls))
    ls.indexing.start(folders)


def shutdown(ls: RestLanguageServer, params):
    close_all(ls)


def exit_(ls: RestLanguageServer, params):
    # pygls exits by raising SystemExit on the event loop, after which the interpreter waits for its
    # stdin reader thread, which only returns when the client closes the pipe. Not every client does:
    # make sure the process ends soon after `exit` either way.
    rc = 0 if ls.protocol._shutdown else 1
    close_all(ls)
    if not ls.exit_ends_process:
        return
    logging.shutdown()
    timer = threading.Timer(1.0, os._exit, args=(rc,))
    timer.daemon = True
    timer.start()


def did_change_configuration(ls: RestLanguageServer, params: types.DidChangeConfigurationParams):
    changed, _ = ls.service.configure(_client_settings(ls, params.settings))   # problems are shown
    if ls.indexing is not None and changed & {"exclude", "index_workspace", "cache_dir", "corpus"}:
        ls.indexing.reconfigure(changed)


def _client_settings(ls: RestLanguageServer, settings: Any) -> Any:
    """The client's settings less those naming paths or models when it is not trusted with them (said in
    window/showMessage); the other settings apply as sent."""
    if ls.trust_client:
        return settings
    kept, withheld = withhold(settings, PATH_KEYS)
    if withheld:
        ls.show_warning(f"ignored {', '.join(sorted(withheld))} from the client: settings that name a path or a "
                        "model are taken from a TCP client only when the server is started with --trust-client "
                        "(or give them on the server's command line)")
    return kept


def did_open(ls: RestLanguageServer, params: types.DidOpenTextDocumentParams):
    if ls.indexing is not None:
        ls.indexing.buffer_changed(params.text_document.uri, params.text_document.text)


def did_change(ls: RestLanguageServer, params: types.DidChangeTextDocumentParams):
    uri = params.text_document.uri
    doc = ls.workspace.get_text_document(uri)
    if ls.indexing is not None:
        ls.indexing.buffer_changed(uri, lambda: ls.workspace.get_text_document(uri).source)
    at = _edit_end(doc, params.content_changes)
    ls.service.document_changed(uri, doc.source, *(at or (None, None)), language=doc.language_id)


def cursor(ls: RestLanguageServer, params: Any):
    """Our clients say where the cursor rests: the KV cache is warmed there before the next request."""
    params = _as_dict(params)
    uri = _as_dict(params.get("textDocument")).get("uri")
    pos = _as_dict(params.get("position"))
    if not isinstance(uri, str) or uri not in ls.workspace.text_documents or \
            not all(isinstance(pos.get(k), int) and pos.get(k) >= 0 for k in ("line", "character")):
        return  # a notification gets no error reply: a bad one is ignored
    doc = ls.workspace.get_text_document(uri)
    line, col = _to_columns(doc, types.Position(pos["line"], pos["character"]))
    ls.service.cursor_rested(uri, doc.source, line, col, language=doc.language_id)


def did_save(ls: RestLanguageServer, params: types.DidSaveTextDocumentParams):
    if ls.indexing is not None:
        ls.indexing.file_saved(params.text_document.uri)
    ls.service.document_saved(params.text_document.uri)


def did_close(ls: RestLanguageServer, params: types.DidCloseTextDocumentParams):
    ls.service.document_closed(params.text_document.uri)
    if ls.indexing is not None:
        ls.indexing.buffer_closed(params.text_document.uri)


def _completion_request(doc, params: types.InlineCompletionParams) -> CompletionRequest:
    """The service's request: code-point columns, the popup's selected item, whether the user asked."""
    line, col = _to_columns(doc, params.position)
    ctx = params.context
    selected = None
    if ctx is not None and ctx.selected_completion_info is not None:
        info = ctx.selected_completion_info
        selected = Selected(_to_columns(doc, info.range.start), _to_columns(doc, info.range.end), info.text)
    automatic = ctx is None or ctx.trigger_kind != types.InlineCompletionTriggerKind.Invoked
    return CompletionRequest(uri=doc.uri, text=doc.source, line=line, column=col, automatic=automatic,
                             selected=selected, language=doc.language_id, version=doc.version)


def _completion_list(doc, text: str, items) -> types.InlineCompletionList:
    return types.InlineCompletionList(items=[
        types.InlineCompletionItem(
            insert_text=item.text,
            range=types.Range(_from_columns(doc, text, *item.start), _from_columns(doc, text, *item.end)))
        for item in items])


async def inline_completion(ls: RestLanguageServer, params: types.InlineCompletionParams):
    uri = params.text_document.uri
    if uri not in ls.workspace.text_documents:
        raise JsonRpcInvalidParams(f"unknown document {uri}: open it with textDocument/didOpen first")
    doc = ls.workspace.get_text_document(uri)
    req = _completion_request(doc, params)
    try:
        resp = await ls.service.complete(req)
    except ServiceError as exc:
        raise _error(exc) from None
    return _completion_list(doc, req.text, resp.items)


def stats(ls: RestLanguageServer, params: Any):
    last = _as_dict(params).get("last", 20)
    last = last if isinstance(last, int) and last >= 0 else 20
    snap = ls.service.snapshot(last)
    snap["datastore"] = ls.indexing.snapshot() if ls.indexing is not None else None
    transport = getattr(ls, "transport_stats", None)
    snap["protocol"] = {**(transport.snapshot() if transport is not None else {}),
                        "error_replies": dict(ls.protocol.error_replies)}
    return snap


def rebuild_index(ls: RestLanguageServer, *args):
    """Queue a from-scratch build of every workspace folder's datastore and answer at once
    ({"folders": [...]}); the indexing thread does the work, with work-done progress, and rest/stats
    shows each folder go indexing -> ready with its new figures (`rebuilds` counts them)."""
    if ls.indexing is None:
        raise JsonRpcInvalidParams("the workspace is not initialized yet")
    if not ls.service.config.index_workspace:
        raise JsonRpcInvalidParams("workspace indexing is off (index_workspace: false)")
    return {"folders": ls.indexing.rebuild()}


async def drafts(ls: RestLanguageServer, params: Any):
    """Debug: what the datastores propose after some text ({"text": str, "max_len"?: int})."""
    if not ls.trust_client:   # it reads indexed text out of any folder the server indexed
        from pygls.exceptions import JsonRpcServerError
        raise JsonRpcServerError("rest/drafts is answered over TCP only when the server is started with "
                                 "--trust-client", NOT_ALLOWED)
    params = _as_dict(params)
    max_len = params.get("max_len", 10)
    if not isinstance(params.get("text"), str) or isinstance(max_len, bool) or \
            not isinstance(max_len, int) or not 1 <= max_len <= 64:
        raise JsonRpcInvalidParams('rest/drafts takes {"text": "<context>", "max_len"?: 1..64}')
    if ls.indexing is None:
        raise JsonRpcInvalidParams("the workspace is not initialized yet")
    try:
        return await asyncio.get_running_loop().run_in_executor(
            None, ls.indexing.drafts, params["text"], max_len)
    except RuntimeError as exc:   # no model, so no tokenizer
        raise _error(ServiceError("model_unavailable", str(exc))) from None


FEATURES = [   # (LSP method, registration options, handler)
    (types.INITIALIZE, None, initialize),
    (types.INITIALIZED, None, initialized),
    (types.SHUTDOWN, None, shutdown),
    (types.EXIT, None, exit_),
    (types.WORKSPACE_DID_CHANGE_CONFIGURATION, None, did_change_configuration),
    (types.TEXT_DOCUMENT_DID_OPEN, None, did_open),
    (types.TEXT_DOCUMENT_DID_CHANGE, None, did_change),
    (CURSOR, None, cursor),
    (types.TEXT_DOCUMENT_DID_SAVE, None, did_save),
    (types.TEXT_DOCUMENT_DID_CLOSE, None, did_close),
    (types.TEXT_DOCUMENT_INLINE_COMPLETION, types.InlineCompletionOptions(), inline_completion),
    (STATS, None, stats),
    (DRAFTS, None, drafts),
]
COMMANDS = [(REBUILD_INDEX, rebuild_index)]   # pygls answers workspace/executeCommand and advertises them


def create_server(config: ServerConfig | None = None) -> RestLanguageServer:
    """The server with every feature registered; `config` is the starting configuration (CLI flags)."""
    server = RestLanguageServer(config)
    for method, options, handler in FEATURES:
        server.feature(method, options)(handler)
    for name, handler in COMMANDS:
        server.command(name)(handler)
    return server


def close_all(ls: RestLanguageServer) -> None:
    """Stop indexing and the inference thread, saving what outlives the process (the history); safe to
    call more than once (shutdown, exit, the end of the client's stream)."""
    if ls.indexing is not None:
        ls.indexing.close()
    ls.service.close()


class _ProgressReporter:
    """Work-done progress for indexing, callable from the indexing thread."""

    def __init__(self, ls: RestLanguageServer):
        self.ls = ls
        self.supported = bool(ls.client_capabilities.window and ls.client_capabilities.window.work_done_progress)
        self._n = 0

    def _call(self, fn, *args) -> None:
        loop = self.ls.loop
        if loop is not None and loop.is_running():
            loop.call_soon_threadsafe(fn, *args)

    def begin(self, title: str, message: str = "") -> str | None:
        if not self.supported:
            return None
        self._n += 1
        token = f"rest-lsp-index-{self._n}"

        def start():
            try:
                fut = self.ls.work_done_progress.create(token)
                fut.add_done_callback(lambda f: self.ls.work_done_progress.begin(
                    token, types.WorkDoneProgressBegin(title=title, message=message, percentage=0,
                                                       cancellable=False)))
            except Exception:  # noqa: BLE001 - progress is cosmetic
                log.exception("work-done progress failed")
        self._call(start)
        return token

    def report(self, token: str | None, message: str, percentage: int | None = None) -> None:
        if token is not None:
            self._call(lambda: token in self.ls.work_done_progress.tokens and self.ls.work_done_progress.report(
                token, types.WorkDoneProgressReport(message=message, percentage=percentage)))

    def end(self, token: str | None, message: str = "") -> None:
        if token is not None:
            self._call(lambda: self.ls.work_done_progress.end(token, types.WorkDoneProgressEnd(message=message)))
