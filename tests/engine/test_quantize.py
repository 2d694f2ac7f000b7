"""Weight-only int8 / int4 layers: kernel output vs own dequantised weights, whole-model swap, exactness."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from engine import LLM, SamplingParams, SpeculativeConfig
from engine.config import QuantConfig
from engine.loading.quantize import quantize_weights
from engine.loading.tiny import tiny_model, tiny_pair
from engine.loading.weight_only import GROUP_SIZES, Scheme, WeightOnlyLinear, quantize_int4

SCHEMES = [("int8", 32)] + [("int4", g) for g in GROUP_SIZES]
# [out_features, in_features] that every scheme above accepts (int4 needs N % 16, K % group size).
SHAPES = [(16, 128), (48, 256), (64, 384)]


def seeded_linear(n: int, k: int, *, bias: bool, seed: int) -> nn.Linear:
    gen = torch.Generator().manual_seed(seed)
    linear = nn.Linear(k, n, bias=bias)
    with torch.no_grad():
        linear.weight.normal_(0.0, k**-0.5, generator=gen)
        if bias:
            linear.bias.normal_(0.0, 1.0, generator=gen)
    return linear


@pytest.mark.parametrize("scheme,group_size", SCHEMES)
@pytest.mark.parametrize("n,k", SHAPES)
@pytest.mark.parametrize("lead", [(5,), (2, 3)], ids=["2d", "3d"])
def test_output_equals_own_dequantised_weights(scheme, group_size, n, k, lead):
    linear = seeded_linear(n, k, bias=True, seed=n + k)
    layer = WeightOnlyLinear.from_linear(linear, scheme, group_size)
    x = torch.randn(*lead, k, generator=torch.Generator().manual_seed(1))  # [..., K] float32
    y = layer(x)  # [..., N]
    # Reference: the bf16 input the kernel sees, float32 matmul with the stored weights and bias.
    ref = x.to(torch.bfloat16).float() @ layer.dequantized_weight().T + layer.bias.float()
    assert y.shape == (*lead, n) and y.dtype == x.dtype
    # The kernel rounds its output to bf16 (relative step 2^-8): allow 1% of the output's range.
    torch.testing.assert_close(y, ref, rtol=1e-2, atol=1e-2 * ref.abs().max().item())


@pytest.mark.parametrize("scheme,group_size", SCHEMES)
def test_dequantised_weight_is_within_one_quantisation_step(scheme, group_size):
    linear = seeded_linear(32, 256, bias=False, seed=3)
    layer = WeightOnlyLinear.from_linear(linear, scheme, group_size)
    w = linear.weight
    if scheme == "int8":
        step = w.abs().amax(dim=1, keepdim=True) / 127  # [N, 1]
    else:
        groups = w.reshape(32, -1, group_size)  # [N, G, g]
        step = ((groups.amax(2) - groups.amin(2)) / 15).repeat_interleave(group_size, dim=1)  # [N, K]
    # Half a step from rounding q, plus slack for the bf16 rounding of scale and zero.
    assert ((layer.dequantized_weight() - w).abs() <= 0.5 * step * 1.05 + 1e-6).all()


def test_int4_codes_survive_packing():
    linear = seeded_linear(48, 128, bias=False, seed=4)
    codes, _ = quantize_int4(linear.weight, 32)
    layer = WeightOnlyLinear.from_linear(linear, "int4", 32)
    assert torch.equal(layer.unpacked_int4(), codes)


@pytest.mark.parametrize("scheme", ["int8", "int4"])
def test_each_row_is_the_same_whatever_the_batch(scheme):
    # What exact verification needs from a layer: a token's output does not depend on how many
    # tokens share the forward (K + 1 in verification, 1 in AR decoding), bit for bit.
    layer = WeightOnlyLinear.from_linear(seeded_linear(64, 128, bias=True, seed=6), scheme)
    x = torch.randn(9, 128, generator=torch.Generator().manual_seed(3))  # [M, K]
    alone = torch.cat([layer(x[i : i + 1]) for i in range(9)])  # [M, N], one row per call
    for m in range(2, 10):
        assert torch.equal(layer(x[:m]), alone[:m])


def test_no_bias_and_bf16_input():
    linear = seeded_linear(32, 64, bias=False, seed=5)
    layer = WeightOnlyLinear.from_linear(linear, "int4", 32)
    x = torch.randn(4, 64, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
    y = layer(x)
    ref = x.float() @ layer.dequantized_weight().T
    assert layer.bias is None and y.dtype == torch.bfloat16
    torch.testing.assert_close(y.float(), ref, rtol=1e-2, atol=1e-2 * ref.abs().max().item())


def test_shape_the_kernel_cannot_take_is_refused():
    with pytest.raises(ValueError, match="does not fit the int4 kernel"):
        WeightOnlyLinear.from_linear(nn.Linear(64, 50), "int4", 32)  # N = 50 is not a multiple of 16
    with pytest.raises(ValueError, match="does not fit the int8 kernel"):
        WeightOnlyLinear.from_linear(nn.Linear(40, 32), "int8")  # K = 40 is not a multiple of 16


# -- whole model ---------------------------------------------------------------------------------
IDS = (torch.arange(24) * 7 % 48).unsqueeze(0)  # [1, 24] token ids
# Largest |Δlogit| allowed on tiny_model (logit spread ~1): tiny K = 32 layers quantise coarsely.
LOGIT_TOLERANCE = {"int8": 0.1, "int4": 1.0}


@pytest.mark.parametrize("scheme", ["int8", "int4"])
def test_quantised_tiny_model_runs_and_stays_close(scheme):
    model = tiny_model(vocab_size=48, seed=0)
    before = model(IDS).logits  # [1, 24, V]
    summary = quantize_weights(model, scheme)
    after = model(IDS).logits  # [1, 24, V]
    # 2 layers x (q, k, v, o, gate, up, down) = 14 Linear layers; lm_head kept by default.
    assert (summary["converted"], summary["skipped_by_name"], summary["skipped_by_shape"]) == (14, 1, 0)
    assert summary["skipped_names"] == ("lm_head",)
    assert summary["model_bytes_after"] < summary["model_bytes_before"]
    assert after.shape == before.shape and after.dtype == before.dtype
    assert (after - before).abs().max().item() < LOGIT_TOLERANCE[scheme]
    assert sum(isinstance(m, WeightOnlyLinear) for m in model.modules()) == 14


def test_bf16_model_keeps_bf16_logits():
    model = tiny_model(vocab_size=48, seed=0).to(torch.bfloat16)
    before = model(IDS).logits.float()  # [1, 24, V]
    quantize_weights(model, "int4")
    after = model(IDS).logits
    assert after.dtype == torch.bfloat16
    assert (after.float() - before).abs().max().item() < LOGIT_TOLERANCE["int4"]


def test_head_not_fitting_int4_is_left_and_counted():
    model = tiny_model(vocab_size=50, seed=0)  # lm_head [50, 32]: 50 is not a multiple of 16
    summary = quantize_weights(model, "int4", skip=())
    assert (summary["converted"], summary["skipped_by_name"], summary["skipped_by_shape"]) == (14, 0, 1)
    assert type(model.lm_head) is nn.Linear
    model(IDS % 50)  # still runs


def test_skip_names_a_module_path():
    model = tiny_model(vocab_size=48, seed=0)
    summary = quantize_weights(model, "int8", skip=("lm_head", "mlp.down_proj"))
    assert summary["skipped_by_name"] == 3  # lm_head and down_proj in each of 2 layers
    assert type(model.model.layers[1].mlp.down_proj) is nn.Linear


def test_int4_stores_fewer_bytes_than_int8():
    int8, int4 = tiny_model(vocab_size=48), tiny_model(vocab_size=48)
    b8 = quantize_weights(int8, "int8")["model_bytes_after"]
    b4 = quantize_weights(int4, "int4")["model_bytes_after"]
    assert b4 < b8


# -- exactness: the quantised target is THE target ------------------------------------------------
PROMPTS = [[1, 2, 3, 4, 5], [7, 8], [9, 10, 11, 12, 13, 14, 15, 16]]
GREEDY = SamplingParams(temperature=0, max_new_tokens=24, stop_on_eos=False)


@pytest.mark.parametrize("scheme", ["int8", "int4"])
def test_greedy_sd_equals_greedy_ar_on_the_quantised_target(scheme):
    target, draft = tiny_pair(vocab_size=48, seed=0, logit_scale=4.0)
    float_ar = [o.token_ids for o in LLM(target).generate(PROMPTS, GREEDY)]
    quantize_weights(target, scheme)  # the float draft now drafts for a low-bit target
    ar = [o.token_ids for o in LLM(target).generate(PROMPTS, GREEDY)]
    out = LLM(target, draft, strategy="sd", speculative=SpeculativeConfig(K=3)).generate(PROMPTS, GREEDY)
    assert [o.token_ids for o in out] == ar
    assert len(out.metrics.accepted_hist) >= 2  # both accepted and rejected drafts were exercised
    # Not a vacuous check: SD followed the quantised target, whose output differs from the float one.
    if scheme == "int4":
        assert ar != float_ar


# -- bad input -----------------------------------------------------------------------------------
def test_unknown_scheme_is_refused():
    with pytest.raises(ValueError, match="unknown quantisation scheme 'int3'; use one of int8, int4"):
        quantize_weights(tiny_model(), "int3")


@pytest.mark.parametrize("group_size", [0, 16, 48, 256])
def test_bad_int4_group_size_is_refused(group_size):
    with pytest.raises(ValueError, match="group_size must be one of 32, 64, 128"):
        quantize_weights(tiny_model(), "int4", group_size=group_size)


def test_scheme_enum_is_accepted():
    layer = WeightOnlyLinear.from_linear(nn.Linear(32, 16), Scheme.INT8)
    assert layer.scheme is Scheme.INT8


# -- settings: QuantConfig, target_quant / draft_quant ------------------------------------------------------
def test_quant_settings_refuse_unknown_schemes_and_group_sizes():
    from engine.config import EngineConfig, QuantConfig

    with pytest.raises(ValueError, match="unknown quantisation scheme 'int3': use one of int8, int4"):
        EngineConfig(target="t", target_quant="int3")
    with pytest.raises(ValueError, match="unknown quantisation scheme 'fp8': use one of int8, int4, or int8-dynamic"):
        EngineConfig(target="t", draft="d", strategy="sd", draft_quant="fp8")
    with pytest.raises(ValueError, match="group_size must be one of 32, 64, 128, got 48"):
        QuantConfig("int4", group_size=48)
    with pytest.raises(ValueError, match="a QuantConfig, a scheme name"):
        EngineConfig(target="t", target_quant=4)
    with pytest.raises(ValueError, match="CPU kernels only"):
        EngineConfig(target="t", target_quant="int8", device="cuda")
    with pytest.raises(ValueError, match="CPU kernels only"):
        EngineConfig(target="t", draft="d", strategy="sd", draft_quant="int4", device="cuda")


def test_a_scheme_name_is_its_quant_config_with_the_defaults():
    from engine.config import EngineConfig, QuantConfig

    named = EngineConfig(target="t", draft="d", strategy="sd", target_quant="int4", draft_quant="int8-dynamic")
    assert named.target_quant == QuantConfig("int4", group_size=32, head=None)
    assert named.draft_quant.dynamic and named.draft_float_dtype == "float32"
    assert named == EngineConfig(
        target="t", draft="d", strategy="sd", target_quant=QuantConfig("int4"), draft_quant=QuantConfig("int8-dynamic")
    )
    with pytest.raises(ValueError, match="int8-dynamic is for the draft only"):
        EngineConfig(target="t", target_quant="int8-dynamic")


def test_the_cli_draft_int8_flag_is_draft_quant_int8_dynamic():
    from argparse import Namespace

    from engine.config import QuantConfig
    from saguaro.commands.generate import quant_kwargs

    flags = dict(
        target_quant=None, draft_quant=None, quant_group_size=32, target_head_quant=None, draft_head_quant=None
    )
    assert quant_kwargs(Namespace(**flags, draft_int8=True)) == {
        "target_quant": None,
        "draft_quant": QuantConfig("int8-dynamic"),
    }
    assert quant_kwargs(Namespace(**{**flags, "draft_quant": "int8-dynamic"}, draft_int8=True))["draft_quant"].dynamic
    with pytest.raises(ValueError, match="--draft-int8 means --draft-quant int8-dynamic: drop one of them"):
        quant_kwargs(Namespace(**{**flags, "draft_quant": "int4"}, draft_int8=True))


def test_the_api_defaults_to_auto_like_the_cli():
    # auto: bfloat16 where the device multiplies in it at speed (tests/engine/test_dtype_auto.py); the config
    # records what LLM resolved it to, so its own default is a concrete dtype
    from engine.config import EngineConfig

    assert EngineConfig(target="t").dtype == "bfloat16"
    assert inspect_default(LLM, "dtype") == "auto"


def inspect_default(function, name):
    import inspect

    return inspect.signature(function).parameters[name].default


def test_llm_quantises_target_and_draft_by_the_settings():
    target, draft = tiny_pair(vocab_size=48, seed=0)
    spec = SpeculativeConfig(K=2)
    with LLM(
        target,
        draft,
        strategy="sd",
        speculative=spec,
        target_quant=QuantConfig("int4", group_size=64),
        draft_quant="int8",
    ) as llm:
        t_layers = [m for m in llm.target.modules() if isinstance(m, WeightOnlyLinear)]
        d_layers = [m for m in llm.draft.modules() if isinstance(m, WeightOnlyLinear)]
        # group 64 fits only the [32, 64] down_proj of each layer; the other 12 layers have K = 32
        assert {(m.scheme, m.group_size) for m in t_layers} == {(Scheme.INT4, 64)} and len(t_layers) == 2
        assert llm.target.quantization["skipped_by_shape"] == 12
        assert {m.scheme for m in d_layers} == {Scheme.INT8} and len(d_layers) == 7
        assert len(llm.generate([[1, 2, 3]], GREEDY)[0].token_ids) == GREEDY.max_new_tokens
    with LLM(target, draft, strategy="sd", draft_quant="int8-dynamic") as llm:  # torch.ao: the fastest draft
        assert {type(m) for m in llm.draft.modules()} >= {torch.ao.nn.quantized.dynamic.Linear}
        assert not any(isinstance(m, WeightOnlyLinear) for m in llm.target.modules())
    # the caller's models were quantised as copies
    assert not any(isinstance(m, WeightOnlyLinear) for m in [*target.modules(), *draft.modules()])
    with pytest.raises(ValueError, match="already has low-bit layers"):
        LLM(quantize_weights_copy(target), target_quant="int8")


def quantize_weights_copy(model):
    import copy

    quantized = copy.deepcopy(model)
    quantize_weights(quantized, "int8")
    return quantized


def test_quantize_model_casts_only_the_float_layers_and_keeps_ties():
    from engine.loading.quantize import quantize_model

    model = tiny_model(vocab_size=48, seed=0)
    model.lm_head.weight = model.model.embed_tokens.weight  # tied, as in Qwen2.5 1.5B
    quantize_model(model, "int4", dtype=torch.bfloat16)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert model.lm_head.weight.dtype == torch.bfloat16
    layer = model.model.layers[0].self_attn.q_proj
    assert layer.scales.dtype == torch.bfloat16 and layer.packed.dtype == torch.uint8
    assert model(IDS).logits.dtype == torch.bfloat16


def test_load_quantized_reads_the_low_bit_cache_when_it_has_the_model(tmp_path, monkeypatch):
    from engine.loading import lowbit_cache
    from engine.loading.models import load_quantized

    tiny_model(vocab_size=48, seed=2).save_pretrained(tmp_path / "m")
    asked = []

    def no_cache(spec, scheme, group_size, cache_dir, *, head_quant=None):
        asked.append((spec, scheme, group_size, cache_dir, head_quant))
        return None

    monkeypatch.setattr(lowbit_cache, "load", no_cache)
    # No low-bit cache: the float32 weights are quantised at load, the float layers cast to dtype.
    loaded = load_quantized(tmp_path / "m", "int4", dtype=torch.bfloat16, cache_dir=tmp_path / "c")
    assert asked == [(str(tmp_path / "m"), "int4", 32, tmp_path / "c", None)]
    assert sum(isinstance(m, WeightOnlyLinear) for m in loaded.model.modules()) == 14
    assert loaded.model.lm_head.weight.dtype == torch.bfloat16
    reference = quantize_model_copy(tiny_model(vocab_size=48, seed=2), "int4")
    assert torch.equal(loaded.model.model.layers[0].mlp.up_proj.packed, reference.model.layers[0].mlp.up_proj.packed)
    # A low-bit cache that has it: its model is used as it is (only the float layers cast).
    cached = quantize_model_copy(tiny_model(vocab_size=48, seed=3), "int8")
    monkeypatch.setattr(lowbit_cache, "load", lambda *args, **kwargs: cached)
    with LLM(str(tmp_path / "m"), target_quant="int8", dtype="float32") as llm:
        assert llm.target is cached and llm.target.lm_head.weight.dtype == torch.float32


def quantize_model_copy(model, scheme):
    from engine.loading.quantize import quantize_model

    return quantize_model(model, scheme)
