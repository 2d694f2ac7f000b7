"""Hardware and model presets. Every number says where it comes from.

Each constant carries its source in a comment and in the preset's `source` text: a spec sheet or model
config (the vendors' datasheet peaks are dense bf16, i.e. half the "with sparsity" number), a paper
figure, "calibrated on X" (fitted once so the roofline reproduces a measured figure) or "assumed" (no
measurement behind it; change it with `dataclasses.replace` if your stack differs).
"""

from __future__ import annotations

import functools
from pathlib import Path

from simulator.hardware import Hardware, ModelSpec
from simulator.host_terms import read_host_terms
from simulator.timing import EngineCosts

# The reference engine's published test log: github.com/tanishqkumar/ssd, tests/reference_test_outputs.md at
# commit 2d8487c (runs of 2026-02-10, H100 80GB nodes, engine commit 8f8d3bc)
REFERENCE_LOG = "the reference engine's test log (github.com/tanishqkumar/ssd tests/reference_test_outputs.md, 2d8487c)"

# calibrated (least squares on relative error) on the three published TP-4 AR figures with the efficiencies
# below: Llama-3.1-70B 54.7 tokens/s (the paper, docs/ssd.md §7) and 54 (the reference's test log), Qwen3-32B 89
# (the test log): 52.7 µs puts them at -3.8%, -2.5% and +4.2% (tests/simulator/test_presets.py checks them)
_GPU_LAYER_OVERHEAD_US = 52.7
# The draft's steps (and any forward on one device) get their own per-layer cost: the 40 µs above absorbs
# whatever a TP-4 forward of a 70B model adds, and says nothing about a 1B model on one GPU.
# calibrated on Hazy Research, "Look Ma, No Bubbles! Designing a Low-Latency Megakernel for Llama-1B"
# (2025-05-27, https://hazyresearch.stanford.edu/blog/2025-05-27-no-bubbles): decoding one sequence of
# Llama-3.2-1B (bf16, 32-token prompt, 128 generated tokens, no speculation) on an H100, "vLLM and SGLang
# are only able to use at most 50% of available GPU bandwidth" (both engines replay decode as CUDA graphs
# by default, as the paper's engine does). 50% of 3.35 TB/s for 2.47 GB of weights is 1.48 ms per forward
# (677 tokens/s); the post's megakernel (78% of bandwidth) being "over 1.5x" faster puts it at >= 1.42 ms.
# With the efficiencies below, 34.5 µs per layer reproduces 1.48 ms (tests/simulator/test_presets.py).
_GPU_SINGLE_DEVICE_LAYER_OVERHEAD_US = 34.5
# Eager forwards (no CUDA graph): calibrated on the reference engine's eager ablation in its test log, Llama-3.2-1B
# draft on one H100, K 6, F 3, batch 1, random backup: its draft's cycle (glue forward and 6 tree-decode steps,
# 7 forwards of 16 layers) took 91.19 ms eager against 22.21 ms replayed from CUDA graphs, i.e. 616 µs more per
# layer per forward (tests/simulator/test_presets.py checks it)
_GPU_LAUNCH_OVERHEAD_US = (91.19 - 22.21) / (7 * 16) * 1e3
_NCCL_ALLREDUCE_US = 10.0  # assumed: one small NCCL all-reduce over NVLink
_GPU_MEM_EFFICIENCY = 0.8  # assumed achievable fraction of peak HBM bandwidth
_GPU_FLOPS_EFFICIENCY = 0.7  # assumed achievable fraction of dense bf16 peak
_USABLE_MEMORY_FRACTION = 0.9  # vLLM's default gpu_memory_utilization; the rest: activations, CUDA context
_GPU_NOTE = (
    f"; mem_efficiency {_GPU_MEM_EFFICIENCY} and flops_efficiency {_GPU_FLOPS_EFFICIENCY}: assumed; "
    f"layer_overhead_us {_GPU_LAYER_OVERHEAD_US:g}: calibrated on the published TP-4 H100 AR figures (Llama-3.1-70B "
    f"54.7 tok/s in the paper and 54 in the reference's test log, Qwen3-32B 89 in the log; forwards at TP > 1); "
    f"single_device_layer_overhead_us {_GPU_SINGLE_DEVICE_LAYER_OVERHEAD_US:g} "
    f"(forwards on one device: the draft's steps): calibrated on Llama-3.2-1B batch-1 decode on an H100 at 50% "
    f"of peak bandwidth, 1.48 ms per forward, the best of vLLM and SGLang (CUDA graphs) in Hazy Research's "
    f"'Look Ma, No Bubbles!' (https://hazyresearch.stanford.edu/blog/2025-05-27-no-bubbles), assumed to carry "
    f"to the other GPUs; launch_overhead_us {_GPU_LAUNCH_OVERHEAD_US:.0f} per layer of an eager forward: calibrated on "
    f"the reference engine's eager ablation (its draft's cycle, 91.19 ms eager against 22.21 ms with CUDA graphs, "
    f"Llama-3.2-1B, K 6, F 3, batch 1; {REFERENCE_LOG}), assumed to carry to the other GPUs; "
    f"interconnect_latency_us {_NCCL_ALLREDUCE_US:g} per small NCCL all-reduce: assumed; "
    f"usable memory {_USABLE_MEMORY_FRACTION}: vLLM's default gpu_memory_utilization"
)

