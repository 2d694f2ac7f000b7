"""The link between the target (rank 0) and the draft worker (rank 1): one message at a time, each receive
before a deadline.

`Transport` is what the process channel (engine.ssd.channel) and the worker (engine.ssd.process) need of a link;
`Endpoint` is the one over torch.distributed. Its process group of two is made directly from a TCPStore (no
global default group, so several engines can live in one process) by a `Backend`: `process_group` unless a
test gives another (`connect` takes it as an argument).

The backend is gloo for every placement (CPU, one GPU, two or more GPUs). Messages are small (ids, outcomes,
q's support: engine.ssd.wire) and both sides encode and decode them on the host anyway, so NCCL would only add
copies to and from the GPUs on each side, need two distinct GPUs (it refuses two ranks on one), and bring a
watchdog that tears the group down when an operation stays in flight past the group's timeout (an idle
worker's receive). Over gloo the bytes go from host memory to host memory; on a CUDA side the receive
buffers are pinned, so what arrives goes on to the GPU with a non-blocking copy (engine.host).

Waits. No wait on the group is longer than the group's timeout (`link_timeout_s`; gloo's failed wait also
closes the pair, so a wait is never retried). A longer receive (the worker waits for the next batch as long as
the link is up) waits in slices: each slice ends with a message, and the target's endpoint sends a
`KeepAlive` whenever its side of the link has been quiet for a quarter of the timeout (`keep_alive`), which the
receiver drops before waiting again. A worker whose process has stopped is found by its heartbeat instead
(engine.ssd.heartbeat).

The address is an init method `tcp://host:port`; the target hosts the store, port 0 picks a free port, and
the draft connects to the same address, so it can run on another host (see engine/ssd/README.md). The store
listens on that host only (127.0.0.1 by default, never every interface unless the init method says 0.0.0.0),
and so does gloo's link when the host is a loopback address. The store has no authentication of its own, so
each run has a secret: the target posts a random challenge, the worker answers it with an HMAC keyed by the
secret (handed to it through its spawn arguments, never a command line), and the target checks the answer
before it forms the link. A timeout, a dead peer or a broken link raise DraftUnavailable; a message that does
not decode, MalformedMessage. A message crosses in at most two transfers (engine.ssd.wire).
"""

from __future__ import annotations

import datetime
import errno
import hashlib
import hmac
import ipaddress
import re
import secrets
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Protocol
from urllib.parse import urlparse

import torch
import torch.distributed as dist
from torch import Tensor

from engine import host
from engine.ssd.messages import KeepAlive, MalformedMessage, Message, decode, encode
from engine.ssd.wire import FRAME_BYTES, from_frame, rest_bytes, to_wire, unpack

TARGET_RANK, DRAFT_RANK = 0, 1


class DraftUnavailable(RuntimeError):
    """The draft worker died, hung past its deadline, or the link to it broke."""


class Transport(Protocol):
    """One side of the link."""

    broken: bool  # a send or receive failed: the stream may hold half a message

    def send(self, msg: Message, timeout_s: float) -> None:
        """Send `msg` (raises DraftUnavailable)."""

    def recv(
        self, timeout_s: float, expect_K: int | tuple[int, ...] | None = None, expect_V: int | None = None
    ) -> Message:
        """The next message, within `timeout_s` (raises DraftUnavailable or MalformedMessage)."""

    def close(self) -> None:
        """Tear the link down (safe after a fault)."""


# -- the rendezvous ---------------------------------------------------------------------------------
def parse_init_method(init_method: str) -> tuple[str, int]:
    url = urlparse(init_method)
    if url.scheme != "tcp" or not url.hostname or url.port is None:
        raise ValueError(f"init method must look like tcp://host:port (port 0 = pick a free one), got {init_method!r}")
    return url.hostname, url.port


def init_address(host: str, port: int) -> str:
    return f"tcp://{host}:{port}"


def _port_taken(host: str, port: int) -> ValueError:
    return ValueError(
        f"port {port} of {init_address(host, port)} is taken (another engine or program listens "
        f"there): choose another, e.g. --init-method {init_address(host, 0)} (port 0 = a free one)"
    )


def _address(host: str, port: int) -> tuple[socket.AddressFamily, tuple]:
    """The socket family and address `host` names (a name resolves to its first address)."""
    try:
        family, _, _, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except socket.gaierror as err:
        raise ValueError(
            f"cannot resolve the host of {init_address(host, port)} ({err.strerror}): use an address "
            f"such as {init_address('127.0.0.1', port)}"
        ) from None
    return family, address


def _listen(host: str, port: int) -> socket.socket:
    """A socket listening on host:port only (port 0: a free one); ValueError when the port is taken."""
    family, address = _address(host, port)
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the store: TIME_WAIT is no conflict
    try:
        sock.bind(address)
        sock.listen(socket.SOMAXCONN)
    except OSError as err:
        sock.close()
        if err.errno == errno.EADDRINUSE:
            raise _port_taken(host, port) from None
        if err.errno == errno.EACCES:
            raise ValueError(
                f"port {port} needs privileges this process lacks: choose a port above 1023, "
                f"or {init_address(host, 0)} for a free one"
            ) from None
        raise
    return sock


