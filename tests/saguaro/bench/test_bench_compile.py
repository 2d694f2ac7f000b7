"""`saguaro bench --compile off on`: this engine's systems run eagerly and compiled in one interleaved run,
labelled apart, with the same greedy tokens; the peers run once."""

from __future__ import annotations

import argparse

from saguaro.bench import start
from tests.saguaro.bench.test_bench import config


def test_compile_off_on_runs_each_engine_variant_both_ways_with_the_same_tokens(tiny_models, tmp_path):
    cfg = config(systems=("ar", "sd", "hf"), compiled=(False, True), compile_max_len=64, n_prompts=2)
    variants, _ = cfg.grid()
    assert sorted(v.key for v in variants) == [
        "ar T=0 b=1",
        "ar T=0 b=1 compiled",
        "hf T=0 b=1",
        "sd K=2 T=0 b=1",
        "sd K=2 T=0 b=1 compiled",
    ]
    bench = start(cfg, tmp_path, "compile", tiny_models)
    outcome = bench.run(progress=False)
    assert outcome.errors == 0 and not outcome.unavailable
    tokens: dict[str, set] = {}
    for r in bench.run_dir.results():
        tokens.setdefault(r["prompt_id"], set()).add(tuple(r["token_ids"]))
    assert len(tokens) == 2 and all(len(outputs) == 1 for outputs in tokens.values())


def test_the_compile_flag_takes_off_and_on():
    from saguaro.commands import bench as command

    parser = argparse.ArgumentParser()
    command.add_parser(parser.add_subparsers(dest="command"))
    assert command.config_from(parser.parse_args(["bench"])).compiled == (False,)
    assert command.config_from(parser.parse_args(["bench", "--compile", "on"])).compiled == (True,)
    both = command.config_from(parser.parse_args(["bench", "--compile", "off", "on", "--max-len", "512"]))
    assert both.compiled == (False, True) and both.compile_max_len == 512
