"""The smaller user mistakes: a ValueError naming the thing from the API, exit 2 and one line from the CLI.

Float token ids (were truncated), bytes as a prompt (were taken as ids), a seed beyond int64 (raw
"Overflow when unpacking long long"), generate()/encode() after close() (AttributeError), text with a lone
surrogate (TypeError from the tokenizer), prompts that are not UTF-8 on argv, stdin or in a JSONL file
(a raw codec message that did not name the file).
"""

import io
import subprocess
import sys

import numpy as np
import pytest
import torch

from engine import LLM, SamplingParams
from tests.engine.test_models import tiny_tokenizer
from tests.engine.tiny import tiny_lm

ONE = SamplingParams(max_new_tokens=1, temperature=0)


@pytest.fixture(scope="module")
def llm():
    return LLM(tiny_lm(0), tokenizer=tiny_tokenizer(50), chat_template=False)


@pytest.mark.parametrize(
    "prompts",
    [[[1.7, 2.2]], [1.7, 2.2], [[1, 2.0]], [np.array([1.5, 2.5])], [[True, 2]], [[1, "2"]]],
    ids=["float ids", "one prompt of floats", "a float among ints", "numpy floats", "a bool", "a string id"],
)
def test_token_ids_that_are_not_integers_are_refused(llm, prompts):
    with pytest.raises(ValueError, match="prompt token ids must be integers, got .* at position"):
        llm.generate(prompts, ONE)


@pytest.mark.parametrize("prompts", [b"\x01\x02", [b"\x01\x02"], bytearray(b"\x01")])
def test_bytes_are_not_taken_as_token_ids(llm, prompts):
    with pytest.raises(ValueError, match=r"given as bytes: decode it to text first"):
        llm.generate(prompts, ONE)


def test_integer_ids_of_any_integer_type_still_work(llm):
    expected = llm.generate([[1, 2, 3]], ONE)[0].token_ids
    for prompt in ([np.int64(1), np.int64(2), np.int64(3)], torch.tensor([1, 2, 3]).tolist(), (1, 2, 3)):
        assert llm.generate([prompt], ONE)[0].token_ids == expected
    assert llm.generate([1, 2, 3], ONE)[0].token_ids == expected  # one prompt given bare


def test_a_prompts_argument_of_the_wrong_kind_is_refused(llm):
    with pytest.raises(ValueError, match="prompts must be a text, a list of token ids, or a list of those; got int"):
        llm.generate(5, ONE)


def test_a_lone_surrogate_in_text_is_refused_before_the_tokenizer(llm):
    text = b"caf\xff".decode("utf-8", errors="surrogateescape")  # what argv / surrogateescape give
    with pytest.raises(
        ValueError, match=r"not valid Unicode text: it holds the lone surrogate '\\udcff' at character 3"
    ):
        llm.generate(text, ONE)
    with pytest.raises(ValueError, match="lone surrogate"):
        llm.encode("ok \ud800 then")


def test_plain_text_still_goes_through_the_tokenizer(llm):
    assert llm.encode("abc") == list(llm.tokenizer("abc")["input_ids"])


@pytest.mark.parametrize("seed", [2**63, 2**70])
def test_a_seed_beyond_int64_is_refused_at_construction(seed):
    with pytest.raises(ValueError, match=r"seed must be a non-negative integer up to 2\*\*63 - 1"):
        SamplingParams(seed=seed)


def test_the_largest_seed_works_per_request(llm):
    out = llm.generate([[1, 2]], [SamplingParams(seed=2**63 - 1, max_new_tokens=2)])
    assert len(out[0].token_ids) == 2


@pytest.mark.parametrize("value", [2.5, 2.0, True, "3"])
def test_max_new_tokens_must_be_an_integer(value):
    with pytest.raises(ValueError, match="max_new_tokens must be an integer >= 1"):
        SamplingParams(max_new_tokens=value)


def test_a_closed_llm_says_so():
    llm = LLM(tiny_lm(0))
    llm.close()
    for call in (lambda: llm.generate([[1, 2]]), lambda: llm.encode([1, 2]), lambda: list(llm.stream([[1, 2]]))):
        with pytest.raises(ValueError, match="this LLM is closed: build a new one"):
            call()


