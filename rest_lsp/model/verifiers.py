"""Choosing a verifier by kind, with one fallback rule for the daemon and `rest-lsp bench`.

    make_verifier_or_eager(loaded, kind) -> Verifier
        "auto": rest_lsp.model.fast's verifier where it supports the model, else the eager HFVerifier (any
        error building the fast one is logged, never raised: the eager verifier runs every HF causal LM);
        "eager", "packed", "screened", "compiled", "static": exactly that kind, its errors raised.
    verifier_kind(verifier) -> "eager" | "packed" | "screened" | "compiled" | "static"
    check_tree_rows(verifier, tokens) -> TreeCheck
        whether this verifier, on this device and CPU, gives a draft tree's rows the bits plain decoding gives
        the same tokens one at a time (a few forwards, run once at load: rest_lsp/service/backend.py)
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, Sequence

import torch

from rest_lsp.engine.verifier import HFVerifier, Verifier

log = logging.getLogger(__name__)

KINDS = ("auto", "eager", "packed", "screened", "compiled", "static")


def make_verifier_or_eager(loaded: Any, kind: str = "auto", **kwargs) -> Verifier:
    """loaded: a LoadedModel (rest_lsp.model.host) or a bare HF causal LM; kwargs go to make_verifier."""
    if kind not in KINDS:
        raise ValueError(f"verifier kind must be one of {', '.join(KINDS)}, got {kind!r}")
    bare = isinstance(loaded, torch.nn.Module)
    model = loaded if bare else loaded.model
    device = None if bare else getattr(loaded, "device", None)
    if kind == "eager":
        return HFVerifier(model, device)
    try:
        from rest_lsp.model.fast import make_verifier

        return make_verifier(loaded, kind, **kwargs)
    except Exception as exc:  # noqa: BLE001 - auto promises a working verifier
        if kind != "auto":
            raise
        log.warning("fast verifier unavailable (%s: %s); using transformers' forward", type(exc).__name__, exc)
        return HFVerifier(model, device)


def verifier_kind(verifier: Any) -> str:
    """The kind a verifier was built as ("eager" for HFVerifier; FastVerifier says its own)."""
    if isinstance(verifier, HFVerifier):
        return "eager"
    return str(getattr(verifier, "kind", None) or type(verifier).__name__)


@dataclass(frozen=True)
class TreeCheck:
    """The outcome of check_tree_rows: `exact` False with the `reason` where a tree row parted from plain
    decoding (or the check could not run)."""

    exact: bool
    reason: str | None = None
    ms: float = 0.0

    def describe(self) -> dict:
        return {"exact": self.exact, "reason": self.reason, "check_ms": round(self.ms, 1)}


# Where each probe tree row hangs (-1: below the cached prompt). Rows 0, 1, 3 form the path a, b, c that plain
# decoding also verifies; the siblings put masked keys between and after the path's (where a kernel's
# summation order can change), and the path sits at rows 0-3, where an AVX2 CPU's attention rounded otherwise
# (rest_lsp/model/fast.py sdpa_row_invariant).
_PROBE_PARENTS = (-1, 0, 0, 1, 2, 3)
_PROBE_PATH = (0, 1, 3)
_PROBE_PROMPT = 6


def _probe_forward(verifier: Any, tokens: Sequence[int], parents: Sequence[int]) -> torch.Tensor:
    q = len(tokens)
    mask = torch.eye(q, dtype=torch.bool)
    depths = [0] * q
    for i, p in enumerate(parents):
        if p >= 0:
            mask[i] |= mask[p]
            depths[i] = depths[p] + 1
    dev = getattr(verifier, "device", None)
    return verifier.forward(torch.tensor(list(tokens), dtype=torch.long, device=dev),
                            torch.tensor(depths, dtype=torch.long, device=dev), mask.to(dev))


def _rows_agree(tree_row: torch.Tensor, tree_scores, plain_row: torch.Tensor, plain_scores,
                exact_logits: bool) -> str | None:
    """None where a tree row and the plain row agree bit for bit; else what differed."""
    if int(tree_row.argmax()) != int(plain_row.argmax()):
        return f"greedy token {int(tree_row.argmax())} against {int(plain_row.argmax())}"
    # a screened head's logits are exact only where a token could win: compare those, exactly, as scored
    ids = plain_row.topk(min(8, plain_row.shape[-1])).indices
    a, b = tree_scores(ids), plain_scores(ids)
    if not torch.equal(a, b):
        return f"top logits differ by up to {float((a.double() - b.double()).abs().max()):.3g}"
    if exact_logits and not torch.equal(tree_row, plain_row):
        return f"logits differ by up to {float((tree_row.double() - plain_row.double()).abs().max()):.3g}"
    return None


def check_tree_rows(verifier: Any, tokens: Sequence[int]) -> TreeCheck:
    """Whether draft trees verify exactly through `verifier` here: a short prompt, then the tokens a, b, c, e
    one at a time (plain decoding), against a, b, c as the path of a six-row tree with siblings, that path
    kept, and e after it. Every path row's greedy token and logits (top ones as row_scorer gives them, all
    where the verifier's logits are exact) and e's must be bit-identical. Greedy REST is token-for-token plain
    decoding only then; a verifier whose rows round differently alone and among others would part from it
    at a near tie. Seven small forwards; the verifier is left empty. `tokens`: ids to build the probe from
    (repeated when short; some real text reads more like what the daemon sees than arbitrary ids)."""
    t0 = time.perf_counter()
    ids = [int(t) for t in tokens] or [0]
    need = _PROBE_PROMPT + 4 + len(_PROBE_PARENTS) - len(_PROBE_PATH)
    ids = (ids * (need // len(ids) + 1))[:need]
    prompt, (a, b, c, e), siblings = ids[:_PROBE_PROMPT], ids[_PROBE_PROMPT:_PROBE_PROMPT + 4], \
        ids[_PROBE_PROMPT + 4:]
    kind = verifier_kind(verifier)
    where = f"the {kind} verifier on {getattr(verifier, 'device', None) or 'cpu'}"
    exact_logits = bool(getattr(verifier, "exact_logits", True))

    def refused(reason: str) -> TreeCheck:
        return TreeCheck(False, f"{where}: {reason}", (time.perf_counter() - t0) * 1000)

    try:
        with torch.inference_mode():
            verifier.truncate(0)
            _probe_forward(verifier, prompt, [-1] + list(range(len(prompt) - 1)))
            cached = verifier.past_len
            plain = []
            for t in (a, b, c, e):
                row = _probe_forward(verifier, [t], [-1])[0].clone()
                plain.append((row, verifier.row_scorer(0)))
            verifier.truncate(cached)
            tree_tokens = [a, b, siblings[0], c, siblings[1], siblings[2]]
            logits = _probe_forward(verifier, tree_tokens, _PROBE_PARENTS).clone()
            tree = [(logits[r], verifier.row_scorer(r)) for r in _PROBE_PATH]
            verifier.keep(list(_PROBE_PATH))
            after = _probe_forward(verifier, [e], [-1])[0].clone()
            tree.append((after, verifier.row_scorer(0)))
    except Exception as exc:  # noqa: BLE001 - a verifier that cannot verify a tree must not verify one
        return refused(f"a draft tree could not be verified ({type(exc).__name__}: {exc})")
    finally:
        try:
            verifier.truncate(0)
        except Exception:  # noqa: BLE001 - the error above is the one to report
            pass
    labels = ("the tree's root", "the tree's depth-1 row", "the tree's depth-2 row",
              "the token after the kept path")
    for label, (t_row, t_scores), (p_row, p_scores) in zip(labels, tree, plain):
        diff = _rows_agree(t_row, t_scores, p_row, p_scores, exact_logits)
        if diff is not None:
            return refused(f"{label} is not what plain decoding computes for the same token ({diff})")
    return TreeCheck(True, None, (time.perf_counter() - t0) * 1000)
