"""The power-law miss model (Def. 11) and fitting its exponent r from measured (fan-out, miss-rate) pairs.

Def. 11 (empirical): guessing the bonus token with F guesses misses with probability `1 − p_hit(F) ≈ F^(−r)`.
We carry an optional scale `a` (miss ≈ a·F^(−r), a = 1 being docs/ssd.md's form) because measured miss
rates at F = 1 are well below 1 (the top-1 guess often hits), which a = 1 cannot express. The scale does
not move the optimal schedule of Thm 12, only the modelled hit probability.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from scipy import optimize, stats

from theory._checks import FloatOrArray, as_float, as_nonnegative, as_positive, scalar_or_array


def miss_rate(F: npt.ArrayLike, r: npt.ArrayLike, scale: npt.ArrayLike = 1.0) -> FloatOrArray:
    """Modelled miss rate with F guesses: `min(1, a·F^(−r))`, and 1 for F = 0 (nothing guessed).

    Def. 11. The cap at 1 matters for F < 1 (real-valued schedules) and for a > 1; a probability it is.
    """
    F = as_nonnegative(F, "F", " (number of guesses)")
    r = as_positive(r, "r", " (power-law exponent of the miss rate)")
    scale = as_positive(scale, "scale", " (the a in miss ≈ a·F^(−r); 1 is docs/ssd.md's form)")
    with np.errstate(divide="ignore"):
        modelled = scale * np.power(F, -r)  # inf at F = 0, capped below
    return scalar_or_array(np.minimum(1.0, modelled))


@dataclass(frozen=True)
class PowerLawFit:
    """The fitted miss model `miss ≈ scale·F^(−r)` with the uncertainty of r.

    `r_ci` is the two-sided `confidence` interval for r from Student's t with `dof` degrees of freedom.
    `log_scale_stderr` is the standard error of log(scale) (None when the scale was fixed to 1).
    """

    r: float
    r_stderr: float
    r_ci: tuple[float, float]
    confidence: float
    scale: float
    log_scale_stderr: float | None
    n_points: int
    dof: int
    method: str


def _check_points(fanout: npt.ArrayLike, miss: npt.ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    F = as_float(fanout, "fanout").ravel()
    m = as_float(miss, "miss").ravel()
    if F.shape != m.shape:
        raise ValueError(f"give one miss rate per fan-out: {F.size} fan-outs but {m.size} miss rates")
    if np.any(F < 1):
        raise ValueError("fan-outs must be >= 1: the power law describes 1 or more guesses")
    if np.any((m <= 0) | (m > 1)):
        raise ValueError(
            "miss rates must lie in (0, 1]: a measured 0 has no logarithm (measure more rounds or drop it)"
        )
    if np.unique(F).size < 2:
        raise ValueError("need at least two distinct fan-outs to fit a slope")
    return F, m


def fit_r(
    fanout: npt.ArrayLike,
    miss: npt.ArrayLike,
    confidence: float = 0.95,
    fix_scale: bool = False,
) -> PowerLawFit:
    """Fit r in `1 − p_hit(F) ≈ a·F^(−r)` (Def. 11) by least squares on log-log axes.

    Why log-log least squares: a miss rate estimated from n rounds has a *relative* error that is roughly
    constant across F (the rate falls by an order of magnitude over the sweep), so the noise is close to
    additive and homoscedastic in log(miss); ordinary least squares there is the natural estimator, has a
    closed form (no starting guess), and gives the exact t-based standard error and interval under
    log-normal noise. Fitting `a·F^(−r)` directly (curve_fit on the raw rates) would let the large early
    miss rates dominate.

    - default (`fix_scale=False`): `scipy.stats.linregress` of log(miss) on log(F); slope = −r,
      intercept = log(a); n − 2 degrees of freedom (needs ≥ 3 points for an uncertainty).
    - `fix_scale=True`: docs/ssd.md's exact form `F^(−r)` (a = 1), a line through the origin fitted with
      `scipy.optimize.curve_fit`; n − 1 degrees of freedom (needs ≥ 2 points, F = 1 carries no information).

    The interval is `r ± t_{dof, (1+confidence)/2}·stderr`. With a perfect fit the stderr is 0.
    """
    F, m = _check_points(fanout, miss)
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must lie in (0, 1), e.g. 0.95; got {confidence}")
    x, y = np.log(F), np.log(m)
    if fix_scale:
        dof = F.size - 1
        if dof < 1 or not np.any(x > 0):
            raise ValueError("fixing the scale needs at least two points with a fan-out above 1")
        popt, pcov = optimize.curve_fit(lambda x_, r_: -r_ * x_, x, y, p0=[1.0])
        r, r_stderr = float(popt[0]), float(np.sqrt(pcov[0, 0]))  # pcov is scaled by the residual variance
        scale, log_scale_stderr, method = 1.0, None, "curve_fit: log(miss) = -r*log(F)"
    else:
        dof = F.size - 2
        if dof < 1:
            raise ValueError("fitting r and the scale needs at least 3 points (or pass fix_scale=True)")
        fit = stats.linregress(x, y)
        r, r_stderr = -float(fit.slope), float(fit.stderr)
        scale, log_scale_stderr = float(np.exp(fit.intercept)), float(fit.intercept_stderr)
        method = "linregress: log(miss) = log(a) - r*log(F)"
    half = float(stats.t.ppf(0.5 + confidence / 2, dof)) * r_stderr
    return PowerLawFit(
        r=r,
        r_stderr=r_stderr,
        r_ci=(r - half, r + half),
        confidence=confidence,
        scale=scale,
        log_scale_stderr=log_scale_stderr,
        n_points=int(F.size),
        dof=dof,
        method=method,
    )
