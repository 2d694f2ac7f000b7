"""`saguaro validate engine` on committed run folders (reports/2026-12-cpu-prediction-accuracy, the runs of
2026-12-01 on an AVX-512 host): the calibration is leveled per run folder by that folder's own SD variants, else
by the temperature's SD reference."""

import json
from pathlib import Path

import numpy as np
import pytest

from saguaro.cli import main
from saguaro.validation import measured

SESSION = "2026-12-01-avx512"  # bench runs 18:43-20:01 UTC and two calibrations, 18:42 and 19:05


@pytest.fixture(scope="module")
def session(held_out_runs) -> Path:
    return held_out_runs / SESSION


def run_folder(session: Path, name: str) -> Path:
    return next((session / "runs").glob(f"*-{name}"))


def _run(session: Path, tmp_path: Path, *extra: str, calibrations: tuple | None = None) -> list[dict]:
    calibrations = calibrations or (session / "calibration-1842.jsonl",)
    folders = [run_folder(session, name) for name in ("k5ref", "b4")]
    out = tmp_path / "validation.json"
    code = main(
        [
            "validate",
            "engine",
            *map(str, folders),
            "--calibration",
            *map(str, calibrations),
            "--rounds",
            "300",
            "--json",
            str(out),
            *extra,
        ]
    )
    assert code == 0
    return json.loads(out.read_text())["rows"]


