"""A timing model fitted from the engine's own per-round records (vidur: measure, then fit, then simulate).

Linear in what a forward touches, with non-negative coefficients (non-negative least squares, each
row weighted by 1/time so that small and large forwards count alike in relative terms):
- target forward over `rows` new positions with `kv` cached tokens read: v0 + v_row·rows + v_kv·kv
  (verify: rows = batch·(K+1), kv = batch·context; AR decode: rows = batch);
- draft forward: d0 + d_row·rows + d_kv·kv, fitted from SD drafting (K forwards of `batch` rows) and SSD
  neural backups (K forwards of the whole batch, hit rows masked). SD's first forward feeds two tokens a row
  after a round in which some row accepted all K (x_K, which the draft had not fed, and the bonus), so it has
  2·batch rows then (`sd_first_widths`): at batch 4, K 4 that step took 64 ms against 41 for the other
  three, and nearly every round has such a row; counting it as one token a row put batch 4's SD drafts ~12%
  under what they take (4 × 40.9 against 63.8 + 3 × 40.9 ms);
- a proposal's own cost beyond its forwards, p_call (one call of the draft: its set-up, the stacking of q
  and the tokens), added once to every SD proposal, neural backup and cache build. It is fitted only where
  the SD proposals span two lengths K or more (`saguaro calibrate` times one step beside its K steps): at one
  K it cannot be told from K times a step. It fitted 0 for the int4 pair: its SD K 1 on 2026-12-02
  (reports/2026-12-cpu-lowbit-vs-llamacpp), predicted 8-9% fast from a calibration at K 3, was short of its first step's
  second row (below), not of a call cost;
- a record may say its first step's width (`first_width`): `saguaro calibrate` times SD's one-step proposal
  feeding one token a row and two, so that even at batch 1 the fit sees the cost of a row (the int4 draft's
  step: 29.5 ms feeding one, 35.3 feeding two, in its Spec-Bench run of 2026-12-02);
- the SSD neural backup: the same shape fitted on the backups alone when the records hold three or more
  at two batch sizes and two contexts or more. The worker's masked pass over the batch is not SD's drafting:
  in the default pair's calibration its per-row cost was 2.8 ms a forward against SD's 0.8, so a pooled fit
  predicted the served backups at batch 5-8 15-20% too cheap;
- SSD cache build, as SSD runs it (next to the verify): a glue forward of batch·(K+1) rows, then K tree
  steps of `branches` rows. In draft steps that is D = d(batch·(K+1), batch·context) + K·d(branches,
  batch·context), but each branch's queries attend over its sequence's whole context (engines before the
  block KV cache also copied that KV per branch), and the worker shares the memory bandwidth with the
  verify, so the build is fitted (on the builds, once d is fitted) as
  s·D + e_row·K·branches + e_kv·(K+1)·branches·context + e_crowd·(K+1)·(branches·context)²/1e6: a scale,
  extra cost per branch row, the branches × context term, and a crowding term (1, 0, 0, 0 when the build is
  just draft steps). The crowding term is there because the branches' KV outgrows the caches: on the default
  pair's calibrations 64 branches at context 512 took 4.3-4.7 s and 128 took 12-14 s, and a line through
  4-128 branches missed the batch-1 builds the engine runs at both ends (16 branches took 0.79-0.85 of the
  line's time, 4 branches 1.16-1.34 times it). With it the build fit's error on seven calibrations fell
  from 10-21% to 9-15%, and the budget-16 rows of the held-out runs of 2026-12-01 from −4..−14% to +2..−8%;
- every context term is only as good as the contexts the records span: `saguaro calibrate --context`
  times the forwards at the workload's contexts (a calibration at 60-100 tokens under-predicted the
  verify, the draft and the build at ~300 by 15-50%);
- AR's one-token step: its own c0 + c_seq·batch + c_kv·kv when the records hold AR rounds at two or more
  batch sizes. One model for the (K+1)-row verify and the 1-row step predicted AR at batch 2 and 4 24% too
  slow: a step's fixed cost (reading the weights) is shared by the rows, the verify's per-row cost is not.
  The verify is then fitted on the verifies alone (SD's, at two row counts or more): the steps pulled its
  context term to a fifth of what the verifies show (the default pair's calibration: 0.020 against 0.111 ms
  a cached token; the AR step at 4 × 512 costs 422 ms, the verify 822) and its error to 14% (4% without);
- a one-row step runs other kernels than a multi-row one (on CPU the linears of a one-row bf16 forward take
  the matrix-vector path, and the one-token attention at batch 1 the masked SDPA kernel), and it can be
  dearer than a multi-row step: the calibration's AR step at 1 × 512 took 452 ms, at 4 × 512 422 ms, and at
  batch 1 the context cost 0.15 ms a token against 0.02 at batch 4. A line in rows cannot bend that way, so
  the step gets one-row terms, [batch = 1]·(u0 + u_kv·context), on top of the multi-row line: batch 1 is a
  regime of its own rather than the line's first point. They are non-negative like the rest (a one-row step
  cheaper than the line gets none) and used only when the AR rounds hold batch 1 and at least two other
  batch sizes (else the line's intercept and per-row slope cannot be told from the one-row offset: the
  former shape is fitted); u_kv only when batch 1 spans two contexts or more;
- the step's knee in batch: on a host without fast small GEMMs the step is not a line in the batch either. On
  an AVX2-only EPYC (float32, 2026-12-03) the default pair's step took 450, 900 and 1150 ms at batch 1, 2 and 4: the
  second row doubled the cost and the next two added a quarter. A line through them (the one-row terms can
  only raise batch 1) put batch 2 at 702-766 ms, and AR at batch 2 was predicted 19% fast. As the verify does,
  when the AR rounds span four batch sizes or more, or three with batch 1 (the one-row terms then take the
  place of a fourth), the fit also tries a knee at each inner batch size R, c0 + c_below·min(batch, R) +
  c_seq·max(batch − R, 0) + c_kv·batch·context (the one-row terms on top), and keeps it on the verify's rule
  (`decode_knee` = (R, c_below));
- the verify's knee: at a few rows the target's forward is not a line in the rows. The default pair's bf16
  verify at batch 1 took 249, 268 and 278 ms for 3, 4 and 6 rows, where the line through 5 rows (batch 1)
  and 20 (batch 4) said 231, 249 and 283, so SD at K 2 and 3 was predicted 8-12% fast. When the verifies
  span four row counts or more (`saguaro calibrate` times widths 2, 3, K + 1 and 2K at batch 1), the fit
  also tries a knee at each inner row count R, v0 + v_below·min(rows, R) + v_row·max(rows − R, 0) + v_kv·kv,
  and keeps the best knee if it cuts the relative error by at least a tenth, and by more than rounding error
  (`verify_knee` = (R, v_below));
- prefill: p0 + p_row·batch·tokens + p_att·batch·tokens² for the target and for the draft (`saguaro
  calibrate` times prefills at several lengths and batch sizes). The last term is causal attention, quadratic
  in each sequence's length: the default pair's target took 8119 ms for 1 × 512 tokens and 7427 for 4 × 128,
  the same rows. It is fitted where three prefills or more tell it from the other two (else p_att = 0);
- per-round engine overhead per strategy and the fast backups' cost: medians of what the forwards leave. A
  calibration's timed points leave nothing (each point's round is its verify and its drafting), so where a
  calibration recorded the engine's host work (`saguaro calibrate`: simulator.host_terms, the work outside the
  round's timers with the forwards taken out, a line in the batch), `with_host_overhead` makes that the least
  a round's overhead is;
- the draft link latency: half the median wait of SSD rounds that hit with a build shorter than the verify
  (rounds the engine ran: `saguaro calibrate` ends with a few, at K 1; its build-beside-verify points record
  no wait and are left out);
- the level: a calibration's forwards run in short bursts, and a long run's rounds on the same machine
  can cost more (the default pair at K 5: the calibration's fit put the verify at 283 ms and the SD draft at
  156, a bench's SD rounds minutes later at 317 and 178, and SD's tokens/s was predicted 15% high).
  `FittedTiming.leveled` takes an SD run's rounds (the run a planner has anyway: α and hits come from it) and
  scales the target's forwards by its verifies' total over the fit's and the draft's forwards (draft,
  backup, build, prefill) by the same ratio of its drafts: the calibration keeps the shapes (rows, context,
  branches, interference), the run sets the level. A ratio of totals, not a median of per-round ratios:
  tokens/s is a ratio of totals, so a run's slow rounds count in it. On an unsteady host (the int4 runs of
  2026-12-02 02:52) a run's verify had a mean 1.08-1.12 times its median, and the median left that run's own
  SD rows 8-11% fast; with totals, 61 of 73 held-out rows of 2026-12-01 and 12-02 fell within 10% instead of
  52, and 19 of the 20 served figures of 2026-12-01 21:50 within 15% instead of 17
  (reports/2026-12-cpu-prediction-accuracy). A ratio within `LEVEL_DEAD_BAND` of 1 is left unapplied:
  that close, it is as likely the fit's shape at the run's K as the machine (a run at the calibration's level
  measured 0.97 and 0.96 against its SD K 5 rounds, and applied, that moved five of its six SSD predictions
  4-5 points further off);
- the build level (measured, applied only on request): `saguaro calibrate` times its builds with its own harness
  (a build of random guesses over a copy of the prompt's KV, one verify beside it), and on this 2-core VM the
  engine's own builds of the same shape have run 12-37% cheaper within minutes (batch 1, K 4, 8 branches,
  context 150: 422 and 350 ms in the calibrations before and after, 311 in the engine's SSD between them).
  `saguaro calibrate --build-tokens N` ends with the engine's own SSD at the workload's K and a budget, at each
  batch size, its rounds marked level "build"; `build_level` is, per batch size, their total build time over
  the fitted line's at their shapes (rounds whose cache was built for their own batch). Those rounds inform
  nothing else. `with_build_level()` scales the line by it (linear in the batch between the sizes measured,
  held beyond). It is not applied by default: on the held-out runs of 2026-12-02 10:50 (an hour of runs, the
  calibration after them; reports/2026-12-cpu-prediction-accuracy) it measured ×0.88, ×0.91 and ×1.07 at batch 1, 4
  and 8, and applied, it put 11 of 21 engine rows within 10% instead of 16 and 8 of 20 served figures within
  15% instead of 14: the builds of those runs cost what the harness said, not what the engine's rounds at the
  end of the calibration cost. The harness's build alone grows with the context: at 64 and 512 tokens, batch 1
  with 16 branches took 494-513 and 938-984 ms (2026-12-04);
- builds alone (`saguaro calibrate --builds-alone`, records marked level "alone", an experiment): the build
  line is fitted on the builds timed with the target idle, and `build_beside` is the median of the builds
  beside the verify over that line (the records' SSD builds, the calibration's and any run's). Beside the
  calibration's verify a build ran ×0.96-1.57 its time alone (a calibration of 2026-12-04 11:40, 24 points,
  median ×1.15). On the held-out runs of 2026-12-04 09:02 with that calibration, 7 of 11 engine rows came
  within 10% this way against 10 of 11 with
  the line through the builds beside, and 12 of 20 served figures within 15% against 8: no better overall, so
  the builds beside stay the default. At one shape (batch 1, 8 branches, context 64) the build beside the
  verify took ×1.5 its time alone in one calibration and ×1.0-1.2 in four shorter ones 40 minutes later, the
  builds alone 302-344 ms in those five (up to 475 in two later ones, after their big points): a slowdown one
  calibration measures and the next does not reproduce;
- interference: the SSD worker builds its cache while the target verifies, and on one machine (shared
  memory bandwidth) that slows the verify. The verifier is fitted on the AR and SD rounds when there are
  any, and `ssd_verify_factor` is the median of SSD rounds' verify over that fit's prediction (1 when the
  records hold only SSD rounds: the fit then already includes it). `saguaro calibrate` records both kinds.
Where a record holds the SSD wait rather than the backup's time (`RoundRecord.backup_time_ms` is None),
a neural backup is not used for the draft fit and a fast backup's time is its round's wait less the link
or, where the looked-up build outlasted the verify, less the rest of that build (the engine's per-row
miss policy finishes the build before the backup).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TypeVar, cast

import numpy as np
from scipy.optimize import nnls

from simulator.records import RoundRecord
from simulator.timing import computed_share
from theory.glossary import Backup, Strategy

Coef = tuple[float, float, float]
FOOTPRINT_SCALE = 1e6  # the build's crowding term is per (K+1)·(branches·context)² / 1e6 (a well-scaled column)
LEVEL_DEAD_BAND = 0.05  # `leveled` leaves a ratio this close to 1 unapplied


_Coefs = TypeVar("_Coefs", Coef, tuple[float, float])


def _coef(values: Sequence[float]) -> Coef:
    """Three fitted coefficients as a `Coef` (ValueError for another count)."""
    a, b, c = values
    return float(a), float(b), float(c)


def _pair(values: Sequence[float]) -> tuple[float, float]:
    a, b = values
    return float(a), float(b)


def _scaled(coef: _Coefs | None, s: float) -> _Coefs | None:
    """Every coefficient times s; None stays None."""
    return None if coef is None else cast(_Coefs, tuple(c * s for c in coef))


def _fit_linear(rows: list[list[float]], y: list[float]) -> tuple[tuple[float, ...], float]:
    """Non-negative least squares on relative error; returns the coefficients and the relative RMS error.

    Records of one shape (the same design row: a calibration's repeats) enter as their median, weighted by
    their number, so that one stalled forward does not pull the fit (the default pair's calibration timed
    an AR step at 4 × 64 at 383, 824 and 374 ms: the mean moved the step's fit by up to 4% and its error from
    6% to 16%). The error is over the shapes, the same way: what the model misses, not the repeats' spread."""
    groups: dict[tuple[float, ...], list[float]] = {}
    for row, value in zip(rows, y, strict=True):
        groups.setdefault(tuple(float(v) for v in row), []).append(float(value))
    A = np.asarray(list(groups), dtype=float)
    b = np.asarray([np.median(v) for v in groups.values()])
    n = np.asarray([len(v) for v in groups.values()], dtype=float)
    w = np.sqrt(n) / np.maximum(b, 1e-6)
    Aw = A * w[:, None]
    scale = np.abs(Aw).max(axis=0)
    scale[scale == 0] = 1.0
    x, _ = nnls(Aw / scale, b * w)
    coef = x / scale
    rel = (A @ coef - b) / np.maximum(b, 1e-6)
    return tuple(float(c) for c in coef), float(np.sqrt(np.average(rel**2, weights=n)))


@dataclass(frozen=True)
class FittedTiming:
    """Fitted coefficients (ms): a TimingModel. `errors`: relative RMS error of each fitted part."""

    verify: Coef
    decode: Coef | None = None  # AR's one-token step, when the records hold AR rounds at two batch sizes
    decode_one_row: tuple[float, float] | None = None  # (u0, u_kv): a batch-1 step's own terms (see above)
    draft: Coef | None = None
    prefill_target: tuple[float, float] | None = None
    prefill_draft: tuple[float, float] | None = None
    prefill_attention: tuple[float, float] = (0.0, 0.0)  # p_att of the target's and the draft's prefill
    overhead: dict = field(default_factory=dict)  # strategy value -> ms per round
    fast_backup_ms: dict = field(default_factory=dict)  # backup value -> ms
    link_latency_ms: float = 0.0
    ssd_verify_factor: float = 1.0  # the verify's slowdown while the SSD worker builds next to it
    build: tuple[float, ...] | None = None  # (s, e_row, e_kv, e_crowd): the cache build (see above)
    build_beside: float = 1.0  # a build beside the verify over the build line (1 when the line is fitted beside it)
    backup: Coef | None = None  # the neural backup's own draft-forward coefficients (see above)
    errors: dict = field(default_factory=dict)
    counts: dict = field(default_factory=dict)
    levels: dict = field(default_factory=dict)  # `leveled`: "target", "draft" applied, "measured", "rounds"
    verify_knee: tuple[float, float] | None = None  # (R, v_below): rows up to R cost v_below each (see above)
    decode_knee: tuple[float, float] | None = None  # (R, c_below): the AR step's batch sizes up to R (see above)
    draft_call: float = 0.0  # p_call: a draft proposal's own cost beyond its forwards (see above)
    build_level: tuple[tuple[int, float], ...] = ()  # (batch, the engine's builds over the line's): measured
    build_scale: tuple[tuple[int, float], ...] = ()  # the build level as applied (`with_build_level`): () = none
    host_overhead: dict = field(default_factory=dict)  # strategy value -> (ms, ms per sequence): measured host work

    def leveled(self, records: list[RoundRecord], dead_band: float = LEVEL_DEAD_BAND) -> FittedTiming:
        """This fit at the level of an SD run's rounds: the target's forwards scaled by the run's total verify
        time over this fit's, the draft's by its total draft time over this fit's, each unless within
        `dead_band` of 1 (module docstring). `levels` holds the scales applied and the ratios measured.
        ValueError without three SD decode rounds or without a fitted draft."""
        pairs = [
            (r, w)
            for r, w in zip(records, sd_first_widths(records), strict=True)
            if r.is_decode and r.strategy is Strategy.SD and r.draft_ms > 0
        ]
        rounds = [r for r, _ in pairs]
        if len(rounds) < 3:
            raise ValueError(
                f"leveling needs an SD run's decode rounds (3 or more with a draft time), got "
                f"{len(rounds)}: give the records of a saguaro bench SD run"
            )
        if self.draft is None:
            raise ValueError("this fit has no draft time to level: fit it on a calibration (saguaro calibrate)")
        target = sum(r.verify_ms for r in rounds) / sum(
            self.verify_ms(r.batch_size, r.K + 1, r.context_len) for r in rounds
        )
        draft = sum(r.draft_ms for r in rounds) / sum(
            self.draft_ms(r.batch_size, r.K, r.context_len, w) for r, w in pairs
        )
        measured = {"target": target, "draft": draft}
        target, draft = (1.0 if abs(x - 1.0) <= dead_band else x for x in (target, draft))
        build = None if self.build is None else (self.build[0], *(c * draft for c in self.build[1:]))
        knee = None if self.verify_knee is None else (self.verify_knee[0], self.verify_knee[1] * target)
        step_knee = None if self.decode_knee is None else (self.decode_knee[0], self.decode_knee[1] * target)
        return replace(
            self,
            verify=_coef([c * target for c in self.verify]),
            verify_knee=knee,
            decode=_scaled(self.decode, target),
            decode_knee=step_knee,
            decode_one_row=_scaled(self.decode_one_row, target),
            prefill_target=_scaled(self.prefill_target, target),
            draft=_scaled(self.draft, draft),
            backup=_scaled(self.backup, draft),
            build=build,
            prefill_draft=_scaled(self.prefill_draft, draft),
            draft_call=self.draft_call * draft,
            prefill_attention=(self.prefill_attention[0] * target, self.prefill_attention[1] * draft),
            levels={"target": target, "draft": draft, "measured": measured, "rounds": len(rounds)},
        )

    def level_text(self) -> str:
        """What `leveled` applied and measured, in one line for a report ("" when not leveled)."""
        if not self.levels:
            return ""
        applied, measured = self.levels, self.levels["measured"]
        return (
            f"target ×{applied['target']:.3f}, draft ×{applied['draft']:.3f} applied (measured "
            f"×{measured['target']:.3f}, ×{measured['draft']:.3f} over {applied['rounds']} SD rounds; within "
            f"{LEVEL_DEAD_BAND:.0%} of 1 left at 1)"
        )

    def with_build_level(self) -> FittedTiming:
        """This fit with its cache builds scaled to the engine's build rounds (`build_level`, module docstring).
        ValueError without them."""
        if not self.build_level:
            raise ValueError(
                "these records hold no engine build rounds to level the builds: calibrate with "
                "saguaro calibrate --build-tokens N"
            )
        return replace(self, build_scale=self.build_level)

    def build_level_text(self) -> str:
        """The build level by batch size, in one line for a report ("" without the engine's build rounds)."""
        if not self.build_level:
            return ""
        levels = ", ".join(f"×{x:.3f} at batch {b}" for b, x in self.build_level)
        return f"builds: the engine's over the line's {levels} ({self.counts.get('build_level', 0)} rounds), " + (
            "applied" if self.build_scale else "not applied"
        )

    def with_host_overhead(self, outside: dict) -> FittedTiming:
        """This fit with the engine's measured host work outside a round's timers (strategy value -> (ms, ms per
        sequence), simulator.host_terms.outside_terms) as the least each round's overhead is."""
        return replace(self, host_overhead={s: (float(a), float(b)) for s, (a, b) in outside.items()})

    def _target(self, rows: int, kv: int) -> float:
        return _verify_time(self.verify, self.verify_knee, rows, kv)

    def _draft(self, rows: int, kv: int, coef: Coef | None = None) -> float:
        if self.draft is None:
            raise ValueError(
                "these records hold no SD or SSD rounds, so the draft's time was not fitted: "
                "add a calibration run of SD or SSD"
            )
        d0, d_row, d_kv = coef or self.draft
        return d0 + d_row * rows + d_kv * kv

    def verify_ms(self, batch: int, tokens: int, context: int) -> float:
        if tokens == 1 and self.decode is not None:
            step = _verify_time(self.decode, self.decode_knee, batch, batch * context)
            if batch == 1 and self.decode_one_row is not None:
                u0, u_kv = self.decode_one_row
                step += u0 + u_kv * context
            return step
        return self._target(batch * tokens, batch * context)

    def for_strategy(self, strategy: Strategy) -> FittedTiming:
        """The timing as that strategy sees it: SSD's verify carries the worker's interference."""
        if Strategy(strategy) is not Strategy.SSD or self.ssd_verify_factor == 1.0:
            return self
        f = self.ssd_verify_factor
        knee = None if self.verify_knee is None else (self.verify_knee[0], self.verify_knee[1] * f)
        return replace(self, verify=_coef([c * f for c in self.verify]), verify_knee=knee, ssd_verify_factor=1.0)

    def draft_ms(self, batch: int, K: int, context: int, first_width: int = 1) -> float:
        if not K:
            return 0.0
        return (
            self.draft_call
            + self._draft(batch * first_width, batch * context)
            + (K - 1) * self._draft(batch, batch * context)
        )

    def cache_build_ms(self, batch: int, K: int, branches: int, context: int) -> float:
        return self._build_line(batch, K, branches, context) * self.build_beside * self.build_level_at(batch)

    def _build_line(self, batch: int, K: int, branches: int, context: int) -> float:
        steps = (
            self.draft_call + self._draft(batch * (K + 1), batch * context) + K * self._draft(branches, batch * context)
        )
        if self.build is None:
            return steps
        s, *extra = self.build
        return s * steps + sum(c * x for c, x in zip(extra, _build_terms(K, branches, context), strict=True))

    def build_level_at(self, batch: int) -> float:
        """The applied build level at `batch`: linear between the batch sizes measured, held beyond them, 1 when
        none is applied (module docstring)."""
        if not self.build_scale:
            return 1.0
        batches, ratios = zip(*self.build_scale, strict=True)
        return float(np.interp(batch, batches, ratios))

    def backup_ms(self, backup: Backup, rows: int, K: int, context: int) -> float:
        if backup is Backup.NEURAL:
            if self.backup is not None:  # fitted on the backups themselves, their own call cost included
                return K * self._draft(rows, rows * context, self.backup)
            return self.draft_call + K * self._draft(rows, rows * context)
        if backup.value not in self.fast_backup_ms:
            raise ValueError(
                f"no SSD rounds with the {backup.value} backup missed in the calibration records: "
                f"its time is unknown (calibrate with that backup)"
            )
        return self.fast_backup_ms[backup.value]

    def prefill_ms(self, strategy: Strategy, batch: int, tokens: int, cached: int = 0) -> float:
        """The prefill line (module docstring) over the computed tokens: with `cached` of them from the prefix
        cache, batch·(tokens − cached) rows and the attention term's tokens² less cached² (the pairs of the
        computed positions: each attends to every position before it, cached or not)."""
        computed_share(tokens, cached)  # the ValueError for a cached count out of range
        rows, pairs = batch * (tokens - cached), batch * (tokens**2 - cached**2)
        if self.prefill_target is None:
            target_ms = self._target(rows, batch * cached)
        else:
            target_ms = self.prefill_target[0] + self.prefill_target[1] * rows + self.prefill_attention[0] * pairs
        return target_ms + self.draft_prefill_ms(batch, tokens, cached) if strategy is Strategy.SD else target_ms

    def draft_prefill_ms(self, batch: int, tokens: int, cached: int = 0) -> float:
        computed_share(tokens, cached)
        if self.prefill_draft is None:
            return 0.0
        rows, pairs = batch * (tokens - cached), batch * (tokens**2 - cached**2)
        return self.prefill_draft[0] + self.prefill_draft[1] * rows + self.prefill_attention[1] * pairs

    def overhead_ms(self, strategy: Strategy, batch: int = 1) -> float:
        fitted = self.overhead.get(strategy.value, 0.0)
        host = self.host_overhead.get(strategy.value)
        return fitted if host is None else max(fitted, host[0] + batch * host[1])


def _build_terms(K: int, branches: int, context: int) -> tuple[float, float, float]:
    """The build's terms beyond its draft steps, in the order of `FittedTiming.build[1:]`: branch rows, the
    branches' KV read, and its crowding once that KV outgrows the caches (module docstring)."""
    footprint = branches * context
    return K * branches, (K + 1) * footprint, (K + 1) * footprint**2 / FOOTPRINT_SCALE


def _verify_time(verify: Coef, knee: tuple[float, float] | None, rows: float, kv: float) -> float:
    v0, v_row, v_kv = verify
    if knee is None:
        return v0 + v_row * rows + v_kv * kv
    R, v_below = knee
    return v0 + v_below * min(rows, R) + v_row * max(rows - R, 0.0) + v_kv * kv


KNEE_GAIN = 0.1  # a knee is kept only if it cuts the verify fit's relative error by at least this share
KNEE_FLOOR = 1e-6  # ... and by more than this much: a line that fits to rounding error has nothing to cut


def _fit_verify(records: list[RoundRecord]) -> tuple[Coef, tuple[float, float] | None, float]:
    """(v0, v_row, v_kv), the knee (R, v_below) or None, and the relative RMS error (module docstring)."""
    X = [[1.0, float(r.batch_size * (r.K + 1)), float(r.batch_size * r.context_len)] for r in records]
    y = [r.verify_ms for r in records]
    line, error = _fit_linear(X, y)
    best: tuple[Coef, tuple[float, float] | None, float] = (_coef(line), None, error)
    counts = sorted({x[1] for x in X})
    if len(counts) < 4:
        return best
    for R in counts[1:-1]:
        coef, err = _fit_linear([[1.0, min(x[1], R), max(x[1] - R, 0.0), x[2]] for x in X], y)
        if err < best[2] and err <= error * (1 - KNEE_GAIN) and error - err > KNEE_FLOOR:
            best = ((coef[0], coef[2], coef[3]), (R, coef[1]), err)
    return best


def link_waits(records: list[RoundRecord]) -> list[float]:
    """The waits that time the link: SSD rounds whose every row hit with a build shorter than the verify, so
    the target waited for the messages and the worker's answer only. A calibration's build-beside-verify points
    record no wait (0.0) and are left out: only rounds the engine ran count."""
    return [
        r.wait_ms
        for r in records
        if r.hit
        and all(r.hit)
        and r.cache_build_ms is not None
        and r.cache_build_ms < r.verify_ms
        and r.wait_ms is not None
        and r.wait_ms > 0
    ]


def _builds(records: list[RoundRecord]) -> list[RoundRecord]:
    return [r for r in records if r.strategy is Strategy.SSD and r.cache_build_ms and r.cache_build_ms > 0]


def _build_shape(r: RoundRecord) -> tuple[int, int, int, int, float]:
    """(batch, K, branches, context, cache_build_ms) of one of `_builds`."""
    if r.branches is None or r.cache_build_ms is None:
        raise ValueError(f"an SSD round with a cache build records its branches and cache_build_ms; got {r}")
    return r.batch_size, r.K, r.branches, r.context_len, r.cache_build_ms


def sd_first_widths(records: list[RoundRecord]) -> list[int]:
    """Per record, the tokens a row feeds in SD's first draft forward of that round: what the record says where
    it says (`first_width`: a calibration's timed proposals), else 2 when the SD decode round before it, in the
    same generate() call (a later round, context not shorter), had a row that accepted all its K
    (engine/strategies/sd.py: that row feeds x_K and the bonus; the block is as wide as its widest row), else
    1 (a call's first round, other strategies)."""
    widths, before = [], None
    for r in records:
        width = 1
        if r.first_width is not None:
            width = r.first_width
        elif r.is_decode and r.strategy is Strategy.SD:
            if (
                before is not None
                and r.round > before.round
                and r.context_len >= before.context_len
                and before.K > 0
                and any(k == before.K for k in before.accepted)
            ):
                width = 2
            before = r
        widths.append(width)
    return widths


def _draft_rows(records: list[RoundRecord]) -> tuple[list[list[float]], list[float]]:
    """Design rows [calls, forwards, Σ rows, Σ kv] and times of SD's drafts and the neural backups in the
    records; the calls column is dropped (all zero) unless the SD drafts span two lengths K or more, where a
    call's own cost can be told from its steps' (module docstring)."""
    X, y, lengths = [], [], set()
    for r, width in zip(records, sd_first_widths(records), strict=True):
        b, K, kv = r.batch_size, r.K, r.batch_size * r.context_len
        if r.strategy is Strategy.SD and r.draft_ms > 0:
            X.append([1.0, K, (K - 1 + width) * b, K * kv])
            y.append(r.draft_ms)
            lengths.add(K)
        elif r.strategy is Strategy.SSD:
            missed = (r.hit or ()).count(False)
            backup_ms = r.backup_time_ms
            if r.backup is Backup.NEURAL and missed and backup_ms:  # it drafts every row (hits masked)
                X.append([1.0, K, K * b, K * kv])
                y.append(backup_ms)
    if len(lengths) < 2:
        X = [[0.0, *row[1:]] for row in X]
    return X, y


def _fit_steps(steps: list[RoundRecord]) -> tuple[Coef, tuple[float, float] | None, tuple[float, float] | None, float]:
    """AR's one-token step: (c0, c_seq, c_kv), the one-row terms (u0, u_kv) or None, the knee in batch (R,
    c_below) or None, and the relative RMS error.

    The one-row terms and the knee only where the records can tell them from the line (see the module
    docstring); the knee is kept on the verify's rule (`KNEE_GAIN`, `KNEE_FLOOR`)."""
    one = [r for r in steps if r.batch_size == 1]
    batches = sorted({r.batch_size for r in steps})
    y = [r.verify_ms for r in steps]
    with_one_row = bool(one) and len(batches) >= 3
    with_kv = with_one_row and len({r.context_len for r in one}) >= 2

    def fit(R: int | None) -> tuple[list[float], float]:
        rows = []
        for r in steps:
            b = r.batch_size
            row = [1.0, b] if R is None else [1.0, min(b, R), max(b - R, 0)]
            row.append(b * r.context_len)
            if with_one_row:
                row += [float(b == 1)] + ([float(b == 1) * r.context_len] if with_kv else [])
            rows.append(row)
        coef, error = _fit_linear(rows, y)
        return list(coef), error

    def split(coef: list[float], R: int | None):
        if R is None:
            line, rest, knee = coef[:3], coef[3:], None
        else:
            line, rest, knee = [coef[0], coef[2], coef[3]], coef[4:], (float(R), coef[1])
        one_row = (rest[0], rest[1] if with_kv else 0.0) if with_one_row else None
        return tuple(line), one_row, knee

    coef, error = fit(None)
    best = (*split(coef, None), error)
    if len(batches) >= 4 or with_one_row:  # with_one_row: three batch sizes, batch 1 among them
        for R in batches[1:-1]:
            coef, err = fit(R)
            if err < best[3] and err <= error * (1 - KNEE_GAIN) and error - err > KNEE_FLOOR:
                best = (*split(coef, R), err)
    return best


def _fit_prefill(prefills: list[RoundRecord], ms: list[float]) -> tuple[tuple[float, float], float, float]:
    """(p0, p_row), p_att and the relative RMS error; p_att only where the records can tell it (rank 3)."""
    rows = [[1.0, r.batch_size * r.tokens, r.batch_size * r.tokens**2] for r in prefills]
    if len(rows) >= 3 and np.linalg.matrix_rank(np.asarray(rows) / np.abs(rows).max(axis=0)) == 3:
        coef, error = _fit_linear(rows, ms)
        return _pair(coef[:2]), coef[2], error
    coef, error = _fit_linear([row[:2] for row in rows], ms)
    return _pair(coef), 0.0, error


def fit_timing(records: list[RoundRecord]) -> FittedTiming:
    """Fit every part the records inform. ValueError if there is nothing to fit the verifier from."""
    leveling = [r for r in records if r.is_decode and r.level == "build"]
    lone = [r for r in _builds(records) if r.level == "alone"]
    records = [r for r in records if r.level is None]  # the build-level rounds inform the level only
    decode = [r for r in records if r.is_decode]
    prefill = [r for r in records if not r.is_decode]
    if len(decode) < 3:
        raise ValueError(f"need at least 3 decode rounds to fit timings, got {len(decode)}: record a longer run")
    errors, counts = {}, {}
    decode_fit = one_row = step_knee = None
    steps = [r for r in decode if r.strategy is Strategy.AR]
    if len(steps) >= 3 and len({r.batch_size for r in steps}) >= 2:
        decode_fit, one_row, step_knee, errors["decode"] = _fit_steps(steps)
        counts["decode"] = len(steps)
    alone = [r for r in decode if r.strategy is not Strategy.SSD]
    verifies = [r for r in alone if r.strategy is not Strategy.AR]
    if decode_fit is not None and len(verifies) >= 3 and len({r.batch_size * (r.K + 1) for r in verifies}) >= 2:
        alone = verifies  # the AR step has its own fit: the one-token steps must not bend the verify's
    plain = alone if len(alone) >= 3 else decode
    verify, knee, errors["verify"] = _fit_verify(plain)
    counts["verify"] = len(plain)
    ssd_verify_factor = 1.0
    busy = [r for r in decode if r.strategy is Strategy.SSD]
    if plain is alone and busy:

        def alone_ms(r: RoundRecord) -> float:
            return _verify_time(verify, knee, r.batch_size * (r.K + 1), r.batch_size * r.context_len)

        ssd_verify_factor = float(np.median([r.verify_ms / max(alone_ms(r), 1e-9) for r in busy]))
        counts["ssd_verify"] = len(busy)
    draft = build = None
    X, y = _draft_rows(decode)
    builds = _builds(decode)
    if len(y) < 3 and len(builds) >= 3:  # SSD records without backups: the builds alone inform the draft
        X = [[0.0, K + 1, b * (K + 1) + K * N, (K + 1) * b * c] for b, K, N, c, _ in map(_build_shape, builds)]
        y = [ms for *_, ms in map(_build_shape, builds)]
    draft_call = 0.0
    if len(y) >= 3:
        (draft_call, *coef), errors["draft"] = _fit_linear(X, y)
        draft = _coef(coef)
        counts["draft"] = len(y)
    backups = [
        (r, ms)
        for r in decode
        if r.strategy is Strategy.SSD
        and r.backup is Backup.NEURAL
        and (r.hit or ()).count(False)
        and (ms := r.backup_time_ms)
    ]
    backup_fit = None
    if (
        len(backups) >= 3
        and len({r.batch_size for r, _ in backups}) >= 2
        and len({r.context_len for r, _ in backups}) >= 2
    ):
        backup_coef, errors["backup"] = _fit_linear(
            [[r.K, r.K * r.batch_size, r.K * r.batch_size * r.context_len] for r, _ in backups],
            [ms for _, ms in backups],
        )
        backup_fit = _coef(backup_coef)
        counts["backup"] = len(backups)
    build_beside = 1.0
    line_from = lone if len(lone) >= 3 else builds
    if draft is not None and len(line_from) >= 3:
        partial = FittedTiming(verify=(0.0, 0.0, 0.0), draft=draft, draft_call=draft_call)
        shapes = [_build_shape(r) for r in line_from]
        build, errors["build"] = _fit_linear(
            [[partial.cache_build_ms(b, K, N, c), *_build_terms(K, N, c)] for b, K, N, c, _ in shapes],
            [ms for *_, ms in shapes],
        )
        counts["build"] = len(line_from)
        if line_from is lone and builds:
            line = replace(partial, build=build)
            build_beside = float(
                np.median([ms / line.cache_build_ms(b, K, N, c) for b, K, N, c, ms in map(_build_shape, builds)])
            )
            counts["build_beside"] = len(builds)
    build_level, leveled_rounds = _build_level(
        FittedTiming(verify=verify, draft=draft, draft_call=draft_call, build=build, build_beside=build_beside),
        leveling,
    )
    if build_level:
        counts["build_level"] = leveled_rounds
    prefill_target = prefill_draft = None
    attention = [0.0, 0.0]
    if len(prefill) >= 2:
        prefill_target, attention[0], errors["prefill_target"] = _fit_prefill(prefill, [r.verify_ms for r in prefill])
        with_draft = [r for r in prefill if r.draft_ms > 0]
        if len(with_draft) >= 2:
            prefill_draft, attention[1], errors["prefill_draft"] = _fit_prefill(
                with_draft, [r.draft_ms for r in with_draft]
            )
    overhead = {}
    for strategy in Strategy:
        rows = [r for r in decode if r.strategy is strategy]
        if rows:
            waited = [(r.wait_ms or 0.0) if strategy is Strategy.SSD else r.draft_ms for r in rows]
            residual = [r.round_ms - r.verify_ms - w for r, w in zip(rows, waited, strict=True)]
            overhead[strategy.value] = max(0.0, float(np.median(residual)))
    waits = link_waits(decode)
    link_ms = float(np.median(waits)) / 2 if waits else 0.0
    fast = {}
    ssd_overhead = overhead.get(Strategy.SSD.value, 0.0)

    def fast_backup_ms(r: RoundRecord) -> float | None:
        if r.backup_time_ms is not None:
            return r.backup_time_ms
        if r.wait_ms is None:  # neither the backup's time nor the target's wait: nothing to read it from
            return None
        # The wait also covers the link both ways and, per-row, the rest of the looked-up build
        # (cache_build_ms in such records) where it outlasted the verify.
        overrun = (r.cache_build_ms or 0.0) - r.verify_ms - ssd_overhead
        return max(0.0, r.wait_ms - max(2 * link_ms, overrun))

    for backup in (Backup.RANDOM, Backup.LOOKUP):
        times = [
            ms for r in decode if r.backup is backup and not all(r.hit or ()) if (ms := fast_backup_ms(r)) is not None
        ]
        if times:
            fast[backup.value] = float(np.median(times))
    return FittedTiming(
        verify=verify,
        verify_knee=knee,
        decode=decode_fit,
        decode_one_row=one_row,
        decode_knee=step_knee,
        backup=backup_fit,
        draft=draft,
        prefill_target=prefill_target,
        prefill_draft=prefill_draft,
        prefill_attention=_pair(attention),
        overhead=overhead,
        fast_backup_ms=fast,
        link_latency_ms=link_ms,
        ssd_verify_factor=ssd_verify_factor,
        build=build,
        build_beside=build_beside,
        errors=errors,
        counts=counts,
        draft_call=draft_call,
        build_level=build_level,
    )


BUILD_LEVEL_ROUNDS = 3  # engine rounds a batch size needs for its build level


def own_batch_builds(records: list[RoundRecord]) -> dict[int, list[RoundRecord]]:
    """The SSD rounds with a build whose looked-up cache was built for the round's own batch (its branches the batch
    times the fan-out's sum), by batch size in order: a round that a sequence joined, or after one finished,
    reports the build of another batch."""
    by_batch: dict[int, list[RoundRecord]] = {}
    for r in _builds(records):
        if r.fanout and r.branches == r.batch_size * sum(r.fanout):
            by_batch.setdefault(r.batch_size, []).append(r)
    return dict(sorted(by_batch.items()))


def _build_level(fitted: FittedTiming, rounds: list[RoundRecord]) -> tuple[tuple[tuple[int, float], ...], int]:
    """Per batch size, the engine's total build time over the fitted line's at the same shapes (module docstring),
    and how many rounds that took: only `own_batch_builds` count."""
    if fitted.draft is None or fitted.build is None:
        return (), 0
    levels, used = [], 0
    for b, at in own_batch_builds(rounds).items():
        if len(at) >= BUILD_LEVEL_ROUNDS:
            shapes = [_build_shape(r) for r in at]
            predicted = sum(fitted.cache_build_ms(b, K, N, c) for _, K, N, c, _ in shapes)
            levels.append((b, sum(ms for *_, ms in shapes) / predicted))
            used += len(at)
    return tuple(levels), used
