"""Bad input: a ValueError that says what to do from the API, exit 2 and no traceback from the CLI."""

import subprocess
import sys

import pytest

from engine import LLM, SamplingParams, SpeculativeConfig
from tests.engine.tiny import tiny_lm


@pytest.fixture(scope="module")
def target():
    return tiny_lm(0)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(temperature=-0.1), "temperature must be a finite number >= 0"),
        (dict(temperature=float("nan")), "temperature must be a finite number >= 0"),
        (dict(temperature=float("inf")), "temperature must be a finite number >= 0"),
        (dict(top_p=0.0), "top_p must be in (0, 1]"),
        (dict(top_p=1.5), "top_p must be in (0, 1]"),
        (dict(top_k=0), "top_k must be an integer >= 1"),
        (dict(max_new_tokens=0), "max_new_tokens must be an integer >= 1"),
        (dict(seed=-1), "seed must be a non-negative integer"),
        (dict(stop=("",)), "stop must be non-empty strings"),
        (dict(logprobs=6), "logprobs must be an integer in 0..5"),
    ],
)
def test_sampling_params_reject_bad_values(kwargs, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)").replace("]", r"\]")):
        SamplingParams(**kwargs)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(K=0), "K .* must be an integer >= 1"),
        (dict(C=0.0), "C .* must be in"),
        (dict(C=1.2), "C .* must be in"),
        (dict(K=2, fanout=(1, 2)), "fanout must list K \\+ 1 = 3"),
        (dict(K=1, fanout=(1, -1)), "non-negative"),
    ],
)
def test_speculative_config_rejects_bad_values(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SpeculativeConfig(**kwargs)


def test_empty_prompts_are_refused(target):
    llm = LLM(target)
    with pytest.raises(ValueError, match="no prompts"):
        llm.generate([])
    with pytest.raises(ValueError, match="empty prompt"):
        llm.generate([[1, 2], []])
    with pytest.raises(ValueError, match="no tokenizer"):
        llm.generate("hello")


def test_out_of_vocabulary_ids_are_refused(target):
    with pytest.raises(ValueError, match=r"token ids must be in \[0, 50\)"):
        LLM(target).generate([[1, 50]])


def test_prompt_plus_new_tokens_beyond_context_is_refused(target):
    with pytest.raises(ValueError, match="exceeds the model's context of 256"):
        LLM(target).generate([[1] * 200], SamplingParams(max_new_tokens=57))
    with pytest.raises(ValueError, match=r"\+5 speculated"):
        LLM(target, target, strategy="sd").generate([[1] * 200], SamplingParams(max_new_tokens=52))


def test_one_batch_may_mix_sampling_settings(target):
    params = [
        SamplingParams(temperature=0, max_new_tokens=2),
        SamplingParams(temperature=1.0, top_k=3, max_new_tokens=3),
    ]
    assert [len(o.token_ids) for o in LLM(target).generate([[1, 2], [3, 4]], params)] == [2, 3]


def test_draft_with_another_vocabulary_is_refused(target):
    with pytest.raises(ValueError, match="different vocabularies"):
        LLM(target, tiny_lm(1, vocab_size=60), strategy="sd")


def test_speculative_strategy_without_draft_is_refused(target):
    with pytest.raises(ValueError, match="needs a draft model"):
        LLM(target, strategy="sd")


@pytest.mark.parametrize(
    "args, message",
    [
        (["generate", "hi", "--temperature", "-1"], "temperature must be a finite number >= 0"),
        (["generate", "hi", "-K", "0"], "K (draft tokens per round) must be"),
        (["generate", "hi", "--top-p", "2"], "top_p must be in (0, 1]"),
        (["generate", "hi", "--target", "/no/such/model"], "/no/such/model"),
        (["generate", "hi", "--budget", "lots"], "--budget must be an integer or 'auto'"),
        (["generate", "hi", "--draft-int8", "--draft-quant", "int4"], "--draft-int8 means --draft-quant int8-dynamic"),
        (["generate", "hi", "--target-quant", "int4", "--device", "cuda"], "CPU kernels only"),
    ],
)
def test_cli_bad_input_exits_2_with_one_line(args, message, capsys):
    from saguaro.cli import main

    assert main(args) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_cli_process_exits_2_without_traceback():
    result = subprocess.run(
        [sys.executable, "-m", "saguaro.cli", "generate", "hi", "--strategy", "ar", "--target", "/no/such/model"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 2, result.stderr
    assert "/no/such/model" in result.stderr and "Traceback" not in result.stderr


def test_an_int8_draft_is_loaded_in_float32_whatever_the_targets_dtype():
    from engine.config import EngineConfig
    from engine.loading.recipe import draft_recipe

    config = EngineConfig(target="t", draft="d", strategy="ssd", dtype="bfloat16", draft_quant="int8-dynamic")
    assert config.draft_float_dtype == "float32" and draft_recipe(None, config).dtype == "float32"
    assert EngineConfig(target="t", draft="d", strategy="sd", dtype="bfloat16").draft_float_dtype == "bfloat16"
    # a weight-only low-bit draft: draft_dtype is then the dtype of the layers left in float
    config = EngineConfig(target="t", draft="d", strategy="sd", draft_dtype="bfloat16", draft_quant="int8")
    assert config.draft_float_dtype == "bfloat16"
    # int8-dynamic (torch.ao) keeps its other layers float32
    with pytest.raises(ValueError, match="keeps its other layers in float32"):
        EngineConfig(target="t", draft="d", strategy="sd", draft_dtype="bfloat16", draft_quant="int8-dynamic")
