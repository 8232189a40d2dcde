"""The fastest exact precision this CPU offers, measured, not assumed.

On a CPU with native bf16 dot products (AVX512-BF16, AMX) a bf16 forward can cost far less than an fp32 one,
on one without them far more; the 2-core EPYC the project is developed on measured a prompt token at
2.5-2.9 ms in bf16 against 4.1-4.7 ms in fp32 and a decoding step at 50-60 ms against 76 ms (docs/cpu.md).
So `precision: auto` on a CPU times both, once per model, CPU and torch version (cached in the user cache),
on what a completion costs: a 64-token prompt chunk and a few one-token steps through the verifier the daemon
uses, and keeps the cheaper one. Greedy output stays exact at the precision chosen: REST decoding emits what
plain greedy decoding at that precision emits.

Per-row int8 (rest_lsp/model/int8row.py) is cheaper still on such a CPU, but it is a coarser model: W8A8 can
cost completion quality where activations have outliers. So int8 joins the timing only for a model whose
first-line exact match (benchmarks/bench_layout.py) was measured within INT8_MAX_LOSS points of bf16's on the
same cases (INT8_QUALITY); elsewhere it stays opt-in (`precision: int8`). Weight-only int8 with bf16 products
(rest_lsp/model/int8weight.py, `int8w`) keeps fp32 activations and loses less; it joins the timing for a model
whose first-line exact match was measured within INT8_MAX_LOSS points of fp32's (INT8W_QUALITY) on a CPU where
its kernel is batch-invariant. The GGUF's own 4-bit blocks (rest_lsp/model/int4weight.py, `int4w`) join it the
same way (INT4W_QUALITY, against fp32). Figures: docs/cpu.md.

A first start often shares the CPU (a download, the editor, the indexer), and a figure taken under load is
cached for every later start. So the candidates are timed in interleaved rounds (ABC CBA ABC: a burst of load
or a drift in clock speed falls on all of them, not on one), each candidate's figure is the median over the
rounds, and a measurement whose rounds disagree (a candidate's per-round figures spread more than MAX_SPREAD)
is taken again, up to MAX_ATTEMPTS times; one still noisy is used for this start but cached as provisional, so
the next start measures again. The daemon also compares its live decoding steps with the cached figure
(`LiveCheck`): a clear disagreement marks the cache stale and the daemon measures again when idle.
"""
from __future__ import annotations

import copy
import dataclasses
import json
import logging
import os
import platform
import statistics
import time
from collections import deque
from collections.abc import Callable, Generator, Sequence
from pathlib import Path

import torch

from rest_lsp.filenames import safe_filename
from restbase.storage import write_bytes_atomic

log = logging.getLogger(__name__)

PROMPT_CHUNK = 64  # the warm-up chunk: what typing costs
STEPS = 6  # one-token steps timed by time_forwards (the median counts)
# the cost a completion pays: a prompt chunk plus this many decoding steps (a short suggestion)
STEPS_PER_COMPLETION = 8
# 2: an "int8" entry and choice (INT8_QUALITY); 3: "int8w" (INT8W_QUALITY); 4: interleaved rounds, settled or
# provisional (a version-3 figure may have been taken under load: measured again); 5: the prompt chunk sent as
# the engine's prefill sends it (`prompt=True`: attention in the model's dtype where trees attend in float64);
# 6: after MEASURE_CONTEXT cached tokens, not 300
MEASURE_VERSION = 6
# cached tokens before the timed chunk and steps: what a typing prompt holds (3,000 characters before the cursor,
# about 900 tokens, and the cross-file block). A step's cost grows with it, and not alike for every precision:
# the 1.5B at int4w through torch's kernel (a Zen4 EPYC) 66.6 ms after 300 tokens, 82.5 after 1,200, 99.0
# after 2,000, the 0.5B at bf16 53.8 / 56.4 / 52.9; the 1.5B's live steps read 1.5x its 300-token figure
MEASURE_CONTEXT = 1024

