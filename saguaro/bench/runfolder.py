"""The run folder of one `saguaro bench` invocation, written so that an interrupted run can resume.

    config.json       the exact BenchConfig
    environment.json  package versions, machine, git commit (and one entry per resumed session)
    prompts.jsonl     the prompts selected, in order (a resumed run reads them from here)
    results.jsonl     one line per (variant, prompt): the request's figures, or its error
    rounds.jsonl      the engine's per-round records, tagged with variant key and batch index
    summary.json/.md  per-variant table, written at the end

A client run (`saguaro bench --url`, load on a server) has config.json (its ClientConfig, `kind` "client"),
environment.json and prompts.jsonl too, and instead of results and rounds:

    requests.jsonl        one line per request sent: its load point, chunk times, latency, text or error
    point-<load>-<v>.json one per load point (e.g. point-rate-2.json): theory.latency summary, throughput, inputs
    summary.json/.md      every point, written at the end

A run that something else disturbed (another job on its cores, a throttled machine) says so, for the report
to mark its rows in tables (†) and figures (hollow markers, hatched bars):

    disturbed.json        {"disturbed": [{"reason": "...", "keys": [...] or null, "prompt_ids": [...] or null}]}
                          (null: every variant / every prompt); written by `RunDir.mark_disturbed`
    a result line's own `disturbed` field (a reason string, or true) marks that request alone

A *unit* is one generate call: (variant key, batch index). Its round records are appended first and
its result lines last, each flushed to disk, so a unit counts as done exactly when its result lines are
complete. On resume a torn last line is cut off, round records of unfinished units are dropped, and the
done units are skipped.
"""

from __future__ import annotations

import datetime
import json
import os
import re
from pathlib import Path

from saguaro.bench.prompts import Prompt

CONFIG, ENVIRONMENT, PROMPTS = "config.json", "environment.json", "prompts.jsonl"
RESULTS, ROUNDS = "results.jsonl", "rounds.jsonl"
REQUESTS = "requests.jsonl"
CLIENT_KIND = "client"  # config.json's `kind` in a client run folder (engine bench configs have no `kind`)
SUMMARY_JSON, SUMMARY_MD = "summary.json", "summary.md"
DISTURBED = "disturbed.json"

Unit = tuple[str, int]


def _read_jsonl(path: Path, repair: bool) -> list[dict]:
    """Every complete line of a JSONL file; with `repair`, a torn (unterminated) last line is cut off."""
    if not path.exists():
        return []
    data = path.read_bytes()
    end = data.rfind(b"\n") + 1
    if end < len(data) and repair:
        with path.open("r+b") as f:
            f.truncate(end)
    rows = []
    for n, line in enumerate(data[:end].splitlines(), 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}:{n} is not valid JSON ({err.msg}); the run folder is damaged") from None
    return rows


