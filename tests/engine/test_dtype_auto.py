"""dtype "auto": bfloat16 where the device multiplies in it at speed, else float32 (float16 on an older GPU).

An AVX2-only CPU has no fast bfloat16 GEMM in torch: there a 64-row bf16 linear of the default target's MLP took
179 ms against float32's 38 (AMD EPYC, Zen 3), so a fixed bfloat16 default made prefills and batched verifies
2-5x slower. What auto chose is what the config, the run folder and the calibration record.
"""

from pathlib import Path

import pytest
import torch

from engine.loading import devices
from engine.loading.devices import AUTO_DTYPE, fast_bfloat16, resolve_dtype


def cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    line = next((x for x in text.splitlines() if x.startswith("flags")), "")
    return set(line.partition(":")[2].split())


@pytest.mark.parametrize("name", ["float32", "bfloat16", "float16"])
def test_a_named_dtype_is_kept_whatever_the_device_can_do(name, monkeypatch):
    monkeypatch.setattr(devices, "fast_bfloat16", lambda device: pytest.fail("a named dtype needs no probe"))
    assert resolve_dtype(name) == name


@pytest.mark.parametrize("fast, expected", [(True, "bfloat16"), (False, "float32")])
def test_auto_on_a_cpu_is_bfloat16_only_where_it_is_fast(fast, expected, monkeypatch):
    monkeypatch.setattr(devices, "fast_bfloat16", lambda device: fast)
    assert resolve_dtype(AUTO_DTYPE, "cpu") == expected


@pytest.mark.parametrize("fast, expected", [(True, "bfloat16"), (False, "float16")])
def test_auto_on_a_gpu_is_bfloat16_or_else_float16(fast, expected, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(devices, "fast_bfloat16", lambda device: fast and device.type == "cuda")
    assert resolve_dtype(AUTO_DTYPE, "cuda:0") == expected


def test_a_bad_name_is_refused_with_what_to_use():
    with pytest.raises(ValueError, match=r"unknown dtype 'bf16'; choose from auto, float32, bfloat16, float16"):
        resolve_dtype("bf16")


@pytest.mark.skipif(torch.cuda.is_available(), reason="a machine without CUDA")
def test_a_device_this_machine_lacks_is_refused_where_it_is_used_not_by_auto():
    # auto picks something; the configuration's own checks, then check_device, say what is wrong
    assert resolve_dtype(AUTO_DTYPE, "cuda") == resolve_dtype(AUTO_DTYPE, "gpu0") == "float32"
    from engine import LLM

    with pytest.raises(ValueError, match="is not available here"):
        LLM("qwen-coder-1.5b", device="cuda")
    with pytest.raises(ValueError, match="unknown device 'gpu0'"):
        LLM("qwen-coder-1.5b", device="gpu0")


@pytest.mark.skipif(not {"avx2", "sse4_2"} <= cpu_flags(), reason="the flags below are x86 Linux's")
def test_the_cpu_probe_follows_the_instruction_sets_torch_needs():
    # torch's oneDNN runs bf16 matmuls on AVX-512 (BW, VL, DQ: the "avx512_core" level) or AVX-NE-CONVERT; below
    # that (AVX2 alone, as on Zen 3) it falls back to a reference kernel
    flags = cpu_flags()
    if {"avx512bw", "avx512vl", "avx512dq"} <= flags:
        assert fast_bfloat16(torch.device("cpu"))
    elif "avx_ne_convert" not in flags:
        assert not fast_bfloat16(torch.device("cpu"))


@pytest.mark.parametrize("fast, expected", [(True, torch.bfloat16), (False, torch.float32)])
def test_llm_loads_a_folder_in_what_auto_chose_and_says_so(fast, expected, tmp_path, monkeypatch):
    from engine import LLM, SamplingParams
    from tests.engine.test_models import save_tiny

    monkeypatch.setattr(devices, "fast_bfloat16", lambda device: fast)
    folder = save_tiny(tmp_path / "tiny", vocab_size=64)
    with LLM(str(folder)) as llm:  # dtype left at its default, auto
        assert llm.config.dtype == str(expected).removeprefix("torch.")
        assert {p.dtype for p in llm.target.parameters()} == {expected}
        assert (
            len(
                llm.generate([[1, 2, 3]], SamplingParams(temperature=0, max_new_tokens=2, stop_on_eos=False))[
                    0
                ].token_ids
            )
            == 2
        )
