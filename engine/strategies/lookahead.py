"""How many tokens SD drafts next round: adaptive K from the past only (theory.adaptive).

Per row: forgotten acceptance counts (a round with k of K accepted adds k acceptances and, if k < K, one
rejection), whose Beta posterior mean is the row's α. Per proposer: an exponentially weighted mean of the
draft's time per forward, and of the verify's time per block width K + 1 (from the loop's measured verify
times); a width not yet seen is read off a straight line through the seen ones. The batch shares one K per
round (one target forward verifies every row): the K that maximises the batch's expected tokens per unit
time, Σ_b E(α_b, K) / (K·T_d + T_v(K + 1)).

Everything here is known before the round's draft starts, so the choice cannot bias the verifier
(docs/ssd.md §1: SD is exact for any proposal fixed before verification). With measured times the choice,
hence the seeded outputs, vary from run to run; `SpeculativeConfig.draft_cost` fixes T_d / T_v instead.
"""

from __future__ import annotations

import numpy as np
from scipy.optimize import nnls

from engine.config import SpeculativeConfig
from engine.ssd.policy import least_budget
from theory.adaptive import acceptance_estimate, best_K, miss_share, updated_counts, with_observations

TIMING_DECAY = 0.8  # weight of the past in the timing means
HIT_DECAY = 0.9  # weight of the past hit counts per answer (an effective memory of about 10 rounds)
WARM_START = 16.0  # observations' worth of the pooled α a new row starts with
REFRESH = 20  # a neighbouring K whose time is older than this many rounds (SSD: builds) is measured again
PROBE = 2  # rounds such a K is run for
UNMEASURED_DRAFT_COST = 0.1  # T_d / T_v assumed before both times have been measured once


