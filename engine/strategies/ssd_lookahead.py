"""How many tokens SSD asks its worker for next round: adaptive K from the past only, as for SD
(engine.strategies.lookahead), with the draft's time counted only on the rounds that miss the cache and the
round's time the longer of the verify and the worker's cache build."""

from __future__ import annotations

import numpy as np
from scipy.optimize import nnls

from engine.config import SpeculativeConfig
from engine.ssd.policy import least_budget
from engine.strategies.lookahead import REFRESH, UNMEASURED_DRAFT_COST, Lookahead, decayed_mean, read_off
from theory.adaptive import best_K, miss_share

HIT_DECAY = 0.9  # weight of the past hit counts per answer (an effective memory of about 10 rounds)


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
            return read_off(self.build_ms, K)
        ((known, ms),) = self.build_ms.items()
        return ms * (K + 1) / (known + 1)

    def answered(
        self,
        hits: list[bool],
        K: int,
        neural_backup_ms: float | None,
        build_ms: float | None = None,
        built_K: int | None = None,
        branches: int | None = None,
    ) -> None:
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
            self.build_ms[built_K] = decayed_mean(self.build_ms.get(built_K), build_ms)
            self.n_builds += 1
            self.built_at[built_K] = self.n_builds
            if branches and hits:
                self.build_branches[built_K] = decayed_mean(self.build_branches.get(built_K), float(branches))
                self.branches_per_row = decayed_mean(self.branches_per_row, branches / len(hits))
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
