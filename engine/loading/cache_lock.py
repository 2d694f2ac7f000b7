"""The model cache's build lock: one process builds a cache key at a time, the others wait and say why.

The lock itself is `filelock.FileLock` (an OS file lock, released by the kernel when its holder dies,
so a crashed build never leaves it taken). Beside the lock file the holder writes a small side file,
`<lock>.holder`, with its pid and command line, so a process that has to wait can say who it waits for.
The side file is only advice: it is written after the lock is taken and removed before it is released,
and a waiter that finds none says so.

How long to wait comes from the caller (`timeout_s`); `lock_timeout_s(env)` reads the user's choice
from `$SAGUARO_LOCK_TIMEOUT` at the public entry points.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import shlex
import sys
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import filelock

logger = logging.getLogger(__name__)

ENV_LOCK_TIMEOUT = "SAGUARO_LOCK_TIMEOUT"
DEFAULT_LOCK_TIMEOUT_S = 600.0
HOLDER_SUFFIX = ".holder"
_COMMAND_CHARS = 200  # a command line longer than this is cut in messages


class LockTimeoutError(ValueError):
    """Waited `timeout_s` for the cache lock and gave up; the message names the lock and the holder."""


@dataclass(frozen=True)
class Holder:
    """Who holds a lock, as its side file says."""

    pid: int
    command: str

    def describe(self) -> str:
        return f"pid {self.pid} (command {self.command})"


def lock_timeout_s(env: Mapping[str, str]) -> float:
    """Seconds to wait for the lock: `$SAGUARO_LOCK_TIMEOUT` if set (a number >= 0, or inf), else 600."""
    raw = env.get(ENV_LOCK_TIMEOUT, "").strip()
    if not raw:
        return DEFAULT_LOCK_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not value >= 0:  # also refuses nan
        raise ValueError(
            f"{ENV_LOCK_TIMEOUT}={raw!r} is not a number of seconds >= 0; set it to, say, 600 (or inf to wait forever)"
        )
    return value


def holder_path(lock_path: Path) -> Path:
    return lock_path.with_name(lock_path.name + HOLDER_SUFFIX)


def read_holder(lock_path: Path) -> Holder | None:
    """The holder recorded beside `lock_path`, or None when there is no readable record."""
    try:
        raw = json.loads(holder_path(lock_path).read_text())
        return Holder(pid=int(raw["pid"]), command=str(raw["command"]))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as err:
        logger.info("cannot read %s (%s)", holder_path(lock_path), err)
        return None


def _this_command() -> str:
    command = shlex.join(sys.argv) if sys.argv and sys.argv[0] else sys.executable
    return command if len(command) <= _COMMAND_CHARS else command[: _COMMAND_CHARS - 3] + "..."


def _write_holder(lock_path: Path) -> None:
    """Record this process as the holder, in one step (a temp file renamed over the side file)."""
    payload = {"pid": os.getpid(), "command": _this_command()}
    handle, temp = tempfile.mkstemp(prefix=holder_path(lock_path).name + ".", dir=lock_path.parent)
    try:
        with os.fdopen(handle, "w") as f:
            json.dump(payload, f)
        os.replace(temp, holder_path(lock_path))
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp)
        raise


def _clear_holder(lock_path: Path) -> None:
    """Remove the side file if it still names this process (call while the lock is still held)."""
    holder = read_holder(lock_path)
    if holder is not None and holder.pid == os.getpid():
        with contextlib.suppress(FileNotFoundError):
            holder_path(lock_path).unlink()


def _gave_up(lock_path: Path, timeout_s: float, holder: Holder | None) -> LockTimeoutError:
    who = holder.describe() if holder else "another process (it left no holder record)"
    stop = f"stop it (kill {holder.pid}) if it is stuck" if holder else "stop it if it is stuck"
    return LockTimeoutError(
        f"gave up after {timeout_s:g} s waiting for the model cache lock {lock_path}, held by {who}; "
        f"let that command finish or {stop}, then run this again "
        f"(wait longer with {ENV_LOCK_TIMEOUT}=SECONDS)"
    )


@contextlib.contextmanager
def hold(lock_path: Path, *, wait: bool = True, timeout_s: float = DEFAULT_LOCK_TIMEOUT_S) -> Iterator[bool]:
    """Hold the lock at `lock_path`; yields True once held.

    With `wait=False` it yields False at once if another holder has it. Otherwise, if the lock is taken,
    it logs once who holds it and waits up to `timeout_s` seconds (inf: forever), then raises
    LockTimeoutError. Opening the lock file can raise OSError (an unwritable folder).
    """
    lock = filelock.FileLock(lock_path)
    try:
        lock.acquire(timeout=0)
    except filelock.Timeout:
        if not wait:
            yield False
            return
        holder = read_holder(lock_path)
        logger.warning(
            "waiting for the model cache lock held by %s; giving up after %g s (%s)",
            holder.describe() if holder else "another process",
            timeout_s,
            ENV_LOCK_TIMEOUT,
        )
        try:
            lock.acquire(timeout=-1 if math.isinf(timeout_s) else timeout_s)
        except filelock.Timeout:
            raise _gave_up(lock_path, timeout_s, read_holder(lock_path) or holder) from None
    try:
        _write_holder(lock_path)
        yield True
    finally:
        try:
            _clear_holder(lock_path)
        finally:
            lock.release()
