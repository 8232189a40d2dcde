"""Prompt layouts: how the text around the cursor is cut into the prompt's parts.

A person typing changes the text at the cursor, and every prompt token after the first changed one has to be
computed again (several ms per token on a CPU). The layouts differ in what a keystroke invalidates:

    psm    [PRE] window before the cursor [SUF] window after [MID]
           every keystroke changes the prefix's end, so the whole suffix window is computed again each time
    line   [PRE] the lines above the cursor line [SUF] rest of the line + lines below [MID] the cursor line
           before the cursor (the layout llama.vim uses with Qwen2.5-Coder): typing on a line changes only the
           last few tokens; a new line recomputes that line and the suffix window once. The cursor line's last
           word (with the space before it) or last space is left out of the prompt and the output must start
           with it (token healing, rest_lsp/engine/vocab.py): a prompt cut inside a word or after a space ends
           where the tokenizer never cut in training (" return" is one token), and the model then continues
           badly. It also leaves the prompt unchanged while a word is typed: no prompt token to compute
    spm    [PRE][SUF] window after [MID] window before the cursor (suffix first, for families trained on it:
           CodeLlama, StarCoder): typing appends to the prompt's end; only an edit after the cursor recomputes

The prefix window starts at a stable line boundary (rest_lsp/service/prompt.py), so the start of the prompt
stays put while the user types. `auto` picks the family's cache-friendly layout (docs/daemon.md: its quality
against psm was measured before it became the default).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from .prompt import CompletionContext

LAYOUTS = ("auto", "line", "psm", "spm")
# The end of a line the tokenizer would join to what follows: a word with the space before it, or a space.
_OPEN_END = re.compile(r"(?:[^\S\n]?\w+|[^\S\n])$")


@dataclass(frozen=True)
class PromptParts:
    prefix: str  # before the suffix marker (psm, line) or after the middle marker (spm)
    suffix: str
    middle: str  # text the infill starts with, after the middle marker (the cursor line, in `line`)
    order: str  # "psm" | "spm"
    lead: str = ""  # text left out of the prompt's end: the output must start with it, and it is taken off


def resolve_layout(layout: str, orders: tuple[str, ...] = ("psm",)) -> str:
    """The layout in effect: `auto` is `line` (every family supports it); `spm` needs a family trained on
    it (`orders`: the FIM format's supported orders)."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {', '.join(LAYOUTS)}, got {layout!r}")
    if layout == "auto":
        return "line"
    if layout == "spm" and "spm" not in orders:
        return "line"
    return layout


def prompt_parts(ctx: CompletionContext, layout: str, max_prefix_chars: int, max_suffix_chars: int,
                 anchor: int | None = None) -> PromptParts:
    """The prompt's text parts for the cursor of `ctx` (layout: psm, line or spm, already resolved).

    anchor (line): the offset in ctx.prefix of a line start above the cursor where the middle begins (the
    lines typed since stay in the middle, so a new line costs no recomputation of the suffix); None or
    outside the prompt window: the cursor line's start."""
    window = ctx.prompt_prefix(max_prefix_chars)
    suffix = ctx.prompt_suffix(max_suffix_chars)
    if layout == "psm":
        return PromptParts(window, suffix, "", "psm")
    if layout == "spm":
        return PromptParts(window, suffix, "", "spm")
    nl = window.rfind("\n")
    start = len(ctx.prefix) - len(window)
    if anchor is not None and start <= anchor <= start + nl + 1 and (anchor == 0 or ctx.prefix[anchor - 1] == "\n"):
        nl = anchor - start - 1
    lines, middle = window[: nl + 1], window[nl + 1 :]
    m = _OPEN_END.search(middle)
    cut = m.start() if m else len(middle)
    return PromptParts(lines, suffix, middle[:cut], "psm", lead=middle[cut:])


def strip_lead(text: str, lead: str) -> str:
    """The output after the cursor, from an output that must start with `lead` (the prompt left it out):
    nothing while the output is still spelling it out, or when it does not start with it."""
    return text[len(lead):] if text.startswith(lead) else ""
