"""REST decoding: draft sources, token trie and tree attention, the speculative loop, stop rules."""
from .drafter import Drafter
from .generate import Engine, GenerationConfig, GenerationResult, Run
from .policy import PolicyError, make_sources
from .sources import ContextSource, DatastoreSource, DraftSource, HistorySource, RecyclingSource
from .verifier import HFVerifier, Verifier

__all__ = [
    "Engine", "GenerationConfig", "GenerationResult", "Run", "Verifier", "HFVerifier", "DraftSource", "Drafter",
    "ContextSource", "DatastoreSource", "HistorySource", "RecyclingSource", "make_sources", "PolicyError",
]
