"""The ground floor both `indexer` and `rest_lsp` stand on: where rest-lsp keeps what outlives a process
(`storage`) and its compiled loops (`jit`). Imports nothing of the project above it, and never torch."""
