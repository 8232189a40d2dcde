"""What one forward's linear layers cost on this CPU per precision path, for decoding (1 row), a draft tree
(8 rows) and a prefill chunk (256 rows): fp32, bf16, int8 with one activation scale per call
(`torch.ao.quantization.quantize_dynamic`, what `precision: int8` ran before rest_lsp/model/int8row.py) and int8
with one activation scale per row (`torch._int_mm` on row-quantized activations: batch-invariant, so it can
verify draft trees exactly; what `precision: int8` runs now, with oneDNN's prepacked product for 2+ rows).

    .venv/bin/python benchmarks/precision_paths.py [--model embedded|DIR] [--threads 2] [--repeat 20]
        [--json OUT]

The shapes are the model's own (every layer's q/k/v/o, gate/up/down and the LM head), taken from its config;
the weights are random (the cost of a matmul does not depend on its values). Prints ms per forward (all
layers) per path and row count, the median of --repeat.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's packages, not an editable install's


def shapes(config) -> list[tuple[int, int, int]]:
    """(in, out, times per forward) of the linear layers of a Llama/Qwen2-style decoder."""
    h, inter, layers = config.hidden_size, config.intermediate_size, config.num_hidden_layers
    heads = config.num_attention_heads
    kv = getattr(config, "num_key_value_heads", heads) * (h // heads)
    return [(h, h, layers), (h, kv, 2 * layers), (h, h, layers), (h, inter, 2 * layers), (inter, h, layers),
            (h, config.vocab_size, 1)]


def row_quant(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[m, k] float -> int8 [m, k] and its per-row scale [m, 1]: each row's scale from its own values."""
    scale = x.abs().amax(dim=1, keepdim=True).clamp(min=1e-8) / 127.0
    return torch.round(x / scale).clamp(-127, 127).to(torch.int8), scale


class RowInt8Linear:
    """y = (q(x) @ W_q^T) * s_x * s_w with per-row activation scales and per-output-channel weight scales."""

    def __init__(self, w: torch.Tensor):
        self.w_scale = (w.abs().amax(dim=1).clamp(min=1e-8) / 127.0)  # [out]
        self.w_t = torch.round(w / self.w_scale[:, None]).clamp(-127, 127).to(torch.int8).t().contiguous()  # [in, out]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        q, s = row_quant(x)
        return torch._int_mm(q, self.w_t).to(torch.float32) * s * self.w_scale


def time_path(fn, x: torch.Tensor, repeat: int) -> float:
    fn(x)
    ts = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn(x)
        ts.append(time.perf_counter() - t)
    return statistics.median(ts) * 1000


def measure(config, rows: list[int], repeat: int) -> dict:
    out: dict = {}
    for m in rows:
        total = {"fp32": 0.0, "bf16": 0.0, "int8 per call": 0.0, "int8 per row": 0.0}
        for k, n, times in shapes(config):
            w = torch.randn(n, k) * 0.02
            x = torch.randn(m, k)
            lin = torch.nn.Linear(k, n, bias=False)
            lin.weight.data = w
            dyn = torch.ao.quantization.quantize_dynamic(torch.nn.Sequential(lin), {torch.nn.Linear},
                                                         dtype=torch.qint8)
            wb, xb = w.to(torch.bfloat16), x.to(torch.bfloat16)
            row = RowInt8Linear(w)
            with torch.inference_mode():
                total["fp32"] += times * time_path(lambda a: a @ w.t(), x, repeat)
                total["bf16"] += times * time_path(lambda a: a @ wb.t(), xb, repeat)
                total["int8 per call"] += times * time_path(dyn, x, repeat)
                try:
                    total["int8 per row"] += times * time_path(row, x, repeat)
                except RuntimeError as exc:  # _int_mm's shape rules differ per backend and version
                    total["int8 per row"] = float("nan")
                    print(f"int8 per row unavailable for m={m}: {exc}", file=sys.stderr)
        out[m] = {name: round(ms, 2) for name, ms in total.items()}
        print(f"rows {m:4d}: " + "  ".join(f"{name} {ms:8.2f} ms" for name, ms in out[m].items()), file=sys.stderr)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="embedded", help="'embedded' (Qwen2.5-Coder-0.5B's shapes) or a model dir")
    p.add_argument("--rows", default="1,8,256")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeat", type=int, default=20)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.model == "embedded":
        from transformers import Qwen2Config
        config = Qwen2Config(hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                             num_attention_heads=14, num_key_value_heads=2, vocab_size=151936)
    else:
        from transformers import AutoConfig
        config = AutoConfig.from_pretrained(args.model)
    report = {"command": " ".join(sys.argv), "threads": args.threads, "torch": torch.__version__,
              "ms_per_forward": measure(config, [int(r) for r in args.rows.split(",")], args.repeat)}
    if args.json:
        from restbase.storage import write_bytes_atomic
        write_bytes_atomic(args.json, json.dumps(report, indent=1).encode())
    return 0


if __name__ == "__main__":
    sys.exit(main())
