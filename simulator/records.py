"""Read the engine's per-round records (JSONL, one object per round) without importing the engine.

The schema (engine/metrics.py `RoundRecord`): strategy, round, batch_size, K, context_len, accepted,
emitted, draft_ms, verify_ms, round_ms, draft_forwards, phase ("decode" | "prefill"), tokens (prefill);
SSD decode rounds also carry hit, cache_build_ms, branches, backup, wait_ms, fanout. SD and SSD decode
rounds may carry outcome_rank (per row: where the verified bonus stood among the draft's guesses for its
outcome, null where unknown; simulator.hits), SSD ones outcome_hit, and every decode round prompt_index.
An SD record may say first_width, the tokens a row fed in its proposal's first forward (`saguaro calibrate`
writes it; the engine's widths are inferred from the round before, `simulator.fit.sd_first_widths`).
`saguaro calibrate --build-tokens` marks the engine's own SSD rounds it runs at the workload's K and budget with
level "build": the fit measures its cache builds against them and they inform nothing else (`simulator.fit`).
It marks its cache builds timed with the target idle level "alone" (an SSD record with verify_ms 0): the fit's
build line is fitted on them.
Unknown keys are ignored (newer engines may add some); missing or ill-typed ones raise ValueError naming
file and line.

An SSD round's `fanout` is the schedule F_0..F_K' of the cache its `hit` was looked up in: the cache built
for the previous round's outcomes, so K' is that round's K. At a fixed K it has K+1 entries; under adaptive
K (K "auto") K' may differ from the round's own K.

`backup` may be null (every sequence hit, no backup ran) or name several kinds joined by commas
("neural,random": a batch whose misses were served by different backups), as the engine writes it.
An SSD round's `draft_ms` is the target's wait for the worker; the backup's own drafting time is
`backup_ms` (engines before it was recorded leave it out); `RoundRecord.backup_time_ms` gives it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from theory.glossary import Backup, Strategy

PREFILL, DECODE = "prefill", "decode"
LEVELS = ("build", "alone")  # the `level` marks of `saguaro calibrate`'s records outside the main fit


@dataclass(frozen=True)
class RoundRecord:
    strategy: Strategy
    round: int
    batch_size: int
    K: int
    context_len: int
    accepted: tuple[int, ...]
    emitted: tuple[int, ...]
    draft_ms: float
    verify_ms: float
    round_ms: float
    draft_forwards: int
    phase: str = DECODE
    tokens: int = 0
    hit: tuple[bool, ...] | None = None
    cache_build_ms: float | None = None
    branches: int | None = None
    backups: tuple[Backup, ...] = ()  # kinds that served this round's misses; () when all hit
    wait_ms: float | None = None
    fanout: tuple[int, ...] | None = None
    backup_ms: float | None = None  # SSD: the backup's own time, as the worker measured it
    outcome_rank: tuple[int | None, ...] | None = None  # SD/SSD: rank of each row's bonus among the guesses
    outcome_hit: tuple[bool | None, ...] | None = None  # SSD: was each row's outcome in the cache
    prompt_index: tuple[int, ...] | None = None  # each row's prompt index in its generate() call
    first_width: int | None = None  # SD: tokens a row fed in the proposal's first forward, where recorded
    level: str | None = None  # "build": calibrate's engine rounds the builds are measured against; "alone": see above

    @property
    def is_decode(self) -> bool:
        return self.phase == DECODE

    @property
    def backup(self) -> Backup | None:
        """The one backup kind that served this round's misses (None: all hit, or several kinds)."""
        return self.backups[0] if len(self.backups) == 1 else None

    @property
    def backup_time_ms(self) -> float | None:
        """The just-in-time backup's time, when recorded (None where only the wait is known)."""
        if self.backup_ms is not None and self.backups:
            return self.backup_ms
        if self.wait_ms is None or self.draft_ms == self.wait_ms:
            return None
        return self.draft_ms

    @property
    def config_key(self) -> tuple:
        """What identifies a configuration within a file: strategy, K and fan-out."""
        return (self.strategy.value, self.K, self.fanout)


