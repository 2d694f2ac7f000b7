"""One glossary for the whole project (notation of docs/ssd.md, Kumar, Dao & May 2026).

p      target distribution            q      draft (proposal) distribution
K      lookahead: draft tokens/round  k      draft tokens accepted in a round, 0..K
t*     bonus token                    v      verification outcome (k, t*)
α      per-token acceptance rate      E      expected tokens emitted per round
F_k    fan-out (guesses) for outcome k; B = Σ_k F_k is the cache budget
r      power-law exponent of the miss rate, 1 − p_hit(F) ≈ F^(−r)
C      Saguaro down-weighting constant in (0, 1]; C = 1 is plain sampling
b      batch size (independent sequences)
T_v    one verify forward (the time unit of the closed forms)
T_d    one draft token;  T_SD = K·T_d / T_v;  T_p cache-build time;  T_b backup time
T_ar   one target decode step (AR);  closed forms take T_v = 1 and T_ar ≈ 1
P(k)   probability of outcome k: α^k(1 − α) for k < K, α^K for k = K
p_hit  probability the verify outcome is in the cache;  E_hit, E_miss: E after a hit / a miss
a      scale of the power law, miss ≈ a·F^(−r) (a = 1 in docs/ssd.md; fitted, it absorbs F = 1)
σ      Saguaro-modified draft distribution σ_{F,C}: q's top F+1 tokens scaled by C, renormalised
T_n    the n best-ranked tokens of q (ties to the lower token id);  G(x) guesses after rejecting x
b*     critical batch size: smallest b at which the fast backup beats the neural one (Cor. 16)
miss policy  what a batch does when some of its rows miss (MissPolicy: per-row or whole-batch)
"""

from __future__ import annotations

from enum import Enum


class Strategy(str, Enum):
    """How tokens are produced: autoregressive, synchronous SD, or asynchronous SSD."""

    AR = "ar"
    SD = "sd"
    SSD = "ssd"


class Backup(str, Enum):
    """What SSD does on a cache miss (docs/ssd.md §6)."""

    NEURAL = "neural"  # the draft drafts K tokens just in time, as SD does
    RANDOM = "random"  # uniform random tokens: almost free, about one token per round
    LOOKUP = "lookup"  # prompt-lookup / n-gram draft: almost free, better than random
    AUTO = "auto"  # pick by the Cor. 16 speedup from measured quantities


class MissPolicy(str, Enum):
    """What SSD does at batch b > 1 when some rows' outcomes miss the cache (docs/ssd.md §3, Cor. 16).

    Per round, T_v = 1, M = max(1, T_p):
    - PER_ROW (this engine, engine/ssd/draft_worker.py): the cache build always runs to its end; then every
      hit row takes its cached branch and the missed rows share one backup call. A round takes
      M + [any row missed]·T_b; each row's tokens follow its own hit or miss.
    - WHOLE_BATCH (the reference engine): a miss in any row abandons the build and the backup drafts every
      row, so no row keeps its hit. A round takes M if all rows hit, else 1 + T_b, and then every row's
      speculation is a backup one.
    """

    PER_ROW = "per-row"
    WHOLE_BATCH = "whole-batch"

    @classmethod
    def _missing_(cls, value: object) -> MissPolicy:
        """Accept the Python spelling ("per_row"); refuse anything else with the choices."""
        if isinstance(value, str) and value.replace("_", "-") in cls._value2member_map_:
            return cls(value.replace("_", "-"))
        choices = ", ".join(repr(m.value) for m in cls)
        raise ValueError(f"miss_policy must be one of {choices} (what a batch does when some rows miss); got {value!r}")