ROUNDS = 3  # interleaved rounds per measurement (ABC CBA ABC)
ROUND_STEPS = 3  # one-token steps per candidate per round (their median is the round's step figure)
# a candidate's rounds agree when the largest per-round figure is within this ratio of the smallest (or within
# ABS_SLACK_MS of it: a ms of timer and scheduler jitter is no disagreement for a tiny model)
MAX_SPREAD = 1.3
ABS_SLACK_MS = 2.0
MAX_ATTEMPTS = 3  # measurements per start before the choice is used as provisional
# starts in a row whose measurement stayed noisy before the choice is cached as settled anyway (marked "noisy"):
# a machine that is never quiet must not pay the measurement on every start; the live check still applies
MAX_PROVISIONAL = 3

# The live check (LiveCheck): decoding steps of at most LIVE_MAX_DRAFT draft nodes, each brought to one row's
# cost through the engine's calibrated c(q), and their median over LIVE_WINDOW steps compared with the cached
# step figure of the precision in use. Not every CPU path has c(4) near c(1): the packed verifiers do (docs/cpu.md),
# int4w through torch's kernel on a Zen4 EPYC without AMX had c(4) = 1.47 c(1), so raw live steps read 1.56-2.11x
# the 1-row figure and re-measured the 1.5B's precision during typing (docs/results/typing.md, 2026-12-04).
LIVE_WINDOW = 50
LIVE_MAX_DRAFT = 3
LIVE_SLOWER = 1.5  # live steps this much slower than measured: the measurement does not hold now
# live steps this much faster than measured: the measurement was taken under load (the case that cached fp32 at
# 97.6 ms a step on a machine where it runs at 66 ms, and bf16 at 43.5 ms, docs/cpu.md)
LIVE_FASTER = 1.3
# another candidate whose measured completion (a prompt chunk and STEPS_PER_COMPLETION steps, what the choice
# compares) costs this much less than the one in use at its live steps would clearly beat it
LIVE_BEATEN = 1.3
# live-triggered measurements that kept the choice before a disagreement is only reported: a model whose live
# steps differ from the measured ones for a lasting reason (long prompts) must not be measured every start
MAX_LIVE_REMEASURES = 2

