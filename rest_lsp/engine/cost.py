"""Verification cost c(q) on this hardware, and the draft size that maximises expected tokens per second.

On a GPU one forward of q tokens costs about what one token costs for dozens of tokens; on a laptop CPU
it does not (c(8)/c(1) is about 2.8 for the embedded model in eager fp32), so the tree must stay small.
c(q) is measured once per model/precision/device/verifier and cached in the user cache directory.
"""
from __future__ import annotations

import hashlib
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from rest_lsp.filenames import safe_filename
from restbase.jit import njit
from restbase.storage import cache_root, write_bytes_atomic

from .verifier import Verifier, chain_mask

DEFAULT_QS = (1, 2, 3, 4, 5, 6, 8, 12, 16, 24, 32, 48, 64)
MEASURE_VERSION = 2  # part of the cache key: a new measuring method never reads old figures


@dataclass
class CostModel:
    """c(q): milliseconds for one forward of q tokens, interpolated between measured points."""

    qs: list[int]
    ms: list[float]

    def __call__(self, q: int) -> float:
        qs, ms = self.qs, self.ms
        if q <= qs[0]:
            return ms[0]
        for (q0, m0), (q1, m1) in zip(zip(qs, ms), zip(qs[1:], ms[1:])):
            if q <= q1:
                return m0 + (m1 - m0) * (q - q0) / (q1 - q0)
        if len(qs) == 1:
            return ms[0]
        slope = max(0.0, (ms[-1] - ms[-2]) / (qs[-1] - qs[-2]))  # beyond the table: linear
        return ms[-1] + slope * (q - qs[-1])

    def upto(self, n: int) -> np.ndarray:
        """[c(1), ..., c(n)], computed once per length (the drafter asks for it every step)."""
        cache = self.__dict__.setdefault("_upto", {})
        if n not in cache:
            cache[n] = np.array([self(q) for q in range(1, n + 1)], dtype=np.float64)
        return cache[n]

    def ratios(self) -> dict[int, float]:
        return {q: m / self.ms[0] for q, m in zip(self.qs, self.ms)}

    @classmethod
    def flat(cls) -> "CostModel":
        """Every size costs the same: only acceptance decides (use where no measurement is wanted)."""
        return cls([1], [1.0])


def best_size(probs: Sequence[float], cost: CostModel) -> int:
    """How many of the ranked draft nodes to verify: argmax over k of (1 + sum(probs[:k])) / c(k + 1).

    probs are the estimated acceptance chances of the nodes in ranking order; the expected tokens of a step
    are 1 (the model's own next token) plus the expected accepted nodes. Scanning every k (not stopping at
    the first loss) copes with cost curves that are flat for a while and then jump.
    """
    return int(best_size_arrays(np.asarray(probs, dtype=np.float64), cost.upto(len(probs) + 1)))


@njit
def best_size_arrays(probs, costs):
    """`best_size` with costs[k] = c(k + 1) for k = 0 .. len(probs)."""
    best_k, best_rate, gained = 0, 1.0 / costs[0], 0.0
    for k in range(1, len(probs) + 1):
        gained += probs[k - 1]
        rate = (1.0 + gained) / costs[k]
        if rate > best_rate:
            best_k, best_rate = k, rate
    return best_k


@dataclass
class Calibration:
    """Scales the trie's acceptance estimates to what the model actually accepts.

    The expected number of accepted draft tokens of a step is the sum of its nodes' acceptance chances, so
    (accepted tokens) / (sum of estimates) over recent steps is the factor the estimates are off by.
    Starts neutral (a prior of 2 tokens both ways), forgets slowly, and stays within [0.25, 2].
    """

    predicted: float = 2.0
    actual: float = 2.0
    decay: float = 0.97

    def scale(self) -> float:
        return min(2.0, max(0.25, self.actual / self.predicted))

    def update(self, predicted: float, actual: int) -> None:
        if predicted > 0:
            self.predicted = self.predicted * self.decay + predicted
            self.actual = self.actual * self.decay + actual