def _append(path: Path, rows: list[dict]) -> None:
    if not rows:
        return
    text = "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in rows)
    with path.open("a", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-") or "bench"


class RunDir:
    def __init__(self, path: Path):
        self.path = Path(path)

    @classmethod
    def create(cls, parent: str | Path, name: str, config: dict, environment: dict) -> RunDir:
        """A new folder `<parent>/<timestamp>-<name>` with config.json and environment.json."""
        stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
        parent = Path(parent)
        parent.mkdir(parents=True, exist_ok=True)
        path = parent / f"{stamp}-{_slug(name)}"
        n = 1
        while path.exists():
            n += 1
            path = parent / f"{stamp}-{_slug(name)}-{n}"
        path.mkdir()
        run = cls(path)
        run._write_json(CONFIG, config)
        run._write_json(ENVIRONMENT, {**environment, "resumed": []})
        return run

    @classmethod
    def open(cls, path: str | Path) -> RunDir:
        run = cls(Path(path))
        if not (run.path / CONFIG).is_file():
            raise ValueError(f"{path} is not a bench run folder (no {CONFIG}): pass a folder `saguaro bench` made")
        return run

    def _write_json(self, name: str, data: dict) -> None:
        tmp = self.path / f".{name}.tmp"
        tmp.write_text(json.dumps(data, indent=2, default=str) + "\n", encoding="utf-8")
        tmp.replace(self.path / name)

    def read_json(self, name: str) -> dict:
        return json.loads((self.path / name).read_text(encoding="utf-8"))

    @property
    def config(self) -> dict:
        return self.read_json(CONFIG)

    def note_resumed(self, environment: dict) -> None:
        env = self.read_json(ENVIRONMENT)
        env.setdefault("resumed", []).append(environment)
        self._write_json(ENVIRONMENT, env)

    def prompts(self) -> list[Prompt] | None:
        """The prompts this run selected, or None before they are written."""
        rows = _read_jsonl(self.path / PROMPTS, repair=False)
        if not rows:
            return None
        return [
            Prompt(
                r["id"], r["category"], r["task"], r.get("text"), tuple(r["ids"]) if r.get("ids") is not None else None
            )
            for r in rows
        ]

    def write_prompts(self, prompts: list[Prompt]) -> None:
        self._rewrite(
            PROMPTS,
            [
                {
                    "id": p.id,
                    "category": p.category,
                    "task": p.task,
                    "text": p.text,
                    "ids": list(p.ids) if p.ids is not None else None,
                }
                for p in prompts
            ],
        )

    # -- results and rounds ----------------------------------------------------------------------
    def results(self) -> list[dict]:
        return _read_jsonl(self.path / RESULTS, repair=False)

    def rounds(self) -> list[dict]:
        return _read_jsonl(self.path / ROUNDS, repair=False)

    def prepare_resume(self, unit_sizes: dict[Unit, int]) -> set[Unit]:
        """Repair the files after an interruption; return the units whose results are complete.

        `unit_sizes`: how many result lines each unit writes (its batch's prompts).
        """
        results = _read_jsonl(self.path / RESULTS, repair=True)
        counts: dict[Unit, int] = {}
        for r in results:
            unit = (r["key"], r["batch_index"])
            counts[unit] = counts.get(unit, 0) + 1
        done = {u for u, n in counts.items() if n >= unit_sizes.get(u, n + 1)}
        partial = set(counts) - done
        if partial:  # a unit's lines are written in one call, so this means a torn write: drop them
            self._rewrite(RESULTS, [r for r in results if (r["key"], r["batch_index"]) in done])
        rounds = _read_jsonl(self.path / ROUNDS, repair=True)
        kept = [r for r in rounds if (r["key"], r["batch_index"]) in done]
        if len(kept) != len(rounds):
            self._rewrite(ROUNDS, kept)
        return done

    def _rewrite(self, name: str, rows: list[dict]) -> None:
        tmp = self.path / f".{name}.tmp"
        tmp.write_text("".join(json.dumps(r, separators=(",", ":")) + "\n" for r in rows), encoding="utf-8")
        tmp.replace(self.path / name)

    def append_unit(self, results: list[dict], rounds: list[dict]) -> None:
        """Record one finished generate call: its rounds first, then its results (the commit)."""
        _append(self.path / ROUNDS, rounds)
        _append(self.path / RESULTS, results)

    # -- disturbance ---------------------------------------------------------------------------------
    def disturbances(self) -> list[dict]:
        """The entries of disturbed.json (none when the run was not marked)."""
        return read_disturbances(self.path)

    def mark_disturbed(self, reason: str, keys: list[str] | None = None, prompt_ids: list[str] | None = None) -> None:
        """Record that these variants' (None: all) requests for these prompts (None: all) were disturbed."""
        if not reason.strip():
            raise ValueError("say what disturbed the run (e.g. 'a debugging job ran on the worker's core')")
        entries = self.disturbances() + [{"reason": reason.strip(), "keys": keys, "prompt_ids": prompt_ids}]
        self._write_json(DISTURBED, {"disturbed": entries})

    # -- client runs ---------------------------------------------------------------------------------
    def requests(self) -> list[dict]:
        return _read_jsonl(self.path / REQUESTS, repair=False)

    def append_requests(self, rows: list[dict]) -> None:
        _append(self.path / REQUESTS, rows)

    def write_point(self, load: str, value: float, summary: dict) -> Path:
        name = f"point-{_slug(f'{load}-{value:g}')}.json"
        self._write_json(name, summary)
        return self.path / name

    def write_summary(self, summary: dict, markdown: str) -> None:
        self._write_json(SUMMARY_JSON, summary)
        (self.path / SUMMARY_MD).write_text(markdown, encoding="utf-8")


def read_disturbances(path: Path) -> list[dict]:
    """disturbed.json's entries in the run folder `path`; ValueError (what to fix) if it is malformed."""
    file = Path(path) / DISTURBED
    if not file.is_file():
        return []
    try:
        entries = json.loads(file.read_text(encoding="utf-8")).get("disturbed")
    except (json.JSONDecodeError, AttributeError):
        entries = None
    if not isinstance(entries, list) or not all(isinstance(e, dict) and e.get("reason") for e in entries):
        raise ValueError(
            f'{file} is malformed: write {{"disturbed": [{{"reason": "...", "keys": null, '
            f'"prompt_ids": null}}]}} (keys, prompt_ids: lists, or null for all)'
        )
    return entries
