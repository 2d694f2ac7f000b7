"""benchmarks/lowbit_accuracy.py's core on tiny models: a model against itself agrees fully with zero KL /
TV; its int4 copy is close but not identical; int4 g32 is further from float than int8; unknown variants refused."""

from __future__ import annotations

import copy

import pytest
import torch

from benchmarks import lowbit_accuracy as script
from engine.loading.quantize import quantize_model
from engine.loading.tiny import tiny_model

PROMPT_SETS = {"a": [[1, 2, 3, 4], [5, 6]], "b": [[7, 8, 9, 10, 11, 12]]}


@pytest.fixture(scope="module")
def result():
    reference = tiny_model(vocab_size=48, seed=0, logit_scale=4.0)
    variants = {
        "self": lambda: reference,
        "int8": lambda: quantize_model(copy.deepcopy(reference), "int8", dtype=torch.bfloat16),
        "int4-g32": lambda: quantize_model(copy.deepcopy(reference), "int4", dtype=torch.bfloat16),
        "missing": lambda: None,
    }
    return script.measure(reference, variants, PROMPT_SETS, new_tokens=12)


def test_a_model_against_itself_agrees_everywhere(result):
    for entry in result["sets"].values():
        row = entry["variants"]["self"]
        assert row["greedy_agreement"] == 1.0
        assert row["mean_kl"] == pytest.approx(0.0, abs=1e-9) and row["mean_tv"] == pytest.approx(0.0, abs=1e-9)
    entry = result["sets"]["a"]
    assert entry["continuation_tokens"] == 24 and entry["variants"]["self"]["positions"] == 24


def test_low_bit_variants_are_close_but_not_identical_and_int4_is_further(result):
    for entry in result["sets"].values():
        int8, int4 = entry["variants"]["int8"], entry["variants"]["int4-g32"]
        assert 0 < int8["mean_kl"] < int4["mean_kl"] < 0.5
        assert 0 < int8["mean_tv"] < int4["mean_tv"] < 0.5
        assert 0.5 < int4["greedy_agreement"] <= 1.0
        assert entry["variants"]["missing"] is None
    assert "| a | missing | not available |" in script.table(result)


def test_eos_ends_a_continuation_early():
    model = tiny_model(vocab_size=48, seed=0, logit_scale=4.0)
    full = script.greedy_continuation(model, [1, 2, 3], 10)
    assert len(full) == 10
    assert script.greedy_continuation(model, [1, 2, 3], 10, frozenset({full[3]})) == full[: full.index(full[3]) + 1]


def test_logprobs_come_from_one_teacher_forced_forward():
    model = tiny_model(vocab_size=48, seed=1)
    prompt, cont = [4, 5, 6], [7, 8, 9]
    lp = script.continuation_logprobs(model, prompt, cont)  # [3, V]
    step = model(torch.tensor([prompt + cont[:1]])).logits[0, -1].log_softmax(-1)  # predicts cont[1]
    assert lp.shape == (3, 48)
    torch.testing.assert_close(lp[1], step, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["int3", "int4-g48", "cache-bf16", "int8-g32"])
def test_unknown_variants_are_refused(name):
    with pytest.raises(ValueError, match="unknown variant"):
        script.parse_variant(name)


def test_cli_refuses_a_bad_variant_with_exit_status_2(tmp_path, capsys):
    assert script.main(["--variants", "int3", "--out", str(tmp_path / "x.json")]) == 2
    err = capsys.readouterr().err
    assert "unknown variant 'int3'" in err and "Traceback" not in err
