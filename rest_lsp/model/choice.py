"""`model: auto`: the largest embedded model whose measured costs keep a suggestion on screen in a typing pause.

The rule, from the typing benchmark's rhythm (benchmarks/bench_typing.py): a request goes out 150 ms after the
last key, and a person pauses 300-700 ms after a newline and after one space or bracket in four. A suggestion
is on screen in a pause when it is there before the median such pause (500 ms) ends: within PAUSE_BUDGET_MS =
350 ms of the request. What the daemon computes in that time, the rest of the prompt having been computed
while the person typed (warm-ups): one forward of the last key's new tokens (KEY_TOKENS; on a CPU a forward of
a few rows costs about one step, docs/cpu.md) and the steps of a first line, PAUSE_STEPS = 5 (10 tokens at
REST's 2 tokens a step, README). So a model fits when

    max(step_ms, KEY_TOKENS * prompt_ms_per_token) + PAUSE_STEPS * step_ms <= PAUSE_BUDGET_MS

with its figures at the precision it runs at, and `auto` takes the largest embedded model (restbase/assets.py
MODELS) that fits; the default, smallest one where none larger does (nothing smaller exists to fall back to).

The figures are precision auto's own measurement of that model on this machine (rest_lsp/model/precision.py:
interleaved rounds, a noisy measurement cached as provisional, live steps held to it, cached per model, CPU,
thread count and torch version), so the choice inherits its defences: a larger model whose entry is
provisional (its rounds disagreed) or stale (the daemon's live steps contradicted it) is not chosen until it is
measured again. The choice itself is not stored: it is derived at each start from those cached entries.

It never fetches: a larger model is a candidate only once it is in the cache (fetched and converted by a run
that named it, `--model qwen2.5-coder-1.5b`); one there but not measured, or whose measurement is provisional
or stale, is measured by the daemon when idle (`pending`), and the choice applies from the next start. So a
fresh machine's first start runs the default model at once, as without `auto`. Measured on the CPU only: on
another device `auto` is the default model (nothing measures a GPU's steps here).
"""
from __future__ import annotations

import logging
from collections.abc import Generator
from dataclasses import dataclass
from pathlib import Path

from restbase import assets

log = logging.getLogger(__name__)

PAUSE_MS = 500.0        # the median of bench_typing.py's 300-700 ms pauses after a newline, a space, a bracket
DEBOUNCE_MS = 150.0     # bench_typing.py DEBOUNCE_S: the request leaves this long after the key
PAUSE_BUDGET_MS = PAUSE_MS - DEBOUNCE_MS
KEY_TOKENS = 4          # a key's new prompt tokens: the word being typed, re-tokenized
PAUSE_STEPS = 5         # a first line of about 10 tokens at 2 tokens a step


@dataclass(frozen=True)
class Candidate:
    """An embedded model as the rule sees it: in the cache (usable without a fetch and a conversion) or not,
    and precision auto's cached entry for it on this machine (None: never measured)."""

    name: str
    cached: bool
    entry: dict | None


def pause_ms(figures: dict) -> float:
    """What answering a pause costs a model with these figures (a precision's entry: step and prompt costs)."""
    step = figures["step_ms"]
    return round(max(step, KEY_TOKENS * figures["prompt_ms_per_token"]) + PAUSE_STEPS * step, 1)


def figures_in_use(entry: dict | None, precision: str) -> tuple[str, dict] | None:
    """(precision, figures) the model would run at: the entry's choice under `precision: auto`, else the
    precision set, where the entry measured it."""
    if not entry:
        return None
    name = entry.get("choice") if precision == "auto" else precision
    figures = entry.get(name)
    if not isinstance(figures, dict) or "step_ms" not in figures or "prompt_ms_per_token" not in figures:
        return None
    return name, figures


def _distrust(entry: dict) -> str | None:
    """Why a measurement cannot decide yet, or None (precision.needs_measuring, in words)."""
    if entry.get("stale"):
        return f"its measurement was contradicted by live steps ({entry['stale'].get('reason', 'stale')})"
    if entry.get("provisional"):
        return "its measurement was noisy (rounds disagreed: provisional)"
    return None