def _get(obj: dict, key: str, kind: type | tuple[type, ...], where: str, minimum: float | None = 0):
    if key not in obj or obj[key] is None:
        raise ValueError(f"{where}: missing field {key!r} (see simulator/records.py for the record schema)")
    value = obj[key]
    if isinstance(value, bool) and kind is not bool:
        raise ValueError(f"{where}: field {key!r} must be a number, got {value!r}")
    if not isinstance(value, kind):
        raise ValueError(f"{where}: field {key!r} must be {_kind_name(kind)}, got {value!r}")
    if minimum is not None and isinstance(value, (int, float)) and value < minimum:
        raise ValueError(f"{where}: field {key!r} must be >= {minimum}, got {value!r}")
    return value


def _kind_name(kind) -> str:
    if kind is int:
        return "an integer"
    if kind is bool:
        return "true or false"
    return "a number" if kind == (int, float) else str(kind)


def _int_list(obj: dict, key: str, n: int, where: str) -> tuple[int, ...]:
    values = obj.get(key)
    if not isinstance(values, list) or len(values) != n:
        raise ValueError(f"{where}: field {key!r} must be a list of {n} integers (one per sequence), got {values!r}")
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in values):
        raise ValueError(f"{where}: field {key!r} must hold non-negative integers, got {values!r}")
    return tuple(values)


def parse_record(obj: object, where: str = "record") -> RoundRecord:
    """One record from its decoded JSON object; ValueError says which field is wrong and where."""
    if not isinstance(obj, dict):
        raise ValueError(f"{where}: each line must be a JSON object, got {type(obj).__name__}")
    name = _get(obj, "strategy", str, where, None)
    try:
        strategy = Strategy(name)
    except ValueError:
        raise ValueError(f"{where}: strategy must be one of ar, sd, ssd; got {name!r}") from None
    phase = obj.get("phase", DECODE)
    if phase not in (DECODE, PREFILL):
        raise ValueError(f"{where}: phase must be 'decode' or 'prefill', got {phase!r}")
    number = (int, float)
    batch = _get(obj, "batch_size", int, where, 1)
    K = _get(obj, "K", int, where, 0)
    accepted = _int_list(obj, "accepted", batch, where)
    emitted = _int_list(obj, "emitted", batch, where)
    if any(k > K for k in accepted):
        raise ValueError(f"{where}: accepted counts {list(accepted)} exceed K = {K}")
    if any(e > k + 1 for e, k in zip(emitted, accepted, strict=True)):
        raise ValueError(f"{where}: emitted {list(emitted)} exceeds accepted + 1 {[k + 1 for k in accepted]}")
    fields = dict(
        strategy=strategy,
        round=_get(obj, "round", int, where),
        batch_size=batch,
        K=K,
        context_len=_get(obj, "context_len", int, where),
        accepted=accepted,
        emitted=emitted,
        draft_ms=float(_get(obj, "draft_ms", number, where)),
        verify_ms=float(_get(obj, "verify_ms", number, where)),
        round_ms=float(_get(obj, "round_ms", number, where)),
        draft_forwards=_get(obj, "draft_forwards", int, where),
        phase=phase,
        tokens=_get(obj, "tokens", int, where) if phase == PREFILL else int(obj.get("tokens") or 0),
    )
    if strategy is Strategy.AR and K != 0:
        raise ValueError(f"{where}: an AR record must have K = 0, got {K}")
    if strategy is Strategy.SSD and phase == DECODE:
        fields.update(_ssd_fields(obj, batch, K, where))
    if phase == DECODE:
        fields.update(_outcome_fields(obj, batch, where))
        width = obj.get("first_width")
        if width is not None:
            if not isinstance(width, int) or isinstance(width, bool) or width < 1:
                raise ValueError(f"{where}: 'first_width' must be a positive integer, got {width!r}")
            fields["first_width"] = width
        level = obj.get("level")
        if level is not None:
            if level not in LEVELS:
                raise ValueError(
                    f'{where}: \'level\' must be "build" (saguaro calibrate\'s engine rounds), "alone" '
                    f"(its builds timed with the target idle) or absent, got {level!r}"
                )
            fields["level"] = level
    return RoundRecord(**fields)


