"""RunMetrics.acceptance_rate reads each round's own K (adaptive speculation varies it)."""

from engine.metrics import RoundRecord, RunMetrics


def _round(K: int, accepted: list[int], phase: str = "decode") -> RoundRecord:
    return RoundRecord(
        strategy="sd",
        round=0,
        batch_size=len(accepted),
        K=K,
        context_len=10,
        accepted=accepted,
        emitted=[k + 1 for k in accepted],
        draft_ms=1.0,
        verify_ms=1.0,
        round_ms=2.0,
        draft_forwards=K,
        phase=phase,
    )


def _metrics(rounds: list[RoundRecord], K: int) -> RunMetrics:
    return RunMetrics(strategy="sd", K=K, requests=[], rounds=rounds, wall_s=1.0)


def test_a_row_that_accepted_its_whole_shorter_block_is_not_a_rejection() -> None:
    # K=6 configured; rounds ran at K=2 (all accepted: 2 successes, no rejection) and K=6 (3 accepted, rejected).
    rounds = [_round(2, [2, 2]), _round(6, [3, 6]), _round(0, [0, 0], phase="prefill")]
    # accepted = 2 + 2 + 3 + 6 = 13; rejections: only the row with 3 of 6 -> α = 13 / 14
    assert _metrics(rounds, K=6).acceptance_rate == 13 / 14


def test_constant_K_matches_the_truncated_geometric_mle() -> None:
    rounds = [_round(4, [0, 4, 2]), _round(4, [1])]
    assert _metrics(rounds, K=4).acceptance_rate == (0 + 4 + 2 + 1) / (7 + 3)


def test_no_speculation_gives_zero() -> None:
    assert _metrics([_round(0, [0])], K=0).acceptance_rate == 0.0
