"""The run folder's environment names the checkout's commit."""

import subprocess

from saguaro.bench.environment import REPO, git_state


def test_git_state_names_the_commit_of_this_checkout():
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True)
    assert head.returncode == 0, "the test suite runs inside a git checkout"
    assert git_state()["commit"] == head.stdout.strip()
    assert (REPO / "saguaro" / "bench" / "environment.py").is_file()


def test_describe_pluralises_cores_and_threads() -> None:
    from saguaro.bench.environment import describe

    one = describe({"machine": {"cpu_model": "X", "usable_cpus": 1, "torch_threads": 1}})
    two = describe({"machine": {"cpu_model": "X", "usable_cpus": 2, "torch_threads": 2}})
    assert one == "X, 1 core, 1 thread" and two == "X, 2 cores, 2 threads"


def test_cpu_model_reads_cpuinfo_and_falls_back_to_the_platform(monkeypatch) -> None:
    """One reader of the CPU's name for the run folders, the calibration summary and the scripts."""
    import platform

    from saguaro.bench import environment

    monkeypatch.setattr(environment, "_cpuinfo", lambda: {"cpu_model": "Some CPU", "cpu_flags": ["avx2"]})
    assert environment.cpu_model() == "Some CPU"
    monkeypatch.setattr(environment, "_cpuinfo", lambda: {})
    monkeypatch.setattr(platform, "processor", lambda: "")
    assert environment.cpu_model() == platform.machine()
