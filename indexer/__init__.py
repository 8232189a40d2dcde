"""rest-lsp's datastore: token-level suffix arrays over a code corpus, the user's repository and live
buffers, searched for REST drafts. Importing this package (and searching) never imports torch."""
from .types import (Continuation, CorruptManifest, CorruptShard, DatastoreNotFound, IndexerError,
                    SearchResult, TokenizerMismatch, TokenOutOfRange)

__all__ = ["Continuation", "SearchResult", "Datastore", "IndexerError", "TokenizerMismatch", "CorruptShard",
           "CorruptManifest", "DatastoreNotFound", "TokenOutOfRange", "load_tokenizer", "fingerprint"]


def __getattr__(name):  # lazy: `import indexer` stays cheap
    if name == "Datastore":
        from .store import Datastore

        return Datastore
    if name in ("load_tokenizer", "fingerprint"):
        from . import tokenizer

        return getattr(tokenizer, name)
    raise AttributeError(name)
