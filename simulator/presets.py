"""Hardware and model presets. Every number says where it comes from.

Accelerator peaks are the vendors' datasheet figures (dense bf16, i.e. half the "with sparsity" number).
The achieved fractions (`mem_efficiency`, `flops_efficiency`) and the per-layer overhead are our
assumptions, calibrated once as stated; change them with `dataclasses.replace` if your stack differs.
"""

from __future__ import annotations

from simulator.hardware import Hardware, ModelSpec

# Fixed per-layer overhead on the GPUs: chosen so that Llama-3.1-70B on 4×H100 (TP 4) decodes at the
# paper's AR figure, 54.7 tokens/s (Kumar, Dao & May 2026, §7 of docs/ssd.md), with the efficiencies below.
_GPU_LAYER_OVERHEAD_US = 40.0
_GPU_NOTE = (
    "; mem_efficiency 0.8 and flops_efficiency 0.7 are assumed achievable fractions; layer_overhead_us "
    "calibrated to the paper's Llama-3.1-70B TP4 H100 AR 54.7 tok/s; 10 µs per small NCCL all-reduce assumed"
)

HARDWARE: dict[str, Hardware] = {
    "h100": Hardware(
        name="H100-SXM5-80GB",
        mem_bandwidth_gb_s=3350.0,
        peak_tflops=989.5,
        interconnect_gb_s=450.0,
        interconnect_latency_us=10.0,
        layer_overhead_us=_GPU_LAYER_OVERHEAD_US,
        memory_gb=80.0,
        source="NVIDIA H100 datasheet: HBM3 3.35 TB/s, BF16 1,979 TFLOPS with sparsity (989.5 dense), "
        "NVLink 900 GB/s total (450 per direction), 80 GB" + _GPU_NOTE,
    ),
    "h200": Hardware(
        name="H200-SXM-141GB",
        mem_bandwidth_gb_s=4800.0,
        peak_tflops=989.5,
        interconnect_gb_s=450.0,
        interconnect_latency_us=10.0,
        layer_overhead_us=_GPU_LAYER_OVERHEAD_US,
        memory_gb=141.0,
        source="NVIDIA H200 datasheet: HBM3e 4.8 TB/s, BF16 1,979 TFLOPS with sparsity (989.5 dense), "
        "NVLink 900 GB/s total (450 per direction), 141 GB" + _GPU_NOTE,
    ),
    "a100": Hardware(
        name="A100-SXM4-80GB",
        mem_bandwidth_gb_s=2039.0,
        peak_tflops=312.0,
        interconnect_gb_s=300.0,
        interconnect_latency_us=10.0,
        layer_overhead_us=_GPU_LAYER_OVERHEAD_US,
        memory_gb=80.0,
        source="NVIDIA A100 datasheet: HBM2e 2,039 GB/s, BF16 312 TFLOPS dense (624 with sparsity), "
        "NVLink 600 GB/s total (300 per direction), 80 GB" + _GPU_NOTE,
    ),
    "cpu": Hardware(
        name="EPYC-2core-1thread",
        mem_bandwidth_gb_s=17.6,
        peak_tflops=0.293,
        interconnect_gb_s=2.0,
        interconnect_latency_us=100.0,
        layer_overhead_us=1716.0,
        memory_gb=24.0,
        mem_efficiency=1.0,
        flops_efficiency=1.0,
        overlaps_memory_and_compute=False,
        source="fitted (least squares on relative error) to docs/models-and-data.md, one thread, bf16, prefix 200: "
        "Qwen2.5-Coder-1.5B n=1,4,5,8 -> 289,285,301,341 ms; 0.5B n=1,4,8,12,16,24 -> 117,126,146,168,182,222 ms. "
        "Effective 17.6 GB/s and 293 GFLOP/s, added (memory and compute do not overlap: the max() form fits "
        "to 13%, the sum to 9%), 1.72 ms per layer per forward (the doc measured 1.5-2 ms of Python per layer). "
        "Link: a process-to-process queue on the same host, 0.1 ms and 2 GB/s assumed. Not valid for int8 drafts.",
    ),
}

