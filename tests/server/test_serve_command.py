"""`saguaro serve`'s flags before any model loads: where the API key comes from, the draft worker's deadline."""

from __future__ import annotations

import logging

import pytest

from saguaro.cli import build_parser, main
from saguaro.commands.serve import API_KEY_VARIABLE, api_key, placement


def parse(*flags: str):
    return build_parser().parse_args(["serve", *flags])


def test_the_key_comes_from_the_environment():
    assert api_key(parse(), {API_KEY_VARIABLE: "from-env"}) == "from-env"


def test_the_key_comes_from_the_first_line_of_a_file(tmp_path):
    path = tmp_path / "key"
    path.write_text("from-file\nignored\n")
    assert api_key(parse("--api-key-file", str(path)), {API_KEY_VARIABLE: "from-env"}) == "from-file"


def test_no_key_anywhere_serves_without_one():
    assert api_key(parse(), {}) is None


def test_a_key_on_the_command_line_still_works_with_a_warning(caplog):
    with caplog.at_level(logging.WARNING):
        assert api_key(parse("--api-key", "seen-in-ps"), {}) == "seen-in-ps"
    assert "ps" in caplog.text


def test_an_empty_key_file_is_refused_in_one_line(tmp_path, capsys):
    path = tmp_path / "key"
    path.write_text("\n")
    assert main(["serve", "--api-key-file", str(path), "--port", "0"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"saguaro serve: error: --api-key-file {path} is empty: its first line is the key"


def test_the_draft_deadline_is_the_ssd_workers_deadline():
    assert placement(parse("--draft-deadline", "2.5")).deadline_s == 2.5


@pytest.mark.parametrize("value", ["0", "-1"])
def test_a_draft_deadline_that_is_not_positive_is_refused(value, capsys):
    assert main(["serve", "--draft-deadline", value, "--port", "0"]) == 2
    assert "--draft-deadline must be > 0 seconds" in capsys.readouterr().err
