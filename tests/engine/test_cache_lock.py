"""The model cache's build lock when another process holds it: who it waits for, how long, and giving up.

The other process is a real one (a small Python child that takes the lock and holds it until its stdin
closes), so the pid in the messages is not ours and a lock held by a dead process is really released.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from engine.loading import cache_lock, model_cache, provision
from engine.loading.cache_lock import LockTimeoutError
from tests.engine.test_model_cache_faults import assert_one_line_error, run_cli

KEY = "some-key"
WAIT_MESSAGE = "waiting for the model cache lock held by pid"

# Imports only engine.loading.cache_lock (the engine packages import their modules on first use, so no torch):
# a fast child.
HOLDER_SCRIPT = """
import sys
from pathlib import Path
from engine.loading import cache_lock
with cache_lock.hold(Path(sys.argv[1])):
    print("held", flush=True)
    sys.stdin.read()  # until the test closes our stdin
"""


def lock_path(root: Path, key: str = KEY) -> Path:
    return root / f"{model_cache.LOCK_PREFIX}{key}"


@pytest.fixture
def hold_elsewhere():
    """Starts children that hold a lock file until their stdin closes; every child is reaped after the test."""
    children: list[subprocess.Popen] = []

    def start(path: Path) -> subprocess.Popen:
        child = subprocess.Popen(
            [sys.executable, "-c", HOLDER_SCRIPT, str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        children.append(child)
        assert child.stdout.readline().strip() == "held"
        return child

    yield start
    for child in children:
        if child.poll() is None:
            child.stdin.close()
            child.wait(timeout=30)


@pytest.fixture
def other_process(tmp_path, hold_elsewhere):
    """A child holding the lock on KEY in a fresh cache root; yields (root, child)."""
    root = tmp_path / "cache"
    root.mkdir()
    return root, hold_elsewhere(lock_path(root))


def release_later(child: subprocess.Popen, delay_s: float) -> threading.Timer:
    timer = threading.Timer(delay_s, child.stdin.close)
    timer.start()
    return timer


def test_holder_is_recorded_while_held_and_removed_after(tmp_path):
    root = tmp_path / "cache"
    with model_cache.key_lock(root, KEY) as held:
        holder = cache_lock.read_holder(lock_path(root))
        assert held and holder is not None and holder.pid == os.getpid() and holder.command
    assert cache_lock.read_holder(lock_path(root)) is None


def test_a_waiter_names_the_holder_once_then_gets_the_lock(other_process, caplog):
    root, child = other_process
    timer = release_later(child, 1.0)
    with caplog.at_level(logging.WARNING, logger="engine.loading.cache_lock"):
        with model_cache.key_lock(root, KEY, timeout_s=60) as held:
            assert held
    timer.join()
    waits = [r.getMessage() for r in caplog.records if WAIT_MESSAGE in r.getMessage()]
    assert len(waits) == 1, waits
    assert f"{WAIT_MESSAGE} {child.pid} (command " in waits[0] and "SAGUARO_LOCK_TIMEOUT" in waits[0]
    assert " -c " in waits[0]  # the child's own command line, as its side file recorded it


def test_a_waiter_gives_up_after_the_timeout_naming_lock_holder_and_remedy(other_process):
    root, child = other_process
    start = time.monotonic()
    with pytest.raises(LockTimeoutError) as caught:
        with model_cache.key_lock(root, KEY, timeout_s=0.3):
            pytest.fail("took a lock that another process holds")
    assert 0.3 <= time.monotonic() - start < 10
    message = str(caught.value)
    for needle in (
        "gave up after 0.3 s",
        str(lock_path(root)),
        f"pid {child.pid}",
        f"kill {child.pid}",
        "SAGUARO_LOCK_TIMEOUT",
    ):
        assert needle in message, message
    assert isinstance(caught.value, ValueError) and "\n" not in message


def test_a_lock_held_by_a_killed_process_is_free(other_process):
    root, child = other_process
    child.kill()
    child.wait(timeout=30)
    with model_cache.key_lock(root, KEY, timeout_s=5) as held:
        assert held


def test_without_waiting_a_held_lock_is_reported_busy(other_process, caplog):
    root, _ = other_process
    with model_cache.key_lock(root, KEY, wait=False) as held:
        assert held is False
    assert not any(WAIT_MESSAGE in r.getMessage() for r in caplog.records)


def test_cli_gives_up_with_one_line_and_exit_2(hold_elsewhere, tmp_path, monkeypatch, capsys, caplog):
    root = tmp_path / "cache"
    root.mkdir()
    gguf = tmp_path / "weights.gguf"
    gguf.write_bytes(b"GGUF not really")
    key = provision.gguf_file_key(model_cache.sha256_file(gguf))
    child = hold_elsewhere(lock_path(root, key))
    monkeypatch.setenv(cache_lock.ENV_LOCK_TIMEOUT, "0.2")
    status, _, err = run_cli(["models", "provision", "--gguf", str(gguf), "--cache", str(root)], capsys)
    # the CLI shows warnings on stderr: at most the one "waiting for the lock" line, then the one error line
    lines = err.strip().splitlines()
    waiting = [x for x in lines if x.startswith("warning: waiting for the model cache lock")]
    assert len(waiting) <= 1 and len(lines) == 1 + len(waiting)
    assert_one_line_error(
        status, lines[-1] + "\n", "gave up after 0.2 s", str(lock_path(root, key)), f"pid {child.pid}"
    )
    assert sum(WAIT_MESSAGE in r.getMessage() for r in caplog.records) == 1


@pytest.mark.parametrize(
    ("raw", "expected"), [(None, 600.0), ("", 600.0), ("2.5", 2.5), ("0", 0.0), ("inf", float("inf"))]
)
def test_lock_timeout_comes_from_the_environment(raw, expected):
    env = {} if raw is None else {cache_lock.ENV_LOCK_TIMEOUT: raw}
    assert cache_lock.lock_timeout_s(env) == expected


@pytest.mark.parametrize("raw", ["soon", "-1", "nan"])
def test_a_bad_lock_timeout_says_what_to_set(raw):
    with pytest.raises(ValueError, match="SAGUARO_LOCK_TIMEOUT=.* is not a number of seconds >= 0"):
        cache_lock.lock_timeout_s({cache_lock.ENV_LOCK_TIMEOUT: raw})
