"""saguaro.formatting: the one table and number format that simulate, plan, placement, theory and bench print."""

from __future__ import annotations

import json
import math

from saguaro.formatting import format_table, latency_unit, number, readable, table, write_json


def test_a_latency_column_turns_to_seconds_once_a_value_reaches_ten_seconds():
    assert latency_unit([5.0, 9_999.0]) == ("ms", 1.0, 1)
    assert latency_unit([5.0, 10_000.0]) == ("s", 1e-3, 2)
    assert latency_unit([0.5, 9.0]) == ("ms", 1.0, 2)  # below 10 ms: two decimals


def test_readable_names_the_unit_in_the_header_and_fixes_decimals_per_column():
    rows, columns = readable([{"K": 4, "itl_p50_ms": 12_345.0, "tok/s": 123.456}], ["K", "itl_p50_ms", "tok/s"])
    assert columns == ["K", "itl_p50_s", "tok/s"]
    assert rows == [{"K": 4, "itl_p50_s": "12.35", "tok/s": "123.5"}]


def test_a_figure_past_its_limit_is_marked_and_a_missing_sample_says_none():
    assert number(41.0, 1, limit=40.0) == "41.0!"
    assert number(39.0, 1, limit=40.0) == "39.0"
    assert number(math.nan, 1) == "none"
    assert number(None, 1) is None


def test_table_prints_fixed_decimals_and_drops_columns_no_row_has():
    text = table([{"a": 1.0, "b": 2.5}, {"a": 3.0, "b": 4.25}], ["a", "b", "c"], markdown=True)
    assert text.splitlines() == ["| a | b |", "|---|---|", "| 1.00 | 2.50 |", "| 3.00 | 4.25 |"]
    assert format_table([{"a": None}], ["a"]).splitlines() == ["a", "-"]


def test_write_json_gives_null_for_figures_without_samples(tmp_path):
    path = tmp_path / "out.json"
    write_json(str(path), {"itl_ms": math.nan, "rows": [math.inf, 1.5]})
    assert json.loads(path.read_text()) == {"itl_ms": None, "rows": [None, 1.5]}
