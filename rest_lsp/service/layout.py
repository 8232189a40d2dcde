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
stays put while the user types. In the line layout the middle may also start some lines above the cursor (an
`Anchor`, kept per document while the person types below it): a new line then only appends to the middle,
and the suffix window is not computed again at every Enter. `auto` picks the family's cache-friendly layout
(docs/daemon.md: its quality against psm, and an anchored middle's against the cursor line alone, were
measured before it became the default: benchmarks/bench_layout.py).
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
    if layout == "spm":  # the text before the cursor ends the prompt: its open end is healed too
        m = _OPEN_END.search(window[window.rfind("\n") + 1:])
        cut = len(window) - (len(m.group(0)) if m else 0)
        return PromptParts(window[:cut], suffix, "", "spm", lead=window[cut:])
    nl = window.rfind("\n")
    start = len(ctx.prefix) - len(window)
    if anchor is not None and start <= anchor <= start + nl + 1 and (anchor == 0 or ctx.prefix[anchor - 1] == "\n"):
        nl = anchor - start - 1
    lines, middle = window[: nl + 1], window[nl + 1 :]
    m = _OPEN_END.search(middle)
    cut = m.start() if m else len(middle)
    return PromptParts(lines, suffix, middle[:cut], "psm", lead=middle[cut:])


@dataclass(frozen=True)
class Anchor:
    """Where the prompt's middle starts: a line start in the text before the cursor."""

    offset: int
    before: str  # the text just before it: an edit there means the place is not the same any more


def next_anchor(ctx: CompletionContext, previous: Anchor | None, max_lines: int, max_chars: int) -> Anchor:
    """The previous anchor while the cursor stays below it, within `max_lines` lines and `max_chars`
    characters of it, and the text before it is unchanged; else the start of the cursor's line."""
    line_start = ctx.prefix.rfind("\n") + 1
    if previous is not None and previous.offset <= line_start \
            and ctx.prefix[max(0, previous.offset - len(previous.before)):previous.offset] == previous.before \
            and ctx.prefix.count("\n", previous.offset, line_start) < max_lines \
            and len(ctx.prefix) - previous.offset <= max_chars:
        return previous
    return Anchor(line_start, ctx.prefix[max(0, line_start - 64):line_start])


def strip_lead(text: str, lead: str) -> str:
    """The output after the cursor, from an output that must start with `lead` (the prompt left it out):
    nothing while the output is still spelling it out, or when it does not start with it."""
    return text[len(lead):] if text.startswith(lead) else ""
