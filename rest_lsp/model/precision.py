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
its kernel is batch-invariant. Figures: docs/cpu.md.
"""
from __future__ import annotations

import copy
import dataclasses
import json
import logging
import platform
import time
from pathlib import Path

import torch

from rest_lsp.filenames import safe_filename
from rest_lsp.storage import write_bytes_atomic

log = logging.getLogger(__name__)

PROMPT_CHUNK = 64  # the warm-up chunk: what typing costs
STEPS = 6  # one-token steps timed (the median counts)
# the cost a completion pays: a prompt chunk plus this many decoding steps (a short suggestion)
STEPS_PER_COMPLETION = 8
MEASURE_VERSION = 3  # 2: an "int8" entry and choice (INT8_QUALITY); 3: "int8w" (INT8W_QUALITY)

# first-line exact match, int8 minus bf16, in points (benchmarks/bench_layout.py --layouts line@body, the same
# cases; docs/cpu.md), per model name. A model missing here is not a candidate: its loss is unknown.
INT8_QUALITY: dict[str, float] = {
    "Qwen2.5-Coder-0.5B-Instruct": -2.5,  # 85 vs 91 of 240 boltons lines (2026-11-30): opt-in only
}
INT8_MAX_LOSS = 2.0  # points of first-line exact match int8 may lose against bf16 and still be chosen
# the same for weight-only int8 (int8w), against fp32 on the same cases
INT8W_QUALITY: dict[str, float] = {
    "Qwen2.5-Coder-0.5B-Instruct": -0.8,  # 89 vs 91 of 240 boltons lines (2026-12-02, AVX-512 Xeon)
}


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _cache_path(model_name: str, int8: bool = False, int8w: bool = False) -> Path:
    from rest_lsp.engine.cost import cache_dir

    # the candidates in the key: a model that becomes one (INT8_QUALITY, INT8W_QUALITY) is measured again
    key = f"{model_name}-{cpu_name()}-t{torch.get_num_threads()}-torch{torch.__version__}-v{MEASURE_VERSION}" \
        + ("-int8" if int8 else "") + ("-int8w" if int8w else "")
    return cache_dir() / f"precision-{safe_filename(key)}.json"


def time_forwards(verifier, vocab_size: int) -> dict:
    """ms of one 64-token prompt chunk after 300 cached tokens, and of one-token steps (median)."""
    from rest_lsp.engine.verifier import chain_mask

    g = torch.Generator().manual_seed(0)

    def forward(q: int, rows=None) -> float:
        t = time.perf_counter()
        verifier.forward(torch.randint(0, vocab_size, (q,), generator=g), torch.arange(q), chain_mask(q), rows=rows)
        return (time.perf_counter() - t) * 1000

    verifier.truncate(0)
    forward(300, rows=[299])
    forward(1)  # first-call overheads
    chunk = min(forward(PROMPT_CHUNK, rows=[PROMPT_CHUNK - 1]) for _ in range(2))
    verifier.truncate(300)
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


def choose(loaded_fp32, *, force: bool = False) -> tuple[str, dict]:
    """("fp32" | "bf16" | "int8" | "int8w", the measurements) for a model loaded in fp32 on the CPU: the
    cheapest by completion_ms among fp32, bf16 (native bf16 dot products only), int8 (int8_candidate models
    only) and int8w (int8w_candidate models only)."""
    from .fast import cpu_has_bf16
    from .verifiers import make_verifier_or_eager

    bf16_ok, int8_ok = cpu_has_bf16(), int8_candidate(loaded_fp32.name)
    int8w_ok = int8w_candidate(loaded_fp32.name)
    if not (bf16_ok or int8_ok or int8w_ok):
        return "fp32", {"reason": "no native bf16 dot products on this CPU, and int8 and int8w are opt-in for this model"}
    path = _cache_path(loaded_fp32.name, int8_ok, int8w_ok)
    if not force:
        try:
            data = json.loads(path.read_text())
            return data["choice"], data
        except (OSError, ValueError, KeyError):
            pass
    timed = {"fp32": time_forwards(make_verifier_or_eager(loaded_fp32, "auto", max_len=512), loaded_fp32.vocab_size)}
    for name, ok in (("bf16", bf16_ok), ("int8", int8_ok), ("int8w", int8w_ok)):
        if ok:
            model = _convert(copy.deepcopy(loaded_fp32.model), name)
            timed[name] = time_forwards(make_verifier_or_eager(model, "auto", max_len=512), loaded_fp32.vocab_size)
            del model
    choice = min(timed, key=lambda name: completion_ms(timed[name]))  # ties: the first (fp32, then bf16)
    data = {"choice": choice, **timed, "cpu": cpu_name(), "threads": torch.get_num_threads(),
            "torch": torch.__version__, "model": loaded_fp32.name}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_bytes_atomic(path, json.dumps(data).encode())
    except OSError:
        pass  # measured again next time
    log.info("precision auto on this CPU: %s (%s)", choice, timed)
    return choice, data


def _convert(model, precision: str):
    """The model converted in place to "bf16", "int8" (per-row W8A8) or "int8w" (weight-only int8)."""
    if precision == "bf16":
        return model.to(torch.bfloat16)
    from .host import quantize

    return quantize(model, precision)


def as_precision(loaded, precision: str):
    """The same LoadedModel (fp32) converted in place to what `choose` chose: "fp32" leaves it as it is, "bf16"
    converts its weights, "int8" and "int8w" its linear layers (activations stay fp32)."""
    if precision == "fp32":
        return loaded
    _convert(loaded.model, precision)
    return dataclasses.replace(loaded, dtype=torch.bfloat16 if precision == "bf16" else torch.float32,
                               precision=precision)
