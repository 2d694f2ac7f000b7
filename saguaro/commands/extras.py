"""The optional dependency groups of pyproject.toml (extras), and the one line that says which to install.

A core install (`pip install saguaro-ssd`) runs `saguaro theory`, `simulate`, `plan` and `report` without
torch. A command that imports a module of a missing extra fails with ModuleNotFoundError; the CLI turns it
into one line naming the extra and the pip command (exit status 2) through `missing_extra_message`.
"""

from __future__ import annotations

import importlib.util

from saguaro import DISTRIBUTION

# Each extra and the modules (import names) it installs that this project imports; keep in step with
# [project.optional-dependencies] in pyproject.toml (tests/saguaro/test_packaging.py checks it).
EXTRAS: dict[str, tuple[str, ...]] = {
    "engine": (
        "torch",
        "transformers",
        "tokenizers",
        "safetensors",
        "gguf",
        "accelerate",
        "tqdm",
        "filelock",
        "psutil",
    ),
    # starlette and pydantic come with fastapi; the server imports them directly.
    "serve": ("fastapi", "uvicorn", "prometheus_client", "httpx", "starlette", "pydantic"),
    "cluster": ("ray",),
    "llamacpp": ("llama_cpp",),
}


def install_command(extra: str) -> str:
    """The pip line that installs `extra`, quoted for a POSIX shell."""
    if extra not in EXTRAS:
        raise ValueError(f"unknown extra {extra!r}; choose from {', '.join(EXTRAS)}")
    return f"pip install '{DISTRIBUTION}[{extra}]'"


def extra_of(module: str) -> str | None:
    """The extra that installs top-level module `module` (e.g. "torch" -> "engine"); None for any other."""
    top = module.partition(".")[0]
    return next((extra for extra, modules in EXTRAS.items() if top in modules), None)


def installed(module: str) -> bool:
    """Whether top-level module `module` can be found (without importing it)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a finder that refuses it, or a half-imported module
        return False


def missing_extra_message(err: BaseException) -> str | None:
    """For an import that failed because a module of an extra is not installed: one line naming the module,
    the extra and the pip command. None for anything else, including a module that is installed but fails
    inside (a broken install), whose own error says more."""
    if not isinstance(err, ModuleNotFoundError) or not err.name:
        return None
    module = err.name.partition(".")[0]
    extra = extra_of(module)
    if extra is None or installed(module):
        return None
    return f"this command needs the '{extra}' extra ({module} is not installed): {install_command(extra)}"
