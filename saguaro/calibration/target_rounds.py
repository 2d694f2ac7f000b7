"""The target's side of `saguaro calibrate`, timed as the engine runs it: each AR step and verify is one round
of the engine's decode loop (engine.decode_loop) over a batch copied from the calibration's prompt cache, and
its time is the round record's verify_ms; at batch > 1 the rows differ in length, as a real batch's do
(`ragged`). saguaro.calibration.measure uses it for every target timing and its draft worker uses `ragged` too."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from engine.strategies.ar import FixedDraft


def ragged(state, b: int):
    """`b` copies of `state`'s single row, every one but the first one token shorter (a hole at its end), as a
    real batch's rows differ in length (prompts of different lengths, rows that accepted different counts), so
    the timed forwards have the shapes and masks of the engine's. (Equal rows would take a slower attention
    kernel if transformers dropped an all-ones mask for a one-token forward and asked SDPA for enable_gqa, which
    on CPU in bfloat16 is many times slower; engine.kv_cache passes a mask on CPU, so that does not differ.) A
    batch of one has no holes in the engine either (its roll-backs are trimmed), so it stays as it is."""
    import torch

    rows = state.fork(torch.zeros(b, dtype=torch.long))
    if b > 1:
        rows.rollback((torch.arange(b) > 0).long())
    return rows


class TargetRounds:
    """The target's side of the timings, run by the engine's own decode loop (engine.decode_loop): each timed
    step is one `DecodeLoop.step()` over requests (greedy, or at the workload's temperature) whose cache is a copy
    of the calibration's prompt (`ragged`, at the point's context), and its time is the round record's
    `verify_ms`, exactly what a run's rounds file shows: the AR step with the AR proposer
    (engine.strategies.ar), the verify of K tokens with a proposer of fixed tokens (FixedDraft, beside it).
    After each round the cache rolls back to where it was (exact), so no point is prefilled again."""

    def __init__(self, target, ids: list[int], K: int, widths: list[int] | None = None, temperature: float = 0.0):
        import torch

        from engine.decode_loop import DecodeLoop
        from engine.scheduler import SchedulerConfig
        from engine.strategies.ar import NoDraft

        self.ids, self.K, self.temperature = ids, K, temperature
        self.widths = sorted(set(widths or []) | {K + 1})  # block widths a verify may be timed at
        self.V = int(target.get_output_embeddings().out_features)
        self.device = torch.device("cpu")
        self.ar = NoDraft(self.V, self.device)
        self.loop = DecodeLoop(target, self.ar, pad_id=0, device=self.device, scheduler=SchedulerConfig())
        self.loop.recorder.records = []
        self.sd: dict[int, FixedDraft] = {}  # width -> the proposer of its fixed tokens

    def batch(self, base, b: int) -> None:
        """The running batch: b requests at `base`'s context (`ragged`), each with its next token pending."""
        import torch

        from engine.sampling_params import SamplingParams
        from engine.sequence import Sequence
        from engine.strategies.ar import FixedDraft

        loop, c = self.loop, int(base.lengths.max())
        params = SamplingParams(temperature=self.temperature, stop_on_eos=False, max_new_tokens=10**9)
        loop.recorder.release()
        loop.running = []
        for i in range(b):
            seq = Sequence(
                seq_id=i,
                request_id=f"calibrate-{i}",
                index=i,
                prompt_ids=self.ids[:c],
                params=params,
                eos_ids=frozenset(),
                seed=i,
                arrival_s=time.perf_counter(),
            )
            loop.running.append(seq)
        loop.state = ragged(base, b)
        loop.batch_changed()
        loop.pending = torch.full((b,), self.ids[c], dtype=torch.long)
        longest = max(self.widths) - 1
        if c + 1 + longest > len(self.ids):
            raise ValueError(
                f"the calibration prompt has {len(self.ids)} tokens: too few for a block of {longest} "
                f"drafted tokens at context {c}"
            )
        x = torch.tensor(self.ids[c + 1 : c + 1 + longest], dtype=torch.long).repeat(b, 1)  # [b, widest K]
        self.sd = {w: FixedDraft(x[:, : w - 1].contiguous(), self.V) for w in self.widths}

    def step(self, T: int) -> tuple[float, float]:
        """One round (T = 1: AR; T = K'+1, one of `widths`: the verify of K' drafted tokens) and the perf_counter
        times (start, end) of its verify as the record times it (the forward, the warp, the rejection sampling,
        the roll-back): end is taken as the round returns, start verify_ms before it."""
        if T != 1 and T not in self.widths:
            raise ValueError(f"a timed round feeds 1 (AR) or one of {self.widths} tokens per row, not {T}")
        loop = self.loop
        loop.proposer = self.ar if T == 1 else self.sd[T]
        before = loop.state.lengths.clone()
        loop.recorder.records.clear()
        loop.step()
        end = time.perf_counter()
        record = loop.recorder.records[-1]
        if len(loop.running) != len(before):
            raise RuntimeError("a calibration row left the decode loop's batch")
        loop.state.rollback(loop.state.lengths - before)  # exact: the batch as it was before the round
        return end - record.verify_ms / 1e3, end
