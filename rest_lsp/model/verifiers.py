"""Which verifier runs here, and is it exact? The one place that decides, for a loaded model.

    device  precision                 verifier (kind)                              tree rows exact?
    cuda    bf16, fp16 (auto), fp32   StaticVerifier (static): static.py           check_tree_rows
    cpu     fp32 (auto's default)     FastVerifier (screened where probes.cpu_has_bf16, else packed): fast.py
                                                                                   check_tree_rows
    cpu     bf16                      FastVerifier (packed) where oneDNN packs bf16; else eager
                                                                                   check_tree_rows
    cpu     int8, int8w, int4w        FastVerifier (packed) over the model's own quantized modules
                                                                                   check_tree_rows
    any     a model neither runs      HFVerifier (eager): transformers' forward    check_tree_rows, and on a
            (support.check_supported: architecture, torch's quantize_dynamic       CPU probes.eager_row_invariant
            modules, bf16 without oneDNN's bf16 kernels)

Precision comes first, decided when the model loads (rest_lsp/model/host.py resolve_precision; `precision:
auto` on a CPU: rest_lsp/model/precision.py, which times candidates through this module's verifier). Then:

    make_verifier(loaded, kind="auto", max_len=4096, **kw) -> Verifier
        "auto": on a GPU static; on the CPU screened where it has native bf16 dot products, else packed; eager
        where none runs the model (UnsupportedModel). "eager", "packed", "screened", "compiled" (inductor per
        q bucket), "static" (any device): exactly that kind, its errors raised.
    make_verifier_or_eager(loaded, kind) -> Verifier
        as make_verifier, and for "auto" any error building the fast one is logged, never raised: the eager
        verifier runs every HF causal LM (the daemon and `rest-lsp bench`)
    verifier_kind(verifier) -> "eager" | "packed" | "screened" | "compiled" | "static"
    check_tree_rows(verifier, tokens) -> TreeCheck
        whether this verifier, on this device and CPU, gives a draft tree's rows the bits plain decoding gives
        the same tokens one at a time (a few forwards, run once at load)
    tree_exactness(verifier, loaded, tokens) -> TreeCheck
        check_tree_rows, and for the eager forward on a CPU its kernels' row invariance too
    choose_verifier(loaded, tokens, kind="auto") -> ChosenVerifier(verifier, kind, trees)
        all of the above in order: what rest_lsp/service/backend.py calls at load

The fallback where trees are not exact: the daemon refuses draft trees and decodes plainly (draft budget 0;
a draftBudget setting overrides), and says why (ModelLimits.exact_trees, trees_reason: backend.py). The
verifiers' exactness by construction: the packed CPU forward attends in the model's dtype where
probes.sdpa_row_invariant, else in float64, and oneDNN's packed products give a row the same bits among
others; the static GPU forward runs fixed-size row pieces (one product shape) and float64 attention. The
load-time check holds each to it rather than assuming it per kind.

Why two decoder forwards (fast.py StaticLM/Layer on the CPU, static.py StaticVerifier._piece on a GPU), not one
parameterised by what differs. They share what can be shared at no cost: the architectures and which models
each runs (support.py), norms, rotary embedding, MLP layouts and the attention window (ops.py). What differs is
not a parameter of one loop but its structure:
- linear products: the CPU forward copies every weight once into oneDNN's blocked layout and fuses q/k/v and
  gate/up into one product each (rest-lsp's int8/int4 modules fused likewise), pads products below 4 rows
  (MIN_ROWS), and may screen the LM head in bf16 (screened.py); the GPU forward calls the model's own
  nn.Linear modules, unfused and uncopied (a fused copy would double the weights' GPU memory, and fusing
  changes the product shapes by which cuBLAS chooses its kernels, and so its last bits);
- row shapes: the CPU forward takes any q rows (inductor compiles per q bucket 1-16 over a static mask of the
  whole cache); the GPU forward splits every call into pieces of exactly `rows` rows (64 on CUDA, the last
  padded), since cuBLAS picks a kernel per shape, and replays one CUDA graph per attended span (rounded up to
  span_step) for each piece, with spare cache slots past max_len for the padding rows;
- attention dtype: the model's own where the CPU's attention is row-invariant (probes.sdpa_row_invariant),
  float64 otherwise; always float64 on the GPU;
- output: the CPU forward computes only the rows asked for (`rows=`: a prefill's last row skips most of the
  LM head); the GPU piece returns every row's logits, as its graph was captured.
Folding these into one forward puts a branch or an indirection into the loop that inductor's fullgraph compile
and CUDA graph capture both trace, and changes either the GPU's product shapes (fused weights there) or the
CPU's (unfused ones here). That it costs nothing was not measured (no GPU was at hand when the two were last
compared, issue 34), and on a GPU a new product shape changes bits, which only a GPU run
(benchmarks/gpu_exact.py, benchmarks/gpu_cost.py) can check. So two remain, each in its own module, and only
this module chooses between them (tests/test_structure.py).
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, Sequence

import torch

from rest_lsp.engine.verifier import HFVerifier, Verifier

from . import probes
from .ops import UnsupportedModel

log = logging.getLogger(__name__)

KINDS = ("auto", "eager", "packed", "screened", "compiled", "static")


def _unreleased(model: Any) -> Any:
    if getattr(model, "rest_released", False):
        raise ValueError("this model's weights were released to the packed verifier that copied them "
                         "(FastVerifier.release_model_copies): load the model again for another verifier")
    return model


def make_verifier(loaded: Any, kind: str = "auto", *, max_len: int = 4096, **kwargs) -> Verifier:
    """A `Verifier` for a LoadedModel (rest_lsp.model.host) or a bare HF model (the table above).

    kind: "eager" (HFVerifier), "packed", "screened" (packed + exact-argmax bf16-screened output
    projection), "compiled", "static" (rest_lsp/model/static.py: the GPU verifier, any device), or "auto":
    on a GPU static; on the CPU screened where it has native bf16 dot products, else packed; eager where
    none supports the model (architecture, torch's quantize_dynamic modules; per-row int8 models run the fast
    path). kwargs go to FastVerifier (min_rows, buckets, mode)."""
    if kind not in KINDS:
        raise ValueError(f"make_verifier: kind must be one of {KINDS}, got {kind!r}")
    model = _unreleased(loaded if isinstance(loaded, torch.nn.Module) else loaded.model)
    if kind == "eager":
        return HFVerifier(model)
    on_cpu = all(p.device.type == "cpu" for p in model.parameters())
    if kind == "static" or (kind == "auto" and not on_cpu):
        from .static import StaticVerifier

        try:
            return StaticVerifier(model, max_len=max_len)
        except UnsupportedModel:
            if kind == "static":
                raise
            return HFVerifier(model)
    from .fast import FastVerifier

    if kind == "auto":
        try:
            return FastVerifier(model, max_len=max_len, screen=probes.cpu_has_bf16(), **kwargs)
        except UnsupportedModel:
            return HFVerifier(model)
    return FastVerifier(model, max_len=max_len, screen=(kind == "screened"), compiled=(kind == "compiled"),
                        **kwargs)


def make_verifier_or_eager(loaded: Any, kind: str = "auto", **kwargs) -> Verifier:
    """loaded: a LoadedModel (rest_lsp.model.host) or a bare HF causal LM; kwargs go to make_verifier."""
    if kind not in KINDS:
        raise ValueError(f"verifier kind must be one of {', '.join(KINDS)}, got {kind!r}")
    bare = isinstance(loaded, torch.nn.Module)
    model = _unreleased(loaded if bare else loaded.model)
    device = None if bare else getattr(loaded, "device", None)
    if kind == "eager":
        return HFVerifier(model, device)
    try:
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


def attention_kind(verifier: Any) -> str:
    """How a verifier's tree and decoding rows attend (rest/stats `model.trees.attention`): "kernel" (the compiled
    tree attention, rest_lsp/model/attention.py), "float64" (exact, slower), "model dtype" (where the CPU's own
    attention is row-invariant), or "transformers" (the eager forward's own)."""
    if isinstance(verifier, HFVerifier):
        return "transformers"
    owner = getattr(verifier, "lm", verifier)  # FastVerifier keeps it on its StaticLM, StaticVerifier on itself
    if getattr(owner, "tree_attention", None) is not None:
        return "kernel"
    return "float64" if getattr(owner, "attention_dtype", None) == torch.float64 else "model dtype"


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
# (rest_lsp/model/probes.py sdpa_row_invariant).
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


def trees_verify_exactly(verifier_kind: str, loaded) -> bool:
    """Whether the CPU's kernels round a row alike alone and among others for transformers' own forward
    (probes.eager_row_invariant: products of 1-33 rows, more shapes than tree_exactness's one tree can try); the
    other verifiers and devices are left to that check."""
    if verifier_kind != "eager" or loaded.device.type != "cpu":
        return True
    return probes.eager_row_invariant(next(loaded.model.parameters()).dtype)


def tree_exactness(verifier: Any, loaded, tokens: Sequence[int]) -> TreeCheck:
    """A TreeCheck: the verifier's own tree rows against its plain rows, on every device and for every kind,
    and for the eager forward on a CPU its kernels' row invariance too."""
    check = check_tree_rows(verifier, tokens)
    kind = verifier_kind(verifier)
    if check.exact and not trees_verify_exactly(kind, loaded):
        return TreeCheck(False, f"the {kind} verifier on cpu: this CPU's matrix products round a row "
                                "differently alone than among others (eager_row_invariant)", check.ms)
    return check


@dataclass(frozen=True)
class ChosenVerifier:
    """What choose_verifier decided: the verifier, its kind, and whether its draft trees verify exactly."""

    verifier: Verifier
    kind: str
    trees: TreeCheck


def choose_verifier(loaded: Any, tokens: Sequence[int], kind: str = "auto") -> ChosenVerifier:
    """The daemon's verifier for a LoadedModel: device -> verifier (make_verifier_or_eager, `auto` falling back to
    eager) -> whether its tree rows are exact (tree_exactness, probed with `tokens`; where they are not, the
    caller decodes plainly). The verifier is left empty."""
    verifier = make_verifier_or_eager(loaded, kind)
    return ChosenVerifier(verifier, verifier_kind(verifier), tree_exactness(verifier, loaded, tokens))
