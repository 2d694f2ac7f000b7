"""What a response says about its seed: OpenAI's `system_fingerprint`, and whether the seed gives this text again.

The fingerprint names the engine's version, the request's sampling mode and the settings that decide a seeded
text under that mode, then a hash of the models as loaded (names, dtypes, low-bit schemes, device kind, compiled
or not, tensor-parallel ranks):

    saguaro-0.2.0:standard:ar:<hash>
    saguaro-0.2.0:standard:sd,K=4:<hash>                      (+ ",confidence_stop=0.5" when set)
    saguaro-0.2.0:standard:ssd,K=4,backup=neural,C=1:<hash>   (K=auto(1..8) when adaptive)
    saguaro-0.2.0:invariant:<hash>

Under drafter-invariant sampling the text is the target's own whatever the strategy, K, backup or C, so those and
the draft are left out: an AR and an SSD server of one target give invariant requests the same fingerprint. Equal
fingerprints, prompt, seed and request parameters mean the same text wherever `reproducible` is true
(docs/serving.md "Seeds and reproducibility"; the engine's side is engine.reproducibility).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from engine.config import EngineConfig
from engine.reproducibility import unreproducible_reason
from engine.sampling_params import SamplingMode, SamplingParams
from saguaro import version
from theory.glossary import Strategy

MODEL_HASH_CHARS = 10  # hex digits of the models' hash: collisions among one user's servers are out of reach
NO_SEED = "the request has no seed, so the engine drew a random one: send `seed` to get the same text again"


@dataclass(frozen=True)
class Reproducibility:
    """One request's fingerprint, and why its seed may not give its text again (None: it does)."""

    system_fingerprint: str
    unreproducible: str | None

    @property
    def reproducible(self) -> bool:
        return self.unreproducible is None

    def fields(self) -> dict:
        """The final body's non-standard fields."""
        return {"reproducible": self.reproducible, "unreproducible_reason": self.unreproducible}


def reproducibility(config: EngineConfig, params: SamplingParams) -> Reproducibility:
    """What the responses to a request with `params` say about its seed, on an engine built with `config`."""
    reason = unreproducible_reason(config.strategy, config.speculative, params)
    if params.seed is None and not params.greedy:
        reason = NO_SEED
    return Reproducibility(system_fingerprint(config, params.sampling_mode), reason)


def system_fingerprint(config: EngineConfig, mode: SamplingMode) -> str:
    """The settings of `config` that decide a seeded text under sampling `mode`, as one string (module docstring)."""
    models: list[tuple] = [
        (
            "target",
            config.target,
            config.dtype,
            repr(config.target_quant),
            config.device.split(":")[0],
            repr(config.compile),
            config.tp,
        )
    ]
    parts = [f"saguaro-{version()}", mode.value]
    if mode is SamplingMode.STANDARD:
        parts.append(speculation(config))
        if config.strategy is not Strategy.AR:
            models.append(("draft", config.draft, config.draft_float_dtype, repr(config.draft_quant)))
    digest = hashlib.sha256(repr(models).encode()).hexdigest()[:MODEL_HASH_CHARS]
    return ":".join([*parts, digest])


def speculation(config: EngineConfig) -> str:
    """The strategy and the speculative settings that decide a standard-sampled text: "ssd,K=4,backup=neural,C=1"."""
    strategy, spec = config.strategy, config.speculative
    if strategy is Strategy.AR:
        return strategy.value
    K = f"auto({spec.K_min}..{spec.K})" if spec.adaptive else str(spec.K)
    parts = [strategy.value, f"K={K}"]
    if strategy is Strategy.SSD:
        parts += [f"backup={spec.backup.value}", f"C={spec.C:g}"]
    if spec.confidence_stop is not None:
        parts.append(f"confidence_stop={spec.confidence_stop:g}")
    return ",".join(parts)
