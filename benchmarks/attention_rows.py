"""One layer's attention for a few query rows over a model-dtype KV cache: float64 (exact, what the packed verifier
used where torch's attention is not row-invariant), the model dtype's SDPA (not exact there), and the compiled tree
attention (rest_lsp/model/attention.py), built for this CPU and, with --march, for other targets' vector widths
(`haswell`: an AVX2-only CPU's 8 lanes; `x86-64`: 4). Median of --rounds rounds of --calls calls, interleaved
(`attention.interleaved_ms`, as the daemon times the kernel against float64 at first use).

    .venv/bin/python benchmarks/attention_rows.py                        # the 0.5B's and the 1.5B's heads
    .venv/bin/python benchmarks/attention_rows.py --march haswell,x86-64 --spans 1200
"""
from __future__ import annotations

import argparse
import functools
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

HEADS = {"0.5B": (14, 2, 64), "1.5B": (12, 2, 128)}


def main(argv: list[str] | None = None) -> dict:
    """Prints the table; returns {"arms": [...], "rows": [{"heads", "span", "ms": {arm: ms}}]}."""
    from rest_lsp.model import attention
    from rest_lsp.model.probes import attend

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--spans", default="700,1200,3000", help="cached tokens, comma list")
    ap.add_argument("--rows", type=int, default=4, help="query rows a call (a draft's nodes)")
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"])
    ap.add_argument("--march", default="", help="also the kernel built for these -march targets, comma list")
    ap.add_argument("--calls", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args(argv)
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32

    arms = {"float64": lambda q, k, v, m: attend(q, k, v, m, torch.float64),
            f"{args.dtype} SDPA": lambda q, k, v, m: attend(q, k, v, m, None)}
    for march in ["native", *filter(None, args.march.split(","))]:
        lib, tag = attention.build_library(march)
        kernel = attention.TreeAttention(lib, dtype, tag)
        arms[f"kernel {march}" + ("" if kernel.rows_alike() else " (rows differ!)")] = kernel
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {args.rows} rows, {args.dtype} cache; "
          f"ms a layer, median of {args.rounds} rounds of {args.calls} calls")
    print("| heads (q / kv, width) | cached tokens | " + " | ".join(arms) + " |")
    print("|---|---|" + "---|" * len(arms))
    g = torch.Generator().manual_seed(0)
    report: dict = {"arms": list(arms), "rows": []}
    for name, (nh, nkv, hd) in HEADS.items():
        for span in map(int, args.spans.split(",")):
            q = torch.randn(nh, args.rows, hd, generator=g).to(dtype)
            k, v = (torch.randn(nkv, span, hd, generator=g).to(dtype) for _ in range(2))
            mask = torch.ones(args.rows, span, dtype=torch.bool)
            ms = attention.interleaved_ms({a: functools.partial(fn, q, k, v, mask) for a, fn in arms.items()},
                                          rounds=args.rounds, calls=args.calls)
            report["rows"].append({"heads": name, "span": span, "ms": ms})
            cells = " | ".join(f"{m:.3f}" for m in ms.values())
            print(f"| {nh} / {nkv}, {hd} ({name}) | {span:,} | {cells} |", flush=True)
    return report


if __name__ == "__main__":
    main()
