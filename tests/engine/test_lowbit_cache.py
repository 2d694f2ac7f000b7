"""The low-bit cache built straight from the GGUF (engine/loading/lowbit_cache.py, lowbit_convert.py, gguf_blocks.py).

The exact-mapping tests: GGUF Q4_0 / Q4_1 / Q4_K blocks become int4 group-32 layers whose weights equal the
GGUF's own dequantisation up to the bfloat16 rounding of each group's scale and zero. First on synthetic
blocks, then on SmolLM2-135M's real GGUF (Q4_1 with llama's Q/K row permutation), checked against the
tensors transformers' GGUF loader (what provision.convert_gguf runs) gives for the same file.
"""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize, quantize

from engine.loading import gguf_blocks, lowbit_cache, model_cache, provision
from engine.loading.weight_only import WeightOnlyLinear

BF16_REL = 2.0**-8  # bfloat16 rounding: at most this relative error


def bf16_bound(layer: WeightOnlyLinear) -> torch.Tensor:
    """Per weight, the largest error the bf16 rounding of scale and zero can cause: |q - 8| <= 8."""
    g = layer.group_size
    scale = layer.scales[..., 0].float().T.repeat_interleave(g, dim=1)
    zero = layer.scales[..., 1].float().T.repeat_interleave(g, dim=1)
    return (8 * scale.abs() + zero.abs()) * BF16_REL * 1.01 + 1e-7


def random_q4k_rows(rows: int, cols: int, seed: int = 0) -> np.ndarray:
    """Raw Q4_K rows (uint8 [rows, cols/256*144]) with random codes, 6-bit scales and positive d, dmin."""
    rng = np.random.default_rng(seed)
    blocks = rows * cols // 256
    d = rng.uniform(1e-4, 2e-2, (blocks, 1)).astype(np.float16).view(np.uint8)
    dmin = rng.uniform(1e-4, 2e-2, (blocks, 1)).astype(np.float16).view(np.uint8)
    scales = rng.integers(0, 256, (blocks, 12), dtype=np.uint8)
    qs = rng.integers(0, 256, (blocks, 128), dtype=np.uint8)
    return np.concatenate([d, dmin, scales, qs], axis=1).reshape(rows, -1)


def gguf_rows(qtype: T, rows: int = 32, cols: int = 512, seed: int = 0) -> np.ndarray:
    if qtype is T.Q4_K:
        return random_q4k_rows(rows, cols, seed)
    values = np.random.default_rng(seed).standard_normal((rows, cols)).astype(np.float32) * 0.05
    values[0] += 0.3  # a row with a large offset: Q4_1's min matters
    return quantize(values, qtype)


@pytest.mark.parametrize("qtype", [T.Q4_0, T.Q4_1, T.Q4_K])
def test_q4_blocks_map_exactly_onto_int4_group_32(qtype):
    raw = gguf_rows(qtype)
    expected = torch.from_numpy(dequantize(raw, qtype))  # [32, 512] float32: the GGUF's own values
    q, scale, zero = gguf_blocks.q4_codes(raw, qtype)
    assert q.shape == (32, 512) and q.dtype == np.uint8 and q.max() <= 15
    # In float32 the int4 form is the GGUF's value (only the order of float operations differs).
    as_int4 = (torch.from_numpy(q).float() - 8) * torch.from_numpy(scale).repeat_interleave(32, 1) + torch.from_numpy(
        zero
    ).repeat_interleave(32, 1)
    # (near-zero values come from cancellation, so the tolerance is relative to the largest value)
    torch.testing.assert_close(as_int4, expected, rtol=1e-6, atol=1e-6 * float(expected.abs().max()))
    # Through the kernel's layer, only bf16 rounding of scale and zero is left.
    layer = WeightOnlyLinear.from_quantized(
        "int4", torch.from_numpy(q), torch.from_numpy(scale), torch.from_numpy(zero), None, 32
    )
    assert torch.equal(layer.unpacked_int4(), torch.from_numpy(q).to(torch.int32))
    err = (layer.dequantized_weight() - expected).abs()
    assert (err <= bf16_bound(layer)).all(), err.max()
    x = torch.randn(3, 512)
    want = x.bfloat16().float() @ layer.dequantized_weight().T  # the kernel takes bf16 activations
    torch.testing.assert_close(layer(x), want, rtol=0, atol=1e-2 * float(want.abs().max()))


