"""Keep a Ray Serve replica's own gRPC listener on loopback when Ray runs on one host.

Ray binds its node to the loopback interface in single-host mode (RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0: GCS,
raylet, workers, agents, Serve's proxy), but a Serve replica (ray 2.60, ray/serve/_private/replica.py) opens its
inter-deployment gRPC server on "[::]:0", every interface, whatever the mode. The deployments call
`keep_serve_on_loopback()` in their constructors, which Ray runs before it opens that server: in single-host
mode the server then binds 127.0.0.1, where the other processes of the node reach it anyway. A joined cluster is
left as Ray made it (its replicas talk across hosts). tests/server/test_replicas.py checks every listener.
"""

from __future__ import annotations

import os

SINGLE_HOST_VARIABLE = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"  # "0": Ray binds its node to the loopback interface
EVERY_INTERFACE = "[::]:"


def single_host() -> bool:
    """Whether this process belongs to a Ray started in single-host mode (the variable is inherited)."""
    return os.environ.get(SINGLE_HOST_VARIABLE) == "0"


def keep_serve_on_loopback() -> None:
    if not single_host():
        return
    from ray.serve._private import replica

    add_port = replica.add_port_to_grpc_server
    if getattr(add_port, "loopback", False):
        return

    def add_port_on_loopback(server, address: str):
        if address.startswith(EVERY_INTERFACE):
            address = "127.0.0.1:" + address.removeprefix(EVERY_INTERFACE)
        return add_port(server, address)

    add_port_on_loopback.loopback = True
    replica.add_port_to_grpc_server = add_port_on_loopback
