"""transformers' assisted generation runs with our K and no early stop, and greedy peers agree."""

from engine import SamplingParams
from engine.loading.tiny import tiny_model
from saguaro.bench.peers import hf_generate


def test_assisted_generation_drafts_exactly_K_tokens_per_round():
    target = tiny_model(vocab_size=64, seed=0)
    draft = tiny_model(vocab_size=64, seed=0)  # the target's twin: every draft token is accepted
    seen: list[int] = []
    original = draft.forward

    def counting_forward(*args, **kwargs):
        seen.append(draft.generation_config.num_assistant_tokens)
        return original(*args, **kwargs)

    draft.forward = counting_forward
    params = SamplingParams(temperature=0, max_new_tokens=13, stop_on_eos=False)
    (assisted,), _ = hf_generate(target, [[1, 2, 3]], params, frozenset(), 0, assistant=draft, K=3)
    (plain,), _ = hf_generate(target, [[1, 2, 3]], params, frozenset(), 0)
    assert set(seen) == {3}
    # 13 tokens with every draft accepted: rounds of K + 1 = 4 tokens, K draft forwards each (the
    # last round is cut short by the length limit).
    assert 9 <= len(seen) <= 12
    assert assisted.token_ids == plain.token_ids and len(plain.token_ids) == 13
    assert draft.generation_config.num_assistant_tokens != 3  # restored afterwards


def test_assisted_generation_with_K_none_runs_transformers_default_schedule():
    target = tiny_model(vocab_size=64, seed=0)
    draft = tiny_model(vocab_size=64, seed=0)
    config = draft.generation_config
    config.num_assistant_tokens, config.assistant_confidence_threshold = 7, 0.9  # the caller's, to be restored
    seen: list[tuple] = []
    original = draft.forward

    def watching_forward(*args, **kwargs):
        seen.append((config.num_assistant_tokens, config.assistant_confidence_threshold))
        return original(*args, **kwargs)

    draft.forward = watching_forward
    params = SamplingParams(temperature=0, max_new_tokens=9, stop_on_eos=False)
    (assisted,), _ = hf_generate(target, [[1, 2, 3]], params, frozenset(), 0, assistant=draft, K=None)
    (plain,), _ = hf_generate(target, [[1, 2, 3]], params, frozenset(), 0)
    assert seen[0] == (20, 0.4)  # K 20 with the confidence stop starting at 0.4 (transformers may adapt it)
    assert assisted.token_ids == plain.token_ids
    assert (config.num_assistant_tokens, config.assistant_confidence_threshold) == (7, 0.9)
