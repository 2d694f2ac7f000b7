"""The draft worker's life: a worker that dies while it starts is noticed at once, a worker dies with
its parent at every stage, Ctrl-C inside generate() leaves SSD running and exact, a taken rendezvous port is
refused in one line before any model loads. Tiny models; each test starts at most one worker process."""

import multiprocessing.util as mp_util
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

import engine.decode_loop
from engine import LLM, SamplingParams, SpeculativeConfig
from engine.config import DraftPlacement, StartFault, WorkerFaults
from engine.ssd.lifetime import spawn_with_sigint_blocked
from engine.ssd.transport import host_store
from saguaro.cli import main as cli
from tests.engine.test_ssd_process import assert_no_children_left, decode_strategies
from tests.engine.tiny import noisy_copy

ROOT = Path(__file__).resolve().parents[2]
# Fixtures target and ar_tokens (conftest.py): the tiny target, and greedy AR's tokens for PROMPTS under GREEDY.
PROMPTS = [[1, 2, 3, 4, 5], [7, 8]]
GREEDY = SamplingParams(temperature=0, max_new_tokens=12, stop_on_eos=False)
NOTICE_S = 30.0  # far below the 300 s start deadline, far above a loaded 2-core machine's noise


@pytest.fixture
def sigint_as_in_a_terminal():
    """SIGINT raises KeyboardInterrupt in this process, as in a terminal, also when the suite was started in the
    background: a shell's `cmd &` starts it with SIGINT ignored, Python then installs no handler, and the Ctrl-C
    these tests send would be dropped."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    if previous is not None:  # None: a handler set outside Python, which cannot be put back from here
        signal.signal(signal.SIGINT, previous)


def _sigint_default() -> None:
    """preexec_fn of the CLI children: SIGINT at its default, so that Python installs its handler (see above)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def ssd(target, faults=None, start_deadline_s=300.0, **placement):
    spec = SpeculativeConfig(
        K=3, placement=DraftPlacement(faults=faults, start_deadline_s=start_deadline_s, **placement)
    )
    return LLM(target, noisy_copy(target, 1.0), strategy="ssd", speculative=spec)


# -- a worker that dies while it starts -------------------------------------------------------------
def test_a_worker_that_dies_before_connecting_is_noticed_at_once(target, ar_tokens):
    t0 = time.monotonic()
    with ssd(target, WorkerFaults(at_start=StartFault.EXIT_BEFORE_JOINING)) as llm:
        started_s = time.monotonic() - t0
        assert llm.strategy_in_use == "sd"
        assert "left before it could connect" in llm.fault
        out = llm.generate(PROMPTS, GREEDY)
    assert started_s < NOTICE_S
    assert [o.token_ids for o in out] == ar_tokens
    assert_no_children_left()


def test_a_worker_that_dies_while_loading_its_model_is_noticed_at_once(target, ar_tokens):
    with ssd(target, WorkerFaults(at_start=StartFault.EXIT_WHILE_LOADING)) as llm:
        t0 = time.monotonic()
        out = llm.generate(PROMPTS, GREEDY)
        took_s = time.monotonic() - t0
        assert "left before it could load its model" in llm.fault
    assert took_s < NOTICE_S
    assert [o.token_ids for o in out] == ar_tokens
    assert set(decode_strategies(out)) == {"sd"}
    assert_no_children_left()


UNGUARDED = """
import sys
sys.path.insert(0, {root!r})
from engine import LLM, SamplingParams, SpeculativeConfig
from tests.engine.tiny import noisy_copy, tiny_lm

target = tiny_lm(0, scale=4.0)
llm = LLM(target, noisy_copy(target, 1.0), strategy="ssd", speculative=SpeculativeConfig(K=2))
out = llm.generate([[1, 2, 3]], SamplingParams(temperature=0, max_new_tokens=4, stop_on_eos=False))
print(llm.strategy_in_use, len(out[0].token_ids))
llm.close()
"""


