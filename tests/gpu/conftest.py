"""The device the tests in tests/gpu run on: "cpu" always, "cuda" (marker `cuda`) only with --run-gpu on a machine
where torch sees a GPU (tests/conftest.py skips it elsewhere). `pytest tests/gpu -m cuda --run-gpu` runs the GPU
half alone."""

import pytest


@pytest.fixture(params=["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
def device(request) -> str:
    return request.param
