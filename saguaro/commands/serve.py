"""`saguaro serve`: an OpenAI-compatible HTTP server (completions, chat, SSE streaming) over AR, SD or SSD.

Once ready it prints one line, `saguaro serve: listening on http://HOST:PORT`. SIGTERM or SIGINT stops
admitting (503), lets requests in flight finish within --shutdown-timeout seconds, aborts the rest,
stops the engine (and SSD's draft worker) and exits 0. The API key comes from --api-key-file or the
SAGUARO_API_KEY environment variable (or --api-key, which other users of the host can read in `ps`).
With --replicas N the engine is replicated N times on Ray Serve behind the same API (docs/serving.md).
"""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Mapping
from pathlib import Path

from saguaro.commands import serve_replicas
from saguaro.commands.generate import (
    DEFAULT_DRAFT,
    DEFAULT_TARGET,
    add_batch_flag,
    add_model_flags,
    add_speculation_flags,
    load_llm,
    speculative_config,
)

API_KEY_VARIABLE = "SAGUARO_API_KEY"
log = logging.getLogger(__name__)


def add_parser(sub) -> argparse.ArgumentParser:
    from saguaro.cli import HelpFormatter

    p = sub.add_parser(
        "serve",
        help="serve a model over an OpenAI-compatible HTTP API",
        description=__doc__,
        formatter_class=HelpFormatter,
    )
    p.add_argument("--target", default=DEFAULT_TARGET, help="alias, model folder or .gguf file")
    p.add_argument("--draft", default=DEFAULT_DRAFT, help="alias, model folder or .gguf file (sd, ssd)")
    p.add_argument("--strategy", choices=["ar", "sd", "ssd"], default="sd")
    add_speculation_flags(p)
    add_model_flags(p)
    p.add_argument("--draft-threads", type=int, default=1, help="SSD draft worker threads (own cores on CPU)")
    p.add_argument(
        "--draft-deadline",
        type=float,
        default=30.0,
        help="seconds SSD waits for one answer of its draft worker before it falls back to SD: the "
        "outer bound of a stall (a worker process that has stopped is found by its heartbeat in "
        "about 5 s; one whose loop hangs stalls the streams this long)",
    )
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0: every interface)")
    p.add_argument("--port", type=int, default=8000, help="port to listen on (0 = a free port)")
    key = p.add_mutually_exclusive_group()
    key.add_argument(
        "--api-key-file",
        type=Path,
        help="require 'Authorization: Bearer KEY' on /v1/*, KEY being "
        f"this file's first line (default: ${API_KEY_VARIABLE} if set)",
    )
    key.add_argument("--api-key", help="as --api-key-file, the key given on the command line (visible in `ps`)")
    p.add_argument("--served-model-name", help="the model name clients ask for (default: --target)")
    add_batch_flag(p, 8, "requests decoded together (batch rows)")
    p.add_argument(
        "--max-prefill-tokens",
        type=int,
        default=2048,
        help="prompt tokens prefilled per step; a longer prompt is prefilled in chunks of this many, "
        "between the decode rounds of the running requests",
    )
    p.add_argument("--max-waiting", type=int, default=64, help="requests queued beyond free rows before 503")
    p.add_argument("--max-request-bytes", type=int, help="largest request body taken, 413 beyond it (default 2 MiB)")
    p.add_argument(
        "--shutdown-timeout",
        type=float,
        default=30.0,
        help="seconds requests in flight get to finish on SIGTERM/SIGINT",
    )
    p.add_argument("--rounds-out", type=Path, help="append per-round records (JSONL) here, for the simulator")
    serve_replicas.add_flags(p)
    return p


def api_key(args, environ: Mapping[str, str]) -> str | None:
    """The key /v1/* requires: --api-key-file's first line, --api-key, else $SAGUARO_API_KEY; None: no key."""
    if args.api_key_file is not None:
        try:
            lines = args.api_key_file.read_text(encoding="utf-8").splitlines()
        except OSError as err:
            raise ValueError(f"cannot read --api-key-file {args.api_key_file} ({err.strerror})") from None
        key = lines[0].strip() if lines else ""
        if not key:
            raise ValueError(f"--api-key-file {args.api_key_file} is empty: its first line is the key")
        return key
    if args.api_key is not None:
        log.warning(
            "--api-key shows the key to every user of this host (ps); prefer --api-key-file or $%s", API_KEY_VARIABLE
        )
        return args.api_key
    return environ.get(API_KEY_VARIABLE) or None


def placement(args):
    """Where SSD's draft worker runs and how long the target waits for it."""
    from engine.config import DraftPlacement

    if not args.draft_deadline > 0:
        raise ValueError(f"--draft-deadline must be > 0 seconds, got {args.draft_deadline}")
    return DraftPlacement(draft_threads=args.draft_threads, deadline_s=args.draft_deadline)


def run(args) -> int:
    from server import HTTPServer, ServerSettings, bind, create_app

    # Cheap checks first: a taken port or a bad flag should not wait for the models to load.
    limits = {} if args.max_request_bytes is None else {"max_request_bytes": args.max_request_bytes}
    settings = ServerSettings(served_model_name=args.served_model_name, api_key=api_key(args, os.environ), **limits)
    if not args.shutdown_timeout >= 0:
        raise ValueError(f"--shutdown-timeout must be >= 0 seconds, got {args.shutdown_timeout}")
    spec = speculative_config(args, placement(args))
    serve_replicas.check_flags(args)
    if args.replicas is not None:
        return serve_replicas.run(args, settings, spec)
    sock = bind(args.host, args.port)
    try:
        llm, aengine = _start_engine(args, spec)
    except BaseException:
        sock.close()
        raise
    app = create_app(llm, aengine, settings)
    server = HTTPServer(
        app,
        sock,
        shutdown_timeout_s=args.shutdown_timeout,
        on_ready=lambda url: print(f"saguaro serve: listening on {url}", flush=True),
    )
    server.run()
    return 0 if server.clean_exit else 1


def _start_engine(args, spec):
    from engine import AsyncLLM

    llm = load_llm(args, spec, max_prefill_tokens=args.max_prefill_tokens, max_waiting=args.max_waiting)
    try:
        return llm, AsyncLLM(llm, max_waiting=args.max_waiting, rounds_path=args.rounds_out)
    except BaseException:
        llm.close()
        raise
