"""The CLI against the API: the same defaults, --help that shows them, one flag syntax, adaptive-K flags, and
progress lines."""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import io
import json
import logging
import re

import pytest

from saguaro.cli import HelpFormatter, build_parser, configure_logging, main, progress_shown

MINE = ("generate", "bench", "serve", "models", "report")
NO_MODEL = ["--target", "/no/such/model", "--draft", "/no/such/model"]


def subparser(name: str, parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    parser = parser or build_parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return sub.choices[name]


def dests(parser: argparse.ArgumentParser) -> dict[str, object]:
    """dest -> default of every visible option (hidden aliases left out)."""
    return {
        a.dest: a.default
        for a in parser._actions
        if a.option_strings and a.help != argparse.SUPPRESS and a.dest != "help"
    }


def scalar(value):
    """An enum's value, a one-element list's element (bench's axes), "4" as 4 (-K is text: it takes auto)."""
    value = getattr(value, "value", value)
    if isinstance(value, list) and len(value) == 1:
        value = value[0]
    if isinstance(value, str) and value.isdigit():
        value = int(value)
    return value


# -- 1. defaults agree with the API --------------------------------------------------------------------
def api_defaults() -> dict[str, tuple[str, object]]:
    """name -> (where, default) for every setting of the API a command line could offer."""
    from engine import LLM, SamplingParams
    from engine.config import DraftPlacement, QuantConfig, SpeculativeConfig

    out: dict[str, tuple[str, object]] = {}
    for cls in (SamplingParams, SpeculativeConfig, DraftPlacement, QuantConfig):
        for f in dataclasses.fields(cls):
            if f.default is not dataclasses.MISSING:
                out[f.name] = (cls.__name__, f.default)
            elif f.default_factory is not dataclasses.MISSING:
                out[f.name] = (cls.__name__, f.default_factory())
    for name, p in inspect.signature(LLM.__init__).parameters.items():
        if p.default is not inspect.Parameter.empty:
            out[name] = ("LLM", p.default)
    return out


# CLI dest of an API setting, where the names differ; "not:" = the flag says the opposite of the setting
RENAMED = {
    "stop_on_eos": "not:ignore_eos",
    "chat_template": "not:no_chat_template",
    "cache_dir": "cache",
    "external": "external_draft",
    "stop_token_ids": "stop_token_id",
    "K": "Ks",
    "C": "C",
    "backup": "backup",
    "schedule": "schedule",
    "budget": "budget",
    "batch": "batch_size",
    "group_size": "quant_group_size",
}
# API settings a command has no flag for, or sets on purpose to something else: the reason
NOT_FLAGS = {
    "strategy": "LLM picks SD when a draft is given; the CLI always has a draft, and says sd",
    "speculative": "a SpeculativeConfig: its fields are compared one by one",
    "placement": "a DraftPlacement: its fields are compared one by one",
    "tokenizer": "an object, not a flag",
    "draft": "LLM's draft is optional (None = AR); the CLI names the default pair's draft (--strategy ar drops it)",
    "adaptive": "set by -K auto",
    "deadline_s": "test/ops tuning of the SSD link, not a flag",
    "start_deadline_s": "test/ops tuning of the SSD link, not a flag",
    "faults": "fault injection for tests",
    "in_process": "tests only",
}
ON_PURPOSE = {  # (command, API name): why the command's default differs from the API's
    ("serve", "max_num_seqs"): "a server needs a bound on its batch (the API default None = all prompts at once)",
    ("serve", "max_prefill_tokens"): "a server bounds the prompt tokens prefilled per step",
    ("serve", "max_waiting"): "a server answers 503 past a bounded queue",
    ("bench", "seed"): "a bench is reproducible: seed + call index, never a fresh random seed",
    ("bench", "K"): "unset: auto where sd or ssd runs (engine.config.COMMAND_LINE_DEFAULTS), else 4",
    ("bench", "schedule"): "unset: SSD's command-line default (geometric)",
    ("generate", "K"): "unset: the strategy's command-line default (engine.config.COMMAND_LINE_DEFAULTS)",
    ("generate", "schedule"): "unset: the strategy's command-line default (geometric for ssd)",
    ("serve", "K"): "unset: the strategy's command-line default (engine.config.COMMAND_LINE_DEFAULTS)",
    ("serve", "schedule"): "unset: the strategy's command-line default (geometric for ssd)",
    ("bench", "max_num_seqs"): "bench's --batch is the prompts per generate call, the whole call is one batch",
}


@pytest.mark.parametrize("command", ["generate", "serve", "bench"])
def test_every_shared_setting_has_the_api_default(command):
    from saguaro.commands.generate import parse_K

    cli = dests(subparser(command))
    compared = []
    for name, (where, api) in api_defaults().items():
        if name in NOT_FLAGS:
            continue
        dest = RENAMED.get(name, name)
        invert = dest.startswith("not:")
        dest = dest.removeprefix("not:")
        if dest not in cli and name in cli:
            dest = name
        if dest not in cli:
            continue  # the command has no such flag (serve: sampling comes with each request)
        if (command, name) in ON_PURPOSE:
            assert scalar(cli[dest]) != scalar(api), f"{command} --{dest} now agrees: drop it from ON_PURPOSE"
            continue
        value = scalar(cli[dest])
        if name == "K":
            value = parse_K(value)
        if invert:
            value = not value
        if isinstance(api, tuple) and value == []:
            value = ()
        assert value == scalar(api), f"saguaro {command}: --{dest} defaults to {value!r}, {where}.{name} to {api!r}"
        compared.append(name)
    # the settings every one of these commands shares with the API
    # (K, budget and schedule: the strategy's command-line defaults, tested below)
    assert {
        "dtype",
        "C",
        "K_min",
        "draft_cost",
        "confidence_stop",
        "draft_dtype",
        "draft_quant",
        "group_size",
        "threads",
    } <= set(compared)
    if command in ("generate", "bench"):
        assert {"temperature", "max_new_tokens"} <= set(compared)
    if command == "generate":
        assert {
            "top_k",
            "top_p",
            "seed",
            "stop",
            "stop_token_ids",
            "logprobs",
            "stop_on_eos",
            "device",
            "max_num_seqs",
            "chat_template",
            "draft_threads",
            "init_method",
            "external",
        } <= set(compared)


@pytest.mark.parametrize("command", ["generate", "serve"])
@pytest.mark.parametrize("strategy", ["ar", "sd", "ssd"])
def test_no_speculation_flag_runs_the_strategys_command_line_defaults(command, strategy):
    from engine.config import COMMAND_LINE_DEFAULTS, DraftPlacement, FanoutSchedule, Strategy
    from saguaro.commands.generate import speculative_config

    args = subparser(command).parse_args(["--strategy", strategy] + (["hi"] if command == "generate" else []))
    spec = speculative_config(args, DraftPlacement())
    expected = COMMAND_LINE_DEFAULTS.get(Strategy(strategy), {})
    assert spec.adaptive == (expected.get("K") == "auto")
    assert spec.budget == expected.get("budget") and spec.schedule is expected.get("schedule", FanoutSchedule.UNIFORM)


def test_a_given_flag_keeps_its_value_and_the_rest_their_defaults():
    from engine.config import DraftPlacement, FanoutSchedule
    from saguaro.commands.generate import speculative_config

    spec = speculative_config(
        subparser("generate").parse_args(["--strategy", "ssd", "-K", "3", "hi"]), DraftPlacement()
    )
    assert (spec.K, spec.adaptive, spec.budget, spec.schedule) == (3, False, "auto", FanoutSchedule.GEOMETRIC)
    given = speculative_config(
        subparser("generate").parse_args(["hi", "--strategy", "ssd", "-K", "2", "--fanout", "2", "1", "1"]),
        DraftPlacement(),
    )
    assert given.fanout == (2, 1, 1) and given.budget is None and given.schedule is FanoutSchedule.UNIFORM


def test_bench_runs_the_command_line_defaults_without_sweep_flags():
    from saguaro.commands.bench import sweep_defaults

    parser = subparser("bench")
    assert sweep_defaults(parser.parse_args(["--systems", "ar", "sd", "ssd"])) == (["auto"], ["auto"], ["geometric"])
    assert sweep_defaults(parser.parse_args(["--systems", "ar"]))[0] == [4]
    assert sweep_defaults(parser.parse_args(["--systems", "ssd", "--fanout", "3", "2", "1"]))[0] == [2]


def test_the_server_samples_with_the_api_default_temperature():
    # serve has no --temperature: a request without one gets SamplingParams' default, as OpenAI's API does
    from engine import SamplingParams
    from server.protocol import CompletionRequest
    from server.translate import sampling_params

    request = CompletionRequest(model="m", prompt="hi")
    assert sampling_params(request, 8, None).temperature == SamplingParams().temperature == 1.0


def test_bench_mirrors_the_engine_limit_of_adaptive_K():
    from engine.config import AUTO_K_MAX
    from saguaro.bench import config
    from saguaro.commands import generate

    assert config.AUTO_K_MAX == generate.AUTO_K_MAX == AUTO_K_MAX


# -- 2. --help shows every default ---------------------------------------------------------------------
def parsers_of_mine():
    parser = build_parser()
    yield "saguaro", parser
    for name in MINE:
        p = subparser(name, parser)
        yield name, p
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub_name, sub in action.choices.items():
                    yield f"{name} {sub_name}", sub


def shown(default) -> str:
    return " ".join(map(str, default)) if isinstance(default, (list, tuple)) else str(default)


@pytest.mark.parametrize("name, parser", list(parsers_of_mine()), ids=lambda x: x if isinstance(x, str) else "")
def test_help_shows_every_default(name, parser):
    assert parser.formatter_class is HelpFormatter, f"saguaro {name} does not use HelpFormatter"
    checked = 0
    for action in parser._actions:
        default = action.default
        if (
            not action.option_strings
            or action.help == argparse.SUPPRESS
            or default in (None, False, [])
            or default is argparse.SUPPRESS
        ):
            continue
        formatter = parser._get_formatter()
        formatter.add_argument(action)
        text = re.sub(r"\s+", "", formatter.format_help())
        assert "default:" + re.sub(r"\s+", "", shown(default)) in text, (name, action.option_strings, text)
        checked += 1
    if name in ("generate", "bench", "serve"):
        assert checked >= 10


def test_help_keeps_the_description_line_breaks():
    text = subparser("bench").format_help()
    assert "\nClient mode: `--url" in text


# -- 3. one flag syntax --------------------------------------------------------------------------------
@pytest.mark.parametrize("command", ["generate", "serve", "bench"])
def test_K_and_batch_are_spelt_alike_everywhere(command):
    p = subparser(command)
    visible = {s for a in p._actions if a.help != argparse.SUPPRESS for s in a.option_strings}
    assert {"-K", "--K-min", "--draft-cost", "--confidence-stop", "--batch"} <= visible
    assert not visible & {"--K", "--lookahead", "--batch-size", "--max-num-seqs"}  # hidden aliases


def test_old_spellings_still_work():
    p = build_parser()
    args = p.parse_args(["generate", "hi", "--lookahead", "3", "--max-num-seqs", "2"])
    assert (args.K, args.max_num_seqs) == ("3", 2)
    args = p.parse_args(["generate", "hi", "-K", "3", "--batch", "2"])
    assert (args.K, args.max_num_seqs) == ("3", 2)
    args = p.parse_args(["serve", "--max-num-seqs", "3"])
    assert args.max_num_seqs == 3 and p.parse_args(["serve"]).max_num_seqs == 8
    new = p.parse_args(["bench", "-K", "2", "--batch", "1", "4", "--fanout", "4", "3", "2"])
    old = p.parse_args(["bench", "--K", "2", "--batch-size", "1", "4", "--fanout", "4,3,2"])
    assert new.Ks == old.Ks == [2] and new.batch_size == old.batch_size == [1, 4]
    assert p.parse_args(["bench", "--lookahead", "2", "3"]).Ks == [2, 3]
    from saguaro.commands.bench import config_from

    assert config_from(new).fanout == config_from(old).fanout == (4, 3, 2)


@pytest.mark.parametrize("command", MINE)
def test_lists_take_space_separated_values(command):
    # every option that takes several values takes them as `--flag a b c`; --stop is the one repeated flag,
    # so that a prompt after it is not read as a stop text
    for action in subparser(command)._actions:
        if type(action) is argparse._AppendAction:
            assert action.option_strings == ["--stop"], action.option_strings
        if action.option_strings and action.nargs not in (None, 0, "?"):
            assert action.nargs == "+", (action.option_strings, action.nargs)


# -- 4. adaptive speculation flags -----------------------------------------------------------------------
def test_adaptive_flags_reach_the_speculative_config():
    from engine.config import DraftPlacement
    from saguaro.commands.generate import speculative_config

    p = build_parser()
    args = p.parse_args(
        ["generate", "hi", "-K", "auto", "--K-min", "2", "--draft-cost", "0.25", "--confidence-stop", "0.4"]
    )
    spec = speculative_config(args, DraftPlacement())
    assert (spec.adaptive, spec.K, spec.K_min, spec.draft_cost, spec.confidence_stop) == (True, 8, 2, 0.25, 0.4)
    fixed = speculative_config(p.parse_args(["serve", "-K", "5"]), DraftPlacement())
    assert (fixed.adaptive, fixed.K, fixed.confidence_stop) == (False, 5, None)


@pytest.mark.parametrize("command", ["generate", "serve"])
@pytest.mark.parametrize(
    "flags, message",
    [
        (["-K", "lots"], "-K must be a whole number of draft tokens per round (>= 1) or auto"),
        (["-K", "0"], "K (draft tokens per round) must be"),
        (["-K", "auto", "--strategy", "ar"], "-K auto (adaptive K) is implemented for --strategy sd and ssd only"),
        (["--confidence-stop", "0.5", "--strategy", "ssd"], "--confidence-stop is implemented for --strategy sd"),
        (["-K", "4", "--K-min", "2"], "add -K auto"),  # without -K the default is auto (sd, ssd): --K-min applies
        (["-K", "4", "--draft-cost", "0.5"], "add -K auto"),
        (["-K", "auto", "--K-min", "9"], "--K-min must be in 1..8"),
        (["-K", "auto", "--draft-cost", "-1"], "draft_cost (T_d / T_v) must be >= 0"),
        (["--confidence-stop", "0"], "confidence_stop must be a probability in (0, 1]"),
    ],
)
def test_bad_adaptive_values_exit_2_with_one_line_before_loading(command, flags, message, capsys):
    argv = [command, *NO_MODEL, *flags] + (["hi"] if command == "generate" else ["--port", "0"])
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "/no/such/model" not in err, err


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    from tests.engine.test_models import save_tiny

    folder = tmp_path_factory.mktemp("tiny")
    save_tiny(folder / "model", vocab_size=64)
    # one prompt: a batch of two token-id prompts of unequal length fails in the engine's prefill on this
    # tiny model (IndexError; reported, engine/ is not this test's to fix)
    (folder / "prompts.jsonl").write_text('{"ids": [1, 2, 3]}\n')
    return folder


def generate(tiny_folder, capsys, *flags, top: tuple[str, ...] = ()) -> tuple[dict, str]:
    """`saguaro [top] generate ... --json [flags]` on the tiny model (as target and draft): (JSON, stderr)."""
    model = str(tiny_folder / "model")
    argv = [
        *top,
        "generate",
        "--target",
        model,
        "--draft",
        model,
        "--dtype",
        "float32",
        "--json",
        "--prompts-file",
        str(tiny_folder / "prompts.jsonl"),
        "--max-new-tokens",
        "12",
        "--ignore-eos",
        "--seed",
        "3",
        *flags,
    ]
    assert main(argv) == 0
    out = capsys.readouterr()
    return json.loads(out.out), out.err


def test_generate_K_auto_gives_ar_s_greedy_tokens(tiny_folder, capsys, tmp_path):
    ar, _ = generate(tiny_folder, capsys, "--strategy", "ar", "--temperature", "0")
    rounds = tmp_path / "rounds.jsonl"
    auto, _ = generate(
        tiny_folder,
        capsys,
        "--strategy",
        "sd",
        "-K",
        "auto",
        "--K-min",
        "2",
        "--draft-cost",
        "0.1",
        "--temperature",
        "0",
        "--rounds-out",
        str(rounds),
    )
    assert [o["token_ids"] for o in auto["outputs"]] == [o["token_ids"] for o in ar["outputs"]]
    decode = [json.loads(line) for line in rounds.read_text().splitlines()]
    decode = [r for r in decode if r.get("phase", "decode") == "decode"]
    assert decode and all(1 <= r["K"] <= 8 for r in decode)


# -- 5. progress lines ---------------------------------------------------------------------------------
class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_shows_on_a_terminal_or_with_v_and_never_with_q():
    assert progress_shown(False, False, Tty()) and progress_shown(True, False, io.StringIO())
    assert not progress_shown(False, False, io.StringIO()) and not progress_shown(False, True, Tty())
    assert not progress_shown(True, True, Tty())  # -q wins


def test_v_and_q_are_taken_before_or_after_the_command():
    p = build_parser()
    assert p.parse_args(["-v", "report", "x"]).verbose and p.parse_args(["report", "x", "-v"]).verbose
    assert p.parse_args(["bench", "-q"]).quiet and not hasattr(p.parse_args(["bench"]), "verbose")


def test_configure_logging_shows_info_of_saguaro_and_engine_only_when_asked(capsys):
    try:
        configure_logging(verbose=True)
        logging.getLogger("engine.models").info("loading x ...")
        logging.getLogger("transformers.x").info("noise")
        err = capsys.readouterr().err
        assert "loading x ..." in err and "noise" not in err
        configure_logging(quiet=True)
        logging.getLogger("engine.models").info("hidden")
        logging.getLogger("engine.models").warning("shown")
        err = capsys.readouterr().err
        assert "hidden" not in err and "warning: shown" in err
    finally:
        configure_logging(quiet=True)


def test_generate_logs_loading_and_the_ssd_worker_start_with_v(tiny_folder, capsys):
    try:
        out, err = generate(tiny_folder, capsys, "--strategy", "ssd", "-K", "2", "--temperature", "0", top=("-v",))
    finally:
        configure_logging(quiet=True)
    assert len(out["outputs"]) == 1
    lines = err.splitlines()
    assert any(
        re.search(r"loading .*model \(float32\) and draft .* \(float32\) in the SSD draft worker \.\.\.$", x)
        for x in lines
    ), err
    assert any(re.search(r"\.\.\. loaded in \d+\.\d s$", x) for x in lines), err
    assert any(re.search(r"starting the draft worker \(pid \d+\) on cpu \.\.\.$", x) for x in lines), err
    assert any(re.search(r"draft worker ready in \d+\.\d s$", x) for x in lines), err


def test_generate_prints_no_progress_when_stderr_is_not_a_terminal(tiny_folder, capsys):
    _, err = generate(tiny_folder, capsys, "--strategy", "sd", "-K", "2")
    # (transformers' own "Loading weights" bars are not ours to silence)
    assert "loading " not in err and "loaded in" not in err


def test_bench_logs_one_line_per_call(tiny_models, tmp_path, caplog, monkeypatch):
    from saguaro.bench import start
    from tests.saguaro.bench.test_bench import config

    # a busy test machine would add "marked disturbed" warnings (saguaro/bench/others.py): not what is tested here
    monkeypatch.setattr("saguaro.bench.runner.disturbed_reason", lambda share: None)

    bench = start(config(systems=("ar", "sd"), n_prompts=2), tmp_path, "lines", tiny_models)
    with caplog.at_level(logging.INFO, logger="saguaro.bench.runner"):
        bench.run(progress=True)
    lines = [r.getMessage() for r in caplog.records if r.name == "saguaro.bench.runner"]
    calls = [x for x in lines if x.startswith("[")]
    assert len(calls) == 4 and calls[0].startswith("[1/4] ar T=0 b=1, batch 0: prompt tiny/1 (")
    assert calls[-1].startswith("[4/4] sd K=2 T=0 b=1, batch 1: prompt tiny/2 (") and "s left) ..." in calls[-1]
    assert any(x.startswith("warming up sd K=2 T=0 b=1") for x in lines)
    caplog.clear()
    quiet = start(config(systems=("ar",), n_prompts=1), tmp_path, "quiet", tiny_models)
    with caplog.at_level(logging.INFO, logger="saguaro.bench.runner"):
        quiet.run(progress=False)
    assert not [r for r in caplog.records if r.name == "saguaro.bench.runner" and r.levelno >= logging.INFO]


def test_bench_K_auto_runs_adaptive_sd_and_ssd(tiny_models, tmp_path):
    # -K auto is one more K value: SD and SSD variants with adaptive K.
    # It runs exactly (AR's greedy tokens) where saguaro/bench/systems.py passes Settings.speculative_kwargs();
    # never silently as a fixed K = 8.
    from saguaro.bench import start
    from tests.saguaro.bench.test_bench import config, results

    cfg = config(systems=("ar", "sd", "ssd"), Ks=(2, "auto"), K_min=2, draft_cost=0.1)
    variants, skipped = cfg.grid()
    keys = [v.key for v in variants]
    assert "sd K=auto K_min=2 cost=0.1 T=0 b=1" in keys and any(k.startswith("ssd K=auto") for k in keys)
    assert skipped == []
    bench = start(cfg, tmp_path, "auto", tiny_models)
    outcome = bench.run(progress=False)
    reasons = {u["key"]: u["reason"] for u in outcome.unavailable}
    auto = "sd K=auto K_min=2 cost=0.1 T=0 b=1"
    assert auto not in reasons
    got = results(bench.run_dir)
    ar = {p: r["token_ids"] for (k, p), r in got.items() if k == "ar T=0 b=1"}
    assert {p: r["token_ids"] for (k, p), r in got.items() if k == auto} == ar
    ssd_auto = next(k for k in keys if k.startswith("ssd K=auto"))
    assert ssd_auto not in reasons
    assert {p: r["token_ids"] for (k, p), r in got.items() if k == ssd_auto} == ar
