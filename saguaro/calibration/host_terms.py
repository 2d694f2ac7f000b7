"""The engine's own work per decode round, with its forwards taken out: what a forward's time does not show.

The real engine (engine.LLM: AR, SD, and SSD with its draft worker in the target's process) decodes a batch
while every forward of the block KV cache (engine.blocks.BlockModel.forward) returns fixed logits at once:
one token leads every other by a wide margin (a seeded random vector with that entry raised), so the argmax is
one token with no ties, every drafted token is accepted (greedy, or sampled: p and q are the same point-like
distribution) and every SSD outcome is in the cache. Everything else runs for real: sampling and verification
over the whole vocabulary, the KV blocks' bookkeeping, the worker's rankings, tree layout and cache. Each
decode round is one `DecodeLoop.step()`, timed on the host's clock, with its round record (the verify, the
drafting, SSD's build and branches); `simulator.host_terms` turns the medians into the simulator's host terms.

The models only set the shapes the engine allocates for and the vocabulary (the forwards never run):
`host_pair` is benchmarks.engine_overhead's random pair (width-64 Qwen2, 8-layer target, 2-layer draft).
`python -m benchmarks.engine_overhead --host-terms` prints the measurement; `saguaro calibrate` records it in
its summary; simulator/data/saguaro_cpu_host.json is one, behind the "saguaro-cpu" engine preset.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import statistics
import time
from collections.abc import Iterator

from simulator.host_terms import HostRound, HostTerms

BATCHES = (1, 8)  # two batch sizes: each host term is a line in the batch
ROUNDS = 64  # timed rounds per strategy and batch size (their medians)
WARMUP = 8  # rounds first, not timed (the first shapes, the worker's first builds)
BLOCKS = 4  # the timed rounds of every strategy and batch size come in this many turns
PROMPT_TOKENS = 32
LEAD = 40.0  # the fixed token's logit over the largest other: p of anything else < V·e^-40 at temperature 1


@contextlib.contextmanager
def instant_forwards(vocab: int, seed: int = 0) -> Iterator[int]:
    """Within: every forward of the block KV cache returns the same logits at once ([B, T or logits_to_keep,
    V], a view of one seeded vector whose entry `vocab // 2` leads by LEAD). Yields that token; the forward is
    restored on the way out."""
    import torch

    from engine.blocks import BlockModel

    logits = torch.randn(vocab, generator=torch.Generator().manual_seed(seed))  # [V]
    token = vocab // 2
    logits[token] = logits.max() + LEAD

    def forward(self, tokens, positions, mask, binding, width, logits_to_keep):
        B, T = tokens.shape
        kept = logits_to_keep if 0 < logits_to_keep < T else T
        return logits.expand(B, kept, vocab)  # [B, kept, V]

    original = BlockModel.forward
    BlockModel.forward = forward
    try:
        yield token
    finally:
        BlockModel.forward = original


def host_pair(vocab: int):
    """benchmarks.engine_overhead's random pair at `vocab`: a width-64 Qwen2 target of 8 layers, a draft of 2."""
    from engine.loading.tiny import tiny_model

    shape = dict(vocab_size=vocab, hidden_size=64, num_heads=4, num_kv_heads=2, max_position_embeddings=8192)
    return tiny_model(num_layers=8, seed=1, **shape), tiny_model(num_layers=2, seed=2, **shape)


def _prompt(row: int, vocab: int, length: int) -> list[int]:
    """Row `row`'s prompt: `length` ids, each row's its own."""
    return [1 + (row + i) % (vocab - 1) for i in range(length)]


class _Decoding:
    """One strategy decoding one batch with the forwards taken out (call within `instant_forwards`): the engine
    (the SSD worker in this process, DraftPlacement(in_process=True)), its rows prefilled, and the rounds timed
    so far, a block at a time."""

    def __init__(self, target, draft, strategy: str, K: int, batch: int, rounds: int, temperature: float):
        from engine import LLM, SamplingParams, SpeculativeConfig
        from engine.config import DraftPlacement

        self.strategy, self.K, self.batch = strategy, K, batch
        vocab = target.get_input_embeddings().num_embeddings
        spec = SpeculativeConfig(K=K, placement=DraftPlacement(in_process=True))
        params = SamplingParams(
            temperature=temperature, max_new_tokens=(rounds + 2) * (K + 1), stop_on_eos=False, seed=1
        )
        self.llm = LLM(target, None if strategy == "ar" else draft, strategy=strategy, speculative=spec, threads=1)
        loop = self.llm.loop
        for row in range(batch):
            loop.submit(self.llm.make_sequence(_prompt(row, vocab, PROMPT_TOKENS), params, index=row))
        loop.step()  # the prefill: every row joins at once (no scheduler limits)
        if len(loop.running) != batch:
            raise RuntimeError(f"{strategy}: {len(loop.running)} of {batch} rows joined in one prefill")
        loop.recorder.records = []
        self.steps_ms: list[float] = []

    def block(self, n: int) -> None:
        step = self.llm.loop.step
        for _ in range(n):
            t0 = time.perf_counter()
            step()
            self.steps_ms.append((time.perf_counter() - t0) * 1e3)

    def result(self, skip: int) -> HostRound:
        """The medians of the rounds after the first `skip` (the warm-up)."""
        decode = self.llm.loop.recorder.records
        if len(decode) != len(self.steps_ms) or any(r.phase != "decode" or r.batch_size != self.batch for r in decode):
            raise RuntimeError(f"{self.strategy} at batch {self.batch}: a step that was not a round of the whole batch")
        steps, records = self.steps_ms[skip:], decode[skip:]
        med = statistics.median
        result = dict(
            strategy=self.strategy,
            batch=self.batch,
            step_ms=med(steps),
            verify_ms=med(r.verify_ms for r in records),
            draft_ms=med(r.draft_ms for r in records),
            target_ms=med(t - r.draft_ms for t, r in zip(steps, records, strict=True)),
            outside_ms=med(t - r.verify_ms - r.draft_ms for t, r in zip(steps, records, strict=True)),
            rounds=len(records),
            draft_forwards=med(r.draft_forwards for r in records),
        )
        if self.strategy != "ar":
            result["accepted"] = sum(sum(r.accepted) for r in records) / (self.K * self.batch * len(records))
        if self.strategy == "ssd":
            # in this process a round's wait is the worker's answer and then its next build, which the next
            # round's record reports (the build of the cache it looks up)
            result.update(
                build_ms=med(r.cache_build_ms for r in records),
                branches=med(r.branches for r in records),
                answer_ms=med(
                    a.draft_ms - b.cache_build_ms for a, b in zip(decode[skip:], decode[skip + 1 :], strict=False)
                ),
            )
        return HostRound(**result)

    def close(self) -> None:
        self.llm.close()


