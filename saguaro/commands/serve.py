"""`saguaro serve`: an OpenAI-compatible HTTP server (completions, chat, SSE streaming) over AR, SD or SSD.

Once ready it prints one line, `saguaro serve: listening on http://HOST:PORT`. SIGTERM or SIGINT stops
admitting (503), lets requests in flight finish within --shutdown-timeout seconds, aborts the rest,
stops the engine (and SSD's draft worker) and exits 0.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from saguaro.commands.generate import (DEFAULT_DRAFT, DEFAULT_TARGET, add_batch_flag, add_model_flags,
                                      add_speculation_flags, load_llm, speculative_config)


def add_parser(sub) -> argparse.ArgumentParser:
    from saguaro.cli import HelpFormatter

    p = sub.add_parser("serve", help="serve a model over an OpenAI-compatible HTTP API", description=__doc__,
                       formatter_class=HelpFormatter)
    p.add_argument("--target", default=DEFAULT_TARGET, help="alias, model folder or .gguf file")
    p.add_argument("--draft", default=DEFAULT_DRAFT, help="alias, model folder or .gguf file (sd, ssd)")
    p.add_argument("--strategy", choices=["ar", "sd", "ssd"], default="sd")
    add_speculation_flags(p)
    add_model_flags(p)
    p.add_argument("--draft-threads", type=int, default=1, help="SSD draft worker threads (own cores on CPU)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0: every interface)")
    p.add_argument("--port", type=int, default=8000, help="port to listen on (0 = a free port)")
    p.add_argument("--api-key", help="require 'Authorization: Bearer KEY' on /v1/*")
    p.add_argument("--served-model-name", help="the model name clients ask for (default: --target)")
    add_batch_flag(p, 8, "requests decoded together (batch rows)")
    p.add_argument("--max-prefill-tokens", type=int, default=2048, help="prompt tokens prefilled per step")
    p.add_argument("--max-waiting", type=int, default=64, help="requests queued before answering 503")
    p.add_argument("--shutdown-timeout", type=float, default=30.0,
                   help="seconds requests in flight get to finish on SIGTERM/SIGINT")
    p.add_argument("--rounds-out", type=Path, help="append per-round records (JSONL) here, for the simulator")
    return p


def run(args) -> int:
    from server import HTTPServer, ServerSettings, bind, create_app

    # Cheap checks first: a taken port or a bad flag should not wait for the models to load.
    settings = ServerSettings(served_model_name=args.served_model_name, api_key=args.api_key)
    if not args.shutdown_timeout >= 0:
        raise ValueError(f"--shutdown-timeout must be >= 0 seconds, got {args.shutdown_timeout}")
    sock = bind(args.host, args.port)
    try:
        llm, aengine = _start_engine(args)
    except BaseException:
        sock.close()
        raise
    app = create_app(llm, aengine, settings)
    server = HTTPServer(app, sock, shutdown_timeout_s=args.shutdown_timeout,
                        on_ready=lambda url: print(f"saguaro serve: listening on {url}", flush=True))
    server.run()
    return 0 if server.clean_exit else 1


def _start_engine(args):
    from engine import AsyncLLM
    from engine.config import DraftPlacement

    spec = speculative_config(args, DraftPlacement(draft_threads=args.draft_threads))
    llm = load_llm(args, spec, max_prefill_tokens=args.max_prefill_tokens, max_waiting=args.max_waiting)
    try:
        return llm, AsyncLLM(llm, max_waiting=args.max_waiting, rounds_path=args.rounds_out)
    except BaseException:
        llm.close()
        raise
