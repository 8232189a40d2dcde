"""Per-row int8 against bf16 and fp32 on a whole model, through the verifier the daemon uses (`auto`):
what `precision.choose` times (a 64-token prompt chunk after 300 cached tokens, one-token steps) and the cost
curve c(q) of verifying q tokens at once after 300 cached tokens (c(8)/c(1) is what speculation pays).

    .venv/bin/python benchmarks/precision_int8.py [--model embedded|DIR] [--threads 2] [--repeat 7]
        [--variants fp32,bf16,int8,int8-fp32-head] [--json OUT]

Variants: fp32 (screened fp32 head on a CPU with native bf16), bf16 (packed bf16), int8 (rest_lsp/model/
int8row.py, decoder and LM head), int8-fp32-head (int8 decoder, fp32 screened head). Prints one line per
variant; `completion_ms` = prompt chunk + precision.STEPS_PER_COMPLETION steps (what `auto` compares).
"""
from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's packages, not an editable install's


def cost_curve(verifier, vocab: int, qs: list[int], repeat: int) -> dict[int, float]:
    """ms of a forward of q chain tokens after 300 cached ones (median of `repeat`), cache restored after each."""
    from rest_lsp.engine.verifier import chain_mask

    g = torch.Generator().manual_seed(1)
    verifier.truncate(0)
    verifier.forward(torch.randint(0, vocab, (300,), generator=g), torch.arange(300), chain_mask(300), rows=[299],
                     prompt=True)
    out = {}
    for q in qs:
        ts = []
        for _ in range(repeat + 1):
            t = time.perf_counter()
            verifier.forward(torch.randint(0, vocab, (q,), generator=g), torch.arange(q), chain_mask(q))
            ts.append((time.perf_counter() - t) * 1000)
            verifier.truncate(300)
        out[q] = round(statistics.median(ts[1:]), 1)
    verifier.truncate(0)
    return out


def variant(loaded, name: str):
    from rest_lsp.model.int8row import quantize_model

    if name == "fp32":
        return loaded.model
    model = copy.deepcopy(loaded.model)
    if name == "bf16":
        return model.to(torch.bfloat16)
    if name == "int8":
        return quantize_model(model, head=True)
    if name == "int8-fp32-head":
        return quantize_model(model, head=False)
    raise ValueError(name)


def main(argv: list[str] | None = None) -> int:
    from rest_lsp.model.host import load_model
    from rest_lsp.model.precision import completion_ms, time_forwards
    from rest_lsp.model.verifiers import make_verifier_or_eager, verifier_kind

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="embedded")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeat", type=int, default=7)
    p.add_argument("--qs", default="1,4,8,16")
    p.add_argument("--variants", default="fp32,bf16,int8,int8-fp32-head")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    loaded = load_model(None if args.model == "embedded" else args.model, device="cpu", precision="fp32")
    qs = [int(q) for q in args.qs.split(",")]
    report = {"command": " ".join(sys.argv), "threads": args.threads, "torch": torch.__version__, "variants": {}}
    for name in args.variants.split(","):
        model = variant(loaded, name)
        verifier = make_verifier_or_eager(model, "auto", max_len=512)
        tf = time_forwards(verifier, loaded.vocab_size)
        curve = cost_curve(verifier, loaded.vocab_size, qs, args.repeat)
        row = {"kind": verifier_kind(verifier), **tf, "completion_ms": round(completion_ms(tf), 1),
               "c_ms": curve, "c_ratio": {q: round(curve[q] / curve[qs[0]], 2) for q in qs}}
        report["variants"][name] = row
        print(f"{name:15s} {row['kind']:9s} chunk {tf['prompt_chunk_ms']:7.1f} ms ({tf['prompt_ms_per_token']:.2f}/tok)"
              f"  step {tf['step_ms']:6.1f} ms  completion {row['completion_ms']:7.1f} ms  c(q) "
              + " ".join(f"{q}:{curve[q]}" for q in qs) + "  c(q)/c(1) "
              + " ".join(f"{q}:{row['c_ratio'][q]}" for q in qs), flush=True)
        del verifier
        if model is not loaded.model:
            del model
    if args.json:
        from restbase.storage import write_bytes_atomic
        write_bytes_atomic(args.json, json.dumps(report, indent=1).encode())
    return 0


if __name__ == "__main__":
    sys.exit(main())
