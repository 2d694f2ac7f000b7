"""`saguaro bench`: this engine's AR, SD and SSD next to transformers' peers, over a sweep, into a run folder.

Its parts: the sweep's settings (config), the prompt sets (prompts, shipped in data/), the engine runs (runner,
systems; the peers: transformers' generate and llama.cpp, peers), the run folder (runfolder) with where it ran
(environment) and what others ran meanwhile (others), the HTTP client's load test (client, client_config,
client_run, load; guidellm beside it), the soak test (soak, soak_result) and the summary it prints (summary).

Scripts that run SSD through this API must guard their entry point (`if __name__ == "__main__":`): SSD's
draft worker is started with multiprocessing "spawn", which imports the main module again.
"""

from saguaro.bench.config import BenchConfig, Settings, Variant

_RUNNER = ("Bench", "BenchOutcome", "resume", "start")


def __getattr__(name: str):
    # The runner and the systems import torch: load them on first use, so that building the CLI parser
    # (which imports every command module, this config included) stays light for `saguaro theory`.
    if name in _RUNNER:
        from saguaro.bench import runner

        return getattr(runner, name)
    if name == "Models":
        from saguaro.bench.systems import Models

        return Models
    raise AttributeError(f"module 'saguaro.bench' has no attribute {name!r}")


__all__ = ["Bench", "BenchConfig", "BenchOutcome", "Models", "Settings", "Variant", "resume", "start"]
