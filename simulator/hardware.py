"""Hardware and model specs, and the roofline time of one forward pass.

A forward over `rows` new tokens (all sequences and positions together) reads the weights once and the
KV cache of every sequence, and does about 2·params FLOPs per row (plus attention). Its time is the
larger of the memory time and the compute time on accelerators that overlap the two (GPUs), their sum
on this CPU (where the fit to measured timings says they do not overlap), plus a fixed cost per layer
(kernel launches / Python; a preset may set a separate one for forwards on one device, the draft's) and,
under tensor parallelism, two all-reduces per layer. A GPU forward replayed from a CUDA graph (the default)
pays the preset's per-layer cost; one launched eagerly, kernel by kernel from the host
(`Deployment(eager=True)`), pays the preset's `launch_overhead_us` per layer on top.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property


def _positive(name: str, value: float, hint: str = "") -> None:
    if not value > 0:  # also rejects NaN
        raise ValueError(f"{name} must be > 0{hint}; got {value!r}")


@dataclass(frozen=True)
class Hardware:
    """One accelerator (or CPU socket share). Peak numbers are per device; efficiencies are achieved fractions."""

    name: str
    mem_bandwidth_gb_s: float  # peak memory bandwidth, GB/s
    peak_tflops: float  # dense bf16 peak, TFLOP/s
    interconnect_gb_s: float  # device-to-device bandwidth per direction, GB/s (TP all-reduce, draft link)
    interconnect_latency_us: float  # one small all-reduce / one message, µs
    layer_overhead_us: float  # fixed cost per layer per forward (launches, framework), µs
    memory_gb: float  # device memory, GB (10^9 bytes)
    mem_efficiency: float = 0.8  # assumed achievable fraction of peak bandwidth (each preset says why)
    flops_efficiency: float = 0.7  # assumed achievable fraction of peak FLOP/s
    overlaps_memory_and_compute: bool = True
    # fraction of memory_gb that weights and KV cache may fill; the rest holds activations and the runtime
    # (vLLM's default gpu_memory_utilization, 0.9)
    usable_memory_fraction: float = 0.9
    # fixed cost per layer of a forward on ONE device (tp = 1: the draft's steps, a small target), µs;
    # None: layer_overhead_us. The GPU presets calibrate it apart from the TP target's (simulator/presets.py)
    single_device_layer_overhead_us: float | None = None
    # added per layer per forward when its kernels are launched one by one from the host (eager: no CUDA graph,
    # no compiled graph), µs; None: not stated (the CPU preset's per-layer cost is the eager one already)
    launch_overhead_us: float | None = None
    source: str = ""

    def __post_init__(self) -> None:
        for field in ("mem_bandwidth_gb_s", "peak_tflops", "interconnect_gb_s", "memory_gb"):
            _positive(field, getattr(self, field), f" for hardware {self.name!r}")
        optional = tuple(
            f for f in ("single_device_layer_overhead_us", "launch_overhead_us") if getattr(self, f) is not None
        )
        for field in ("interconnect_latency_us", "layer_overhead_us", *optional):
            if not getattr(self, field) >= 0:
                raise ValueError(f"{field} must be >= 0 for hardware {self.name!r}; got {getattr(self, field)!r}")
        for field in ("mem_efficiency", "flops_efficiency", "usable_memory_fraction"):
            if not 0 < getattr(self, field) <= 1:
                raise ValueError(f"{field} is a fraction and must lie in (0, 1]; got {getattr(self, field)}")

    @property
    def usable_memory_gb(self) -> float:
        return self.memory_gb * self.usable_memory_fraction

    def layer_overhead_for(self, tp: int, eager: bool = False) -> float:
        """The fixed cost per layer (µs) of a forward on `tp` devices, replayed from a graph or (`eager`)
        launched kernel by kernel."""
        base = self.layer_overhead_us
        if tp == 1 and self.single_device_layer_overhead_us is not None:
            base = self.single_device_layer_overhead_us
        if eager and self.launch_overhead_us is not None:
            base += self.launch_overhead_us
        return base


@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only transformer, as the roofline and the feasibility checks need it."""

    name: str
    params: float  # parameters as loaded (untied output head counted)
    layers: int
    hidden: int
    heads: int  # attention (query) heads
    kv_heads: int
    head_dim: int
    vocab: int
    context_window: int | None = None  # most positions (prompt + output) the model takes; None: not checked
    dtype_bytes: float = 2.0  # bytes per weight (bf16)
    kv_dtype_bytes: float = 2.0  # bytes per KV-cache element (bf16, as the weights: vLLM's kv_cache_dtype "auto")
    source: str = ""

    def __post_init__(self) -> None:
        for field in (
            "params",
            "layers",
            "hidden",
            "heads",
            "kv_heads",
            "head_dim",
            "vocab",
            "dtype_bytes",
            "kv_dtype_bytes",
        ):
            _positive(field, getattr(self, field), f" for model {self.name!r}")
        if self.context_window is not None:
            _positive("context_window", self.context_window, f" for model {self.name!r}")
        if self.kv_heads > self.heads:
            raise ValueError(f"kv_heads ({self.kv_heads}) cannot exceed heads ({self.heads}) for {self.name!r}")

    @property
    def weight_bytes(self) -> float:
        return self.params * self.dtype_bytes

    @property
    def kv_bytes_per_token(self) -> float:
        return 2.0 * self.layers * self.kv_heads * self.head_dim * self.kv_dtype_bytes  # K and V


