"""A draft given without a strategy is used (SD), not silently dropped; no draft means AR."""

from engine import LLM
from engine.config import Strategy
from tests.engine.tiny import tiny_lm


def test_a_draft_without_a_strategy_runs_sd():
    with LLM(tiny_lm(0), tiny_lm(1)) as llm:
        assert llm.config.strategy is Strategy.SD
        assert llm.draft is not None


def test_no_draft_and_no_strategy_runs_ar():
    with LLM(tiny_lm(0)) as llm:
        assert llm.config.strategy is Strategy.AR
