"""`saguaro models`: provision the real models from their PyPI data wheels, list them, verify them.

  saguaro models provision [--which default|smoke|all|ALIAS | --gguf FILE] [--cache DIR] [--rebuild]
  saguaro models list [--cache DIR]
  saguaro models verify [--cache DIR]
  saguaro models clean [--cache DIR]
  saguaro models hit-tables RUN_DIR... [--keep OLD_TABLE] [--out simulator/data/hit_tables.json] [--markdown T.md]

The cache is --cache, else $SAGUARO_CACHE, else ~/.cache/saguaro. `provision` rebuilds a damaged
entry; `clean` removes temp folders left by interrupted builds (provision does too). `hit-tables` builds the
simulator's shipped hit tables from SD bench runs (saguaro/calibration/hit_tables.py; no torch).
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

# Kept here, not imported, so that building the parser never imports torch (engine/__init__ does);
# tests/engine/test_provision.py checks these against engine.loading.provision.
GROUP_CHOICES = ("default", "smoke", "all")
ALIAS_CHOICES = ("qwen-coder-1.5b", "qwen-coder-0.5b", "smollm2-135m")


def add_parser(subparsers) -> argparse.ArgumentParser:
    from saguaro.cli import HelpFormatter

    p = subparsers.add_parser(
        "models",
        help="provision, list and verify the real models",
        description=__doc__,
        formatter_class=HelpFormatter,
    )
    actions = p.add_subparsers(dest="models_action", required=True, metavar="ACTION")
    prov = actions.add_parser(
        "provision", help="assemble, verify and convert models into the cache", formatter_class=HelpFormatter
    )
    prov.add_argument(
        "--which",
        choices=GROUP_CHOICES + ALIAS_CHOICES,
        default="default",
        help="default = the Qwen-Coder 1.5B/0.5B pair, smoke = SmolLM2-135M",
    )
    prov.add_argument(
        "--gguf",
        type=Path,
        metavar="FILE",
        help="convert (or repair the cache entry of) a local .gguf file instead of --which",
    )
    prov.add_argument("--rebuild", action="store_true", help="convert again even if the cache is valid")
    prov.add_argument(
        "--lowbit",
        choices=["int4", "int8"],
        help="build the low-bit form straight from the GGUF instead of the float32 one (int4: the "
        "GGUF's 4-bit blocks kept as int4 group-32, other layers int8; for --target-quant / "
        "--draft-quant); no float32 copy is written",
    )
    prov.add_argument(
        "--group-size",
        type=int,
        choices=[32, 64, 128],
        default=32,
        help="int4 group size of --lowbit (32 keeps Q4_K blocks exactly)",
    )
    actions.add_parser("list", help="the model aliases, whether provisioned, and where", formatter_class=HelpFormatter)
    actions.add_parser("verify", help="re-hash every cached file against its manifest", formatter_class=HelpFormatter)
    actions.add_parser("clean", help="remove temp folders left by interrupted builds", formatter_class=HelpFormatter)
    for action in actions.choices.values():
        action.add_argument(
            "--cache",
            type=Path,
            metavar="DIR",
            help="model cache folder (default: $SAGUARO_CACHE, else ~/.cache/saguaro)",
        )
    _add_hit_tables(actions)
    return p


def _add_hit_tables(actions) -> None:
    from saguaro.cli import HelpFormatter

    hits = actions.add_parser(
        "hit-tables",
        formatter_class=HelpFormatter,
        help="build the simulator's hit tables from SD bench runs (where each bonus stood among the draft's guesses)",
        description="Pool SD (or SSD) `saguaro bench` run folders into the hit table the simulator ships: one entry "
        "per (prompt set, T, C) and per task; a later run replaces an earlier one's rounds of the same "
        "prompt.",
    )
    hits.add_argument("runs", nargs="+", type=Path, help="saguaro bench run folders")
    hits.add_argument("--keep", type=Path, help="an existing table whose entries the runs do not measure are kept")
    hits.add_argument(
        "--out",
        type=Path,
        help="where the table goes (default: the simulator's shipped simulator/data/hit_tables.json)",
    )
    hits.add_argument("--markdown", type=Path, help="also write the per-entry Markdown table here")


def run(args: argparse.Namespace) -> int:
    if args.models_action == "hit-tables":
        return _hit_tables(args)
    from engine.loading import model_cache, provision

    root = model_cache.resolve_cache_root(args.cache, os.environ)
    if args.models_action == "provision":
        _clean(model_cache, root, quiet=True)
        if args.lowbit is not None:
            return _provision_lowbit(provision, root, args)
        if args.gguf is not None:
            return _provision_gguf(provision, root, args.gguf, args.rebuild)
        return _provision(provision, root, args.which, args.rebuild)
    if args.models_action == "list":
        return _list(provision, model_cache, root)
    if args.models_action == "clean":
        return _clean(model_cache, root, quiet=False)
    return _verify(provision, model_cache, root)


def _gib(size: int) -> str:
    return f"{size / 2**30:.2f} GiB" if size >= 2**30 else f"{size / 2**20:.1f} MiB"


def _clean(model_cache, root: Path, *, quiet: bool) -> int:
    if not root.is_dir() or not os.access(root, os.W_OK):
        if not quiet:
            print(f"nothing to clean in {root}" if not root.is_dir() else f"{root} is not writable")
        return 0
    from engine.loading.leftovers import clean_leftovers

    removed, busy = clean_leftovers(root)
    for leftover in removed:
        print(f"removed {leftover.path} ({_gib(leftover.size)}) left by an interrupted build")
    for leftover in busy:
        print(f"kept    {leftover.path}: a build of {leftover.key} is running")
    if not quiet and not removed and not busy:
        print(f"no leftovers in {root}")
    return 0


def _provision_gguf(provision, root: Path, gguf: Path, rebuild: bool) -> int:
    if not gguf.is_file() or gguf.suffix != ".gguf":
        raise ValueError(f"--gguf {gguf}: expected an existing .gguf file")
    result = provision.provision_gguf_file(gguf, root, rebuild=rebuild)
    _report(result.name, result)
    return 0


def _report(alias: str, result) -> None:
    if result.reused:
        print(f"{alias}: already provisioned in {result.folder}")
    else:
        print(
            f"{alias}: assemble+hash {result.assemble_s:.1f} s, convert {result.convert_s:.1f} s, "
            f"hash+manifest {result.manifest_s:.1f} s -> {result.folder}"
        )


def _provision_lowbit(provision, root: Path, args: argparse.Namespace) -> int:
    """The low-bit entries (engine.loading.lowbit_cache), built tensor by tensor from each GGUF."""
    import time

    from engine.loading import lowbit_cache

    models = [args.gguf] if args.gguf is not None else list(provision.GROUPS.get(args.which, (args.which,)))
    for model in models:
        if args.gguf is None:
            provision.locate_parts(provision.PACKAGED[model])  # every missing package named before minutes pass
    for model in models:
        t0 = time.perf_counter()
        folder = lowbit_cache.provision_lowbit(
            model, root, lowbit=args.lowbit, group_size=args.group_size, rebuild=args.rebuild
        )
        print(f"{model}: {args.lowbit} (group {args.group_size}) in {folder} ({time.perf_counter() - t0:.1f} s)")
    return 0


def _provision(provision, root: Path, which: str, rebuild: bool) -> int:
    aliases = provision.GROUPS.get(which, (which,))
    for alias in aliases:  # every missing package reported before any minutes are spent
        provision.locate_parts(provision.PACKAGED[alias])
    for alias in aliases:
        _report(alias, provision.provision(alias, root, rebuild=rebuild))
    if provision.DEFAULT_TARGET in aliases and provision.DEFAULT_DRAFT in aliases:
        from engine.loading.vocabulary import check_compatible, vocabulary

        target = root / provision.PACKAGED[provision.DEFAULT_TARGET].key
        check_compatible(target, root / provision.PACKAGED[provision.DEFAULT_DRAFT].key)
        print(f"target and draft share one vocabulary ({vocabulary(target).logits} ids)")
    return 0


def _state(provision, folder: Path) -> str:
    """ready / not provisioned / DAMAGED with the command that repairs it (re-hashes changed files)."""
    if not folder.exists():
        return "not provisioned"
    if provision.cache_ready(folder):
        return "ready"
    return f"DAMAGED (repair: {provision.repair_command(folder)})"


def _list(provision, model_cache, root: Path) -> int:
    print(f"cache: {root}")
    for alias, packaged in provision.PACKAGED.items():
        folder = root / packaged.key
        try:
            provision.locate_parts(packaged)
            packages = "installed"
        except provision.ProvisioningError:
            packages = f"missing ({packaged.install_command})"
        print(f"{alias:16} {_state(provision, folder):16} {folder}\n{'':16} {packaged.title}; packages {packages}")
    known = {p.key for p in provision.PACKAGED.values()}
    for folder in model_cache.list_folders(root):
        if folder.name not in known:
            print(f"{'(local gguf)':16} {_state(provision, folder):16} {folder}")
    from engine.loading.leftovers import find_leftovers

    for leftover in find_leftovers(root):
        print(
            f"{'(leftover)':16} {_gib(leftover.size):16} {leftover.path}: temp folder of an interrupted "
            "build; `saguaro models clean` removes it"
        )
    return 0


def _verify(provision, model_cache, root: Path) -> int:
    folders = model_cache.list_folders(root)
    if not folders:
        print(f"nothing provisioned in {root}")
        return 0
    repairs = []
    for folder in folders:
        start = time.perf_counter()
        try:
            model_cache.check_folder(folder, verify=True)
        except model_cache.CorruptCacheError as err:
            repairs.append(provision.repair_command(folder))
            print(f"FAILED {folder}: {err}; repair: {repairs[-1]}")
            continue
        print(f"ok     {folder} ({time.perf_counter() - start:.1f} s)")
    if repairs:
        raise model_cache.CorruptCacheError(
            f"{len(repairs)} cache folder(s) failed verification; repair with: {'; '.join(repairs)}"
        )
    return 0


def _hit_tables(args: argparse.Namespace) -> int:
    from saguaro.calibration.hit_tables import write
    from simulator.hits import TABLES

    out = args.out or TABLES
    table = write(args.runs, out, keep=args.keep, markdown_out=args.markdown)
    for e in table["entries"]:
        m = e["model"]
        fit = m.get("power_law") or {}
        print(
            f"{e['workload']:<32} T={e['temperature']:<4g} C={e['C']:<4g} prompts={e.get('prompts', '-'):<3} "
            f"rounds={e.get('rounds', '-'):<5} outcomes={m['outcomes']:<5} alpha={m['alpha']} r={fit.get('r')} "
            f"r_ci95={fit.get('r_ci95')} scale={fit.get('scale')}"
        )
    print(f"wrote {out}")
    if args.markdown:
        print(f"wrote {args.markdown}")
    return 0
