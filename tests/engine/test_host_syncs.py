"""Host synchronisations per steady decode step, held to a budget per strategy (benchmarks/host_syncs.py counts
on the CPU what a GPU run would wait for: reads of tensors on the host, device stopwatch reads, downloads).

Tiny models, K = 3, SSD's worker in the target's process (its waits counted with the target's), 12 steady steps
after 3 warm-up steps; every step must stay within the budget, which does not grow with the batch. What a step
reads:

- AR, 5: the target cache's longest row (the record's context length), the round's input checks (one read for
  the warp, the token range and the bonus draw), the outcome (k, t*, x in one read), the verify and round
  stopwatches.
- SD, 10: AR's five, plus the draft's step checks (one read for all K steps), the two roll-backs (target, draft:
  each its check and trim in one read), the bonus ranks (one read for the rejected and the all-accepted rows), the
  draft stopwatch.
- SSD, 18: AR's five, plus in the worker: the outcome ranks, the speculation's tokens, the roll-backs of the draft
  and of the branches and their checks, the KV surgery of the rows that go on (a concat and a select: a trim each,
  and, every few rounds, a compaction that lists the live columns), the guessed tokens that index the cache, the
  backup and build stopwatches. With plain sampling (no top-k) q's support is read at each of the K backup and K
  branch steps: 6 more.
"""

import pytest

from engine import LLM, SamplingParams, SpeculativeConfig
from engine.config import DraftPlacement
from benchmarks.host_syncs import count_host_syncs
from tests.engine.tiny import noisy_copy, tiny_lm

SAMPLINGS = {"greedy": dict(temperature=0.0), "top-k": dict(temperature=1.0, top_k=20),
             "plain": dict(temperature=1.0)}
BUDGET = {("ar", "greedy"): 5, ("ar", "top-k"): 5, ("ar", "plain"): 5,
          ("sd", "greedy"): 10, ("sd", "top-k"): 10, ("sd", "plain"): 10,
          ("ssd", "greedy"): 18, ("ssd", "top-k"): 18, ("ssd", "plain"): 18 + 6}
WARM_UP, STEPS = 3, 12


def steady_step_syncs(strategy: str, sampling: str, rows: int) -> list:
    target = tiny_lm(0, scale=4.0)
    spec = SpeculativeConfig(K=3, placement=DraftPlacement(in_process=True))
    llm = LLM(target, None if strategy == "ar" else noisy_copy(target, 1.0), strategy=strategy, speculative=spec)
    params = SamplingParams(**SAMPLINGS[sampling], max_new_tokens=80, stop_on_eos=False, seed=1)
    for b in range(rows):
        llm.loop.submit(llm.make_sequence([1, 2, 3, 4 + b], params, index=b))
    for _ in range(WARM_UP):
        llm.loop.step()
    counts = []
    for _ in range(STEPS):
        with count_host_syncs() as count:
            llm.loop.step()
        counts.append(count)
    assert len(llm.loop.running) == rows  # every counted step was a decode round over the whole batch
    llm.close()
    return counts


@pytest.mark.parametrize("sampling", list(SAMPLINGS))
@pytest.mark.parametrize("strategy", ["ar", "sd", "ssd"])
def test_a_steady_decode_step_waits_for_the_device_within_its_budget(strategy, sampling):
    budget = BUDGET[(strategy, sampling)]
    for count in steady_step_syncs(strategy, sampling, rows=3):
        assert count.total <= budget, f"{strategy} {sampling}: {count}"


@pytest.mark.parametrize("strategy", ["ar", "sd", "ssd"])
def test_the_budget_holds_for_a_batch_of_eight(strategy):
    budget = BUDGET[(strategy, "top-k")]  # no read, draw or copy per row
    for count in steady_step_syncs(strategy, "top-k", rows=8):
        assert count.total <= budget, f"{strategy}, 8 rows: {count}"
