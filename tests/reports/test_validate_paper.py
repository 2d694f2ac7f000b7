"""`saguaro validate paper` (saguaro/validation/paper.py): the α fitted on the paper's SD figure reproduces that
figure, also on fresh draws; the command prints both tables and writes the JSON."""

import json
from dataclasses import replace

import pytest

from saguaro.cli import main
from saguaro.commands.validate import PAIRS
from saguaro.validation import paper
from theory import Strategy

ROUNDS = 2000  # small: a fit takes about 20 simulations of this many rounds (a few seconds)
LLAMA = paper.HEADLINE["llama"]
SD_TPS = paper.PAPER["llama"].sd_tps  # 161.8 tok/s


@pytest.fixture(scope="module")
def llama_alpha() -> float:
    return paper.fit_alpha(LLAMA, SD_TPS, ROUNDS, seed=0)


def test_fitted_alpha_reproduces_the_sd_figure_on_its_own_draws(llama_alpha):
    sd = paper.decode_tps(LLAMA, Strategy.SD, llama_alpha, ROUNDS, seed=0)
    assert sd == pytest.approx(SD_TPS, rel=0.01)


def test_fitted_alpha_reproduces_the_sd_figure_on_other_draws(llama_alpha):
    # at 2000 rounds SD tok/s varies by 1.4% (one standard deviation, 20 seeds) at a fixed α, and the fitted α
    # carries as much noise again: 5% is about 2.5 σ of the difference (false alarm ≈ 1% if the draws change)
    sd = paper.decode_tps(LLAMA, Strategy.SD, llama_alpha, ROUNDS, seed=7)
    assert sd == pytest.approx(SD_TPS, rel=0.05)


def test_a_wrong_alpha_misses_the_sd_figure(llama_alpha):
    # negative control: the 5% tolerance above does reject an α 0.1 off
    sd = paper.decode_tps(LLAMA, Strategy.SD, llama_alpha - 0.1, ROUNDS, seed=7)
    assert sd != pytest.approx(SD_TPS, rel=0.05)


def test_qwen_is_fitted_to_the_implied_sd_over_ar_ratio():
    result = paper.reproduce(paper.HEADLINE["qwen3"], ROUNDS, seed=0)
    assert result["simulated"]["sd_over_ar"] == pytest.approx(2.3 / 1.49, rel=0.01)
    assert result["paper"]["ssd_tps"] is None and result["relative_error"]["ssd_tps"] is None


def test_an_unreachable_sd_figure_is_refused():
    with pytest.raises(ValueError, match="cannot be fitted"):
        paper.fit_alpha(replace(LLAMA, K=1), SD_TPS, ROUNDS, seed=0)  # K = 1: at most 2 tokens a round


def test_the_command_pairs_are_the_headline_setups():
    assert PAIRS == tuple(paper.HEADLINE)


def test_the_command_prints_both_tables_and_writes_the_figures(tmp_path, capsys):
    out = tmp_path / "table.json"
    assert main(["validate", "paper", "--pairs", "qwen3", "--no-variants", "--rounds", "300", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "| qwen3 | K=4, " in text and "| pair | variant | fan-out |" in text
    data = json.loads(out.read_text())
    assert data["command"].startswith("saguaro validate paper --rounds 300") and len(data["headline"]) == 1
    assert data["variants"] == [] and data["headline"][0]["setup"]["pair"] == "qwen3"


def test_rounds_below_one_are_one_line_and_exit_2(capsys):
    assert main(["validate", "paper", "--rounds", "0"]) == 2
    assert "--rounds must be at least 1" in capsys.readouterr().err
