"""The generation engine: AR, synchronous SD and (later) asynchronous SSD on transformers models."""

from engine.config import SpeculativeConfig
from engine.llm import LLM, Generation, RequestOutput
from engine.sampling_params import SamplingParams
from theory.glossary import Backup, Strategy

__all__ = ["LLM", "Generation", "RequestOutput", "SamplingParams", "SpeculativeConfig", "Strategy", "Backup"]
