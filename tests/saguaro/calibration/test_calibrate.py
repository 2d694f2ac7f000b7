"""`saguaro calibrate` on tiny models: timed forwards at every --context and batch size (one prefill, exact
roll-backs), builds next to the verify at batch·budget branches, the summary echoing its inputs, and records
the timing fit reads (the verify alone, SSD's slowdown as a factor, the build's context × branches term)."""

import json
import statistics

import pytest

from saguaro.calibration.measure import prefill_points
from saguaro.cli import main
from simulator import fit_timing, read_records
from tests.engine.test_models import save_tiny


def calibrate_argv(
    target, draft, out, *extra: str, budget=("2",), batch=("1",), repeats=1, prompt_ids=(1, 2, 3)
) -> list[str]:
    """`saguaro calibrate` on the tiny pair at its smallest grid (K 2, context 12, float32), plus `extra` flags."""
    return [
        "calibrate",
        "--target",
        str(target),
        "--draft",
        str(draft),
        "-K",
        "2",
        "--budget",
        *budget,
        "--batch",
        *batch,
        "--context",
        "12",
        "--repeats",
        str(repeats),
        "--prompt-ids",
        *(str(i) for i in prompt_ids),
        "--dtype",
        "float32",
        *extra,
        "--out",
        str(out),
    ]


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("pair")
    return save_tiny(root / "target", seed=0), save_tiny(root / "draft", seed=1)


@pytest.fixture(scope="module")
def calibrated(pair, tmp_path_factory):
    target, draft = pair
    out = tmp_path_factory.mktemp("calib") / "calib.jsonl"
    argv = [
        "calibrate",
        "--target",
        str(target),
        "--draft",
        str(draft),
        "-K",
        "2",
        "--budget",
        "2",
        "3",
        "--batch",
        "1",
        "2",
        "--context",
        "12",
        "40",
        "--repeats",
        "2",
        "--prompt-ids",
        "1",
        "2",
        "3",
        "4",
        "5",
        "6",
        "7",
        "--dtype",
        "float32",
        "--link-tokens",
        "24",
        "--build-tokens",
        "32",
        "--out",
        str(out),
    ]
    assert main(argv) == 0
    return out


def test_every_context_and_batch_is_timed(calibrated):
    decode = [r for r in read_records(calibrated) if r.is_decode and r.prompt_index is None]  # (not the engine's)
    points = {(r.strategy.value, r.batch_size, r.context_len) for r in decode}
    assert points == {(s, b, c) for s in ("ar", "sd", "ssd") for b in (1, 2) for c in (12, 40)}
    for b in (1, 2):
        for c in (12, 40):
            at = [r for r in decode if (r.batch_size, r.context_len) == (b, c)]
            assert sum(r.strategy.value == "ar" for r in at) == 2  # --repeats
            sd = [r for r in at if r.strategy.value == "sd"]
            drafted = [r for r in sd if r.draft_ms > 0]
            # the proposal at K and at one step, that step feeding one token a row and then two (as SD's does
            # after all accepted), each with its own 2-token verify: the fit's per-call and per-row costs need them
            assert sorted((r.K, r.first_width) for r in drafted) == [(1, 1), (1, 1), (1, 2), (1, 2), (2, 1), (2, 1)]
            assert all(r.verify_ms > 0 for r in drafted)
            # the verify alone, taken in turn with each build (2 budgets × 2 repeats), and at batch 1 the other
            # width (2K = 4; K + 1 = 3 and 2 are timed with the proposals): every one timed, none with a draft
            alone = sorted(r.K for r in sd if r.draft_ms == 0)
            assert alone == ([2] * 4 + [3, 3] if b == 1 else [2] * 4)
            assert all(r.verify_ms > 0 for r in sd)
            builds = [r for r in at if r.strategy.value == "ssd" and r.cache_build_ms]
            assert sorted(r.branches for r in builds) == [2 * b, 2 * b, 3 * b, 3 * b]  # batch · budget, 2 repeats
            assert all(r.verify_ms > 0 for r in builds)
            backups = [r for r in at if r.strategy.value == "ssd" and not any(r.hit)]
            assert backups and all(r.backup_ms > 0 and r.backup_time_ms == r.backup_ms for r in backups)
    prefill = [r for r in read_records(calibrated) if not r.is_decode]
    # batch 1 at the shortest, middle and longest context; batch 2 at the shortest and twice it
    assert sorted((r.batch_size, r.tokens) for r in prefill) == [(1, 12), (1, 26), (1, 40), (2, 12), (2, 24)]
    assert all(r.verify_ms > 0 and r.draft_ms > 0 for r in prefill)