def check_port_free(init_method: str) -> None:
    """ValueError if the target could not host the rendezvous at this fixed port of its host (port 0 always can)."""
    host, port = parse_init_method(init_method)
    if port != 0:
        _listen(host, port).close()


def host_store(init_method: str, connect_s: float) -> tuple[dist.TCPStore, str]:
    """The target's side of the rendezvous: start the store, listening on the init method's host only, and post
    its challenge (`answer_challenge`); returns it and the address the draft joins."""
    host, port = parse_init_method(init_method)
    sock = _listen(host, port)
    bound = sock.getsockname()[1]
    store = dist.TCPStore(
        host,
        bound,
        2,
        True,
        timeout=datetime.timedelta(seconds=connect_s),
        wait_for_workers=False,
        master_listen_fd=sock.detach(),
    )  # the store owns the socket from here
    store.set(CHALLENGE_KEY, secrets.token_hex(16))
    return store, init_address(host, bound)


def join_store(init_method: str, connect_s: float) -> dist.TCPStore:
    """The draft's side of the rendezvous: a client of the store the target hosts."""
    host, port = parse_init_method(init_method)
    return dist.TCPStore(host, port, 2, False, timeout=datetime.timedelta(seconds=connect_s))


CHALLENGE_KEY = "saguaro/challenge"


def new_secret() -> str:
    """A run's secret, which the draft worker proves it holds when it joins."""
    return secrets.token_hex(32)


def answer_challenge(store: dist.Store, secret: str) -> str:
    """The draft's proof that it holds `secret`: an HMAC of the store's challenge (the secret never crosses)."""
    return hmac.new(secret.encode(), store.get(CHALLENGE_KEY), hashlib.sha256).hexdigest()


def check_answer(store: dist.Store, key: str, secret: str) -> bool:
    """Whether the answer the draft left at `key` proves it holds `secret`."""
    return hmac.compare_digest(store.get(key), answer_challenge(store, secret).encode())


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(_address(host, 0)[1][0]).is_loopback
    except ValueError:
        return False


# -- the link ---------------------------------------------------------------------------------------
Backend = Callable[[dist.Store, int, datetime.timedelta], dist.ProcessGroup]
KEEP_ALIVE_SHARE = 0.25  # a quiet target sends a KeepAlive after this share of the link's timeout
KEEP_ALIVE_POLL_S = 0.01  # the keep-alive thread looks at the link at most this often


def process_group(store: dist.Store, rank: int, timeout: datetime.timedelta) -> dist.ProcessGroup:
    """The process group of two that carries the messages: gloo, whatever the devices (module docstring).
    `timeout` bounds joining the group and is the longest any one wait on it may be (Endpoint)."""
    # The public constructor torch's own init_process_group/new_group use. Gloo binds the interface the host
    # name resolves to (loopback when it resolves to none), or loopback when the store is on loopback (both
    # sides are on this host: nothing need listen beyond it); GLOO_SOCKET_IFNAME picks another, as for any
    # torch.distributed job.
    host = getattr(store, "host", "")
    if host and is_loopback(host):
        options = dist.ProcessGroupGloo._Options()
        options._timeout = timeout
        options._devices = [dist.ProcessGroupGloo.create_device(hostname=host)]
        return dist.ProcessGroupGloo(store, rank, 2, options)
    return dist.ProcessGroupGloo(store, rank, 2, timeout=timeout)


def _reason(err: Exception) -> str:
    """gloo's error in one short clause: no source path, no advice paragraph (the target's warning is one line)."""
    text = re.sub(r"^\[[^\]]*\]\s*", "", str(err).strip().splitlines()[0] if str(err).strip() else "")
    return re.split(r"(?<=[.!])\s", text, maxsplit=1)[0] or type(err).__name__


