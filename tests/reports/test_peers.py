"""transformers' assisted generation runs with our K and no early stop, and greedy peers agree."""

from engine import SamplingParams
from engine.models import tiny_model
from saguaro.peers import hf_generate


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
