"""More than one engine: engine replicas on Ray Serve behind the plain server's FastAPI app (`saguaro serve
--replicas N`).

Files: `replica` (one engine replica), `remote` (the replicas as the ingress's AsyncEngine and ServedModel),
`routing` (power of two choices, prefix affinity), `resources` (what a replica asks of Ray, and the fit check),
`application` (the Ray Serve deployments), `launch` (start or join Ray, serve, drain, stop). Needs the `cluster`
extra (ray[serve]); nothing here is imported by the plain server.
"""

from server.replicas.launch import ClusterSettings, Stop, serve_replicas

__all__ = ["ClusterSettings", "Stop", "serve_replicas"]
