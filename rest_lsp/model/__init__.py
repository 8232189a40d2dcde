"""Hosting the model: loading (host.py), precisions (precision.py, int8row.py, int8weight.py,
int4weight.py), verifiers.

Importing this package imports no torch: the CLI and the daemon's settings check names against PRECISIONS
before any model loads."""

PRECISIONS = ("auto", "fp32", "int8", "int8w", "int4w", "bf16", "fp16")  # `precision`: what load_model accepts
