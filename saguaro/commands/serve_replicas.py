"""`saguaro serve --replicas N`: the same server, its engine replicated N times on Ray Serve (server.replicas).

Without --address a local Ray starts on this machine (every listener on loopback) and stops on exit; with it the
replicas join an existing Ray cluster. Each replica takes the cores or GPUs that `--strategy`, `--device`,
`--threads` and `--draft-threads` say (server.replicas.resources); N replicas that do not fit are refused before
any model loads.
"""

from __future__ import annotations

import argparse
import copy
import functools

from saguaro.commands.generate import load_llm

ROUTINGS = ("pow2", "prefix")  # server.replicas.options.Routing (not imported here: --help needs no server)


def add_flags(p: argparse.ArgumentParser) -> None:
    group = p.add_argument_group("more than one engine (Ray Serve; the 'cluster' extra)")
    group.add_argument(
        "--replicas",
        type=int,
        metavar="N",
        help="serve N engine replicas on Ray Serve (default: one engine in this process, no Ray)",
    )
    group.add_argument(
        "--address", help="join this Ray cluster (e.g. auto or HOST:6379) instead of starting a local Ray"
    )
    group.add_argument(
        "--routing",
        choices=ROUTINGS,
        default=ROUTINGS[0],
        help="pow2: the less busy of two replicas; prefix: prompts sharing their first "
        "--prefix-tokens tokens go to one replica while it is within --load-bound requests of "
        "the least busy",
    )
    group.add_argument(
        "--prefix-tokens",
        type=int,
        metavar="N",
        help="--routing prefix: leading tokens that make a shared prefix "
        "(default: server.replicas.options.PREFIX_TOKENS, 32)",
    )
    group.add_argument(
        "--load-bound",
        type=int,
        metavar="N",
        help="--routing prefix: requests in flight a prefix's replica may have beyond the least busy "
        "(default: server.replicas.options.LOAD_BOUND, 4)",
    )
    group.add_argument("--ray-cpus", type=int, metavar="N", help="CPUs of the local Ray (default: this machine's)")


def check_flags(args) -> None:
    """The replica flags make sense only with --replicas."""
    if args.replicas is None:
        given = [
            flag
            for flag, value in (
                ("--address", args.address),
                ("--ray-cpus", args.ray_cpus),
                ("--prefix-tokens", args.prefix_tokens),
                ("--load-bound", args.load_bound),
            )
            if value is not None
        ]
        if given:
            raise ValueError(f"{' and '.join(given)} need --replicas N")


def engine_builder(args, spec, threads: int):
    """What each replica calls to build its engine: the command's own load_llm, with the replica's threads."""
    replica_args = copy.copy(args)
    replica_args.threads = args.threads or threads
    for name in ("_run", "api_key", "api_key_file"):  # not needed where the engine runs
        if hasattr(replica_args, name):
            delattr(replica_args, name)
    return functools.partial(
        load_llm, replica_args, spec, max_prefill_tokens=args.max_prefill_tokens, max_waiting=args.max_waiting
    )


def run(args, settings, spec) -> int:
    from server.replicas import ClusterSettings, ReplicaOptions, ReplicaResources, serve_replicas

    resources = ReplicaResources.for_strategy(args.strategy, args.device, args.threads, args.draft_threads)
    tuning = {name: getattr(args, name) for name in ("prefix_tokens", "load_bound") if getattr(args, name) is not None}
    options = ReplicaOptions(
        replicas=args.replicas,
        resources=resources,
        routing=args.routing,
        batch=args.max_num_seqs,
        max_waiting=args.max_waiting,
        **tuning,
    )
    cluster = ClusterSettings(
        host=args.host,
        port=args.port,
        address=args.address,
        num_cpus=args.ray_cpus,
        shutdown_timeout_s=args.shutdown_timeout,
    )
    return serve_replicas(
        engine_builder(args, spec, resources.threads),
        options,
        settings,
        cluster,
        on_ready=lambda url: print(f"saguaro serve: listening on {url} ({args.replicas} replicas)", flush=True),
    )
