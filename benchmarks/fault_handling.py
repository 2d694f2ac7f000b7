"""Faults and user mistakes, each run for real, as one Markdown table: case, input, exit status, the first line
of stderr (the exception's line for API cases), whether a Traceback appeared, seconds taken. What it checks:
bad input and damaged files give exit 2 and one line that says what to do, API misuse one ValueError, and an
interrupted or failing SSD run leaves no process behind.

Each case runs in its own process group under a timeout and is killed with its group if it overruns.
Models: SmolLM2-135M (`smollm2-135m`) only. Faults on cached weights are made in a private cache under a
scratch folder (hard links to the real entry, the tampered file a real copy), never in ~/.cache/saguaro.

    python -m benchmarks.fault_handling [--timeout 120] [--only TEXT] > table.md
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parent.parent
MODEL = "smollm2-135m"
CLI = [sys.executable, "-m", "saguaro.cli"]
GENERATE = CLI + ["generate", "--target", MODEL, "--draft", MODEL, "--max-new-tokens", "6"]


@dataclass
class Case:
    name: str
    shown: str  # the input as a reader would type it
    argv: list[str]
    stdin: bytes | None = None
    api: bool = False  # an API call: the exception's own line is the answer, a traceback is expected
    interrupt: bool = False  # SIGINT to the process group after the first output


@dataclass
class Outcome:
    rc: int | None
    line: str
    traceback: bool
    seconds: float
    note: str = ""


def run_case(case: Case, timeout_s: float) -> Outcome:
    start = time.monotonic()
    proc = subprocess.Popen(
        case.argv,
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    note = ""
    try:
        if case.interrupt:
            out, err, note = _interrupt_after_first_output(proc, timeout_s)
        else:
            out, err = proc.communicate(case.stdin, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        note = f"killed after {timeout_s:.0f} s"
    seconds = time.monotonic() - start
    text = err.decode(errors="replace")
    lines = [ln for ln in text.splitlines() if ln.strip() and "Warning" not in ln]
    line = (lines[-1] if case.api else lines[0]) if lines else ""
    if not line and out:
        note = note or "stdout: " + out.decode(errors="replace").strip().replace("\n", " ")[:60]
    elif case.name.startswith("temperature") and out:
        note = note or "stdout: " + repr(out.decode(errors="replace").strip()[:40])
    return Outcome(proc.returncode, line, "Traceback" in text, seconds, note)


def _interrupt_after_first_output(proc: subprocess.Popen, timeout_s: float):
    """Wait for the first byte of output, SIGINT the group (as Ctrl-C in a terminal does), then check that
    every process of the group is gone a few seconds after the parent exits."""
    os.set_blocking(proc.stdout.fileno(), True)
    deadline = time.monotonic() + timeout_s
    first = proc.stdout.read(1)  # --stream prints as rounds emit
    family = {proc.pid} | {c.pid for c in psutil.Process(proc.pid).children(recursive=True)}
    os.killpg(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
    time.sleep(5)
    alive = [p for p in family if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    lines = len([ln for ln in err.decode(errors="replace").splitlines() if ln.strip()])
    note = f"{len(family)} processes in the group, {len(alive)} alive 5 s after exit; {lines} stderr line(s)"
    return first + out, err, note


def private_cache(scratch: Path, name: str) -> Path:
    """A cache folder holding hard links to the real SmolLM2 entry (the files to tamper get real copies)."""
    real = Path.home() / ".cache" / "saguaro"
    entry = next(real.glob(f"{MODEL}-*"))
    cache = scratch / name
    shutil.copytree(entry, cache / entry.name, copy_function=os.link)
    return cache / entry.name


def unlink_copy(path: Path) -> None:
    data = path.read_bytes()
    path.unlink()
    path.write_bytes(data)


def flip_byte(path: Path, offset: int) -> None:
    unlink_copy(path)
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0xFF]))


def build_cases(scratch: Path) -> list[Case]:
    weights = private_cache(scratch, "weights")
    flip_byte(weights / "model.safetensors", (weights / "model.safetensors").stat().st_size // 2)
    header = private_cache(scratch, "header")
    flip_byte(header / "model.safetensors", 20)

    folders = scratch / "folders"
    real = next((Path.home() / ".cache" / "saguaro").glob(f"{MODEL}-*"))
    bad_config = folders / "bad-config"
    shutil.copytree(real, bad_config, copy_function=os.link, ignore=shutil.ignore_patterns("bfloat16"))
    (bad_config / "config.json").unlink()
    (bad_config / "config.json").write_text('{"model_type": "llama", "hidden_size": ')
    (bad_config / "manifest.json").unlink()
    no_weights = folders / "no-weights"
    shutil.copytree(real, no_weights, copy_function=os.link, ignore=shutil.ignore_patterns("bfloat16", "*.safetensors"))
    (no_weights / "manifest.json").unlink()

    blocker = scratch / "a-file"
    blocker.write_text("not a folder")
    gguf = scratch / "truncated.gguf"
    gguf.write_bytes(
        b"GGUF" + (3).to_bytes(4, "little") + (1).to_bytes(8, "little") + (0).to_bytes(8, "little") + b"\x05\x00"
    )  # a valid start, then cut inside the first tensor's name
    jsonl = scratch / "prompts.jsonl"
    jsonl.write_bytes(b'{"prompt": "hello"}\n{"prompt": "caf\xe9"}\n')
    unguarded = scratch / "unguarded.py"
    unguarded.write_text(
        textwrap.dedent(f"""\
        import sys
        sys.path.insert(0, {str(REPO)!r})
        from engine import LLM
        llm = LLM({MODEL!r}, {MODEL!r}, strategy="ssd")
        print([o.text for o in llm.generate("Hi")])
        llm.close()
        """)
    )

    def api(code: str) -> list[str]:
        return [
            sys.executable,
            "-c",
            f"from engine import LLM, SamplingParams\nllm = LLM({MODEL!r}, strategy='ar')\n" + code,
        ]

    return [
        Case(
            "temperature 1e-40",
            "--strategy ar --temperature 1e-40",
            GENERATE + ["--strategy", "ar", "--temperature", "1e-40", "Hi"],
        ),
        Case("temperature inf", "--temperature inf", GENERATE + ["--strategy", "ar", "--temperature", "inf", "Hi"]),
        Case(
            "flipped weight byte",
            "--cache <copy> with one byte of model.safetensors flipped",
            GENERATE + ["--strategy", "ar", "--dtype", "float32", "--cache", str(weights.parent), "Hi"],
        ),
        Case(
            "flipped safetensors header byte",
            "--cache <copy> with byte 20 of model.safetensors flipped",
            GENERATE + ["--strategy", "ar", "--dtype", "float32", "--cache", str(header.parent), "Hi"],
        ),
        Case(
            "malformed config.json",
            "--target <folder with cut config.json>",
            GENERATE + ["--strategy", "ar", "--target", str(bad_config), "Hi"],
        ),
        Case(
            "model folder without weights",
            "--target <folder without *.safetensors>",
            GENERATE + ["--strategy", "ar", "--target", str(no_weights), "Hi"],
        ),
        Case(
            "unwritable cache dir",
            "--cache <path under a regular file> (root: chmod does not bind)",
            GENERATE + ["--strategy", "ar", "--cache", str(blocker / "cache"), "Hi"],
        ),
        Case(
            "non-UTF-8 prompt on argv",
            "argv b'caf\\xe9'",
            [os.fsencode(a) for a in GENERATE + ["--strategy", "ar"]] + [b"caf\xe9"],
        ),
        Case("non-UTF-8 prompt on stdin", "stdin b'caf\\xe9'", GENERATE + ["--strategy", "ar"], stdin=b"caf\xe9\n"),
        Case("--device cuda (CPU build)", "--device cuda", GENERATE + ["--strategy", "ar", "--device", "cuda", "Hi"]),
        Case("--device gpu7", "--device gpu7", GENERATE + ["--strategy", "ar", "--device", "gpu7", "Hi"]),
        Case(
            "--draft-device gpu7",
            "--strategy ssd --draft-device gpu7",
            GENERATE + ["--strategy", "ssd", "--draft-device", "gpu7", "Hi"],
        ),
        Case(
            "--budget lots", "--strategy ssd --budget lots", GENERATE + ["--strategy", "ssd", "--budget", "lots", "Hi"]
        ),
        Case(
            "max_new_tokens 2.5 (API)",
            "SamplingParams(max_new_tokens=2.5)",
            api("print([o.text for o in llm.generate('Hi', SamplingParams(max_new_tokens=2.5))])"),
            api=True,
        ),
        Case(
            "seed 2**70 (API)",
            "SamplingParams(seed=2**70)",
            api("print([o.text for o in llm.generate('Hi', SamplingParams(seed=2**70, max_new_tokens=2))])"),
            api=True,
        ),
        Case(
            "generate after close (API)",
            "llm.close(); llm.generate('Hi')",
            api("llm.close()\nllm.generate('Hi')"),
            api=True,
        ),
        Case(
            "float token ids (API)",
            "llm.generate([[1.0, 2.7, 3.2]])",
            api("print([o.text for o in llm.generate([[1.0, 2.7, 3.2]], SamplingParams(max_new_tokens=2))])"),
            api=True,
        ),
        Case(
            "truncated .gguf",
            "--target <synthetic .gguf cut in its header>",
            GENERATE + ["--strategy", "ar", "--target", str(gguf), "Hi"],
        ),
        Case(
            "non-UTF-8 JSONL prompts file",
            "--prompts-file <JSONL with b'\\xe9'>",
            GENERATE + ["--strategy", "ar", "--prompts-file", str(jsonl)],
        ),
        Case(
            "SSD worker death at start",
            "python <script building an SSD LLM without a __main__ guard>",
            [sys.executable, str(unguarded)],
        ),
        Case(
            "taken --init-method port",
            "--init-method tcp://127.0.0.1:<taken>",
            GENERATE + ["--strategy", "ssd", "--init-method", "tcp://127.0.0.1:{port}", "Hi"],
        ),
        Case(
            "Ctrl-C of generate --strategy ssd",
            "SIGINT to the process group after the first streamed text",
            CLI
            + [
                "generate",
                "--target",
                MODEL,
                "--draft",
                MODEL,
                "--strategy",
                "ssd",
                "--stream",
                "--max-new-tokens",
                "400",
                "--ignore-eos",
                "Write a long story.",
            ],
            interrupt=True,
        ),
    ]


def cell(text: str, scratch: str = "") -> str:
    if scratch:
        text = text.replace(scratch, "<scratch>")
    return text.replace("|", "\\|").replace("\n", " ")[:220]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds each case may take")
    parser.add_argument("--only", help="run only the cases whose name contains this text")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="saguaro-faults-") as tmp, socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        cases = [c for c in build_cases(Path(tmp)) if not args.only or args.only in c.name]
        print("| case | input | exit | first line of stderr (API: the exception) | traceback | s | note |")
        print("|---|---|---|---|---|---|---|")
        for case in cases:
            case.argv = [a.replace("{port}", str(port)) if isinstance(a, str) else a for a in case.argv]
            o = run_case(case, args.timeout)
            print(
                f"| {cell(case.name)} | {cell(case.shown)} | {o.rc} | {cell(o.line, tmp)} | "
                f"{'yes' if o.traceback else 'no'} | {o.seconds:.1f} | {cell(o.note, tmp)} |",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
