"""The draft worker: answers each verification outcome with the next speculation, then pre-drafts the
one after it for the likely outcomes while the target verifies (docs/ssd.md §2).

Per round: `respond(outcome)` looks every sequence up in the speculation cache (hit: the pre-drafted
branch becomes that sequence's state) or runs the backup (miss), and returns the next speculation;
`build_cache()` then runs the glue decode over that speculation and the K batched branch forwards.
The same class runs in the target's process (tests) or in its own process (`serve`).

Draft KV bookkeeping per row, between `respond` and `build_cache`: the cache holds the committed tokens
except `tail` (not yet fed): after a hit [y_K] (the branch fed t*, y_1..y_{K−1}); after the neural
backup [y_K]; after a fast backup [t*, y_1..y_K]. The glue feeds the tails, so afterwards every row
holds [.., t*, y_1..y_K] and the draft has its logits at all K+1 positions.
"""

from __future__ import annotations

import time

import torch
from torch import Tensor

from engine.config import SpeculativeConfig
from engine.kv_cache import KVState
from engine.sampling_params import SamplingParams
from engine.ssd.backups import lookup_backup, random_backup
from engine.ssd.messages import Outcome, Source, Speculation, Start
from engine.ssd.policy import DraftPolicy
from engine.ssd.speculation_cache import SpeculationCache, guesses
from engine.ssd.tree import decode_branches, draft_tokens, stack_rows
from engine.strategies.base import ms_since, right_aligned
from theory.glossary import Backup

SOURCE_OF = {Backup.NEURAL: Source.NEURAL, Backup.RANDOM: Source.RANDOM, Backup.LOOKUP: Source.LOOKUP}
SEED_OFFSET = 0x5A6  # the draft's random stream differs from the target's


