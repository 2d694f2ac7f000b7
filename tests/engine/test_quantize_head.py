"""A low-bit output head (QuantConfig.head): untied from the embedding, same code for the cache and the
at-load path, refused where it cannot apply, and SD / SSD exact relative to the model with it."""

from __future__ import annotations

import copy

import pytest
import torch

from engine import LLM, SamplingParams, SpeculativeConfig
from engine.config import DraftPlacement, QuantConfig
from engine.loading.models import load_quantized
from engine.loading.quantize import int8_dynamic, quantize_head, quantize_model, quantize_weights
from engine.loading.tiny import tiny_model, tiny_pair
from engine.loading.weight_only import Scheme, WeightOnlyLinear

PROMPTS = [[1, 2, 3, 4, 5], [7, 8], [9, 10, 11, 12, 13, 14, 15, 16]]
GREEDY = SamplingParams(temperature=0, max_new_tokens=24, stop_on_eos=False)


def tied(vocab_size: int = 48, seed: int = 0):
    """A tiny model whose output head is its embedding table, as in Qwen2.5-1.5B."""
    model = tiny_model(vocab_size=vocab_size, seed=seed)
    model.config.tie_word_embeddings = True
    model.lm_head.weight = model.model.embed_tokens.weight
    return model


@pytest.mark.parametrize("head_quant", ["int8", "int4"])
def test_a_tied_head_is_untied_and_the_embedding_stays_float(head_quant):
    model = tied()
    table = model.model.embed_tokens.weight.detach().clone()
    info = quantize_head(model, head_quant, 32)
    assert info == {"head_quant": head_quant, "head_group_size": 32 if head_quant == "int4" else None}
    head = model.get_output_embeddings()
    assert isinstance(head, WeightOnlyLinear) and head.scheme is Scheme(head_quant)
    assert model.config.tie_word_embeddings is False
    embedding = model.get_input_embeddings().weight
    assert embedding.dtype == torch.float32 and torch.equal(embedding, table)  # the lookup is untouched
    err = (head.dequantized_weight() - table).abs()
    if head_quant == "int8":
        assert (err <= table.abs().amax(1, keepdim=True) / 127).all()  # within an int8 step of each row
    assert err.max() < 0.5 * table.abs().max()  # int4: coarse, but the head it claims to be
    model.tie_weights()  # a later tie must not put the float table back as the head
    assert model.get_output_embeddings() is head


def test_quantize_weights_and_the_cache_path_give_the_same_head():
    """quantize_weights(head_quant=...) and lowbit_cache.load(head_quant=...) both call quantize_head on the
    weight as loaded: the same weight gives the same packed head."""
    model = tied(seed=1)
    alone = copy.deepcopy(model)
    summary = quantize_weights(model, "int4", 32, head_quant="int8")
    assert summary["head_quant"] == "int8" and summary["converted"] == 14
    quantize_head(alone, "int8", 32)
    assert torch.equal(model.lm_head.packed, alone.lm_head.packed)
    assert torch.equal(model.lm_head.scales, alone.lm_head.scales)


def test_load_quantized_passes_head_quant_on_the_at_load_path(tmp_path):
    tiny_model(vocab_size=48, seed=2).save_pretrained(tmp_path / "m")
    loaded = load_quantized(
        tmp_path / "m", QuantConfig("int4", head="int4"), dtype=torch.bfloat16, cache_dir=tmp_path / "c"
    )
    assert isinstance(loaded.model.lm_head, WeightOnlyLinear) and loaded.model.lm_head.scheme is Scheme.INT4
    assert loaded.model.model.embed_tokens.weight.dtype == torch.bfloat16
    assert loaded.model.quantization["head_quant"] == "int4"
    plain = load_quantized(tmp_path / "m", "int4", dtype=torch.bfloat16, cache_dir=tmp_path / "c")
    assert type(plain.model.lm_head) is torch.nn.Linear and plain.model.quantization["head_quant"] is None


def test_bad_head_settings_are_refused_with_what_to_do(tmp_path):
    with pytest.raises(ValueError, match="unknown quantisation scheme 'int3'"):
        quantize_model(tied(), QuantConfig("int4", head="int3"))
    with pytest.raises(ValueError, match="output head is dynamic int8 already: drop head"):
        quantize_model(tiny_model(vocab_size=48), QuantConfig("int8-dynamic", head="int8"))
    with pytest.raises(ValueError, match="drop head_quant"):
        quantize_head(int8_dynamic(tiny_model(vocab_size=48)), "int8")
    with pytest.raises(ValueError, match="does not fit the int4 kernel"):  # 40 rows: int4 needs a multiple of 16
        quantize_head(tiny_model(vocab_size=40), "int4", 32)
    model = tied()
    quantize_head(model, "int8")
    assert quantize_head(model, "int8")["head_quant"] == "int8"  # asked again: already so
    with pytest.raises(ValueError, match="already int8"):
        quantize_head(model, "int4", 32)


@pytest.fixture(scope="module")
def low_bit_pair():
    """An int4 target with an int4 head and an int8 draft with an int8 head, quantised once (deterministic)."""
    target, draft = tiny_pair(vocab_size=48, seed=0, logit_scale=4.0)
    return (
        quantize_model(copy.deepcopy(target), QuantConfig("int4", head="int4")),
        quantize_model(copy.deepcopy(draft), QuantConfig("int8", head="int8")),
        quantize_model(copy.deepcopy(target), "int4"),
    )


@pytest.fixture(scope="module")
def head_ar(low_bit_pair):
    with LLM(low_bit_pair[0]) as llm:
        return [o.token_ids for o in llm.generate(PROMPTS, GREEDY)]


def test_the_low_bit_head_makes_a_different_model(low_bit_pair, head_ar):
    with LLM(low_bit_pair[2]) as llm:  # the same int4 body, float head
        float_head = [o.token_ids for o in llm.generate(PROMPTS, GREEDY)]
    assert float_head != head_ar  # otherwise the equalities below would not tell the two apart


@pytest.mark.parametrize("K", [1, 3])
def test_greedy_sd_with_low_bit_heads_equals_ar(low_bit_pair, head_ar, K):
    target, draft, _ = low_bit_pair
    with LLM(target, draft, strategy="sd", speculative=SpeculativeConfig(K=K)) as llm:
        assert isinstance(llm.target.lm_head, WeightOnlyLinear) and isinstance(llm.draft.lm_head, WeightOnlyLinear)
        out = llm.generate(PROMPTS, GREEDY)
    assert [o.token_ids for o in out] == head_ar
    assert len(out.metrics.accepted_hist) >= 2  # accepted and rejected drafts both exercised


def test_greedy_ssd_with_low_bit_heads_equals_ar(low_bit_pair, head_ar):
    target, draft, _ = low_bit_pair
    spec = SpeculativeConfig(K=3, placement=DraftPlacement(in_process=True))
    with LLM(target, draft, strategy="ssd", speculative=spec) as llm:
        out = llm.generate(PROMPTS, GREEDY)
    assert [o.token_ids for o in out] == head_ar
