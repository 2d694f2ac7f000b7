"""When a seed reproduces a request's text: what the engine promises, per strategy and sampling mode.

Every random number behind a token is keyed by (seed, position, purpose) (engine.sampling.Keys), so the numbers
never depend on the run. The text then depends on the run only through the proposals a strategy verifies:

- temperature 0, and drafter-invariant sampling at any temperature: the text is the target's own (AR's) for every
  strategy, K and draft (up to the float rounding of block shapes, which can flip a near-tie);
- standard sampling: AR's text is fixed; SD's too when K is fixed; SSD's too when K is fixed, its backup is the
  neural draft and C = 1, and it is then SD's text (a cache hit and the backup propose the same tokens from the same
  q, and a worker that fails is replaced by SD with the same K).

Otherwise the text depends on choices made from measured times, from the batch or from what the cache held: adaptive
K (one K for the whole batch, from its rows' acceptance and the times measured), SD's confidence stop (it ends a
round's draft when every row of the batch is unsure), a fast backup (its tokens differ from the
draft's, and whether a row misses depends on the cache), or Saguaro's C < 1 (σ's down-weighted set follows the
hit or the backup schedule). The distribution is exact either way.
"""

from __future__ import annotations

from engine.config import SpeculativeConfig
from engine.sampling_params import SamplingParams
from theory.glossary import Backup, Strategy


def unreproducible_reason(strategy: Strategy, spec: SpeculativeConfig, params: SamplingParams) -> str | None:
    """Why the same prompt, seed and settings may give another text on another run (None: they give one text)."""
    if params.greedy or params.invariant or strategy is Strategy.AR:
        return None
    if spec.adaptive:
        return (
            "adaptive K chooses each round's length from measured times and the batch's acceptance; fix K, or "
            "use sampling_mode='invariant'"
        )
    if strategy is Strategy.SD and spec.confidence_stop is not None:
        return (
            "the confidence stop ends a round's draft when every row of the batch is unsure, so a row's rounds "
            "depend on its batch-mates; drop confidence_stop, or use sampling_mode='invariant'"
        )
    if strategy is Strategy.SSD and spec.backup is not Backup.NEURAL:
        return (
            f"SSD's {spec.backup.value} backup proposes other tokens than the draft on a cache miss; use "
            f"backup='neural', or sampling_mode='invariant'"
        )
    if strategy is Strategy.SSD and spec.C < 1:
        return (
            "Saguaro's C < 1 down-weights a set that follows the hit or the backup schedule; use C=1, or "
            "sampling_mode='invariant'"
        )
    return None
