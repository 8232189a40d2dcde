"""Daemon configuration: defaults, and merging `initializationOptions` / `workspace/didChangeConfiguration`.

Clients send settings either flat or nested under a section name ("rest-lsp", "restLsp", "rest_lsp");
keys may be snake_case or camelCase. Unknown keys are reported, never silently dropped.
"""
from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field, fields
from typing import Any

from rest_lsp.model import PRECISIONS

SECTIONS = ("rest-lsp", "restLsp", "rest_lsp")

# Settings whose change means the model (and everything tokenised with it) must be reloaded.
MODEL_KEYS = frozenset({"model", "device", "precision", "server"})
# Settings that name a path or a model: what the server reads, loads or writes. Over TCP a client may be
# another local process than the user's editor, so these are taken from it only when the server was started
# with --trust-client (docs/daemon.md, "Serving over TCP").
PATH_KEYS = frozenset({"model", "cache_dir", "request_log", "corpus", "server"})


@dataclass
class ServerConfig:
    model: str | None = None            # None: the embedded Qwen2.5-Coder-0.5B; an embedded model's name
                                        # (restbase/assets.py MODELS: qwen2.5-coder-0.5b, qwen2.5-coder-1.5b);
                                        # "auto" (rest_lsp/model/choice.py); a model dir / .gguf / hub id
    device: str = "auto"                # "auto" | "cpu" | "cuda" | "cuda:N" (mps: refused at load)
    precision: str = "auto"             # "auto" | "fp32" | "int8" | "int8w" | "int4w" | "bf16" | "fp16"
    corpus: str | None = None           # a datastore built with `rest-index` (optional)
    draft_budget: int | None = None     # draft tree nodes per step; None: calibrated, 0: plain decoding
    max_tokens: int = 64                # new tokens per completion
    max_lines: int = 8                  # lines of a multi-line completion
    time_budget_ms: int = 1500          # per request, 0: none; past it the text so far is returned, cut at a line
    prompt_budget_ms: int = 1000        # an Automatic request whose prompt is not computed by then gets no
                                        # suggestion (the prompt goes on computing for the next one); 0: none
    predict_budget_ms: int = 20         # after the prompt, an Automatic request shows the complete lines or
                                        # words decided by then; 0: wait for the first line (or time_budget_ms)
                                        # (120 until 2026-12-04: a person's next key comes a median 64-78 ms
                                        # after the request; docs/results/typing.md)
    partial_words: bool = True          # that partial answer ends at a whole word; false: every token decided,
                                        # a word's start too (a 1.5B step decides one to three tokens)
    layout: str = "auto"                # prompt layout: auto | line | psm | spm (rest_lsp/service/layout.py)
    middle_lines: int = 16              # line layout: lines typed above the cursor kept in the prompt's middle,
                                        # so a new line needs no recomputation of the suffix; 0: the cursor line
    warm_up: bool = True                # extend the KV cache at the cursor while the user types
    predict_while_typing: bool = True   # ... and go on decoding there (low priority), so that the next pause
                                        # is answered with what was decoded since the key; false: prompt only
    predict_ahead: bool = True          # after a shown suggestion, predict as if it were accepted
    kv_cache_mb: int = 256              # memory for the KV caches of other documents and places (0: one cache)
    languages: list[str] | None = None  # LSP languageIds served; None: all
    exclude: list[str] = field(default_factory=list)   # gitignore-style patterns not indexed (on top of
                                        # .gitignore, .git, node_modules, venvs, build output and secrets)
    index_workspace: bool = True        # index workspace folders into a per-workspace datastore
    persist_history: bool = True        # keep the model's output (a draft source) in cache_dir across restarts
    cache_dir: str | None = None        # None: the user cache directory (platformdirs)
    request_log: str | None = None      # JSONL file, one line per request
    alternatives: int = 2               # items for an Invoked trigger (greedy + sampled); Automatic gets 1
    max_prefix_chars: int | None = None  # text before the cursor in the prompt; None: 6000 (3000 on a CPU)
    max_suffix_chars: int | None = None  # text after the cursor (fill-in-the-middle); None: 1500 (300 on a CPU)
    max_live_bytes: int = 2_000_000     # larger open buffers are not fed to the live draft shard
    queue_size: int = 8                 # pending requests (one per document at most) before the oldest is dropped
    cross_file: bool | str = "auto"     # other files of the repository before the current one in the prompt:
                                        # true, false, or "auto": while the document fits the prompt's prefix
                                        # window, or did when first seen (`cross_file_on`)
    cross_file_tokens: int | None = None  # their token budget; None: 512 on a CPU, 2048 elsewhere
    cross_file_selectors: list[str] = field(default_factory=lambda: ["definitions", "similar", "recent", "siblings"])
    server: dict | None = None          # a team server (rest-lsp team-server, docs/team.md) that decodes instead of
                                        # a local model: "http://host:8000" or {"url", "key" | "keyEnv", "model"}
                                        # (key default: $REST_LSP_TEAM_KEY); `model` still names the tokenizer


