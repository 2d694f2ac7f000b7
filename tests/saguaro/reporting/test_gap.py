"""The share of Cor. 9's ceiling split into factors (saguaro.reporting.analysis.gap), on records built so each is
known."""

from __future__ import annotations

from math import prod
from pathlib import Path

import pytest

from saguaro.reporting.analysis.gap import FACTORS, decompose, gap_rows, reading
from saguaro.reporting.analysis.load import Run


def _ssd(
    accepted: int,
    verify: float,
    wait: float,
    hit: bool,
    backup: float = 0.0,
    other: float = 5.0,
    build: float = 200.0,
    emitted: int | None = None,
) -> dict:
    return {
        "phase": "decode",
        "batch_size": 1,
        "K": 3,
        "accepted": [accepted],
        "emitted": [accepted + 1 if emitted is None else emitted],
        "draft_ms": wait,
        "wait_ms": wait,
        "verify_ms": verify,
        "round_ms": wait + verify + other,
        "hit": [hit],
        "backup_ms": backup,
        "cache_build_ms": build,
    }


def _sd(
    accepted: int,
    emitted: int | None = None,
    draft: float = 60.0,
    verify: float = 200.0,
    other: float = 10.0,
    K: int = 3,
) -> dict:
    return {
        "phase": "decode",
        "batch_size": 1,
        "K": K,
        "accepted": [accepted],
        "emitted": [accepted + 1 if emitted is None else emitted],
        "draft_ms": draft,
        "verify_ms": verify,
        "round_ms": draft + verify + other,
    }


def _ssd_call(overrun: bool) -> list[dict]:
    """One generate call: a first round that waits 200 ms more (the worker's start), three hits, two misses.
    Every round: verify 220 ms, link 10 ms, 5 ms of the rest; hits accept 2, misses 1 after a 120 ms backup."""
    return [
        _ssd(2, 220.0, 10.0 + 200.0, True),
        _ssd(2, 220.0, 10.0, True),
        _ssd(2, 220.0, 10.0, True, build=250.0 if overrun else 200.0),
        _ssd(2, 220.0, 10.0, True),
        _ssd(1, 220.0, 10.0 + 120.0, False, backup=120.0),
        _ssd(1, 220.0, 10.0 + 120.0, False, backup=120.0),
    ]


def _sd_call() -> list[dict]:
    """Five rounds accepting 2 (draft 60, 10 ms of the rest): four of K = 3 (verify 200 ms), the last cut to 1
    token, and one of K = 2 (verify 180 ms), a shape SSD never verifies."""
    return [_sd(2), _sd(2), _sd(2, K=2, verify=180.0), _sd(2), _sd(2, emitted=1)]


def test_each_factor_is_what_the_records_were_built_with_and_they_multiply_to_the_share():
    row = decompose([_ssd_call(True), _ssd_call(False)], [_sd_call(), _sd_call()])
    # SSD: 12 rounds, 8 hits of 3 tokens and 4 misses of 2; T = 12·235 + 4·120 (backup) + 2·200 (start) = 3700;
    # the start is each call's whole first wait (its link too), the waits the 10 later rounds' links
    T, B, S, W, V, overhead = 3700.0, 480.0, 2 * 210.0, 10 * 10.0, 12 * 220.0, 12 * 5.0
    expected = {
        "misses_tokens": (8 * 3 + 4 * 2) / 12 / 3,
        "misses_backup": (T - B) / T,
        "start": (T - B - S) / (T - B),
        "waits": (T - B - S - W) / (T - B - S),
        "shapes": (60.0 + 196.0) / (60.0 + 200.0),  # SD's verify: 196 ms at its own K mix, 200 at SSD's K = 3
        "interference": (60.0 + 200.0) / (60.0 + 220.0),
        "overhead": V / (V + overhead) * 266.0 / 256.0,
        "rest": 1.0 / (26 / 30),  # SSD's tokens all kept; SD's 30 drafted, 26 emitted
    }
    assert {f: row[f] for f in FACTORS} == pytest.approx(expected)
    assert all(v != pytest.approx(1.0) for v in expected.values())  # dropping any factor breaks the product
    measured = (32 / T) / (26 / 2660.0)
    ceiling = (1 + 60.0 / 220.0) * 3 / 3
    assert row["measured_ssd_over_sd"] == pytest.approx(measured)
    assert row["ceiling"] == pytest.approx(ceiling)
    assert prod(row[f] for f in FACTORS) == pytest.approx(measured / ceiling, rel=1e-12)
    assert row["p_hit"] == pytest.approx(8 / 12) and row["E_miss_over_E_hit"] == pytest.approx(2 / 3)
    assert row["backup_ms"] == pytest.approx(120.0) and row["start_ms"] == pytest.approx(210.0)
    assert row["link_ms"] == pytest.approx(10.0) and row["overrun_rounds"] == pytest.approx(1 / 10)


def test_the_hit_rate_for_90_percent_solves_the_share_with_todays_miss_cost():
    # No other loss: verify 100, no link, no rest, SD's verify the same; a miss costs a 50 ms backup and
    # as many tokens as a hit, so share(p) = 100 / (100 + (1 − p)·50), 0.9 at p = 7/9.
    ssd = [[_ssd(1, 100.0, 0.0, True, other=0.0)] * 6 + [_ssd(1, 100.0, 50.0, False, backup=50.0, other=0.0)] * 4]
    sd = [[_sd(1, draft=30.0, verify=100.0, other=0.0)] * 5]
    row = decompose(ssd, sd)
    assert row["share"] == pytest.approx(100 / (100 + 0.4 * 50))
    assert row["share_at_all_hits"] == pytest.approx(1.0)
    assert row["p_hit_for_90"] == pytest.approx(7 / 9, abs=1e-4)
    assert row["p_hit_misses_alone"] == pytest.approx(7 / 9, abs=1e-4)
    assert "hit rate of 0.78 (today 0.60)" in reading({**row, "key": "ssd"})