def test_a_script_without_a_main_guard_falls_back_at_once_and_says_why(tmp_path):
    script = tmp_path / "unguarded.py"
    script.write_text(UNGUARDED.format(root=str(ROOT)))
    t0 = time.monotonic()
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=240, cwd=tmp_path)
    took_s = time.monotonic() - t0
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["sd", "4"]
    assert 'if __name__ == "__main__":' in run.stderr and "Traceback" not in run.stderr
    assert took_s < 2 * NOTICE_S  # two interpreters import torch; the start deadline is 300 s


# -- a worker dies with its parent --------------------------------------------------------------------
PARENT = """
import sys, time
sys.path.insert(0, {root!r})
from engine import LLM, SpeculativeConfig
from engine.config import DraftPlacement, StartFault, WorkerFaults
from tests.engine.tiny import noisy_copy, tiny_lm

if __name__ == "__main__":
    target = tiny_lm(0, scale=4.0)
    faults = WorkerFaults(at_start=StartFault.HANG_WHILE_LOADING)
    llm = LLM(target, noisy_copy(target, 1.0), strategy="ssd",
              speculative=SpeculativeConfig(K=2, placement=DraftPlacement(faults=faults)))
    print("up", flush=True)
    time.sleep(600)
"""


def _worker_of(parent: psutil.Process, timeout_s: float) -> list[psutil.Process]:
    """The parent's children once the draft worker (a spawned interpreter) is among them."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        children = parent.children(recursive=True)
        if any("spawn_main" in " ".join(c.cmdline()) for c in children):
            return children
        time.sleep(0.05)
    raise AssertionError("the draft worker process never appeared")


@pytest.mark.parametrize("stage", ["starting", "loading"])
def test_the_worker_and_its_resource_tracker_die_with_a_killed_parent(tmp_path, stage):
    """`starting`: killed the moment the worker process exists (it is still importing); `loading`: killed
    once LLM() has returned, while the worker builds its model (made to hang there)."""
    script = tmp_path / "parent.py"
    script.write_text(PARENT.format(root=str(ROOT)))
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        parent = psutil.Process(proc.pid)
        if stage == "loading":
            assert proc.stdout.readline().strip() == "up"
        children = _worker_of(parent, 120)
        parent.kill()
        proc.wait(10)
        t0 = time.monotonic()
        _, alive = psutil.wait_procs(children, timeout=NOTICE_S)
        gone_s = time.monotonic() - t0
    finally:
        proc.kill()
        proc.wait()
    for p in alive:
        p.kill()
    assert alive == [], f"left behind: {[p.cmdline() for p in alive]}"
    assert gone_s < 15.0


# -- Ctrl-C inside generate() --------------------------------------------------------------------------
def _interrupt_in_exchange(llm, monkeypatch, at_call: int) -> None:
    """SIGINT lands just after a round was sent, before its answer is read (unguarded, the stream would fall out of
    step)."""
    endpoint = llm.proposer.channel.endpoint
    real_recv, calls = endpoint.recv, []

    def recv(*args, **kwargs):
        calls.append(1)
        if len(calls) == at_call:
            os.kill(os.getpid(), signal.SIGINT)
        return real_recv(*args, **kwargs)

    monkeypatch.setattr(endpoint, "recv", recv)


def _interrupt_in_verify(llm, monkeypatch, at_call: int) -> None:
    """Ctrl-C while the target verifies: the worker's answer is in, its outcome never will be."""
    calls = []

    def interrupting(real_verify):
        def verify(*args, **kwargs):
            calls.append(1)
            if len(calls) == at_call:
                raise KeyboardInterrupt
            return real_verify(*args, **kwargs)

        return verify

    for name in ("verify_rows", "verify_greedy"):  # rows sampling at T > 0, and all-greedy rows
        monkeypatch.setattr(engine.decode_loop, name, interrupting(getattr(engine.decode_loop, name)))


