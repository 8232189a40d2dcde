"""Choosing a verifier by kind, with one fallback rule for the daemon and `rest-lsp bench`.

    make_verifier_or_eager(loaded, kind) -> Verifier
        "auto": rest_lsp.model.fast's verifier where it supports the model, else the eager HFVerifier (any
        error building the fast one is logged, never raised: the eager verifier runs every HF causal LM);
        "eager", "packed", "screened", "compiled", "static": exactly that kind, its errors raised.
    verifier_kind(verifier) -> "eager" | "packed" | "screened" | "compiled" | "static"
"""
from __future__ import annotations

import logging
from typing import Any

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
