"""More than one engine: engine replicas on Ray Serve behind the plain server's FastAPI app (`saguaro serve
--replicas N`).

Files: `replica` (one engine replica), `remote` (the replicas as the ingress's AsyncEngine and ServedModel),
`options` (how many replicas, routed how), `routing` (power of two choices, prefix affinity), `resources` (what
a replica asks of Ray, and the fit check), `application` (the Ray Serve deployments), `loopback` (a Serve
replica's own listener kept on loopback), `launch` (start or join Ray, serve, drain, stop). Needs the `cluster`
extra (ray[serve]); nothing here is imported by the plain server.
"""

from server.replicas.launch import ClusterSettings, Stop, serve_replicas
from server.replicas.options import ReplicaOptions, Routing
from server.replicas.resources import ReplicaResources

__all__ = ["ClusterSettings", "ReplicaOptions", "ReplicaResources", "Routing", "Stop", "serve_replicas"]
