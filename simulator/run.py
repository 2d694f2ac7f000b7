"""One seeded simulation: a frozen config in, a `SimResult` out."""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace

import numpy as np
import simpy

from simulator.acceptance import AcceptanceModel, HitModel, Replay, Source
from simulator.batch import Batch
from simulator.draws import ReplayDraws, TableDraws
from simulator.link import Link, LinkSpec
from simulator.metrics import Recorder, SimResult, summarize
from simulator.processes import Testbed, ar_decoder, arrivals, sd_draft_worker, ssd_draft_worker, verifier
from simulator.timing import TimingModel
from simulator.workload import ClosedLoop, Replayed, RequestSource, Workload
from theory.glossary import Backup, MissPolicy, Strategy

TOKEN_ID_BYTES = 4
OUTCOME_BYTES = 8  # (k, t*) per sequence


@dataclass(frozen=True)
class Policy:
    """How tokens are produced: strategy, lookahead K, SSD fan-out schedules and backup.

    `fanout` is F^p (used while verifying a speculation that came from the cache), `fanout_backup` F^b
    (after a backup round; None: same). Each has K+1 entries, F_0..F_K. `miss_policy`: what the draft
    does when some rows miss (theory.MissPolicy): PER_ROW (this engine) finishes the cache build, keeps the
    hit rows' branches and backs up the missed rows; WHOLE_BATCH (the reference engine) drops the rest of
    the build at once and backs up every row.
    """

    strategy: Strategy
    K: int = 4
    fanout: tuple[int, ...] | None = None
    fanout_backup: tuple[int, ...] | None = None
    backup: Backup = Backup.NEURAL
    miss_policy: MissPolicy = MissPolicy.PER_ROW

    def __post_init__(self) -> None:
        strategy = Strategy(self.strategy)
        object.__setattr__(self, "strategy", strategy)
        object.__setattr__(self, "backup", Backup(self.backup))
        object.__setattr__(self, "miss_policy", MissPolicy(self.miss_policy))
        if strategy is Strategy.AR:
            if self.K != 0:
                object.__setattr__(self, "K", 0)
            return
        if self.K < 1:
            raise ValueError(f"K (draft tokens per round) must be >= 1 for {strategy.value}; got {self.K}")
        if strategy is Strategy.SD:
            return
        if self.backup is Backup.AUTO:
            raise ValueError("resolve backup 'auto' first (saguaro plan, or simulate each of neural/random/lookup)")
        for name in ("fanout", "fanout_backup"):
            schedule = getattr(self, name)
            if schedule is None:
                if name == "fanout":
                    raise ValueError("SSD needs a fan-out schedule F_0..F_K (e.g. uniform_fanout(K, 3))")
                continue
            schedule = tuple(int(f) for f in schedule)
            object.__setattr__(self, name, schedule)
            if len(schedule) != self.K + 1 or min(schedule) < 0 or sum(schedule) < 1:
                raise ValueError(
                    f"{name} needs K+1 = {self.K + 1} non-negative guesses (F_0..F_K) summing to >= 1; "
                    f"got {list(schedule)}"
                )

    @property
    def budget(self) -> int:
        return sum(self.fanout) if self.fanout else 0

    @property
    def budget_backup(self) -> int:
        return sum(self.fanout_backup) if self.fanout_backup else self.budget


def uniform_fanout(K: int, F: int) -> tuple[int, ...]:
    """The reference engine's default: F guesses at every position (K+1 positions)."""
    return (F,) * (K + 1)


