"""Run the replicas' application: start a local Ray (or join a cluster), deploy, serve until a signal, then stop
everything this process started.

On one machine a local Ray starts with this process and stops with it; all its listeners (GCS, raylets, workers,
agents) bind the loopback interface: Ray's own single-host mode (RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0), with no
dashboard and a small object store (server.replicas.loopback keeps Serve's replicas there too). With `address`
the application joins an existing cluster and, on exit, deletes only itself. SIGTERM or SIGINT drains the
ingress (503 to new requests, those in flight get `shutdown_timeout_s`), then the application and the local Ray
go: exit status 0.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass

from engine import LLM
from server.context import ServerSettings
from server.replicas.loopback import SINGLE_HOST_VARIABLE

log = logging.getLogger("server")

OBJECT_STORE_BYTES = 256 * 2**20  # chunks are small; Ray's default (30% of RAM) would reserve GiBs of /dev/shm
NAMESPACE = "saguaro"


@dataclass(frozen=True)
class ClusterSettings:
    """Where the application runs and listens.

    address      an existing Ray cluster to join ("auto", "ray://...", host:port); None: start a local Ray
    host, port   the HTTP listener (Ray Serve's proxy): loopback unless told otherwise
    num_cpus     CPUs of a local Ray (None: this machine's)
    """

    host: str = "127.0.0.1"
    port: int = 8000
    address: str | None = None
    num_cpus: int | None = None
    shutdown_timeout_s: float = 30.0

    def __post_init__(self) -> None:
        if not 1 <= self.port <= 65535:
            raise ValueError(
                f"--port must be in 1..65535 with --replicas (Ray Serve's proxy needs a port), got {self.port}"
            )
        if not self.shutdown_timeout_s >= 0:
            raise ValueError(f"--shutdown-timeout must be >= 0 seconds, got {self.shutdown_timeout_s}")


def loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def start_ray(cluster: ClusterSettings) -> bool:
    """Connect to Ray: join `cluster.address`, or start a local Ray bound to loopback. True when started here."""
    if cluster.address is None:
        if "ray" in sys.modules and os.environ.get(SINGLE_HOST_VARIABLE) != "0":
            raise ValueError(
                f"ray was imported before the local Ray started, so its node would listen on every "
                f"interface: set {SINGLE_HOST_VARIABLE}=0 before importing ray, or import it later"
            )
        os.environ[SINGLE_HOST_VARIABLE] = "0"  # read when ray is imported, and by the processes it starts
    import ray

    logging.getLogger("ray.serve").setLevel(logging.WARNING)  # Serve's progress lines are not ours to show
    if cluster.address is not None:
        ray.init(address=cluster.address, namespace=NAMESPACE, logging_level=logging.ERROR, log_to_driver=False)
        return False
    ray.init(
        num_cpus=cluster.num_cpus,
        include_dashboard=False,
        namespace=NAMESPACE,
        logging_level=logging.ERROR,
        object_store_memory=OBJECT_STORE_BYTES,
        log_to_driver=False,
    )
    return True


def node_resources() -> list[dict[str, float]]:
    import ray

    return [node["Resources"] for node in ray.nodes() if node.get("Alive")]


class Stop:
    """Set by SIGTERM / SIGINT (or `set()` from another thread)."""

    def __init__(self) -> None:
        self.event = threading.Event()

    def install(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda number, _frame: self._signalled(number))

    def _signalled(self, number: int) -> None:
        log.info("got %s", signal.Signals(number).name)
        self.event.set()

    def set(self) -> None:
        self.event.set()

    def wait(self) -> None:
        while not self.event.wait(0.5):  # wakes now and then so that signals are handled promptly
            pass


def serve_replicas(
    build: Callable[[], LLM],
    options,
    settings: ServerSettings | None = None,
    cluster: ClusterSettings | None = None,
    on_ready: Callable[[str], None] | None = None,
    stop: Stop | None = None,
) -> int:
    """Serve `options.replicas` engines built by `build()` (picklable: it runs in each replica) on Ray Serve until
    SIGTERM / SIGINT (or `stop`), then stop what was started. Returns the exit status (0)."""
    from server.replicas.options import ReplicaOptions
    from server.replicas.resources import check_fit

    if not isinstance(options, ReplicaOptions):
        raise ValueError("options must be a server.replicas.ReplicaOptions")
    settings = settings or ServerSettings()
    cluster = cluster or ClusterSettings()
    if cluster.address is None and not loopback(cluster.host):
        log.warning("the HTTP listener binds %s; the local Ray's own ports stay on loopback", cluster.host)
    stop = stop or Stop()
    started = start_ray(cluster)
    try:
        check_fit(options.replicas, options.resources, node_resources())
        if threading.current_thread() is threading.main_thread():  # signals reach only the main thread
            stop.install()
        url = _deploy(build, options, settings, cluster)
        if on_ready is not None:
            on_ready(url)
        stop.wait()
        _drain(cluster.shutdown_timeout_s)
    finally:
        _stop(started)
    return 0


def _deploy(build, options, settings: ServerSettings, cluster: ClusterSettings) -> str:
    from ray import serve
    from ray.serve.config import HTTPOptions

    from server.replicas.application import APP_NAME, application

    serve.start(http_options=HTTPOptions(host=cluster.host, port=cluster.port))
    try:
        serve.run(application(build, options, settings), name=APP_NAME, route_prefix="/")
    except RuntimeError as err:  # Ray Serve's own words say only that the deployment failed
        raise ReplicasFailed(f"the replicas did not start: {_why_not_started(err)}") from None
    host = f"[{cluster.host}]" if ":" in cluster.host else cluster.host
    return f"http://{host}:{cluster.port}"


class ReplicasFailed(RuntimeError):
    """The application did not start; the message is one line (the CLI prints it as is, exit status 1)."""

    one_line = True


def _why_not_started(err: RuntimeError) -> str:
    """The last line of the first deployment error Ray Serve recorded (a replica's exception), else `err`."""
    from ray import serve

    from server.replicas.application import APP_NAME

    try:
        deployments = serve.status().applications[APP_NAME].deployments.values()
    except Exception:  # noqa: BLE001  the controller is gone too: Ray's own words will do
        return str(err)
    for deployment in deployments:
        lines = [line.strip() for line in (deployment.message or "").splitlines() if line.strip()]
        if lines:
            return lines[-1]
    return str(err)


def _drain(timeout_s: float) -> None:
    from ray import serve

    from server.replicas.application import APP_NAME, INGRESS

    try:
        left = (
            serve.get_deployment_handle(INGRESS, app_name=APP_NAME)
            .drain.remote(timeout_s)
            .result(timeout_s=timeout_s + 10)
        )
        if left:
            log.warning("%d requests still in flight after %.0f s: they are cut", left, timeout_s)
    except Exception as err:  # noqa: BLE001  the ingress is gone already: nothing to drain
        log.warning("could not drain the ingress: %s", err)


def _stop(started: bool) -> None:
    import ray
    from ray import serve

    from server.replicas.application import APP_NAME

    try:
        if started:
            serve.shutdown()
        else:
            serve.delete(APP_NAME)
    finally:
        ray.shutdown()  # a local Ray stops with this process; a joined cluster is only disconnected
