"""verify(): the deterministic cases (greedy, all accepted, impossible tokens), reproducibility, shapes.

The distributional guarantees are in test_exactness.py (by enumeration) and
test_verifier_statistics.py (chi-square on the real code path).
"""

import pytest
import torch

from engine.proposals import point_mass
from engine.verifier import Verification, verify

F64 = torch.float64


def one_hot(tokens: list[list[int]], vocab_size: int) -> torch.Tensor:
    return torch.nn.functional.one_hot(torch.tensor(tokens), vocab_size).to(F64)  # [B, L, V]


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_greedy_accepts_while_the_draft_equals_the_target_argmax_and_the_bonus_is_the_target_argmax():
    target_argmax = [[1, 2, 3, 0], [1, 2, 3, 0], [1, 2, 3, 0], [4, 4, 4, 2]]  # [B, K+1]
    draft = [[1, 2, 3], [1, 0, 3], [0, 2, 3], [4, 4, 4]]  # [B, K]
    for seed in range(5):
        result = verify(torch.tensor(draft), one_hot(draft, 5), one_hot(target_argmax, 5), gen(seed))
        assert result.accepted.tolist() == [3, 1, 0, 3]
        assert result.bonus.tolist() == [0, 2, 1, 2]
        assert result.emitted(torch.tensor(draft)) == [[1, 2, 3, 0], [1, 2], [1], [4, 4, 4, 2]]


def test_all_accepted_draws_the_bonus_from_the_last_target_position():
    p = torch.tensor([[[0.2, 0.5, 0.3], [0.6, 0.1, 0.3], [0.0, 0.0, 1.0]]], dtype=F64)  # [1, 3, 3]
    q = p[:, :2].clone()  # q == p: every draft token is accepted (u < 1)
    for seed in range(10):
        result = verify(torch.tensor([[1, 0]]), q, p, gen(seed))
        assert result.accepted.tolist() == [2] and result.bonus.tolist() == [2]


def test_a_rejection_draws_the_bonus_from_the_residual():
    # q puts all mass on token 0, p only 0.25: rejection leaves residual ∝ max(0, p − q) = [0, 0.5, 0.25].
    p = torch.tensor([[[0.25, 0.5, 0.25], [1.0, 0.0, 0.0]]], dtype=F64).expand(4000, 2, 3)
    q = point_mass(torch.zeros(4000, 1, dtype=torch.long), 3, dtype=F64)
    result = verify(torch.zeros(4000, 1, dtype=torch.long), q, p, gen())
    rejected = result.accepted == 0
    assert set(result.bonus[rejected].tolist()) == {1, 2}  # never the rejected token
    assert 0.2 < rejected.double().mean() < 0.8  # not "accept because it equals the target argmax"


def test_a_token_the_target_rules_out_is_never_accepted():
    p = torch.tensor([[[0.0, 0.5, 0.5], [1 / 3, 1 / 3, 1 / 3]]], dtype=F64).expand(500, 2, 3)
    q = torch.tensor([[[0.9, 0.05, 0.05]]], dtype=F64).expand(500, 1, 3)
    result = verify(torch.zeros(500, 1, dtype=torch.long), q, p, gen())
    assert (result.accepted == 0).all() and (result.bonus != 0).all()


def test_the_draft_taking_the_target_argmax_is_not_enough_above_temperature_zero():
    p = torch.tensor([[[0.5, 0.3, 0.2], [1.0, 0.0, 0.0]]], dtype=F64).expand(4000, 2, 3)
    q = point_mass(torch.zeros(4000, 1, dtype=torch.long), 3, dtype=F64)  # a lookup proposing the argmax
    result = verify(torch.zeros(4000, 1, dtype=torch.long), q, p, gen())
    assert 0.45 < result.accepted.double().mean() < 0.55  # accepted with p/q = 0.5, not always


def test_a_degenerate_residual_falls_back_to_the_target():
    # p ≤ q everywhere in floating point; force a rejection anyway with a token whose p is 0.
    p = torch.tensor([[[0.0, 0.5, 0.5], [1.0, 0.0, 0.0]]], dtype=F64)
    q = torch.tensor([[[0.0, 0.5, 0.5]]], dtype=F64)
    result = verify(torch.tensor([[0]]), q, p, gen())
    assert result.accepted.tolist() == [0] and result.bonus.item() in (1, 2)


