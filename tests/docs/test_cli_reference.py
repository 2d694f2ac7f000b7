"""docs/cli.md against saguaro.cli's parsers: a section for every command, every flag it names taken by the
command it names it for, every flag of every parser named, and every example command line accepted."""

from __future__ import annotations

import pytest

from tests.docs.cli_reference import (
    CLI_MD,
    bad_examples,
    documented_flags,
    missing_sections,
    undocumented_flags,
    unknown_flags,
)

TEXT = CLI_MD.read_text(encoding="utf-8")


def test_every_command_has_a_section():
    assert missing_sections(TEXT) == []


def test_every_flag_the_reference_names_is_a_flag_of_its_command():
    assert unknown_flags(TEXT) == []


def test_every_flag_of_every_command_is_in_the_reference():
    assert undocumented_flags(TEXT) == []


def test_every_example_command_line_parses(capsys):
    assert bad_examples(TEXT) == [], capsys.readouterr().err


def test_the_shared_model_table_documents_a_flag_for_each_command_its_row_names():
    documented = documented_flags(TEXT)
    assert {"--draft-int8", "--target-quant"} <= documented["calibrate"] & documented["bench"]
    assert "--draft-dtype" in documented["serve"] and "--draft-dtype" not in documented["calibrate"]


# -- negative controls: a doctored reference is caught ------------------------------------------------------
def test_a_flag_renamed_in_the_reference_is_caught_both_ways():
    doctored = TEXT.replace("`--draft-int8`", "`--draft-int9`")
    assert "saguaro generate has no --draft-int9" in " ".join(unknown_flags(doctored))
    assert "saguaro calibrate: --draft-int8" in undocumented_flags(doctored)


def test_a_flag_given_to_the_wrong_command_is_caught():
    doctored = TEXT.replace("| generate, serve, calibrate |", "| generate, serve, calibrate, report |", 1)
    assert any("saguaro report has no" in line for line in unknown_flags(doctored))


@pytest.mark.parametrize("bad", ["saguaro simulate --no-such-flag", "saguaro no-such-command"])
def test_an_example_the_parser_refuses_is_caught(bad, capsys):
    doctored = TEXT.replace("saguaro theory speedup --alpha 0.8", f"{bad} --alpha 0.8", 1)
    assert len(bad_examples(doctored)) == 1


def test_a_command_without_a_section_is_caught():
    doctored = TEXT.replace("## `saguaro validate`", "## Validation")
    assert missing_sections(doctored) == ["no section for saguaro validate"]
