"""`saguaro serve`: an OpenAI-compatible HTTP server over the engine's AsyncLLM.

Files: `protocol` (request bodies), `translate` (request -> prompt ids and SamplingParams),
`generation` (one request through the engine: SSE stream or one response), `responses` (OpenAI
response bodies), `token_bytes` (a token's text and raw bytes), `errors` (OpenAI error JSON), `metrics`
(Prometheus), `app` (the routes), `http_server` (uvicorn, signals, graceful drain), `engine_api` (what the
server needs from the engine).
"""

from server.app import create_app
from server.context import ServerSettings
from server.http_server import HTTPServer, bind

__all__ = ["HTTPServer", "ServerSettings", "bind", "create_app"]
