"""REST decoding: draft sources, token trie and tree attention, the speculative loop, stop rules."""
from .generate import Engine, GenerationConfig, GenerationResult
from .sources import ContextSource, DatastoreSource, DraftSource, HistorySource, RecyclingSource, default_sources
from .verifier import HFVerifier, Verifier

__all__ = [
    "Engine", "GenerationConfig", "GenerationResult", "Verifier", "HFVerifier", "DraftSource",
    "ContextSource", "DatastoreSource", "HistorySource", "RecyclingSource", "default_sources",
]