# first-line exact match, int8 minus bf16, in points (benchmarks/bench_layout.py --layouts line@body, the same
# cases; docs/cpu.md), per model name. A model missing here is not a candidate: its loss is unknown.
INT8_QUALITY: dict[str, float] = {
    "Qwen2.5-Coder-0.5B-Instruct": -2.5,  # 85 vs 91 of 240 boltons lines (2026-11-30): opt-in only
}
INT8_MAX_LOSS = 2.0  # points of first-line exact match int8 may lose against bf16 and still be chosen
# the same for weight-only int8 (int8w), against fp32 on the same cases
# A single measurement, not a bound: one run of 240 boltons lines on one AVX-512 Xeon (2026-12-02), which
# `auto` applies as it stands on every CPU (nothing measures the quality again per model or per CPU).
INT8W_QUALITY: dict[str, float] = {
    "Qwen2.5-Coder-0.5B-Instruct": -0.8,  # 89 vs 91 of 240 boltons lines (2026-12-02, AVX-512 Xeon)
}
# the same for the GGUF's own 4-bit blocks (int4w), against fp32 on the same cases. The 0.5B's GGUF holds 12 of
# its 169 projections as Q4_K (the rest Q5_0, Q6_K, Q8_0: int8w there), so int4w is the 1.5B's ...
INT4W_QUALITY: dict[str, float] = {
    "Qwen2.5-Coder-1.5B-Instruct": +1.2,  # 116 vs 113 of 240 boltons lines (2026-12-03, 2-core Zen 5 EPYC)
}
# ... except where gguf_amx.py's kernel runs (int4weight.kernel_name() "amx-..." or "avx512-..."): there every
# layer of both models is its GGUF's own blocks (Q4_K, Q6_K, Q5_0, Q8_0), so int4w is a candidate for the 0.5B
# too. The AVX-512 build multiplies the same weights, its sums rounded otherwise: measured again with it
INT4W_AMX_QUALITY: dict[str, float] = {
    "Qwen2.5-Coder-0.5B-Instruct": +0.8,  # 93 vs 91 of 240 boltons lines (2026-12-03, 2-core Xeon with AMX; the
    # same 93 vs 91 with the AVX-512 build on a 2-core Zen4 EPYC, 2026-12-06: 8 lines differ, 2 exact only in int4w)
}
# ... and where the VNNI build runs (int4weight.kernel_name() "vnni-...", gguf_amx.variant()): every format
# multiplies int8 activations (a scale per 32 inputs), other numerics than the bf16 builds', so only these apply
INT4W_VNNI_QUALITY: dict[str, float] = {
    "Qwen2.5-Coder-0.5B-Instruct": +0.4,  # 92 vs 91 of 240 boltons lines (2026-12-07, 2-core Zen4 EPYC; 92 again
    # with its Q5_0 and Q8_0 layers on int8 activations too, 7 lines' text changed, none's exactness)
    "Qwen2.5-Coder-1.5B-Instruct": -0.8,  # 111 vs 113 (fp32 of 2026-12-03) of 240 boltons lines (2026-12-07, the same)
}
# ... and where the AVX2 build computes a model's prompt chunks too, that model's own figure:
# int4weight.INT4W_AVX2_QUALITY (int4weight.prompts_on_kernel; host.quantize reads it there, below this module)


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _cache_path(model_name: str, names: Sequence[str] = ()) -> Path:
    from rest_lsp.engine.cost import cache_dir

    # the quantized candidates in the key: a model that becomes one (INT8_QUALITY, INT8W_QUALITY,
    # INT4W_QUALITY) is measured again
    key = f"{model_name}-{cpu_name()}-t{torch.get_num_threads()}-torch{torch.__version__}-v{MEASURE_VERSION}" \
        + "".join(f"-{n}" for n in QUANTIZED if n in names)
    if "int4w" in names:  # its product is compiled here or torch's (int4weight.kernel_name): each its own figures
        from .int4weight import kernel_name, prompts_on_kernel

        key += f"-{kernel_name()}" + ("-prompts" if prompts_on_kernel(model_name) else "")  # prompt chunks' cost
    return cache_dir() / f"precision-{safe_filename(key)}.json"


def forward_timer(verifier, vocab_size: int) -> Callable[..., float]:
    """forward(q, rows=None): ms of one forward of q random tokens (a chain) through `verifier`, appended to its
    cache; with `rows` (the rows whose logits a prefill needs) it is a prompt chunk, as the engine's prefill
    sends it (`prompt=True`). The tokens come from a fixed seed, so every candidate times the same inputs."""
    from rest_lsp.engine.verifier import chain_mask

    g = torch.Generator().manual_seed(0)

    def forward(q: int, rows=None) -> float:
        t = time.perf_counter()
        verifier.forward(torch.randint(0, vocab_size, (q,), generator=g), torch.arange(q), chain_mask(q), rows=rows,
                         prompt=rows is not None)
        return (time.perf_counter() - t) * 1000

    return forward


def measure_context(verifier) -> int:
    """MEASURE_CONTEXT, or less where the verifier's cache holds less (a tiny test model)."""
    room = getattr(verifier, "max_len", None)
    return MEASURE_CONTEXT if room is None else max(1, min(MEASURE_CONTEXT, room - 2 * PROMPT_CHUNK))


