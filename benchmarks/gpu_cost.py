"""c(q) for a model *shape* with random weights (no download), on a GPU, and what it makes of REST's drafts.

The verification cost curve of CodeLlama-7B shapes in bf16 through the engine's tree verifiers, each with a
tree mask, position ids by depth and the KV cache kept between calls:
    eager        transformers' own forward (HFVerifier; SDPA attention, a DynamicCache)
    static       rest_lsp/model/static.py, what the daemon uses on a GPU: a static KV cache, fixed-size row
                 pieces and float64 attention (batch-invariant, so REST is bit-exact), CUDA graphs
    static-lowp  the same with attention in the model's dtype: what the exactness of `static` costs
and the projected speedup M / (c(q)/c(1)) for the draft sizes a replay measured. Timing synchronises the
device around every forward. Part of benchmarks/gpu_check.sh; alone:

    python benchmarks/gpu_cost.py --shape codellama-7b --device cuda --replay benchmarks/replay-humaneval-cpu.json \
        --json gpu-cost.json

`--replay` takes a `rest-lsp replay --json` report (M per draft budget; a budget of n nodes verifies n + 1
tokens). `--shape tiny --device cpu` runs the same code in seconds (the test suite does).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # cost_curve.py, its neighbour

SHAPES = {  # LlamaConfig fields; vocab and sizes as the published configs
    "codellama-7b": dict(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32,
                         num_key_value_heads=32, vocab_size=32016, max_position_embeddings=16384,
                         rope_theta=1_000_000.0),
    "codellama-13b": dict(hidden_size=5120, intermediate_size=13824, num_hidden_layers=40, num_attention_heads=40,
                          num_key_value_heads=40, vocab_size=32016, max_position_embeddings=16384,
                          rope_theta=1_000_000.0),
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=512, max_position_embeddings=2048),
}
QS = (1, 2, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128)
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def random_model(shape: str, device: str, dtype: torch.dtype) -> torch.nn.Module:
    """A Llama causal LM of the named shape, random weights, built directly on the device in `dtype`."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(**SHAPES[shape], attn_implementation="sdpa")
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = LlamaForCausalLM(config)
    finally:
        torch.set_default_dtype(old)
    return model.eval()


KINDS = ("eager", "static", "static-lowp")


def make_verifiers(model: torch.nn.Module, kinds, max_len: int) -> dict:
    from rest_lsp.engine.verifier import HFVerifier
    from rest_lsp.model.static import StaticVerifier

    make = {"eager": lambda: HFVerifier(model),
            "static": lambda: StaticVerifier(model, max_len=max_len),
            "static-lowp": lambda: StaticVerifier(model, max_len=max_len, attention_dtype=next(model.parameters()).dtype)}
    return {k: make[k]() for k in kinds}


def device_sync(device: str):
    """What waits for the device before and after a timed forward (a GPU runs asynchronously)."""
    return torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)


@torch.inference_mode()
def cost_curve(verifiers: dict, vocab: int, device: str, qs, past: int, repeats: int) -> dict[str, dict[int, float]]:
    """Median ms of one q-token tree verification after a `past`-token cache, per verifier and q: cost_curve.py's
    round-robin loop, waiting for the device around every forward."""
    from cost_curve import cost_curves

    return cost_curves(verifiers, vocab, qs, past, repeats, sync=device_sync(device))


@torch.inference_mode()
def prefill_ms(verifiers: dict, vocab: int, device: str, past: int, repeats: int) -> dict[str, float]:
    """Median ms to compute a `past`-token prompt into an empty cache, per verifier: what a new cross-file block
    (or a new document) costs in the background before its first step. A first untimed prefill captures the
    pieces' CUDA graphs, which a daemon does once per span, not once per block."""
    from cost_curve import prefill

    sync = device_sync(device)
    context = torch.randint(0, vocab, (past,), generator=torch.Generator().manual_seed(1))
    times: dict[str, list[float]] = {k: [] for k in verifiers}
    for r in range(repeats + 1):
        for k, v in verifiers.items():
            sync()
            t = time.perf_counter()
            prefill(v, context)
            sync()
            if r:
                times[k].append((time.perf_counter() - t) * 1e3)
    return {k: statistics.median(ts) for k, ts in times.items()}


