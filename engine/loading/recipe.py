"""How a process rebuilds a draft model it was not handed: SSD's draft worker (engine.ssd.process) and the
calibration worker get a picklable recipe, never a live model.

A draft passed by alias / path is loaded there the same way (dtype, low-bit scheme, cache_dir); one passed as
a model object travels as its config and weights (quantised there), so the worker drafts with exactly that
model, even if it was changed after loading (a fine-tuned or perturbed copy whose name_or_path still names
the original). Quantisation is deterministic, so the worker's low-bit draft is the one SD uses in the
target's process.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.compile_config import SlotPlan, slot_plans
from engine.config import EngineConfig, QuantConfig
from theory.glossary import Strategy


@dataclass
class DraftRecipe:
    """Load `path` (alias, folder, .gguf) in `dtype`, or build `config` and load `state` (keeping the weights'
    own dtype); then quantise as `quant` says (None: float weights).

    dtype  for a draft loaded by path: its float dtype, or, quantised, that of the layers left in float.
    slots  run it on the static slot cache, compiled (engine.compiled), as the engine's `compile` says.
    """

    path: str | None = None
    dtype: str = "float32"
    cache_dir: str | None = None
    config: dict | None = None
    state: dict | None = None
    quant: QuantConfig | None = None
    slots: SlotPlan | None = None
    prefix_caching: bool = True  # reuse cached prompt prefixes on the eager path (engine.blocks)

    @classmethod
    def from_model(cls, model: torch.nn.Module, quant: QuantConfig | None = None) -> DraftRecipe:
        """The recipe of a float model object: its config and weights."""
        from engine.loading.quantize import is_quantized

        if not hasattr(model, "config"):
            raise ValueError("an in-memory draft must be a transformers model (or pass it by alias / path)")
        if is_quantized(model):
            raise ValueError(
                "an int8-quantised draft object (or any low-bit one) cannot be sent to SSD's worker "
                "process: pass the float model (or its alias / path) with draft_quant='int8' / 'int4' "
                "/ 'int8-dynamic'"
            )
        return cls(
            config=model.config.to_dict(),
            state={k: v.detach().cpu() for k, v in model.state_dict().items()},
            quant=quant,
        )

    def build(self, device: torch.device) -> torch.nn.Module:
        """The draft (on the static slot cache when the recipe says so: what the worker feeds)."""
        from engine.compiled import slot_model

        return slot_model(self._model(device), self.slots, device, "draft", prefix_caching=self.prefix_caching)

    def _model(self, device: torch.device) -> torch.nn.Module:
        from engine.loading.devices import TORCH_DTYPES
        from engine.loading.models import load_model, load_quantized
        from engine.loading.quantize import quantize_model

        if self.quant is not None and device.type != "cpu":
            raise ValueError(
                f"a {self.quant.scheme} draft runs on CPU kernels only, not on {device}: use draft_device cpu"
            )
        if self.path is not None:
            if self.quant is not None:
                return load_quantized(
                    self.path, self.quant, dtype=TORCH_DTYPES[self.dtype], cache_dir=self.cache_dir
                ).model
            return load_model(
                self.path, dtype=TORCH_DTYPES[self.dtype], device=device, cache_dir=self.cache_dir
            ).model.eval()
        model = self._from_weights(device)
        return model if self.quant is None else quantize_model(model, self.quant)

    def _from_weights(self, device: torch.device) -> torch.nn.Module:
        from transformers import AutoConfig, AutoModelForCausalLM

        config = dict(self.config)
        config_class = AutoConfig.for_model(config.pop("model_type"), **config)
        dtype = next((v.dtype for v in self.state.values() if v.is_floating_point()), torch.float32)
        model = AutoModelForCausalLM.from_config(config_class).to(dtype)  # the weights' own dtype
        model.load_state_dict(self.state)
        return model.to(device).eval()


def draft_recipe(given: torch.nn.Module | None, config: EngineConfig) -> DraftRecipe:
    """How the worker process rebuilds the engine's draft: from `given`, the model object the caller passed,
    or, when it was passed by name (`given` None), by loading `config.draft` as the engine did."""
    spec = config.speculative
    K = None if config.strategy is Strategy.AR else spec.K
    _, slots = slot_plans(config.compile, K, sum(spec.fanouts) if config.strategy is Strategy.SSD else 0, None)
    if given is not None:
        recipe = DraftRecipe.from_model(given, config.draft_quant)
        recipe.slots, recipe.prefix_caching = slots, config.prefix_caching
        return recipe
    return DraftRecipe(
        path=config.draft,
        dtype=config.draft_float_dtype,
        cache_dir=config.cache_dir,
        quant=config.draft_quant,
        slots=slots,
        prefix_caching=config.prefix_caching,
    )