def decide(candidates: list[Candidate], precision: str = "auto") -> dict:
    """The rule over the embedded models, smallest first (the first is the default): {"choice", "reason",
    "pending" (the larger cached model to measure when idle, or None), "budget_ms", "models" (per model: its
    state and, where measured, its pause cost)}."""
    default = candidates[0].name
    models: dict[str, dict] = {}
    choice, reason, pending = default, None, None
    for c in candidates:
        info: dict = {"cached": c.cached}
        used = figures_in_use(c.entry, precision)
        if used is not None:
            info.update(precision=used[0], step_ms=used[1]["step_ms"], pause_ms=pause_ms(used[1]))
        models[c.name] = info
    for c in reversed(candidates[1:]):   # the largest first; so `pending` is only ever larger than the choice
        info = models[c.name]
        if not c.cached:
            info["state"] = "not in the cache (fetched by a run that names it)"
            continue
        distrust = _distrust(c.entry) if c.entry else "not measured on this machine yet"
        if distrust is None and "pause_ms" not in info:
            distrust = f"no {precision} figures in its measurement"
        if distrust is not None:
            info["state"] = distrust
            pending = pending or c.name
            continue
        fits = info["pause_ms"] <= PAUSE_BUDGET_MS
        info["state"] = "fits" if fits else "too slow"
        if fits:
            choice = c.name
            reason = (f"{c.name} answers a typing pause in {info['pause_ms']} ms at {info['precision']} "
                      f"({info['step_ms']} ms a step), within the {PAUSE_BUDGET_MS:.0f} ms budget")
            break
    if reason is None:
        larger = [f"{n}: {models[n]['state']}" + (f" ({models[n]['pause_ms']} ms a pause)"
                                                   if models[n].get("state") == "too slow" else "")
                  for n in reversed([c.name for c in candidates[1:]])]
        reason = (f"{default} (the default): no larger embedded model is measured to fit a {PAUSE_BUDGET_MS:.0f} ms "
                  f"typing pause here" + (f" ({'; '.join(larger)})" if larger else ""))
        if "pause_ms" in models[default]:
            reason += f"; {default} itself takes {models[default]['pause_ms']} ms"
    return {"setting": "auto", "choice": choice, "reason": reason, "pending": pending,
            "budget_ms": PAUSE_BUDGET_MS, "rule": f"max(step, {KEY_TOKENS} prompt tokens) + {PAUSE_STEPS} steps "
            f"<= {PAUSE_BUDGET_MS:.0f} ms", "models": models}


def is_converted(name: str) -> bool:
    """The model's safetensors copy is in the cache: loading it costs seconds, not a fetch and a conversion."""
    return (assets.converted_dir(name) / "config.json").is_file()


def gather() -> list[Candidate]:
    """Every embedded model as a Candidate, from the cache as it is on this machine (nothing is fetched)."""
    from . import precision as prec

    return [Candidate(m.name, cached=is_converted(m.name), entry=prec.read_cached(prec.cache_file(m.title)))
            for m in assets.MODELS.values()]


def resolve(device_type: str = "cpu", precision: str = "auto") -> dict:
    """`model: auto` on this machine: decide() over the cache's measurements, logged with its reason."""
    default = assets.DEFAULT_MODEL
    if device_type != "cpu":
        data = {"setting": "auto", "choice": default, "pending": None, "models": {},
                "reason": f"{default} (the default): model auto measures CPU steps only, not {device_type}"}
    else:
        data = decide(gather(), precision)
    log.info("model auto: %s (%s)%s", data["choice"], data["reason"],
             f"; {data['pending']} is measured when the daemon is idle" if data.get("pending") else "")
    return data


def fp32_bytes(name: str) -> int:
    """The fp32 size of a converted embedded model (its safetensors files on disk): what measuring it loads."""
    return sum(p.stat().st_size for p in Path(assets.converted_dir(name)).glob("*.safetensors"))


def measure(name: str, precision: str = "auto", *, load=None, timer=None) -> Generator[None, None, dict]:
    """Precision auto's measurement of the embedded model `name` on this CPU (loaded again in fp32), cached
    as precision auto caches it, one forward per step (the daemon runs it when idle); returns the choice
    decided again with it (which a daemon applies from its next start). load: a stand-in for load_model
    (tests); timer: precision's round_timer or a stand-in."""
    from .host import load_model
    from .precision import cache_file, measure_and_store, read_cached

    loaded = (load or load_model)(name, device="cpu", precision="fp32")
    yield
    data = yield from measure_and_store(loaded, timer=timer, previous=read_cached(cache_file(loaded.name)))
    del loaded
    after = resolve("cpu", precision)
    after["measured"] = {"model": name, "precision": data["choice"], "provisional": data["provisional"],
                         "step_ms": {k: v["step_ms"] for k, v in data.items() if isinstance(v, dict) and "step_ms" in v}}
    return after
