"""What one keystroke costs the daemon in a big buffer, before and after issue 12.

    python benchmarks/bench_edit.py [--edits 20] [--tokenizer PATH] [--json OUT]

Per edit (a one-character insertion in the middle of the buffer, as typing sends it): applying the
incremental change to the open document, converting the cursor's UTF-16 position for the next request,
and bringing the buffer's live-shard tokens up to date (what `didChange` and the indexing thread do).
"before": pygls' TextDocument and re-tokenizing the whole buffer; "after": rest_lsp/documents.py's
FastTextDocument and rest_lsp/service/live.py's LiveBuffer (secrets masking included). Buffers: 1 MB on one
line (minified code), and 1 MB of ordinary code (about 25,000 lines). Tokenizer: the embedded model's.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from lsprotocol import types  # noqa: E402
from pygls.workspace.text_document import TextDocument  # noqa: E402

from indexer.secrets import clean  # noqa: E402
from indexer.tokenizer import encode_batch, load_tokenizer  # noqa: E402
from rest_lsp.documents import FastTextDocument  # noqa: E402
from rest_lsp.service.live import LiveBuffer  # noqa: E402
from report import write_json  # noqa: E402


def buffers() -> dict[str, str]:
    one_line = "var data=[" + ",".join(f'{{"id":{i},"v":"x{i % 97}"}}' for i in range(60_000)) + "];"
    code = "".join(f"def function_{i}(a, b):\n    return a * {i} + b\n\n" for i in range(26_000))
    return {"1 MB, one line": one_line[:1_000_000], "1 MB, 26k lines of code": code[:1_000_000]}


def edit_at(doc_text: str, k: int) -> types.TextDocumentContentChangePartial:
    """Insert one character at the middle of the middle line (UTF-16 positions, as VS Code sends)."""
    lines = doc_text.split("\n")
    line = len(lines) // 2
    col = len(lines[line]) // 2 + k
    pos = types.Position(line, col)
    return types.TextDocumentContentChangePartial(range=types.Range(pos, pos), text="x")


def run(name: str, text: str, tok, edits: int, before: bool) -> list[float]:
    encode = lambda texts: encode_batch(tok, texts)  # noqa: E731
    doc = (TextDocument if before else FastTextDocument)("file:///b.py", text)
    live = LiveBuffer("b.py", encode, clean)
    live.update(text)
    times = []
    for k in range(edits):
        change = edit_at(doc.source, k)
        t0 = time.perf_counter()
        doc.apply_change(change)
        pos = types.Position(change.range.start.line, change.range.start.character + 1)
        if before:
            doc.position_codec.position_from_client_units(doc.lines, pos)
            tok.encode(doc.source, add_special_tokens=False)
        else:
            doc.columns(pos)
            live.update(doc.source)
        times.append((time.perf_counter() - t0) * 1000)
    return times


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--edits", type=int, default=20)
    p.add_argument("--tokenizer", default=None)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    tok = load_tokenizer(args.tokenizer)
    out = {}
    for name, text in buffers().items():
        row = {}
        for label, before in (("before", True), ("after", False)):
            t = run(name, text, tok, args.edits, before)
            row[label] = {"p50_ms": round(statistics.median(t), 2), "max_ms": round(max(t), 2)}
        out[name] = row
        print(f"{name}: before p50 {row['before']['p50_ms']} ms (max {row['before']['max_ms']}), "
              f"after p50 {row['after']['p50_ms']} ms (max {row['after']['max_ms']}) per edit")
    if args.json:
        write_json(args.json, out, indent=2)
    return out


if __name__ == "__main__":
    main()
