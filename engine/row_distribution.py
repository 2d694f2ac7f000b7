"""What the target's distribution means for one request: min_tokens holds back the ids that would end it, and
`logprobs` reports each emitted token's log-probability under the model's own distribution (RAW) or under the
one sampled (PROCESSED). Rows are the decode loop's; logits and p are [B, T, V] over a round's positions."""

from __future__ import annotations

import torch
from torch import Tensor

from engine.outputs import TokenLogprob
from engine.sampling_params import LogprobsMode
from engine.sequence import Sequence


def hold_back_stops(logits: Tensor, seqs: list[Sequence]) -> Tensor:
    """logits [B, T, V] with the ids that would end row b set to -inf at the positions whose token would come
    before its min_tokens (position j predicts output token len(output_ids) + j); the same tensor when no row
    needs it."""
    masked = logits
    for b, seq in enumerate(seqs):
        short = seq.params.min_tokens - len(seq.output_ids)  # positions of this row still held back
        stops = seq.params.stops_before(seq.eos_ids) if short > 0 else ()
        if stops:
            if masked is logits:
                masked = logits.clone()
            masked[b, :short, list(stops)] = -torch.inf
    return masked


def logprobs(
    logits: Tensor, p: Tensor, tokens: list[list[int]], seqs: list[Sequence]
) -> list[list[TokenLogprob] | None]:
    """Per row, each emitted token's log-probability (token i at position i) and the top N there, for the rows
    that asked (None for the others): under the model's own log-softmax of logits [B, T, V] (RAW), or under
    the distribution sampled, p [B, T, V] (PROCESSED)."""
    out: list[list[TokenLogprob] | None] = []
    for b, (toks, seq) in enumerate(zip(tokens, seqs, strict=True)):
        n = seq.params.logprobs
        if n is None:
            out.append(None)
            continue
        if seq.params.logprobs_mode is LogprobsMode.PROCESSED:
            rows = p[b, : len(toks)].log()  # [T, V]
        else:
            rows = torch.log_softmax(logits[b, : len(toks)].float(), dim=-1)  # [T, V]
        chosen = rows.gather(-1, torch.tensor(toks, device=rows.device)[:, None])[:, 0].tolist()
        tops = torch.topk(rows, n, dim=-1) if n else None
        lps = []
        for i, (token, lp) in enumerate(zip(toks, chosen, strict=True)):
            top = tuple(zip(tops.indices[i].tolist(), tops.values[i].tolist(), strict=True)) if tops is not None else ()
            lps.append(TokenLogprob(token, lp, top))
        out.append(lps)
    return out
