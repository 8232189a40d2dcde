"""The fastest exact precision this CPU offers, measured, not assumed.

On a CPU with native bf16 dot products (AVX512-BF16, AMX) a bf16 forward can cost far less than an fp32 one,
on one without them far more; the 2-core EPYC the project is developed on measured a prompt token at
2.5-2.9 ms in bf16 against 4.1-4.7 ms in fp32 and a decoding step at 50-60 ms against 76 ms (docs/cpu.md).
So `precision: auto` on a CPU times both, once per model, CPU and torch version (cached in the user cache),
on what a completion costs: a 64-token prompt chunk and a few one-token steps through the verifier the daemon
uses, and keeps the cheaper one. Greedy output stays exact at the precision chosen: REST decoding emits what
plain greedy decoding at that precision emits.
"""
from __future__ import annotations

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
MEASURE_VERSION = 1


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _cache_path(model_name: str) -> Path:
    from rest_lsp.engine.cost import cache_dir

    key = f"{model_name}-{cpu_name()}-t{torch.get_num_threads()}-torch{torch.__version__}-v{MEASURE_VERSION}"
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


def choose(loaded_fp32, *, force: bool = False) -> tuple[str, dict]:
    """("fp32" | "bf16", the measurements) for a model loaded in fp32 on the CPU."""
    from .fast import cpu_has_bf16
    from .verifiers import make_verifier_or_eager

    if not cpu_has_bf16():
        return "fp32", {"reason": "no native bf16 dot products on this CPU"}
    path = _cache_path(loaded_fp32.name)
    if not force:
        try:
            data = json.loads(path.read_text())
            return data["choice"], data
        except (OSError, ValueError, KeyError):
            pass
    fp32 = time_forwards(make_verifier_or_eager(loaded_fp32, "auto", max_len=512), loaded_fp32.vocab_size)
    bf16_model = _bf16_copy(loaded_fp32.model)
    bf16 = time_forwards(make_verifier_or_eager(bf16_model, "auto", max_len=512), loaded_fp32.vocab_size)
    del bf16_model
    choice = "bf16" if completion_ms(bf16) < completion_ms(fp32) else "fp32"
    data = {"choice": choice, "fp32": fp32, "bf16": bf16, "cpu": cpu_name(), "threads": torch.get_num_threads(),
            "torch": torch.__version__, "model": loaded_fp32.name}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_bytes_atomic(path, json.dumps(data).encode())
    except OSError:
        pass  # measured again next time
    log.info("precision auto on this CPU: %s (fp32 %s, bf16 %s)", choice, fp32, bf16)
    return choice, data


def _bf16_copy(model):
    import copy

    return copy.deepcopy(model).to(torch.bfloat16)


def as_bf16(loaded):
    """The same LoadedModel with its weights in bf16 (converted in place)."""
    import dataclasses

    loaded.model.to(torch.bfloat16)
    return dataclasses.replace(loaded, dtype=torch.bfloat16, precision="bf16")
