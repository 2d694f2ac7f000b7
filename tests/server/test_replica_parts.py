"""The parts of `saguaro serve --replicas` that need no running Ray: the fit check, the options, prefix-affinity
routing, the ingress's view of the replicas (their stats, the model's facts) and the metrics' replica label."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from types import SimpleNamespace

import pytest

pytest.importorskip("ray")  # the cluster extra

from engine import ServingStats
from engine.config import EngineConfig
from saguaro.cli import main
from server.metrics import ServerMetrics
from server.replicas.options import ReplicaOptions
from server.replicas.remote import RemoteModel, ReplicaBoard, total
from server.replicas.replica import ModelFacts, ReplicaReport
from server.replicas.resources import ReplicaResources, check_fit, replicas_that_fit
from server.replicas.routing import PrefixAffinityRouter, prefix_key, rendezvous_order

CPU_NODE = {"CPU": 2.0, "memory": 1e9}


# -- resources ------------------------------------------------------------------------------------------------
def test_replicas_beyond_the_nodes_cpus_are_refused_saying_what_each_needs():
    with pytest.raises(ValueError, match=r"3 replicas need 1 CPU each on one node, and the Ray cluster holds 2"):
        check_fit(3, ReplicaResources(), [CPU_NODE])


def test_an_ssd_replica_counts_its_draft_workers_cores():
    ssd = ReplicaResources.for_strategy("ssd", "cpu", threads=1, draft_threads=1)
    assert ssd.demand() == {"CPU": 2.0} and replicas_that_fit(ssd, [CPU_NODE]) == 1
    with pytest.raises(ValueError, match=r"target 1, SSD draft worker 1"):
        check_fit(2, ssd, [CPU_NODE])


def test_an_ssd_replica_on_gpus_asks_for_two_and_fits_one_node_at_a_time():
    ssd = ReplicaResources.for_strategy("ssd", "cuda:0", threads=None, draft_threads=1)
    nodes = [{"CPU": 16.0, "GPU": 3.0}, {"CPU": 16.0, "GPU": 1.0}]  # 4 GPUs, but only one node holds a pair
    assert ssd.demand()["GPU"] == 2.0 and replicas_that_fit(ssd, nodes) == 1


def test_replicas_that_fit_are_let_through():
    check_fit(2, ReplicaResources(), [CPU_NODE])


def test_a_bad_routing_is_a_value_error_naming_the_choices():
    with pytest.raises(ValueError, match="pow2, prefix"):
        ReplicaOptions(routing="random")


@pytest.mark.parametrize("flags", [["--address", "auto"], ["--ray-cpus", "2"], ["--prefix-tokens", "8"]])
def test_a_replica_flag_without_replicas_is_one_line_and_status_2(flags, capsys):
    assert main(["serve", *flags, "--port", "0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "need --replicas N" in err[0]


# -- prefix affinity ---------------------------------------------------------------------------------------------
def test_prompts_sharing_their_prefix_share_a_key_and_short_ones_have_none():
    a, b = list(range(40)), list(range(32)) + [99] * 8
    assert prefix_key(a, 32) == prefix_key(b, 32) != prefix_key(a[1:], 32)
    assert prefix_key(list(range(31)), 32) is None


def test_a_replica_leaving_moves_only_the_prefixes_it_was_home_to():
    keys = [prefix_key([k] * 32, 32) for k in range(200)]
    replicas = ["a", "b", "c"]
    homes = {key: rendezvous_order(key, replicas)[0] for key in keys}
    after = {key: rendezvous_order(key, ["a", "b"])[0] for key in keys}
    assert {key for key in keys if homes[key] != after[key]} == {key for key in keys if homes[key] == "c"}
    assert 40 < sum(home == "c" for home in homes.values()) < 95  # about a third each (binomial, p = 1/3: > 4 sd)


@dataclass(frozen=True)
class FakeReplicaId:
    name: str

    def to_full_id_str(self) -> str:
        return self.name


class FakeReplica:
    def __init__(self, name: str):
        self.replica_id = FakeReplicaId(name)
        self.name = name


def router(loads: dict[str, int], bound: int = 2) -> PrefixAffinityRouter:
    """The router's choose_replicas with Ray's queue-length cache replaced by `loads` (requests in flight)."""
    made = PrefixAffinityRouter.__new__(PrefixAffinityRouter)
    made.initialize_state(prefix_tokens=4, load_bound=bound)
    made._replica_queue_len_cache = SimpleNamespace(get=lambda replica_id: loads[replica_id.to_full_id_str()])
    return made


def choose(made: PrefixAffinityRouter, replicas, prompt_ids):
    request = SimpleNamespace(args=[SimpleNamespace(prompt_ids=prompt_ids)])
    return asyncio.run(made.choose_replicas(replicas, request))


def test_a_prefix_goes_first_to_its_home_replica():
    replicas = [FakeReplica(n) for n in "abc"]
    prompt = [7, 7, 7, 7, 1]
    home = rendezvous_order(prefix_key(prompt, 4), ["a", "b", "c"])[0]
    ranks = choose(router({"a": 1, "b": 1, "c": 1}), replicas, prompt)
    assert [r.name for r in ranks[0]] == [home] and home not in {r.name for r in ranks[1]}


def test_a_home_past_the_load_bound_is_passed_over():
    replicas = [FakeReplica(n) for n in "abc"]
    prompt = [7, 7, 7, 7, 1]
    home = rendezvous_order(prefix_key(prompt, 4), ["a", "b", "c"])[0]
    loads = {n: (3 if n == home else 0) for n in "abc"}  # 3 more than the least loaded, bound 2
    ranks = choose(router(loads), replicas, prompt)
    assert len(ranks) == 1 and len(ranks[0]) == 2  # power of two choices
    assert [r.name for r in choose(router(loads, bound=3), replicas, prompt)[0]] == [home]  # within the bound


# -- what the ingress knows of the replicas -----------------------------------------------------------------------
def test_the_replicas_stats_add_up_and_the_strategies_are_named():
    a = ServingStats(strategy="ssd", running=2, generation_tokens=10, accepted_per_position=(3, 1))
    b = ServingStats(strategy="sd", running=1, generation_tokens=5, accepted_per_position=(2,))
    both = total([a, b], "ssd")
    assert (both.running, both.generation_tokens, both.accepted_per_position) == (3, 15, (5, 1))
    assert both.strategy == "sd,ssd" and total([], "ar").strategy == "ar"


def test_a_replica_not_heard_from_is_dropped():
    board = ReplicaBoard(stale_s=0.0)
    board.note(ReplicaReport("r1", ServingStats(strategy="ar"), None))
    assert board.live() == {}


def test_the_ingress_checks_prompts_against_the_models_facts():
    facts = ModelFacts(
        model_name="m",
        tokenizer=None,
        vocab_size=64,
        max_context=100,
        lookahead=4,
        strategy="sd",
        config=EngineConfig(target="m", draft="d", strategy="sd"),
    )
    model = RemoteModel(facts, ReplicaBoard())
    assert model.room([1, 2, 3]) == 100 - 3 - 4 and model.encode([1, 63]) == [1, 63]
    with pytest.raises(ValueError, match=r"\[0, 64\)"):
        model.encode([64])


def test_engine_metrics_carry_one_series_per_replica():
    by_replica = {"r1": ServingStats(strategy="ar", generation_tokens=7), "r2": ServingStats(strategy="ar")}
    text = ServerMetrics(lambda: total(list(by_replica.values()), "ar"), "m", by_replica=lambda: by_replica)
    lines = text.exposition().decode().splitlines()
    assert 'saguaro:generation_tokens_total{model_name="m",replica="r1"} 7.0' in lines
    assert 'saguaro:generation_tokens_total{model_name="m",replica="r2"} 0.0' in lines
