"""benchmarks/engine_overhead.py --host-terms: the engine's work a round with its forwards taken out, printed and
written in the form the simulator's measured engine presets read."""

from benchmarks import engine_overhead
from simulator.host_terms import read_host_terms


def test_the_host_terms_section_alone_prints_and_writes_a_measurement_the_simulator_reads(tmp_path, capsys):
    argv = ["--vocab", "64", "--host-terms-only", "--host-rounds", "4", "-K", "2", "--out", str(tmp_path)]
    assert engine_overhead.main(argv) == 0
    out = capsys.readouterr().out
    assert "its forwards taken out" in out and "simulator terms (EngineCosts)" in out
    terms = read_host_terms(tmp_path / "host_terms_64.json")
    assert terms.K == 2 and terms.meta["vocab"] == 64 and "--host-terms-only" in terms.meta["command"]
    assert {(r.strategy, r.batch) for r in terms.rounds} == {(s, b) for s in ("ar", "sd", "ssd") for b in (1, 8)}
    terms.costs()  # the terms derive from what was written
