"""Input checks shared by the closed forms: each turns bad input into a `ValueError` that says what to do.

Every check returns a numpy array (0-d for a scalar), so callers broadcast freely and `scalar_or_array`
turns a 0-d result back into a plain float.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
# What the public functions return: np.float64 (a float) for scalar inputs, an array otherwise.
FloatOrArray = float | FloatArray

# A distribution may be off by float rounding (softmax in float32 sums to 1 ± 1e-7); more is a caller bug.
DISTRIBUTION_ATOL = 1e-6


def scalar_or_array(x: npt.NDArray) -> FloatOrArray:
    """0-d array -> numpy scalar (a `float`), otherwise the array itself."""
    return x[()] if x.ndim == 0 else x


def as_float(x: npt.ArrayLike, name: str) -> FloatArray:
    try:
        arr = np.asarray(x, dtype=np.float64)
    except (TypeError, ValueError) as err:
        raise ValueError(f"{name} must be a number or an array of numbers, got {x!r}") from err
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} must be finite (no NaN or inf), got {x!r}")
    return arr


def _show(arr: npt.NDArray, bad: npt.NDArray) -> str:
    """The first offending value, for the error message."""
    return repr(arr[bad].flat[0].item()) if arr.ndim else repr(arr.item())


def as_probability(x: npt.ArrayLike, name: str, hint: str = "") -> FloatArray:
    """Values in [0, 1]."""
    arr = as_float(x, name)
    bad = (arr < 0) | (arr > 1)
    if np.any(bad):
        raise ValueError(f"{name} is a probability and must lie in [0, 1]{hint}; got {_show(arr, bad)}")
    return arr


def as_nonnegative(x: npt.ArrayLike, name: str, hint: str = "") -> FloatArray:
    arr = as_float(x, name)
    bad = arr < 0
    if np.any(bad):
        raise ValueError(f"{name} must be >= 0{hint}; got {_show(arr, bad)}")
    return arr


def as_positive(x: npt.ArrayLike, name: str, hint: str = "") -> FloatArray:
    arr = as_float(x, name)
    bad = arr <= 0
    if np.any(bad):
        raise ValueError(f"{name} must be > 0{hint}; got {_show(arr, bad)}")
    return arr


def as_int(x: npt.ArrayLike, name: str, minimum: int = 0) -> IntArray:
    """Integer-valued input (ints, or floats such as 4.0) that is at least `minimum`."""
    arr = as_float(x, name)
    bad = arr != np.round(arr)
    if np.any(bad):
        raise ValueError(f"{name} must be a whole number; got {_show(arr, bad)}")
    bad = arr < minimum
    if np.any(bad):
        raise ValueError(f"{name} must be an integer >= {minimum}; got {_show(arr, bad)}")
    return arr.astype(np.int64)


def as_saguaro_constant(x: npt.ArrayLike, name: str = "C") -> FloatArray:
    arr = as_float(x, name)
    bad = (arr <= 0) | (arr > 1)
    if np.any(bad):
        raise ValueError(
            f"{name} is the Saguaro down-weighting constant and must lie in (0, 1] (1 = plain sampling); "
            f"got {_show(arr, bad)}"
        )
    return arr


def as_distribution(x: npt.ArrayLike, name: str) -> FloatArray:
    """Non-negative vectors over the last axis (the vocabulary) that each sum to 1."""
    arr = as_float(x, name)
    if arr.ndim == 0 or arr.shape[-1] == 0:
        raise ValueError(f"{name} must be a vector over the vocabulary, shape [..., V] with V >= 1")
    if np.any(arr < 0):
        raise ValueError(f"{name} must be non-negative: it is a probability distribution over tokens")
    sums = arr.sum(axis=-1)
    bad = np.abs(sums - 1) > DISTRIBUTION_ATOL
    if np.any(bad):
        raise ValueError(
            f"{name} must sum to 1 over the vocabulary (normalise it first); a row sums to {_show(sums, bad)}"
        )
    return arr
