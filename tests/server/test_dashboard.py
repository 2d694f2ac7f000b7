"""The Grafana dashboard committed with the server (server/grafana/saguaro.json) queries only metrics the
server exports."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

DASHBOARD = Path(__file__).parents[2] / "server" / "grafana" / "saguaro.json"
METRIC = re.compile(r"saguaro:[A-Za-z0-9_:]+")


def queries(dashboard: dict) -> list[str]:
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    return exprs + [v["definition"] for v in dashboard["templating"]["list"] if "definition" in v]


def exported(client, fake) -> set[str]:
    """The sample names of a scrape once every labelled series has something to show."""
    fake.stats_now = dataclasses.replace(
        fake.stats_now,
        accepted_per_position=(3, 1),
        ssd_lookups_by_k=(2, 1),
        ssd_hits_by_k=(1, 1),
        cache_capacity_tokens=128,
    )
    client.post("/v1/completions", json={"model": "fake-model", "prompt": "aa bbb", "max_tokens": 5})
    text = client.get("/metrics").text
    return {s.name for family in text_string_to_metric_families(text) for s in family.samples}


def test_every_metric_the_dashboard_queries_is_exported(client, fake):
    wanted = {name for expr in queries(json.loads(DASHBOARD.read_text())) for name in METRIC.findall(expr)}
    assert wanted and wanted <= exported(client, fake), sorted(wanted - exported(client, fake))


def test_every_panel_queries_the_chosen_model():
    dashboard = json.loads(DASHBOARD.read_text())
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            names = METRIC.findall(target["expr"])
            assert names and target["expr"].count('model_name="$model_name"') == len(names), panel["title"]
