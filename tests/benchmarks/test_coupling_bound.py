"""benchmarks/coupling_bound.py: the acceptance a shared-noise race allows against rejection sampling's, and the
same-text check of bench runs."""

import json
import shutil
from pathlib import Path

import pytest
import torch

from benchmarks import coupling_bound as cb
from engine.invariant import draft_winners, target_winners

FIXTURES = Path(__file__).resolve().parents[1] / "saguaro" / "fixtures" / "runs"
SIGMAS = 5  # two-sided false-alarm rate of a 5-sigma check: 5.7e-7


def test_total_variation_and_the_floor_at_their_ends():
    same, apart = torch.tensor([0.5, 0.5, 0.0]), torch.tensor([0.0, 0.0, 1.0])
    tv = cb.total_variation(torch.stack([same, same]), torch.stack([same, apart]))
    assert tv.tolist() == [0.0, 1.0]
    assert cb.invariant_floor(tv).tolist() == [1.0, 0.0]


def test_race_winners_are_the_engines_races():
    """With every token among the target's racers and the draft's cut to its 64 most probable (V = 200), both
    winners are exactly those of engine.invariant under the same keyed seeds."""
    g = torch.Generator().manual_seed(0)
    n, V, D = 5, 200, 16
    p = torch.rand(n, V, generator=g).pow(4).softmax(-1)
    q = torch.rand(n, V, generator=g).pow(4).softmax(-1)
    positions = torch.arange(30, 30 + n)
    target, draft = cb.race_winners(p, q, positions, D)
    seeds = torch.arange(1, D + 1)
    at = positions[None].expand(D, n)
    assert torch.equal(target, target_winners(p[None].expand(D, -1, -1), seeds, at))
    expected = draft_winners(q[None].expand(D, -1, -1).reshape(D * n, V), seeds.repeat_interleave(n), at.reshape(-1))
    assert torch.equal(draft, expected.reshape(D, n))


def _two_token_agreement(shift: int) -> tuple[float, float]:
    """The race agreement of p = (0.7, 0.3) and q = (0.4, 0.6) (TV 0.3) over 200 positions x 50 seeds, the
    draft's noise taken `shift` positions away (0: shared, as the engine does); and its standard error."""
    p = torch.tensor([[0.7, 0.3]]).expand(200, 2)
    q = torch.tensor([[0.4, 0.6]]).expand(200, 2)
    positions = torch.arange(200)
    target, _ = cb.race_winners(p, q, positions, 50)
    _, draft = cb.race_winners(p, q, positions + shift, 50)
    agree = float((target == draft).double().mean())
    return agree, (0.7 * 0.3 / target.numel()) ** 0.5


def test_two_token_race_agrees_as_often_as_rejection_sampling_accepts():
    """On two tokens the race is a maximal coupling: agreement 1 − TV = 0.7, above the floor 0.7/1.3."""
    agree, se = _two_token_agreement(shift=0)
    assert abs(agree - 0.7) < SIGMAS * se


def test_two_token_check_rejects_unshared_noise():
    """The negative control: with independent noise the draft agrees with probability Σ p q = 0.46."""
    agree, se = _two_token_agreement(shift=10**6)
    assert abs(agree - 0.7) > SIGMAS * se
    assert abs(agree - 0.46) < SIGMAS * se


def _run(tmp_path, results: list[dict]):
    run = tmp_path / "run"
    run.mkdir()
    (run / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in results))
    return run


def _result(system, prompt, tokens, mode=None, T=0.7):
    return {
        "system": system,
        "prompt_id": prompt,
        "token_ids": tokens,
        "settings": {"temperature": T, "sampling_mode": mode},
    }


def test_same_texts_counts_the_prompts_on_which_every_system_agrees(tmp_path):
    run = _run(
        tmp_path,
        [
            _result("ar", "a", [1, 2], "invariant"),
            _result("sd", "a", [1, 2], "invariant"),
            _result("ssd", "a", [1, 2], "invariant"),
            _result("ar", "b", [1, 2], "invariant"),
            _result("sd", "b", [1, 3], "invariant"),
            _result("ssd", "b", [1, 2], "invariant"),
            _result("sd", "a", [4], None),
            _result("ssd", "a", [4], None),
        ],
    )
    rows = {r["mode"]: r for r in cb.same_texts([run])}
    assert (rows["invariant"]["systems"], rows["invariant"]["prompts"], rows["invariant"]["same_text"]) == (
        ["ar", "sd", "ssd"],
        2,
        1,
    )
    assert rows["invariant"]["sd_ssd_same_text"] == 1
    assert (rows["standard"]["prompts"], rows["standard"]["same_text"], rows["standard"]["sd_ssd_same_text"]) == (
        1,
        1,
        1,
    )


def test_a_folder_that_is_not_a_run_exits_2(tmp_path, capsys):
    assert cb.main([str(tmp_path), "--texts"]) == 2
    assert "saguaro bench run folders" in capsys.readouterr().err


@pytest.mark.parametrize("draws", ["0", "-3"])
def test_draws_below_one_exit_2(tmp_path, draws, capsys):
    run = _run(tmp_path, [_result("sd", "a", [1])])
    assert cb.main([str(run), "--draws", draws]) == 2
    assert "--draws" in capsys.readouterr().err


def _with_invariant_copy(tmp_path, slower: float):
    """The synthetic temperature-c run with its SD K=4 T=0.7 variant copied as that variant's invariant twin,
    whose decode rounds take `slower` times as long."""
    from saguaro.bench.runfolder import RunDir
    from saguaro.bench.summary import summarize

    run = tmp_path / "run"
    shutil.copytree(FIXTURES / "temperature-c", run)
    key = "sd K=4 T=0.7 b=1"
    for name in ("results.jsonl", "rounds.jsonl"):
        rows = [json.loads(line) for line in (run / name).read_text().splitlines()]
        twins = [{**r, "key": key + " invariant"} for r in rows if r["key"] == key]
        for r in twins:
            if name == "rounds.jsonl" and r.get("phase", "decode") == "decode":
                r["round_ms"] *= slower
            elif name == "results.jsonl":
                r["settings"] = {**r["settings"], "sampling_mode": "invariant"}
        (run / name).write_text("".join(json.dumps(r) + "\n" for r in rows + twins))
    summarize(RunDir(run))
    return run, key


def test_paired_intervals_of_a_variant_against_its_twin(tmp_path):
    run, key = _with_invariant_copy(tmp_path, slower=2.0)
    out = cb.paired(run, key, key + " invariant")
    assert (out["d_alpha_low"], out["d_alpha_high"]) == (0.0, 0.0)
    assert out["decode_ratio_low"] == pytest.approx(0.5) and out["decode_ratio_high"] == pytest.approx(0.5)


def test_measured_puts_the_invariant_row_beside_its_standard_one(tmp_path):
    run, key = _with_invariant_copy(tmp_path, slower=2.0)
    rows = {r["key"]: r for r in cb.measured([run])}
    invariant, standard = rows[key + " invariant"], rows[key]
    assert (invariant["mode"], standard["mode"]) == ("invariant", "standard")
    assert invariant["alpha"] == standard["alpha"]
    assert invariant["decode_ratio"] == pytest.approx(0.5)
    assert invariant["round_ms"] == pytest.approx(2 * standard["round_ms"])
