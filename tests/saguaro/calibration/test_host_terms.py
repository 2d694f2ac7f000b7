"""The engine's host work with its forwards taken out (saguaro.calibration.host_terms), on a random pair of a small
vocabulary: the fixed logits, what the rounds measure, and `saguaro calibrate` recording them for `simulate --fit`."""

import json
import shutil

import pytest
import torch

from saguaro.calibration.files import fit_all
from saguaro.calibration.host_terms import host_pair, instant_forwards, measure_host_terms
from simulator.host_terms import HostTerms
from theory.glossary import Strategy

K = 2


@pytest.fixture(scope="module")
def measured() -> HostTerms:
    return measure_host_terms(*host_pair(64), K=K, rounds=8, warmup=2)


def test_the_fixed_logits_have_one_argmax_without_ties_at_every_kept_position():
    from engine.blocks import BlockModel

    tokens = torch.zeros(3, 5, dtype=torch.long)
    with instant_forwards(64) as token:
        every = BlockModel.forward(None, tokens, None, None, None, 5, 0)  # [3, 5, 64]
        last = BlockModel.forward(None, tokens, None, None, None, 5, 2)  # [3, 2, 64]
    assert every.shape == (3, 5, 64) and last.shape == (3, 2, 64)
    top2 = every.topk(2, dim=-1)
    assert (top2.indices[..., 0] == token).all() and (top2.values[..., 0] > top2.values[..., 1]).all()


def test_the_forward_is_restored_on_the_way_out_even_after_an_error():
    from engine.blocks import BlockModel

    original = BlockModel.forward
    with pytest.raises(RuntimeError, match="inside"):
        with instant_forwards(64):
            assert BlockModel.forward is not original
            raise RuntimeError("inside")
    assert BlockModel.forward is original


def test_every_strategy_and_batch_size_is_timed_with_every_draft_accepted(measured):
    got = {(r.strategy, r.batch): r for r in measured.rounds}
    assert set(got) == {(s, b) for s in ("ar", "sd", "ssd") for b in (1, 8)}
    assert all(r.rounds == 8 and r.step_ms > 0 and r.outside_ms > 0 for r in measured.rounds)
    assert all(got[s, b].accepted == 1.0 for s in ("sd", "ssd") for b in (1, 8))  # the fixed logits agree
    assert got["sd", 1].draft_forwards == K and got["ar", 1].draft_ms == 0.0
    assert got["ssd", 8].branches == 8 * got["ssd", 1].branches  # every row's outcome built, every build hit
    assert all(got["ssd", b].build_ms > 0 and got["ssd", b].answer_ms is not None for b in (1, 8))


def test_the_measurement_says_where_and_how_it_ran(measured):
    meta = measured.meta
    assert meta["cpu"] and meta["date"] and "commit" in meta and len(meta["load_average_before"]) == 3
    assert meta["vocab"] == 64 and meta["batches"] == [1, 8] and meta["temperature"] == 0.0


def test_a_measurement_needs_two_batch_sizes():
    with pytest.raises(ValueError, match="two batch sizes"):
        measure_host_terms(*host_pair(64), batches=(4, 4))


@pytest.fixture(scope="module")
def calibration(tmp_path_factory):
    from saguaro.cli import main
    from tests.engine.test_models import save_tiny
    from tests.saguaro.calibration.test_calibrate import calibrate_argv

    root = tmp_path_factory.mktemp("host-calib")
    target, draft = save_tiny(root / "target", seed=0), save_tiny(root / "draft", seed=1)
    out = root / "calib.jsonl"
    argv = calibrate_argv(
        target, draft, out, "--link-tokens", "0", "--host-rounds", "6", prompt_ids=(1, 2, 3, 4, 5, 6, 7)
    )
    assert main(argv) == 0
    return out


def test_a_calibration_records_its_host_terms_and_they_read_back(calibration):
    summary = json.loads(calibration.with_suffix(".summary.json").read_text())
    terms = HostTerms.from_dict(summary["host_terms"])
    assert terms.K == 2 and terms.meta["command"] == "saguaro calibrate" and terms.meta["vocab"] == 32
    assert HostTerms.from_dict(json.loads(json.dumps(terms.to_dict()))) == terms
    assert summary["inputs"]["host_rounds"] == 6


def test_simulate_fit_counts_the_recorded_host_work(calibration):
    terms = HostTerms.from_dict(json.loads(calibration.with_suffix(".summary.json").read_text())["host_terms"])
    fitted = fit_all([str(calibration)])
    assert fitted.host_overhead == terms.outside()
    for strategy, (fixed, per_row) in terms.outside().items():
        assert fitted.overhead_ms(Strategy(strategy), 4) >= fixed + 4 * per_row


def test_a_calibration_written_before_host_terms_still_fits_as_it_did(calibration, tmp_path):
    old = tmp_path / "old.jsonl"
    shutil.copy(calibration, old)
    summary = json.loads(calibration.with_suffix(".summary.json").read_text())
    del summary["host_terms"]
    old.with_suffix(".summary.json").write_text(json.dumps(summary))
    fitted = fit_all([str(old)])
    assert fitted.host_overhead == {} and fitted.fast_backup_ms == fit_all([str(calibration)]).fast_backup_ms
