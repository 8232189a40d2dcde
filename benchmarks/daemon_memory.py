"""The memory a daemon holds: a real `rest-lsp --stdio` (benchmarks/lsp_client.py) per model and precision,
initialized on a workspace, asked for one completion, left until quiet, then read from /proc: anonymous memory
(what the process allocated: weights, caches, the index), file-backed memory (mapped files: libraries, the
converted model's safetensors that a model loaded in fp32 still views; clean pages the kernel may drop and read
again) and USS (psutil: the pages only this process holds, both kinds).

    .venv/bin/python benchmarks/daemon_memory.py          # the embedded 0.5B at bf16, the 1.5B at int4w
    .venv/bin/python benchmarks/daemon_memory.py --models qwen2.5-coder-0.5b@auto --json mem.json

The daemons use the user's cache (the converted models, a cached `precision: auto` choice), no history file.
Figures: docs/results/memory.md.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's packages, not an editable install's
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_typing import wait_quiet  # noqa: E402
from lsp_client import Server  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
GIB = 1 << 30


def process_memory(pid: int) -> dict:
    """GiB of anonymous and file-backed resident memory (/proc/PID/status) and USS (psutil)."""
    import psutil   # installed with accelerate, a dependency of the project

    status = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    kib = {k: int(status[k].split()[0]) for k in ("RssAnon", "RssFile")}
    return {"anon_gib": round(kib["RssAnon"] / (1 << 20), 2), "file_gib": round(kib["RssFile"] / (1 << 20), 2),
            "uss_gib": round(psutil.Process(pid).memory_full_info().uss / GIB, 2)}


async def measure(model: str, precision: str, workspace: Path, file: str, position: tuple[int, int],
                  log_dir: Path) -> dict:
    server = Server(log_dir / f"{model}@{precision}")
    await server.start()
    try:
        t0 = time.perf_counter()
        await server.initialize({"model": model, "precision": precision, "persistHistory": False}, [workspace])
        st = await server.wait_ready(workspace=True)
        ready_s = time.perf_counter() - t0
        path = workspace / file
        uri = path.as_uri()
        server.open(uri, path.read_text())
        items = await server.complete(uri, *position, invoked=True)
        text = (getattr(items, "items", None) or [None])[0]
        await wait_quiet(server, quiet_s=1.0, cap_s=30.0)   # its background work (predictions, warm-up) done
        model_st = (await server.stats()).get("model") or st.get("model") or {}
        return {"model": model, "precision": precision, "chosen": model_st.get("precision"),
                "verifier": model_st.get("verifier"), "ready_s": round(ready_s, 1),
                "completed": text is not None, **process_memory(server.proc.pid)}
    finally:
        await server.close()


def table(rows: list[dict]) -> str:
    out = ["| model | precision (chosen) | verifier | anonymous GiB | file-backed GiB | USS GiB | ready s |",
           "|---|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['model']} | {r['precision']} ({r['chosen']}) | {r['verifier']} | {r['anon_gib']} | "
                   f"{r['file_gib']} | {r['uss_gib']} | {r['ready_s']} |")
    return "\n".join(out)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="qwen2.5-coder-0.5b@bf16,qwen2.5-coder-1.5b@int4w",
                   help="comma list of MODEL@PRECISION (the daemon's `model` and `precision` settings)")
    p.add_argument("--workspace", default=str(ROOT / "examples"))
    p.add_argument("--file", default="inventory.py", help="the file completed once, relative to the workspace")
    p.add_argument("--position", default="46:8", help="LINE:CHARACTER, 0-based (the README's first completion)")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    line, character = (int(x) for x in args.position.split(":"))
    rows = []
    with tempfile.TemporaryDirectory(prefix="rest-lsp-memory.") as tmp:
        for spec in args.models.split(","):
            model, _, precision = spec.partition("@")
            rows.append(asyncio.run(measure(model, precision or "auto", Path(args.workspace), args.file,
                                            (line, character), Path(tmp))))
            print(json.dumps(rows[-1]), file=sys.stderr)
    print(table(rows))
    if args.json:
        Path(args.json).write_text(json.dumps({"command": " ".join(sys.argv), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
