"""A seed means one text: every random number behind a token is keyed by (seed, position, purpose)
(engine.sampling.Keys), so a request's tokens do not depend on its batch-mates, on when it joined, on cache hits
or misses, or on the worker's process (docs/api.md "Reproducible sampling").

Standard sampling (rejection sampling): AR, SD and SSD each give one text per (prompt, seed, settings); SD and SSD
give the same text as each other when K is fixed, the backup is the neural draft and C = 1 (they then verify the
same proposals with the same numbers), and SSD's text does not depend on which outcomes its cache held.
Drafter-invariant sampling: AR, SD and SSD give the same text for a seed, whatever K, the backup or the cache.
Sampling at T > 0 on tiny float32 models; texts compared token for token.
"""

import pytest

from engine import LLM, SamplingParams, SpeculativeConfig
from engine.config import DraftPlacement, WorkerFaults
from tests.engine.tiny import noisy_copy, tiny_lm

IN_PROCESS = DraftPlacement(in_process=True)
PROMPTS = [[1, 2, 3, 4, 5], [7, 8], [9, 10, 11, 12], [3], [20, 21, 22]]
SEEDS = [5, 77, 1234, 2**40 + 3, 9]


@pytest.fixture(scope="module")
def pair():
    target = tiny_lm(0, scale=3.0)
    return target, noisy_copy(target, 0.5)


def params(T: float = 0.8, mode: str = "standard", n: int = 30, seed: int | None = None) -> SamplingParams:
    return SamplingParams(temperature=T, max_new_tokens=n, stop_on_eos=False, sampling_mode=mode, seed=seed)


def alone(llm: LLM, sampling: SamplingParams) -> list[list[int]]:
    """Each request run on its own."""
    out = []
    for prompt, seed in zip(PROMPTS, SEEDS, strict=True):
        seq = llm.make_sequence(prompt, sampling, seed=seed)
        out.append(run(llm, [(seq, 0)])[0])
    return out


def with_joins(llm: LLM, sampling: SamplingParams) -> list[list[int]]:
    """All requests in one ragged batch, joining at different steps (the last first)."""
    seqs = [
        (llm.make_sequence(p, sampling, seed=s, index=i), 3 * (len(PROMPTS) - 1 - i))
        for i, (p, s) in enumerate(zip(PROMPTS, SEEDS, strict=True))
    ]
    return run(llm, seqs)


def run(llm: LLM, requests) -> list[list[int]]:
    step = 0
    while any(not seq.finished for seq, _ in requests):
        for seq, at in requests:
            if at == step:
                llm.loop.submit(seq)
        llm.loop.step()
        step += 1
    return [seq.output_ids for seq, _ in requests]


def engine(pair, strategy: str, **spec) -> LLM:
    target, draft = pair
    spec = SpeculativeConfig(**({"placement": IN_PROCESS} | spec))
    return LLM(target, None if strategy == "ar" else draft, strategy=strategy, speculative=spec)


@pytest.mark.parametrize(
    "strategy, spec",
    [
        ("ar", {}),
        ("sd", dict(K=3)),
        ("ssd", dict(K=3, backup="neural")),
        ("ssd", dict(K=3, backup="random")),
        ("ssd", dict(K=3, backup="lookup")),
    ],
    ids=["ar", "sd", "ssd-neural", "ssd-random", "ssd-lookup"],
)
def test_a_seed_gives_one_text_alone_and_in_a_ragged_batch_with_joins(pair, strategy, spec):
    with engine(pair, strategy, **spec) as llm:
        solo = alone(llm, params())
        batched = with_joins(llm, params())
    assert solo == batched
    assert len({tuple(t) for t in solo}) == len(solo)  # the requests differ: the comparison is not vacuous


def test_sd_and_ssd_give_the_same_text_with_a_fixed_K_and_the_neural_backup(pair):
    with engine(pair, "sd", K=3) as llm:
        sd = with_joins(llm, params())
    with engine(pair, "ssd", K=3, backup="neural") as llm:
        ssd = with_joins(llm, params())
    assert sd == ssd


