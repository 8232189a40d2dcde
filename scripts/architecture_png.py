"""Draw docs/architecture.png, the one picture of how a completion flows through rest-lsp.

    .venv/bin/python scripts/architecture_png.py [OUT]     # matplotlib (the `dev`/`bench` extras)

The boxes are the module areas of docs/ARCHITECTURE.md; an arrow is a call (and the data it carries) from
the caller (the model's verifiers implement the engine's Verifier protocol: the engine calls them
without importing the model package). Regenerate after changing the areas or what they may import.
"""
from __future__ import annotations

import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch  # noqa: E402

OUT = Path(__file__).resolve().parents[1] / "docs" / "architecture.png"

# name: (x, y, width, height, title, lines, colour)
BOXES = {
    "editor": (0.2, 7.6, 3.2, 1.3, "editors/", ["VS Code extension, Neovim plugin", "ghost text, rest/cursor"], "#eeeeee"),
    "server": (4.6, 7.6, 3.6, 1.3, "rest_lsp/server.py", ["pygls: one handler per LSP message",
                                                          "(+ transport.py, documents.py)"], "#dbe9f6"),
    "bench": (9.4, 7.6, 3.2, 1.3, "rest_lsp/bench/", ["rest-lsp bench / replay", "(ar, pld, rest, ...)"], "#f2f2f2"),
    "service": (4.6, 4.9, 3.6, 1.9, "rest_lsp/service/", ["core: requests, budgets, supersession",
                                                           "worker: prioritised inference thread",
                                                           "prediction, prompt, layout",
                                                           "workspace: index, watch, live buffers"], "#dbe9f6"),
    "engine": (4.6, 2.2, 3.6, 2.0, "rest_lsp/engine/", ["generate: Engine.start/advance (runs)",
                                                         "drafter + sources -> draft tree",
                                                         "verifier protocol, tree attention",
                                                         "kvpool, cost c(q), history"], "#fde9d9"),
    "model": (9.4, 2.2, 3.2, 2.0, "rest_lsp/model/", ["host: load_model (dir, hub, GGUF)",
                                                       "precision, FIM prompts",
                                                       "fast / static verifiers"], "#fde9d9"),
    "indexer": (0.2, 2.2, 3.2, 2.0, "indexer/", ["Datastore: suffix-array shards",
                                                  "search(context) -> continuations",
                                                  "build, watch, live shards", "no torch"], "#e2f0d9"),
    "storage": (3.2, 0.1, 6.4, 1.2, "restbase/ + restbase/assets.py", ["cache root, file locks, atomic writes,",
                                                                       "compiled loops; the embedded model's files"],
                "#f2f2f2"),
}

# (from, (side, fraction along it), to, (side, fraction), label, label offset)
ARROWS = [
    ("editor", ("right", 0.5), "server", ("left", 0.5), "LSP (stdio)", (-0.5, 0.12)),
    ("server", ("bottom", 0.5), "service", ("top", 0.5), "CompletionRequest", (0.1, 0.0)),
    ("service", ("bottom", 0.5), "engine", ("top", 0.5), "start / advance runs", (0.1, 0.0)),
    ("engine", ("left", 0.5), "indexer", ("right", 0.5), "search: drafts", (-0.5, 0.15)),
    ("engine", ("right", 0.5), "model", ("left", 0.5), "forward(tree)", (-0.47, 0.15)),
    ("service", ("left", 0.5), "indexer", ("top", 0.6), "build, set_live", (-1.3, 0.1)),
    ("service", ("right", 0.5), "model", ("top", 0.3), "load_model", (0.15, 0.1)),
    ("bench", ("bottom", 0.6), "model", ("top", 0.6), "load_model, Engine", (0.1, 0.4)),
    ("indexer", ("bottom", 0.5), "storage", ("left", 0.5), "", (0, 0)),
    ("model", ("bottom", 0.5), "storage", ("right", 0.5), "", (0, 0)),
]


def anchor(box, where):
    x, y, w, h = BOXES[box][:4]
    side, f = where
    return {"left": (x, y + h * f), "right": (x + w, y + h * f), "top": (x + w * f, y + h),
            "bottom": (x + w * f, y)}[side]


def draw(out: Path = OUT) -> Path:
    fig, ax = plt.subplots(figsize=(11, 8))
    ax.set_xlim(0, 12.8)
    ax.set_ylim(0, 9.2)
    ax.axis("off")
    for x, y, w, h, title, lines, colour in BOXES.values():
        ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.05", fc=colour, ec="#333333", lw=1.2))
        ax.text(x + w / 2, y + h - 0.22, title, ha="center", va="top", fontsize=10.5, weight="bold",
                family="monospace")
        ax.text(x + w / 2, y + h - 0.55, "\n".join(lines), ha="center", va="top", fontsize=8.5, linespacing=1.35)
    for a, sa, b, sb, label, (dx, dy) in ARROWS:
        p, q = anchor(a, sa), anchor(b, sb)
        ax.add_patch(FancyArrowPatch(p, q, arrowstyle="-|>", mutation_scale=14, lw=1.3, color="#444444",
                                     connectionstyle="arc3,rad=0.0"))
        if label:
            ax.text((p[0] + q[0]) / 2 + dx, (p[1] + q[1]) / 2 + dy, label, fontsize=8, style="italic",
                    color="#1f3b70")
    ax.set_title("rest-lsp: a completion request, top to bottom (arrows: who calls whom)", fontsize=11)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=80, bbox_inches="tight")
    plt.close(fig)
    return out


if __name__ == "__main__":
    print(draw(Path(sys.argv[1]) if len(sys.argv) > 1 else OUT))
