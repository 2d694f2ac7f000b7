"""Driving the decode loop by hand: requests that join a running batch at chosen steps."""

from engine import LLM


def staggered(llm: LLM, prompts, params, join_at: list[int]):
    """Submit prompt i before step join_at[i]; step until all finish. Returns the sequences and batch sizes."""
    seqs = [llm.make_sequence(list(p), params, index=i, seed=i) for i, p in enumerate(prompts)]
    step, sizes = 0, []
    while not all(s.finished for s in seqs):
        for seq, at in zip(seqs, join_at, strict=True):
            if at == step:
                llm.loop.submit(seq)
        llm.loop.step()
        sizes.append(len(llm.loop.running))
        step += 1
        assert step < 500
    return seqs, sizes
