"""Shared test options: slow real-model tests are opt-in with --run-slow."""

import pytest


def pytest_addoption(parser):
    parser.addoption("--run-slow", action="store_true", help="run the slow real-model tests")


def pytest_collection_modifyitems(config, items):
    if config.getoption("--run-slow"):
        return
    skip = pytest.mark.skip(reason="slow real-model test: pass --run-slow to run it")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)
