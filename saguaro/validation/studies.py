"""The committed studies under reports/: each folder holds a README.md and a manifest.json that says what the
study is (question, machine, commit, command) and, for a study of the simulator's predictions, its held-out
sets: the bench runs, served runs and calibrations that `saguaro validate audit` predicts again. The runs
themselves are packed per measurement session in the study's data/*.tar.gz (run folders as `saguaro bench`
wrote them, less their logs); a set names them by paths inside those archives (globs allowed), and the audit
unpacks them into a work folder first.

    {"title": ..., "question": ..., "machine": ..., "commit": ..., "command": ...,
     "held_out": [{"name": "2026-12-02-avx512-0515", "host": "AMD EPYC, AVX-512 BF16", "host_speed": "steady",
                   "note": ..., "runs": ["2026-12-02-avx512-0515/runs/*-k235", ...],
                   "calibrations": ["2026-12-02-avx512-0515/calibration.jsonl"],
                   "served": {"client_runs": [...], "sd_run": ..., "server_rounds": ..., "max_num_seqs": 8,
                              "calibrations": [...]}}]}      # served and its calibrations optional
"""

from __future__ import annotations

import glob
import json
import tarfile
from dataclasses import dataclass
from pathlib import Path

REPORTS = Path(__file__).resolve().parents[2] / "reports"  # the checkout's reports/ (not part of an install)
MANIFEST = "manifest.json"
DATA = "data"
HOST_SPEEDS = ("steady", "drifting")


@dataclass(frozen=True)
class ServedSet:
    """A served SSD run to predict: the client runs' load points, the SD bench run on the served prompts (α
    and hits), the server's own round records (its policy) and its --max-num-seqs."""

    client_runs: tuple[str, ...]
    sd_run: str
    server_rounds: str
    max_num_seqs: int
    calibrations: tuple[str, ...] = ()  # () : the set's own calibrations


@dataclass(frozen=True)
class HeldOutSet:
    """Held-out runs and the calibration(s) they were predicted with, paths inside the study's archives."""

    name: str
    study: str
    host: str
    host_speed: str  # "steady": the host held its speed through the runs; "drifting": it moved 10-30% within the hour
    runs: tuple[str, ...]
    calibrations: tuple[str, ...]
    served: ServedSet | None = None
    note: str = ""


def _strings(value, what: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
        raise ValueError(f"{what} must be a non-empty list of paths inside the study's archives")
    return tuple(value)


def _held_out(study: str, entry: dict) -> HeldOutSet:
    where = f"{study}/{MANIFEST}: held-out set {entry.get('name')!r}"
    if entry.get("host_speed") not in HOST_SPEEDS:
        raise ValueError(f"{where}: host_speed must be one of {', '.join(HOST_SPEEDS)}")
    served = entry.get("served")
    if served is not None:
        served = ServedSet(
            client_runs=_strings(served.get("client_runs"), f"{where}: served.client_runs"),
            sd_run=str(served["sd_run"]),
            server_rounds=str(served["server_rounds"]),
            max_num_seqs=int(served["max_num_seqs"]),
            calibrations=tuple(served.get("calibrations") or ()),
        )
    return HeldOutSet(
        name=str(entry["name"]),
        study=study,
        host=str(entry.get("host", "")),
        host_speed=entry["host_speed"],
        runs=_strings(entry.get("runs"), f"{where}: runs"),
        calibrations=_strings(entry.get("calibrations"), f"{where}: calibrations"),
        served=served,
        note=str(entry.get("note", "")),
    )


def manifests(reports: Path = REPORTS) -> dict[str, dict]:
    """study folder name -> its manifest, for every study under `reports` (sorted by name)."""
    reports = Path(reports)
    if not reports.is_dir():
        raise ValueError(f"no reports folder at {reports}: run from a checkout of the project, or give --reports DIR")
    found = {}
    for path in sorted(reports.glob(f"*/{MANIFEST}")):
        try:
            found[path.parent.name] = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as err:
            raise ValueError(f"{path} is not valid JSON ({err.msg}, line {err.lineno})") from None
    return found


def held_out_sets(reports: Path = REPORTS) -> list[HeldOutSet]:
    """Every study's held-out sets, in the order of the studies' names and then of their manifests."""
    return [
        _held_out(study, entry)
        for study, manifest in manifests(reports).items()
        for entry in manifest.get("held_out", [])
    ]


def archives(reports: Path, study: str) -> list[Path]:
    return sorted((Path(reports) / study / DATA).glob("*.tar.gz"))


def unpack(reports: Path, study: str, into: Path) -> Path:
    """The study's archives unpacked under `into`/<study> (again only where not done yet); returns that folder,
    the root the sets' paths are relative to."""
    root = Path(into) / study
    for archive in archives(reports, study):
        done = root / f".{archive.name}.unpacked"
        if done.is_file():
            continue
        root.mkdir(parents=True, exist_ok=True)
        with tarfile.open(archive, "r:gz") as tar:
            tar.extractall(root, filter="data")  # plain files and folders inside `root` only
        done.touch()
    return root


def paths(root: Path, patterns: tuple[str, ...]) -> list[Path]:
    """Every pattern's matches under `root`, each pattern's sorted; FileNotFoundError names a pattern that
    matches nothing."""
    found = []
    for pattern in patterns:
        hits = sorted(glob.glob(str(Path(root) / pattern)))
        if not hits:
            raise FileNotFoundError(f"no run matches {pattern} under {root}")
        found += [Path(hit) for hit in hits]
    return found
