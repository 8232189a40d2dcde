"""`rest-index`: build, query, inspect and watch a datastore.

    rest-index build ROOT... --out DIR [--tokenizer MODEL] [--json]
    rest-index build --corpus-from-env --out DIR --tokenizer MODEL

MODEL is the model the datastore is for: a model directory, a .gguf file or a hub id (resolved as rest-lsp
loads that model's tokenizer), a tokenizer.json, or "embedded" (the default model, also the default here).
    rest-index query DIR (--text TEXT | --tokens 1,2,3) [--k K] [--json]
    rest-index stats DIR --json
    rest-index watch ROOT... --out DIR
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .types import IndexerError


def _languages(s: str | None):
    if s is None:
        return None
    if s in ("all", "*"):
        return "all"
    return tuple(x.strip() for x in s.split(",") if x.strip())


def _filters(args):
    from . import discover as disc
    from .build import corpus_filters

    base = corpus_filters() if args.corpus_from_env and not args.roots else disc.Filters()
    langs = _languages(args.languages)
    return disc.Filters(
        max_file_size=args.max_file_size if args.max_file_size is not None else base.max_file_size,
        languages=None if langs == "all" else (langs if langs is not None else base.languages),
        extensions=tuple(args.ext.split(",")) if args.ext else (),
        exclude_dirs=base.exclude_dirs,
        exclude_paths=tuple(args.exclude or ()),
        use_gitignore=not args.no_gitignore,
    )


def _add_filter_args(p):
    p.add_argument("--languages", help="comma-separated languages (default: common programming languages; "
                   "'all': any extension)")
    p.add_argument("--ext", help="extra file extensions, comma-separated (e.g. .txt,.md)")
    p.add_argument("--exclude", action="append", help="gitignore-style pattern to skip (repeatable)")
    p.add_argument("--max-file-size", type=int, help="skip files larger than this many bytes (default 1 MiB)")
    p.add_argument("--no-gitignore", action="store_true", help="do not honour .gitignore/.ignore")


def cmd_build(args) -> int:
    from .build import build_datastore

    if not args.roots and not args.corpus_from_env:
        raise IndexerError("give ROOT paths or --corpus-from-env")
    progress = (not args.json and sys.stderr.isatty()) if args.progress is None else args.progress
    rep = build_datastore(args.roots, args.out, tokenizer=args.tokenizer, filters=_filters(args),
                          corpus_from_env=args.corpus_from_env, progress=progress, max_tokens=args.max_tokens)
    for e in rep["errors"]:
        print(f"rest-index: warning: {e}", file=sys.stderr)
    if args.json:
        print(json.dumps(rep))
    else:
        print(f"{rep['out']}: {rep['documents']} documents, {rep['tokens']:,} tokens in {rep['shards']} shard(s) "
              f"in the tokenizer of {rep['tokenizer']['name']} ({rep['tokenizer']['vocab_size']:,} ids), "
              f"{rep['bytes_on_disk'] / 1e6:.1f} MB ({rep['bytes_per_token']} bytes/token); "
              f"{rep['seconds']:.1f} s (tokenize {rep['tokenize_s']:.1f} s, sort {rep['sort_s']:.1f} s)")
        if rep["skipped"]:
            print("skipped: " + ", ".join(f"{k} {v}" for k, v in sorted(rep["skipped"].items())))
        if rep["undecodable_chars"]:
            print(f"undecodable bytes replaced: {rep['undecodable_chars']}")
    return 0


def cmd_query(args) -> int:
    from .store import Datastore

    ds = Datastore.open(args.dir, tokenizer=args.tokenizer, auto_refresh=False)
    if args.tokens is not None:
        try:
            ids = [int(x) for x in args.tokens.split(",") if x.strip()]
        except ValueError:
            raise IndexerError(f"--tokens wants comma-separated integers, got {args.tokens!r}") from None
    else:
        ids = ds.tokenizer.encode(args.text, add_special_tokens=False).ids
    r = ds.search(ids, k=args.k, n_max=args.n_max, n_min=args.n_min, max_len=args.max_len)
    tok = None
    try:
        tok = ds.tokenizer
    except Exception as e:  # tokens-only queries still work without the tokenizer
        print(f"rest-index: warning: no tokenizer to decode with ({e})", file=sys.stderr)
    conts = [{"tokens": list(c.tokens), "text": tok.decode(list(c.tokens), skip_special_tokens=False) if tok else None,
              "count": c.count} for c in r.continuations[: args.limit]]
    out = {"match_len": r.match_len, "count": r.count, "continuations": conts}
    if args.json:
        print(json.dumps(out))
    else:
        print(f"match_len {r.match_len}, {r.count} occurrence(s), {len(r.continuations)} distinct continuation(s)")
        for c in conts:
            print(f"{c['count']:8d}  {c['text']!r}")
    return 0


def cmd_stats(args) -> int:
    from .store import Datastore

    ds = Datastore.open(args.dir, verify=args.verify, auto_refresh=False)
    s = ds.stats()
    if args.json:
        print(json.dumps(s))
    else:
        for k, v in s.items():
            print(f"{k}: {v}")
    return 0


def store_tokenizer(out) -> str | None:
    """The tokenizer an existing store at `out` was built with (what `load_tokenizer` takes), or None."""
    from .manifest import read_manifest
    from .tokenizer import EMBEDDED_NAME

    try:
        m = read_manifest(Path(out))
    except IndexerError:
        return None
    return m.get("tokenizer_source") or ("embedded" if m["tokenizer"].get("name") == EMBEDDED_NAME else None)


def cmd_watch(args) -> int:
    from .watch import watch_forever

    # an existing store keeps its own tokenizer (a default would rebuild a CodeLlama store in Qwen's vocabulary)
    tokenizer = args.tokenizer or store_tokenizer(args.out) or "embedded"
    watch_forever(args.roots, args.out, tokenizer=tokenizer, filters=_filters(args),
                  debounce_s=args.debounce_ms / 1000.0, verbose=not args.quiet)
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="rest-index", description="Suffix-array datastores for REST drafts.")
    sub = p.add_subparsers(dest="cmd", required=True)

    b = sub.add_parser("build", help="build a datastore from files")
    b.add_argument("roots", nargs="*", type=Path)
    b.add_argument("--out", required=True, type=Path)
    b.add_argument("--tokenizer", default="embedded", metavar="MODEL",
                   help="the model whose tokenizer the datastore uses: a model directory, .gguf file, hub id or "
                        "tokenizer.json; 'embedded' (the default) is the embedded Qwen2.5-Coder model")
    b.add_argument("--corpus-from-env", action="store_true",
                   help="index the Python standard library and this environment's site-packages")
    b.add_argument("--max-tokens", type=int, help="stop adding documents past this many tokens")
    b.add_argument("--json", action="store_true")
    b.add_argument("--progress", action="store_true", default=None)
    b.add_argument("--no-progress", dest="progress", action="store_false")
    _add_filter_args(b)
    b.set_defaults(func=cmd_build)

    q = sub.add_parser("query", help="look up the continuations of a context")
    q.add_argument("dir", type=Path)
    g = q.add_mutually_exclusive_group(required=True)
    g.add_argument("--text")
    g.add_argument("--tokens")
    q.add_argument("--k", type=int, default=5000)
    q.add_argument("--n-max", type=int, default=16)
    q.add_argument("--n-min", type=int, default=2)
    q.add_argument("--max-len", type=int, default=10)
    q.add_argument("--limit", type=int, default=20, help="continuations printed (default 20)")
    q.add_argument("--tokenizer", help="check the store against this tokenizer")
    q.add_argument("--json", action="store_true")
    q.set_defaults(func=cmd_query)

    s = sub.add_parser("stats", help="size and contents of a datastore")
    s.add_argument("dir", type=Path)
    s.add_argument("--json", action="store_true")
    s.add_argument("--verify", action="store_true", help="check every shard's checksum")
    s.set_defaults(func=cmd_stats)

    w = sub.add_parser("watch", help="keep a datastore current while files change")
    w.add_argument("roots", nargs="+", type=Path)
    w.add_argument("--out", required=True, type=Path)
    w.add_argument("--tokenizer", metavar="MODEL",
                   help="as for build (default: the tokenizer an existing store at --out was built with, else embedded)")
    w.add_argument("--debounce-ms", type=float, default=200.0)
    w.add_argument("--quiet", action="store_true")
    _add_filter_args(w)
    w.set_defaults(func=cmd_watch, corpus_from_env=False)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except IndexerError as e:
        print(f"rest-index: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
