"""`saguaro validate paper` (saguaro/validation/paper.py): the α fitted on a published SD figure reproduces that
figure, also on fresh draws; the presets calibrated on the reference's test log reproduce what they were
calibrated on; the paper's rows come out within 10%; the command prints every table and writes the JSON."""

import json
from dataclasses import replace

import pytest

from saguaro.cli import main
from saguaro.commands.validate import FITS as COMMAND_FITS
from saguaro.validation import log_engine, paper
from saguaro.validation.published import FIT_KEYS, FITS, Run
from simulator.presets import PAIR_ALPHA, engine_preset
from theory import Strategy

ROUNDS = 2000  # small: a fit takes about 20 simulations of this many rounds (about a second)
PAPER_LLAMA = next(f for f in FITS if f.key == "paper-llama")
SETUP = paper.Setup("llama", "reference", ROUNDS, 0)
SD_TPS = PAPER_LLAMA.sd_tps  # 161.8 tok/s


@pytest.fixture(scope="module")
def llama_alpha() -> float:
    return paper.fit_alpha(SETUP, PAPER_LLAMA.sd, SD_TPS)


def test_fitted_alpha_reproduces_the_sd_figure_on_its_own_draws(llama_alpha):
    sd = paper.simulate_run(SETUP, PAPER_LLAMA.sd, llama_alpha).decode_tokens_per_s
    assert sd == pytest.approx(SD_TPS, rel=0.01)


def test_fitted_alpha_reproduces_the_sd_figure_on_other_draws(llama_alpha):
    # at 2000 rounds SD tok/s varies by about 1.4% (one standard deviation over seeds) at a fixed α, and the
    # fitted α carries as much noise again: 5% is about 2.5 σ of the difference (false alarm ≈ 1%)
    sd = paper.simulate_run(replace(SETUP, seed=7), PAPER_LLAMA.sd, llama_alpha).decode_tokens_per_s
    assert sd == pytest.approx(SD_TPS, rel=0.05)


def test_a_wrong_alpha_misses_the_sd_figure(llama_alpha):
    # negative control: the 5% tolerance above does reject an α 0.1 off
    sd = paper.simulate_run(replace(SETUP, seed=7), PAPER_LLAMA.sd, llama_alpha - 0.1).decode_tokens_per_s
    assert sd != pytest.approx(SD_TPS, rel=0.05)


def test_the_pair_presets_alpha_is_the_one_fitted_to_the_papers_sd():
    for result in paper.run_fits(["paper-llama", "paper-qwen3"], ROUNDS):
        assert PAIR_ALPHA[result["pair"]] == pytest.approx(result["alpha"], abs=0.01)


def test_qwen_is_fitted_to_the_implied_sd_over_ar_ratio():
    (result,) = paper.run_fits(["paper-qwen3"], ROUNDS)
    (fitted,) = [row for row in result["rows"] if row["figure"] == "SD / AR"]
    assert fitted["predicted"] == pytest.approx(2.3 / 1.49, rel=0.01)


def test_the_papers_rows_are_within_ten_percent():
    results = paper.run_fits(["paper-llama", "paper-qwen3"], 3000)
    assert paper.summary(results) == (5, 5)  # SSD tok/s, SSD / SD, SSD / AR (Llama); SSD / SD, SSD / AR (Qwen)


def test_every_ssd_prediction_states_its_hit_model():
    (result,) = paper.run_fits(["log-llama"], 300)
    lines = result["hit_model"].values()
    assert lines and all("α-model" in line and "interval" in line for line in lines)


def test_an_unreachable_sd_figure_is_refused():
    with pytest.raises(ValueError, match="cannot be fitted"):
        paper.fit_alpha(SETUP, Run(Strategy.SD, 1), SD_TPS)  # K = 1: at most 2 tokens a round


def test_the_log_engines_draft_step_is_rederived_from_the_log():
    layer_us, alpha = log_engine.draft_layer_overhead_us()
    assert alpha == pytest.approx(0.921, abs=0.001)
    assert engine_preset("reference-log").draft_layer_overhead_us == pytest.approx(layer_us, abs=0.5)


def test_the_log_engine_reproduces_the_draft_cycles_it_was_calibrated_on():
    engine = engine_preset("reference-log")
    cycles = log_engine._cycles(
        engine.draft_layer_overhead_us, engine.tree_step_overhead_ms, engine.build_row_us, ROUNDS
    )
    assert cycles == pytest.approx(list(log_engine.CYCLES.values()), rel=0.05)


def test_the_command_fits_are_the_published_ones():
    assert COMMAND_FITS == FIT_KEYS


def test_the_command_prints_the_tables_and_writes_the_figures(tmp_path, capsys):
    out = tmp_path / "table.json"
    assert main(["validate", "paper", "--fits", "paper-qwen3", "--rounds", "300", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "predicted figures within 10%" in text and "| paper | qwen3 |" in text and "hit model of SSD" in text
    data = json.loads(out.read_text())
    assert data["command"].startswith("saguaro validate paper --rounds 300") and len(data["fits"]) == 1
    assert data["variants"] == [] and data["fits"][0]["pair"] == "qwen3"


def test_rounds_below_one_are_one_line_and_exit_2(capsys):
    assert main(["validate", "paper", "--rounds", "0"]) == 2
    assert "--rounds must be at least 1" in capsys.readouterr().err
