"""The draft side of `saguaro calibrate`: the draft in a process of its own (spawned), pinned to its own cores
as SSD's worker is, timing the draft's forwards on command while the target times its own
(saguaro.calibration.measure sends the commands)."""

from __future__ import annotations

import time

from saguaro.calibration.target_rounds import ragged


def _worker(conn, recipe, threads: int, cores, ids: list[int], K: int, temperature: float = 0.0) -> None:
    """Draft side: serve timed commands over `conn` until "exit"; a failure goes back as ("error", text)."""
    try:
        _serve(conn, recipe, threads, cores, ids, K, temperature)
    except Exception as err:  # noqa: BLE001  the parent reports it in one line
        conn.send(("error", f"{type(err).__name__}: {err}"))


def _serve(conn, recipe, threads: int, cores, ids: list[int], K: int, temperature: float = 0.0) -> None:
    """Times are (start, end) perf_counter pairs (CLOCK_MONOTONIC on Linux: comparable across processes). The
    draft samples at `temperature` (0: greedy), as the workload's SD drafts, backups and builds do."""
    import os

    import torch

    from engine.drafting import draft_tokens
    from engine.kv_cache import KVState
    from engine.sampling import RowSampling
    from engine.sampling_params import SamplingParams
    from engine.sparse import RANK_DEPTH, TopLogits
    from engine.ssd.tree import decode_branches, draft_compact

    torch.set_num_threads(threads)
    if cores and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, cores)
    device = torch.device("cpu")
    model = recipe.build(device)
    V = int(model.get_output_embeddings().out_features)
    sampling = SamplingParams(temperature=temperature, stop_on_eos=False)
    gen = torch.Generator().manual_seed(0)
    pick = torch.Generator().manual_seed(1)
    base: KVState | None = None
    conn.send(("ready", V))

    def rows_of(b: int) -> KVState:
        return ragged(base, b)

    def feed(b: int) -> torch.Tensor:
        return torch.tensor([ids[i % len(ids)] for i in range(b)], dtype=torch.long).reshape(b, 1)

    with torch.inference_mode():
        while True:
            cmd, *a = conn.recv()
            if cmd == "exit":
                return
            if cmd == "prefill":  # (tokens, keep, batch)
                n, keep, b = a
                state = KVState(model, b, device)
                t0 = time.perf_counter()
                state.extend(torch.tensor([ids[:n]] * b, dtype=torch.long), logits_to_keep=1)
                conn.send([(t0, time.perf_counter())])
                if keep:
                    base = state
            elif cmd == "context":  # roll the cache back to `c` tokens (exact)
                (c,) = a
                base.rollback(base.lengths - c)
                conn.send(int(base.lengths[0]))
            elif cmd in ("sd", "backup"):  # (batch, repeats[, k, width]): k draft forwards over the batch
                b, reps, *shape = a  # (default K), the first feeding `width` tokens a row (default 1)
                k, width = shape if shape else (K, 1)
                state, params, times = rows_of(b), RowSampling([sampling] * b), []
                first = torch.cat([feed(b)] * width, dim=1)  # [b, width]
                for _ in range(reps):
                    t0 = time.perf_counter()
                    if cmd == "sd":
                        draft_tokens(state, first, None, k, (1,) * k, 1.0, params, [gen] * b)
                    else:  # the worker's backup: ranked, compact q, every row missed
                        draft_compact(state, first, None, k, (1,) * k, 1.0, params, [gen] * b, RANK_DEPTH)
                    times.append((t0, time.perf_counter()))
                    state.rollback(torch.full((b,), width + k - 1, dtype=torch.long))
                conn.send(times)
            elif cmd == "build":  # (batch, branches per row): one cache build, timed; says when it starts
                b, per_row = a
                depth = max(RANK_DEPTH, per_row + 1)
                N = b * per_row
                params = RowSampling([sampling] * N)
                state = rows_of(b)  # [.., x_1..x_K] are the prompt's last K tokens
                row = torch.arange(b).repeat_interleave(per_row)
                k = torch.randint(0, K + 1, (N,), generator=pick)
                t = torch.randint(0, V, (N,), generator=pick)
                t0 = time.perf_counter()
                conn.send(("started", t0))
                glue = state.extend(feed(b)).float()  # the glue forward after a hit: one tail token per row
                TopLogits.of(glue[:, -1], depth)
                decode_branches(state, row, k, t, K, (per_row + 1,) * K, 1.0, params, [gen] * N, depth)
                conn.send([(t0, time.perf_counter())])


class DraftWorker:
    """The parent's end: commands out, timed answers back; a failure in the worker raises here."""

    def __init__(self, recipe, threads: int, ids: list[int], K: int, temperature: float = 0.0):
        import torch.multiprocessing as mp

        from engine.ssd.placement import worker_cores

        cores, _ = worker_cores(threads)
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_worker, args=(child, recipe, threads, cores, ids, K, temperature), daemon=True)
        self.proc.start()
        child.close()

    def ask(self, *cmd, timeout_s: float = 1800.0):
        self.conn.send(cmd)
        return self.recv(timeout_s)

    def recv(self, timeout_s: float = 1800.0):
        if not self.conn.poll(timeout_s) and not self.proc.is_alive():
            raise RuntimeError(f"the calibration's draft worker stopped (exit code {self.proc.exitcode})")
        try:
            message = self.conn.recv()
        except EOFError:
            self.proc.join(5)
            raise RuntimeError(f"the calibration's draft worker stopped (exit code {self.proc.exitcode})") from None
        if isinstance(message, tuple) and message[0] == "error":
            raise ValueError(f"the draft failed in calibrate's worker process: {message[1]}")
        return message

    def close(self) -> None:
        if self.proc.is_alive():
            try:
                self.conn.send(("exit",))
            except (BrokenPipeError, OSError):
                pass
            self.proc.join(10)
        if self.proc.is_alive():
            self.proc.terminate()
            self.proc.join(5)


def start_worker(recipe, threads: int, ids: list[int], K: int, temperature: float = 0.0) -> DraftWorker:
    """The draft in its own process (spawned), pinned to the last `threads` cores as SSD's worker is, sampling
    at `temperature`."""
    return DraftWorker(recipe, threads, ids, K, temperature)