# The interrupted call has three rows where the worker's last speculation had at most two: a stale outcome
# would not fit.
@pytest.mark.parametrize(
    "where, at_call", [(_interrupt_in_exchange, 2), (_interrupt_in_verify, 1)], ids=["exchange", "verify"]
)
@pytest.mark.usefixtures("sigint_as_in_a_terminal")
def test_ctrl_c_inside_generate_leaves_ssd_running_with_exact_output(target, ar_tokens, monkeypatch, where, at_call):
    with ssd(target, deadline_s=10.0) as llm:
        llm.generate(PROMPTS, GREEDY)
        with monkeypatch.context() as patch:
            where(llm, patch, at_call)
            with pytest.raises(KeyboardInterrupt):
                llm.generate(PROMPTS + [[9, 10, 11]], GREEDY)
        out = llm.generate(PROMPTS, GREEDY)
        again = llm.generate(PROMPTS[::-1], GREEDY)
        assert llm.fault is None
    assert [o.token_ids for o in out] == ar_tokens
    assert [o.token_ids for o in again] == ar_tokens[::-1]
    assert set(decode_strategies(out)) == {"ssd"} and set(decode_strategies(again)) == {"ssd"}
    assert out.metrics.summary()["hit_rate"] > 0
    assert_no_children_left()


# -- a Ctrl-C while the worker is being started -----------------------------------------------------------
# The child sends itself a Ctrl-C at start-up, as a terminal's can reach a worker still importing: born with
# SIGINT blocked (or ignored) it lives on to write "alive"; born taking it, it dies of a KeyboardInterrupt.
CHILD_SIGINT = (
    "import os, signal, sys, time; os.kill(os.getpid(), signal.SIGINT); time.sleep(0.1); "
    "open(sys.argv[1], 'w').write('alive')"
)


@pytest.mark.usefixtures("sigint_as_in_a_terminal")
def test_a_ctrl_c_while_the_worker_starts_is_raised_once_it_has_started(tmp_path):
    """The Ctrl-C comes from another thread while `start` runs, as a terminal's does to a process with OpenMP
    threads. It must neither break `start` off (the target must own the worker it started) nor be lost (it was,
    when SIGINT stayed ignored for the whole of `start`); the child is still born deaf to it."""

    child_saw, started = tmp_path / "sigint", []

    def start():
        sender = threading.Thread(target=os.kill, args=(os.getpid(), signal.SIGINT))
        sender.start()
        sender.join()
        time.sleep(0.1)  # time for a KeyboardInterrupt to be raised here, which must not happen
        child = [sys.executable, "-c", CHILD_SIGINT, str(child_saw)]
        pid = mp_util.spawnv_passfds(os.fsencode(sys.executable), child, [])
        assert os.waitpid(pid, 0)[1] == 0
        started.append(True)

    with pytest.raises(KeyboardInterrupt):
        spawn_with_sigint_blocked(start)
    assert started == [True]
    assert child_saw.read_text() == "alive"
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


@pytest.mark.usefixtures("sigint_as_in_a_terminal")
def test_a_ctrl_c_that_another_thread_takes_during_the_fork_is_kept(monkeypatch):
    """The race that lost a terminal's Ctrl-C: during the fork this thread blocks SIGINT, so the kernel hands a
    process-directed one to another thread. When SIGINT was ignored around the fork, that thread discarded it;
    now the held handler runs there and the target is interrupted once `start` returns."""

    def fork(*args):
        sender = threading.Thread(target=os.kill, args=(os.getpid(), signal.SIGINT))
        sender.start()
        sender.join()
        time.sleep(0.1)
        return 12345

    monkeypatch.setattr(mp_util, "spawnv_passfds", fork)
    with pytest.raises(KeyboardInterrupt):
        spawn_with_sigint_blocked(lambda: mp_util.spawnv_passfds("python", ["python"], []))


