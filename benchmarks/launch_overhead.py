"""What a decode step of a Llama-3.2-1B-shaped model costs on this GPU, eager against replayed from a CUDA graph,
and how it splits into per-layer and per-forward costs (`python -m benchmarks.launch_overhead OUT.json` on a CUDA
machine).

Random bf16 weights, batch 1, one new token a step over a fixed 512-position KV cache (attention reads all of
it: a timing study, not a model). Two implementations:
- lean: one fused QKV and one fused gate-up projection, RMSNorm, SDPA with grouped KV heads, a tied output head
  and an argmax, as graph-capturing engines (vLLM, SGLang, the SSD reference) lay a layer out;
- transformers: LlamaForCausalLM from the same config with its dynamic cache, as this project's engine runs it.
Each at 16 layers and at 1 layer: the difference over 15 layers is the per-layer cost, the rest the per-forward
cost (embedding, head, sampling, launch of the step). Median of 200 timed steps after 20 warm-ups.
"""

from __future__ import annotations

import json
import statistics
import sys
import time

import torch
import torch.nn.functional as F

from engine.kv_cache import cache_keyword

D, HEADS, KV_HEADS, HEAD_DIM, FFN, VOCAB, CACHE = 2048, 32, 8, 64, 8192, 128256, 512
WARMUP, STEPS = 20, 200


class Layer(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm1, self.norm2 = torch.nn.RMSNorm(D), torch.nn.RMSNorm(D)
        self.qkv = torch.nn.Linear(D, (HEADS + 2 * KV_HEADS) * HEAD_DIM, bias=False)
        self.o = torch.nn.Linear(HEADS * HEAD_DIM, D, bias=False)
        self.gate_up = torch.nn.Linear(D, 2 * FFN, bias=False)
        self.down = torch.nn.Linear(FFN, D, bias=False)
        self.register_buffer("k", torch.zeros(1, KV_HEADS, CACHE, HEAD_DIM))
        self.register_buffer("v", torch.zeros(1, KV_HEADS, CACHE, HEAD_DIM))

    def forward(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:  # x [1, 1, D], pos [1]
        q, k, v = self.qkv(self.norm1(x)).split([HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM], -1)
        self.k.index_copy_(2, pos, k.view(1, 1, KV_HEADS, HEAD_DIM).transpose(1, 2))
        self.v.index_copy_(2, pos, v.view(1, 1, KV_HEADS, HEAD_DIM).transpose(1, 2))
        attn = F.scaled_dot_product_attention(
            q.view(1, 1, HEADS, HEAD_DIM).transpose(1, 2), self.k, self.v, enable_gqa=True
        )  # [1, HEADS, 1, HEAD_DIM]
        x = x + self.o(attn.transpose(1, 2).reshape(1, 1, HEADS * HEAD_DIM))
        gate, up = self.gate_up(self.norm2(x)).chunk(2, -1)
        return x + self.down(F.silu(gate) * up)


class Lean(torch.nn.Module):
    def __init__(self, layers: int) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, D)
        self.layers = torch.nn.ModuleList(Layer() for _ in range(layers))
        self.norm = torch.nn.RMSNorm(D)

    def forward(self, token: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:  # token [1, 1]
        x = self.embed(token)
        for layer in self.layers:
            x = layer(x, pos)
        return (self.norm(x) @ self.embed.weight.T).argmax(-1)  # tied head, greedy


def timed(step) -> float:
    """Median ms of one step (synchronised), after warm-up."""
    for _ in range(WARMUP):
        step()
    torch.cuda.synchronize()
    times = []
    for _ in range(STEPS):
        start = time.perf_counter()
        step()
        torch.cuda.synchronize()
        times.append(1e3 * (time.perf_counter() - start))
    return statistics.median(times)


def lean(layers: int) -> dict:
    model = Lean(layers).cuda().to(torch.bfloat16).eval()
    token = torch.zeros(1, 1, dtype=torch.long, device="cuda")
    pos = torch.tensor([CACHE // 2], device="cuda")
    with torch.inference_mode():
        eager_ms = timed(lambda: model(token, pos))
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(3):
                model(token, pos)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            model(token, pos)
        graph_ms = timed(graph.replay)
    return {"layers": layers, "eager_ms": eager_ms, "graph_ms": graph_ms}


def transformers_eager(layers: int) -> dict:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        hidden_size=D,
        intermediate_size=FFN,
        num_hidden_layers=layers,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        head_dim=HEAD_DIM,
        vocab_size=VOCAB,
        tie_word_embeddings=True,
    )
    model = LlamaForCausalLM(config).cuda().to(torch.bfloat16).eval()
    with torch.inference_mode():
        out = model(torch.zeros(1, 128, dtype=torch.long, device="cuda"), use_cache=True)
        cache = out.past_key_values
        token = out.logits[:, -1:].argmax(-1)

        def step() -> None:
            nonlocal token
            token = model(token, **{cache_keyword(model): cache}, use_cache=True).logits[:, -1:].argmax(-1)

        return {"layers": layers, "eager_ms": timed(step)}


def split(at16: float, at1: float) -> dict:
    per_layer = (at16 - at1) / 15
    return {"per_layer_us": 1e3 * per_layer, "per_forward_ms": at1 - per_layer}


def main(path: str) -> None:
    out: dict = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__}
    runs = {n: lean(n) for n in (16, 1)}
    out["lean"] = runs
    out["lean_eager_split"] = split(runs[16]["eager_ms"], runs[1]["eager_ms"])
    out["lean_graph_split"] = split(runs[16]["graph_ms"], runs[1]["graph_ms"])
    out["lean_launch_overhead_us_per_layer"] = (
        out["lean_eager_split"]["per_layer_us"] - out["lean_graph_split"]["per_layer_us"]
    )
    try:
        hf = {n: transformers_eager(n) for n in (16, 1)}
        import transformers

        out["transformers"] = {
            "version": transformers.__version__,
            **{str(n): r for n, r in hf.items()},
            "eager_split": split(hf[16]["eager_ms"], hf[1]["eager_ms"]),
        }
    except Exception as err:  # noqa: BLE001  the lean figures stand on their own
        out["transformers"] = {"error": repr(err)}
    text = json.dumps(out, indent=1)
    print(text)
    with open(path, "w") as f:
        f.write(text + "\n")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "launch_overhead.json")
