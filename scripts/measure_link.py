"""Bytes on the SSD link per round: the draft's answer (tokens + q) as messages.encode lays it out.

Runs SSD with the worker in process (the same messages, not sent) and sums the bytes of every tensor that
encode() would send for each Speculation; prints the mean per round for each sampling setting.

    python scripts/measure_link.py --target smollm2-135m --draft smollm2-135m --batch 1
"""

from __future__ import annotations

import argparse


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", default="smollm2-135m")
    p.add_argument("--draft", default="smollm2-135m")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("-K", type=int, default=4)
    p.add_argument("--budget", type=int, default=8)
    p.add_argument("--tokens", type=int, default=24)
    args = p.parse_args(argv)

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
    settings = [("T = 0", dict(temperature=0.0)), ("T = 0.7", dict(temperature=0.7)),
                ("T = 0.7, top-k 50", dict(temperature=0.7, top_k=50))]
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