@pytest.mark.usefixtures("sigint_as_in_a_terminal")
def test_a_ctrl_c_during_the_fork_itself_is_kept_for_the_target(monkeypatch):
    """Inside the fork SIGINT is blocked in this thread, and its disposition is not SIG_IGN: one sent to this
    thread then stays pending and is raised once `start` returns; the fork function is put back afterwards."""

    seen = []

    def fork(*args):
        seen.append((signal.getsignal(signal.SIGINT), signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, [])))
        signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)
        return 12345

    monkeypatch.setattr(mp_util, "spawnv_passfds", fork)
    with pytest.raises(KeyboardInterrupt):
        spawn_with_sigint_blocked(lambda: mp_util.spawnv_passfds("python", ["python"], []))
    assert len(seen) == 1 and callable(seen[0][0]) and seen[0][1]  # a handler that holds it, and blocked
    assert mp_util.spawnv_passfds is fork
    assert signal.SIGINT not in signal.pthread_sigmask(signal.SIG_BLOCK, [])


@pytest.mark.usefixtures("sigint_as_in_a_terminal")
def test_another_threads_spawn_during_the_start_passes_through(monkeypatch):
    """The fork function is swapped module-wide while the worker starts: a process spawned by another thread
    in that window goes through as it is (setting a handler from that thread would raise ValueError)."""

    seen = []
    monkeypatch.setattr(mp_util, "spawnv_passfds", lambda *args: seen.append(signal.getsignal(signal.SIGINT)) or 1)

    def start():
        other = threading.Thread(target=lambda: seen.append(mp_util.spawnv_passfds("python", ["python"], [])))
        other.start()
        other.join()

    spawn_with_sigint_blocked(start)
    assert len(seen) == 2 and seen[0] is not signal.SIG_IGN and seen[1] == 1  # not ignored, and no error


@pytest.mark.parametrize("disposition", [signal.SIG_DFL, signal.SIG_IGN], ids=["default", "ignored"])
def test_without_a_python_handler_the_child_is_still_born_deaf_to_sigint(tmp_path, disposition):
    """SIG_DFL (a program that set it so) or SIG_IGN (started in the background): nothing to hold, but the fork
    still gives the child SIGINT blocked, and the disposition and mask are as they were after."""

    child_saw = tmp_path / "sigint"
    previous = signal.signal(signal.SIGINT, disposition)
    try:

        def start():
            child = [sys.executable, "-c", CHILD_SIGINT, str(child_saw)]
            assert os.waitpid(mp_util.spawnv_passfds(os.fsencode(sys.executable), child, []), 0)[1] == 0

        spawn_with_sigint_blocked(start)
        assert signal.getsignal(signal.SIGINT) == disposition
        assert signal.SIGINT not in signal.pthread_sigmask(signal.SIG_BLOCK, [])
    finally:
        signal.signal(signal.SIGINT, previous)
    assert child_saw.read_text() == "alive"


def test_a_child_spawned_without_the_block_dies_of_its_own_ctrl_c(tmp_path):
    """Negative control of the child above: spawned as it is, under Python's handler, the same child dies."""
    child_saw = tmp_path / "sigint"
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        child = [sys.executable, "-c", CHILD_SIGINT, str(child_saw)]
        status = os.waitpid(mp_util.spawnv_passfds(os.fsencode(sys.executable), child, []), 0)[1]
    finally:
        signal.signal(signal.SIGINT, previous)
    assert os.waitstatus_to_exitcode(status) != 0 and not child_saw.exists()


class Abandoned(BaseException):
    """Something other than Ctrl-C that leaves an exchange half done (Ctrl-C itself waits for the answer)."""


