"""Shared pieces of the reports tests: the committed fixture run folders and tiny in-memory models."""

from __future__ import annotations

from pathlib import Path

import pytest

FIXTURES = Path(__file__).resolve().parent / "fixtures"
FIXTURE_RUNS = sorted(p for p in (FIXTURES / "runs").iterdir() if p.is_dir())
TOKEN_PROMPTS = FIXTURES / "token_prompts.jsonl"


@pytest.fixture(scope="session")
def tiny_models():
    """A tiny fp32 target and a noisy copy as draft (vocabulary 50), no tokenizer: token-id prompts."""
    from saguaro.bench import Models
    from tests.engine.tiny import noisy_copy, tiny_lm

    target = tiny_lm(0, scale=4.0)
    return Models(target, noisy_copy(target, noise=1.0), None)


@pytest.fixture(scope="session")
def report_data():
    from saguaro.reporting.report import load_data

    return load_data(FIXTURE_RUNS)[0]


PREDICTION_STUDY = "2026-12-cpu-prediction-accuracy"


@pytest.fixture(scope="session")
def held_out_runs(tmp_path_factory) -> Path:
    """The committed held-out runs of reports/2026-12-cpu-prediction-accuracy, unpacked once per session: the
    folder its manifest's paths are relative to (e.g. <it>/2026-12-01-avx512/runs/*-k5ref)."""
    from saguaro.validation.studies import REPORTS, unpack

    return unpack(REPORTS, PREDICTION_STUDY, tmp_path_factory.mktemp("studies"))