def test_summary_echoes_its_inputs_and_the_interference(calibrated):
    summary = json.loads(calibrated.with_suffix(".summary.json").read_text())
    inputs = summary["inputs"]
    assert inputs["contexts"] == [12, 40] and inputs["batches"] == [1, 2] and inputs["budgets"] == [2, 3]
    assert inputs["target"].endswith("target") and inputs["draft"].endswith("draft")
    assert inputs["dtype"] == "float32" and inputs["threads"] == 1 and inputs["draft_threads"] == 1
    assert inputs["cpu"] and inputs["K"] == 2 and inputs["ragged_rows"] is True
    from saguaro.bench.environment import machine

    assert inputs["cpu_flags"] == machine().get("cpu_flags")  # tells an AVX2-only host from an AVX-512 one
    assert set(summary["interference"]) == {"1x12", "2x12", "1x40", "2x40"} and summary["interference_factor"] > 0
    assert set(summary["cache_build_ms"]) == {f"{b}x{c}x{b * B}" for b in (1, 2) for c in (12, 40) for B in (2, 3)}
    assert set(summary["fast_backup_ms"]) == {"random", "lookup"}
    fit = summary["fit"]  # the fit of these records and its predictions at batch 4, context 300
    assert len(fit["verify"]) == 3 and len(fit["build"]) == 4 and fit["ssd_verify_factor"] > 0
    assert fit["draft_call"] >= 0 and set(summary["sd_step_ms"]) == set(summary["sd_draft_ms"])
    assert all(set(widths) == {"width_1", "width_2"} for widths in summary["sd_step_ms"].values())
    assert all(ms > 0 for ms in fit["at_b4_c300_K4_ms"].values())
    # every fitted term
    assert len(fit["prefill_attention"]) == 2 and {"decode_one_row", "decode_knee", "backup"} <= set(fit)


def test_the_engines_own_ssd_rounds_come_last(calibrated):
    """--link-tokens: the engine's SSD at K 1, one guess per outcome, on the calibration's prompt; its decode
    rounds are written with the timed points, and the summary says what their hits waited."""
    engine = [r for r in read_records(calibrated) if r.prompt_index is not None and r.level is None]
    link = json.loads(calibrated.with_suffix(".summary.json").read_text())["link"]
    assert engine and len(engine) == link["rounds"] and all(r.is_decode for r in engine)
    assert all(r.strategy.value == "ssd" and r.K == 1 for r in engine)
    assert sum(sum(r.emitted) for r in engine) == 24 - 1  # the first token comes from the prefill
    timed = [r for r in engine if all(r.hit) and r.cache_build_ms < r.verify_ms]
    assert link["hits_timed"] == len(timed) and all(r.wait_ms > 0 for r in engine)
    want = round(statistics.median(r.wait_ms for r in timed), 3) if timed else None
    assert link["hit_wait_ms"] == pytest.approx(want, abs=2e-3) if timed else link["hit_wait_ms"] is None


