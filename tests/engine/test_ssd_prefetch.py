"""The target's PREFILL does not wait for a worker that is still building its cache.

Over gloo a send completes only once the peer has posted the matching receive, and the worker receives only
between its rounds, so a Prefill sent with a blocking send held the target until the worker's build ended.
The channel sends it from a thread instead and waits for that thread at the next exchange, so the Round
still follows it on the stream (the worker reads the Prefill first). These tests start a worker process whose
draft sleeps in every forward, so that its build lasts well past the moment the target announces new
prompts."""

import multiprocessing
import time
from dataclasses import dataclass

import pytest
import torch

from engine import SpeculativeConfig
from engine.config import DraftPlacement
from engine.loading.recipe import DraftRecipe
from engine.ssd.channel import InProcessChannel, ProcessChannel
from engine.ssd.messages import Join, Prefill, Round
from engine.ssd.transport import DraftUnavailable
from tests.engine.tiny import tiny_lm

V = 50
FORWARD_S = 0.1  # the worker's draft sleeps this long in every forward: its build takes several
SPEC = SpeculativeConfig(K=3, placement=DraftPlacement(deadline_s=20.0))
PROMPTS = {1: [1, 2, 3, 4, 5], 2: [7, 8], 3: [9, 10, 11]}


@dataclass
class SlowRecipe(DraftRecipe):
    """The draft, built in the worker process, sleeping `forward_s` in each forward."""

    forward_s: float = 0.0

    def build(self, device: torch.device) -> torch.nn.Module:
        model = super().build(device)
        forward = model.forward

        def slow(*args, **kwargs):
            time.sleep(self.forward_s)
            return forward(*args, **kwargs)

        model.forward = slow
        return model


def join(seq_id: int) -> Join:
    return Join(seq_id, PROMPTS[seq_id], 4, 0.0, 0, 1.0, 100 + seq_id)  # greedy: the same tokens in any process


FIRST = Round(0, [], [], [], 0.0, [join(1), join(2)], K=3, V=V)
ANNOUNCED = Prefill([3], [PROMPTS[3]], V)
SECOND = Round(1, [1, 3], [6, 9], [True, True], 5.0, [join(3)], K=3, V=V)


@pytest.fixture(scope="module")
def draft():
    return tiny_lm(0, vocab_size=V)


@pytest.fixture
def channel(draft):
    recipe = SlowRecipe.from_model(draft)
    recipe.forward_s = FORWARD_S
    channel = ProcessChannel(recipe, SPEC, 0, torch.device("cpu"))
    yield channel
    channel.close()
    assert multiprocessing.active_children() == []


def test_a_prefill_announced_while_the_worker_builds_does_not_hold_the_target(channel, draft):
    channel.exchange(FIRST)  # the worker answers, then builds its cache: several slow forwards
    t0 = time.perf_counter()
    channel.prefetch(ANNOUNCED)
    assert time.perf_counter() - t0 < FORWARD_S  # a blocking send waited out the build (~4 forwards)
    reply = channel.exchange(SECOND)  # the worker reads the Prefill first, then this Round
    here = InProcessChannel(draft, SPEC, 0, torch.device("cpu"))
    here.exchange(FIRST)
    here.prefetch(ANNOUNCED)
    assert torch.equal(reply.tokens, here.exchange(SECOND).tokens)


def test_a_worker_that_dies_with_a_prefill_under_way_is_reported_by_the_next_exchange(channel):
    channel.exchange(FIRST)
    channel.prefetch(ANNOUNCED)
    channel.process.kill()
    channel.process.join()
    with pytest.raises(DraftUnavailable):
        channel.exchange(SECOND)


def test_a_prefill_the_worker_never_receives_fails_the_next_exchange(channel):
    channel.exchange(FIRST)
    channel.prefetch(ANNOUNCED)
    process, channel.process = channel.process, None  # as for a worker started by hand: only the link can tell
    process.kill()
    process.join()
    try:
        with pytest.raises(DraftUnavailable):
            channel.exchange(SECOND)
    finally:
        channel.process = process  # for close to reap
