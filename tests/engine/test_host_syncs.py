"""Host synchronisations per steady decode step, held to a budget per strategy (benchmarks/host_syncs.py counts
on the CPU what a GPU run would wait for: reads of tensors on the host, device stopwatch reads, downloads).

Tiny models, K = 3, SSD's worker in the target's process, 12 steady steps after 3 warm-up steps, on the eager
path (the block KV cache) and on the static slot cache of the compiled path (run eagerly here: the same host
bookkeeping); every step must stay within the budget, which does not grow with the batch. The target's side of a
round reads once: the outcome (k, t* and x of every row) with the round's input checks (the draft's and the
verify's). SSD's worker, counted apart (in production it is another process), reads twice a round: its answer's
tokens with its drafting's checks, and its build's guesses with the ranking they came from.
"""

import pytest

from benchmarks.host_syncs import count_host_syncs
from engine import LLM, SamplingParams, SpeculativeConfig
from engine.compile_config import CompileConfig
from engine.config import DraftPlacement
from engine.ssd.draft_worker import DraftWorker
from tests.engine.tiny import noisy_copy, tiny_lm

SAMPLINGS = {
    "greedy": dict(temperature=0.0),
    "top-k": dict(temperature=1.0, top_k=20),
    "plain": dict(temperature=1.0),
    "invariant": dict(temperature=1.0, sampling_mode="invariant"),
}
TARGET_BUDGET = 1  # every strategy: the round's one read
WORKER_BUDGET = 2  # SSD's worker: its answer and its build
WARM_UP, STEPS = 3, 12


def steady_step_syncs(
    strategy: str, sampling: str, rows: int, monkeypatch, compiled: bool = False
) -> list[tuple[int, int, str]]:
    """Per steady step: (the target's reads, the worker's reads, what was read)."""
    target = tiny_lm(0, scale=4.0)
    spec = SpeculativeConfig(K=3, placement=DraftPlacement(in_process=True))
    compile = CompileConfig(max_len=256, compiled=False) if compiled else False
    llm = LLM(
        target,
        None if strategy == "ar" else noisy_copy(target, 1.0),
        strategy=strategy,
        speculative=spec,
        compile=compile,
    )
    params = SamplingParams(**SAMPLINGS[sampling], max_new_tokens=80, stop_on_eos=False, seed=1)
    for b in range(rows):
        llm.loop.submit(llm.make_sequence([1, 2, 3, 4 + b], params, index=b))
    for _ in range(WARM_UP):
        llm.loop.step()
    counting = {"count": None, "worker": 0}

    def worker_side(method):
        def counted(self, *args, **kwargs):
            before = counting["count"].total if counting["count"] is not None else 0
            try:
                return method(self, *args, **kwargs)
            finally:
                if counting["count"] is not None:
                    counting["worker"] += counting["count"].total - before

        return counted

    for name in ("respond", "build_cache"):
        monkeypatch.setattr(DraftWorker, name, worker_side(getattr(DraftWorker, name)))
    steps = []
    for _ in range(STEPS):
        counting["worker"] = 0
        with count_host_syncs() as count:
            counting["count"] = count
            llm.loop.step()
        counting["count"] = None
        steps.append((count.total - counting["worker"], counting["worker"], str(count)))
    assert len(llm.loop.running) == rows  # every counted step was a decode round over the whole batch
    llm.close()
    return steps


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "static-cache"])
@pytest.mark.parametrize("sampling", list(SAMPLINGS))
@pytest.mark.parametrize("strategy", ["ar", "sd", "ssd"])
def test_a_steady_decode_step_waits_for_the_device_within_its_budget(strategy, sampling, compiled, monkeypatch):
    for target, worker, what in steady_step_syncs(strategy, sampling, 3, monkeypatch, compiled):
        assert target <= TARGET_BUDGET, f"{strategy} {sampling}: {what}"
        assert worker <= (WORKER_BUDGET if strategy == "ssd" else 0), f"{strategy} {sampling}: {what}"


@pytest.mark.parametrize("strategy", ["ar", "sd", "ssd"])
def test_the_budget_holds_for_a_batch_of_eight(strategy, monkeypatch):
    for target, worker, what in steady_step_syncs(strategy, "top-k", 8, monkeypatch):  # no read, draw or copy per row
        assert target <= TARGET_BUDGET and worker <= (WORKER_BUDGET if strategy == "ssd" else 0), what