def _optional_list(obj: dict, key: str, n: int, kinds: tuple[type, ...], where: str, nullable: bool) -> tuple | None:
    values = obj.get(key)
    if values is None:
        return None
    ok = (
        isinstance(values, list)
        and len(values) == n
        and all(
            (v is None and nullable)
            or (
                isinstance(v, kinds)
                and (bool in kinds or not isinstance(v, bool))
                and (isinstance(v, bool) or (isinstance(v, (int, float)) and v >= 0))
            )
            for v in values
        )
    )
    if not ok:
        kind = " or ".join(k.__name__ for k in kinds) + (" or null" if nullable else "")
        raise ValueError(f"{where}: '{key}' must be a list of {n} values ({kind}, non-negative), got {values!r}")
    return tuple(values)


def _outcome_fields(obj: dict, batch: int, where: str) -> dict:
    return dict(
        outcome_rank=_optional_list(obj, "outcome_rank", batch, (int,), where, nullable=True),
        outcome_hit=_optional_list(obj, "outcome_hit", batch, (bool,), where, nullable=True),
        prompt_index=_optional_list(obj, "prompt_index", batch, (int,), where, nullable=False),
    )


def _ssd_fields(obj: dict, batch: int, K: int, where: str) -> dict:
    number = (int, float)
    hit = obj.get("hit")
    if not isinstance(hit, list) or len(hit) != batch or not all(isinstance(h, bool) for h in hit):
        raise ValueError(f"{where}: an SSD round needs 'hit', a list of {batch} booleans, got {hit!r}")
    fanout = obj.get("fanout")
    if not isinstance(fanout, list) or len(fanout) < 2:
        raise ValueError(
            f"{where}: an SSD round needs 'fanout', the looked-up cache's F_0..F_K' (K + 1 integers at "
            f"a fixed K), got {fanout!r}"
        )
    if not all(isinstance(f, int) and not isinstance(f, bool) and f >= 0 for f in fanout):
        raise ValueError(f"{where}: 'fanout' must hold non-negative integers, got {fanout!r}")
    name = obj.get("backup")
    if name is not None and not isinstance(name, str):
        raise ValueError(f"{where}: 'backup' must be null or backup names joined by commas, got {name!r}")
    try:
        backups = tuple(Backup(part.strip()) for part in name.split(",")) if name else ()
    except ValueError:
        raise ValueError(f"{where}: 'backup' names neural, random or lookup (comma-joined), got {name!r}") from None
    if Backup.AUTO in backups:
        raise ValueError(f"{where}: 'backup' must name the backup actually used (neural, random or lookup), not auto")
    if backups == () and not all(hit):
        raise ValueError(f"{where}: some sequences missed, so 'backup' must name the backup that served them")
    return dict(
        hit=tuple(hit),
        cache_build_ms=float(_get(obj, "cache_build_ms", number, where)),
        branches=_get(obj, "branches", int, where),
        backups=backups,
        wait_ms=float(_get(obj, "wait_ms", number, where)),
        fanout=tuple(fanout),
        backup_ms=float(_get(obj, "backup_ms", number, where)) if obj.get("backup_ms") is not None else None,
    )


def read_records(path: str | Path) -> list[RoundRecord]:
    """All records of a JSONL file, in order. Blank lines are skipped."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no records file at {path}: pass the JSONL the engine wrote (one round per line)")
    records = []
    with path.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            where = f"{path}:{number}"
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"{where}: not valid JSON ({err.msg}); each line must be one JSON object") from None
            records.append(parse_record(obj, where))
    if not records:
        raise ValueError(f"{path} holds no records: run the engine with per-round records switched on")
    return records
