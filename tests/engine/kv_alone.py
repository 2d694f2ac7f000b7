"""The logits of a token sequence run alone through a model: what every batched row must reproduce."""

import torch


def alone(model, tokens: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        return model(torch.tensor([tokens])).logits[0, -1]
