"""`saguaro bench`: this engine's AR, SD and SSD next to transformers' peers, over a sweep, into a run folder.

Scripts that run SSD through this API must guard their entry point (`if __name__ == "__main__":`): SSD's
draft worker is started with multiprocessing "spawn", which imports the main module again.
"""

from reports.bench.config import BenchConfig, Settings, Variant
from reports.bench.runner import Bench, BenchOutcome, resume, start
from reports.bench.systems import Models

__all__ = ["Bench", "BenchConfig", "BenchOutcome", "Models", "Settings", "Variant", "resume", "start"]
