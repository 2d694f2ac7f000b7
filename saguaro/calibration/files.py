"""Calibration and round-record files read for a fit: every record of several files fitted as one, and the
precision (dtype, low-bit schemes) each calibration or run folder states, so that a fit is never applied to a
run of another precision. `saguaro simulate --fit`, `saguaro plan` and `saguaro validate` read them here."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path


def read_all(paths: list[str]) -> list:
    from simulator import read_records

    return [r for path in paths for r in read_records(path)]


def fit_all(paths: list[str]):
    """fit_timing over every file; what the records lack comes from a calibration summary (`saguaro calibrate`
    writes NAME.summary.json next to NAME.jsonl): the fast backups' times, and the engine's host work outside a
    round's timers where the summary measured it (its "host_terms"; the first calibration that has them), which
    a round's overhead is then at least (simulator.fit.FittedTiming.with_host_overhead). Summaries written before
    calibrations measured host work have no "host_terms": their fit is as it was."""
    from simulator import fit_timing

    fitted = fit_timing(read_all(paths))
    fast = dict(fitted.fast_backup_ms)
    host = None
    for path in paths:
        summary = Path(path).with_suffix(".summary.json")
        if summary.is_file():
            data = json.loads(summary.read_text())
            for kind, ms in (data.get("fast_backup_ms") or {}).items():
                fast.setdefault(kind, float(ms))
            if host is None:
                host = host_terms(data)
    fitted = replace(fitted, fast_backup_ms=fast)
    return fitted if host is None else fitted.with_host_overhead(host.outside())


def host_terms(summary: dict):
    """The host-work measurement a calibration summary records (simulator.host_terms.HostTerms), or None where it
    has none (an older summary, --host-rounds 0, or a measurement that failed: its "error")."""
    from simulator.host_terms import HostTerms

    data = summary.get("host_terms")
    if not data or "error" in data:
        return None
    return HostTerms.from_dict(data)


PRECISION = (
    "dtype",
    "draft_dtype",
    "target_quant",
    "draft_quant",
    "target_head_quant",
    "draft_head_quant",
    "quant_group_size",
)


def precision(settings: dict) -> dict:
    """What decides a forward's cost beyond its shape, from a calibration summary's inputs or a bench run's
    config: the dtype and the low-bit schemes (draft_int8 is draft_quant int8-dynamic, whose float parts are
    float32; the group size only where int4 uses it). A file that does not state the dtype (older summaries,
    client runs) states nothing here."""
    if "dtype" not in settings:
        return {}
    out = {k: settings.get(k) for k in PRECISION}
    if settings.get("draft_int8"):
        out["draft_quant"] = "int8-dynamic"
    out["draft_dtype"] = "float32" if out["draft_quant"] == "int8-dynamic" else out["draft_dtype"] or out["dtype"]
    if "int4" not in (out["target_quant"], out["draft_quant"]):
        del out["quant_group_size"]
    return out


def _stated_precision(path: Path) -> dict:
    """precision() of a calibration (NAME.jsonl, from NAME.summary.json) or a run (its folder's config.json,
    given the folder or a file in it); {} where no such file says."""
    summary = path.with_suffix(".summary.json")
    if path.suffix == ".jsonl" and summary.is_file():
        return precision(json.loads(summary.read_text()).get("inputs", {}))
    folder = path if path.is_dir() else path.parent
    config = folder / "config.json"
    return precision(json.loads(config.read_text())) if config.is_file() else {}


def check_same_precision(calibrations, runs=()) -> None:
    """ValueError unless every calibration and run that states its precision states the first one's: a fit
    timed in bfloat16 cannot level or predict a float32 run (on an AVX2-only CPU their costs grow differently
    with the rows), nor an int4 target a float one. dtype auto makes this easy to get wrong: it resolves by
    machine, and each file records what it resolved to."""
    stated = [(Path(p), _stated_precision(Path(p))) for p in [*calibrations, *runs]]
    stated = [(p, s) for p, s in stated if s]
    if not stated:
        return
    first, want = stated[0]
    for path, got in stated[1:]:
        differ = [k for k in want if want.get(k) != got.get(k)]
        if differ:
            what = ", ".join(f"{k} {got.get(k)} (not {want.get(k)})" for k in differ)
            raise ValueError(
                f"{path} has {what} against {first}: a calibration predicts only the precision it "
                "timed; calibrate again with the runs' --dtype and quantisation flags"
            )
