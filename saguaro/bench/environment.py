"""A description of where a benchmark ran: packages, machine, threads and the git commit."""

from __future__ import annotations

import datetime
import os
import platform
import subprocess
import sys
from importlib import metadata
from pathlib import Path

PACKAGES = (
    "saguaro-ssd",
    "torch",
    "transformers",
    "tokenizers",
    "safetensors",
    "accelerate",
    "gguf",
    "numpy",
    "scipy",
    "simpy",
    "matplotlib",
    "tqdm",
    "fastapi",
    "uvicorn",
    "llama-cpp-python",
)
REPO = Path(__file__).resolve().parents[2]  # the checkout (this file is saguaro/bench/environment.py)


def package_versions() -> dict[str, str | None]:
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def _cpuinfo() -> dict:
    """CPU model and flags of interest from /proc/cpuinfo (Linux); empty elsewhere."""
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return {}
    info: dict = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key, value = key.strip(), value.strip()
        if key == "model name" and "cpu_model" not in info:
            info["cpu_model"] = value
        elif key == "flags" and "cpu_flags" not in info:
            wanted = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_int8")
            info["cpu_flags"] = [f for f in wanted if f in value.split()]
    return info


def cpu_model() -> str:
    """The CPU's model name: /proc/cpuinfo's on Linux, else what the platform module says."""
    return _cpuinfo().get("cpu_model") or platform.processor() or platform.machine()


def _memory_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 2**20, 1)
    except (OSError, ValueError, IndexError):
        pass
    return None


def git_state(repo: Path = REPO) -> dict:
    """The commit and whether the tree had local changes; None fields when git is not available."""

    def git(*args: str) -> str | None:
        try:
            out = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.SubprocessError):
            return None
        return out.stdout.strip() if out.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    status = git("status", "--porcelain", "--untracked-files=no") if commit else None
    return {"commit": commit, "dirty": bool(status) if status is not None else None}


def machine(torch_threads: int | None = None) -> dict:
    try:
        affinity = len(os.sched_getaffinity(0))
    except AttributeError:
        affinity = None
    gpu = None
    if torch_threads is not None:
        import torch

        if torch.cuda.is_available():
            gpu = torch.cuda.get_device_name(0)
    return {
        "platform": platform.platform(),
        "machine": platform.machine(),
        **_cpuinfo(),
        "logical_cpus": os.cpu_count(),
        "usable_cpus": affinity,
        "memory_gib": _memory_gib(),
        "torch_threads": torch_threads,
        "gpu": gpu,
    }


def environment(torch_threads: int | None = None) -> dict:
    return {
        "time": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "python": sys.version.split()[0],
        "packages": package_versions(),
        "machine": machine(torch_threads),
        "git": git_state(),
        "argv": sys.argv,
    }


def describe(env: dict) -> str:
    """One line for figure titles: CPU (or GPU), usable cores and torch threads."""
    m = env.get("machine", {})
    where = m.get("gpu") or m.get("cpu_model") or m.get("machine") or "unknown machine"
    cores = m.get("usable_cpus") or m.get("logical_cpus")
    threads = m.get("torch_threads")
    bits = [where]
    if cores:
        bits.append(f"{cores} core" + ("" if cores == 1 else "s"))
    if threads:
        bits.append(f"{threads} thread" + ("" if threads == 1 else "s"))
    return ", ".join(bits)