class Endpoint:
    """One side of the link over a torch.distributed process group: send a message, receive one before a
    deadline. The bytes cross in host memory; `device` is where this side computes (its receive buffers are
    pinned when that is a CUDA device). One message at a time: a send or receive holds the link, so a keep-alive
    never lands inside a message. No single wait on the group is longer than `link_timeout_s`."""

    def __init__(
        self,
        group: dist.ProcessGroup,
        rank: int,
        device: torch.device,
        store: dist.Store | None = None,
        link_timeout_s: float = 300.0,
    ):
        self.group = group
        self.peer = DRAFT_RANK if rank == TARGET_RANK else TARGET_RANK
        self.device = torch.device(device)
        self.store = store  # kept alive as long as the group
        self.link_timeout_s = link_timeout_s
        self.broken = False
        self._busy = threading.Lock()  # held by a send or a receive
        self._quiet_since = time.monotonic()
        self._closing = threading.Event()
        self._keeper: threading.Thread | None = None

    # -- sending ---------------------------------------------------------------------------------
    def send(self, msg: Message, timeout_s: float) -> None:
        with self._holding(timeout_s):
            self._send(msg, timeout_s)

    def _send(self, msg: Message, timeout_s: float) -> None:
        try:
            for tensor in to_wire(encode(msg)):  # uint8 host tensors
                self._wait(self.group.send([tensor], self.peer, 0), timeout_s)
        except RuntimeError as err:
            self.broken = True
            raise DraftUnavailable(f"sending to the peer failed: {_reason(err)}") from None

    # -- receiving -------------------------------------------------------------------------------
    def recv(
        self, timeout_s: float, expect_K: int | tuple[int, ...] | None = None, expect_V: int | None = None
    ) -> Message:
        """The next message other than a KeepAlive, within `timeout_s`: one slice of at most the link's timeout at a
        time, each ended by a message (a KeepAlive starts the next slice)."""
        deadline = time.monotonic() + timeout_s
        with self._holding(timeout_s):
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    self.broken = True  # the peer still owes this message: the stream is out of step
                    raise DraftUnavailable(f"no message from the peer within {timeout_s:g} s")
                # the last slice reports the whole timeout; an earlier one, the link's (no keep-alive came)
                said = timeout_s if left <= self.link_timeout_s else self.link_timeout_s
                msg = self._recv(min(left, self.link_timeout_s), said, expect_K, expect_V)
                if not isinstance(msg, KeepAlive):
                    return msg

    def _recv(self, timeout_s: float, said_s: float, expect_K, expect_V) -> Message:
        frame = self._recv_one(FRAME_BYTES, timeout_s, said_s)
        try:
            tensors, rest = from_frame(frame)
            if rest:
                tensors += unpack(self._recv_one(rest_bytes(rest), timeout_s, said_s), rest)
            return decode(tensors, expect_K, expect_V)
        except MalformedMessage:
            self.broken = True  # the rest of the stream cannot be framed any more
            raise

    def _recv_one(self, n_bytes: int, timeout_s: float, said_s: float) -> Tensor:
        buf = host.pinned_empty((n_bytes,), torch.uint8, self.device)  # host memory (pinned beside a GPU)
        try:
            self._wait(self.group.recv([buf], self.peer, 0), timeout_s)
        except RuntimeError as err:
            self.broken = True
            raise DraftUnavailable(
                f"no message from the peer within {said_s:g} s or the link broke: {_reason(err)}"
            ) from None
        return buf

    # -- waits, keep-alives, closing -------------------------------------------------------------
    def _wait(self, work, timeout_s: float) -> None:
        work.wait(datetime.timedelta(seconds=min(timeout_s, self.link_timeout_s)))

    @contextmanager
    def _holding(self, timeout_s: float) -> Iterator[None]:
        if not self._busy.acquire(timeout=max(timeout_s, 0.0)):
            raise DraftUnavailable(f"the link stayed busy for {timeout_s:g} s")
        try:
            if self.broken:
                raise DraftUnavailable("the link broke earlier")
            yield
        finally:
            self._quiet_since = time.monotonic()
            self._busy.release()

    def keep_alive(self, quiet_s: float | None = None) -> None:
        """From now on send a KeepAlive whenever this side has neither sent nor received for `quiet_s` (default: a
        quarter of the link's timeout) and no transfer is under way, so the peer's sliced receive always gets a
        message within the link's timeout. Runs on a daemon thread until `close`."""
        quiet_s = self.link_timeout_s * KEEP_ALIVE_SHARE if quiet_s is None else quiet_s

        def run() -> None:
            while not self._closing.wait(max(quiet_s / 4, KEEP_ALIVE_POLL_S)):
                if self.broken:
                    return
                if time.monotonic() - self._quiet_since < quiet_s or not self._busy.acquire(blocking=False):
                    continue  # not quiet long enough, or a message is crossing now
                try:
                    self._send(KeepAlive(), self.link_timeout_s)
                except DraftUnavailable:
                    return  # the next exchange reports the broken link
                finally:
                    self._quiet_since = time.monotonic()
                    self._busy.release()

        self._keeper = threading.Thread(target=run, name="saguaro-keep-alive", daemon=True)
        self._keeper.start()

    def close(self) -> None:
        self._closing.set()
        if self._keeper is not None and self._keeper is not threading.current_thread():
            self._keeper.join(1.0)  # unless it is blocked in a send to a peer that is gone (then its send fails)
        try:
            self.group.shutdown()
        except (RuntimeError, AttributeError):  # already torn down by a broken peer
            pass


def connect(
    store: dist.Store, rank: int, device: torch.device, link_timeout_s: float, backend: Backend = process_group
) -> Endpoint:
    """`rank`'s side of the link over the rendezvous `store`, its group made by `backend` (process_group unless
    a test gives another) within `link_timeout_s` seconds, which also bounds every later wait on it. `device`: where
    this side computes (engine.ssd.placement)."""
    group = backend(store, rank, datetime.timedelta(seconds=link_timeout_s))
    return Endpoint(group, rank, device, store, link_timeout_s)
