"""The draft worker's ties to the target process: it lives only while its parent does, never answers Ctrl-C
itself, and leaves quietly; the target defers Ctrl-C while a message exchange is in flight.

Why each piece:
- parent death: a target killed while its worker starts (or loads its model) would leave the worker and
  multiprocessing's resource tracker (which waits for the worker's copy of its pipe) behind for minutes.
  On Linux the kernel's parent-death signal kills the worker at once (PR_SET_PDEATHSIG, set only when the
  target started it from its main thread: the signal follows the starting *thread*); everywhere a daemon
  thread also polls the parent every POLL_S and exits the worker when it has gone (a check that cannot block).
- Ctrl-C: a terminal sends SIGINT to the whole process group. The worker is born with SIGINT blocked
  (`spawn_with_sigint_blocked`), ignores it from the first line of `serve`, and is stopped by the target; a
  Ctrl-C that comes while the worker is being started reaches the target once it is started.
- quiet exit: once the worker leaves its loop, gloo's shutdown chatter ("Connection closed by peer") is not
  the user's business; the target reports faults, in one warning.
- an exchange is one send and one receive of several tensors; a KeyboardInterrupt between them (a notebook's
  stop button) would leave a reply unread and the stream out of step. `sigint_deferred` holds Ctrl-C until
  the exchange and its bookkeeping are complete (each bounded by the worker deadline), then raises it.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from enum import IntEnum

log = logging.getLogger(__name__)
POLL_S = 0.25
PR_SET_PDEATHSIG = 1  # linux/prctl.h


class WorkerExit(IntEnum):
    """Exit statuses of the worker process that the target explains."""

    FAULT_INJECTED = 3  # WorkerFaults.exit_at_round (tests)
    MAIN_NOT_GUARDED = 4  # spawn re-ran a script that builds an SSD LLM at top level
    PARENT_GONE = 5


UNGUARDED_MAIN = (
    "the script that builds this SSD LLM runs again in the draft worker process (multiprocessing "
    "'spawn' imports the main module): put the code that builds the LLM under "
    '`if __name__ == "__main__":`'
)


def explain_exit(code: int | None) -> str:
    """Why a worker that left with status `code` did so, as far as the target can tell."""
    if code == WorkerExit.MAIN_NOT_GUARDED:
        return UNGUARDED_MAIN
    if code == WorkerExit.PARENT_GONE:
        return "it lost its parent"
    if code is not None and code < 0:
        return f"it was killed by signal {-code}"
    return f"exit status {code}; its stderr says why"


def refuse_unguarded_main() -> None:
    """In a process that spawn is still bootstrapping (it is re-running the parent's main script), building an
    SSD LLM would load the target again and then fail to start a worker: leave at once, with a status the
    parent explains (it alone speaks)."""
    import multiprocessing.process as mpp

    if getattr(mpp.current_process(), "_inheriting", False):
        raise SystemExit(int(WorkerExit.MAIN_NOT_GUARDED))


def spawn_with_sigint_blocked(start: Callable[[], None]) -> None:
    """Run `start` (which spawns the worker) so that the child is born with SIGINT blocked (the signal mask is
    kept across fork and exec; `ignore_sigint`, the worker's first act, then drops a pending one: a Ctrl-C
    during its start-up, imports and unpickling, cannot give it a traceback), while a Ctrl-C meant for the
    target is kept, not lost.

    SIGINT is blocked in this thread only around the fork itself (multiprocessing's `spawnv_passfds`, a vfork
    and exec); its disposition is never changed to SIG_IGN. Around all of `start` (writing the pickled process
    object to the child can take as long as the child's imports) a Ctrl-C is held and raised once `start`
    returns, so the target owns a started worker it can stop. A Ctrl-C the kernel hands to another thread
    (OpenMP's, a progress bar's) while this thread blocks it runs the held handler there. Ignoring SIGINT around
    the fork instead would discard such a Ctrl-C (the kernel drops an ignored signal on delivery).
    This is how multiprocessing's own resource tracker is started. From a thread other than the main one
    `start` runs as it is (only the main thread gets KeyboardInterrupt; the worker still ignores SIGINT from
    its first line), and so it does without `pthread_sigmask` (Windows: no process group Ctrl-C to share)."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "pthread_sigmask"):
        start()
        return
    import multiprocessing.util as mp_util

    fork = mp_util.spawnv_passfds

    def fork_blocking_sigint(*args, **kwargs):
        if threading.current_thread() is not threading.main_thread():
            return fork(*args, **kwargs)  # another thread's spawn in this window: not the worker's
        was_blocked = signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            return fork(*args, **kwargs)
        finally:
            if not was_blocked:  # one that came meanwhile is delivered now, to the held handler
                signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})

    with sigint_deferred():
        mp_util.spawnv_passfds = fork_blocking_sigint
        try:
            start()
        finally:
            mp_util.spawnv_passfds = fork


def ignore_sigint() -> None:
    """In the worker: Ctrl-C is the target's to handle (it stops the worker with STOP)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})  # a pending one is dropped: ignored


def _parent_alive(pid: int) -> bool:
    if os.name == "posix":
        return os.getppid() == pid  # an orphan is re-parented (to init or a subreaper)
    import multiprocessing

    parent = multiprocessing.parent_process()  # Windows: a handle on the parent, polled without blocking
    return parent is None or parent.is_alive()


def _watch(pid: int) -> None:
    while _parent_alive(pid):
        time.sleep(POLL_S)
    os._exit(WorkerExit.PARENT_GONE)


def die_with_parent(pid: int | None, death_signal: bool) -> None:
    """In the worker, first thing: exit when process `pid` (the target) is gone, at every later stage."""
    if pid is None:
        return  # started by hand (another host): the broken link ends it
    if death_signal and sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
                log.debug("prctl(PR_SET_PDEATHSIG) failed: errno %d; the watch thread still runs", ctypes.get_errno())
        except (OSError, AttributeError) as err:  # no libc prctl: the watch thread below still covers it
            log.debug("no parent-death signal (%s); the watch thread still runs", err)
    if not _parent_alive(pid):  # the parent died before the signal was armed
        os._exit(WorkerExit.PARENT_GONE)
    threading.Thread(target=_watch, args=(pid,), name="saguaro-parent-watch", daemon=True).start()


def silence_stderr() -> None:
    """In the worker, once it leaves its loop: drop what C++ (gloo) prints while the link is torn down."""
    try:
        sys.stderr.flush()
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 2)
        os.close(devnull)
    except OSError as err:
        log.debug("could not silence stderr: %s", err)


@contextmanager
def sigint_deferred() -> Iterator[None]:
    """Hold Ctrl-C (in the main thread) until the block ends, then deliver it to the handler it was meant for."""
    previous = signal.getsignal(signal.SIGINT)
    if threading.current_thread() is not threading.main_thread() or not callable(previous):
        yield  # only the main thread gets KeyboardInterrupt; SIG_IGN / SIG_DFL need nothing
        return
    caught: list = []
    signal.signal(signal.SIGINT, lambda signum, frame: caught.append(frame))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if caught:
            previous(signal.SIGINT, caught[-1])