def projected(ms: dict[int, float], replay: dict) -> list[dict]:
    """Per policy and budget of a replay report: M, q = nodes + 1 (auto: at its mean tree size), c(q)/c(1) and
    M / (c(q)/c(1)); budgets beyond the largest measured q are left out rather than extrapolated."""
    from rest_lsp.engine.cost import CostModel

    qs = sorted(ms)
    c = CostModel(qs, [ms[q] for q in qs])  # linear between measured sizes
    rows = []
    for r in replay.get("results", []):
        nodes = r["mean_tree_nodes"] if r["budget"] == "auto" else r["budget"]
        if r.get("mean_accepted") is None or nodes is None or nodes + 1 > qs[-1]:
            continue
        ratio = c(nodes + 1) / ms[qs[0]]
        rows.append({"policy": r["policy"], "budget": r["budget"], "q": nodes + 1, "M": r["mean_accepted"],
                     "cost_ratio": ratio, "projected_speedup": r["mean_accepted"] / ratio})
    return rows


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", choices=sorted(SHAPES), default="codellama-7b")
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    p.add_argument("--kinds", default=",".join(KINDS), help=f"verifiers to time, from {','.join(KINDS)}")
    p.add_argument("--qs", default=None, help=f"comma list of q (default {','.join(map(str, QS))})")
    p.add_argument("--past", default="300,1000", help="comma list of cached tokens before each forward")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--replay", default=None, help="a `rest-lsp replay --json` report: projected speedups")
    p.add_argument("--prefill", action="store_true",
                   help="also time the prefill of each --past prompt into an empty cache (a new block's cost)")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        sys.exit("gpu_cost.py: no CUDA device here (use --device cpu --shape tiny to try the script)")
    qs = tuple(int(x) for x in args.qs.split(",")) if args.qs else QS
    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    if not kinds or any(k not in KINDS for k in kinds):
        sys.exit(f"gpu_cost.py: --kinds takes some of {', '.join(KINDS)}, got {args.kinds!r}")
    pasts = [int(x) for x in args.past.split(",")]
    t = time.perf_counter()
    model = random_model(args.shape, args.device, DTYPES[args.dtype])
    name = torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu"
    print(f"{args.shape} ({sum(x.numel() for x in model.parameters()) / 1e9:.2f}B parameters, {args.dtype}) "
          f"on {name}: built in {time.perf_counter() - t:.1f} s; torch {torch.__version__}", flush=True)
    report = {"shape": args.shape, "config": SHAPES[args.shape], "dtype": args.dtype, "device": name,
              "torch": torch.__version__, "repeats": args.repeats, "kinds": kinds, "curves": {}}
    verifiers = make_verifiers(model, kinds, max_len=max(pasts) + max(qs) + 64)
    replay = json.loads(Path(args.replay).read_text()) if args.replay else None
    for past in pasts:
        curves = cost_curve(verifiers, model.config.vocab_size, args.device, qs, past, args.repeats)
        report["curves"][str(past)] = {}
        if args.prefill:
            pre = prefill_ms(verifiers, model.config.vocab_size, args.device, past, args.repeats)
            report.setdefault("prefill_ms", {})[str(past)] = pre
            print(f"prefill of {past} tokens: " + ", ".join(f"{k} {v:.1f} ms" for k, v in pre.items()), flush=True)
        print(f"\nc(q) ms after {past} cached tokens (ratio to q={qs[0]}):")
        print("| verifier | " + " | ".join(f"q={q}" for q in qs) + " |\n|---|" + "---|" * len(qs))
        for kind, ms in curves.items():
            report["curves"][str(past)][kind] = {"ms": ms, "ratio": {q: ms[q] / ms[qs[0]] for q in qs}}
            print(f"| {kind} | " + " | ".join(f"{ms[q]:.2f} ({ms[q] / ms[qs[0]]:.2f})" for q in qs) + " |",
                  flush=True)
        if replay is not None:
            print(f"\nprojected speedup M / (c(q)/c(1)) after {past} cached tokens ({replay.get('source', args.replay)}):")
            print("| verifier | policy | budget | q | M | c(q)/c(1) | projected |\n|---|---|---|---|---|---|---|")
            for kind, ms in curves.items():
                rows = projected(ms, replay)
                report["curves"][str(past)][kind]["projected"] = rows
                for r in rows:
                    print(f"| {kind} | {r['policy']} | {r['budget']} | {r['q']:.1f} | {r['M']:.2f} | "
                          f"{r['cost_ratio']:.2f} | {r['projected_speedup']:.2f}x |")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
        print(f"\nwrote {args.json}")
    return report


if __name__ == "__main__":
    main()
