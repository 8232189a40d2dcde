"""Test support, not part of the product: tiny random models that build in a second without a download, for the
tests (tests/, the VS Code extension's node tests), benchmarks/gpu_exact.py and offline demos; and a gate that
holds a test server's model runs until the test opens it (`gate`).

It lives at the top of the repository, outside the packages the wheel ships (pyproject.toml lists restbase,
indexer and rest_lsp), and the production packages never import it (tests/test_structure.py). Run from the
repository root (pytest puts the root on sys.path: `pythonpath` in pyproject.toml):

    python -m testmodels.tiny DIR [--seed N] [--family qwen|qwen3|codellama]
"""
