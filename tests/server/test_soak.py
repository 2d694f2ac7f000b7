"""A short soak (saguaro.bench.soak) of the server over the tiny SSD pair: mixed requests, clients leaving,
bad requests and a killed draft worker, a few seconds on loopback; nothing lost or hung, greedy outputs solo."""

from __future__ import annotations

import psutil
import pytest

from engine import LLM, SpeculativeConfig
from saguaro.bench.soak import Kind, Outcome, Soak, SoakConfig, SoakResult, markdown, write
from tests.server.test_live_tiny import NAME, PROMPTS, pair, serving  # noqa: F401 (pair: a fixture)


def test_a_short_soak_with_a_killed_draft_worker_loses_nothing(pair, tmp_path):  # noqa: F811 (the fixture)
    target, draft = pair
    before = {c.pid for c in psutil.Process().children(recursive=True)}
    llm = LLM(target, draft, strategy="ssd", speculative=SpeculativeConfig(K=3), max_num_seqs=4)
    with serving(llm, max_waiting=16) as (server, aengine):
        worker = next(
            c
            for c in psutil.Process().children(recursive=True)
            if c.pid not in before and "spawn_main" in " ".join(c.cmdline())
        )
        config = SoakConfig(
            url=server.url,
            model=NAME,
            prompts=tuple(tuple(p) for p in PROMPTS),
            duration_s=4.0,
            concurrency=3,
            max_tokens=16,
            fault_at_s=1.5,
            timeout_s=30.0,
        )
        result = Soak(config, fault=worker.kill, rss=lambda: psutil.Process().memory_info().rss).run()
        fallbacks = aengine.stats().fallbacks
    summary = write(result, tmp_path)
    assert result.passed, summary
    assert {r.kind for r in result.requests} == set(Kind) and fallbacks == 1 and result.fault_s is not None
    assert summary["outcomes"][Outcome.OK.value] > 0 and summary["outcomes"][Outcome.REFUSED.value] > 0
    assert (tmp_path / "soak.md").read_text() == markdown(summary) and "RSS growth" in markdown(summary)


@pytest.mark.parametrize("url", ["http://10.0.0.1:8000", "http://example.com:80"])
def test_the_soak_talks_to_loopback_only(url):
    with pytest.raises(ValueError, match="loopback only"):
        SoakConfig(url=url, model="m", prompts=("hi",))


def test_the_soak_is_bounded_in_time():
    with pytest.raises(ValueError, match="duration"):
        SoakConfig(url="http://127.0.0.1:1", model="m", prompts=("hi",), duration_s=601)


def _result(samples_mib, fault_s=60.0):
    config = SoakConfig(url="http://127.0.0.1:1", model="m", prompts=("hi",), duration_s=120.0, fault_at_s=60.0)
    result = SoakResult(config, solo=[], rss_samples=[(t, int(mib * 2**20)) for t, mib in samples_mib])
    result.fault_s = fault_s
    result.rss_end = result.rss_samples[-1][1]
    return result


def test_memory_counts_from_the_end_of_the_warm_up_and_a_settled_server_has_no_slope():
    # grows for the first 10 s (new shapes, allocator pools), then flat; the fallback adds a step at the fault
    samples = [(t, 100 + 5 * min(t, 10) + (50 if t >= 60 else 0)) for t in range(0, 120)]
    summary = _result(samples).summary()
    assert summary["warmup_s"] == 15.0  # a quarter of the time before the fault
    assert summary["rss_after_warmup_mib"] == 150 and summary["rss_before_fault_mib"] == 150
    assert summary["rss_growth_before_fault"] == 0 and summary["rss_growth_after_fault"] == 0
    assert abs(summary["rss_slope_before_fault_mib_min"]) < 1e-9
    assert abs(summary["rss_slope_after_fault_mib_min"]) < 1e-9


def test_a_steady_leak_shows_as_growth_and_a_slope():
    samples = [(t, 100 + 0.5 * t) for t in range(0, 120)]  # 30 MiB a minute, all along
    summary = _result(samples).summary()
    assert summary["rss_growth_before_fault"] > 0.1
    assert abs(summary["rss_slope_before_fault_mib_min"] - 30) < 1e-6
    assert abs(summary["rss_slope_after_fault_mib_min"] - 30) < 1e-6
    assert "30.0 MiB/min" in markdown(summary)


def test_the_warm_up_must_end_before_the_fault():
    with pytest.raises(ValueError, match="warm-up"):
        SoakConfig(url="http://127.0.0.1:1", model="m", prompts=("hi",), duration_s=60, fault_at_s=20, warmup_s=30)