def test_q4k_nibble_order_is_the_ggufs():
    """A wrong nibble order gives values that still look plausible; pin it on one hand-made block."""
    raw = random_q4k_rows(1, 256, seed=3)
    raw[0, 16:] = 0
    raw[0, 16 + 5] = 0x0A | (0x03 << 4)  # byte 5 of chunk 0: value 5 gets 10 (group 0), value 37 gets 3 (group 1)
    raw[0, 16 + 32 + 7] = 0x0F << 4  # byte 7 of chunk 1: value 64 + 32 + 7 = 103 gets 15 (group 3)
    q, _, _ = gguf_blocks.q4_codes(raw, T.Q4_K)
    nonzero = {int(i): int(q[0, i]) for i in np.flatnonzero(q[0])}
    assert nonzero == {5: 10, 37: 3, 103: 15}


def test_nibble_packing_round_trips():
    q = torch.randint(0, 16, (48, 64), dtype=torch.uint8)
    packed = gguf_blocks.pack_nibbles(q)
    assert packed.shape == (48, 32) and torch.equal(packed[:, 0], q[:, 0] | (q[:, 1] << 4))
    assert torch.equal(gguf_blocks.unpack_nibbles(packed), q)


@pytest.mark.parametrize("qtype", [T.Q4_0, T.Q4_1, T.Q4_K])
def test_codes_packed_straight_from_the_gguf_bytes_are_the_packed_codes(qtype):
    """The build packs from the GGUF's bytes (q4_packed); it must equal packing the unpacked codes."""
    raw = gguf_rows(qtype, rows=24, cols=1024, seed=5)
    order = np.random.default_rng(1).permutation(24)  # the build permutes llama's Q/K rows first
    for rows in (raw, raw[order]):
        q, scale, zero = gguf_blocks.q4_codes(rows, qtype)
        packed, packed_scale, packed_zero = gguf_blocks.q4_packed(rows, qtype)
        assert packed.shape == (24, 512) and packed.dtype == np.uint8
        assert torch.equal(torch.from_numpy(packed), gguf_blocks.pack_nibbles(torch.from_numpy(q)))
        assert np.array_equal(packed_scale, scale) and np.array_equal(packed_zero, zero)
    with pytest.raises(ValueError, match="no exact int4 form"):
        gguf_blocks.q4_packed(raw, T.Q6_K)


