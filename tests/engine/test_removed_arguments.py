"""LLM's low-bit arguments from before QuantConfig (draft_int8, quant_group_size, target_head_quant,
draft_head_quant) keep working until 0.3.0: each gives a DeprecationWarning naming its replacement, at the
caller's line, and a ValueError when the replacement is given too at another value."""

from __future__ import annotations

import warnings

import pytest

from engine import LLM
from engine.config import REMOVED_IN, REMOVED_QUANT_ARGUMENTS, QuantConfig, replace_removed_quant_arguments


def test_draft_int8_still_gives_a_dynamic_int8_draft_with_a_warning_at_the_callers_line(target, draft):
    with pytest.warns(
        DeprecationWarning,
        match=r"LLM\(draft_int8=\.\.\.\) is deprecated .* use "
        r"draft_quant='int8-dynamic'",
    ) as caught:
        llm = LLM(target, draft, strategy="sd", draft_int8=True)
    with llm:
        assert llm.config.draft_quant == QuantConfig("int8-dynamic")
        assert llm.config.draft_float_dtype == "float32"
    assert [w.filename for w in caught if w.category is DeprecationWarning] == [__file__]


def test_an_argument_that_never_existed_is_still_a_type_error(target):
    with pytest.raises(TypeError, match="unexpected keyword argument 'draft_int4'"):
        LLM(target, draft_int4=True)


@pytest.mark.parametrize("name", sorted(REMOVED_QUANT_ARGUMENTS))
def test_each_removed_argument_names_its_replacement_and_the_version_that_drops_it(name):
    value = {"draft_int8": True, "quant_group_size": 64, "target_head_quant": "int8", "draft_head_quant": "int8"}
    draft_quant = None if name == "draft_int8" else "int4"
    _, _, messages = replace_removed_quant_arguments("int4", draft_quant, {name: value[name]})
    assert messages == [
        f"LLM({name}=...) is deprecated since 0.2.0 and will be removed in {REMOVED_IN}: "
        f"use {REMOVED_QUANT_ARGUMENTS[name]}"
    ]


def test_quant_group_size_sets_the_group_of_both_quantisations():
    target, draft, _ = replace_removed_quant_arguments("int4", "int8", {"quant_group_size": 128})
    assert target == QuantConfig("int4", group_size=128) and draft == QuantConfig("int8", group_size=128)


def test_head_quant_arguments_set_each_models_head_at_the_group_size_given():
    target, draft, _ = replace_removed_quant_arguments(
        "int4", "int4", {"quant_group_size": 64, "target_head_quant": "int8", "draft_head_quant": "int4"}
    )
    assert target == QuantConfig("int4", group_size=64, head="int8")
    assert draft == QuantConfig("int4", group_size=64, head="int4")


def test_draft_int8_false_asks_for_nothing_as_before():
    assert replace_removed_quant_arguments(None, None, {"draft_int8": False})[:2] == (None, None)


def test_old_and_new_arguments_that_agree_are_taken():
    target, draft, _ = replace_removed_quant_arguments(
        QuantConfig("int4", group_size=64), "int8-dynamic", {"draft_int8": True, "quant_group_size": 64}
    )
    assert target == QuantConfig("int4", group_size=64) and draft == QuantConfig("int8-dynamic", group_size=64)


@pytest.mark.parametrize(
    "target_quant, draft_quant, removed, message",
    [
        (None, "int4", {"draft_int8": True}, "draft_int8=True means draft_quant='int8-dynamic', which conflicts"),
        (
            QuantConfig("int4", group_size=32),
            None,
            {"quant_group_size": 64},
            "quant_group_size=64 conflicts with target_quant",
        ),
        (
            "int4",
            QuantConfig("int4", head="int4"),
            {"draft_head_quant": "int8"},
            "draft_head_quant='int8' conflicts with draft_quant",
        ),
        (None, None, {"target_head_quant": "int8"}, "target_head_quant='int8' needs target_quant 'int8' or 'int4'"),
        ("int4", None, {"quant_group_size": 48}, "quant_group_size must be one of 32, 64, 128"),
    ],
    ids=["draft_int8 and int4", "two group sizes", "two heads", "head without a body", "group size"],
)
def test_conflicting_or_bad_values_are_a_value_error_that_says_what_to_give(
    target_quant, draft_quant, removed, message
):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        replace_removed_quant_arguments(target_quant, draft_quant, removed)


def test_the_current_arguments_alone_warn_of_nothing(target):
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        with LLM(target, target_quant=None) as llm:
            assert llm.config.target_quant is None
