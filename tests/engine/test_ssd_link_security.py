"""The draft worker's link: its store listens on the init method's host only, and a process joins only with the
run's secret."""

import psutil
import pytest

from engine.ssd.transport import answer_challenge, check_answer, check_port_free, host_store, join_store, new_secret

TIMEOUT_S = 10.0


def listening(port: int) -> list[str]:
    return [
        c.laddr.ip for c in psutil.Process().net_connections("inet") if c.status == "LISTEN" and c.laddr.port == port
    ]


def test_the_store_listens_on_loopback_only():
    store, address = host_store("tcp://127.0.0.1:0", TIMEOUT_S)
    assert listening(store.port) == ["127.0.0.1"] and address == f"tcp://127.0.0.1:{store.port}"


def test_a_taken_port_of_the_host_is_refused_before_the_store_starts():
    store, address = host_store("tcp://127.0.0.1:0", TIMEOUT_S)
    with pytest.raises(ValueError, match="is taken"):
        check_port_free(address)


def test_the_answer_of_a_worker_with_the_secret_is_accepted():
    secret = new_secret()
    store, address = host_store("tcp://127.0.0.1:0", TIMEOUT_S)
    worker = join_store(address, TIMEOUT_S)
    worker.set("joined", answer_challenge(worker, secret))
    assert check_answer(store, "joined", secret)


def test_a_process_without_the_secret_is_refused():
    store, address = host_store("tcp://127.0.0.1:0", TIMEOUT_S)
    stranger = join_store(address, TIMEOUT_S)
    stranger.set("joined", answer_challenge(stranger, new_secret()))
    assert not check_answer(store, "joined", new_secret())


def test_each_store_poses_its_own_challenge():
    secret = new_secret()
    first, _ = host_store("tcp://127.0.0.1:0", TIMEOUT_S)
    second, _ = host_store("tcp://127.0.0.1:0", TIMEOUT_S)
    assert answer_challenge(first, secret) != answer_challenge(second, secret)  # an answer cannot be replayed
