"""Bytes and time on the SSD link per round: the draft's answer (tokens + q) as messages.encode lays it out.

Default: runs SSD with the worker in process (the same messages, not sent) and sums the bytes of every tensor
that encode() would send for each Speculation; prints the mean per round for each sampling setting.

    python -m benchmarks.link --target smollm2-135m --draft smollm2-135m --batch 1

--wire: no model; a synthetic answer per setting (greedy: one support id per position; top-k 50; dense q at
T > 0 without top-k) is encoded, sent to a worker process over a real gloo pair and echoed back, and decoded;
prints the milliseconds of each step and the transfers per message. Loopback on a shared machine:
the times are noisy, a few milliseconds of swing.

    python -m benchmarks.link --wire --batch 4 --vocab 151936
"""

from __future__ import annotations

import argparse
import time


def _echo(address: str, count: int) -> None:
    """The worker's side of --wire: receive each message's transfers and send them back unchanged."""
    import torch

    from engine.ssd.transport import DRAFT_RANK, connect, join_store
    from engine.ssd.wire import FRAME_BYTES, from_frame, rest_bytes

    torch.set_num_threads(1)
    peer = connect(join_store(address, 60.0), DRAFT_RANK, torch.device("cpu"), 60.0)
    for _ in range(count):
        wire = [peer._recv_one((FRAME_BYTES,), torch.uint8, 60.0)]
        rest = from_frame(wire[0])[1]
        if rest:
            wire.append(peer._recv_one((rest_bytes(rest),), torch.uint8, 60.0))
        for tensor in wire:
            peer.group.send([tensor], peer.peer, 0).wait()
    peer.close()


def _answer(B: int, K: int, V: int, S: int):
    """A Speculation of B rows whose q has S support entries per position (0: dense)."""
    import torch

    from engine.sparse import SparseQ
    from engine.ssd.messages import Source, Speculation

    g = torch.Generator().manual_seed(0)
    if S:
        ids = torch.stack([torch.randperm(V, generator=g)[:S] for _ in range(B * K)]).reshape(B, K, S)
        values = torch.rand(B, K, S, generator=g)
        q, tokens = SparseQ(V, ids, values / values.sum(-1, keepdim=True)), ids[..., 0]
    else:
        dense = torch.rand(B, K, V, generator=g)
        q = SparseQ(V, None, dense / dense.sum(-1, keepdim=True))
        tokens = torch.multinomial(q.values.reshape(-1, V), 1, generator=g).reshape(B, K)
    return Speculation(1, [Source.HIT] * B, tokens, q, 1.0, 2.0, 10, [5, 4, 3, 2, 1], [0] * B)


def wire(B: int, K: int, V: int, repeats: int) -> None:
    import torch
    import torch.multiprocessing as mp

    from engine.ssd.messages import decode, encode
    from engine.ssd.transport import TARGET_RANK, connect, host_store
    from engine.ssd.wire import from_frame, rest_bytes, to_wire, unpack

    torch.set_num_threads(1)  # as the target's round on a two-core machine
    settings = [("T = 0", 1), ("T = 0.7, top-k 50", 50), ("T = 0.7 (dense q)", 0)]
    store, address = host_store("tcp://127.0.0.1:0", 60.0)
    child = mp.get_context("spawn").Process(target=_echo, args=(address, len(settings) * (repeats + 1)))
    child.start()
    link = connect(store, TARGET_RANK, torch.device("cpu"), 60.0)
    print(f"| setting (batch {B}, K = {K}, V = {V}) | bytes | transfers | encode ms | send + echo ms | decode ms |")
    print("|---|---|---|---|---|---|")
    for name, S in settings:
        msg = _answer(B, K, V, S)
        times = {"encode": 0.0, "link": 0.0, "decode": 0.0}
        for i in range(repeats + 1):  # the first is a warm-up
            t0 = time.perf_counter()
            sent = to_wire(encode(msg))
            t1 = time.perf_counter()
            for tensor in sent:
                link.group.send([tensor], link.peer, 0).wait()
            frame = link._recv_one((sent[0].numel(),), torch.uint8, 60.0)
            tensors, rest = from_frame(frame)
            if rest:
                tensors += unpack(link._recv_one((rest_bytes(rest),), torch.uint8, 60.0), rest)
            t2 = time.perf_counter()
            decode(tensors, K, V)
            t3 = time.perf_counter()
            if i:
                for key, dt in zip(times, (t1 - t0, t2 - t1, t3 - t2), strict=True):
                    times[key] += dt * 1e3 / repeats
        size = sum(t.numel() for t in sent)
        print(
            f"| {name} | {size} | {len(sent)} | {times['encode']:.3f} | {times['link']:.3f} | {times['decode']:.3f} |",
            flush=True,
        )
    link.close()
    child.join()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", default="smollm2-135m")
    p.add_argument("--draft", default="smollm2-135m")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("-K", type=int, default=4)
    p.add_argument("--budget", type=int, default=8)
    p.add_argument("--tokens", type=int, default=24)
    p.add_argument("--wire", action="store_true", help="time synthetic answers over a real gloo pair, no model")
    p.add_argument("--vocab", type=int, default=151936, help="--wire: V")
    p.add_argument("--repeats", type=int, default=20, help="--wire: timed messages per setting")
    args = p.parse_args(argv)
    if min(args.batch, args.K, args.vocab, args.repeats) < 1 or args.vocab < 50:
        p.error("--batch, -K and --repeats must be >= 1 and --vocab >= 50")
    if args.wire:
        wire(args.batch, args.K, args.vocab, args.repeats)
        return 0

    from engine import LLM, SamplingParams, SpeculativeConfig
    from engine.config import DraftPlacement
    from engine.ssd import channel
    from engine.ssd.messages import encode

    sizes: list[int] = []
    exchange = channel.InProcessChannel.exchange

    def counted(self, msg):
        reply = exchange(self, msg)
        sizes.append(sum(t.numel() * t.element_size() for t in encode(reply)))
        return reply

    channel.InProcessChannel.exchange = counted
    spec = SpeculativeConfig(K=args.K, budget=args.budget, placement=DraftPlacement(in_process=True))
    prompt = "Write a short story about a robot who learns to paint, in three sentences."
    settings = [
        ("T = 0", dict(temperature=0.0)),
        ("T = 0.7", dict(temperature=0.7)),
        ("T = 0.7, top-k 50", dict(temperature=0.7, top_k=50)),
    ]
    print(f"| setting (batch {args.batch}, K = {args.K}) | rounds | mean bytes per answer | largest |")
    print("|---|---|---|---|")
    with LLM(args.target, args.draft, strategy="ssd", speculative=spec) as llm:
        for name, kw in settings:
            sizes.clear()
            params = SamplingParams(max_new_tokens=args.tokens, stop_on_eos=False, seed=0, **kw)
            llm.generate([prompt] * args.batch, params)
            print(f"| {name} | {len(sizes)} | {sum(sizes) / len(sizes):.0f} | {max(sizes)} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
