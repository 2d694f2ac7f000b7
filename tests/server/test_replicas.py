"""`saguaro serve --replicas 2` on a tiny model: one local Ray for the module, started as the command line does.

The same greedy text as the plain server through the official openai client, and the same seeded sampled text
and fingerprint in either sampling mode, concurrent streams spread over both replicas, every listener on loopback,
a replica killed mid-stream survived with nothing lost or hung, and SIGTERM ending it all with status 0. The
tests run in this file's order: the last one stops the server. Marker `ray` (`-m 'not ray'` leaves them out): the
module takes about a minute on 2 cores, most of it Ray starting.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import psutil
import pytest
from openai import OpenAI

from engine import LLM, AsyncLLM
from engine.loading.tiny import tiny_model
from server import ServerSettings
from tests.engine.test_models import tiny_tokenizer
from tests.server.conftest import running

pytestmark = [pytest.mark.ray, pytest.mark.timeout(300)]

NAME = "tiny"
PROMPTS = [(1, 2, 3), (5, 9, 4, 7, 2), (11,), (30, 31)]  # token ids: the saved tiny tokenizer reads no text
MAX_NEW = 12
VOCAB, CONTEXT, LONG = 64, 8192, 8000  # a LONG stream lasts seconds on this model
NO_EOS = {"ignore_eos": True}  # the tiny model ends most answers at once otherwise
SEEDS = (5, 6, 7)
START_TIMEOUT_S = 180.0
STOP_TIMEOUT_S = 20.0  # SIGTERM to exit, as docs/serving.md promises
REPLACE_TIMEOUT_S = 90.0
REPORT_WAIT_S = 2.5  # a replica reports its counters to the ingress every second
ENGINE_TITLE = "ServeReplica:saguaro:EngineReplica"


def free_port() -> int:
    """A port free now (Ray Serve's proxy takes a port number, not port 0): bound to 127.0.0.1, then released."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Served:
    """The `saguaro serve --replicas 2` process, its URL, and every process it started (seen while it runs)."""

    def __init__(self, folder: Path):
        self.port = free_port()
        env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])}
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "saguaro.cli",
                "serve",
                "--replicas",
                "2",
                "--target",
                str(folder),
                "--strategy",
                "ar",
                "--served-model-name",
                NAME,
                "--batch",
                "4",
                "--threads",
                "1",
                "--ray-cpus",
                "2",
                "--port",
                str(self.port),
                "--shutdown-timeout",
                "5",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        self.url = self._wait_for_url()
        self.seen: set[int] = set()
        self.note_processes()

    def _wait_for_url(self) -> str:
        found: list[str] = []

        def read() -> None:
            for line in self.process.stdout:
                if "listening on" in line:
                    found.append(line.split("listening on ")[1].split()[0])
                    return

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        reader.join(START_TIMEOUT_S)
        if not found:
            self.process.kill()
            raise RuntimeError(f"the replicas did not start: {self.process.stderr.read()[-3000:]}")
        return found[0]

    def processes(self) -> list[psutil.Process]:
        try:
            return psutil.Process(self.process.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []

    def note_processes(self) -> None:
        self.seen |= {p.pid for p in self.processes()}

    def engine_replicas(self) -> list[psutil.Process]:
        return [p for p in self.processes() if ENGINE_TITLE in " ".join(p.cmdline())]

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        for pid in self.seen:
            try:
                psutil.Process(pid).kill()
            except psutil.NoSuchProcess:
                pass


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """A tiny model with room for streams long enough to kill a replica under one (a few seconds of tokens)."""
    path = tmp_path_factory.mktemp("tiny")
    tiny_model(vocab_size=VOCAB, max_position_embeddings=CONTEXT).save_pretrained(path)
    tiny_tokenizer(VOCAB).save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def served(folder):
    server = Served(folder)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def plain_server(folder):
    """The plain server of the same model."""
    llm = LLM(str(folder), max_num_seqs=4, threads=1)
    with running(llm, AsyncLLM(llm, max_waiting=8), ServerSettings(served_model_name=NAME)) as server:
        yield server


@pytest.fixture(scope="module")
def plain(plain_server):
    """What the plain server answers, by prompt: the greedy (text, token ids) through the openai client."""
    return {prompt: answer(client_of(plain_server.url), prompt) for prompt in PROMPTS}


def client_of(url: str) -> OpenAI:
    return OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=60)


def answer(client: OpenAI, prompt: tuple[int, ...]) -> tuple[str, list[int]]:
    choice = client.completions.create(
        model=NAME, prompt=list(prompt), max_tokens=MAX_NEW, temperature=0, extra_body=NO_EOS
    ).choices[0]
    return choice.text, choice.model_extra["token_ids"]


def sampled(url: str, seed: int, mode: str) -> tuple[list[int], str, bool]:
    """A seeded completion at temperature 0.8: its token ids, system_fingerprint and `reproducible`."""
    completion = client_of(url).completions.create(
        model=NAME,
        prompt=list(PROMPTS[1]),
        max_tokens=MAX_NEW,
        temperature=0.8,
        seed=seed,
        extra_body={**NO_EOS, "sampling_mode": mode},
    )
    extra = completion.choices[0].model_extra
    return extra["token_ids"], completion.system_fingerprint, completion.model_extra["reproducible"]