@pytest.mark.parametrize("qtype", [T.Q6_K, T.Q4_K, T.Q8_0, T.F16], ids=lambda t: t.name)
def test_float_tensors_dequantised_in_slabs_equal_the_whole_dequantisation(qtype, monkeypatch):
    rng = np.random.default_rng(2)
    if qtype is T.Q4_K:
        raw = random_q4k_rows(37, 512)
    elif qtype is T.Q6_K:  # gguf cannot quantise to Q6_K: random blocks (128 ql, 64 qh, 16 scales, f16 d)
        raw = rng.integers(0, 256, (37 * 2, 210), dtype=np.uint8)
        raw[:, 208:] = rng.uniform(1e-4, 1e-2, (37 * 2, 1)).astype(np.float16).view(np.uint8)
        raw = raw.reshape(37, -1)
    else:
        raw = quantize(rng.standard_normal((37, 512)).astype(np.float32), qtype)
    want = torch.from_numpy(dequantize(raw, qtype).astype(np.float32)).to(torch.bfloat16)
    monkeypatch.setattr(gguf_blocks, "SLAB_BYTES", raw.nbytes // 37 * 5)  # 5 rows a slab: 8 slabs, one short
    got = gguf_blocks.bfloat16_rows(raw, qtype)
    assert got.dtype == torch.bfloat16 and torch.equal(got, want)


def test_from_quantized_int8_multiplies_by_the_given_codes():
    q = torch.randint(-127, 128, (16, 32), dtype=torch.int8)
    scales = torch.rand(16) / 100
    layer = WeightOnlyLinear.from_quantized("int8", q, scales)
    assert torch.equal(layer.dequantized_weight(), q.float() * scales.to(torch.bfloat16).float()[:, None])


def test_from_quantized_refuses_bad_input():
    scales = torch.ones(16, 1)
    with pytest.raises(ValueError, match="does not fit"):
        WeightOnlyLinear.from_quantized("int4", torch.zeros(10, 32, dtype=torch.uint8), scales, scales)
    with pytest.raises(ValueError, match="0..15"):
        WeightOnlyLinear.from_quantized("int4", torch.full((16, 32), 16, dtype=torch.uint8), scales, scales)
    with pytest.raises(ValueError, match="zeros"):
        WeightOnlyLinear.from_quantized("int4", torch.zeros(16, 32, dtype=torch.uint8), scales, None)
    with pytest.raises(ValueError, match="int8 needs"):
        WeightOnlyLinear.from_quantized("int8", torch.zeros(16, 32, dtype=torch.int32), torch.ones(16))
    with pytest.raises(ValueError, match="unknown quantisation scheme"):
        WeightOnlyLinear.from_quantized("int3", torch.zeros(16, 32, dtype=torch.int8), torch.ones(16))


# ------------------------------------------------------------------------------- SmolLM2-135M's GGUF


def smoke_gguf():
    try:
        return provision.locate_parts(provision.PACKAGED[provision.SMOKE_MODEL])[0]
    except provision.MissingPackageError:
        pytest.skip(
            f"{provision.SMOKE_MODEL}'s data wheel is not installed "
            f"({provision.PACKAGED[provision.SMOKE_MODEL].install_command})"
        )


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    """(cache root, low-bit folder) of SmolLM2-135M's int4 form, built once for this module (~1 min)."""
    smoke_gguf()
    root = tmp_path_factory.mktemp("lowbit") / "cache"
    return root, lowbit_cache.build(provision.SMOKE_MODEL, "int4", 32, root, progress=False)


@pytest.fixture(scope="module")
def reference(smoke):
    """The float32 tensors transformers' GGUF loader gives for the same file (names as convert_gguf)."""
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    gguf = smoke_gguf()
    config = AutoConfig.from_pretrained(gguf.parent, gguf_file=gguf.name)
    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(config)
    return load_gguf_checkpoint(str(gguf), return_tensors=True, model_to_load=skeleton)["tensors"]


@pytest.mark.slow  # ~160 s each on SmolLM2's real GGUF: opt-in with --run-slow
def test_smoke_model_layers_are_the_ggufs_values(smoke, reference):
    root, folder = smoke
    assert folder == root / f"{provision.PACKAGED[provision.SMOKE_MODEL].key}-int4-g32"
    model = lowbit_cache.load(provision.SMOKE_MODEL, "int4", 32, root)
    layers = {name: m for name, m in model.named_modules() if isinstance(m, WeightOnlyLinear)}
    assert len(layers) == 30 * 7 and model.quantization["int4_exact"] == 210
    for name, layer in layers.items():  # q_proj / k_proj included: llama's row permutation carried over
        expected = reference[f"{name}.weight"]
        err = (layer.dequantized_weight() - expected).abs()
        assert (err <= bf16_bound(layer)).all(), (name, err.max())
    state = model.state_dict()
    floats = [k for k, v in state.items() if v.dtype == torch.bfloat16 and k in reference]
    assert "model.embed_tokens.weight" in floats and "model.norm.weight" in floats
    for key in floats:
        assert torch.equal(state[key], reference[key].to(torch.bfloat16)), key
    assert model.lm_head.weight is model.model.embed_tokens.weight  # tied, as in the GGUF
    assert not any(t.is_meta for t in [*model.parameters(), *model.buffers()])


@pytest.mark.slow  # ~160 s each on SmolLM2's real GGUF: opt-in with --run-slow
def test_smoke_model_generates_what_its_float_twin_does(smoke, reference):
    """Same greedy tokens as a bf16 model holding the dequantised low-bit weights (the model it claims to be)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    root, folder = smoke
    model = lowbit_cache.load(folder)
    assert model.name_or_path == str(folder) and (folder / "tokenizer.json").is_file()
    twin = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(folder), dtype=torch.bfloat16)
    weights = {k: v for k, v in model.state_dict().items() if v.dtype == torch.bfloat16}
    for name, m in model.named_modules():
        if isinstance(m, WeightOnlyLinear):
            weights[f"{name}.weight"] = m.dequantized_weight().to(torch.bfloat16)
    twin.load_state_dict(weights, strict=False)
    twin.tie_weights()
    ids = torch.tensor([[1, 504, 3458, 282, 4649, 314, 216]])
    with torch.no_grad():
        ours = model.generate(ids, max_new_tokens=8, do_sample=False)
        theirs = twin.generate(ids, max_new_tokens=8, do_sample=False)
        logits = model(ids).logits.float()
        twin_logits = twin(ids).logits.float()
    assert torch.equal(ours, theirs)
    assert (logits - twin_logits).abs().max() < 1.0  # logits ~20: bf16 activations on both sides, different kernels


# sha256 over the smoke build's tensors (sorted by name: name, dtype, shape, then the bytes), taken from
# the build of commit 36410be, before the build was made fast: the fast build must write the same bytes.
SMOKE_TENSORS_SHA256 = "705517d103b9d8b3d8be114f02d8ec9d626fde90f65a41ecb0695cd93b3d81b8"


def test_smoke_build_writes_the_bytes_the_first_build_wrote(smoke):
    import hashlib

    from safetensors.torch import load_file

    _, folder = smoke
    tensors = {}
    for shard in sorted(folder.glob("model-*.safetensors")):
        tensors.update(load_file(str(shard)))
    digest = hashlib.sha256()
    for name in sorted(tensors):
        tensor = tensors[name].contiguous()
        digest.update(f"{name} {tensor.dtype} {tuple(tensor.shape)}\n".encode())
        digest.update(tensor.view(-1).view(torch.uint8).numpy().tobytes())
    assert len(tensors) == 692 and digest.hexdigest() == SMOKE_TENSORS_SHA256


def test_load_is_none_until_built_and_builds_once(smoke):
    root, folder = smoke
    assert lowbit_cache.load(provision.SMOKE_MODEL, "int8", 32, root) is None
    assert lowbit_cache.load(provision.SMOKE_MODEL, "int4", 64, root) is None
    assert lowbit_cache.load(provision.SMOKE_MODEL, "int4", 32, root.parent / "elsewhere") is None
    stamp = (folder / model_cache.MANIFEST_NAME).stat().st_mtime_ns
    assert lowbit_cache.build(provision.SMOKE_MODEL, "int4", 32, root) == folder  # reused, not rebuilt
    assert (folder / model_cache.MANIFEST_NAME).stat().st_mtime_ns == stamp
    # the float32 entry's folder (a sibling) also finds it
    assert lowbit_cache.load(root / provision.PACKAGED[provision.SMOKE_MODEL].key) is not None
    manifest = model_cache.check_folder(folder, verify=True)
    assert manifest.source["gguf_sha256"] == provision.PACKAGED[provision.SMOKE_MODEL].sha256
    assert any(name.endswith(".safetensors") for name in manifest.files)
    assert not list(root.glob(f"{model_cache.TEMP_PREFIX}*"))


def test_a_changed_byte_is_refused(smoke, tmp_path):
    _, folder = smoke
    copy = tmp_path / folder.name
    shutil.copytree(folder, copy)
    shard = sorted(copy.glob("model-*.safetensors"))[0]
    with open(shard, "r+b") as f:
        f.seek(shard.stat().st_size - 10)
        byte = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([byte[0] ^ 0x01]))
    with pytest.raises(model_cache.CorruptCacheError, match="rebuild"):
        lowbit_cache.load(copy)


def test_bad_scheme_is_a_value_error():
    with pytest.raises(ValueError, match="group_size"):
        lowbit_cache.load(provision.SMOKE_MODEL, "int4", 48)
    with pytest.raises(ValueError, match="neither a packaged model"):
        lowbit_cache.build("no-such-model")


def test_int8_layer_from_tensors_read_by_safetensors_runs(tmp_path):
    """The int8 kernel crashed (SIGSEGV) on q read by safetensors.load_file as it was: from_quantized copies."""
    from safetensors.torch import load_file, save_file

    q = torch.randint(-127, 128, (256, 1536), dtype=torch.int8)
    scales = (torch.rand(256) / 100).to(torch.bfloat16)
    save_file({"b.scales": scales, "a.qweight": q, "c.bias": torch.zeros(3)}, str(tmp_path / "w.safetensors"))
    read = load_file(str(tmp_path / "w.safetensors"))
    layer = WeightOnlyLinear.from_quantized("int8", read["a.qweight"], read["b.scales"])
    x = torch.randn(4, 1536)
    want = x.bfloat16().float() @ layer.dequantized_weight().T
    torch.testing.assert_close(layer(x).float(), want, rtol=0, atol=1e-2 * float(want.abs().max()))


@pytest.mark.parametrize("head_quant", ["int8", "int4"])
def test_head_quant_gives_a_low_bit_head_untied_from_the_bf16_embedding(smoke, reference, head_quant):
    """The cache's head is quantised at load from its bf16 table by the code quantize_weights uses."""
    root, _ = smoke
    model = lowbit_cache.load(provision.SMOKE_MODEL, "int4", 32, root, head_quant=head_quant)
    head, embedding = model.lm_head, model.model.embed_tokens.weight
    assert isinstance(head, WeightOnlyLinear) and head.scheme.value == head_quant
    assert model.quantization["head_quant"] == head_quant and model.config.tie_word_embeddings is False
    assert embedding.dtype == torch.bfloat16
    assert torch.equal(embedding, reference["model.embed_tokens.weight"].to(torch.bfloat16))  # lookup unchanged
    table = torch.nn.Linear(embedding.shape[1], embedding.shape[0], bias=False, dtype=torch.bfloat16)
    table.weight = torch.nn.Parameter(embedding.detach().clone(), requires_grad=False)
    same = WeightOnlyLinear.from_linear(table, head_quant, 32)
    assert torch.equal(head.packed, same.packed) and torch.equal(head.scales, same.scales)
