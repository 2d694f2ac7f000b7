"""Prompt sets for benchmarks: Spec-Bench and HumanEval (both shipped in saguaro/bench/data), any JSONL.

A prompt is text (wrapped in the tokenizer's chat template by the engine) or a list of token ids
(for tokenizer-free runs on tiny models). Each prompt belongs to a `category` and a `task`: Spec-Bench's
80 MT-Bench questions have eight categories (writing, coding, ...) but one task, `mt_bench`; its other
five tasks are their own category. Selecting n prompts takes them round-robin across tasks, so a
small n still covers every task.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from itertools import zip_longest
from pathlib import Path

SETS = ("spec_bench", "humaneval")
PROMPT_ORDERS = ("round-robin", "file")
SPEC_BENCH_TASKS = ("translation", "summarization", "qa", "math_reasoning", "rag")


@dataclass(frozen=True)
class Prompt:
    id: str
    category: str
    task: str
    text: str | None = None
    ids: tuple[int, ...] | None = None

    @property
    def content(self) -> str | list[int]:
        """What the engine encodes: the text, or the token ids as given."""
        return self.text if self.text is not None else list(self.ids)


def _spec_bench() -> list[Prompt]:
    """Spec-Bench (Apache-2.0, licence in saguaro/bench/data/SPEC_BENCH_LICENSE): first turn of each."""
    text = resources.files("saguaro.bench").joinpath("data/spec_bench.jsonl").read_text(encoding="utf-8")
    rows = [json.loads(line) for line in text.splitlines() if line.strip()]
    return [
        Prompt(
            f"spec_bench/{r['question_id']}",
            r["category"],
            r["category"] if r["category"] in SPEC_BENCH_TASKS else "mt_bench",
            r["turns"][0],
        )
        for r in rows
    ]


def _humaneval() -> list[Prompt]:
    """HumanEval (MIT, licence in saguaro/bench/data/HUMANEVAL_LICENSE): the function signature and docstring."""
    text = resources.files("saguaro.bench").joinpath("data/humaneval.jsonl").read_text(encoding="utf-8")
    rows = [json.loads(line) for line in text.splitlines() if line.strip()]
    return [
        Prompt(r["task_id"], "humaneval", "humaneval", "Complete this Python function.\n\n" + r["prompt"]) for r in rows
    ]


def _jsonl_row(row: object, where: str, default_id: str, default_category: str) -> Prompt:
    if not isinstance(row, dict):
        raise ValueError(f"{where}: each line must be a JSON object with a 'prompt' text or 'ids' list")
    text = row.get("prompt")
    if text is None and row.get("turns"):
        text = row["turns"][0]
    ids = row.get("ids")
    if ids is not None:
        if not isinstance(ids, list) or not ids or not all(type(t) is int and t >= 0 for t in ids):  # not bools
            raise ValueError(f"{where}: 'ids' must be a non-empty list of non-negative token ids")
        ids = tuple(ids)
    elif not isinstance(text, str) or not text.strip():
        raise ValueError(f"{where}: needs a non-empty 'prompt' (or 'turns') text, or an 'ids' list of token ids")
    elif not _encodes(text):
        raise ValueError(
            f"{where}: the prompt holds a lone surrogate (an escape such as \\udcff that is not a "
            "character): write the text itself in UTF-8"
        )
    category = str(row.get("category", default_category))
    return Prompt(
        str(row.get("id", default_id)), category, str(row.get("task", category)), None if ids is not None else text, ids
    )


def _read_utf8(path: Path) -> str:
    raw = path.read_bytes()
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        line = raw[: err.start].count(b"\n") + 1
        raise ValueError(
            f"{path}:{line} is not UTF-8 text (byte 0x{raw[err.start]:02x} at offset {err.start}): "
            "save the file as UTF-8 (iconv -t UTF-8)"
        ) from None


def _jsonl(path: Path) -> list[Prompt]:
    prompts = []
    for n, line in enumerate(_read_utf8(path).splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}:{n} is not valid JSON ({err.msg})") from None
        prompts.append(_jsonl_row(row, f"{path}:{n}", f"{path.stem}/{n}", path.stem))
    if not prompts:
        raise ValueError(f"{path} holds no prompts: give one JSON object per line")
    ids = [p.id for p in prompts]
    if len(set(ids)) != len(ids):
        raise ValueError(f"{path}: prompt ids must be unique (results are keyed by them)")
    return prompts


def _encodes(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def round_robin(prompts: list[Prompt]) -> list[Prompt]:
    """Interleave tasks (first of each task, then second of each, ...), keeping each task's order."""
    by_task: dict[str, list[Prompt]] = {}
    for p in prompts:
        by_task.setdefault(p.task, []).append(p)
    return [p for group in zip_longest(*by_task.values()) for p in group if p is not None]


def load_prompts(
    source: str, n: int | None = None, categories: list[str] | None = None, order: str = "round-robin"
) -> list[Prompt]:
    """n prompts of a set ("spec_bench", "humaneval") or of a JSONL file.

    `order`: "round-robin" (default) takes them across tasks, so a small n covers every task; "file" takes
    the first n in the file's order (the "first 20 prompts of Spec-Bench" of published comparisons, which
    are all MT-Bench). `categories` keeps prompts whose category or task is listed (e.g. `mt_bench`, `qa`).
    """
    if order not in PROMPT_ORDERS:
        raise ValueError(f"unknown prompt order {order!r}; choose from {', '.join(PROMPT_ORDERS)}")
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
        known = {p.category for p in prompts} | {p.task for p in prompts}
        unknown = set(categories) - known
        if unknown:
            raise ValueError(f"no category or task {sorted(unknown)} in {source}; it has {sorted(known)}")
        prompts = [p for p in prompts if p.category in categories or p.task in categories]
    if order == "round-robin":
        prompts = round_robin(prompts)
    if n is not None:
        if n < 1:
            raise ValueError(f"number of prompts must be >= 1, got {n}")
        prompts = prompts[:n]
    return prompts
