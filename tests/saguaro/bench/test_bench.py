"""`saguaro bench` end to end on tiny in-memory models: run folder, peers, crashes, resume."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from saguaro.bench import Bench, BenchConfig, resume, start
from saguaro.bench.runfolder import RESULTS, ROUNDS
from saguaro.cli import main
from tests.saguaro.conftest import TOKEN_PROMPTS

SYSTEMS = ("ar", "sd", "ssd", "hf", "hf-assisted")


def config(**overrides) -> BenchConfig:
    base = dict(
        target="tiny-target",
        draft="tiny-draft",
        prompts=str(TOKEN_PROMPTS),
        n_prompts=4,
        max_new_tokens=8,
        stop_on_eos=False,
        systems=("ar", "sd"),
        Ks=(2,),
        dtype="float32",
        threads=1,
        warmup=1,
        warmup_tokens=2,
    )
    return BenchConfig(**{**base, **overrides})


def results(run_dir) -> dict[tuple[str, str], dict]:
    return {(r["key"], r["prompt_id"]): r for r in run_dir.results()}


@pytest.fixture(scope="module")
def greedy_run(tiny_models, tmp_path_factory):
    bench = start(config(systems=SYSTEMS, batch_sizes=(1, 2)), tmp_path_factory.mktemp("runs"), "greedy", tiny_models)
    return bench, bench.run(progress=False)


def test_run_folder_holds_config_environment_results_rounds_and_summary(greedy_run):
    bench, _ = greedy_run
    names = {p.name for p in bench.run_dir.path.iterdir()}
    assert {"config.json", "environment.json", "prompts.jsonl", RESULTS, ROUNDS, "summary.json", "summary.md"} <= names
    env = json.loads((bench.run_dir.path / "environment.json").read_text())
    assert env["packages"]["torch"] and env["machine"]["torch_threads"] == 1 and "commit" in env["git"]
    assert json.loads((bench.run_dir.path / "config.json").read_text())["systems"] == list(SYSTEMS)


def test_every_available_variant_answers_every_prompt(greedy_run):
    bench, outcome = greedy_run
    variants, _ = bench.config.grid()
    blocked = {u["key"] for u in outcome.unavailable}
    expected = {(v.key, p.id) for v in variants if v.key not in blocked for p in bench.prompts}
    assert set(results(bench.run_dir)) == expected and outcome.errors == 0


def test_greedy_output_is_the_same_for_every_system(greedy_run):
    # fp32 tiny models at temperature 0: AR, SD, transformers' generate and assisted generation agree exactly
    bench, _ = greedy_run
    by_prompt: dict[str, set] = {}
    for (_, prompt), r in results(bench.run_dir).items():
        by_prompt.setdefault(prompt, set()).add(tuple(r["token_ids"]))
    assert all(len(outputs) == 1 for outputs in by_prompt.values())


def test_rounds_are_tagged_with_their_variant_and_call(greedy_run):
    bench, _ = greedy_run
    rounds = bench.run_dir.rounds()
    keys = {r["key"] for r in rounds}
    assert keys == {k for k, _ in results(bench.run_dir) if k.split()[0] in ("ar", "sd", "ssd")}
    assert all({"batch_index", "prompt_ids", "verify_ms", "accepted"} <= set(r) for r in rounds)


def test_unavailable_strategy_and_batched_assisted_generation_are_reported_not_run(greedy_run):
    _, outcome = greedy_run
    reasons = {u["key"]: u["reason"] for u in outcome.unavailable}
    assert "hf-assisted K=2 T=0 b=2" in reasons and "batch size 1 only" in reasons["hf-assisted K=2 T=0 b=2"]
    ssd = [k for k in reasons if k.startswith("ssd")]
    if ssd:  # until the engine offers SSD, its variants say why they did not run
        assert "ssd" in reasons[ssd[0]]
    assert outcome.summary["unavailable"] == outcome.unavailable


def test_a_crashing_prompt_is_recorded_with_its_error(tiny_models, tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(TOKEN_PROMPTS.read_text() + '{"id": "bad", "category": "alpha", "ids": [1, 999]}\n')
    bench = start(config(prompts=str(prompts), n_prompts=5, systems=("ar", "hf")), tmp_path, "crash", tiny_models)
    outcome = bench.run(progress=False)
    failed = [r for r in bench.run_dir.results() if r.get("error")]
    assert {r["key"] for r in failed} == {"ar T=0 b=1", "hf T=0 b=1"} and {r["prompt_id"] for r in failed} == {"bad"}
    assert "token ids must be in [0, 50)" in failed[0]["error"] and failed[0]["traceback"]
    assert outcome.errors == 2 and len(outcome.summary["errors"]) == 2
    assert len(bench.run_dir.results()) == 2 * 5  # the other prompts ran as usual


class Interrupt(KeyboardInterrupt):
    pass


def _interrupt_after(n: int):
    def on_unit(done: int) -> None:
        if done == n:
            raise Interrupt

    return on_unit


def test_a_resumed_run_gives_the_same_result_as_an_uninterrupted_one(tiny_models, tmp_path):
    cfg = config(systems=("ar", "sd", "hf"), temperatures=(0.8,), batch_sizes=(1, 2))
    whole = start(cfg, tmp_path / "a", "whole", tiny_models)
    whole.run(progress=False)

    broken = start(cfg, tmp_path / "b", "broken", tiny_models)
    with pytest.raises(Interrupt):
        broken.run(progress=False, on_unit=_interrupt_after(5))
    assert len({(r["key"], r["batch_index"]) for r in broken.run_dir.results()}) == 5
    # a torn write: half a result line and the rounds of a call whose results never landed
    with (broken.run_dir.path / RESULTS).open("a") as f:
        f.write('{"key": "sd K=2 T=0.8 b=1", "batch_')
    with (broken.run_dir.path / ROUNDS).open("a") as f:
        f.write(json.dumps({"key": "sd K=2 T=0.8 b=1", "batch_index": 3, "round": 0}) + "\n")

    resumed = resume(broken.run_dir.path, tiny_models)
    outcome = resumed.run(progress=False)
    assert outcome.skipped == 5 and outcome.ran == len(resumed.units(cfg.grid()[0])) - 5

    def comparable(run_dir):
        return {k: (r["token_ids"], r.get("accepted_hist"), r["new_tokens"]) for k, r in results(run_dir).items()}

    assert comparable(resumed.run_dir) == comparable(whole.run_dir)
    assert len(resumed.run_dir.results()) == len(whole.run_dir.results())
    units = lambda d: sorted({(r["key"], r["batch_index"], r["round"]) for r in d.rounds()})  # noqa: E731
    assert units(resumed.run_dir) == units(whole.run_dir)
    env = json.loads((resumed.run_dir.path / "environment.json").read_text())
    assert len(env["resumed"]) == 1


def test_grouped_order_runs_variant_by_variant_with_the_same_draws(tiny_models, tmp_path):
    cfg = config(systems=("ar", "sd"), Ks=(2, 3), temperatures=(0.8,), batch_sizes=(1, 2))
    interleaved = start(cfg, tmp_path / "i", "interleaved", tiny_models)
    grouped = start(BenchConfig(**{**cfg.to_dict(), "order": "grouped"}), tmp_path / "g", "grouped", tiny_models)
    order = [(v.key, i) for v, i, _ in grouped.units(cfg.grid()[0])]
    assert order[:6] == [
        ("ar T=0.8 b=1", 0),
        ("ar T=0.8 b=1", 1),
        ("ar T=0.8 b=1", 2),
        ("ar T=0.8 b=1", 3),
        ("ar T=0.8 b=2", 0),
        ("ar T=0.8 b=2", 1),
    ]
    assert [(v.key, i) for v, i, _ in interleaved.units(cfg.grid()[0])][:2] == [
        ("ar T=0.8 b=1", 0),
        ("ar T=0.8 b=2", 0),
    ]
    interleaved.run(progress=False)
    grouped.run(progress=False)
    tokens = lambda d: {k: r["token_ids"] for k, r in results(d).items()}  # noqa: E731
    assert tokens(grouped.run_dir) == tokens(interleaved.run_dir)


def test_resuming_a_finished_run_runs_nothing(tiny_models, tmp_path):
    bench = start(config(systems=("ar",), n_prompts=2), tmp_path, "done", tiny_models)
    bench.run(progress=False)
    again = resume(bench.run_dir.path, tiny_models).run(progress=False)
    assert again.ran == 0 and again.skipped == 2


def test_bench_uses_the_saved_prompts_when_resuming(tiny_models, tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(TOKEN_PROMPTS.read_text())
    bench = start(config(prompts=str(prompts), systems=("ar",), n_prompts=2), tmp_path, "saved", tiny_models)
    prompts.unlink()
    assert [p.id for p in Bench(bench.config, bench.run_dir, tiny_models).prompts] == ["tiny/1", "tiny/2"]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["-K", "0"], "K (-K) must be integers >= 1"),
        (["--K", "0"], "K (-K) must be integers >= 1"),  # the old spelling still works
        (["-K", "auto", "--systems", "ar"], "implemented for sd and ssd only"),
        (
            ["--target-head-quant", "int8", "--systems", "ar"],
            "--target-head-quant takes int8 or int4 and needs --target-quant",
        ),
        (["-K", "4", "--K-min", "2", "--systems", "sd"], "add auto to -K"),
        (["-K", "auto", "--K-min", "9", "--systems", "sd"], "--K-min must be a whole number in 1..8"),
        (["-K", "auto", "--draft-cost", "-1", "--systems", "sd"], "--draft-cost (T_d / T_v) must be >= 0"),
        (["--confidence-stop", "1.5", "--systems", "sd"], "--confidence-stop must be a probability in (0, 1]"),
        (["--C", "1.5"], "C (Saguaro constant) must be in (0, 1]"),
        (["--fanout", "3,3", "--K", "4"], "explicit --fanout needs one K and K+1"),
        (["--fanout", "3", "3", "-K", "4"], "explicit --fanout needs one K and K+1"),
        (["--prompts", "no-such-set"], "unknown prompt set"),
        (["--resume", "/no/such/run"], "not a bench run folder"),
        (["--systems", "sd", "ssd", "-K", "3", "--only", "ssd K=5"], "--only 'ssd K=5' matches no variant"),
    ],
)
def test_bad_input_exits_2_with_what_to_do(argv, message, tmp_path, capsys):
    assert main(["bench", "--out", str(tmp_path), *argv]) == 2
    assert message in capsys.readouterr().err


def test_budget_auto_runs_ssd_sized_by_the_engine(tiny_models, tmp_path):
    # --budget auto next to a fixed budget: two SSD variants, labelled apart, each with AR's greedy tokens
    cfg = config(systems=("ar", "ssd"), budgets=(3, "auto"), schedules=("uniform",))
    variants, _ = cfg.grid()
    labels = sorted(v.settings.label() for v in variants if v.system == "ssd")
    assert labels == ["K=2 B=3 uniform neural T=0 b=1", "K=2 B=auto uniform neural T=0 b=1"]
    bench = start(cfg, tmp_path, "auto", tiny_models)
    outcome = bench.run(progress=False)
    assert outcome.errors == 0 and not outcome.unavailable
    by_prompt: dict[str, set] = {}
    for (_, prompt), r in results(bench.run_dir).items():
        by_prompt.setdefault(prompt, set()).add(tuple(r["token_ids"]))
    assert len(by_prompt) == 4 and all(len(outputs) == 1 for outputs in by_prompt.values())
    auto_rounds = [r for r in bench.run_dir.rounds() if "B=auto" in r["key"] and r.get("phase") == "decode"]
    assert auto_rounds and all(r["fanout"] for r in auto_rounds)  # each round says the schedule it used


def test_a_budget_that_is_neither_a_number_nor_auto_exits_2(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["bench", "--budget", "lots", "--systems", "ssd"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "whole number of guesses or 'auto'" in err and "Traceback" not in err


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(target_quant="int3"), "target_quant must be int8, int4 or unset"),
        (dict(target_quant="int8-dynamic"), "target_quant must be int8, int4 or unset"),
        (dict(draft_int8=True, draft_quant="int4"), "--draft-int8 means --draft-quant int8-dynamic"),
        (dict(quant_group_size=48), "--quant-group-size must be 32, 64 or 128"),
    ],
)
def test_low_bit_settings_are_checked(overrides, message):
    with pytest.raises(ValueError, match=message):
        config(**overrides)


def test_bench_command_line_takes_low_bit_settings():
    import argparse

    from saguaro.commands import bench as command

    parser = argparse.ArgumentParser()
    command.add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["bench", "--target-quant", "int4", "--draft-quant", "int8", "--quant-group-size", "64"])
    cfg = command.config_from(args)
    assert (cfg.target_quant, cfg.draft_quant, cfg.quant_group_size) == ("int4", "int8", 64)


def test_interleaved_ssd_engines_that_would_not_fit_are_refused_before_they_run(tiny_models, tmp_path, monkeypatch):
    """After the first SSD engine is built, the ones still to build (each as costly) must fit in what is left;
    else the run stops with a ValueError that names --order grouped, instead of the kernel killing it."""
    from saguaro.bench.runner import MEMORY_MARGIN

    gib = 1 << 30
    readings = iter([8 * gib, 5 * gib])  # before and after building the first: it took 3 GiB, 5 are left
    monkeypatch.setattr(Bench, "available_memory", staticmethod(lambda: next(readings)))
    bench = start(config(systems=("ssd",), Ks=(2, 3)), tmp_path, "memory", tiny_models)
    with pytest.raises(ValueError, match="--order grouped"):
        bench.run(progress=False)
    assert 1.5 * 3 * gib + MEMORY_MARGIN > 5 * gib  # the one left needs 5.5 GiB: the refusal was due


def test_interleaved_ssd_engines_that_fit_run(tiny_models, tmp_path, monkeypatch):
    gib = 1 << 30
    monkeypatch.setattr(Bench, "available_memory", staticmethod(lambda: 20 * gib))  # building costs nothing seen
    bench = start(config(systems=("ssd",), Ks=(2, 3), n_prompts=1), tmp_path, "fits", tiny_models)
    outcome = bench.run(progress=False)
    assert outcome.ran == 2 and not outcome.errors


def test_only_keeps_the_variants_a_pattern_picks_word_by_word():
    cfg = config(systems=("ar", "sd", "ssd"), Ks=(3, "auto"), budgets=(8, "auto"), schedules=("uniform", "geometric"))
    every = [v.key for v in cfg.grid()[0]]
    assert len(every) == 1 + 2 + 8
    picked = [v.key for v in replace(cfg, only=("sd", "ssd K=3 B=8 uniform", "ssd K=auto B=auto geometric")).grid()[0]]
    # "sd" is a word of SD's keys only; a pattern's words may come in any place of the key
    assert picked == [
        k
        for k in every
        if k.startswith("sd ") or k.startswith("ssd K=3 B=8 uniform ") or k.startswith("ssd K=auto B=auto geometric ")
    ]
    assert len(picked) == 4
    assert [v.key for v in replace(cfg, only=("ar",)).grid()[0]] == ["ar T=0 b=1"]


def test_only_is_saved_with_the_run_and_a_resumed_run_keeps_it(tiny_models, tmp_path):
    cfg = config(systems=("ar", "sd"), Ks=(2, 3), n_prompts=1, only=("sd K=3",))
    bench = start(cfg, tmp_path, "only", tiny_models)
    assert bench.run(progress=False).ran == 1
    assert {key for key, _ in results(bench.run_dir)} == {"sd K=3 T=0 b=1"}
    again = resume(bench.run_dir.path, tiny_models)
    assert again.config.only == ("sd K=3",) and again.run(progress=False).ran == 0


def test_the_command_line_passes_only_to_the_config():
    import argparse

    from saguaro.commands import bench as command

    parser = argparse.ArgumentParser()
    command.add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["bench", "--systems", "ssd", "-K", "3", "auto", "--only", "ssd K=3", "ssd K=auto"])
    assert command.config_from(args).only == ("ssd K=3", "ssd K=auto")
