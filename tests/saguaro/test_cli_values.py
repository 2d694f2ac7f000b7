"""saguaro.commands.values: the flag readers that bench, generate and simulate share."""

import argparse

import pytest

from saguaro.commands.values import argument_type, flat, numbers, whole_or_auto


@pytest.mark.parametrize("text, value", [("auto", "auto"), ("4", 4), (" 12", 12), (3, 3)])
def test_whole_or_auto_reads_auto_or_an_integer(text, value):
    assert whole_or_auto(text, "K is a number") == value


@pytest.mark.parametrize("text", ["lots", "2.5", "", None, "Auto"])
def test_whole_or_auto_refuses_the_rest_with_what_the_flag_takes(text):
    with pytest.raises(ValueError, match=r"^-K takes K, got "):
        whole_or_auto(text, "-K takes K")


@pytest.mark.parametrize(
    "text, separators, value",
    [
        ("4", ",", [4]),
        ("4,3,2", ",", [4, 3, 2]),
        ("4,,3,", ",", [4, 3]),
        ("4-3-2", ",-", [4, 3, 2]),
        ("4,3-2", ",-", [4, 3, 2]),
    ],
)
def test_numbers_reads_one_word_in_the_spaced_or_the_old_form(text, separators, value):
    assert numbers(text, int, "F", separators=separators) == value


def test_numbers_reads_floats_and_names_the_word_it_could_not_read():
    assert numbers("0.9,0.8 inf", float, "α") == [0.9, 0.8, float("inf")]
    with pytest.raises(ValueError, match=r"^a fan-out is integers, got '4,x'$"):
        numbers("4,x", int, "a fan-out is integers")
    with pytest.raises(ValueError, match="got '4-3'"):
        numbers("4-3", int, "a fan-out is integers")  # '-' separates only where the flag says so


def test_flat_joins_the_words_of_a_list_flag():
    assert flat([[4, 3], [2], [1]]) == [4, 3, 2, 1]
    assert flat(None) is None


def test_argument_type_turns_the_readers_error_into_a_usage_error():
    parser = argparse.ArgumentParser()
    parser.add_argument("-K", type=argument_type(whole_or_auto, "K is a whole number or auto"), nargs="+")
    assert parser.parse_args(["-K", "2", "auto"]).K == [2, "auto"]
    with pytest.raises(argparse.ArgumentTypeError, match=r"^K is a whole number or auto, got 'x'$"):
        argument_type(whole_or_auto, "K is a whole number or auto")("x")


@pytest.mark.parametrize("text", ["-1", "-4-3", ",4"])
def test_a_word_that_starts_with_a_separator_is_refused_not_read_as_the_numbers_after_it(text):
    """`--fanout -1` once read as [1]: '-' is also the old form's separator, so the negative check never saw it."""
    with pytest.raises(ValueError, match=f"got '{text}'"):
        numbers(text, int, "a fan-out is integers", separators=",-")


def test_bench_refuses_a_negative_fanout_with_exit_status_2(capsys):
    from saguaro.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["bench", "--systems", "ssd", "--fanout", "-1"])
    assert exit_.value.code == 2 and "got '-1'" in capsys.readouterr().err