def test_same_generator_seed_reproduces_the_outcome():
    logits = torch.randn(64, 4, 6, generator=gen(1), dtype=F64)
    p, q = logits[:, :4].softmax(-1), logits[:, 1:].softmax(-1)  # [64, 4, 6], [64, 3, 6]
    draft = torch.randint(0, 6, (64, 3), generator=gen(2))
    first, second = verify(draft, q, p, gen(5)), verify(draft, q, p, gen(5))
    assert torch.equal(first.accepted, second.accepted) and torch.equal(first.bonus, second.bonus)
    other = verify(draft, q, p, gen(6))
    assert not (torch.equal(first.accepted, other.accepted) and torch.equal(first.bonus, other.bonus))


def test_batch_rows_are_verified_independently():
    # A greedy row keeps its deterministic outcome whatever its stochastic neighbours are.
    stochastic_p = torch.full((1, 3, 4), 0.25, dtype=F64)
    stochastic_q = torch.tensor([[[0.7, 0.1, 0.1, 0.1]] * 2], dtype=F64)
    greedy_p, greedy_q = one_hot([[2, 3, 1]], 4), one_hot([[2, 0]], 4)
    for seed in range(5):
        p = torch.cat([stochastic_p, greedy_p, stochastic_p * 0 + 0.25, greedy_p])  # [4, 3, 4]
        q = torch.cat([stochastic_q, greedy_q, stochastic_q.flip(-1), greedy_q])  # [4, 2, 4]
        draft = torch.tensor([[0, 0], [2, 0], [3, 3], [2, 0]])
        result = verify(draft, q, p, gen(seed))
        assert result.accepted[[1, 3]].tolist() == [1, 1] and result.bonus[[1, 3]].tolist() == [3, 3]


def test_float32_and_mixed_dtypes_are_accepted():
    p = torch.tensor([[[0.5, 0.5], [1.0, 0.0]]])  # float32
    q = torch.tensor([[[0.5, 0.5]]], dtype=F64)
    result = verify(torch.tensor([[1]], dtype=torch.int32), q, p, gen())
    assert result.accepted.tolist() == [1] and result.bonus.tolist() == [0]


def test_zero_lookahead_emits_one_token_from_the_target():
    p = torch.tensor([[[0.0, 1.0]]], dtype=F64)
    result = verify(torch.zeros(1, 0, dtype=torch.long), torch.zeros(1, 0, 2, dtype=F64), p, gen())
    assert result.accepted.tolist() == [0] and result.bonus.tolist() == [1]


def test_emitted_checks_the_draft_shape():
    result = Verification(accepted=torch.tensor([1]), bonus=torch.tensor([0]))
    with pytest.raises(ValueError):
        result.emitted(torch.tensor([[1, 2], [3, 4]]))


B, K, V = 2, 3, 5
GOOD = (torch.zeros(B, K, dtype=torch.long), torch.full((B, K, V), 0.2), torch.full((B, K + 1, V), 0.2))


@pytest.mark.parametrize(
    "draft, q, p",
    [
        (GOOD[0][0], GOOD[1], GOOD[2]),  # draft not 2-D
        (GOOD[0].float(), GOOD[1], GOOD[2]),  # draft not integer
        (GOOD[0], GOOD[1][:, :2], GOOD[2]),  # q has the wrong K
        (GOOD[0], GOOD[1][:1], GOOD[2]),  # q has the wrong B
        (GOOD[0], GOOD[1], GOOD[2][:, :K]),  # p lacks the K+1-th position
        (GOOD[0], GOOD[1][..., :4], GOOD[2]),  # vocabularies differ
        (GOOD[0], GOOD[1][0], GOOD[2]),  # q not 3-D
        (GOOD[0] + V, GOOD[1], GOOD[2]),  # token out of range
        (GOOD[0], GOOD[1].long(), GOOD[2]),  # q not floating point
    ],
)
def test_bad_shapes_raise_value_error(draft, q, p):
    with pytest.raises(ValueError):
        verify(draft, q, p, gen())