# --- the CLI: exit 2, one line, before any model loads (the target below does not exist) ---------------

NO_MODEL = ["--strategy", "ar", "--target", "/no/such/model"]


def run_cli(args, capsys) -> str:
    from saguaro.cli import main

    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err


def test_cli_refuses_a_non_utf8_argument(capsys):
    arg = b"hi \xff there".decode("utf-8", errors="surrogateescape")  # how Python hands over such argv
    err = run_cli(["generate", arg, *NO_MODEL], capsys)
    assert "prompt argument 1 is not UTF-8 text (byte 0xff at offset 3)" in err


def test_cli_refuses_non_utf8_stdin(capsys, monkeypatch):
    stdin = io.TextIOWrapper(io.BytesIO(b"ok\n\xfe\xff"), encoding="utf-8")
    monkeypatch.setattr(sys, "stdin", stdin)
    err = run_cli(["generate", *NO_MODEL], capsys)
    assert "the prompt on stdin is not UTF-8 text (byte 0xfe at offset 3)" in err


def test_cli_refuses_a_non_utf8_prompts_file_naming_it(tmp_path, capsys):
    path = tmp_path / "prompts.jsonl"
    path.write_bytes(b'{"prompt": "fine"}\n{"prompt": "caf\xe9"}\n')  # latin-1, not UTF-8
    err = run_cli(["generate", "--prompts-file", str(path), *NO_MODEL], capsys)
    assert f"{path}:2 is not UTF-8 text (byte 0xe9" in err and "save the file as UTF-8" in err


def test_cli_refuses_a_lone_surrogate_escape_in_a_prompts_file(tmp_path, capsys):
    path = tmp_path / "prompts.jsonl"
    path.write_text('{"prompt": "x \\udcff y"}\n', encoding="utf-8")
    err = run_cli(["generate", "--prompts-file", str(path), *NO_MODEL], capsys)
    assert f"{path}:1: the prompt holds a lone surrogate" in err


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--seed", str(2**70)], "seed must be a non-negative integer up to 2**63 - 1"),
        (["--budget", "lots"], "--budget must be an integer or 'auto', got 'lots'"),
        (["--temperature", "inf"], "temperature must be a finite number >= 0"),
    ],
)
def test_cli_refuses_bad_flags_before_loading(flags, message, capsys):
    err = run_cli(["generate", "hi", *NO_MODEL, *flags], capsys)
    assert message in err and "/no/such/model" not in err  # refused before the model was looked up


def test_cli_process_with_non_utf8_argv_and_stdin_exits_2_without_traceback():
    cli = [sys.executable, "-m", "saguaro.cli", "generate", *NO_MODEL]
    from_argv = subprocess.run([*cli, b"caf\xe9"], capture_output=True, timeout=300)
    from_stdin = subprocess.run(cli, input=b"caf\xe9", capture_output=True, timeout=300)
    for result, where in ((from_argv, b"prompt argument 1"), (from_stdin, b"the prompt on stdin")):
        assert result.returncode == 2, result.stderr
        assert where + b" is not UTF-8 text (byte 0xe9 at offset 3)" in result.stderr
        assert b"Traceback" not in result.stderr and result.stderr.count(b"\n") == 1


def test_a_pad_token_past_the_models_vocabulary_is_not_used_for_padding(tmp_path):
    # save_tiny's tokenizer has 65 tokens (pad = 64) for a 64-row model: padding must pick an id the model has
    from engine import LLM, SamplingParams
    from tests.engine.test_models import save_tiny

    folder = save_tiny(tmp_path / "tiny", vocab_size=64)
    greedy = SamplingParams(temperature=0, max_new_tokens=4, stop_on_eos=False)
    with LLM(str(folder), dtype="float32") as llm:
        assert llm.pad_id < 64
        both = llm.generate([[1, 2, 3], [4, 5]], greedy)
        alone = [llm.generate([p], greedy)[0] for p in ([1, 2, 3], [4, 5])]
    assert [o.token_ids for o in both] == [o.token_ids for o in alone]