MODELS: dict[str, ModelSpec] = {
    "llama-3.1-70b": ModelSpec(
        name="Llama-3.1-70B",
        params=70.55e9,
        layers=80,
        hidden=8192,
        heads=64,
        kv_heads=8,
        head_dim=128,
        vocab=128256,
        source="meta-llama/Llama-3.1-70B config.json (80 layers, hidden 8192, 64 heads, 8 KV heads, vocab 128256); "
        "70.55 B parameters (model card)",
    ),
    "llama-3.2-1b": ModelSpec(
        name="Llama-3.2-1B",
        params=1.236e9,
        layers=16,
        hidden=2048,
        heads=32,
        kv_heads=8,
        head_dim=64,
        vocab=128256,
        source="meta-llama/Llama-3.2-1B config.json (16 layers, hidden 2048, 32 heads, 8 KV heads, tied "
        "embeddings); 1.24 B parameters (model card)",
    ),
    "qwen3-32b": ModelSpec(
        name="Qwen3-32B",
        params=32.8e9,
        layers=64,
        hidden=5120,
        heads=64,
        kv_heads=8,
        head_dim=128,
        vocab=151936,
        source="Qwen/Qwen3-32B model card and config.json: 32.8 B parameters, 64 layers, 64 Q / 8 KV heads, "
        "head_dim 128",
    ),
    "qwen3-0.6b": ModelSpec(
        name="Qwen3-0.6B",
        params=0.6e9,
        layers=28,
        hidden=1024,
        heads=16,
        kv_heads=8,
        head_dim=128,
        vocab=151936,
        source="Qwen/Qwen3-0.6B model card and config.json: 0.6 B parameters (0.44 B non-embedding, tied), "
        "28 layers, 16 Q / 8 KV heads, head_dim 128",
    ),
    "qwen2.5-coder-1.5b": ModelSpec(
        name="Qwen2.5-Coder-1.5B-Instruct",
        params=1.78e9,
        layers=28,
        hidden=1536,
        heads=12,
        kv_heads=2,
        head_dim=128,
        vocab=151936,
        source="docs/models-and-data.md: 28 layers, d=1536, 12 heads / 2 KV heads, ~1.78 B parameters as loaded "
        "(untied output head), vocab 151,936",
    ),
    "qwen2.5-coder-0.5b": ModelSpec(
        name="Qwen2.5-Coder-0.5B-Instruct",
        params=0.63e9,
        layers=24,
        hidden=896,
        heads=14,
        kv_heads=2,
        head_dim=64,
        vocab=151936,
        source="docs/models-and-data.md: 24 layers, d=896, ~0.63 B parameters as loaded; Qwen2.5-0.5B "
        "config.json: 14 Q / 2 KV heads, head_dim 64",
    ),
}

# Model pairs with the number of target devices the paper (or this machine) uses.
PAIRS: dict[str, tuple[str, str, int]] = {
    "llama": ("llama-3.1-70b", "llama-3.2-1b", 4),  # paper: TP 4 on H100, draft on a 5th device
    "qwen3": ("qwen3-32b", "qwen3-0.6b", 2),
    "qwen-coder": ("qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b", 1),  # the default pair of this project
}


def _lookup(table: dict, name: str, what: str):
    key = name.strip().lower()
    if key not in table:
        raise ValueError(f"unknown {what} {name!r}: choose one of {', '.join(sorted(table))}")
    return table[key]


def hardware_preset(name: str) -> Hardware:
    """A hardware preset by name (h100, h200, a100, cpu)."""
    return _lookup(HARDWARE, name, "hardware")


def model_preset(name: str) -> ModelSpec:
    """A model preset by name (llama-3.1-70b, llama-3.2-1b, qwen3-32b, qwen3-0.6b, qwen2.5-coder-1.5b/-0.5b)."""
    return _lookup(MODELS, name, "model")