@dataclass(frozen=True)
class SimConfig:
    """Everything one simulation needs. `draft_probs_bytes`: bytes of q sent per drafted token (the verifier
    needs q at temperature > 0: vocab × 2 in bf16; 0 when greedy). `prefill_overlap` (SSD): the target
    announces each prefill to the draft worker, which prefills the joiners' draft side meanwhile, as the
    engine does since its Prefill message; False: the worker prefills them only when the round that brings
    them arrives, before their backup (engines before that message: commit fbc55c0 of 2026-12-01 added it)."""

    policy: Policy
    timing: TimingModel
    acceptance: AcceptanceModel | Replay
    hits: HitModel | None = None
    workload: Workload = field(default_factory=ClosedLoop)
    link: LinkSpec = field(default_factory=LinkSpec)
    draft_probs_bytes: float = 0.0
    target_devices: int = 1
    draft_devices: int = 1
    rounds: int = 10_000
    requests: int | None = None
    seed: int = 0
    prefill_overlap: bool = True

    def __post_init__(self) -> None:
        if self.rounds < 1:
            raise ValueError(f"rounds must be >= 1; got {self.rounds}")
        if self.requests is not None and self.requests < 1:
            raise ValueError(f"requests must be >= 1 (or None for no limit); got {self.requests}")
        if self.target_devices < 1 or self.draft_devices < 1:
            raise ValueError("target_devices and draft_devices must be >= 1")
        if self.policy.strategy is Strategy.SSD and self.hits is None and not isinstance(self.acceptance, Replay):
            raise ValueError("SSD needs a hit model (ConstantHit or PowerLawHit) or replayed records")

    @property
    def accelerators(self) -> int:
        """SD runs its draft on the target's devices; SSD's draft has its own."""
        extra = self.draft_devices if self.policy.strategy is Strategy.SSD else 0
        return self.target_devices + extra

    def settings(self) -> dict:
        p = self.policy
        out = {"strategy": p.strategy.value, "K": p.K, "batch": self.workload.max_batch}
        if p.strategy is Strategy.SSD:
            out.update(
                budget=p.budget,
                fanout="-".join(map(str, p.fanout or ())),
                backup=p.backup.value,
                miss_policy=p.miss_policy.value,
            )
        return out


def _draws(config: SimConfig, rng: np.random.Generator):
    p = config.policy
    if isinstance(config.acceptance, Replay):
        return ReplayDraws(list(config.acceptance.records))
    miss_source = Source.of_backup(p.backup) if p.strategy is Strategy.SSD else Source.DRAFT
    return TableDraws(config.acceptance, config.hits, p.K, miss_source, p.fanout, p.fanout_backup, rng)


def simulate(config: SimConfig, *, trace: bool = False) -> SimResult:
    """Run one configuration until `rounds` target forwards (or `requests` completions) have happened."""
    p, wl = config.policy, config.workload
    env = simpy.Environment()
    # independent streams: the workload does not change when only the policy does
    work_rng, draw_rng = np.random.default_rng(config.seed).spawn(2)
    rec = Recorder(p.K, trace)
    source = RequestSource(wl, work_rng)
    closed = isinstance(wl, ClosedLoop)
    batch = Batch(env, wl.max_batch, source, rec, closed)
    link = config.link if p.strategy is Strategy.SSD else LinkSpec()  # SD's draft shares the target's devices
    to_draft = Link(env, link, "link_to_draft", rec.spans)
    to_target = Link(env, link, "link_to_target", rec.spans)
    # a timing fitted with the SSD worker's interference applies it to SSD's verifies only (simulator.fit)
    timing = config.timing.for_strategy(p.strategy) if hasattr(config.timing, "for_strategy") else config.timing
    bed = Testbed(
        env,
        strategy=p.strategy,
        K=p.K,
        backup=p.backup,
        budget=p.budget,
        budget_backup=p.budget_backup,
        miss_policy=p.miss_policy,
        timing=timing,
        draws=_draws(config, draw_rng),
        batch=batch,
        recorder=rec,
        to_draft=to_draft,
        to_target=to_target,
        spec_bytes_per_seq=p.K * (TOKEN_ID_BYTES + config.draft_probs_bytes),
        outcome_bytes_per_seq=OUTCOME_BYTES,
        max_rounds=config.rounds,
        # a replayed run ends with its last request
        max_requests=config.requests or (wl.requests if isinstance(wl, Replayed) else None),
        prefill_ahead=config.prefill_overlap and p.strategy is Strategy.SSD,
    )
    if isinstance(wl, ClosedLoop):
        for _ in range(wl.concurrency):
            batch.queue.put(source.next_request(0.0))
    else:
        env.process(arrivals(env, batch, source))
    if p.strategy is Strategy.AR:
        env.process(ar_decoder(env, bed))
    else:
        env.process(verifier(env, bed))
        worker = ssd_draft_worker if p.strategy is Strategy.SSD else sd_draft_worker
        env.process(worker(env, bed))
    env.run(until=bed.done)
    links = {"to_draft": to_draft.busy_ms, "to_target": to_target.busy_ms}
    result = summarize(rec, p.strategy.value, config.settings(), env.now, config.accelerators, links)
    return replace(result, timeline=tuple(rec.spans or ())) if trace else result


def rounds_per_second(config: SimConfig) -> tuple[float, float]:
    """Speed of the simulator on one configuration: simulated rounds per second of wall time and of CPU time
    (the two differ when other work shares the cores)."""
    wall, cpu = time.perf_counter(), time.process_time()
    result = simulate(config)
    return result.rounds / (time.perf_counter() - wall), result.rounds / (time.process_time() - cpu)