def test_no_hit_rate_reaches_90_percent_when_the_other_factors_cap_it_and_the_line_says_which():
    row = decompose([_ssd_call(False)], [[_sd(2)] * 5])
    assert row["share_at_all_hits"] < 0.9 and row["p_hit_for_90"] is None
    line = reading({**row, "key": "ssd"})
    assert "no hit rate reaches 90%" in line and f"{row['share_at_all_hits']:.2f}" in line
    assert "largest loss: start" in line  # 200 ms of start in 6 short rounds: the largest loss here
    assert f"the misses leave {row['misses_tokens'] * row['misses_backup']:.2f}" in line
    hits_only = decompose([[r for r in _ssd_call(False) if r["hit"][0]]], [[_sd(2)] * 5])
    assert reading({**hits_only, "key": "ssd"}).endswith("there are no misses.")


def test_with_no_misses_the_miss_factors_are_one_and_no_hit_rate_is_asked():
    call = [r for r in _ssd_call(False) if r["hit"][0]]
    row = decompose([call], [_sd_call()])
    assert row["misses_tokens"] == 1.0 and row["misses_backup"] == 1.0 and row["p_hit"] == 1.0
    assert row["E_miss"] is None and row["backup_ms"] is None and row["p_hit_for_90"] is None
    assert prod(row[f] for f in FACTORS) == pytest.approx(row["share"], rel=1e-12)


def test_with_every_speculation_missed_there_is_no_ceiling_and_no_row():
    call = [r for r in _ssd_call(False) if not r["hit"][0]]
    assert decompose([call], [_sd_call()]) is None


def test_without_sd_rounds_there_is_no_row():
    assert decompose([_ssd_call(False)], []) is None


def test_gap_rows_follow_the_ceiling_rows_and_skip_variants_without_rounds():
    def tag(rows: list[dict], key: str, index: int) -> list[dict]:
        return [{**r, "key": key, "batch_index": index, "round": i} for i, r in enumerate(rows)]

    misses = [r for r in _ssd_call(False) if not r["hit"][0]]
    rounds = tag(_ssd_call(False), "ssd K=3", 0) + tag(_sd_call(), "sd K=3", 0) + tag(misses, "ssd K=4", 0)
    run = Run(Path("run"), {}, {}, [], rounds)
    ceilings = [
        {"run": "run", "key": "ssd K=3", "sd_key": "sd K=3"},
        {"run": "run", "key": "ssd K=4", "sd_key": "sd K=3"},  # never hit: no E_hit
        {"run": "run", "key": "ssd K=5", "sd_key": "sd K=3"},
    ]  # no rounds at all
    rows = gap_rows([run], ceilings)
    assert [r["key"] for r in rows] == ["ssd K=3"]
    assert rows[0]["share"] == pytest.approx(decompose([_ssd_call(False)], [_sd_call()])["share"])


def test_on_the_fixture_runs_each_ceiling_row_gets_its_factors_and_the_report_prints_them(tmp_path):
    from saguaro.reporting.analysis.predict import ceiling_rows
    from saguaro.reporting.report import build_report, load_data
    from tests.saguaro.conftest import FIXTURE_RUNS

    data, _ = load_data(FIXTURE_RUNS)
    ceilings = ceiling_rows(data.runs, data.rows)
    rows = gap_rows(data.runs, ceilings)
    assert len(rows) == len(ceilings) > 0
    for c, g in zip(ceilings, rows, strict=True):
        assert (g["key"], g["sd_key"]) == (c["key"], c["sd_key"])
        assert g["share"] == pytest.approx(c["share"]) and g["ceiling"] == pytest.approx(c["ceiling"])
        assert prod(g[f] for f in FACTORS) == pytest.approx(c["share"], rel=1e-9)
    text = build_report(FIXTURE_RUNS, tmp_path).read_text()
    section = text.split("## SSD against its Cor. 9 ceiling", 1)[1].split("\n## ", 1)[0]
    assert "### Where the share goes" in section and "| misses_tokens | misses_backup | start | waits |" in section
    assert section.count("- `ssd ") == len(rows)


def test_sds_verify_at_ssds_shapes_is_matched_by_k_then_linear_in_k_then_scaled():
    from saguaro.reporting.analysis.gap import _verify_at_shapes

    sd = [_sd(1, K=1, verify=100.0), _sd(1, K=2, verify=120.0), _sd(1, K=2, verify=124.0)]
    assert _verify_at_shapes(sd, [_ssd(1, 150.0, 0.0, True) | {"K": 2}]) == pytest.approx(122.0)
    assert _verify_at_shapes(sd, [_ssd(1, 150.0, 0.0, True) | {"K": 3}]) == pytest.approx(144.0)  # 100 + 22·2
    # one SD shape only: an unmatched SSD round is priced at its own verify times SD/SSD of the matched ones
    ssd = [_ssd(1, 150.0, 0.0, True) | {"K": 1}, _ssd(1, 300.0, 0.0, True) | {"K": 5}]
    assert _verify_at_shapes([_sd(1, K=1, verify=100.0)], ssd) == pytest.approx((100.0 + 300.0 * 100 / 150) / 2)
