"""`saguaro bench`: this engine's AR, SD and SSD next to transformers' peers, over a sweep, into a run folder."""

from reports.bench.config import BenchConfig, Settings, Variant
from reports.bench.runner import Bench, BenchOutcome, resume, start
from reports.bench.systems import Models

__all__ = ["Bench", "BenchConfig", "BenchOutcome", "Models", "Settings", "Variant", "resume", "start"]