def host_rounds(
    target, draft, K: int, batches: tuple[int, ...], rounds: int, warmup: int, temperature: float, blocks: int = BLOCKS
) -> list[HostRound]:
    """AR, SD and SSD at each batch size, each decoding its own batch; their rounds are timed in `blocks` turns,
    rounds / blocks at a time, so that whatever else the machine does falls on all of them alike. Call within
    `instant_forwards`."""
    import torch

    threads = torch.get_num_threads()
    per_block = -(-rounds // blocks)
    with contextlib.ExitStack() as stack:
        runs = []
        for strategy in ("ar", "sd", "ssd"):
            for batch in sorted(set(batches)):
                run = _Decoding(target, draft, strategy, K, batch, warmup + per_block * blocks, temperature)
                stack.callback(run.close)
                runs.append(run)
        try:
            for run in runs:
                run.block(warmup)
            for _ in range(blocks):
                for run in runs:
                    run.block(per_block)
            return [run.result(warmup) for run in runs]
        finally:
            torch.set_num_threads(threads)


def measure_host_terms(
    target,
    draft,
    K: int = 4,
    batches: tuple[int, ...] = BATCHES,
    rounds: int = ROUNDS,
    warmup: int = WARMUP,
    temperature: float = 0.0,
    meta: dict | None = None,
) -> HostTerms:
    """AR, SD and SSD at each batch size with the forwards taken out (`host_rounds`), and where it ran: the CPU
    model, the commit, the date, the load average before and after, the vocabulary, the settings (`meta` adds
    to them)."""
    from saguaro.bench.environment import cpu_model, git_state

    if K < 1 or rounds < 1 or warmup < 0 or len(set(batches)) < 2 or min(batches) < 1:
        raise ValueError(
            f"host terms need K >= 1, rounds >= 1, warmup >= 0 and two batch sizes >= 1 or more; got "
            f"K {K}, rounds {rounds}, warmup {warmup}, batches {list(batches)}"
        )
    vocab = target.get_input_embeddings().num_embeddings
    load_before = os.getloadavg()
    with instant_forwards(vocab):
        measured = host_rounds(target, draft, K, batches, rounds, warmup, temperature)
    info = {
        "cpu": cpu_model(),
        **git_state(),
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
        "vocab": vocab,
        "temperature": temperature,
        "rounds": measured[0].rounds,
        "warmup": warmup,
        "batches": sorted(set(batches)),
        "torch_threads": 1,
        **(meta or {}),
    }
    return HostTerms(K, tuple(measured), info)


def describe(terms: HostTerms) -> list[str]:
    """Lines for a report: each strategy's step and its parts by batch size, then the simulator's terms."""
    lines = ["  strategy  batch  step ms  verify ms  draft ms  outside ms  build ms  branches  accepted"]
    for r in terms.rounds:
        build = "-" if r.build_ms is None else f"{r.build_ms:.3f}"
        branches = "-" if r.branches is None else f"{r.branches:.0f}"
        accepted = "-" if r.accepted is None else f"{r.accepted:.3f}"
        lines.append(
            f"  {r.strategy:8s}  {r.batch:5d}  {r.step_ms:7.3f}  {r.verify_ms:9.3f}  {r.draft_ms:8.3f}  "
            f"{r.outside_ms:10.3f}  {build:>8s}  {branches:>8s}  {accepted:>8s}"
        )
    try:
        costs = terms.costs()
    except ValueError as err:
        return lines + [f"  no simulator terms: {err}"]
    lines.append(
        f"  simulator terms (EngineCosts): round_host_ms {costs.round_host_ms:.4f} + round_row_us "
        f"{costs.round_row_us:.1f}/row; verify_host_ms {costs.verify_host_ms:.4f} + verify_row_us "
        f"{costs.verify_row_us:.1f}/row; draft_host_ms {costs.draft_host_ms:.4f} + draft_row_us "
        f"{costs.draft_row_us:.1f}/row per draft forward; tree_step_overhead_ms "
        f"{costs.tree_step_overhead_ms:.4f} + build_row_us {costs.build_row_us:.2f}/branch row per tree step"
    )
    ssd = [r for r in terms.rounds if r.answer_ms is not None]
    lines.append(
        "  SSD worker's answer before its build (no simulator term; the link stands for it): "
        + ", ".join(f"{r.answer_ms:.3f} ms at batch {r.batch}" for r in ssd)
    )
    return lines