@torch.inference_mode()
def measure_cost(
    verifier: Verifier, vocab_size: int, qs: Sequence[int] = DEFAULT_QS, past: int = 256, repeats: int = 2
) -> CostModel:
    """c(q) after a `past`-token cache; leaves the verifier's cache empty.

    Other processes only ever add time, so each q keeps its fastest run, the sizes are measured round-robin
    (a burst of load spreads over all q instead of inflating one), and the curve is made non-decreasing
    from the right (more tokens never cost less: a slow small q is load, not cost).
    """
    gen = torch.Generator().manual_seed(0)
    verifier.truncate(0)
    verifier.forward(torch.randint(0, vocab_size, (past,), generator=gen), torch.arange(past), chain_mask(past))
    best = {q: float("inf") for q in qs}
    for r in range(repeats + 1):  # round 0 warms every shape up
        for q in qs:
            tokens = torch.randint(0, vocab_size, (q,), generator=gen)
            t0 = time.perf_counter()
            logits = verifier.forward(tokens, torch.arange(q), chain_mask(q))
            float(logits[-1, 0])  # wait for the device
            if r:
                best[q] = min(best[q], (time.perf_counter() - t0) * 1000)
            verifier.keep([])
    verifier.truncate(0)
    ms = [best[q] for q in qs]
    for i in range(len(ms) - 2, -1, -1):
        ms[i] = min(ms[i], ms[i + 1])
    return CostModel(list(qs), ms)


def cache_dir() -> Path:
    return cache_root() / "cost"


def cost_key(name: str, precision: str, device: str, verifier: object) -> str:
    threads = torch.get_num_threads()
    # FastVerifier's kind (packed, screened, compiled): each has its own c(q)
    kind = type(verifier).__name__ + (f"-{verifier.kind}" if getattr(verifier, "kind", None) else "")
    # exact attention where the CPU's SDPA is not row-invariant (rest_lsp/model/probes.py) costs more: the
    # compiled kernel (rest_lsp/model/attention.py), or float64 where it does not build
    lm = getattr(verifier, "lm", None)
    if getattr(lm, "attention_dtype", None) == torch.float64:
        kind += "-attk" if getattr(lm, "tree_attention", None) is not None else "-att64"
    raw = (f"{name}-{precision}-{device}-{kind}-t{threads}-torch{torch.__version__}-v{MEASURE_VERSION}"
           f"-{forward_code(verifier)}")
    return safe_filename(raw)


def forward_code(verifier: object) -> str:
    """A digest of the source of this project's modules that run the verifier's forward (the verifier's own
    class and every module class inside it: packed, quantized, screened products). A c(q) measured before
    one of them changed is not read after: a cached int4w curve from an earlier kernel read 4x the cost
    of the kernel that replaced it, and sized every draft tree from it."""
    classes = {type(verifier)}
    root = getattr(verifier, "lm", None)
    tags = set()  # a module's compiled kernel, chosen per machine (int4w: AMX tiles, AVX-512 or torch's product)
    if isinstance(root, torch.nn.Module):
        classes.update(type(m) for m in root.modules())
        tags.update(str(m.kernel_tag) for m in root.modules() if hasattr(m, "kernel_tag"))
    files = set()
    for cls in classes:
        module = sys.modules.get(cls.__module__)
        path = getattr(module, "__file__", None)
        if path and cls.__module__.split(".")[0] == "rest_lsp":
            files.add(path)
    digest = hashlib.sha256()
    for path in sorted(files):
        try:
            digest.update(Path(path).read_bytes())
        except OSError:
            digest.update(path.encode())
    for tag in sorted(tags):
        digest.update(tag.encode())
    return digest.hexdigest()[:10]


def load_or_measure(
    verifier: Verifier, vocab_size: int, key: str, directory: Path | None = None, *, force: bool = False,
    **measure_kw,
) -> CostModel:
    """The cached c(q) for this key, measuring (and atomically caching) it on first use or when forced."""
    path = (directory or cache_dir()) / f"{key}.json"
    try:
        if not force:
            data = json.loads(path.read_text())
            return CostModel([int(q) for q in data["qs"]], [float(m) for m in data["ms"]])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    model = measure_cost(verifier, vocab_size, **measure_kw)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_bytes_atomic(path, json.dumps({"qs": model.qs, "ms": model.ms}).encode())
    except OSError:
        pass  # a read-only cache only costs a re-measurement next time
    return model