def test_an_exchange_broken_off_mid_way_restarts_the_worker_for_the_next_call(target, ar_tokens, monkeypatch):
    with ssd(target, deadline_s=10.0) as llm:
        llm.generate(PROMPTS, GREEDY)
        first_pid = llm.proposer.channel.process.pid
        endpoint = llm.proposer.channel.endpoint
        real_recv, calls = endpoint.recv, []

        def recv(*args, **kwargs):
            calls.append(1)
            if len(calls) == 2:
                raise Abandoned  # the round was sent, its answer is never read
            return real_recv(*args, **kwargs)

        with monkeypatch.context() as patch:
            patch.setattr(endpoint, "recv", recv)
            with pytest.raises(Abandoned):
                llm.generate(PROMPTS, GREEDY)
        out = llm.generate(PROMPTS, GREEDY)
        assert llm.fault is None and llm.proposer.channel.process.pid != first_pid
    assert [o.token_ids for o in out] == ar_tokens
    assert set(decode_strategies(out)) == {"ssd"}
    assert_no_children_left()


# -- a taken rendezvous port ---------------------------------------------------------------------------
@pytest.fixture
def taken_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


def test_a_taken_port_is_refused_before_any_model_loads(taken_port):
    spec = SpeculativeConfig(placement=DraftPlacement(init_method=f"tcp://127.0.0.1:{taken_port}"))
    # The models do not exist: the port is checked first.
    with pytest.raises(ValueError, match=f"port {taken_port} of tcp://127.0.0.1:{taken_port} is taken.*port 0"):
        LLM("/no/such/target", "/no/such/draft", strategy="ssd", speculative=spec)


def test_a_port_taken_after_the_check_is_refused_the_same_way(taken_port):
    with pytest.raises(ValueError, match=f"port {taken_port} .* is taken"):
        host_store(f"tcp://127.0.0.1:{taken_port}", 5.0)


def test_a_taken_port_on_the_command_line_is_one_line_and_exit_2(taken_port, capsys):
    code = cli(
        [
            "generate",
            "--strategy",
            "ssd",
            "--init-method",
            f"tcp://127.0.0.1:{taken_port}",
            "--target",
            "/no/such/target",
            "--draft",
            "/no/such/draft",
            "Hi",
        ]
    )
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and f"port {taken_port}" in err and "Traceback" not in err


def test_two_engines_on_one_port_the_second_is_refused(target):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with ssd(target, init_method=f"tcp://127.0.0.1:{port}") as first:
        assert first.strategy_in_use == "ssd"
        with pytest.raises(ValueError, match=f"port {port} .* is taken"):
            ssd(target, init_method=f"tcp://127.0.0.1:{port}")
    assert_no_children_left()


# -- only the parent speaks ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def cli_args(tmp_path_factory):
    from tests.engine.test_models import save_tiny

    folder = tmp_path_factory.mktemp("tiny")
    save_tiny(folder / "model", vocab_size=64)
    (folder / "prompts.jsonl").write_text('{"ids": [1, 2, 3]}\n')
    return [
        sys.executable,
        "-m",
        "saguaro.cli",
        "generate",
        "--strategy",
        "ssd",
        "--target",
        str(folder / "model"),
        "--draft",
        str(folder / "model"),
        "--dtype",
        "float32",
        "-K",
        "2",
        "--ignore-eos",
        "--prompts-file",
        str(folder / "prompts.jsonl"),
    ]


@pytest.mark.parametrize("when", ["worker starting", "generating"])
def test_ctrl_c_of_generate_ssd_prints_one_line(cli_args, when):
    """A terminal's Ctrl-C reaches the whole process group, the worker included."""
    proc = subprocess.Popen(
        cli_args + ["--max-new-tokens", "200", "--stream"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
        cwd=ROOT,
        preexec_fn=_sigint_default,
    )
    try:
        if when == "generating":
            proc.stdout.read(1)
        else:
            _worker_of(psutil.Process(proc.pid), 120)
        os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
        proc.wait()
    assert (proc.returncode, err.decode()) == (130, "saguaro: interrupted\n")


def test_a_normal_close_prints_nothing(cli_args):
    run = subprocess.run(
        cli_args + ["--max-new-tokens", "16", "--json"], capture_output=True, text=True, timeout=240, cwd=ROOT
    )
    assert run.returncode == 0 and run.stderr == ""
