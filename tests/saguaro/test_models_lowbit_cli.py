"""`saguaro models provision --lowbit` builds the low-bit entries straight from the GGUFs
(engine.loading.lowbit_cache)."""

from engine.loading import lowbit_cache, provision
from saguaro.cli import main


def test_lowbit_provisioning_builds_each_model_of_the_group(tmp_path, monkeypatch, capsys):
    calls = []

    def fake(model, cache_dir=None, *, lowbit, group_size, rebuild, progress=None):
        calls.append((model, cache_dir, lowbit, group_size, rebuild))
        return tmp_path / f"{model}-{lowbit}"

    monkeypatch.setattr(lowbit_cache, "provision_lowbit", fake)
    monkeypatch.setattr(provision, "locate_parts", lambda packaged: [])
    assert main(["models", "provision", "--which", "default", "--lowbit", "int4", "--cache", str(tmp_path)]) == 0
    assert [(m, lowbit, g, r) for m, _, lowbit, g, r in calls] == [
        (a, "int4", 32, False) for a in provision.GROUPS["default"]
    ]
    out = capsys.readouterr().out
    assert all(f"{a}: int4 (group 32)" in out for a in provision.GROUPS["default"])


def test_lowbit_provisioning_of_the_smoke_model_loads_as_a_low_bit_model(tmp_path):
    # real: SmolLM2-135M's GGUF (Q4_1) is small; the entry is built and the engine loads it
    from engine.loading.models import load_quantized
    from engine.loading.weight_only import WeightOnlyLinear

    assert (
        main(["models", "provision", "--which", provision.SMOKE_MODEL, "--lowbit", "int4", "--cache", str(tmp_path)])
        == 0
    )
    loaded = load_quantized(provision.SMOKE_MODEL, "int4", cache_dir=tmp_path)
    assert any(isinstance(m, WeightOnlyLinear) for m in loaded.model.modules())
    assert not (tmp_path / provision.PACKAGED[provision.SMOKE_MODEL].key / "model.safetensors").exists()