HARDWARE: dict[str, Hardware] = {
    "h100": Hardware(
        name="H100-SXM5-80GB",
        mem_bandwidth_gb_s=3350.0,
        peak_tflops=989.5,
        interconnect_gb_s=450.0,
        interconnect_latency_us=_NCCL_ALLREDUCE_US,
        layer_overhead_us=_GPU_LAYER_OVERHEAD_US,
        single_device_layer_overhead_us=_GPU_SINGLE_DEVICE_LAYER_OVERHEAD_US,
        launch_overhead_us=_GPU_LAUNCH_OVERHEAD_US,
        memory_gb=80.0,
        mem_efficiency=_GPU_MEM_EFFICIENCY,
        flops_efficiency=_GPU_FLOPS_EFFICIENCY,
        usable_memory_fraction=_USABLE_MEMORY_FRACTION,
        source="NVIDIA H100 datasheet: HBM3 3.35 TB/s, BF16 1,979 TFLOPS with sparsity (989.5 dense), "
        "NVLink 900 GB/s total (450 per direction), 80 GB" + _GPU_NOTE,
    ),
    "h200": Hardware(
        name="H200-SXM-141GB",
        mem_bandwidth_gb_s=4800.0,
        peak_tflops=989.5,
        interconnect_gb_s=450.0,
        interconnect_latency_us=_NCCL_ALLREDUCE_US,
        layer_overhead_us=_GPU_LAYER_OVERHEAD_US,
        single_device_layer_overhead_us=_GPU_SINGLE_DEVICE_LAYER_OVERHEAD_US,
        launch_overhead_us=_GPU_LAUNCH_OVERHEAD_US,
        memory_gb=141.0,
        mem_efficiency=_GPU_MEM_EFFICIENCY,
        flops_efficiency=_GPU_FLOPS_EFFICIENCY,
        usable_memory_fraction=_USABLE_MEMORY_FRACTION,
        source="NVIDIA H200 datasheet: HBM3e 4.8 TB/s, BF16 1,979 TFLOPS with sparsity (989.5 dense), "
        "NVLink 900 GB/s total (450 per direction), 141 GB" + _GPU_NOTE,
    ),
    "a100": Hardware(
        name="A100-SXM4-80GB",
        mem_bandwidth_gb_s=2039.0,
        peak_tflops=312.0,
        interconnect_gb_s=300.0,
        interconnect_latency_us=_NCCL_ALLREDUCE_US,
        layer_overhead_us=_GPU_LAYER_OVERHEAD_US,
        single_device_layer_overhead_us=_GPU_SINGLE_DEVICE_LAYER_OVERHEAD_US,
        launch_overhead_us=_GPU_LAUNCH_OVERHEAD_US,
        memory_gb=80.0,
        mem_efficiency=_GPU_MEM_EFFICIENCY,
        flops_efficiency=_GPU_FLOPS_EFFICIENCY,
        usable_memory_fraction=_USABLE_MEMORY_FRACTION,
        source="NVIDIA A100 datasheet: HBM2e 2,039 GB/s, BF16 312 TFLOPS dense (624 with sparsity), "
        "NVLink 600 GB/s total (300 per direction), 80 GB" + _GPU_NOTE,
    ),
    "cpu": Hardware(
        name="EPYC-2core-1thread",
        mem_bandwidth_gb_s=17.6,  # calibrated, as the source says
        peak_tflops=0.293,  # calibrated, as the source says
        interconnect_gb_s=2.0,  # assumed: a process-to-process queue on the same host
        interconnect_latency_us=100.0,  # assumed, as above
        layer_overhead_us=1716.0,  # calibrated on the forwards below (Python per layer)
        memory_gb=24.0,  # this machine's RAM (`free`: 23 GiB, about 24 GB)
        mem_efficiency=1.0,  # the fitted 17.6 GB/s and 293 GFLOP/s are already achieved figures
        flops_efficiency=1.0,
        overlaps_memory_and_compute=False,
        usable_memory_fraction=0.75,  # assumed: the OS, Python and torch keep about a quarter
        source="calibrated on this machine: fitted (least squares on relative error) to docs/models-and-data.md, "
        "one thread, bf16, prefix 200: "
        "Qwen2.5-Coder-1.5B n=1,4,5,8 -> 289,285,301,341 ms; 0.5B n=1,4,8,12,16,24 -> 117,126,146,168,182,222 ms. "
        "Effective 17.6 GB/s and 293 GFLOP/s, added (memory and compute do not overlap: the max() form fits "
        "to 13%, the sum to 9%), 1.72 ms per layer per forward (the doc measured 1.5-2 ms of Python per layer). "
        "Link: a process-to-process queue on the same host, 0.1 ms and 2 GB/s assumed. Memory: this machine's "
        "24 GB of RAM, 75% usable (assumed). Not valid for int8 drafts.",
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
        context_window=131072,
        source="meta-llama/Llama-3.1-70B config.json (80 layers, hidden 8192, 64 heads, 8 KV heads, vocab 128256, "
        "max_position_embeddings 131072: the 128K context of the model card); 70.55 B parameters (model card); "
        "bf16 weights and KV cache",
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
        context_window=131072,
        source="meta-llama/Llama-3.2-1B config.json (16 layers, hidden 2048, 32 heads, 8 KV heads, tied "
        "embeddings, max_position_embeddings 131072); 1.24 B parameters (model card); bf16 weights and KV cache",
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
        context_window=40960,
        source="Qwen/Qwen3-32B model card and config.json: 32.8 B parameters, 64 layers, 64 Q / 8 KV heads, "
        "head_dim 128, max_position_embeddings 40960 (the model card: 32,768 native, 131,072 with YaRN, which "
        "this preset does not assume); bf16 weights and KV cache",
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
        context_window=40960,
        source="Qwen/Qwen3-0.6B model card and config.json: 0.6 B parameters (0.44 B non-embedding, tied), "
        "28 layers, 16 Q / 8 KV heads, head_dim 128, max_position_embeddings 40960; bf16 weights and KV cache",
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
        context_window=32768,
        source="docs/models-and-data.md: 28 layers, d=1536, 12 heads / 2 KV heads, ~1.78 B parameters as loaded "
        "(untied output head), vocab 151,936; config.json of the provisioned model: max_position_embeddings "
        "32768, no sliding window; bf16 weights and KV cache",
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
        context_window=32768,
        source="docs/models-and-data.md: 24 layers, d=896, ~0.63 B parameters as loaded; Qwen2.5-0.5B "
        "config.json: 14 Q / 2 KV heads, head_dim 64; config.json of the provisioned model: "
        "max_position_embeddings 32768; bf16 weights and KV cache",
    ),
}

