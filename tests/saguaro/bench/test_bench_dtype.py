"""bench --dtype auto: the run folder records the dtype it resolved to, so a report or a resumed run knows what
loaded (engine.loading.devices.resolve_dtype; tests/engine/test_dtype_auto.py has the rule)."""

import json

from engine.loading import devices


def test_a_bench_run_folder_records_the_dtype_auto_chose(tiny_models, tmp_path, monkeypatch):
    from saguaro.bench import resume, start
    from tests.saguaro.bench.test_bench import config

    monkeypatch.setattr(devices, "fast_bfloat16", lambda device: False)
    bench = start(config(systems=("ar",), n_prompts=1, dtype="auto", draft_dtype="auto"), tmp_path, "auto", tiny_models)
    saved = json.loads((bench.run_dir.path / "config.json").read_text())
    assert (saved["dtype"], saved["draft_dtype"]) == ("float32", "float32")
    assert (bench.config.dtype, bench.config.draft_dtype) == ("float32", "float32")
    monkeypatch.setattr(devices, "fast_bfloat16", lambda device: True)  # a resumed run loads what was recorded
    assert resume(str(bench.run_dir.path), tiny_models).config.dtype == "float32"
