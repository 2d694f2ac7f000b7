"""A round decides its backup once: that one decision sets the length of an all-miss round (K_miss when the
neural draft drafts every row) and drafts the missed rows, so the two can never disagree."""

import itertools

import torch

from engine import LLM, SamplingParams, SpeculativeConfig
from engine.config import DraftPlacement
from engine.ssd.draft_worker import DraftWorker
from engine.ssd.messages import Join, Round, Source
from engine.ssd.policy import DraftPolicy
from tests.engine.tiny import noisy_copy, tiny_lm
from theory.glossary import Backup

V = 50


def test_an_all_miss_round_asks_the_policy_once_and_drafts_with_its_answer():
    spec = SpeculativeConfig(K=4, adaptive=True, draft_cost=0.05)
    worker = DraftWorker(tiny_lm(0, vocab_size=V), spec, 0, torch.device("cpu"))
    answers = itertools.cycle([Backup.NEURAL, Backup.LOOKUP])  # a policy that changes its mind on every call
    calls = []
    worker.policy.backup = lambda batch_size: calls.append(batch_size) or next(answers)
    joins = [Join(1, [1, 2, 3], 4, 0.0, 0, 1.0, 11), Join(2, [5, 6], 7, 0.0, 0, 1.0, 12)]
    reply = worker.respond(Round(0, [], [], [], 0.0, joins, K=4, V=V, K_miss=2))
    assert calls == [2]
    assert reply.source == [Source.NEURAL, Source.NEURAL]
    assert tuple(reply.tokens.shape) == (2, 2)  # the neural backup drafts every row: the length offered for that


def test_every_round_with_a_miss_asks_the_policy_once_and_an_all_hit_round_never(monkeypatch):
    target = tiny_lm(0, scale=4.0)
    asked = []
    backup = DraftPolicy.backup
    monkeypatch.setattr(DraftPolicy, "backup", lambda self, n: asked.append(n) or backup(self, n))
    answered = []  # per answer: (policy calls during it, whether a row missed)
    respond = DraftWorker.respond

    def counted(self, msg):
        before = len(asked)
        reply = respond(self, msg)
        answered.append((len(asked) - before, any(s is not Source.HIT for s in reply.source)))
        return reply

    monkeypatch.setattr(DraftWorker, "respond", counted)
    spec = SpeculativeConfig(
        K=4, adaptive=True, draft_cost=0.05, backup="auto", placement=DraftPlacement(in_process=True)
    )
    params = SamplingParams(temperature=0, max_new_tokens=25, stop_on_eos=False)
    with LLM(target, noisy_copy(target, noise=1.0), strategy="ssd", speculative=spec) as llm:
        llm.generate([[1, 2, 3, 4, 5], [7, 8], [9, 10, 11]], params)
    assert {missed for _, missed in answered} == {True, False}  # both kinds of round were seen
    assert all(calls == int(missed) for calls, missed in answered)