def test_the_engines_build_rounds_level_the_builds(calibrated):
    """--build-tokens: the engine's SSD at K, the middle budget (2 of 2 and 3: the lower middle) and each batch
    size, marked level "build"; the summary gives their builds' medians and the fit their level by batch."""
    records = read_records(calibrated)
    level = [r for r in records if r.level == "build"]
    summary = json.loads(calibrated.with_suffix(".summary.json").read_text())
    assert summary["build_level"]["rounds"] == len(level) and summary["build_level"]["budget"] == 2
    assert summary["inputs"]["build_tokens"] == 32
    assert all(r.is_decode and r.strategy.value == "ssd" and r.K == 2 and r.prompt_index is not None for r in level)
    for b in (1, 2):
        own = [r for r in level if r.batch_size == b and r.branches == 2 * b and r.cache_build_ms]
        assert len(own) >= 3
        assert all(sum(r.fanout) == 2 for r in own)
        assert summary["build_level"]["build_ms"][str(b)] == pytest.approx(
            statistics.median(r.cache_build_ms for r in own), abs=0.01
        )
    assert {r.prompt_index for r in level if r.batch_size == 2} == {(0, 1)}  # the batch of two holds both prompts
    fitted = fit_timing(records)
    assert [b for b, _ in fitted.build_level] == [1, 2] and all(x > 0 for _, x in fitted.build_level)
    assert [b for b, _ in summary["fit"]["build_level"]] == [1, 2]
    line = fit_timing([r for r in records if r.level is None])  # the level is all the rounds change
    assert line.build == fitted.build and line.build_level == ()
    assert fitted.cache_build_ms(1, 2, 2, 30) == line.cache_build_ms(1, 2, 2, 30)  # measured, not applied
    ratio = fitted.with_build_level().cache_build_ms(1, 2, 2, 30) / line.cache_build_ms(1, 2, 2, 30)
    assert ratio == pytest.approx(fitted.build_level[0][1])


def test_the_records_fit_and_simulate(calibrated):
    records = read_records(calibrated)
    fitted = fit_timing(records)
    assert fitted.counts["ssd_verify"] == sum(r.strategy.value == "ssd" and r.level is None for r in records)
    assert fitted.ssd_verify_factor > 0 and fitted.build is not None and fitted.prefill_target is not None
    # simulate --fit reads the fast backups' times from the summary beside the records
    assert (
        main(
            [
                "simulate",
                "--fit",
                str(calibrated),
                "--strategy",
                "ssd",
                "--backup",
                "random",
                "--K",
                "2",
                "--budget",
                "3",
                "--rounds",
                "200",
                "--output-len",
                "16",
                "--prompt-len",
                "8",
            ]
        )
        == 0
    )


@pytest.mark.parametrize(
    "flags, message",
    [
        (["-K", "0"], "-K must be >= 1"),
        (["--batch", "0"], "--batch sizes"),
        (["--budget", "4", "0"], "--budget values"),
        (["--context", "64", "3"], "--context values must be at least K+1"),
        (["--repeats", "0"], "--repeats must be >= 1"),
        (["--temperature", "-0.5"], "--temperature must be >= 0"),
        (["--link-tokens", "-1"], "--link-tokens must be >= 0"),
        (["--build-tokens", "-1"], "--build-tokens must be >= 0"),
        (["--host-rounds", "-1"], "--host-rounds must be >= 0"),
    ],
)
def test_bad_settings_exit_2_with_a_line(flags, message, tmp_path, capsys):
    assert main(["calibrate", "--out", str(tmp_path / "x.jsonl"), *flags]) == 2
    assert message in capsys.readouterr().err


def test_the_progress_line_says_what_is_left_at_the_pace_so_far():
    """An AVX2-only host took 548 s where the README said ~2 min (2026-12-03): the first points say so."""
    from saguaro.calibration.measure import _time_left

    assert _time_left(120.0, 1, 6) == (
        "; point 1 of 6, about 10 min left at this pace (fewer --context, --batch, --budget or --repeats take less)"
    )
    assert _time_left(10.0, 1, 4) == "; point 1 of 4"  # half a minute left: no advice
    assert _time_left(300.0, 6, 6) == ""  # the last point: nothing left


def test_a_calibration_at_the_workloads_temperature(pair, tmp_path):
    """--temperature: the verify and the draft's proposal, backup and build sample at it; the summary says so,
    and the records hold every kind of point a greedy calibration's do."""
    target, draft = pair
    out = tmp_path / "hot.jsonl"
    assert main(calibrate_argv(target, draft, out, "--temperature", "0.7", "--link-tokens", "0")) == 0
    summary = json.loads(out.with_suffix(".summary.json").read_text())
    assert summary["inputs"]["temperature"] == 0.7 and summary["settings"]["temperature"] == 0.7
    records = read_records(out)
    assert "build_level" not in summary and all(r.level is None for r in records)  # --build-tokens is opt-in
    assert {r.strategy.value for r in records if r.is_decode} == {"ar", "sd", "ssd"}
    assert any(r.cache_build_ms for r in records) and any(r.draft_ms > 0 for r in records if r.is_decode)


