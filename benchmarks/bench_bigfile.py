"""Peak memory of indexing one big file: `rest-index build` with a raised --max-file-size.

    python benchmarks/bench_bigfile.py --mb 50 [--files 1] [--tokenizer PATH] [--json OUT] [--code CHECKOUT]

Writes MB megabytes of real Python source (this environment's standard library, repeated) into FILES files,
then builds a datastore of them in a fresh process and reports that process's peak RSS during the build
(VmHWM, reset through /proc/self/clear_refs once the tokenizer is loaded and has tokenized one 256 KB piece
of the source) over its RSS at that point, next to the target of
issue 12: at most 3x the token array, i.e. 3 x tokens x the store's token width in bytes. Work files go
under .bench/bigfile (ignored by git).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's packages, not an editable install's
sys.path.insert(0, str(ROOT / "benchmarks"))

from report import write_json  # noqa: E402

CHILD = r"""
import json, sys, time
sys.path.insert(0, sys.argv[1])
from indexer.build import build_datastore
from indexer.discover import Filters
from indexer.layout import width_for_vocab
from indexer.tokenizer import encode_batch, fingerprint, load_tokenizer

def status_kb(key):
    for line in open("/proc/self/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1])

tok = load_tokenizer(sys.argv[4] or None)
# the tokenizer's caches and thread pool fill on first use and stay bounded: part of the baseline
encode_batch(tok, [open(sys.argv[5]).read(1 << 18)])
base = status_kb("VmRSS")
# the high-water mark so far includes parsing tokenizer.json (tens of MB, freed since): start it afresh
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")
t = time.perf_counter()
rep = build_datastore([sys.argv[2]], sys.argv[3], tokenizer=tok,
                      filters=Filters(max_file_size=10**8, languages=None))   # --max-file-size 1e8
peak = status_kb("VmHWM")
print(json.dumps({"baseline_kb": base, "peak_kb": peak, "tokens": rep["tokens"], "documents": rep["documents"],
                  "seconds": round(time.perf_counter() - t, 1), "width": width_for_vocab(fingerprint(tok)["vocab_size"]),
                  "bytes_on_disk": rep["bytes_on_disk"]}))
"""


def write_source(folder: Path, mb: float, files: int) -> int:
    """`files` .py files totalling `mb` megabytes of standard-library source; returns the bytes written."""
    std = Path(sysconfig.get_paths()["stdlib"])
    parts, size = [], 0
    for p in sorted(std.glob("*.py")):
        text = p.read_text(encoding="utf-8", errors="replace")
        parts.append(text)
        size += len(text.encode())
        if size > 4 << 20:
            break
    unit = "".join(parts).encode()
    target = int(mb * 1e6)
    folder.mkdir(parents=True, exist_ok=True)
    per = target // files
    for i in range(files):
        with open(folder / f"big_{i}.py", "wb") as f:
            left = per
            while left > 0:
                f.write(unit[:left])
                left -= min(left, len(unit))
    return per * files


def measure(mb: float, files: int = 1, tokenizer: str | None = None, work: Path | None = None,
            code: Path = ROOT) -> dict:
    work = work or ROOT / ".bench" / "bigfile"
    src, out = work / f"src-{mb}-{files}", work / f"ds-{mb}-{files}"
    written = write_source(src, mb, files)
    r = subprocess.run([sys.executable, "-c", CHILD, str(code), str(src), str(out), tokenizer or "",
                        str(next(src.glob("*.py")))],
                       capture_output=True, text=True, check=True, env={**os.environ, "TOKENIZERS_PARALLELISM": "true"})
    rep = json.loads(r.stdout.strip().splitlines()[-1])
    over = (rep["peak_kb"] - rep["baseline_kb"]) * 1024
    token_bytes = rep["tokens"] * rep["width"]
    return {**rep, "mb": mb, "files": files, "file_bytes": written, "peak_over_baseline_mb": round(over / 2**20, 1),
            "bytes_per_token_over_baseline": round(over / rep["tokens"], 2),
            "target_mb": round(3 * token_bytes / 2**20, 1), "within_target": over <= 3 * token_bytes}


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mb", type=float, default=50.0)
    p.add_argument("--files", type=int, default=1)
    p.add_argument("--tokenizer", default=None, help="tokenizer.json or model dir (default: the embedded model's)")
    p.add_argument("--json", default=None)
    p.add_argument("--code", type=Path, default=ROOT, help="the checkout whose indexer runs (a 'before' figure)")
    args = p.parse_args(argv)
    rep = measure(args.mb, args.files, args.tokenizer, code=args.code)
    print(f"{rep['files']} file(s), {rep['file_bytes'] / 1e6:.1f} MB, {rep['tokens']:,} tokens (width "
          f"{rep['width']}): peak RSS {rep['peak_over_baseline_mb']} MB over the baseline "
          f"({rep['bytes_per_token_over_baseline']} bytes/token); target <= {rep['target_mb']} MB "
          f"(3 x tokens x width): {'met' if rep['within_target'] else 'NOT met'}; build {rep['seconds']} s")
    if args.json:
        write_json(args.json, rep, indent=2)
    return rep


if __name__ == "__main__":
    main()