_FIELD_NAMES = {f.name for f in fields(ServerConfig)}
# Upper bounds of counts that nothing else bounds: with timeBudgetMs 0 an Invoked request samples every
# alternative to its end, so a million of them is a request that never answers; refused at the door.
MAXIMA = {"alternatives": 10}


def _snake(key: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", key).lower().replace("-", "_")


def _coerce_server(value: Any) -> dict | None:
    """The `server` setting: a URL, or {"url", "key", "keyEnv", "model"} (strings), as a dict."""
    if value is None or value == "":
        return None
    if isinstance(value, str):
        value = {"url": value}
    if not isinstance(value, dict) or not isinstance(value.get("url"), str) or not value["url"].strip():
        raise ValueError(f"server: expected a URL or {{\"url\": ..., \"key\": ...}}, got {type(value).__name__}")
    out = {}
    for k, v in value.items():
        name = _snake(str(k))
        if name not in ("url", "key", "key_env", "model"):
            raise ValueError(f"server: unknown field {k!r} (url, key, keyEnv, model)")
        if not isinstance(v, str):
            raise ValueError(f"server.{k}: expected a string")
        out[name] = v.strip()
    if not out["url"].startswith(("http://", "https://")):
        raise ValueError(f"server.url: expected http://HOST:PORT or https://..., got {out['url']!r}")
    return out


def _coerce(name: str, value: Any, current: Any) -> Any:
    """Type-check one setting against the field's default type; raise ValueError with the setting's name."""
    if name == "server":
        return _coerce_server(value)
    if name == "cross_file":
        if not isinstance(value, bool) and value != "auto":
            raise ValueError(f"cross_file: expected true, false or \"auto\", got {value!r}")
        return value
    if value is None:
        if name in {"model", "corpus", "draft_budget", "languages", "cache_dir", "request_log",
                    "max_prefix_chars", "max_suffix_chars", "cross_file_tokens"}:
            return None
        raise ValueError(f"{name}: null is not allowed")
    default = getattr(ServerConfig(), name)
    kind = type(default) if default is not None else {"draft_budget": int, "languages": list, "max_prefix_chars": int,
                                                      "max_suffix_chars": int, "cross_file_tokens": int}.get(name, str)
    if kind is bool:
        if not isinstance(value, bool):
            raise ValueError(f"{name}: expected true/false, got {value!r}")
        return value
    if kind is int:
        # is_integer() first: int() of NaN or infinity raises an error that would not name the setting
        if isinstance(value, bool) or not isinstance(value, (int, float)) or \
                (isinstance(value, float) and not value.is_integer()) or value < 0:
            raise ValueError(f"{name}: expected a non-negative integer, got {value!r}")
        if name in MAXIMA and value > MAXIMA[name]:
            raise ValueError(f"{name}: at most {MAXIMA[name]}, got {value!r}")
        return int(value)
    if kind is list:
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ValueError(f"{name}: expected a list of strings, got {value!r}")
        if name == "cross_file_selectors" and not set(value) <= set(CROSS_FILE_SELECTORS):
            raise ValueError(f"{name}: expected a list of {', '.join(CROSS_FILE_SELECTORS)}, got {value!r}")
        return list(value)
    if not isinstance(value, str):
        raise ValueError(f"{name}: expected a string, got {value!r}")
    if name == "precision" and value not in PRECISIONS:
        raise ValueError(f"precision: expected {'|'.join(PRECISIONS)}, got {value!r}")
    if name == "layout" and value not in {"auto", "line", "psm", "spm"}:
        raise ValueError(f"layout: expected auto|line|psm|spm, got {value!r}")
    return value


# Prompt windows by device. In fill-in-the-middle order (prefix, suffix, middle) a keystroke at the cursor
# invalidates the KV cache of everything after it, so every request re-computes the suffix window: on a
# small CPU (about 30 ms per prompt token for the 0.5B model, measured on 2 cores) 1,500 characters (~400
# tokens) would cost ~12 s per request, 300 characters ~2 s. The prefix is reused between requests.
WINDOWS = {"cpu": (3000, 300), "other": (6000, 1500)}


# The cross-file block's token budget by device: computed once per block in the background, but every
# decoding step attends over it and the block is computed again whenever it changes (docs/crossfile.md).
CROSS_FILE_TOKENS = {"cpu": 512, "other": 2048}
CROSS_FILE_SELECTORS = ("definitions", "similar", "recent", "siblings")


AUTO_BACK_UNDER = 0.9  # "auto": a document past the prefix window when first seen gets a block under 90% of it


def cross_file_on(config: "ServerConfig", device_type: str, document_chars: int, was_long: bool = False,
                  born_short: bool = False) -> bool:
    """Whether a document's prompts start with other files' code. "auto": while the whole document fits the
    prompt's prefix window - a new or short file, where the window has room and other files' code measured
    better for a person typing (a new module among its siblings: +7.6% characters accepted); a longer file's
    window already holds what its lines need, and there the block measured level or worse
    (docs/results/crossfile.md, 2026-12-04). A document that fitted the window when the daemon first saw it
    (`born_short`: a new module being written) keeps its block as it grows past the window: there it measured
    +2.5% (2026-12-05), and dropping it costs the whole prompt. Each switch costs the whole prompt on a
    keystroke's path, so a document that was past the window (`was_long`) gets its block back only well under
    it: editing around the limit does not switch at every line."""
    if config.cross_file == "auto":
        return born_short or fits_prefix_window(config, device_type, document_chars,
                                                AUTO_BACK_UNDER if was_long else 1.0)
    return bool(config.cross_file)


def fits_prefix_window(config: "ServerConfig", device_type: str, document_chars: int, share: float = 1.0) -> bool:
    """Whether a whole document fits `share` of the prompt's prefix window on this device."""
    return document_chars <= prompt_windows(config, device_type)[0] * share


def cross_file_budget(config: "ServerConfig", device_type: str) -> int:
    """Tokens of other files the prompt may hold (0: none)."""
    if not config.cross_file:
        return 0
    if config.cross_file_tokens is not None:
        return config.cross_file_tokens
    return CROSS_FILE_TOKENS["cpu" if device_type == "cpu" else "other"]


def prompt_windows(config: "ServerConfig", device_type: str) -> tuple[int, int]:
    """(max_prefix_chars, max_suffix_chars) in effect on this device."""
    pre, suf = WINDOWS["cpu" if device_type == "cpu" else "other"]
    return (config.max_prefix_chars if config.max_prefix_chars is not None else pre,
            config.max_suffix_chars if config.max_suffix_chars is not None else suf)


@dataclass(frozen=True)
class ModelLimits:
    """What a loaded model allows the settings (a backend's `limits()`)."""
    context: int | None          # positions the engine holds: prompt + completion + one draft tree
    tree_reserve: int = 0        # positions the engine keeps free for the last step's draft tree
    fim: bool = True             # the model has a fill-in-the-middle prompt format
    exact_trees: bool = True     # its verifier gave a row the same bits alone and in a tree (checked at load)
    trees_reason: str | None = None  # what that check found where it did not


MIN_PROMPT_TOKENS = 256      # the least prompt a completion is worth making from
CHARS_PER_TOKEN = 8          # more characters per token than code ever has: windows beyond this cannot fit


def check_against_model(config: ServerConfig, limits: ModelLimits) -> tuple[ServerConfig, list[str]]:
    """The settings a model can serve, and what was changed or will not apply. A completion longer than the
    context window less a prompt (maxTokens) is cut to what fits, instead of every request failing."""
    problems: list[str] = []
    updates: dict[str, Any] = {}
    if limits.context:
        most = max(1, limits.context - limits.tree_reserve - MIN_PROMPT_TOKENS)
        if config.max_tokens > most:
            updates["max_tokens"] = most
            problems.append(f"maxTokens {config.max_tokens} does not fit the model's {limits.context}-token context "
                            f"with a prompt of at least {MIN_PROMPT_TOKENS} tokens; using {most}")
        for name in ("max_prefix_chars", "max_suffix_chars"):
            v = getattr(config, name)
            if v is not None and v > limits.context * CHARS_PER_TOKEN:
                problems.append(f"{_camel(name)} {v} is more than the model's {limits.context}-token context can "
                                "hold; prompts are cut to fit it")
    if not limits.exact_trees and config.draft_budget != 0:
        why = (f"draft trees are not exact here ({limits.trees_reason})" if limits.trees_reason else
               "this model's verifier computes a row with other rounding alone than among others")
        if config.draft_budget is None:
            problems.append(f"{why}: it decodes plainly, without drafts, to keep the output exact (a draftBudget "
                            "speculates anyway, and can then differ from plain decoding where two tokens nearly tie; "
                            "fp32 Qwen2/Qwen3/Llama/Mistral/StarCoder2 models run the exact fast path)")
        else:
            problems.append(f"{why}: with draftBudget {config.draft_budget}, REST's output can differ from plain "
                            "decoding where two tokens nearly tie (draftBudget 0, or unset, decodes plainly)")
    if not limits.fim and config.max_suffix_chars:
        problems.append("the model has no fill-in-the-middle format: maxSuffixChars does not apply (the prompt is "
                        "the text before the cursor)")
    return (dataclasses.replace(config, **updates) if updates else config), problems


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(w.title() for w in rest)


def unwrap_settings(settings: Any) -> dict:
    """The rest-lsp part of a settings object (flat, or under one of SECTIONS)."""
    if not isinstance(settings, dict):
        return {}
    for section in SECTIONS:
        if isinstance(settings.get(section), dict):
            return settings[section]
    return settings


def withhold(settings: Any, names: frozenset[str]) -> tuple[Any, list[str]]:
    """`settings` without the keys that are `names` once spelt snake_case, in the same shape (flat or under
    its section), and those keys as the client spelt them."""
    inner = unwrap_settings(settings)
    dropped = [str(k) for k in inner if _snake(str(k)) in names]
    if not dropped:
        return settings, []
    kept = {k: v for k, v in inner.items() if str(k) not in dropped}
    if inner is settings:
        return kept, dropped
    section = next(s for s in SECTIONS if settings.get(s) is inner)
    return {**settings, section: kept}, dropped


def merge(config: ServerConfig, settings: Any) -> tuple[ServerConfig, set[str], list[str]]:
    """Apply settings over config. Returns (new config, names of changed fields, problems)."""
    updates: dict[str, Any] = {}
    problems: list[str] = []
    for key, value in unwrap_settings(settings).items():
        name = _snake(str(key))
        if name not in _FIELD_NAMES:
            problems.append(f"unknown setting {key!r}")
            continue
        try:
            updates[name] = _coerce(name, value, getattr(config, name))
        except ValueError as exc:
            problems.append(str(exc))
    changed = {k for k, v in updates.items() if getattr(config, k) != v}
    return dataclasses.replace(config, **updates), changed, problems


def describe() -> list[tuple[str, Any]]:
    """(name, default) for the documentation and `rest/stats`."""
    return [(f.name, getattr(ServerConfig(), f.name)) for f in fields(ServerConfig)]
