"""Can a configuration run at all, and can it keep up? Checked before a latency is quoted.

Static checks (`problems`, `check`) need model and hardware specs, so they apply to roofline timing
(simulator.presets); constant and fitted timings carry neither and pass unchecked.
- Context: the longest prompt + output beyond a model's context window (the check engines make).
- Tensor parallelism: the TP degree must divide the attention heads, and divide the KV heads or be a
  multiple of them (then each device keeps a copy of one KV head): vLLM's rule.
- Memory per device: weights ÷ TP + batch × longest sequence × KV bytes per token on that device, against
  the device's usable memory (`Hardware.usable_memory_gb`). The target on each of its TP devices; SSD's draft
  on its own device (its tree adds budget × K positions per sequence); SD's draft next to the target's
  shard on the target's first device. Every sequence of the batch is taken at its longest (the simulator
  does not model preemption, so a batch that only fits while short would not give the simulated figures).

Saturation (`overload`): an open loop whose arrivals exceed what the configuration serves at full load (a
closed loop at its batch size: tokens/s ÷ mean output tokens, as simulator.plan sizes replicas) never
settles: its queue, and with it every latency, grows for as long as the run lasts. Such a run reports
"overloaded" and the capacity instead of a latency.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from simulator.hardware import Deployment, Hardware, ModelSpec
from simulator.metrics import SimResult
from simulator.run import SimConfig, simulate
from simulator.timing import RooflineTiming
from simulator.workload import ClosedLoop, Lengths, OpenLoop, Replayed
from theory.glossary import Strategy

CAPACITY_ROUNDS = 3000  # most rounds of the closed loop that measures an open loop's capacity


def longest_sequence(prompt_len: Lengths, output_len: Lengths | None) -> int:
    """Tokens of the longest request (prompt + output); with endless outputs, the prompt alone."""
    return prompt_len.upper + (0 if output_len is None else output_len.upper)


def kv_bytes_per_token_per_device(model: ModelSpec, tp: int) -> float:
    """KV-cache bytes one token takes on one of `tp` devices (a KV head is copied when TP exceeds them)."""
    heads_per_device = max(1, model.kv_heads // tp)
    return 2.0 * model.layers * heads_per_device * model.head_dim * model.kv_dtype_bytes  # K and V


def _divisors(n: int) -> str:
    return ", ".join(str(d) for d in range(1, n + 1) if n % d == 0)


def tp_problems(model: ModelSpec, tp: int) -> list[str]:
    """The TP degree against the model's heads (vLLM's rule), as sentences that say what to do."""
    out = []
    if model.heads % tp:
        out.append(
            f"TP {tp} does not divide {model.name}'s {model.heads} attention heads: choose a tensor-"
            f"parallel degree among {_divisors(model.heads)}"
        )
    elif model.kv_heads % tp and tp % model.kv_heads:
        out.append(
            f"TP {tp} neither divides {model.name}'s {model.kv_heads} KV heads nor is a multiple of them: "
            f"choose a tensor-parallel degree among {_divisors(model.heads)} that divides or is a "
            f"multiple of {model.kv_heads}"
        )
    return out


def context_problems(models: list[ModelSpec], tokens: int) -> list[str]:
    """Requests of up to `tokens` positions against each model's context window (one sentence for all)."""
    over = [m for m in models if m.context_window is not None and tokens > m.context_window]
    if not over:
        return []
    windows = " and ".join(f"{m.name} ({m.context_window:,} tokens)" for m in over)
    return [
        f"prompt + output of up to {tokens:,} tokens exceeds the context window of {windows}: shorten the "
        f"prompt or output lengths (--prompt-len, --output-len)"
    ]


@dataclass(frozen=True)
class DeviceLoad:
    """What one device holds: model weights and KV cache, GB (10^9 bytes)."""

    hardware: Hardware
    weights_gb: float
    kv_gb: float
    what: str  # e.g. "Llama-3.1-70B (TP 4, batch 16 × 4,224 tokens)"

    @property
    def total_gb(self) -> float:
        return self.weights_gb + self.kv_gb

    def problem(self, remedy: str) -> str | None:
        hw = self.hardware
        if self.total_gb <= hw.usable_memory_gb:
            return None
        return (
            f"{self.what} needs {self.total_gb:.1f} GB per device ({self.weights_gb:.1f} GB weights + "
            f"{self.kv_gb:.1f} GB KV cache) but {hw.name} has {hw.usable_memory_gb:.1f} GB usable "
            f"({hw.usable_memory_fraction:.0%} of {hw.memory_gb:g} GB): {remedy}"
        )


def _load(deployment: Deployment, batch: int, tokens: int) -> DeviceLoad:
    m, tp = deployment.model, deployment.tp
    kv_gb = batch * tokens * kv_bytes_per_token_per_device(m, tp) / 1e9
    tp_text = f"TP {tp}, " if tp > 1 else ""
    return DeviceLoad(
        deployment.hardware, m.weight_bytes / tp / 1e9, kv_gb, f"{m.name} ({tp_text}batch {batch} × {tokens:,} tokens)"
    )


