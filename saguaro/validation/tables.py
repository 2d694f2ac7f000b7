"""The Markdown tables `saguaro validate engine` and `saguaro validate serving` print: measured against
predicted per configuration or load point, the share within tolerance, and (with --terms) each forward's
measured time beside the fit's."""

from __future__ import annotations

import json
from collections import defaultdict

import numpy as np

from saguaro.validation.engine import TERMS, TOLERANCE, EngineValidation
from saguaro.validation.serving import METRICS, STATS, ServedValidation
from saguaro.validation.serving import TOLERANCE as SERVED_TOLERANCE
from theory.glossary import Backup, Strategy


def engine_text(result: EngineValidation, with_terms: bool = False) -> str:
    """Every configuration's row, the share of held-out rows within 10%, and each calibration's fit."""
    table = result.rows
    lines = [
        "| configuration | rounds | measured tok/s | predicted | error | full-batch rounds: measured | error | "
        "former way | its error | hit rate, measured / predicted |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in table:
        mark = " (α source)" if r["reference"] else " (level source)" if r["level_source"] else ""
        hits_text = "" if r["hit_rate"] is None else f"{r['hit_rate']:.3f} / {r['predicted_hit_rate']:.3f}"
        full = (
            "- | -"
            if r["measured_full_batch"] is None
            else f"{r['measured_full_batch']:.3f} | {r['error_full_batch']:+.1%}"
        )
        lines.append(
            f"| {r['configuration']}{mark} | {r['rounds']} | {r['measured']:.3f} | {r['predicted']:.3f} | "
            f"{r['error']:+.1%} | {full} | {r['former_predicted']:.3f} | {r['former_error']:+.1%} | "
            f"{hits_text} |"
        )
    lines.append("")
    for name, held_out in (
        ("the α sources", [r for r in table if not r["reference"]]),
        ("the α and level sources", [r for r in table if not (r["reference"] or r["level_source"])]),
    ):
        if held_out:
            within = sum(abs(r["error"]) <= TOLERANCE for r in held_out)
            lines.append(
                f"{within} of {len(held_out)} configurations ({name} left out) within {TOLERANCE:.0%}; "
                f"median |error| {np.median([abs(r['error']) for r in held_out]):.1%}, "
                f"largest {max(held_out, key=lambda r: abs(r['error']))['error']:+.1%}"
            )
    held_out = result.held_out()
    if any(r["measured_full_batch"] is not None for r in held_out):
        within = sum(abs(r["error_full_batch"]) <= TOLERANCE for r in held_out)
        lines.append(
            f"against the full-batch rounds alone (what the closed loop simulates; the α sources left "
            f"out): {within} of {len(held_out)} within {TOLERANCE:.0%}, median |error| "
            f"{np.median([abs(r['error_full_batch']) for r in held_out]):.1%}"
        )
    if with_terms:
        lines += [
            "",
            "Each configuration's rounds against its leveled fit, median per term (ms, measured / predicted):",
            "",
            "| configuration | " + " | ".join(t.replace("_", " ") for t in TERMS) + " |",
            "|---|" + "---|" * len(TERMS),
        ]
        for r in table:
            cells = [
                (
                    f"{x['measured']:.0f} / {x['predicted']:.0f} ({x['predicted'] / x['measured'] - 1:+.0%})"
                    if (x := r["terms"].get(t))
                    else "-"
                )
                for t in TERMS
            ]
            lines.append(f"| {r['configuration']} | " + " | ".join(cells) + " |")
        lines.append("")
    for temperature, (path, timing) in sorted(result.calibrations.items()):
        lines.append(
            f"timing fitted on {path} (T = {temperature:g}): ssd_verify_factor "
            f"{timing.ssd_verify_factor:.3f}, link {timing.link_latency_ms:.2f} ms, fit errors "
            f"{json.dumps({k: round(v, 3) for k, v in timing.errors.items()})}"
            + (
                f"; build line from {timing.counts['build']} builds alone, ×{timing.build_beside:.3f} beside the verify"
                if "build_beside" in timing.counts
                else ""
            )
            + (f"; {timing.build_level_text()}" if timing.build_level else "")
        )
    return "\n".join(lines)


def served_text(result: ServedValidation, server_records: list | None = None) -> str:
    """Every load point's figures measured / predicted, the share within 15%, and with `server_records` the
    server's rounds term by term against the fit."""
    cols = [f"{m}_{s}" for m in METRICS for s in STATS]
    lines = [
        "| point | requests | " + " | ".join(f"{c} measured / predicted (ms)" for c in cols) + " |",
        "|---|---|" + "---|" * len(cols),
    ]
    for r in result.rows:
        cells = [f"{r['measured'][c]:.0f} / {r['predicted'][c]:.0f} ({r['error'][c]:+.0%})" for c in cols]
        lines.append(f"| {r['point']} | {r['requests']} | " + " | ".join(cells) + " |")
    errors = [abs(e) for e in result.errors()]
    policy, timing = result.policy, result.timing
    lines += [
        "",
        f"{sum(e <= SERVED_TOLERANCE for e in errors)} of {len(errors)} figures within "
        f"{SERVED_TOLERANCE:.0%}; median |error| {np.median(errors):.1%}; policy {policy.strategy.value} "
        f"K={policy.K}"
        + (f" F={'-'.join(map(str, policy.fanout))} {policy.backup.value}" if policy.fanout else "")
        + f"; ssd_verify_factor {timing.ssd_verify_factor:.3f}"
        + (f"; {timing.build_level_text()}" if timing.build_level else ""),
    ]
    if server_records is not None:
        lines += ["", "The server's rounds against the fit, median per batch size (ms, measured / predicted):", ""]
        lines += term_table(timing, server_records)
    return "\n".join(lines)


def term_table(timing, records) -> list[str]:
    """Markdown rows: per batch size, the served rounds' verify, cache build, neural backup and round against
    what the fit predicts for the same shapes. The round as the per-row policy runs it: max(verify, the build
    that was looked up) + the backup if a row missed."""
    ssd = timing.for_strategy(Strategy.SSD)
    by_batch: dict[int, list] = defaultdict(list)
    for r in records:
        if r.is_decode and r.strategy is Strategy.SSD:
            by_batch[r.batch_size].append(r)

    def cell(pairs: list[tuple[float, float]]) -> str:
        if not pairs:
            return "-"
        m, q = np.median([a for a, _ in pairs]), np.median([b for _, b in pairs])
        return f"{m:.0f} / {q:.0f} ({q / m - 1:+.0%})"

    out = [
        "| batch | rounds | verify | cache build | neural backup | round (built rounds) |",
        "|---|---|---|---|---|---|",
    ]
    for b, rows in sorted(by_batch.items()):

        def verify(r, b=b):
            return ssd.verify_ms(b, r.K + 1, r.context_len)

        def build(r, b=b):
            return ssd.cache_build_ms(b, r.K, r.branches, r.context_len)

        def backup(r, b=b):
            return ssd.backup_ms(Backup.NEURAL, b, r.K, r.context_len)

        built = [r for r in rows if r.cache_build_ms]
        missed = [r for r in rows if r.backup is Backup.NEURAL and r.backup_time_ms and not all(r.hit)]
        rounds = [(r.round_ms, max(verify(r), build(r)) + (backup(r) if not all(r.hit) else 0.0)) for r in built]
        out.append(
            f"| {b} | {len(rows)} | {cell([(r.verify_ms, verify(r)) for r in rows])} | "
            f"{cell([(r.cache_build_ms, build(r)) for r in built])} | "
            f"{cell([(r.backup_time_ms, backup(r)) for r in missed])} | {cell(rounds)} |"
        )
    shapes: dict[tuple[int, int], list[float]] = defaultdict(list)
    for r in records:
        if not r.is_decode:
            shapes[(r.batch_size, r.tokens)].append(r.verify_ms)
    out += ["", "| prefill: batch × tokens (prefills) | measured (median) | predicted |", "|---|---|---|"]
    for (b, n), ms in sorted(shapes.items()):
        m, want = float(np.median(ms)), ssd.prefill_ms(Strategy.SSD, b, n)
        out.append(f"| {b} × {n} ({len(ms)}) | {m:.0f} | {want:.0f} ({want / m - 1:+.0%}) |")
    return out