def test_ssds_text_does_not_depend_on_what_its_cache_held(pair):
    """A cache that holds many outcomes against one that holds none (every round takes the neural backup)."""
    with engine(pair, "ssd", K=3, schedule="given", fanout=(8, 8, 8, 8), backup="neural") as llm:
        out = llm.generate(PROMPTS, params(seed=3))
        hits = out.metrics.summary()["hit_rate"]
        wide = [o.token_ids for o in out]
    with engine(pair, "ssd", K=3, schedule="given", fanout=(0, 0, 0, 0), backup="neural") as llm:
        out = llm.generate(PROMPTS, params(seed=3))
        none = [o.token_ids for o in out]
        assert out.metrics.summary()["hit_rate"] == 0
    assert hits > 0.15 and wide == none  # dozens of rounds took a cached speculation


@pytest.mark.parametrize("T", [0.7, 1.0])
def test_invariant_sampling_gives_ar_s_text_for_every_strategy_K_and_backup(pair, T):
    sampling = params(T, "invariant")
    with engine(pair, "ar") as llm:
        ar = with_joins(llm, sampling)
    for strategy, spec in [
        ("sd", dict(K=2)),
        ("sd", dict(K=5)),
        ("sd", dict(K="auto")),
        ("ssd", dict(K=3, backup="neural")),
        ("ssd", dict(K=3, backup="random")),
        ("ssd", dict(K="auto", budget="auto", backup="lookup")),
    ]:
        with engine(pair, strategy, **spec) as llm:
            assert alone(llm, sampling) == ar, (strategy, spec)


def test_ssd_in_its_own_process_gives_the_text_of_the_worker_in_process(pair):
    with engine(pair, "ssd", K=3, backup="neural") as llm:
        here = with_joins(llm, params())
    with engine(pair, "ssd", K=3, backup="neural", placement=DraftPlacement(deadline_s=60.0)) as llm:
        apart = with_joins(llm, params())
        assert llm.fault is None
    assert here == apart


def test_a_killed_worker_leaves_the_text_as_it_was(pair):
    """The worker exits at its third round; SD with the same K takes over and the text does not change."""
    with engine(pair, "ssd", K=3, backup="neural") as llm:
        expected = with_joins(llm, params())
    faulty = DraftPlacement(deadline_s=60.0, faults=WorkerFaults(exit_at_round=3))
    with engine(pair, "ssd", K=3, backup="neural", placement=faulty) as llm:
        got = with_joins(llm, params())
        assert llm.fault is not None and llm.strategy_in_use == "sd"
    assert got == expected


@pytest.mark.parametrize(
    "strategy, spec, sampling, reproducible",
    [
        ("ar", {}, params(), True),
        ("sd", dict(K=3), params(), True),
        ("sd", dict(K="auto"), params(), False),
        ("sd", dict(K="auto"), params(0.0), True),
        ("sd", dict(K=3, confidence_stop=0.6), params(), False),
        ("ssd", dict(K=3, backup="neural"), params(), True),
        ("ssd", dict(K=3, backup="random"), params(), False),
        ("ssd", dict(K=3, backup="neural", C=0.5), params(), False),
        ("ssd", dict(K="auto", backup="auto"), params(mode="invariant"), True),
    ],
    ids=[
        "ar",
        "sd",
        "sd-adaptive",
        "sd-adaptive-greedy",
        "sd-confidence-stop",
        "ssd-neural",
        "ssd-random",
        "ssd-saguaro",
        "ssd-invariant",
    ],
)
def test_each_output_says_whether_its_seed_reproduces_it(pair, strategy, spec, sampling, reproducible):
    with engine(pair, strategy, **spec) as llm:
        out = llm.generate([PROMPTS[0]], sampling)[0]
    assert out.reproducible is reproducible
    assert (out.unreproducible is None) is reproducible
    if not reproducible:
        assert "sampling_mode='invariant'" in out.unreproducible  # says what to do
