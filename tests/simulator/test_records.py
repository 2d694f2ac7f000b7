"""The record reader accepts the engine's JSONL and says clearly what is wrong with bad records."""

import json

import pytest

from simulator import read_records
from simulator.records import parse_record
from tests.simulator.synthetic import engine_run, write_jsonl
from theory.glossary import Backup, Strategy

SD_ROUND = {
    "strategy": "sd",
    "round": 3,
    "batch_size": 2,
    "K": 4,
    "context_len": 120,
    "accepted": [4, 1],
    "emitted": [5, 2],
    "draft_ms": 12.5,
    "verify_ms": 30.0,
    "round_ms": 44.0,
    "draft_forwards": 4,
}
SSD_ROUND = {
    **SD_ROUND,
    "strategy": "ssd",
    "hit": [True, False],
    "cache_build_ms": 25.0,
    "branches": 24,
    "backup": "neural",
    "wait_ms": 3.0,
    "fanout": [3, 3, 2, 2, 2],
}


def test_reads_every_record_of_a_file(tmp_path):
    path = write_jsonl(tmp_path / "r.jsonl", engine_run("ssd", 2, 1, 5, fanout=(1, 1, 1)))
    records = read_records(path)
    assert [r.phase for r in records] == ["prefill"] + ["decode"] * 5
    assert records[1].strategy is Strategy.SSD and records[1].backup is Backup.NEURAL


def test_parses_an_sd_round_and_ignores_unknown_fields():
    record = parse_record({**SD_ROUND, "future_field": 1})
    assert (record.accepted, record.emitted, record.hit) == ((4, 1), (5, 2), None)


def test_parses_an_ssd_round():
    record = parse_record(SSD_ROUND)
    assert record.hit == (True, False) and record.fanout == (3, 3, 2, 2, 2) and record.branches == 24


def test_a_calibrations_build_level_rounds_are_marked():
    """`saguaro calibrate` marks its engine rounds that measure the builds; the engine's own rounds carry no mark."""
    assert parse_record({**SSD_ROUND, "level": "build"}).level == "build"
    assert parse_record({**SSD_ROUND, "level": "alone"}).level == "alone"  # its builds timed with the target idle
    assert parse_record(SSD_ROUND).level is None and parse_record({**SSD_ROUND, "level": None}).level is None


@pytest.mark.parametrize(
    "change, message",
    [
        ({"strategy": "tree"}, "strategy must be one of ar, sd, ssd"),
        ({"level": "verify"}, "'level' must be \"build\""),
        ({"verify_ms": None}, "missing field 'verify_ms'"),
        ({"round_ms": "fast"}, "'round_ms' must be a number"),
        ({"batch_size": 0}, "'batch_size' must be >= 1"),
        ({"accepted": [4]}, "'accepted' must be a list of 2 integers"),
        ({"accepted": [5, 1]}, "exceed K = 4"),
        ({"emitted": [6, 2]}, "exceeds accepted \\+ 1"),
        ({"phase": "warmup"}, "phase must be 'decode' or 'prefill'"),
        ({"K": True}, "'K' must be a number"),
    ],
)
def test_bad_sd_fields_are_named(change, message):
    with pytest.raises(ValueError, match=message):
        parse_record({**SD_ROUND, **change}, "runs.jsonl:7")


def test_under_adaptive_k_the_looked_up_caches_schedule_may_have_another_length():
    """The engine's K "auto": this round verified K = 4, its hit was looked up in a cache built for a round of
    K = 2 (three outcomes)."""
    assert parse_record({**SSD_ROUND, "fanout": [4, 2, 2]}).fanout == (4, 2, 2)


@pytest.mark.parametrize(
    "change, message",
    [
        ({"hit": [True]}, "'hit', a list of 2 booleans"),
        ({"fanout": [3]}, "'fanout', the looked-up cache's F_0..F_K'"),
        ({"fanout": None}, "'fanout', the looked-up cache's F_0..F_K'"),
        ({"backup": "auto"}, "not auto"),
        ({"backup": "magic"}, "names neural, random or lookup"),
        ({"backup": None}, "must name the backup that served them"),
        ({"wait_ms": None}, "missing field 'wait_ms'"),
    ],
)
def test_bad_ssd_fields_are_named(change, message):
    with pytest.raises(ValueError, match=message):
        parse_record({**SSD_ROUND, **change})


def test_engine_style_backup_fields():
    all_hit = parse_record({**SSD_ROUND, "hit": [True, True], "backup": None})
    assert all_hit.backups == () and all_hit.backup is None
    mixed = parse_record({**SSD_ROUND, "hit": [False, False], "backup": "neural,random"})
    assert mixed.backups == (Backup.NEURAL, Backup.RANDOM) and mixed.backup is None
    # the engine writes the wait into draft_ms: then the backup's own time is unknown
    assert parse_record({**SSD_ROUND, "draft_ms": 3.0, "wait_ms": 3.0}).backup_time_ms is None
    assert parse_record(SSD_ROUND).backup_time_ms == 12.5
    # engines that record the backup's own time: that, not the wait
    recorded = parse_record({**SSD_ROUND, "draft_ms": 30.0, "wait_ms": 30.0, "backup_ms": 7.5})
    assert recorded.backup_time_ms == 7.5


def test_an_ar_record_needs_k_zero():
    with pytest.raises(ValueError, match="AR record must have K = 0"):
        parse_record({**SD_ROUND, "strategy": "ar"})


def test_error_names_file_and_line(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text(json.dumps(SD_ROUND) + "\n\n{not json\n")
    with pytest.raises(ValueError, match=r"r.jsonl:3: not valid JSON"):
        read_records(path)


def test_missing_and_empty_files_are_refused(tmp_path):
    with pytest.raises(FileNotFoundError, match="no records file"):
        read_records(tmp_path / "absent.jsonl")
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(ValueError, match="holds no records"):
        read_records(tmp_path / "empty.jsonl")