def _copy_with_rounds(folder: Path, into: Path, keep) -> Path:
    """A copy of a bench run folder under `into` whose rounds.jsonl holds only the records `keep` accepts."""
    copy = into / folder.name
    copy.mkdir()
    for name in ("config.json", "environment.json", "prompts.jsonl", "results.jsonl", "summary.json"):
        (copy / name).write_bytes((folder / name).read_bytes())
    rows = [json.loads(line) for line in (folder / "rounds.jsonl").read_text().splitlines()]
    (copy / "rounds.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows if keep(r)))
    return copy


def test_each_run_folder_is_leveled_by_its_own_sd_variants(session, tmp_path):
    rows = _run(session, tmp_path)
    reference = [r for r in rows if r["reference"]]
    assert [r["configuration"] for r in reference] == ["sd T=0 b=1 K=5"]
    b4 = [r for r in rows if r["run"].endswith("-b4")]
    assert {r["configuration"].split()[0] for r in b4} == {"ar", "sd", "ssd"}
    sd_b4 = [r for r in b4 if r["configuration"].startswith("sd ")]
    assert [r["level_source"] for r in sd_b4] == [True]
    assert not any(r["level_source"] for r in b4 if r is not sd_b4[0])
    # every row of the b4 folder carries the level its SD variant measured, not the reference's
    assert all(r["level"] == sd_b4[0]["level"] for r in b4)
    assert sd_b4[0]["level"]["rounds"] == sd_b4[0]["rounds"]
    assert sd_b4[0]["level"]["measured"] != pytest.approx(reference[0]["level"]["measured"], rel=0.01)


def test_ssd_rows_show_the_measured_hit_rate_beside_the_predicted_one(session, tmp_path):
    """The measured one as `saguaro bench` now reports it (outcomes looked up, first rounds left out, as the
    simulator counts), the predicted one the simulator's; other rows have none."""
    from saguaro.reporting.analysis import rounds as R

    rows = _run(session, tmp_path)
    b4 = run_folder(session, "b4")
    records = [json.loads(line) for line in (b4 / "rounds.jsonl").read_text().splitlines()]
    keys = sorted({r["key"] for r in records if r["key"].startswith("ssd ")})
    bench = [R.hit_rate([[r for r in records if r["key"] == key]]) for key in keys]
    ssd = [r for r in rows if r["configuration"].startswith("ssd ")]
    assert len(ssd) == 2 and len(bench) == 2
    assert sorted(r["hit_rate"] for r in ssd) == pytest.approx(sorted(bench), abs=1e-4)
    assert all(0 < r["predicted_hit_rate"] <= 1 for r in ssd)
    assert all(r["hit_rate"] is None and r["predicted_hit_rate"] is None for r in rows if r not in ssd)


def test_no_level_leaves_the_calibration_as_it_is(session, tmp_path):
    rows = _run(session, tmp_path, "--no-level")
    assert not any(r["level_source"] or r["level"] for r in rows)


def test_a_folder_whose_sd_rounds_cannot_set_a_level_is_one_line_and_exit_2(session, tmp_path, capsys):
    """Two SD rounds in the b4 folder: too few to level on (three are needed)."""
    b4 = run_folder(session, "b4")
    rows = [json.loads(line) for line in (b4 / "rounds.jsonl").read_text().splitlines()]
    sd = [r for r in rows if r["key"].startswith("sd ") and r.get("phase") == "decode"]
    short = _copy_with_rounds(
        b4, tmp_path, lambda r: not r["key"].startswith("sd ") or r.get("phase") != "decode" or r in sd[:2]
    )
    code = main(
        [
            "validate",
            "engine",
            str(run_folder(session, "k5ref")),
            str(short),
            "--calibration",
            str(session / "calibration-1842.jsonl"),
            "--rounds",
            "300",
        ]
    )
    err = capsys.readouterr().err
    assert code == 2
    assert f"error: {b4.name}, T = 0: leveling needs an SD run's decode rounds" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def _at_temperature(session: Path, tmp_path: Path, name: str, temperature: float) -> Path:
    """A copy of a committed calibration whose summary says it was taken at `temperature`."""
    source = session / name
    copy = tmp_path / f"T{temperature:g}-{name}"
    copy.write_bytes(source.read_bytes())
    summary = json.loads(source.with_suffix(".summary.json").read_text())
    summary["inputs"]["temperature"] = temperature
    copy.with_suffix(".summary.json").write_text(json.dumps(summary))
    return copy


def test_each_configuration_takes_the_calibration_at_its_temperature_else_the_nearest(session, tmp_path, capsys):
    """The runs are at T = 0: beside a calibration at T = 0.7 the greedy one (1842, written before --temperature:
    greedy) is used, so the table is the one 1842 alone gives; given only the T = 0.7 one, it stands in, said."""
    alone = _run(session, tmp_path)
    hot_1905 = _at_temperature(session, tmp_path, "calibration-1905.jsonl", 0.7)
    both = _run(session, tmp_path, calibrations=(session / "calibration-1842.jsonl", hot_1905))
    assert [(r["configuration"], r["predicted"]) for r in both] == [(r["configuration"], r["predicted"]) for r in alone]
    capsys.readouterr()
    stand_in = _run(session, tmp_path, calibrations=(hot_1905,))
    assert "no calibration at this temperature; the one at T = 0.7" in capsys.readouterr().err
    as_greedy = _run(session, tmp_path, calibrations=(session / "calibration-1905.jsonl",))
    assert [r["predicted"] for r in stand_in] == [r["predicted"] for r in as_greedy]
    assert [r["predicted"] for r in stand_in] != [r["predicted"] for r in alone]  # 1905 is not 1842


def pooled_calibration(tmp_path: Path, *paths: Path) -> Path:
    """One calibration file holding the records of the given ones in turn, with the first one's summary."""
    pooled = tmp_path / "pooled.jsonl"
    pooled.write_text("".join(path.read_text() for path in paths))
    pooled.with_suffix(".summary.json").write_bytes(paths[0].with_suffix(".summary.json").read_bytes())
    return pooled


def test_two_calibrations_at_one_temperature_are_fitted_as_one(session, tmp_path, capsys):
    """Given two greedy calibrations, the table is the one their records in a single file give (one fit over
    both, as `saguaro simulate --fit A B`), and neither's alone."""
    paths = (session / "calibration-1842.jsonl", session / "calibration-1905.jsonl")
    both = _run(session, tmp_path, calibrations=paths)
    assert "calibration-1842.jsonl + " in capsys.readouterr().out  # the fit names both
    one_file = _run(session, tmp_path, calibrations=(pooled_calibration(tmp_path, *paths),))
    assert [(r["configuration"], r["predicted"]) for r in both] == [
        (r["configuration"], r["predicted"]) for r in one_file
    ]
    for path in paths:
        alone = _run(session, tmp_path, calibrations=(path,))
        assert [r["predicted"] for r in alone] != [r["predicted"] for r in both]


def test_the_lookups_rates_per_position_multiply_to_its_measured_all_accepted_share(session):
    """On the committed lookup run (K 4, budget 4): α_i over the rows the lookup proposed; their product is
    exactly the share of those rows that took all K (the estimator telescopes), and the first position is the
    hard one (a continuation holds or fails at once)."""
    from simulator.hits import is_draft_sourced

    folder = run_folder(session, "fast-backups")
    rows = next(
        r for s, r in measured.variants(folder).values() if s.get("backup") == "lookup" and s.get("budget") == 4
    )
    alphas = measured.lookup_alphas(rows)
    assert alphas is not None and len(alphas) == 4
    proposed = [k for r in rows for i, k in enumerate(r.accepted) if not is_draft_sourced(r, i)]
    assert float(np.prod(alphas)) == pytest.approx(sum(k == 4 for k in proposed) / len(proposed))
    assert alphas[0] < min(alphas[1:])


def test_terms_show_each_forward_measured_beside_the_leveled_fit(session, tmp_path):
    """--terms: per configuration, the medians of its rounds' verify, SD draft, SSD build and neural backup as
    the bench recorded them, beside the leveled fit's for the same shapes; a term a system lacks is absent."""
    rows = _run(session, tmp_path, "--terms")
    b4 = run_folder(session, "b4")
    records = [json.loads(line) for line in (b4 / "rounds.jsonl").read_text().splitlines()]
    for row in (r for r in rows if r["run"] == b4.name):
        system = row["configuration"].split()[0]
        mine = [
            r
            for r in records
            if r["phase"] == "decode"
            and r["key"].startswith(f"{system} ")
            and (system != "ssd" or f"B={r['key'].split('B=')[1].split()[0]} " in row["configuration"] + " ")
        ]
        want = {"ar": {"verify"}, "sd": {"verify", "draft"}, "ssd": {"verify", "cache_build", "backup"}}[system]
        assert set(row["terms"]) == want, row["configuration"]
        verify = row["terms"]["verify"]
        assert verify["rounds"] == len(mine) == row["rounds"]
        assert verify["measured"] == pytest.approx(np.median([r["verify_ms"] for r in mine]), abs=0.05)
        if system == "ssd":
            builds = [r["cache_build_ms"] for r in mine if r.get("cache_build_ms")]
            assert row["terms"]["cache_build"]["measured"] == pytest.approx(np.median(builds), abs=0.05)
        for term in row["terms"].values():
            assert term["predicted"] > 0 and 0.5 < term["predicted"] / term["measured"] < 2


def test_without_terms_the_table_is_the_same(session, tmp_path, capsys):
    """The breakdown is extra output: the tokens/s rows are those of a run without it."""
    plain = _run(session, tmp_path)
    capsys.readouterr()
    with_terms = _run(session, tmp_path, "--terms")
    assert "per term" in capsys.readouterr().out
    strip = lambda rows: [{k: v for k, v in r.items() if k != "terms"} for r in rows]  # noqa: E731
    assert strip(plain) == strip(with_terms)


def test_build_level_scales_only_the_ssd_predictions_and_needs_the_engines_build_rounds(
    held_out_runs, session, tmp_path, capsys
):
    """--build-level (an experiment): the calibration of 2026-12-02 10:50 holds the engine's build rounds;
    applied, the SSD rows' builds and so their predictions move and nothing else does. A calibration without
    them: one line, exit 2."""
    with_rounds = (held_out_runs / "2026-12-02-avx512-1050" / "runs" / "calibration.jsonl",)
    plain = _run(session, tmp_path, "--terms", calibrations=with_rounds)
    leveled = _run(session, tmp_path, "--terms", "--build-level", calibrations=with_rounds)
    assert [r["configuration"] for r in plain] == [r["configuration"] for r in leveled]
    for a, b in zip(plain, leveled, strict=True):
        if a["configuration"].startswith("ssd"):
            assert a["predicted"] != b["predicted"]
            assert a["terms"]["cache_build"]["predicted"] != b["terms"]["cache_build"]["predicted"]
            assert a["terms"]["verify"] == b["terms"]["verify"]
        else:
            assert a["predicted"] == b["predicted"]
    code = main(
        [
            "validate",
            "engine",
            str(run_folder(session, "k5ref")),
            "--calibration",
            str(session / "calibration-1842.jsonl"),
            "--build-level",
        ]
    )
    err = capsys.readouterr().err
    assert code == 2 and "no engine build rounds" in err and "Traceback" not in err


def test_without_an_sd_run_at_batch_1_alpha_and_hits_come_from_the_smallest_batch(session, tmp_path, capsys):
    """The b4 folder alone: its SD variant at batch 4 is the reference (every row records its own outcomes), and
    with the batch-1 run beside it the batch-1 one still is. Runs without any SD variant: one line, exit 2."""
    b4 = run_folder(session, "b4")
    out = tmp_path / "b4.json"
    code = main(
        [
            "validate",
            "-v",
            "engine",
            str(b4),
            "--calibration",
            str(session / "calibration-1842.jsonl"),
            "--rounds",
            "300",
            "--json",
            str(out),
        ]
    )
    assert code == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["configuration"] for r in rows if r["reference"]] == ["sd T=0 b=4 K=4"]
    assert "α per position and hits from" in capsys.readouterr().err
    assert any(r["configuration"].startswith("ssd ") and r["predicted_hit_rate"] for r in rows)
    assert [r["configuration"] for r in _run(session, tmp_path) if r["reference"]] == ["sd T=0 b=1 K=5"]

    no_sd = _copy_with_rounds(b4, tmp_path, lambda r: not r["key"].startswith("sd "))
    code = main(
        ["validate", "engine", str(no_sd), "--calibration", str(session / "calibration-1842.jsonl"), "--rounds", "300"]
    )
    err = capsys.readouterr().err
    assert code == 2 and "no SD variant" in err and "saguaro bench --systems sd" in err and "Traceback" not in err