def replica_tokens(url: str) -> dict[str, float]:
    """saguaro:generation_tokens_total by replica, from the one /metrics endpoint."""
    totals = {}
    for line in httpx.get(f"{url}/metrics", timeout=10).text.splitlines():
        if line.startswith("saguaro:generation_tokens_total{"):
            labels, value = line.rsplit(" ", 1)
            replica = labels.split('replica="')[1].split('"')[0]
            totals[replica] = float(value)
    return totals


def stream_events(url: str, body: dict, first: threading.Event | None = None) -> list:
    """The data events of one stream, read to its end ([DONE] included); `first` is set at the first event."""
    events = []
    with httpx.stream("POST", f"{url}/v1/completions", json={**body, "stream": True}, timeout=60) as response:
        for line in response.iter_lines():
            if line.startswith("data: "):
                payload = line.removeprefix("data: ")
                events.append(payload if payload == "[DONE]" else json.loads(payload))
                if first is not None:
                    first.set()
    return events


def test_the_openai_client_gets_the_plain_servers_greedy_text(served, plain):
    client = client_of(served.url)
    for prompt, (text, token_ids) in plain.items():
        assert answer(client, prompt) == (text, token_ids) and len(token_ids) == MAX_NEW
        parts = [
            part.choices[0]
            for part in client.completions.create(
                model=NAME, prompt=list(prompt), max_tokens=MAX_NEW, temperature=0, stream=True, extra_body=NO_EOS
            )
            if part.choices
        ]
        assert "".join(p.text for p in parts) == text
        assert [t for p in parts for t in p.model_extra["token_ids"]] == token_ids


def test_a_seeded_sampled_answer_and_its_fingerprint_are_the_plain_servers_in_either_mode(served, plain_server):
    answers = {mode: [sampled(served.url, seed, mode) for seed in SEEDS] for mode in ("standard", "invariant")}
    for mode, replies in answers.items():
        assert replies == [sampled(plain_server.url, seed, mode) for seed in SEEDS], mode
        assert all(reproducible for _, _, reproducible in replies)
    assert [ids for ids, _, _ in answers["standard"]] != [ids for ids, _, _ in answers["invariant"]]  # mode arrived


def test_concurrent_streams_are_spread_over_both_replicas(served):
    # Power of two choices sends a request to the less busy of two replicas; were it a coin flip per request,
    # all 12 on one replica would happen with probability 2 x 2^-12 (0.05%).
    time.sleep(REPORT_WAIT_S)  # counters of the requests before this test reach the ingress
    before = replica_tokens(served.url)
    body = {"model": NAME, "prompt": [1, 2], "max_tokens": 40, "temperature": 0, "ignore_eos": True}
    threads = [threading.Thread(target=stream_events, args=(served.url, body)) for _ in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    time.sleep(REPORT_WAIT_S)
    after = replica_tokens(served.url)
    grown = {replica: after[replica] - before.get(replica, 0.0) for replica in after}
    assert len(grown) == 2 and all(n > 0 for n in grown.values()), grown
    assert sum(grown.values()) == 12 * 40


def test_every_listener_binds_loopback(served):
    served.note_processes()
    listeners = {
        (c.laddr.ip, c.laddr.port, p.name())
        for p in [psutil.Process(served.process.pid), *served.processes()]
        for c in p.net_connections(kind="inet")
        if c.status == psutil.CONN_LISTEN
    }
    assert listeners
    assert all(ip in ("127.0.0.1", "::ffff:127.0.0.1", "::1") for ip, _, _ in listeners), sorted(listeners)


def test_a_killed_replica_ends_its_streams_with_an_error_and_the_rest_go_on(served, plain):
    served.note_processes()
    replicas = served.engine_replicas()
    assert len(replicas) == 2
    body = {"model": NAME, "prompt": [1, 2], "max_tokens": LONG, "temperature": 0, "ignore_eos": True}
    results: list[list] = []
    first = threading.Event()
    stream = threading.Thread(target=lambda: results.append(stream_events(served.url, body, first)))
    stream.start()
    assert first.wait(60)
    for replica in replicas:
        replica.cpu_percent()
    time.sleep(0.5)
    busy = max(replicas, key=lambda r: r.cpu_percent())  # the one generating the stream's tokens
    busy.kill()
    stream.join(60)
    assert not stream.is_alive(), "the stream hung"
    events = results[0]
    assert events[-1] == "[DONE]" and events[-2]["error"]["type"] == "server_error"
    assert len([e for e in events if isinstance(e, dict) and "choices" in e]) < LONG
    client = client_of(served.url)
    for prompt, expected in plain.items():  # new requests: none lost, all on the live replica or its replacement
        assert answer(client, prompt) == expected
    end = time.monotonic() + REPLACE_TIMEOUT_S
    while time.monotonic() < end and len(served.engine_replicas()) < 2:
        time.sleep(1)
    served.note_processes()
    assert len(served.engine_replicas()) == 2 and busy.pid not in {p.pid for p in served.engine_replicas()}


def test_sigterm_exits_0_within_20_s_and_leaves_no_process(served):
    served.note_processes()
    started = time.monotonic()
    served.process.send_signal(signal.SIGTERM)
    status = served.process.wait(STOP_TIMEOUT_S + 10)
    took = time.monotonic() - started
    time.sleep(1)
    alive = [pid for pid in served.seen if psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie"]
    assert status == 0 and took < STOP_TIMEOUT_S, (status, took, served.process.stderr.read()[-2000:])
    assert alive == []