class Lookahead:
    def __init__(self, spec: SpeculativeConfig):
        self.spec = spec
        self.accepted = np.zeros(0)  # [B] forgotten acceptances per row
        self.rejected = np.zeros(0)  # [B] forgotten rejections per row
        self.draft_ms: float | None = None  # per draft forward
        self.verify_ms: dict[int, float] = {}  # block width K + 1 -> mean verify time
        self.pooled: tuple[float, float] | None = None  # every row's acceptances and rejections, forgotten alike
        self.n_verified = 0  # rounds verified so far
        self.verified_at: dict[int, int] = {}  # K -> n_verified when a round of K was last verified
        self.asked_at: dict[int, int] = {}  # K -> the count (`_stamps`) when `_refreshed` last asked for it
        self.probe: tuple[int, int] | None = None  # (K, rounds left) of a refresh under way

    def admit(self, n: int) -> None:
        """New rows start from the α of the rows before them (`pooled`), worth WARM_START observations, rather
        than from the prior's ½: from ½ a request spent its first ~10 rounds at K = 1 while its α was learnt."""
        if self.pooled is None:
            start = (0.0, 0.0)
        else:
            alpha = float(acceptance_estimate(*self.pooled))
            start = (alpha * WARM_START, (1.0 - alpha) * WARM_START)
        self.accepted = np.append(self.accepted, np.full(n, start[0]))
        self.rejected = np.append(self.rejected, np.full(n, start[1]))

    def retire(self, keep: list[int]) -> None:
        self.accepted, self.rejected = self.accepted[keep], self.rejected[keep]

    def alphas(self) -> np.ndarray:
        """[B] each row's running α."""
        return np.atleast_1d(acceptance_estimate(self.accepted, self.rejected))

    def choose(self) -> int:
        """K for the next round: the spec's K unless adaptive."""
        spec = self.spec
        if not spec.adaptive:
            return spec.K
        if spec.draft_cost is not None:
            draft, verify = spec.draft_cost, 1.0
        elif self.draft_ms is None or not self.verify_ms:
            draft, verify = UNMEASURED_DRAFT_COST, 1.0
        else:
            draft, verify = self.draft_ms, self._verify_ms
        return self._refreshed(best_K(self.alphas(), draft, verify, K_max=self._K_max(), K_min=spec.K_min))

    def _stamps(self) -> tuple[dict[int, int], int]:
        """When each K's time was last measured, and the count now (SD: its verify, counted in rounds)."""
        return self.verified_at, self.n_verified

    def _refreshed(self, K: int) -> int:
        """K, or once every REFRESH neighbour of K whose time was last measured longer ago than that, so that it
        is measured again (afresh: a time that old is dropped when it comes in). A K timed in a slow moment is
        otherwise never chosen, hence never timed, again: a HumanEval run (int4 target) timed SSD's K = 2 build
        at 172 ms early on, ran K = 1 from then on, and never saw K = 2 build in 115 (its rounds 23% faster per
        token than K = 1's); an SD run kept K = 2 on a stale 128 ms verify of width 4 (it was 108 by then)."""
        if self.spec.draft_cost is not None:
            return K
        if self.probe is not None:  # a probe lasts PROBE rounds: SSD's first build at a new length is not timed
            k, left = self.probe
            self.probe = (k, left - 1) if left > 1 else None
            return k
        stamps, now = self._stamps()
        K_max = self._K_max()
        stale = [k for k in (K - 1, K + 1) if self.spec.K_min <= k <= K_max and k in stamps
                 and now - max(stamps[k], self.asked_at.get(k, 0)) > REFRESH]
        if not stale:
            return K
        k = min(stale, key=stamps.get)
        self.asked_at[k] = now
        self.probe = (k, PROBE - 1) if PROBE > 1 else None
        return k

    def _K_max(self) -> int:
        """The longest K worth considering: one past the longest K verified, so K climbs a step at a time and
        each block width is timed before the next (past the widths measured the verify is read off a line, flat
        from one width, while on a CPU it grows with the block). With fixed times (`draft_cost`) nothing is
        measured and every K up to the spec's is open."""
        spec = self.spec
        if spec.draft_cost is not None:
            return spec.K
        known = max((width - 1 for width in self.verify_ms), default=spec.K_min)
        return max(spec.K_min, min(spec.K, known + 1))

    def _verify_ms(self, width: int) -> float:
        return _read_off(self.verify_ms, width)

    def drafted(self, forwards: int, ms: float) -> None:
        if forwards:
            self.draft_ms = _mean(self.draft_ms, ms / forwards)

    def observe(self, accepted: list[int], K: int, verify_ms: float) -> None:
        if self.n_verified - self.verified_at.get(K, self.n_verified) > REFRESH:  # an old time: start afresh
            self.verify_ms.pop(K + 1, None)
        self.n_verified += 1
        self.verified_at[K] = self.n_verified
        self.accepted, self.rejected = updated_counts(self.accepted, self.rejected, accepted, K)
        pooled = with_observations(*(self.pooled or (0.0, 0.0)), np.sum(accepted), np.sum(np.asarray(accepted) < K))
        self.pooled = (float(pooled[0]), float(pooled[1]))
        self.verify_ms[K + 1] = _mean(self.verify_ms.get(K + 1), verify_ms)


def _mean(old: float | None, new: float) -> float:
    return new if old is None else TIMING_DECAY * old + (1 - TIMING_DECAY) * new


def _read_off(table: dict[int, float], x: int) -> float:
    """A measured time at x, or read off a straight line through the measured ones."""
    if x in table:
        return table[x]
    xs, times = zip(*sorted(table.items()))
    if len(xs) == 1:
        return times[0]
    slope, intercept = np.polyfit(xs, times, 1)
    return max(float(slope * x + intercept), min(times))  # a line fitted on noise may dip below 0