def test_a_context_beyond_the_window_exits_2(pair, tmp_path, capsys):
    target, draft = pair
    assert (
        main(
            [
                "calibrate",
                "--target",
                str(target),
                "--draft",
                str(draft),
                "--context",
                "100000",
                "--prompt-ids",
                "1",
                "2",
                "--dtype",
                "float32",
                "--out",
                str(tmp_path / "x.jsonl"),
            ]
        )
        == 2
    )
    assert "context window" in capsys.readouterr().err


def test_a_draft_that_cannot_load_exits_2_with_the_workers_reason(pair, tmp_path, capsys):
    target, _ = pair
    assert (
        main(
            [
                "calibrate",
                "--target",
                str(target),
                "--draft",
                str(tmp_path / "missing"),
                "--context",
                "8",
                "--prompt-ids",
                "1",
                "2",
                "--dtype",
                "float32",
                "--out",
                str(tmp_path / "x.jsonl"),
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert "calibrate's worker process" in err and "missing" in err and "Traceback" not in err


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--target-head-quant", "int8"], "--target-head-quant int8 needs --target-quant int8 or int4"),
        (["--draft-int8", "--draft-quant", "int4"], "--draft-int8 means --draft-quant int8-dynamic"),
    ],
)
def test_bad_quant_flags_exit_2_before_loading(flags, message, tmp_path, capsys):
    assert (
        main(["calibrate", "--target", str(tmp_path / "never-loaded"), "--out", str(tmp_path / "x.jsonl"), *flags]) == 2
    )
    assert message in capsys.readouterr().err


def test_a_low_bit_pair_is_calibrated_as_ssd_loads_it(pair, tmp_path, monkeypatch):
    """--target-quant / --draft-quant: the target timed here and the draft in the worker are the low-bit models
    an SSD run with the same flags loads (the worker gets SSD's own recipe), and the summary says which."""
    import saguaro.commands.calibrate as command
    from engine.config import EngineConfig
    from engine.loading.recipe import draft_recipe
    from engine.loading.weight_only import WeightOnlyLinear

    target, draft = pair
    recipes, targets = [], []
    start, measure = command.start_worker, command.measure
    monkeypatch.setattr(command, "start_worker", lambda recipe, *a: recipes.append(recipe) or start(recipe, *a))
    monkeypatch.setattr(command, "measure", lambda args, model, *a: targets.append(model) or measure(args, model, *a))
    out = tmp_path / "lowbit.jsonl"
    assert (
        main(
            calibrate_argv(target, draft, out, "--target-quant", "int4", "--draft-quant", "int8", "--link-tokens", "0")
        )
        == 0
    )
    inputs = json.loads(out.with_suffix(".summary.json").read_text())["inputs"]
    assert (inputs["target_quant"], inputs["draft_quant"], inputs["quant_group_size"]) == ("int4", "int8", 32)
    assert inputs["draft_int8"] is False and inputs["target_head_quant"] is None
    assert any(isinstance(m, WeightOnlyLinear) and m.scheme.value == "int4" for m in targets[0].modules())
    ssd = EngineConfig(
        target=str(target),
        draft=str(draft),
        strategy="ssd",
        dtype="float32",
        threads=1,
        target_quant="int4",
        draft_quant="int8",
    )
    assert recipes == [draft_recipe(None, ssd)] and recipes[0].quant.scheme == "int8"


def test_a_failed_link_run_keeps_the_timed_points(pair, tmp_path, monkeypatch, capsys):
    """The engine's SSD rounds come after minutes of timed points: if they fail, those are written all the
    same, and the summary says why the link and the build level are missing."""
    import saguaro.commands.calibrate as command

    def fail(*args, **kwargs):
        raise RuntimeError("no port")

    monkeypatch.setattr(command, "link_rounds", fail)
    monkeypatch.setattr(command, "build_rounds", fail)
    target, draft = pair
    out = tmp_path / "kept.jsonl"
    assert main(calibrate_argv(target, draft, out, "--build-tokens", "8")) == 0
    err = capsys.readouterr().err
    assert "the engine's SSD rounds failed (RuntimeError: no port)" in err
    # a progress line for each timed prefill (one forward each; on a slow host each can take most of a minute)
    points, lines = prefill_points([12], [1]), [line for line in err.splitlines() if "prefilled" in line]
    assert len(lines) == len(points) >= 1
    for i, ((b, n), line) in enumerate(zip(points, lines, strict=True), 1):
        assert f"prefilled {b} x {n} tokens, target and draft ({i} of {len(points)})" in line
    assert "the engine's SSD build rounds failed (RuntimeError: no port): no build level is measured" in err
    summary = json.loads(out.with_suffix(".summary.json").read_text())
    assert summary["link"] == summary["build_level"] == {"error": "RuntimeError: no port"}
    assert summary["fit"]["build_level"] == []
    records = read_records(out)
    assert any(r.cache_build_ms for r in records) and all(r.prompt_index is None for r in records)


def test_two_untimed_builds_go_before_the_first_timed_one_and_only_then(pair, tmp_path, monkeypatch):
    """A fresh worker's first build runs slow: calibrate asks for two builds at the first shape and records
    none of them; every timed build is one record (the budgets × repeats of the one point timed)."""
    import saguaro.calibration.measure as calibration
    import saguaro.commands.calibrate as command

    sent = []
    start = command.start_worker

    def spying(*a):  # calibrate's worker, its commands noted: `ask` (send, answer) untimed, `conn.send` timed
        worker = start(*a)
        send = worker.conn.send
        worker.ask = lambda *cmd, **kw: (sent.append(("untimed", *cmd)), send(cmd), worker.recv(**kw))[-1]
        worker.conn.send = lambda cmd: sent.append(("timed", *cmd)) or send(cmd)
        return worker

    target, draft = pair
    monkeypatch.setattr(command, "start_worker", spying)
    out = tmp_path / "warm.jsonl"
    assert (
        main(
            calibrate_argv(
                target, draft, out, "--link-tokens", "0", "--build-tokens", "0", budget=("2", "3"), repeats=2
            )
        )
        == 0
    )
    builds = [s for s in sent if s[1] == "build"]
    assert calibration.WARM_BUILDS == 2
    assert builds[:2] == [("untimed", "build", 1, 2)] * 2  # at the first shape: batch 1, the first budget
    assert [s[0] for s in builds[2:]] == ["timed"] * 4  # then only timed ones: 2 budgets × 2 repeats
    records = [r for r in read_records(out) if r.cache_build_ms]
    assert sorted(r.branches for r in records) == [2, 2, 3, 3]


def test_builds_alone_are_timed_on_request_and_give_the_build_line(calibrated, pair, tmp_path):
    """--builds-alone: after each of a point's first two pairs, one build with the target idle, marked level
    "alone" (verify 0); the fit's build line comes from them and the builds beside the verify give its factor.
    Without the flag (the module's calibration) there are none and the line comes from the builds beside."""
    assert not [r for r in read_records(calibrated) if r.level == "alone"]
    assert "cache_build_alone_ms" not in json.loads(calibrated.with_suffix(".summary.json").read_text())
    target, draft = pair
    out = tmp_path / "alone.jsonl"
    assert (
        main(
            calibrate_argv(
                target,
                draft,
                out,
                "--link-tokens",
                "0",
                "--builds-alone",
                budget=("2", "3"),
                batch=("1", "2"),
                repeats=3,
            )
        )
        == 0
    )
    records = read_records(out)
    alone = [r for r in records if r.level == "alone"]
    beside = [r for r in records if r.level is None and r.cache_build_ms]
    assert len(alone) == 2 * 2 * 2 and len(beside) == 3 * 2 * 2  # two of three repeats, budgets x batches
    assert all(r.verify_ms == 0 and r.cache_build_ms > 0 and all(r.hit) for r in alone)
    assert sorted((r.batch_size, r.branches) for r in alone) == sorted(
        (b, b * B) for b in (1, 2) for B in (2, 3) for _ in range(2)
    )
    summary = json.loads(out.with_suffix(".summary.json").read_text())
    assert sorted(summary["cache_build_alone_ms"]) == sorted(summary["cache_build_ms"])
    fitted = fit_timing(records)
    assert fitted.counts["build"] == len(alone) and fitted.counts["build_beside"] == len(beside)
    assert fitted.build_beside > 0 and summary["fit"]["build_beside"] == pytest.approx(fitted.build_beside, abs=1e-5)