def problems(config: SimConfig) -> list[str]:
    """Why `config` cannot run as simulated: one sentence each, saying what to do; empty when it can."""
    timing = config.timing
    if not isinstance(timing, RooflineTiming):
        return []  # constant or fitted timing: no model or hardware to check against
    p, wl = config.policy, config.workload
    batch = wl.max_batch
    if isinstance(wl, Replayed):
        tokens = max(n + m for n, m in zip(wl.prompt_lens, wl.output_lens, strict=True))
    else:
        tokens = longest_sequence(wl.prompt_len, wl.output_len)
    target, draft = timing.target, timing.draft
    deployments = [target] if p.strategy is Strategy.AR else [target, draft]
    out = [problem for d in deployments for problem in tp_problems(d.model, d.tp)]
    out += context_problems([d.model for d in deployments], tokens)
    if out:
        return out
    target_load = _load(target, batch, tokens)
    raise_tp = "lower the batch or the lengths, or raise the tensor-parallel degree (--tp)"
    if p.strategy is Strategy.SD:  # the draft shares the target's first device
        draft_load = _load(draft, batch, tokens + p.K)
        colocated = DeviceLoad(
            target.hardware,
            target_load.weights_gb + draft_load.weights_gb,
            target_load.kv_gb + draft_load.kv_gb,
            f"{target_load.what} with the SD draft {draft_load.what} on the same device",
        )
        problem = colocated.problem(raise_tp)
        return [problem] if problem else []
    problem = target_load.problem(raise_tp)
    out = [problem] if problem else []
    if p.strategy is Strategy.SSD:
        tree = (p.K + 1) + max(p.budget, p.budget_backup) * p.K  # glue positions and every branch's K steps
        problem = _load(draft, batch, tokens + tree).problem(
            "lower the batch, the lengths or the fan-out budget, or give the draft a larger device (--draft-hardware)"
        )
        out += [problem] if problem else []
    return out


def check(*configs: SimConfig) -> None:
    """Raise ValueError (one line: what is wrong and what to do) if any configuration cannot run."""
    bad = [(c, found) for c in configs if (found := problems(c))]
    if not bad:
        return
    config, found = bad[0]
    where = ""
    if len(configs) > 1:
        where = " ".join(f"{k}={v}" for k, v in config.settings().items()) + ": "
    more = f" ({len(bad)} of {len(configs)} configurations cannot run)" if len(bad) > 1 else ""
    raise ValueError(where + "; ".join(found) + more)


def requests_per_s(result: SimResult, output_len: Lengths) -> float:
    """Requests per second a closed-loop run serves: its tokens/s over the mean output length."""
    return result.tokens_per_s / output_len.mean


def capacity_per_s(config: SimConfig) -> float:
    """Requests per second `config` serves at full load: the same configuration as a closed loop at its batch."""
    wl = config.workload
    if isinstance(wl, Replayed):
        raise ValueError("capacity in requests per second is measured on generated lengths, not a replayed run")
    if wl.output_len is None:
        raise ValueError("capacity in requests per second needs finite output lengths (requests must finish)")
    closed = replace(
        config,
        workload=ClosedLoop(wl.max_batch, wl.prompt_len, wl.output_len),
        requests=None,
        rounds=min(config.rounds, CAPACITY_ROUNDS),
    )
    return requests_per_s(simulate(closed), wl.output_len)


@dataclass(frozen=True)
class Overload:
    """An open loop whose arrivals exceed its capacity: its latencies grow with the run and are not quoted."""

    rate_per_s: float
    capacity_per_s: float
    batch: int

    def __str__(self) -> str:
        return (
            f"overloaded: {self.rate_per_s:g} requests/s arrive but this configuration serves at most "
            f"{self.capacity_per_s:.3g} requests/s (full load at batch {self.batch}); its queue grows for as "
            f"long as the run lasts, so no latency is quoted. Lower the rate below {self.capacity_per_s:.3g}, "
            f"raise the batch, or add replicas (saguaro plan sizes them)"
        )

    def withhold(self, result: SimResult) -> SimResult:
        """The result with its latencies NaN (null in JSON) and the overload in its settings."""
        settings = {**result.settings, "overloaded": True, "capacity_rps": float(f"{self.capacity_per_s:.4g}")}
        return replace(
            result,
            settings=settings,
            ttft_ms=_blank(result.ttft_ms),
            itl_ms=_blank(result.itl_ms),
            tpot_ms=_blank(result.tpot_ms),
            e2el_ms=_blank(result.e2el_ms),
        )


def _blank(stats: dict) -> dict:
    """The same statistics, each NaN (null in JSON)."""
    return dict.fromkeys(stats, math.nan)


def overload(config: SimConfig) -> Overload | None:
    """An `Overload` when `config` is an open loop with arrivals above its capacity; None otherwise."""
    wl = config.workload
    if not isinstance(wl, OpenLoop):
        return None
    capacity = capacity_per_s(config)
    return Overload(wl.rate_per_s, capacity, wl.max_batch) if wl.rate_per_s > capacity else None


def honest(config: SimConfig, result: SimResult) -> tuple[SimResult, Overload | None]:
    """`result` as it may be quoted: latencies withheld (and the overload returned) if `config` is overloaded."""
    found = overload(config)
    return (found.withhold(result), found) if found else (result, None)