@dataclass(frozen=True)
class Deployment:
    """A model on `tp` devices of one kind (tensor parallel); `eager`: its forwards launched kernel by kernel
    from the host instead of replayed from a CUDA graph (the hardware's launch_overhead_us per layer)."""

    model: ModelSpec
    hardware: Hardware
    tp: int = 1
    eager: bool = False

    def __post_init__(self) -> None:
        if self.tp < 1:
            raise ValueError(f"tp (tensor-parallel degree) must be >= 1; got {self.tp}")
        need_gb = self.model.weight_bytes / 1e9 / self.tp
        if need_gb > self.hardware.memory_gb:
            raise ValueError(
                f"{self.model.name} needs {need_gb:.0f} GB of weights per device on {self.tp}× "
                f"{self.hardware.name} ({self.hardware.memory_gb:.0f} GB each): raise the tensor-parallel degree"
            )

    @cached_property
    def _per_unit_ms(self) -> tuple[float, float, float, float, float, float]:
        """The forward's time per unit of work, computed once (the simulator calls forward_ms every round)."""
        m, hw, tp = self.model, self.hardware, self.tp
        byte_ms = 1e3 / (hw.mem_bandwidth_gb_s * 1e9 * hw.mem_efficiency)
        flop_ms = 1e3 / (hw.peak_tflops * 1e12 * hw.flops_efficiency)
        fixed_ms, fixed_per_row_ms = m.layers * hw.layer_overhead_for(tp, self.eager) * 1e-3, 0.0
        if tp > 1:  # two ring all-reduces of the activations per layer
            fixed_ms += 2 * m.layers * hw.interconnect_latency_us * 1e-3
            ring_bytes_per_row = m.hidden * m.dtype_bytes * 2.0 * (tp - 1) / tp
            fixed_per_row_ms = 2 * m.layers * ring_bytes_per_row / (hw.interconnect_gb_s * 1e9) * 1e3
        return (
            m.weight_bytes / tp * byte_ms,  # weights, read once per forward
            m.kv_bytes_per_token / tp * byte_ms,  # per cached token read
            2.0 * m.params / tp * flop_ms,  # per new row
            4.0 * m.layers * m.heads * m.head_dim / tp * flop_ms,  # per (row, attended token) pair
            fixed_ms,
            fixed_per_row_ms,
        )

    def forward_ms(self, rows: int, kv_tokens: int, attention_pairs: int) -> float:
        """Time of one forward over `rows` new tokens.

        `kv_tokens`: cached tokens read in all (each sequence's cache once, also when several rows share it);
        `attention_pairs`: Σ over rows of the tokens each row attends to (the attention FLOPs).
        """
        weights_ms, kv_ms, row_ms, pair_ms, fixed_ms, fixed_row_ms = self._per_unit_ms
        mem_ms = weights_ms + kv_tokens * kv_ms
        compute_ms = rows * row_ms + attention_pairs * pair_ms
        if self.hardware.overlaps_memory_and_compute:
            return max(mem_ms, compute_ms) + fixed_ms + rows * fixed_row_ms
        return mem_ms + compute_ms + fixed_ms + rows * fixed_row_ms
