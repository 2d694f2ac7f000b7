"""Asynchronous speculative speculative decoding (SSD / Saguaro), the target's side (docs/ssd.md §2-§6).

Per round the target verifies the speculation the draft worker sent (x [B, K] and the q they were drawn
from: the draft's, Saguaro's σ_{F,C}, uniform for random tokens or a point mass for the lookup draft),
exactly as sd.py does; then it sends the outcome (k, t*) of every sequence and receives the next
speculation. On a cache hit the worker answers at once, so drafting costs the target nothing.

Target KV bookkeeping is sd.py's: the cache holds every committed token except `pending` (t*), fed first
in the next block [pending, x_1..x_K]; after k accepted it drops x_{k+1}..x_K. The draft's cache never
crosses. If the worker dies, hangs past its deadline or sends a malformed message, the worker is reaped and
generation goes on from this exact state (still exact), with one warning: synchronous SD with the draft in
the target's process when it has one (engine.strategies.sd; its cache re-prefilled on prompt + output so
far), otherwise autoregressively.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from engine.config import SpeculativeConfig
from engine.kv_cache import KVState
from engine.metrics import RoundRecord
from engine.sampling import sample, warp
from engine.sampling_params import SamplingParams
from engine.sequence import Sequence
from engine.ssd.messages import MalformedMessage, Outcome, Source, Speculation, Start
from engine.ssd.transport import DraftUnavailable
from engine.strategies.base import Clock, Decoder, emit_round, ms_since, prefill, surviving_rows, verify_block
from engine.strategies.sd import SpeculativeDecoder

if TYPE_CHECKING:
    from engine.ssd.process import ModelRecipe

log = logging.getLogger(__name__)
FAULTS = (DraftUnavailable, MalformedMessage)


class SpeculativeSpeculativeDecoder(Decoder):
    name = "ssd"

    def __init__(
        self,
        target: torch.nn.Module,
        open_channel: Callable[[], object],
        spec: SpeculativeConfig,
        pad_id: int,
        device: torch.device,
        draft: torch.nn.Module | None = None,
    ):
        super().__init__(target, pad_id, device)
        self.spec = spec
        self.open_channel = open_channel
        self.channel = None
        self.draft = draft  # the draft in the target's process, for the synchronous SD fallback (None: AR)
        self.fault: str | None = None  # why SSD fell back (None while healthy)
        self.vocab_size = target.get_output_embeddings().weight.shape[0]
        try:  # start the worker now, so that loading its model is not charged to the first generate()
            self._channel()
        except FAULTS as err:
            self._record_fault(err, "did not start")

    @property
    def fallback(self) -> str:
        """The strategy used once the worker has failed: "sd" with an in-process draft, else "ar"."""
        return "sd" if self.draft is not None else "ar"

    def _record_fault(self, err: Exception, what: str) -> None:
        """Remember the fault, reap the worker, and warn once saying which fallback runs from now on."""
        self.fault = f"{type(err).__name__}: {err}"
        self.close()
        how = ("synchronous speculative decoding with the draft in the target process" if self.fallback == "sd"
               else "autoregressive decoding")
        log.warning("SSD draft worker %s (%s); stopped it and continuing with %s (the output distribution is "
                    "unchanged)", what, self.fault, how)

    def _channel(self):
        if self.channel is None and self.fault is None:
            self.channel = self.open_channel()
        return self.channel

    def close(self) -> None:
        if self.channel is not None:
            self.channel.close()
            self.channel = None

    def run(
        self, seqs: list[Sequence], params: SamplingParams, generator: torch.Generator, clock: Clock
    ) -> list[RoundRecord]:
        K, V = self.spec.K, self.vocab_size
        records: list[RoundRecord] = []
        target = KVState(self.target, len(seqs), self.device)
        active = list(seqs)

        t0 = time.perf_counter()
        logits = prefill(target, active, self.pad_id, self.device)  # [B, V]
        pending = sample(warp(logits.float(), params), generator)  # [B], the first token
        now = clock.now()
        for seq, token in zip(active, pending.tolist()):
            seq.append([token], now)
            seq.metrics.target_forwards += 1
        records.append(RoundRecord(
            strategy=self.name, round=0, batch_size=len(active), K=K, context_len=0,
            accepted=[0] * len(active), emitted=[1] * len(active), draft_ms=0.0, verify_ms=ms_since(t0),
            round_ms=ms_since(t0), draft_forwards=0, phase="prefill", tokens=max(len(s.prompt_ids) for s in active),
        ))
        active, rows = surviving_rows(active)
        if not active:
            return records
        if rows is not None:
            target.select(rows.to(self.device))
            pending = pending[rows]

        t_wait = time.perf_counter()
        try:
            channel = self._channel()
            if channel is None:
                return records + self._continue(target, active, pending, params, generator, clock, len(records))
            speculation = channel.start(Start(
                seq_ids=[s.index for s in active], prompts=[s.prompt_ids for s in active], pending=pending.tolist(),
                temperature=params.temperature, top_k=params.top_k or 0, top_p=params.top_p or 1.0,
                seed=params.seed, K=K, V=V,
            ))
        except FAULTS as err:
            return records + self._fall_back(err, target, active, pending, params, generator, clock, len(records))

        while True:
            wait_ms = ms_since(t_wait)
            try:
                x, q = self._checked(speculation, len(active))
            except MalformedMessage as err:
                return records + self._fall_back(err, target, active, pending, params, generator, clock, len(records))
            context_len = int(target.lengths.max())
            t1 = time.perf_counter()
            result = verify_block(target, pending, x, q, params, generator)
            verify_ms = ms_since(t1)

            k = result.accepted.to(self.device)  # [B]
            pending = result.bonus
            emitted = emit_round(active, result, x, clock.now())
            backups = sorted({s.name.lower() for s in speculation.source if s is not Source.HIT})
            record = RoundRecord(
                strategy=self.name, round=len(records), batch_size=len(active), K=K, context_len=context_len,
                accepted=k.tolist(), emitted=emitted, draft_ms=wait_ms, verify_ms=verify_ms,
                round_ms=wait_ms + ms_since(t1), draft_forwards=0, hit=speculation.hits,
                cache_build_ms=speculation.cache_build_ms, branches=speculation.branches,
                backup=",".join(backups) or None, wait_ms=wait_ms, fanout=speculation.fanout,
            )
            records.append(record)
            alive = [not s.finished for s in active]
            active, rows = surviving_rows(active)
            if not active:
                return records
            outcome = Outcome(record.round, record.accepted, pending.tolist(), alive, verify_ms, K, V)
            if rows is not None:
                target.select(rows.to(self.device))
                pending = pending[rows]
            t_wait = time.perf_counter()
            try:
                speculation = self.channel.exchange(outcome)
            except FAULTS as err:
                return records + self._fall_back(err, target, active, pending, params, generator, clock, len(records))
            live_hits = iter(speculation.hits)
            record.outcome_hit = [next(live_hits, None) if a else None for a in alive]

    def _checked(self, speculation: Speculation, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
        K, V = self.spec.K, self.vocab_size
        if speculation.tokens.shape != (batch, K) or speculation.q.shape != (batch, K, V):
            raise MalformedMessage(
                f"speculation for {tuple(speculation.tokens.shape)} tokens, expected ({batch}, {K}) over V={V}"
            )
        return speculation.tokens.to(self.device), speculation.q.to(self.device)

    def _fall_back(self, err, target, active, pending, params, generator, clock, first_round) -> list[RoundRecord]:
        self._record_fault(err, "failed")
        return self._continue(target, active, pending, params, generator, clock, first_round)

    def _continue(self, target, active, pending, params, generator, clock, first_round) -> list[RoundRecord]:
        """Without a worker: synchronous SD from the current state when there is a draft here, else AR."""
        if self.draft is None:
            return self._autoregressive(target, active, pending, params, generator, clock, first_round)
        sd = SpeculativeDecoder(self.target, self.draft, self.spec, self.pad_id, self.device)
        draft, tail = sd.prefill_draft(active)  # the draft's cache: prompt + output so far, but pending
        return sd.decode(target, draft, active, pending, tail, params, generator, clock, first_round)

    def _autoregressive(self, target, active, pending, params, generator, clock, first_round) -> list[RoundRecord]:
        """AR from the current state: the target cache holds everything but `pending`."""
        records = []
        while active:
            context_len = int(target.lengths.max())
            t0 = time.perf_counter()
            logits = target.extend(pending[:, None].to(self.device))[:, -1]  # [B, V]
            pending = sample(warp(logits.float(), params), generator)  # [B]
            now = clock.now()
            for seq, token in zip(active, pending.tolist()):
                seq.append([token], now)
                seq.metrics.target_forwards += 1
                seq.metrics.rounds += 1
            records.append(RoundRecord(
                strategy="ar", round=first_round + len(records), batch_size=len(active), K=0,
                context_len=context_len, accepted=[0] * len(active), emitted=[1] * len(active), draft_ms=0.0,
                verify_ms=ms_since(t0), round_ms=ms_since(t0), draft_forwards=0,
            ))
            active, rows = surviving_rows(active)
            if rows is not None and active:
                target.select(rows.to(self.device))
                pending = pending[rows]
        return records


def open_channel(draft, given, config, spec: SpeculativeConfig, pad_id: int, device: torch.device
                 ) -> Callable[[], object]:
    """A function that starts the draft worker: in process (on `draft`, the engine's draft model), or in
    its own process from a recipe (`given`: the model object the caller passed, None if passed by name)."""
    from engine.ssd.channel import InProcessChannel
    from engine.ssd.process import ProcessChannel

    if spec.placement.in_process:
        return lambda: InProcessChannel(draft, spec, pad_id, device)
    recipe = draft_recipe(given, config)

    def start() -> ProcessChannel:
        channel = ProcessChannel(recipe, spec, pad_id, device)
        if channel.target_threads and config.threads is None and device.type == "cpu":
            torch.set_num_threads(channel.target_threads)  # the draft has its own core(s) now
        return channel

    return start


def draft_recipe(given, config) -> "ModelRecipe":
    """How the worker process rebuilds the draft. A draft passed by alias / path is loaded there the
    same way (dtype, int8, cache_dir); one passed as a model object travels as its config and weights
    (int8 applied there), so the worker drafts with exactly that model, even if it was changed after
    loading (a fine-tuned or perturbed copy whose name_or_path still names the original)."""
    from engine.ssd.process import ModelRecipe

    if given is not None:
        return ModelRecipe.from_model(given, int8=config.draft_int8)
    return ModelRecipe(path=config.draft, dtype=config.draft_dtype or config.dtype, int8=config.draft_int8,
                       cache_dir=config.cache_dir)
