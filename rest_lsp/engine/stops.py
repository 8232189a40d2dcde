"""Stop rules for completions: max tokens, end of sequence, time, lines, the infill's suffix, cancellation.

Checked between decoding steps. A step may emit several tokens at once, so each rule also says where
inside the output to cut: the result holds exactly the tokens and text before the stop.
"""
from __future__ import annotations

import time
from typing import Callable


def lines_cut(text: str, max_lines: int) -> int | None:
    """Where the text ends after max_lines lines (before the max_lines-th newline that follows visible
    text; leading blank lines do not count), or None if it is shorter."""
    first = len(text) - len(text.lstrip())
    seen = 0
    pos = text.find("\n", first)
    while pos != -1:
        seen += 1
        if seen >= max_lines:
            return pos
        pos = text.find("\n", pos + 1)
    return None


def suffix_cut(text: str, suffix: str) -> int | None:
    """Where the output starts repeating the infill's suffix, or None.

    - The suffix continues the cursor's line (its first line has text, e.g. `)` after `print(|`): a complete
      first output line that ends with that text is cut before it.
    - Otherwise, a complete output line equal (ignoring indentation) to the suffix's first non-blank line is
      cut at its start, with the blank space before it that the suffix's own leading line breaks supply.
    Only complete lines (a newline after them) count, so a line still being written is never cut.
    """
    lines = suffix.split("\n")
    first = lines[0].strip()
    starts = 0
    if first:
        nl = text.find("\n")
        if nl != -1 and text[:nl].rstrip().endswith(first) and text[:nl].strip() != "":
            return text[:nl].rstrip().rfind(first)
        if nl == -1:
            return None
        starts = nl + 1
    target = next((ln.strip() for ln in lines if ln.strip()), "")
    if not target:
        return None
    pos = starts
    while (nl := text.find("\n", pos)) != -1:
        if text[pos:nl].strip() == target:
            head = text[:pos]
            if "\n" in suffix[: len(suffix) - len(suffix.lstrip())]:
                head = head.rstrip()
            return len(head)
        pos = nl + 1
    return None


class StopChecker:
    """Decides after each step whether to stop; keeps the output as it should be returned."""

    def __init__(self, config, tokenizer, eos_token_ids: set[int], start: float):
        self.config = config
        self.tokenizer = tokenizer
        self.eos = eos_token_ids
        self.start = start
        self.final_tokens: list[int] = []
        self.final_text = ""
        if tokenizer is None and (config.max_lines is not None or config.stop_text or config.stop_fn):
            raise ValueError("max_lines, stop_text and stop_fn need a tokenizer")

    def check(self, out: list[int], should_stop: Callable[[], bool] | None) -> str | None:
        cfg = self.config
        tokens, reason = out, None
        eos_at = next((i for i, t in enumerate(tokens) if t in self.eos), None)
        if eos_at is not None:
            tokens, reason = tokens[:eos_at], "eos"
        if len(tokens) >= cfg.max_new_tokens:
            tokens, reason = tokens[: cfg.max_new_tokens], "max_tokens"
        text = self._decode(tokens)
        if cfg.stop_text:  # before max_lines, which would remove the newline that completes the line
            final = "\n" if reason == "eos" else ""  # the output is over: its last line is complete
            cut = suffix_cut(text + final, cfg.stop_text)
            if cut is not None:
                text, reason = text[: min(cut, len(text))], "stop_text"
                tokens = tokens[: self._covering(tokens, len(text))]
        if cfg.max_lines is not None and (cut := lines_cut(text, cfg.max_lines)) is not None:
            text, reason = text[:cut], "max_lines"
            tokens = tokens[: self._covering(tokens, cut)]
        if cfg.stop_fn is not None and (cut := cfg.stop_fn(text)) is not None:
            text, reason = text[:cut], "stop_fn"
            tokens = tokens[: self._covering(tokens, cut)]
        self.final_tokens, self.final_text = list(tokens), text
        if reason is None and cfg.time_budget_s is not None and time.perf_counter() - self.start >= cfg.time_budget_s:
            reason = "time"
        if reason is None and should_stop is not None and should_stop():
            reason = "cancelled"
        return reason

    def _decode(self, tokens: list[int]) -> str:
        if self.tokenizer is None:
            return ""
        return self.tokenizer.decode(tokens, skip_special_tokens=False)

    def _covering(self, tokens: list[int], cut: int) -> int:
        """The fewest leading tokens whose text reaches `cut` characters (binary search)."""
        lo, hi = 0, len(tokens)
        while lo < hi:
            mid = (lo + hi) // 2
            if len(self._decode(tokens[:mid])) >= cut:
                hi = mid
            else:
                lo = mid + 1
        return lo