class DraftWorker:
    def __init__(self, model: torch.nn.Module, spec: SpeculativeConfig, pad_id: int, device: torch.device):
        self.model = model
        self.spec = spec
        self.K = spec.K
        self.pad_id = pad_id
        self.device = device
        self.policy = DraftPolicy(spec)

    # -- a new batch --------------------------------------------------------------------------
    def start(self, msg: Start) -> Speculation:
        """Prefill the prompts and answer with a backup speculation for every sequence."""
        self.params = SamplingParams(
            temperature=msg.temperature, top_k=msg.top_k or None, top_p=msg.top_p if msg.top_p < 1 else None,
            max_new_tokens=1, stop_on_eos=False, seed=msg.seed,
        )
        self.generator = torch.Generator(device=self.device).manual_seed(msg.seed + SEED_OFFSET)
        self.V = msg.V
        self.seq_ids = list(msg.seq_ids)
        self.contexts = [p + [t] for p, t in zip(msg.prompts, msg.pending)]
        self.state = KVState(self.model, len(self.seq_ids), self.device)
        tokens, valid = right_aligned(msg.prompts, self.pad_id, self.device)
        self.state.extend(tokens, valid, logits_to_keep=1)
        self.cache = SpeculationCache(self.seq_ids, None)
        self.build_ms, self.built_fanout = 0.0, list(self.policy.schedule(True))
        self.round = 0
        n = len(self.seq_ids)
        return self._next_speculation(torch.tensor(msg.pending), [None] * n, 0)

    # -- one round ----------------------------------------------------------------------------
    def respond(self, msg: Outcome) -> Speculation:
        K = self.K
        k = torch.tensor(msg.accepted, dtype=torch.long)
        bonus = torch.tensor(msg.bonus, dtype=torch.long)
        x = self.x.tolist()
        found: list[int | None] = []
        for b, (seq_id, kb, tb) in enumerate(zip(self.seq_ids, msg.accepted, msg.bonus)):
            found.append(self.cache.lookup(seq_id, kb, tb))
            self.contexts[b] += x[b][:kb] + [tb]
            self.policy.observe_round(self.sources[b], kb, self.row_fanout[b][kb], found[b] is not None)
        self.policy.observe_times(msg.verify_ms, self.build_ms, self.last_backup, self.last_backup_ms)

        # Every row now holds x_1..x_K (glue); keep the verified x_1..x_k.
        self.state.rollback((K - k).to(self.device))
        alive = [b for b, a in enumerate(msg.alive) if a]
        hit_rows = [b for b in alive if found[b] is not None]
        miss_rows = [b for b in alive if found[b] is None]
        as_long = lambda v: torch.tensor(v, dtype=torch.long, device=self.device)  # noqa: E731
        if alive:
            parts = [(self.state, as_long(miss_rows))]
            if hit_rows:
                parts.insert(0, (self.cache.branches.state, as_long([found[b] for b in hit_rows])))
            self.state = stack_rows(parts)
            position = {b: i for i, b in enumerate(hit_rows + miss_rows)}
            self.state.select(as_long([position[b] for b in alive]))  # back to batch order
        self.seq_ids = [self.seq_ids[b] for b in alive]
        self.contexts = [self.contexts[b] for b in alive]
        return self._next_speculation(bonus[alive], [found[b] for b in alive], msg.round)

    def _next_speculation(self, bonus: Tensor, hit_index: list[int | None], round_: int) -> Speculation:
        """Assemble the next speculation: cached branches for the hit rows, the backup for the rest."""
        K, V, n = self.K, self.V, len(self.seq_ids)
        hit = [i is not None for i in hit_index]
        hits = [b for b in range(n) if hit[b]]
        miss = [b for b in range(n) if not hit[b]]
        tokens = torch.zeros(n, K, dtype=torch.long)  # [n, K]
        q = torch.zeros(n, K, V)  # [n, K, V]
        self.logits = torch.zeros(n, K, V)  # [n, K, V] draft logits at positions 1..K where known
        self.known = torch.zeros(n, dtype=torch.bool)  # [n] rows whose logits are known (hit, neural)
        self.sources = ["hit"] * n
        if hits:
            branches, i = self.cache.branches, torch.tensor([hit_index[b] for b in hits], dtype=torch.long)
            tokens[hits], q[hits], self.logits[hits] = branches.tokens[i], branches.q[i], branches.logits[i]
            self.known[hits] = True
        backup = self.policy.backup(max(n, 1)) if miss else None
        t0 = time.perf_counter()
        if miss:
            self.sources = [backup.value if not h else "hit" for h in hit]
            if backup is Backup.NEURAL:
                first = [[] if hit[b] else [int(bonus[b])] for b in range(n)]
                first_t, first_v = right_aligned(first, self.pad_id, self.device)
                active = ~torch.tensor(hit, dtype=torch.bool, device=self.device)  # [n]
                y, qy, z = draft_tokens(self.state, first_t, first_v, K, self.saguaro_top(False), self.spec.C,
                                        self.params, self.generator, active)
                rows = torch.tensor(miss, dtype=torch.long, device=self.device)
                tokens[miss], q[miss], self.logits[miss] = y[rows].cpu(), qy[rows].cpu(), z[rows].cpu()
                self.known[miss] = True
            else:
                if backup is Backup.RANDOM:
                    y, qy = random_backup(len(miss), K, V, self.generator)
                else:
                    y, qy = lookup_backup([self.contexts[b] for b in miss], K, V)
                tokens[miss], q[miss] = y.cpu(), qy.cpu()
        # Tails not yet fed to the draft: y_K after a hit or the neural backup, t*, y_1..y_K after a fast one.
        known, listed, bonus_list = self.known.tolist(), tokens.tolist(), bonus.tolist()
        self.tails = [[row[-1]] if kn else [tb] + row for row, kn, tb in zip(listed, known, bonus_list)]
        self.last_backup = backup.value if backup else None
        self.last_backup_ms = ms_since(t0) if miss else 0.0
        self.x = tokens
        source = [Source.HIT if hit[b] else SOURCE_OF[backup] for b in range(n)]
        reply = Speculation(round_, source, tokens, q, self.last_backup_ms, self.build_ms,
                            len(self.cache), list(self.built_fanout))
        return reply

    def saguaro_top(self, after_hit: bool) -> tuple[int, ...]:
        """Saguaro's down-weighted set at draft positions 1..K: the F_{i−1} guesses + the drafted token."""
        return tuple(f + 1 for f in self.policy.schedule(after_hit)[: self.K])

    # -- while the target verifies ------------------------------------------------------------
    def build_cache(self) -> None:
        """Glue decode over the current speculation, then pre-draft every guessed outcome."""
        t0 = time.perf_counter()
        K, n = self.K, len(self.seq_ids)
        self.row_fanout = [self.policy.schedule(s == "hit") for s in self.sources]
        if n == 0:
            self.cache, self.build_ms = SpeculationCache([], None), 0.0
            return
        tokens, valid = right_aligned(self.tails, self.pad_id, self.device)
        out = self.state.extend(tokens, valid).float().cpu()  # [n, W, V]
        logits = torch.empty(n, K + 1, out.shape[-1])  # [n, K+1, V] draft logits at positions 1..K+1
        logits[:, :K] = self.logits
        logits[:, K] = out[:, -1]
        fast = ~self.known  # fast backup rows: the glue fed t*, y_1..y_K (W = K + 1)
        if fast.any():
            logits[fast] = out[fast, -(K + 1) :]
        row, k, t = guesses(logits, self.x, self.row_fanout)
        branches = None
        if row.numel():
            dev = lambda v: v.to(self.device)  # noqa: E731
            branches = decode_branches(self.state, dev(row), dev(k), dev(t), K, self.saguaro_top(True),
                                       self.spec.C, self.params, self.generator)
            branches.row, branches.k, branches.t = row, k, t
            branches.tokens, branches.q, branches.logits = (
                branches.tokens.cpu(), branches.q.cpu(), branches.logits.cpu())
        self.cache = SpeculationCache(self.seq_ids, branches)
        self.built_fanout = list(self.policy.schedule(True))
        self.build_ms = ms_since(t0)
