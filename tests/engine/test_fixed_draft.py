"""FixedDraft (engine/strategies/ar.py): NoDraft with a speculation of fixed tokens, what `saguaro calibrate`
times a verify with."""

import torch

from engine.strategies.ar import FixedDraft, NoDraft


def test_fixed_draft_proposes_its_tokens_from_a_point_mass_every_round():
    x = torch.tensor([[5, 0, 7], [1, 2, 3]])  # [b, K]
    draft = FixedDraft(x, 9)
    assert isinstance(draft, NoDraft) and (draft.name, draft.K, draft.vocab_size) == ("sd", 3, 9)
    for _ in range(2):
        proposal = draft.propose(None)
        assert torch.equal(proposal.tokens, x)
        assert proposal.q.shape == (2, 3, 9) and torch.equal(proposal.q.sum(-1), torch.ones(2, 3))
        assert torch.equal(proposal.q.argmax(-1), x)
        assert (draft.last_round.draft_ms, draft.last_round.draft_forwards) == (0.0, 0)
    draft.admit([]), draft.retire([]), draft.observe(None, 1.0), draft.close()  # NoDraft's no-ops
    assert NoDraft(9, torch.device("cpu")).K == 0  # the subclass's K does not leak into NoDraft's
