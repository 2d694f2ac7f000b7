"""The draft worker: answers each verification outcome with the next speculation, then pre-drafts the
one after it for the likely outcomes while the target verifies (docs/ssd.md §2).

Per round: `respond(round)` looks every sequence up in the speculation cache (hit: the pre-drafted
branch becomes that sequence's state) or runs the backup (miss), prefills the sequences that join (their
first speculation comes from the backup), and returns the next speculation; `build_cache()` then runs the
glue decode over that speculation and the K batched branch forwards. When every row hit, the answer is the
cached branches, and the draft's KV is rebuilt from them only after the answer has gone (at the start of
`build_cache`): ~3 ms of forks and copies off the target's critical path on the default pair. Sequences
join and leave between rounds (continuous batching); each has its own sampling settings and random stream.
The same class runs in the target's process (tests) or in its own process (`serve`).

Draft KV bookkeeping per row, between `respond` and `build_cache`: the cache holds the committed tokens
except `tail` (not yet fed): after a hit [y_K] (the branch fed t*, y_1..y_{K−1}); after the neural
backup [y_K]; after a fast backup or for a joiner's fast backup [t*, y_1..y_K]. The glue feeds the tails, so
afterwards every row holds [.., t*, y_1..y_K] and the draft has its logits at all K+1 positions.

Adaptive K (docs/ssd.md §2, engine.strategies.lookahead): each round asks for a speculation of length
`Round.K` and says how long the cache's branches are to be (`Round.K_next`, the length the target will ask
for next round). K here is the length of the current speculation; the branches are `branch_K` long. A
cached branch is a hit only if it has exactly the asked length (any other length is a miss), so a hit's
tokens and q are the ones drafted for that very length. When no row hits and the backup is the neural draft,
the speculation is `Round.K_miss` long instead (the target's SD-optimal length for a round drafted on its
critical path), and the next cache is built over that shorter speculation.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from engine import host
from engine.checks import Checks
from engine.config import SpeculativeConfig
from engine.invariant import race_ranking
from engine.kv_cache import KVState, new_state, prefill, right_aligned
from engine.sampling import RowSampling, warp_rows
from engine.sampling_params import SamplingMode, SamplingParams
from engine.sparse import RANK_DEPTH, SparseQ, TopLogits, host_ranks, support_width
from engine.ssd.backups import lookup_tokens, random_backup
from engine.ssd.messages import Join, Prefill, Round, Source, Speculation
from engine.ssd.policy import DraftPolicy
from engine.ssd.speculation_cache import SpeculationCache, guess_plan
from engine.ssd.tree import decode_branches, draft_compact
from engine.ssd.worker_rows import Current, Rows
from engine.timing import Stopwatch
from theory.glossary import Backup

SOURCE_OF = {Backup.NEURAL: Source.NEURAL, Backup.RANDOM: Source.RANDOM, Backup.LOOKUP: Source.LOOKUP}


class DraftWorker:
    """The draft's side of SSD. Its work stays on `device`: the KV cache, every branch, the rankings the cache's
    guesses come from and the guesses themselves. Per round only the token ids and q of the rows the target
    verifies leave it (on the host when `host_answers`, for a worker whose answers cross a link; else on
    `device`, for the target's own process), and the host reads the few ids its bookkeeping needs."""

    def __init__(
        self,
        model: torch.nn.Module,
        spec: SpeculativeConfig,
        pad_id: int,
        device: torch.device,
        host_answers: bool = False,
    ):
        self.model = model
        self.host_answers = host_answers
        self.spec = spec
        self.K = spec.K  # length of the current speculation
        self.branch_K = spec.K  # length of the branches the next cache pre-drafts
        self.cache_K = spec.K  # length of the branches in the cache now
        self.pad_id = pad_id
        self.device = device
        self.policy = DraftPolicy(spec)
        self.rows = Rows()
        self.state = new_state(model, 0, device)
        self.cache = SpeculationCache([], None)
        self.current: Current | None = None
        self.row_fanout: list[tuple[int, ...]] = []
        self.glue_ranking: np.ndarray | None = None  # [n, K+1, M] the ranking the last cache's guesses came from (host)
        self.checks = Checks()  # the drafting's input checks, read with the next answer's tokens
        self.V = 0  # the vocabulary, from the first round
        self.build_ms = 0.0
        self.built_fanout = list(self.policy.schedule(True))
        self.last_backup: str | None = None
        self.last_backup_ms = 0.0
        self._unsettled = None  # an all-hit answer's KV surgery, done after the answer went out (`_settle`)
        self.prefilled: tuple[list[int], list[list[int]], KVState] | None = None  # from a Prefill: ids, prompts, KV

    # -- one round ----------------------------------------------------------------------------
    def respond(self, msg: Round) -> Speculation:
        self._settle()
        K, n_old = self.K, len(msg.accepted)
        if n_old != len(self.rows.seq_ids):
            raise ValueError(f"round for {n_old} rows, but the worker holds {len(self.rows.seq_ids)}")
        if n_old and msg.K_last != K:
            raise ValueError(f"round for a speculation of length {msg.K_last}, but the last one had {K}")
        if not (1 <= msg.K <= self.spec.K and 1 <= msg.K_next <= self.spec.K and 1 <= msg.K_miss <= msg.K):
            raise ValueError(
                f"round asks for K={msg.K}, K_next={msg.K_next}, K_miss={msg.K_miss}: K and K_next must "
                f"lie in 1..{self.spec.K}, K_miss in 1..K"
            )
        if msg.K != self.spec.K or msg.K_next != self.spec.K or msg.K_miss != msg.K:
            if not self.spec.adaptive:
                raise ValueError(f"round asks for K={msg.K}, K_next={msg.K_next} but K is fixed at {self.spec.K}")
        same_length = msg.K == self.cache_K  # a cached branch of another length is a miss
        found: list[int | None] = []
        x = self.current.listed if n_old else []
        ranks = self._outcome_ranks(msg) if n_old else []
        for b, (seq_id, kb, tb) in enumerate(zip(self.rows.seq_ids, msg.accepted, msg.bonus, strict=False)):
            found.append(self.cache.lookup(seq_id, kb, tb) if same_length else None)
            self.rows.contexts[b].extend(x[b][:kb] + [tb])  # in place: a round adds its tokens, copies nothing
            if msg.alive[b]:
                self.policy.observe_round(
                    self.current.sources[b], kb, self.row_fanout[b][kb], found[b] is not None, K, rank=ranks[b]
                )
        if n_old:
            self.policy.observe_times(msg.verify_ms, self.build_ms, self.last_backup, self.last_backup_ms)
            # Every row now holds x_1..x_K (glue); keep the verified x_1..x_k.
            self.state.rollback([K - k for k in msg.accepted])

        alive = [b for b, a in enumerate(msg.alive) if a]
        hit_rows = [b for b in alive if found[b] is not None]
        missed = [b for b in alive if found[b] is None]
        old_state, branches = self.state, self.cache.branches

        def settle() -> KVState:
            # Rows that go on: a hit takes its branch's state, a miss keeps its own; back in batch order.
            parts = [old_state.fork(missed)]
            if hit_rows:
                parts.insert(0, branches.state.fork([found[b] for b in hit_rows]))
            order = {b: i for i, b in enumerate(hit_rows + missed)}
            state = KVState.concat(parts)
            state.select([order[b] for b in alive])
            return state

        rows = self.rows.keep(alive)
        bonus = [msg.bonus[b] for b in alive]
        hit_index = [found[b] for b in alive]
        if missed or msg.joins:  # the backup and the joiners' prefill need the draft's state now
            state = settle()
            if msg.joins:
                state = KVState.concat([state, self._prefill(msg.joins)])
            self.state = state
        else:
            # Every row hit: the answer is the cached branches, so the draft's KV is rebuilt from them after the
            # answer has gone out (`build_cache` settles it first), off the target's critical path.
            self._unsettled = settle
        self.prefilled = None  # announced prompts that did not join (they finished at their first token)
        if msg.joins:
            rows = rows + self._join_rows(msg.joins)
            bonus += [j.pending for j in msg.joins]
            hit_index += [None] * len(msg.joins)
        self.rows = rows
        self.V = msg.V
        self.K, self.branch_K = msg.K, msg.K_next
        # The round's one backup decision: it sets the length of an all-miss round and drafts the misses.
        backup = self.policy.backup(len(hit_index)) if None in hit_index else None
        if backup is Backup.NEURAL and all(i is None for i in hit_index):
            self.K = msg.K_miss  # every row drafts on the critical path, as in SD: SD's length (Round.K_miss)
        return self._next_speculation(bonus, hit_index, backup, msg.round, ranks)

    def _outcome_ranks(self, msg: Round) -> list[int]:
        """Each row's rank of its verified bonus among the guesses the last cache could make (every row,
        finished or not: its outcome was verified all the same); −1 where no cache was built. On the host, from
        the ranking the build read with its guesses."""
        if self.glue_ranking is None or self.glue_ranking.shape[0] != len(msg.accepted):
            return [-1] * len(msg.accepted)
        n = len(msg.accepted)
        listed = self.current.listed
        excluded = [row[kb] if kb < len(row) else -1 for row, kb in zip(listed, msg.accepted, strict=True)]  # x_{k+1}
        ids = self.glue_ranking[np.arange(n), np.asarray(msg.accepted)]  # [n, M]
        return host_ranks(ids, np.asarray(msg.bonus), np.asarray(excluded), self.V)

    def prefill_ahead(self, msg: Prefill) -> None:
        """Prefill prompts the target is prefilling now, for the Round that brings them as joins."""
        self.prefilled = (msg.seq_ids, msg.prompts, self._prefill_prompts(msg.prompts))

    def _prefill(self, joins: list[Join]) -> KVState:
        """The joiners' prompts through the draft (their first token is the tail, fed by the backup): taken from
        the Prefill that announced them when it holds every one of them with the same prompt."""
        ahead, self.prefilled = self.prefilled, None
        if ahead is not None:
            ids, prompts, state = ahead
            at = {seq_id: i for i, seq_id in enumerate(ids)}
            rows = [at.get(j.seq_id) for j in joins]
            if all(r is not None and prompts[r] == j.prompt for r, j in zip(rows, joins, strict=False)):
                if rows != list(range(len(ids))):  # some announced prompts finished at their first token
                    state.select(rows)
                return state
        return self._prefill_prompts([j.prompt for j in joins])

    def _prefill_prompts(self, prompts: list[list[int]]) -> KVState:
        return prefill(new_state(self.model, len(prompts), self.device), prompts, self.pad_id, self.device)

    def _join_rows(self, joins: list[Join]) -> Rows:
        params = [
            SamplingParams(
                temperature=j.temperature,
                top_k=j.top_k or None,
                top_p=j.top_p if j.top_p < 1 else None,
                stop_on_eos=False,
                sampling_mode=SamplingMode.INVARIANT if j.invariant else SamplingMode.STANDARD,
            )
            for j in joins
        ]
        return Rows([j.seq_id for j in joins], [j.prompt + [j.pending] for j in joins], params, [j.seed for j in joins])

    def _next_speculation(
        self, bonus: list[int], hit_index: list[int | None], backup: Backup | None, round_: int, ranks: list[int]
    ) -> Speculation:
        """Assemble the next speculation on the worker's device: cached branches for the hit rows, `backup` (the
        round's choice; None when every row hit) for the rest. The host reads its tokens once."""
        K, V, n, on = self.K, self.V, len(self.rows.seq_ids), self.device
        hit = [i is not None for i in hit_index]
        hits = [b for b in range(n) if hit[b]]
        miss = [b for b in range(n) if not hit[b]]
        depth = self.depth()
        width = support_width(self.rows.params)
        tokens: list[Tensor] = []  # [., K] of the hit rows, then of the missed rows
        qs: list[SparseQ] = []  # likewise, [., K, V]
        rankings: list[TopLogits] = []  # likewise, [., K, M]
        if hits:
            branches, i = self.cache.branches, host.tensor([hit_index[b] for b in hits], torch.long, on)
            tokens.append(branches.tokens[i])
            qs.append(branches.q.rows(i))
            rankings.append(branches.ranking.rows(i))
        t0 = Stopwatch()  # the host's clock, read after the answer's read (which waits for the backup's work)
        if miss:
            if backup is Backup.NEURAL:
                first = [[] if hit[b] else [bonus[b]] for b in range(n)]
                first_t, first_v = right_aligned(first, self.pad_id, on)
                active = host.tensor([not h for h in hit], torch.bool, on)  # [n]
                y, qy, ranking = draft_compact(
                    self.state,
                    first_t,
                    first_v,
                    K,
                    self.saguaro_top(False),
                    self.spec.C,
                    RowSampling(self.rows.params),
                    self.rows.keys(),
                    depth,
                    active,
                    width,
                    fed=[len(f) for f in first],
                    active_host=[not h for h in hit],
                    checks=self.checks,
                )
                rows = host.tensor(miss, torch.long, on)
                tokens.append(y[rows])
                qs.append(qy.rows(rows))
                rankings.append(ranking.rows(rows))
            else:
                if backup is Backup.RANDOM:
                    y, qy = random_backup(self.rows.keys(miss), K, V)
                    tokens.append(host.upload(y, on))
                    qs.append(SparseQ(V, None, host.upload(qy, on)))  # uniform: dense (its support is everything)
                else:  # a point mass at each token, kept as its support: nothing over the vocabulary
                    y = host.upload(lookup_tokens([self.rows.contexts[b] for b in miss], K), on)
                    tokens.append(y)
                    qs.append(SparseQ.point_mass(y, V))
                # The fast backup's rows have no ranking yet: the glue decode makes it.
                rankings.append(TopLogits(torch.zeros(len(miss), K, depth, dtype=torch.long, device=on), V))
        order = host.tensor(sorted(range(n), key=(hits + miss).__getitem__), torch.long, on)  # back to row order
        if n:
            x, q, ranking = torch.cat(tokens)[order], SparseQ.cat(qs).rows(order), TopLogits.cat(rankings).rows(order)
        else:
            x = torch.zeros(0, K, dtype=torch.long, device=on)
            q = SparseQ(V, None, torch.zeros(0, K, V, device=on))
            ranking = TopLogits(torch.zeros(0, K, depth, dtype=torch.long, device=on), V)
        sent_x, sent_q = x, q  # [n, K], [n, K, V]
        checks, self.checks = self.checks, Checks()
        flags = checks.flags().to(on)  # the drafting's input checks since the last answer
        if self.host_answers:  # what crosses the link: x and q, in one wait for the device
            sent_x, flags, *parts = host.download([x, flags, q.values] + ([] if q.ids is None else [q.ids]))
            sent_q = SparseQ(V, parts[1] if len(parts) > 1 else None, parts[0])
            listed, failed = sent_x.tolist(), flags.tolist()
        else:  # in the target's process: x stays on the device, and the host reads it with the checks
            values = torch.cat([x.reshape(-1), flags]).tolist()  # the answer's one read
            listed = [values[b * K : (b + 1) * K] for b in range(n)]
            failed = values[n * K :]
        checks.raise_from(failed)
        known = [h or backup is Backup.NEURAL for h in hit]
        sources = ["hit" if h else backup.value for h in hit]
        tails = [[row[-1]] if kn else [tb] + row for row, kn, tb in zip(listed, known, bonus, strict=False)]
        self.current = Current(x, listed, ranking, known, sources, tails)
        self.last_backup = backup.value if backup else None
        self.last_backup_ms = t0.ms() if miss else 0.0
        source = [Source.HIT if hit[b] else SOURCE_OF[backup] for b in range(n)]
        return Speculation(
            round_,
            source,
            sent_x,
            sent_q,
            self.last_backup_ms,
            self.build_ms,
            len(self.cache),
            list(self.built_fanout),
            ranks,
        )

    def depth(self) -> int:
        """Tokens per position the ranking keeps: enough for the largest fan-out of either schedule + 1."""
        largest = max(
            max(self.policy.schedule(hit, K), default=0) for hit in (True, False) for K in {self.K, self.branch_K}
        )
        return min(max(RANK_DEPTH, largest + 1), self.V)

    def saguaro_top(self, after_hit: bool, K: int | None = None) -> tuple[int, ...]:
        """Saguaro's down-weighted set at draft positions 1..K of a speculation K long (default: the current
        one): the F_{i−1} guesses + the drafted token."""
        K = self.K if K is None else K
        return tuple(f + 1 for f in self.policy.schedule(after_hit, K)[:K])

    def _race_glue(self, ids: Tensor, out: Tensor, racing: list[int], fast: list[int], K: int, depth: int) -> None:
        """The glue's ranking for drafter-invariant rows (ids [n, K+1, M], filled in place): by the race of each
        position, over the draft's warped q there, at x_{K+1}'s position for every such row and at x_1..x_K's for
        those a fast backup drafted (the others' came from their drafting)."""
        params = RowSampling([self.rows.params[b] for b in racing])
        q = warp_rows(out[racing, -1].float(), params, self.checks)  # [r, V] at position K+1
        ids[racing, K] = race_ranking(q, self.rows.keys(racing, K), depth)[:, : ids.shape[-1]]
        for b in (b for b in racing if b in set(fast)):
            q = warp_rows(out[b, -(K + 1) : -1].float(), params.index([racing.index(b)] * K), self.checks)  # [K, V]
            keys = self.rows.keys([b] * K, list(range(K)))
            ids[b, :K] = race_ranking(q, keys, depth)[:, : ids.shape[-1]]

    # -- while the target verifies ------------------------------------------------------------
    def _settle(self) -> None:
        """Rebuild the draft's KV from the hit branches, if the last answer left that for later."""
        if self._unsettled is not None:
            self.state, self._unsettled = self._unsettled(), None

    def build_cache(self) -> None:
        """Glue decode over the current speculation, then pre-draft every guessed outcome: all on the worker's
        device (the logits never leave it), the host reading only the guessed tokens, to index the cache."""
        t0 = Stopwatch()  # the host's clock, read after the build's one read (which waits for its work)
        self._settle()
        K, n, cur, on = self.K, len(self.rows.seq_ids), self.current, self.device
        if n == 0 or cur is None:
            self.row_fanout, self.cache, self.build_ms = [], SpeculationCache([], None), 0.0
            self.glue_ranking = None
            return
        length = self.branch_K
        self.row_fanout = [self.policy.schedule(s == "hit", K, length) for s in cur.sources]
        depth = self.depth()
        tokens, valid = right_aligned(cur.tails, self.pad_id, on)
        out = self.state.extend(tokens, valid, fed=[len(t) for t in cur.tails])  # [n, W, V] on the worker's device
        ids = torch.empty(n, K + 1, depth, dtype=torch.long, device=on)  # [n, K+1, M] ranking at positions 1..K+1
        kept = min(depth, cur.ranking.depth)
        ids[:, :K, :kept] = cur.ranking.ids[..., :kept]
        ids[:, K] = TopLogits.of(out[:, -1].float(), depth).ids
        fast = [b for b, known in enumerate(cur.known) if not known]  # fast backup rows: the glue fed t*, y_1..y_K
        if fast:
            f = host.tensor(fast, torch.long, on)
            ids[f, :K] = TopLogits.of(out[f, -(K + 1) : -1].float(), depth).ids
        racing = [b for b, params in enumerate(self.rows.params) if params.invariant]
        if racing:  # drafter-invariant rows: the target's winner is guessed from the draft's race (engine.invariant)
            self._race_glue(ids, out, racing, fast, K, depth)
        ranking = TopLogits(ids[..., :kept] if any(cur.known) else ids, out.shape[-1])
        del out
        rows, ks, t = guess_plan(ranking, cur.tokens, self.row_fanout)
        branches, keys = None, []
        if rows:
            branches = decode_branches(
                self.state,
                rows,
                ks,
                t,
                K,
                self.saguaro_top(True, length),
                self.spec.C,
                RowSampling(self.rows.params).index(rows),
                self.rows.keys(rows, [k + 1 for k in ks]),
                depth,
                length,
                support_width(self.rows.params),
                checks=self.checks,
            )
        # the build's one read: the guessed tokens (the cache's keys) and the ranking they came from (the outcome
        # ranks of the next answer are worked out from it on the host)
        glue = ranking.ids.reshape(-1)
        values = np.asarray(torch.cat([t, glue]).tolist(), dtype=np.int64)
        keys = list(zip(rows, ks, values[: len(rows)].tolist(), strict=False))
        self.glue_ranking = values[len(rows) :].reshape(ranking.ids.shape)
        self.cache, self.cache_K = SpeculationCache(self.rows.seq_ids, branches, keys), length
        self.built_fanout = list(self.policy.schedule(True, K, length))
        self.policy.built(K, length, len(rows) / n)
        self.build_ms = t0.ms()
