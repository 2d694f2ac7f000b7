"""The SSD link over a fake backend (tests/engine/fake_link.py: gloo's failure rules, NCCL's watchdog): receives
end at their timeout, no wait on the group is longer than its timeout, an idle receive outlasts that timeout on
the target's keep-alives (and without them it does not), what crosses is host memory (pinned beside a GPU), and a
worker whose heartbeat stops is declared lost within its bound; the idle wait once more over real gloo."""

import threading
import time

import pytest
import torch

from engine import host
from engine.ssd.heartbeat import HeartbeatWatch, beat
from engine.ssd.messages import KeepAlive, Round, encode
from engine.ssd.transport import DRAFT_RANK, TARGET_RANK, DraftUnavailable, connect, host_store, join_store
from tests.engine.fake_link import FakeLink
from tests.engine.test_ssd_wire import _messages, _speculation

V = 50


@pytest.fixture
def link():
    """make(timeout_s, target_device, draft_device) -> (fake, target, draft) over one FakeLink; closed after."""
    made = []

    def make(timeout_s: float, target_device: str = "cpu", draft_device: str = "cpu"):
        fake = FakeLink()
        target = connect(None, TARGET_RANK, torch.device(target_device), timeout_s, fake.backend)
        draft = connect(None, DRAFT_RANK, torch.device(draft_device), timeout_s, fake.backend)
        made.extend([target, draft])
        return fake, target, draft

    yield make
    for endpoint in made:
        endpoint.close()


def same(a, b) -> bool:
    return all(torch.equal(x, y) for x, y in zip(encode(a), encode(b), strict=True))


def test_a_receive_that_gets_nothing_fails_at_its_timeout_and_breaks_the_link(link):
    _, target, draft = link(timeout_s=30.0)
    t0 = time.monotonic()
    with pytest.raises(DraftUnavailable, match="within 0.3 s"):
        draft.recv(0.3)
    assert 0.3 <= time.monotonic() - t0 < 5.0
    assert draft.broken
    with pytest.raises(DraftUnavailable, match="broke earlier"):
        draft.send(KeepAlive(), 1.0)  # a broken stream is never used again


def test_no_wait_on_the_group_is_longer_than_its_timeout(link):
    fake, target, draft = link(timeout_s=2.0)
    target.keep_alive(quiet_s=0.2)
    for msg in [m for m in _messages() if not isinstance(m, KeepAlive)]:  # a receive drops keep-alives
        target.send(msg, timeout_s=600.0)
        assert same(draft.recv(timeout_s=3600.0), msg)
    assert fake.waits_s and max(fake.waits_s) <= fake.group_timeout_s == 2.0


def test_an_idle_receive_outlasts_the_link_timeout_on_the_targets_keep_alives(link):
    fake, target, draft = link(timeout_s=0.4)
    target.keep_alive()  # a quarter of the link's timeout: 0.1 s
    got: list = []
    receiver = threading.Thread(target=lambda: got.append(draft.recv(timeout_s=60.0)))
    receiver.start()
    time.sleep(1.5)  # idle for almost four link timeouts
    sent = Round(1, [0], [3], [True], 1.0, [], K=2, V=V)
    target.send(sent, timeout_s=1.0)
    receiver.join(10.0)
    assert len(got) == 1 and same(got[0], sent)  # the keep-alives were dropped on the way
    assert not draft.broken and not fake.closed.is_set()
    assert max(fake.waits_s) <= 0.4


def test_without_keep_alives_an_idle_receive_fails_at_the_link_timeout(link):
    _, target, draft = link(timeout_s=0.4)
    t0 = time.monotonic()
    with pytest.raises(DraftUnavailable, match="within 0.4 s"):
        draft.recv(timeout_s=60.0)
    assert time.monotonic() - t0 < 5.0


def test_keep_alives_never_land_inside_a_message(link):
    _, target, draft = link(timeout_s=5.0)
    target.keep_alive(quiet_s=0.0)  # a keep-alive whenever the link is free
    big = _speculation(3, 0)  # dense q: two transfers
    for _ in range(20):
        target.send(big, timeout_s=5.0)
        assert same(draft.recv(timeout_s=5.0), big)


def test_what_crosses_is_host_memory_and_a_gpu_side_receives_into_pinned_buffers(link, monkeypatch):
    asked: list[torch.device] = []

    def pinned_empty(shape, dtype, device):  # on a CPU-only machine: record the device, hand out plain memory
        asked.append(torch.device(device))
        return torch.empty(shape, dtype=dtype)

    monkeypatch.setattr(host, "pinned_empty", pinned_empty)
    fake, target, draft = link(timeout_s=5.0, target_device="cuda:0")  # nothing here touches CUDA
    answer = _speculation(2, 0)
    draft.send(answer, timeout_s=5.0)
    got = target.recv(timeout_s=5.0)
    assert same(got, answer)
    assert asked and set(asked) == {torch.device("cuda:0")}  # every receive buffer of the GPU side: pinned
    assert all(t.device.type == "cpu" and t.dtype == torch.uint8 for t in fake.handed)
    assert got.tokens.device.type == "cpu" and got.q.values.device.type == "cpu"


def test_a_beating_worker_is_never_declared_lost_and_a_stopped_one_is_within_its_bound():
    store, _ = host_store("tcp://127.0.0.1:0", 30.0)
    lost: list[tuple[float, str]] = []
    stop = beat(store, every_s=0.05)
    watch = HeartbeatWatch(store, lambda reason: lost.append((time.monotonic(), reason)), every_s=0.05, lost_s=0.5)
    try:
        time.sleep(1.5)
        assert lost == []  # three lost_s of beats
        stopped = time.monotonic()
        stop.set()
        deadline = stopped + 10.0
        while not lost and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        watch.stop()
    assert len(lost) == 1 and "no heartbeat" in lost[0][1]
    assert lost[0][0] - stopped < 0.5 + 0.05 + 2.0  # lost_s + one period, with room for a loaded machine


def test_an_idle_receive_outlasts_the_link_timeout_over_real_gloo():
    store, address = host_store("tcp://127.0.0.1:0", 30.0)
    got: list = []

    def worker():
        peer = connect(join_store(address, 30.0), DRAFT_RANK, torch.device("cpu"), 0.5)
        try:
            got.append(peer.recv(timeout_s=30.0))
        except DraftUnavailable as err:
            got.append(err)
        finally:
            peer.close()

    receiver = threading.Thread(target=worker)
    receiver.start()
    target = connect(store, TARGET_RANK, torch.device("cpu"), 0.5)
    try:
        target.keep_alive()
        time.sleep(2.0)  # four link timeouts
        sent = Round(1, [0], [3], [True], 1.0, [], K=2, V=V)
        target.send(sent, timeout_s=0.5)
        receiver.join(30.0)
    finally:
        target.close()
    assert len(got) == 1 and not isinstance(got[0], Exception) and same(got[0], sent)
