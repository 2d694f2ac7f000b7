"""`saguaro validate defaults` (saguaro/validation/defaults.py): the command line's speculation defaults against
the best variant of each bench run."""

import json

import pytest

from saguaro.cli import main
from saguaro.validation.defaults import check, is_default, markdown


def _run(tmp_path, name, variants):
    path = tmp_path / name
    path.mkdir()
    (path / "summary.json").write_text(json.dumps({"variants": variants}))
    (path / "config.json").write_text(json.dumps({"prompts": "humaneval"}))
    return path


def v(system, key, tps, T=0.0):
    return {"system": system, "key": f"{system} {key} T={T:g} b=1", "temperature": T, "batch": 1, "tokens_per_s": tps}


SWEEP = [
    v("ar", "", 4.0),
    v("sd", "K=3", 9.0),
    v("sd", "K=auto", 8.8),
    v("ssd", "K=3 B=8 uniform neural", 12.0),
    v("ssd", "K=auto B=auto geometric neural", 10.0),
    v("ssd", "K=auto B=auto uniform neural", 11.0),
]


def test_the_defaults_are_recognised_by_their_keys():
    assert is_default(v("sd", "K=auto", 1)) and not is_default(v("sd", "K=auto C=0.5", 1))
    assert is_default(v("ssd", "K=auto B=auto geometric neural", 1))
    assert not is_default(v("ssd", "K=auto B=auto uniform neural", 1)) and not is_default(v("ar", "", 1))


def test_each_system_is_compared_with_its_own_best(tmp_path):
    rows = {r["system"]: r for r in check([_run(tmp_path, "run", SWEEP)])}
    assert rows["sd"]["ratio"] == pytest.approx(8.8 / 9.0) and rows["sd"]["within"]
    assert rows["ssd"]["ratio"] == pytest.approx(10 / 12) and not rows["ssd"]["within"]  # the negative case


def test_a_run_without_the_default_is_refused_in_one_line(tmp_path, capsys):
    run = _run(tmp_path, "run", [v("sd", "K=3", 9.0)])
    assert main(["validate", "defaults", str(run)]) == 2
    assert "no sd variant runs the default" in capsys.readouterr().err


def test_the_command_prints_the_table_and_the_count(tmp_path, capsys):
    out = tmp_path / "t.md"
    assert main(["validate", "defaults", str(_run(tmp_path, "run", SWEEP)), "--markdown", str(out)]) == 0
    text = capsys.readouterr().out
    assert "| run | prompts | T |" in text and "1 of 2 within 5%" in text and out.read_text() in text


def _calls(path, key, walls, tokens=64):
    with (path / "results.jsonl").open("a") as f:
        for i, wall in enumerate(walls):
            f.write(json.dumps({"key": key, "prompt_id": f"p/{i}", "new_tokens": tokens, "wall_s": wall}) + "\n")


WALLS = [4.0, 12.0, 7.0, 5.0, 9.0, 6.0]  # seconds per prompt: the prompts' lengths vary 3×
OTHER = v("ssd", "K=3 B=8 uniform neural", 6.4)


def _ssd_row(tmp_path, default_tps: float, default_walls: list[float], other_walls: list[float]) -> dict:
    """The SSD row of a run whose default and one other SSD variant answered the same prompts in these times."""
    default = v("ssd", "K=auto B=auto geometric neural", default_tps)
    run = _run(tmp_path, "run", [v("sd", "K=auto", 5.0), default, OTHER])
    _calls(run, OTHER["key"], other_walls)
    _calls(run, default["key"], default_walls)
    return next(r for r in check([run]) if r["system"] == "ssd")


def test_the_ratio_gets_an_interval_from_the_prompts_resampled_in_pairs(tmp_path):
    # the default is 5% slower on every prompt: paired, the ratio is exact
    row = _ssd_row(tmp_path, 6.0, [w * 1.05 for w in WALLS], WALLS)
    assert row["low"] == pytest.approx(1 / 1.05) and row["high"] == pytest.approx(1 / 1.05)


def test_an_interval_widens_with_disagreeing_prompts_and_straddles_the_tolerance(tmp_path):
    """Negative control for the pairing: the same totals, with prompts that disagree, give a wide interval."""
    row = _ssd_row(tmp_path, 6.0, [6.0, 9.0, 9.5, 3.5, 11.0, 5.0], WALLS)
    assert row["low"] < 1 - 0.05 < row["high"]
    assert markdown([row]).splitlines()[-1].split("|")[9].strip() == f"{row['low']:.3f}-{row['high']:.3f}"


def test_without_per_call_results_the_interval_is_left_out(tmp_path):
    rows = check([_run(tmp_path, "run", SWEEP)])
    assert all(r["low"] is None for r in rows)
    assert markdown(rows).splitlines()[-1].split("|")[9].strip() == "-"


def test_a_default_that_is_the_best_gets_the_interval_of_its_lead_over_the_runner_up(tmp_path):
    row = _ssd_row(tmp_path, 7.0, [w / 1.1 for w in WALLS], WALLS)  # 10% faster on every prompt
    assert row["ratio"] == 1.0 and row["rival"] == OTHER["key"]
    assert row["low"] == pytest.approx(1.1) and row["high"] == pytest.approx(1.1)