def test_batch_rows_are_also_measured_over_their_full_batch_rounds(session, tmp_path, capsys):
    """`saguaro bench` runs fixed batches whose last rows run on alone; the closed loop refills at once. Each
    batch > 1 configuration is also measured over its rounds at the full batch, and its error taken against
    them; a configuration whose every round ran at its batch (batch 1 here) has none."""
    rows = _run(session, tmp_path)
    b4 = run_folder(session, "b4")
    records = [json.loads(line) for line in (b4 / "rounds.jsonl").read_text().splitlines()]
    checked = 0
    for row in rows:
        if not row["run"].endswith("-b4"):
            assert row["measured_full_batch"] is None and row["error_full_batch"] == row["error"]
            continue
        (key,) = (k for k in {r["key"] for r in records} if _same_variant(k, row["configuration"]))
        decode = [r for r in records if r["key"] == key and r["phase"] == "decode"]
        full = [r for r in decode if r["batch_size"] == 4]
        if key.startswith("ar "):  # one token a round: every row ends in the same round, no tail
            assert len(full) == len(decode) and row["measured_full_batch"] is None
            continue
        assert len(full) < len(decode), "the b4 folder's SD and SSD batches end in tails"
        expected = sum(sum(r["emitted"]) for r in full) / sum(r["round_ms"] for r in full) * 1e3
        assert row["measured_full_batch"] == pytest.approx(expected, abs=1e-3)
        assert row["measured_full_batch"] > row["measured"]  # the tail rounds make fewer tokens a second
        assert row["error_full_batch"] == pytest.approx(row["predicted"] / expected - 1, abs=1e-3)
        checked += 1
    assert checked == 3  # sd and two ssd
    out = capsys.readouterr().out
    assert "full-batch rounds: measured" in out and "against the full-batch rounds alone" in out


def test_a_float32_calibration_is_refused_for_bfloat16_runs(session, tmp_path, capsys):
    source = session / "calibration-1842.jsonl"
    cal = tmp_path / "calibration-f32.jsonl"
    cal.write_text(source.read_text())
    summary = json.loads(source.with_suffix(".summary.json").read_text())
    summary["inputs"]["dtype"] = "float32"
    cal.with_suffix(".summary.json").write_text(json.dumps(summary))
    code = main(["validate", "engine", str(run_folder(session, "k5ref")), "--calibration", str(cal), "--rounds", "100"])
    assert code == 2
    assert "dtype bfloat16 (not float32)" in capsys.readouterr().err


def _same_variant(key: str, configuration: str) -> bool:
    """A bench key ("ssd K=4 B=8 uniform neural T=0 b=4") names the variant of a table label ("ssd T=0 b=4 K=4
    uniform B=8 F=2-2-2-1-1 neural") when they share the system and the label holds each of the key's words."""
    words = configuration.split()
    return key.split()[0] == words[0] and set(key.split()) <= set(words)
