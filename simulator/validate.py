"""Validation against the real engine: fit timings on one run, then predict other runs' tokens/s.

For each configuration in the validation records (strategy, K, fan-out, batch), the simulator replays
that run's accepted counts and hits (acceptance is not what is being validated) with the fitted timings,
and its decode tokens/s is compared with the measured one, Σ emitted / Σ round_ms. The engine run should
keep its batch full (fixed output lengths, no early stop at EOS): the simulation does.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from simulator.acceptance import Replay
from simulator.fit import FittedTiming
from simulator.link import LinkSpec
from simulator.records import RoundRecord
from simulator.run import Policy, SimConfig, simulate
from simulator.workload import ClosedLoop, Lengths
from theory.glossary import Backup

TOLERANCE = 0.10


@dataclass(frozen=True)
class ValidationRow:
    strategy: str
    K: int
    batch: int
    backup: str | None
    fanout: tuple[int, ...] | None
    rounds: int
    measured_tokens_per_s: float
    simulated_tokens_per_s: float

    @property
    def error(self) -> float:
        """Relative error of the simulation, (simulated − measured) / measured."""
        return self.simulated_tokens_per_s / self.measured_tokens_per_s - 1.0

    @property
    def within_tolerance(self) -> bool:
        return abs(self.error) <= TOLERANCE


def _segments(records: list[RoundRecord]) -> list[list[RoundRecord]]:
    """Decode rounds split into generate() calls: a call ends where the configuration changes or the context shrinks."""
    segments: list[list[RoundRecord]] = []
    for r in records:
        if not r.is_decode:
            continue
        last = segments[-1][-1] if segments else None
        if last is None or r.config_key != last.config_key or r.context_len < last.context_len:
            segments.append([])
        segments[-1].append(r)
    return segments


def group_runs(records: list[RoundRecord]) -> dict[tuple, list[list[RoundRecord]]]:
    """generate() calls grouped by configuration and starting batch size, in first-seen order."""
    groups: dict[tuple, list[list[RoundRecord]]] = {}
    for segment in _segments(records):
        groups.setdefault(segment[0].config_key + (segment[0].batch_size,), []).append(segment)
    return groups


def _backup(rows: list[RoundRecord]) -> Backup:
    """The backup the run used most (records name it per round; neural when no round missed)."""
    kinds = Counter(r.backup for r in rows if r.backup is not None)
    return kinds.most_common(1)[0][0] if kinds else Backup.NEURAL


def simulate_like(timing: FittedTiming, segments: list[list[RoundRecord]], seed: int = 0) -> float:
    """Decode tokens/s the simulator predicts for the generate() calls these decode records came from."""
    rows = [r for s in segments for r in s]
    first = rows[0]
    Ks = sorted({r.K for r in rows})
    if len(Ks) > 1:  # adaptive speculation: the replay would hand a one-K policy other rounds' accepted counts
        raise ValueError(
            f"its rounds use several K ({', '.join(map(str, Ks))}: adaptive speculation), and the "
            "simulator replays one K per configuration"
        )
    prompt = max(1, round(sum(s[0].context_len for s in segments) / len(segments)))
    per_seq = [sum(sum(r.emitted) for r in s) / s[0].batch_size for s in segments]
    output = max(2, round(sum(per_seq) / len(per_seq)) + 1)
    policy = Policy(first.strategy, K=first.K, fanout=first.fanout, backup=_backup(rows))
    config = SimConfig(
        policy=policy,
        timing=timing,
        acceptance=Replay(tuple(rows)),
        workload=ClosedLoop(first.batch_size, Lengths(prompt), Lengths(output)),
        link=LinkSpec(latency_ms=timing.link_latency_ms),
        rounds=len(rows),
        seed=seed,
    )
    return simulate(config).decode_tokens_per_s


def validate(timing: FittedTiming, records: list[RoundRecord]) -> list[ValidationRow]:
    """One row per configuration (strategy, K, fan-out, batch) in `records`, decode rounds only.

    Records do not name the temperature: validate each temperature's records separately.
    """
    out = []
    for key, segments in group_runs(records).items():
        rows = [r for s in segments for r in s]
        measured_ms = sum(r.round_ms for r in rows)
        if measured_ms <= 0:
            raise ValueError(f"configuration {key} has no measured time (round_ms all 0)")
        measured = sum(sum(r.emitted) for r in rows) / measured_ms * 1e3
        first = rows[0]
        out.append(
            ValidationRow(
                strategy=first.strategy.value,
                K=first.K,
                batch=first.batch_size,
                backup=_backup(rows).value if first.strategy.value == "ssd" else None,
                fanout=first.fanout,
                rounds=len(rows),
                measured_tokens_per_s=measured,
                simulated_tokens_per_s=simulate_like(timing, segments),
            )
        )
    return out