# Model pairs: (target, draft, target tensor-parallel degree). The draft runs at TP 1 (SSD: on its own device).
PAIRS: dict[str, tuple[str, str, int]] = {
    "llama": ("llama-3.1-70b", "llama-3.2-1b", 4),
    "qwen3": ("qwen3-32b", "qwen3-0.6b", 4),
    "qwen-coder": ("qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b", 1),
}
# α of a pair preset when none is given: the acceptance rate fitted to the pair's published SD figure by
# `saguaro validate paper` (the paper's: Llama SD 161.8 tok/s, Qwen SD/AR 2.3/1.49, SD K 6 on the "reference"
# engine; tests/saguaro/validation/test_validate_paper.py checks they agree). The default pair's is measured instead
# (its rank tables, saguaro/commands/hit_choice.py)
PAIR_ALPHA: dict[str, float] = {"llama": 0.871, "qwen3": 0.690}
# where each pair's TP degree comes from
PAIR_SOURCES: dict[str, str] = {
    "llama": "the paper's setup (docs/ssd.md §7): TP 4 on H100, draft on a 5th device",
    "qwen3": "the paper's second pair, same setup (docs/ssd.md §7): TP 4, draft on its own device",
    "qwen-coder": "this project's default pair (docs/models-and-data.md): one device",
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


# What an engine adds to the roofline's forwards (simulator.timing.EngineCosts), each with its source.
ENGINES: dict[str, EngineCosts] = {
    "saguaro": EngineCosts(),
    "reference": EngineCosts(sd_extra_forward=True),
    # calibrated on the draft's costs in the reference's test log (saguaro/validation/log_engine.py derives them;
    # tests/saguaro/validation/test_validate_paper.py checks them):
    # - draft_layer_overhead_us: its batch-1 runs, Llama-3.2-1B, K 6: SSD's 238 tok/s over a 23.30 ms draft cycle
    #   is 5.55 tokens a round (α 0.921); SD's 172 tok/s at that α is a 32.24 ms round, of which the verify is
    #   the AR step and the rest 7 draft forwards: the preset's roofline plus 59.8 µs for each of 16 layers
    #   (vLLM and SGLang: 34.5 µs, the H100 preset's);
    # - tree_step_overhead_ms, build_row_us: the draft cycle at batch 1 with the random backup (22.21 ms) and at
    #   batch 16 (43.84 ms), simulated with the α fitted to SD's 172 tok/s and the α-model's hits
    "reference-log": EngineCosts(
        sd_extra_forward=True, draft_layer_overhead_us=59.8, tree_step_overhead_ms=1.41, build_row_us=4.35
    ),
    # calibrated on this engine's first GPU run (reports/2026-12-h200-gpu-check, commit f6a0865: one H200, random
    # weights shaped like Qwen2.5-1.5B/0.5B, bf16, eager transformers forwards, 64 tokens after 128-token prompts):
    # - eager: the forwards pay the hardware's launch overhead per layer;
    # - round_host_ms: AR's tokens/s at batch 1, 8 and 32 (13.1, 111.6, 386.1) over the eager roofline's step
    #   (19.1 ms) leave 58 ms a step of host work (geometric mean of the three ratios set to 1);
    # - draft_host_ms: SD's at α = 1, K 4 (8.2, 97.0, 414.4) leave 77 ms per draft forward on top.
    # Held out: SSD at α = 1 (8.5, 64.5), predicted 17-24% high (its worker shared the target's GPU and host).
    "saguaro-eager-h200": EngineCosts(eager=True, round_host_ms=58.0, draft_host_ms=77.0),
}
ENGINE_SOURCES: dict[str, str] = {
    "saguaro": "this engine: SD drafts K forwards, the first two tokens wide after an all-accepted round "
    "(engine/strategies/sd.py); no per-build costs beyond the forwards",
    "reference": "the reference engine (github.com/tanishqkumar/ssd, ssd/engine/speculator_sync.py): SD drafts "
    "K + 1 forwards a round, the last feeding x_K; the draft's steps as the H100 preset's (vLLM/SGLang)",
    "saguaro-eager-h200": "this engine with eager transformers forwards as it ran on one H200 at commit f6a0865 "
    "(reports/2026-12-h200-gpu-check): the launch overhead per layer, 58 ms of host work a "
    "round and 77 ms per draft forward (calibrated on its AR and SD tokens/s at batch 1-32)",
    "reference-log": f"the reference engine as {REFERENCE_LOG} times it: SD drafts K + 1 forwards at 59.8 µs a layer, "
    "each tree-decode step of an SSD build adds 1.41 ms of host work and 4.35 µs per branch row "
    "(calibrated on the log's draft cycles at batch 1 and 16 and its batch-1 SD and SSD)",
}


# Engines whose host terms come from a committed measurement (simulator.host_terms; read when first asked for):
# - saguaro-cpu: this engine's rounds with its forwards taken out (saguaro.calibration.host_terms) on the CPU,
#   at the commit and on the date the file records, with the default pair's vocabulary (151,936): the work of
#   every round beyond the forwards, per round, per draft forward and per SSD tree step, each with its part per
#   sequence or branch row. The forwards stay the hardware preset's.
DATA = Path(__file__).with_name("data")
MEASURED_ENGINES: dict[str, Path] = {"saguaro-cpu": DATA / "saguaro_cpu_host.json"}
MEASURED_ENGINE_SOURCES: dict[str, str] = {
    "saguaro-cpu": "this engine's host work measured with its forwards taken out (simulator/data/"
    "saguaro_cpu_host.json: the CPU, commit and date it ran at; python -m benchmarks.engine_overhead "
    "--host-terms-only): AR's, SD's and SSD's rounds at batch 1 and 8, K 4, greedy, vocabulary 151,936",
}


def engine_names() -> list[str]:
    """Every engine preset's name: the stated ones, then the measured ones."""
    return [*ENGINES, *MEASURED_ENGINES]


@functools.cache
def _measured_engine(path: Path) -> EngineCosts:
    return read_host_terms(path).costs()


def engine_preset(name: str) -> EngineCosts:
    """An engine's costs by name (saguaro, saguaro-eager-h200, reference, reference-log, saguaro-cpu)."""
    key = name.strip().lower()
    if key in MEASURED_ENGINES:
        return _measured_engine(MEASURED_ENGINES[key])
    if key not in ENGINES:
        raise ValueError(f"unknown engine {name!r}: choose one of {', '.join(sorted(engine_names()))}")
    return ENGINES[key]
