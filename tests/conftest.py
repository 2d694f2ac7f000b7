"""Shared test options: slow real-model tests are opt-in with --run-slow; CUDA tests (marker `cuda`: the "cuda"
half of tests/gpu's device-parametrised tests, whose "cpu" half always runs) with --run-gpu, and then run only
where torch sees a CUDA device."""

import pytest


def pytest_addoption(parser):
    parser.addoption("--run-slow", action="store_true", help="run the slow real-model tests")
    parser.addoption("--run-gpu", action="store_true", help="run the CUDA tests (marker cuda) if a GPU is present")


def _cuda_skip_reason(config) -> str | None:
    """Why the cuda-marked tests are skipped, or None to run them (torch is imported only when asked)."""
    if not config.getoption("--run-gpu"):
        return "CUDA test: pass --run-gpu on a machine with a GPU to run it"
    import torch

    if not torch.cuda.is_available():
        return f"CUDA test: torch {torch.__version__} sees no CUDA device (a CPU build, or no GPU here)"
    return None


def pytest_collection_modifyitems(config, items):
    cuda_items = [item for item in items if "cuda" in item.keywords]
    reason = _cuda_skip_reason(config) if cuda_items else None
    if reason:
        for item in cuda_items:
            item.add_marker(pytest.mark.skip(reason=reason))
    if config.getoption("--run-slow"):
        return
    skip = pytest.mark.skip(reason="slow real-model test: pass --run-slow to run it")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)