class SSDLookahead(Lookahead):
    """Adaptive K for SSD (engine.strategies.ssd): as for SD, with the draft's time counted only on the rounds
    that miss the cache (theory.adaptive.miss_share). The draft's time per token is the neural backup's
    (its time over the K it drafted, as the worker reports it), the hit rate a forgotten mean of the rows'
    lookups. All of it comes from rounds already answered or verified, so the K chosen is fixed before the
    round it is for is drafted or verified.

    A round's target-side time is its verify or, when longer, the worker's build of the cache it looks up (a
    hit waits for the build to end): branches K long cost K draft steps of every branch, and past a point they
    outlast the verify (measured, int4 target on HumanEval: K = 6 built in 488 ms against a 398 ms verify,
    where K = 3 built inside its verify).

    The build is modelled by what it does: a glue forward, then K forwards over its n branches, each forward a
    fixed part plus a part per branch,

        T_build(K, n) = (K + 1)·t_forward + K·n·t_branch,

    the two fitted (non-negative least squares) through one point per branch length built: that length's
    forgotten mean time and branch count. With one length only, t_branch = 0 (every forward costs the same):
    that rates a longer K high, and the climb (`_K_max`) then measures it, which gives the second point. The
    fit prices lengths not built yet. A length built keeps its own measured time, moved by t_branch to the
    branches it needs now (budget "auto" shrinks a cache sized for a longer K over several rounds, and taken as
    measured those builds kept a run at K = 4: 250 ms rounds for 4.7 tokens, against K = 3's 183 for 3.9), and
    `_refreshed` times it again when that time grows old. The measured builds are not linear in K (int4
    HumanEval, one row at the floor: 87, 115 and 214 ms at lengths 1, 2, 3), and the fit through so few points
    is loose (t_branch 12-25 ms, where one more row costs the int8 draft ~2 ms a forward).

    The branches a K needs: with budget "auto" the fewest the worker will build, one guess per outcome (K + 1
    a row; above that it sizes the budget to fit in the verify, so the round costs max(T_v, T_build at that
    floor)); with a fixed budget, the branches per row measured (a budget B is B guesses a row at any K).

    Keyed by length alone and never timed again, the build times went stale as budget "auto" resized the cache,
    and a line through them missed the growth with branches: a HumanEval run (int4 target) kept K = 4 at 348 ms
    rounds where K = 3 ran 233 ms ones. With t_forward taken as the neural backup's time per token (~30 ms,
    where a build's forward costs ~40 with its glue and bookkeeping), K = 2 looked slower than it is and runs
    stayed at K = 1. Builds answered without a branch count are read by length (a line past them).
    """

    def __init__(self, spec: SpeculativeConfig):
        super().__init__(spec)
        self.hits, self.lookups = 0.0, 0.0  # forgotten counts
        self.build_ms: dict[int, float] = {}  # branch length -> mean time of the worker's cache build
        self.build_branches: dict[int, float] = {}  # branch length -> mean branches of those builds
        self.branches_per_row: float | None = None  # mean branches a row in the builds (a fixed budget's B)
        self._build_fit: tuple[float, float] | None = None  # (t_forward, t_branch), refitted on each build
        self.n_builds = 0  # builds timed so far
        self.built_at: dict[int, int] = {}  # branch length -> n_builds when it was last timed
        self.last_built: int | None = None  # the branch length of the last build answered

    @property
    def p_hit(self) -> float:
        return (1.0 + self.hits) / (2.0 + self.lookups)  # prior: one hit, one miss

    def choose(self) -> int:
        spec = self.spec
        if not spec.adaptive:
            return spec.K
        rows = len(self.accepted)
        alphas = self.alphas() if rows else 0.5  # no row yet (the first request): the prior α
        share = miss_share(self.p_hit, max(rows, 1))
        K = best_K(alphas, self._draft() * share, self._verify(), K_max=self._K_max(), K_min=spec.K_min)
        return self._refreshed(K)

    def _stamps(self) -> tuple[dict[int, int], int]:
        """SSD's time is its build's (rounds past the verify are the build's): counted in builds."""
        return self.built_at, self.n_builds

    def choose_miss(self) -> int:
        """K for a round in which no row hits and the neural backup drafts every row: an SD round, so SD's
        choice, with the draft's time in full (not discounted by the hit rate as in `choose`)."""
        spec = self.spec
        if not spec.adaptive:
            return spec.K
        alphas = self.alphas() if len(self.accepted) else 0.5  # no row yet: the prior α
        return best_K(alphas, self._draft(), self._verify(), K_max=self._K_max(), K_min=spec.K_min)

    def _K_max(self) -> int:
        """The longest K worth considering: one past the longest branch length whose build has been timed (before
        any, one past the longest K verified), so K climbs a step at a time and each step is measured before the
        next. A build's time grows faster than its length (K + 1 branches of K steps at the smallest fan-out),
        and read off the lengths measured it looked cheap: on HumanEval (int4 target) a run jumped from K = 1 to
        8 before any build was timed and stayed there (955 ms rounds; K = 3 fixed: 275 ms, 8.6 against 6.2
        tokens/s). With fixed times (`draft_cost`) nothing is measured and every K up to the spec's is open."""
        spec = self.spec
        if spec.draft_cost is not None:
            return spec.K
        known = max(self.build_ms, default=max((width - 1 for width in self.verify_ms), default=spec.K_min))
        return max(spec.K_min, min(spec.K, known + 1))

    def _draft(self) -> float:
        if self.spec.draft_cost is not None:
            return self.spec.draft_cost
        if self.draft_ms is None or not self.verify_ms:
            return UNMEASURED_DRAFT_COST
        return self.draft_ms

    def _verify(self):
        if self.spec.draft_cost is not None or self.draft_ms is None or not self.verify_ms:
            return 1.0
        return self._round_ms

    def _round_ms(self, width: int) -> float:
        """The verify of `width` tokens, or the build of branches width − 1 long when that takes longer."""
        verify = self._verify_ms(width)
        return max(verify, self._build_ms(width - 1)) if self.build_ms else verify

    def _build_ms(self, K: int) -> float:
        """The build of branches K long: (K + 1)·t_forward + K·n·t_branch for the branches n it needs (class
        docstring). Builds answered without their branch count: the build measured at length K, read off the
        line through two lengths or more, or one length scaled by K + 1 (a glue forward and K branch steps)."""
        if self._build_fit is not None:
            t_forward, t_branch = self._build_fit
            rows = max(len(self.accepted), 1)
            if self.spec.budget == "auto" or self.branches_per_row is None:
                per_row = least_budget(self.spec, K)
            else:
                per_row = self.branches_per_row
            if K in self.build_branches:  # measured at this length: its time, moved to the branches needed now
                return max(self.build_ms[K] + K * (rows * per_row - self.build_branches[K]) * t_branch, 0.0)
            return (K + 1) * t_forward + K * rows * per_row * t_branch
        if K in self.build_ms or len(self.build_ms) > 1:
            return _read_off(self.build_ms, K)
        (known, ms), = self.build_ms.items()
        return ms * (K + 1) / (known + 1)

    def answered(self, hits: list[bool], K: int, neural_backup_ms: float | None, build_ms: float | None = None,
                 built_K: int | None = None, branches: int | None = None) -> None:
        """The worker's answer: the hit flag of each row that looked its outcome up, the length K of the
        speculation, the neural backup's time when it drafted some rows (None otherwise), and the time of the
        build of the cache it looked up, whose `branches` (over those rows) were `built_K` long."""
        if hits:
            self.hits = HIT_DECAY * self.hits + sum(hits)
            self.lookups = HIT_DECAY * self.lookups + len(hits)
        if neural_backup_ms is not None and K:
            self.drafted(K, neural_backup_ms)
        switched, self.last_built = built_K != self.last_built, built_K
        if build_ms and built_K and switched and built_K in self.build_ms:
            # The first build at a length the cache switches to is sized by budget "auto" for the old length (a
            # K = 3 build right after K = 4 ran long and sent a run back to K = 4): only a length not timed yet
            # (the climb needs one time) takes it.
            return
        if build_ms and built_K:
            if self.n_builds - self.built_at.get(built_K, self.n_builds) > REFRESH:  # an old time: restart
                self.build_ms.pop(built_K)
                self.build_branches.pop(built_K, None)
            self.build_ms[built_K] = _mean(self.build_ms.get(built_K), build_ms)
            self.n_builds += 1
            self.built_at[built_K] = self.n_builds
            if branches and hits:
                self.build_branches[built_K] = _mean(self.build_branches.get(built_K), float(branches))
                self.branches_per_row = _mean(self.branches_per_row, branches / len(hits))
                self._build_fit = build_fit(self.build_ms, self.build_branches)


def build_fit(build_ms: dict[int, float], branches: dict[int, float]) -> tuple[float, float]:
    """(t_forward, t_branch) ≥ 0 fitted to T(L) = (L + 1)·t_forward + L·n_L·t_branch through one point per branch
    length L timed with its branch count n_L; from one length, t_branch = 0."""
    lengths = [L for L in branches if L in build_ms]
    if len(lengths) == 1:
        (L,) = lengths
        return build_ms[L] / (L + 1), 0.0
    design = np.array([[L + 1.0, L * branches[L]] for L in lengths])
    (t_forward, t_branch), _ = nnls(design, np.array([build_ms[L] for L in lengths]))
    return float(t_forward), float(t_branch)
