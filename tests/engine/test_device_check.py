"""A device this machine lacks is refused before any model loads: a ValueError from the API, one line and
exit 2 from the CLI, in seconds (the target path below does not exist, so loading would fail otherwise)."""

import subprocess
import sys
import time

import pytest
import torch

from engine import LLM, SpeculativeConfig
from engine.config import DraftPlacement

MISSING_MODEL = "/nonexistent/saguaro-model"


@pytest.mark.parametrize("device, message", [("gpu7", "unknown device 'gpu7'"), ("cuda:99", "cuda:99")])
def test_llm_refuses_a_missing_target_device_before_loading(device, message):
    with pytest.raises(ValueError, match=message):
        LLM(MISSING_MODEL, device=device)


@pytest.mark.parametrize(
    "device, message", [("gpu7", "draft device: unknown device 'gpu7'"), ("cuda:99", "draft device: .*cuda:99")]
)
def test_llm_refuses_a_missing_draft_device_before_loading(device, message):
    spec = SpeculativeConfig(placement=DraftPlacement(draft_device=device))
    with pytest.raises(ValueError, match=message):
        LLM(MISSING_MODEL, MISSING_MODEL, strategy="ssd", speculative=spec)


@pytest.mark.skipif(torch.cuda.is_available(), reason="cuda exists here")
@pytest.mark.parametrize("flag", ["--device", "--draft-device"])
@pytest.mark.parametrize("device", ["gpu7", "cuda"])
def test_generate_refuses_a_missing_device_in_one_line(flag, device, capsys):
    """In-process (the CLI's main); the process itself, exit status and stderr, is checked once below."""
    from saguaro.cli import main

    start = time.monotonic()
    status = main(
        ["generate", "--strategy", "ssd", "--target", MISSING_MODEL, "--draft", MISSING_MODEL, flag, device, "Hi"]
    )
    err = capsys.readouterr().err
    assert status == 2
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) == 1 and "device" in err
    assert time.monotonic() - start < 60


@pytest.mark.skipif(torch.cuda.is_available(), reason="cuda exists here")
def test_the_cli_process_refuses_a_missing_device_with_exit_2_and_one_line():
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "saguaro.cli",
            "generate",
            "--strategy",
            "ssd",
            "--target",
            MISSING_MODEL,
            "--draft",
            MISSING_MODEL,
            "--draft-device",
            "cuda",
            "Hi",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2
    assert "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and "draft device" in out.stderr
