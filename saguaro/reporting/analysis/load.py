"""A bench run folder read back: configuration, environment, per-request results, per-round records."""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

from saguaro.bench.environment import describe  # re-exported: one line naming the machine, for figure titles
from saguaro.bench.runfolder import CLIENT_KIND, CONFIG, ENVIRONMENT, RunDir, read_disturbances


@dataclass
class Run:
    path: Path
    config: dict
    environment: dict
    results: list[dict]
    rounds: list[dict]
    requests: list[dict] = field(default_factory=list)  # client runs (saguaro bench --url): one per request
    disturbances: list[dict] = field(default_factory=list)  # disturbed.json's entries (saguaro.bench.runfolder)
    _by_unit: dict | None = field(default=None, repr=False)

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def is_client(self) -> bool:
        """A load test of a server (saguaro bench --url) rather than of the engine in process."""
        return self.config.get("kind") == CLIENT_KIND

    @property
    def where(self) -> str:
        return f"client on {describe(self.environment)}" if self.is_client else describe(self.environment)

    def disturbed(self, line: dict) -> str | None:
        """Why this result (or request) line's measurement was disturbed, or None if it was not."""
        own = line.get("disturbed")
        if own:
            return own if isinstance(own, str) else "marked disturbed in its result line"
        for entry in self.disturbances:
            keys, ids = entry.get("keys"), entry.get("prompt_ids")
            if (keys is None or line.get("key") in keys) and (ids is None or line.get("prompt_id") in ids):
                return entry["reason"]
        return None

    @property
    def models(self) -> str:
        c = self.config
        if self.is_client:  # the host, not the port: each server of a sweep gets a port of its own
            host = urlparse(c.get("url") or "").hostname or c.get("url")
            return f"{c.get('model')} served at {host}"
        draft = c.get("draft") if any(s in ("sd", "ssd", "hf-assisted") for s in c.get("systems", ())) else None
        dtype = c.get("dtype")
        quant = c.get("target_quant")
        text = f"{c.get('target')} ({f'{quant}, float layers {dtype}' if quant else dtype})"
        if draft:
            dquant = c.get("draft_quant") or ("int8-dynamic" if c.get("draft_int8") else None)
            text += f" / {draft} ({dquant or c.get('draft_dtype') or dtype})"
        return text

    def rounds_by_unit(self) -> dict[tuple[str, int], list[dict]]:
        """Round records of each generate call (variant key, batch index), in round order."""
        if self._by_unit is None:
            groups: dict[tuple[str, int], list[dict]] = defaultdict(list)
            for r in self.rounds:
                groups[(r["key"], r["batch_index"])].append(r)
            self._by_unit = {u: sorted(rs, key=lambda r: r["round"]) for u, rs in groups.items()}
        return self._by_unit

    def rounds_of(self, key: str) -> list[list[dict]]:
        """Round records of one variant, one list per generate call."""
        return [rs for (k, _), rs in sorted(self.rounds_by_unit().items(), key=lambda x: x[0][1]) if k == key]


def load_run(path: str | Path) -> Run:
    """Read a run folder; ValueError (with what to pass instead) if it is not one."""
    path = Path(path)
    if not (path / CONFIG).is_file() or not (path / ENVIRONMENT).is_file():
        raise ValueError(
            f"{path} is not a bench run folder (needs {CONFIG} and {ENVIRONMENT}): "
            "pass folders that `saguaro bench` wrote, e.g. runs/<timestamp>-<name>"
        )
    run_dir = RunDir(path)
    try:
        config, env = run_dir.read_json(CONFIG), run_dir.read_json(ENVIRONMENT)
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: damaged JSON ({err.msg})") from None
    return Run(path, config, env, run_dir.results(), run_dir.rounds(), run_dir.requests(), read_disturbances(path))