def time_forwards(verifier, vocab_size: int) -> dict:
    """ms of one 64-token prompt chunk after MEASURE_CONTEXT cached tokens, and of one-token steps (median)."""
    forward, past = forward_timer(verifier, vocab_size), measure_context(verifier)

    verifier.truncate(0)
    forward(past, rows=[past - 1])
    forward(1)  # first-call overheads
    chunk = min(forward(PROMPT_CHUNK, rows=[PROMPT_CHUNK - 1]) for _ in range(2))
    verifier.truncate(past)
    steps = sorted(forward(1) for _ in range(STEPS))
    verifier.truncate(0)
    return {"prompt_chunk_ms": round(chunk, 1), "prompt_ms_per_token": round(chunk / PROMPT_CHUNK, 2),
            "step_ms": round(steps[len(steps) // 2], 1)}


def completion_ms(m: dict) -> float:
    return m["prompt_chunk_ms"] + STEPS_PER_COMPLETION * m["step_ms"]


def int8_candidate(model_name: str) -> bool:
    """int8 may be chosen for this model: its measured quality loss against bf16 is within INT8_MAX_LOSS."""
    from .int8row import int_mm_exact

    loss = INT8_QUALITY.get(model_name)
    return loss is not None and loss >= -INT8_MAX_LOSS and int_mm_exact()


def int8w_candidate(model_name: str) -> bool:
    """int8w may be chosen for this model: its measured quality loss against fp32 is within INT8_MAX_LOSS, and
    its kernel is batch-invariant on this CPU."""
    from .int8weight import weight_int8_exact

    loss = INT8W_QUALITY.get(model_name)
    return loss is not None and loss >= -INT8_MAX_LOSS and weight_int8_exact()


def int4w_candidate(model_name: str) -> bool:
    """int4w may be chosen for this model: its measured quality loss against fp32 is within INT8_MAX_LOSS, and
    the 4-bit kernel is batch-invariant on this CPU (the model's GGUF is read when it is converted)."""
    from . import gguf_amx
    from .int4weight import INT4W_AVX2_QUALITY, kernel_name, prompts_on_kernel, weight_int4_exact

    if all(model_name not in figures
           for figures in (INT4W_QUALITY, INT4W_AMX_QUALITY, INT4W_VNNI_QUALITY, INT4W_AVX2_QUALITY)):
        return False  # no figure under any build: nothing to compile (kernel_name builds this CPU's kernel)
    name = kernel_name()
    if prompts_on_kernel(model_name):
        loss = INT4W_AVX2_QUALITY.get(model_name)
    elif name.startswith(gguf_amx.INT8_ACTIVATIONS):  # other numerics (the avx2 build's are vnni's): their own figures
        loss = INT4W_VNNI_QUALITY.get(model_name)
    else:
        loss = INT4W_QUALITY.get(model_name)
        if loss is None and model_name in INT4W_AMX_QUALITY and name.startswith(("amx", "avx512")):
            loss = INT4W_AMX_QUALITY[model_name]
    return loss is not None and loss >= -INT8_MAX_LOSS and weight_int4_exact()


Timer = Callable[[str, object, int], Callable[[], dict]]
MEASURED = ("fp32", "bf16", "int8", "int8w", "int4w")  # the figures a cache entry may hold, one per candidate
QUANTIZED = ("int8", "int8w", "int4w")


def round_timer(name: str, verifier, vocab_size: int) -> Callable[[], dict]:
    """Prepares `verifier` (MEASURE_CONTEXT cached tokens; the first calls of both shapes paid) and returns one
    round's timing of it: {"prompt_chunk_ms": a 64-token chunk after those tokens, "step_ms": the median of
    ROUND_STEPS one-token steps}. `name` is the candidate's, for a timer standing in for this one (tests)."""
    forward, past = forward_timer(verifier, vocab_size), measure_context(verifier)

    verifier.truncate(0)
    forward(past, rows=[past - 1])
    forward(PROMPT_CHUNK, rows=[PROMPT_CHUNK - 1])  # a shape's first call pays one-time overheads
    verifier.truncate(past)
    forward(1)

    def one_round() -> dict:
        verifier.truncate(past)
        chunk = forward(PROMPT_CHUNK, rows=[PROMPT_CHUNK - 1])
        verifier.truncate(past)
        steps = sorted(forward(1) for _ in range(ROUND_STEPS))
        return {"prompt_chunk_ms": chunk, "step_ms": steps[len(steps) // 2]}

    return one_round


def _agree(xs: Sequence[float]) -> bool:
    lo, hi = min(xs), max(xs)
    return hi <= lo * MAX_SPREAD or hi - lo <= ABS_SLACK_MS


def judge(rounds: dict[str, list[dict]]) -> tuple[dict[str, dict], list[str]]:
    """Per candidate its figures over its rounds (the median of each), and the candidates whose rounds disagree
    with each other (MAX_SPREAD)."""
    figures: dict[str, dict] = {}
    noisy: list[str] = []
    for name, rs in rounds.items():
        chunks, steps = [r["prompt_chunk_ms"] for r in rs], [r["step_ms"] for r in rs]
        chunk, step = statistics.median(chunks), statistics.median(steps)
        figures[name] = {"prompt_chunk_ms": round(chunk, 1), "prompt_ms_per_token": round(chunk / PROMPT_CHUNK, 2),
                         "step_ms": round(step, 1), "rounds_step_ms": [round(x, 1) for x in steps],
                         "rounds_chunk_ms": [round(x, 1) for x in chunks]}
        if not (_agree(chunks) and _agree(steps)):
            noisy.append(name)
    return figures, noisy


def candidates(model_name: str) -> list[str]:
    """The precisions `auto` times for this model on this CPU, fp32 first (it wins ties)."""
    from .probes import cpu_has_bf16

    return ["fp32"] + [name for name, ok in (("bf16", cpu_has_bf16()), ("int8", int8_candidate(model_name)),
                                             ("int8w", int8w_candidate(model_name)),
                                             ("int4w", int4w_candidate(model_name))) if ok]


def cache_file(model_name: str) -> Path:
    return _cache_path(model_name, candidates(model_name))


def read_cached(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text())
        return data if isinstance(data, dict) and data.get("choice") else None
    except (OSError, ValueError):
        return None


def needs_measuring(data: dict | None) -> bool:
    """No figures, figures from a noisy start (provisional), or figures the live steps disagreed with (stale)."""
    return data is None or bool(data.get("provisional")) or bool(data.get("stale"))


def _mem_available() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _fits_at_once(loaded_fp32, names: Sequence[str]) -> bool:
    """Whether every candidate's copy and prepacked weights fit in memory together (interleaving needs them
    all alive); bounded by fp32 sizes: the fp32 model's packing, and a copy plus its packing per other one."""
    fp32_bytes = sum(p.numel() for p in loaded_fp32.model.parameters()) * 4
    avail = _mem_available()
    return avail is None or fp32_bytes * (1 + 2 * (len(names) - 1)) <= 0.7 * avail


def _candidate(loaded_fp32, name: str, timer: Timer) -> Callable[[], dict]:
    from .verifiers import make_verifier_or_eager

    model = loaded_fp32 if name == "fp32" else _convert(copy.deepcopy(loaded_fp32.model), name,
                                                                  getattr(loaded_fp32, "gguf", None), loaded_fp32.name)
    return timer(name, make_verifier_or_eager(model, "auto", max_len=MEASURE_CONTEXT + 2 * PROMPT_CHUNK),
                 loaded_fp32.vocab_size)


def measure(loaded_fp32, names: Sequence[str], *, timer: Timer | None = None) -> Generator[None, None, dict]:
    """Times the candidates `names` in interleaved rounds, yielding between forwards (the daemon runs it between
    its jobs); returns {"choice", "settled" (the rounds agreed), "attempts", "noisy" (the candidates whose
    rounds disagreed in the last attempt), "interleaved", and per candidate its figures}. timer: round_timer
    or a stand-in (tests)."""
    timer = timer or round_timer
    names = list(names)
    interleaved = _fits_at_once(loaded_fp32, names)
    timers: dict[str, Callable[[], dict]] = {}
    if interleaved:
        for name in names:
            timers[name] = _candidate(loaded_fp32, name, timer)
            yield
    pooled: dict[str, list[dict]] = {name: [] for name in names}
    attempt, noisy = 0, list(names)
    while noisy and attempt < MAX_ATTEMPTS:
        attempt += 1
        got: dict[str, list[dict]] = {name: [] for name in names}
        if interleaved:
            for r in range(ROUNDS):
                for name in names if r % 2 == 0 else names[::-1]:  # a drift weighs on all candidates alike
                    got[name].append(timers[name]())
                    yield
        else:  # one after another: only a candidate's own rounds can disagree
            for name in names:
                one = _candidate(loaded_fp32, name, timer)
                yield
                for _ in range(ROUNDS):
                    got[name].append(one())
                    yield
                del one
        figures, noisy = judge(got)
        for name in names:
            pooled[name] += got[name]
        if noisy:
            log.info("precision auto: rounds disagree for %s (%s); %s", ", ".join(noisy),
                     {n: {"step_ms": figures[n]["rounds_step_ms"], "chunk_ms": figures[n]["rounds_chunk_ms"]}
                      for n in noisy},
                     "measuring again" if attempt < MAX_ATTEMPTS else "keeping the best seen, provisionally")
    timers.clear()
    if noisy:  # the best seen over every round of this start
        figures, _ = judge(pooled)
    choice = min(names, key=lambda name: completion_ms(figures[name]))  # ties: the first (fp32, then bf16)
    return {"choice": choice, "settled": not noisy, "attempts": attempt, "noisy": noisy,
            "interleaved": interleaved, **figures}


def measure_and_store(loaded_fp32, *, timer: Timer | None = None,
                      previous: dict | None = None) -> Generator[None, None, dict]:
    """measure, then cache the result: settled when the rounds agreed, else provisional (the next start measures
    again) unless MAX_PROVISIONAL starts in a row were noisy. previous: the cached entry this replaces."""
    name = loaded_fp32.name
    names = candidates(name)
    path = _cache_path(name, names)  # the file every start reads (cache_file), whatever this load can convert to
    if getattr(loaded_fp32, "gguf", None) is None and "int4w" in names:  # a model named by its converted directory
        names.remove("int4w")
    result = yield from measure(loaded_fp32, names, timer=timer)
    prev = previous or {}
    data = {**result, "cpu": cpu_name(), "threads": torch.get_num_threads(), "torch": torch.__version__,
            "model": name, "measured_at": round(time.time(), 3)}
    if result["settled"]:
        data["provisional"] = False
    else:
        data["provisional_starts"] = starts = prev.get("provisional_starts", 0) + 1 if prev.get("provisional") else 1
        data["provisional"] = starts < MAX_PROVISIONAL
    if prev.get("stale"):  # measured again because the live steps disagreed: count the times it kept the choice
        data["after_live"] = prev["stale"]
        data["live_remeasures"] = prev.get("live_remeasures", 0) + 1 if prev.get("choice") == data["choice"] else 0
    _store(path, data)
    log.info("precision auto on this CPU: %s (%s; %s)", data["choice"],
             {n: result[n]["step_ms"] for n in names},
             "settled" if not data["provisional"] else f"provisional: rounds disagreed for {', '.join(result['noisy'])}")
    return data


def _store(path: Path, data: dict) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_bytes_atomic(path, json.dumps(data).encode())
    except OSError:
        pass  # measured again next time


def run_to_end(gen: Generator):
    """What a measuring generator returns, run here without pausing."""
    while True:
        try:
            next(gen)
        except StopIteration as done:
            return done.value


def choose(loaded_fp32, *, force: bool = False, timer: Timer | None = None) -> tuple[str, dict]:
    """("fp32" | "bf16" | "int8" | "int8w" | "int4w", the measurements) for a model loaded in fp32 on the CPU: the
    cheapest by completion_ms among fp32, bf16 (native bf16 dot products only), int8 (int8_candidate models
    only), int8w (int8w_candidate models only) and int4w (int4w_candidate models only); read from the cache unless that entry is provisional or
    stale (needs_measuring)."""
    if candidates(loaded_fp32.name) == ["fp32"]:
        return "fp32", {"reason": "no native bf16 dot products on this CPU, and int8 and int8w are opt-in for this model"}
    previous = read_cached(cache_file(loaded_fp32.name))
    if not force and not needs_measuring(previous):
        return previous["choice"], previous
    data = run_to_end(measure_and_store(loaded_fp32, timer=timer, previous=previous))
    return data["choice"], data


def _step_figures(data: dict) -> dict[str, float]:
    return {n: data[n]["step_ms"] for n in MEASURED if isinstance(data.get(n), dict) and "step_ms" in data[n]}


def disagreement(data: dict, in_use: str, live_step_ms: float) -> str | None:
    """Why the live decoding steps at `in_use` contradict the cached measurement `data`, or None."""
    cached = (data.get(in_use) or {}).get("step_ms")
    if not cached:
        return None
    if live_step_ms > LIVE_SLOWER * cached:
        return f"live {in_use} steps take {live_step_ms:.1f} ms, {live_step_ms / cached:.2f}x the {cached} ms measured"
    if live_step_ms * LIVE_FASTER < cached:
        return (f"live {in_use} steps take {live_step_ms:.1f} ms, {cached / live_step_ms:.2f}x faster than the "
                f"{cached} ms measured: the measurement was taken under load")
    # judged on what the choice compared: a cheaper step does not beat a cheaper prompt chunk (AMX: int8w steps
    # 42 ms against bf16's 55-58, its 64-token chunk 359 ms against 104)
    live = _completion_or_step({**data[in_use], "step_ms": live_step_ms})
    for other in MEASURED:
        m = data.get(other) or {}
        if other != in_use and m.get("step_ms") and _completion_or_step(m) * LIVE_BEATEN < live:
            return (f"{other} measured {_completion_or_step(m):.1f} ms ({_what(m)}), clearly below the {live:.1f} ms "
                    f"{in_use} takes at its live steps")
    return None


def _completion_or_step(m: dict) -> float:
    """completion_ms where the prompt chunk was measured, else the step alone."""
    return completion_ms(m) if m.get("prompt_chunk_ms") is not None else m["step_ms"]


def _what(m: dict) -> str:
    if m.get("prompt_chunk_ms") is None:
        return "a step"
    return f"a {PROMPT_CHUNK}-token chunk and {STEPS_PER_COMPLETION} steps of {m['step_ms']} ms"


# a re-measurement holds the model in fp32 again plus a converted copy per candidate: this many times the
# fp32 model's bytes must be available
REMEASURE_MEMORY_FACTOR = 4


def machine_allows(model_bytes: int) -> str | None:
    """Why the machine cannot take a measurement in the background now, or None. It loads the model again in
    fp32 (model_bytes: its fp32 size) and converts a copy per candidate: several times the model's size (4
    daemons of the typing benchmark that re-measured at once were killed for memory), and it times forwards,
    which another busy process makes meaningless (the 1-minute load average above half the cores)."""
    avail = _mem_available()
    if avail is not None and avail < REMEASURE_MEMORY_FACTOR * model_bytes:
        return f"{avail >> 20} MiB available, {REMEASURE_MEMORY_FACTOR * model_bytes >> 20} MiB needed"
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    if load > 0.5 * (os.cpu_count() or 1):
        return f"the machine is busy (load {load:.1f})"
    return None


class LiveCheck:
    """The precision in use held to the daemon's own decoding steps: after every LIVE_WINDOW new steps of at
    most LIVE_MAX_DRAFT draft nodes, their median is compared with the cached figure (`disagreement`). A
    disagreement marks the cache entry stale (the next start measures again) and makes a re-measurement due,
    which the daemon runs when idle (`remeasure`); its choice applies from the next start. At most one
    re-measurement per process, and none once MAX_LIVE_REMEASURES of them kept the choice (then reported only)."""

    def __init__(self, model_name: str, data: dict):
        self.model_name = model_name
        self.data = data
        self.in_use: str = data["choice"]
        self.steps: deque[float] = deque(maxlen=LIVE_WINDOW)
        self.seen = 0
        self._new = 0
        self.live_step_ms: float | None = None
        self.verdict: str | None = None  # "agrees" | "disagrees"
        self.reason: str | None = None
        self.action: str | None = None  # "pending" | "measuring" | "measured" | "failed" | "reported only"
        self.remeasured: dict | None = None

    def observe(self, forward_ms: Sequence[float], draft_sizes: Sequence[int],
                cost: Callable[[int], float] | None = None) -> bool:
        """One run's decoding steps; True when this made a re-measurement due. `cost`: the engine's c(q) at the
        precision in use, which scales a step of q rows to one row's cost (None: steps taken as they are)."""
        for ms, drafted in zip(forward_ms, draft_sizes):
            if drafted <= LIVE_MAX_DRAFT:
                if cost is not None and cost(drafted + 1) > 0:
                    ms = ms * cost(1) / cost(drafted + 1)
                self.steps.append(ms)
                self.seen += 1
                self._new += 1
        if len(self.steps) < LIVE_WINDOW or self._new < LIVE_WINDOW:
            return False
        self._new = 0
        self.live_step_ms = round(statistics.median(self.steps), 1)
        reason = disagreement(self.data, self.in_use, self.live_step_ms)
        self.verdict, self.reason = ("disagrees", reason) if reason else ("agrees", None)
        if reason is None or self.action is not None:
            return False
        if self.data.get("live_remeasures", 0) >= MAX_LIVE_REMEASURES:
            self.action = "reported only"
            log.info("precision %s: %s (not measured again: %d re-measurements kept the choice)", self.in_use,
                     reason, self.data["live_remeasures"])
            return False
        self._mark_stale(reason)
        self.action = "pending"
        log.warning("precision %s: %s; measuring again when idle (cached: %s)", self.in_use, reason,
                    _step_figures(self.data))
        return True

    def _mark_stale(self, reason: str) -> None:
        path = cache_file(self.model_name)
        data = read_cached(path)
        # only the measurement these steps were held to: another process may have replaced it meanwhile
        if data is not None and data.get("measured_at") == self.data.get("measured_at"):
            data["stale"] = {"reason": reason, "in_use": self.in_use, "live_step_ms": self.live_step_ms,
                             "at": round(time.time(), 3)}
            _store(path, data)
            self.data = data

    @property
    def due(self) -> bool:
        return self.action == "pending"

    def remeasure(self, load_fp32: Callable[[], object], *, timer: Timer | None = None) -> Generator[None, None, dict | None]:
        """The re-measurement, one forward per step (load_fp32: the model again, in fp32); caches its result."""
        self.action = "measuring"
        try:
            loaded = load_fp32()
            yield
            data = yield from measure_and_store(loaded, timer=timer, previous=read_cached(cache_file(self.model_name)))
        except Exception:
            self.action = "failed"
            raise
        del loaded
        self.action = "measured"
        self.remeasured = {"choice": data["choice"], "provisional": data["provisional"],
                           "step_ms": _step_figures(data),
                           "applies": "now" if data["choice"] == self.in_use else "at the next start"}
        log.info("precision re-measured after the live check: %s (in use: %s; %s)", data["choice"], self.in_use,
                 "the choice holds" if data["choice"] == self.in_use else "applies at the next start")
        self.data = data
        return data

    def snapshot(self) -> dict:
        return {"in_use": self.in_use, "cached_step_ms": (self.data.get(self.in_use) or {}).get("step_ms"),
                "live_step_ms": self.live_step_ms, "live_steps": self.seen, "verdict": self.verdict,
                "reason": self.reason, "action": self.action, "remeasured": self.remeasured}


def _convert(model, precision: str, gguf: Path | None = None, name: str | None = None):
    """The model (named `name`) converted in place to "bf16", "int8" (per-row W8A8), "int8w" (weight-only int8)
    or "int4w" (the GGUF `gguf`'s 4-bit blocks)."""
    if precision == "bf16":
        return model.to(torch.bfloat16)
    from .host import quantize

    return quantize(model, precision, gguf, name)


def as_precision(loaded, precision: str):
    """The same LoadedModel (fp32) converted in place to what `choose` chose: "fp32" leaves it as it is, "bf16"
    converts its weights, "int8" and "int8w" its linear layers (activations stay fp32)."""
    if precision == "fp32":
        return loaded
    _convert(loaded.model, precision, getattr(loaded, "gguf", None), loaded.name)
    return dataclasses.replace(loaded, dtype=torch.bfloat16 if precision == "bf16" else torch.float32,
                               precision=precision)
