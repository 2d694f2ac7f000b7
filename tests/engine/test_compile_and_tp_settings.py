"""The settings of compiled forwards and of a tensor-parallel target: ValueErrors that say what to do, the CLI
flags that set them, and one line with exit status 1 when a rank dies under the CLI."""

import pytest

from engine.compile_config import CompileConfig
from engine.config import EngineConfig
from saguaro.cli import main
from saguaro.commands import generate


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(max_len=1), "max_len .* must be an integer >= 2"),
        (dict(batch_buckets=()), "batch_buckets must list batch sizes >= 1"),
        (dict(batch_buckets=(0, 4)), "batch_buckets must list batch sizes >= 1"),
        (dict(max_len=16, context_buckets=(32,)), "context_buckets must be widths in 2..max_len \\+ 1"),
        (dict(mode="fast"), "mode must be one of"),
    ],
)
def test_compile_config_rejects_bad_values(kwargs, message):
    with pytest.raises(ValueError, match=message):
        CompileConfig(**kwargs)


def test_the_widths_end_with_the_whole_row():
    assert CompileConfig(max_len=64).widths == (65,)
    assert CompileConfig(max_len=64, context_buckets=(32, 16)).widths == (16, 32, 65)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(tp=0), "tp .* must be an integer >= 1"),
        (dict(tp=2, compile=True), "compile and tp > 1 do not combine yet"),
        (dict(tp=2, target_quant="int8"), "tensor-parallel target shards float weights"),
        (dict(compile="yes"), "compile must be True, False, None or a CompileConfig"),
    ],
)
def test_engine_config_rejects_bad_compile_and_tp_settings(kwargs, message):
    with pytest.raises(ValueError, match=message):
        EngineConfig(target="t", **kwargs)


def test_compile_true_takes_the_default_settings():
    assert EngineConfig(target="t", compile=True).compile == CompileConfig()
    assert EngineConfig(target="t", compile=False).compile is None


def test_the_cli_flags_set_compile_max_len_and_tp(monkeypatch):
    seen = {}

    class FakeLLM:
        def __init__(self, *args, **kwargs):
            seen.update(kwargs)
            raise ValueError("stop here")

    monkeypatch.setattr("engine.LLM", FakeLLM)
    assert main(["generate", "--strategy", "ar", "--compile", "--max-len", "512", "--tp", "2", "hi"]) == 2
    assert seen["compile"] == CompileConfig(max_len=512) and seen["tp"] == 2


def test_max_len_without_compile_is_one_line_and_exit_2(capsys):
    assert main(["generate", "--strategy", "ar", "--max-len", "512", "hi"]) == 2
    err = capsys.readouterr().err.strip()
    assert "--max-len sizes the static KV cache of --compile" in err and "\n" not in err


def test_a_rank_that_dies_under_the_cli_is_one_line_and_exit_1(monkeypatch, capsys):
    from engine.tp import TPRankDied

    def dies(args):
        raise TPRankDied("tensor-parallel rank 1 of 2 (pid 7) left: it was killed by signal 9; the run cannot go on")

    monkeypatch.setattr(generate, "run", dies)
    assert main(["generate", "hi"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "rank 1 of 2" in err
