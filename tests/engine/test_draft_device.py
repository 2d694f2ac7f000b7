"""SD's draft runs on its own device and only what verification needs crosses to the target's: the fallback of
an SSD worker whose draft was quantised for the CPU keeps it on the CPU beside a CUDA target. A CPU-only machine
has one real device, so the target's is played by the "meta" device (shapes, no data) or named without use; the
device's own paths (which read nothing back) run on the CPU too, and must give the CPU's tokens."""

import pytest
import torch

from engine import LLM, host
from engine.config import DraftPlacement, SpeculativeConfig
from engine.sampling import RowSampling
from engine.sampling_params import SamplingParams
from engine.sequence import Sequence
from engine.ssd.transport import DraftUnavailable
from engine.strategies.sd import InProcessDraft
from engine.strategies.ssd import DraftWorkerProposer
from tests.engine.tiny import noisy_copy, tiny_lm

PARAMS = SamplingParams(temperature=1.0, max_new_tokens=8, stop_on_eos=False)


def joined(seq_id: int, prompt: list[int]) -> Sequence:
    seq = Sequence(
        seq_id=seq_id,
        request_id=f"r{seq_id}",
        index=seq_id,
        prompt_ids=prompt,
        params=PARAMS,
        eos_ids=frozenset(),
        seed=seq_id,
        arrival_s=0.0,
    )
    seq.output_ids = [7]  # the first token, sampled by the target
    return seq


def test_sd_drafts_on_the_drafts_device_and_hands_x_and_q_to_the_targets():
    draft = noisy_copy(tiny_lm(0), 1.0)  # on the CPU
    sd = InProcessDraft(draft, SpeculativeConfig(K=3), pad_id=0, device=torch.device("meta"))
    seqs = [joined(0, [1, 2, 3]), joined(1, [4, 5])]
    sd.admit(seqs)
    proposal = sd.propose(RowSampling([s.params for s in seqs]))
    assert sd.draft_device == torch.device("cpu") and sd.state.mask.device.type == "cpu"
    assert proposal.tokens.device.type == "meta" and proposal.q.device.type == "meta"
    assert tuple(proposal.tokens.shape) == (2, 3) and tuple(proposal.q.shape) == (2, 3, 50)


def test_the_fallback_of_a_lost_worker_keeps_a_cpu_draft_on_the_cpu_beside_a_gpu_target():
    draft = noisy_copy(tiny_lm(0), 1.0)  # as a low-bit draft would be: CPU kernels only
    proposer = DraftWorkerProposer(
        lambda: None, SpeculativeConfig(K=3), vocab_size=50, pad_id=0, device=torch.device("cuda", 0), draft=draft
    )  # nothing here touches CUDA
    fallback = proposer.fallback(DraftUnavailable("the draft worker stopped"))
    assert isinstance(fallback, InProcessDraft)
    assert fallback.draft_device == torch.device("cpu")  # where the draft runs
    assert fallback.device == torch.device("cuda", 0)  # where x and q go to be verified


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=0.0, max_new_tokens=10, stop_on_eos=False),
        SamplingParams(temperature=1.0, top_k=8, max_new_tokens=10, stop_on_eos=False, seed=3),
    ],
    ids=["greedy", "top-k"],
)
def test_the_device_paths_give_the_cpus_tokens(params, monkeypatch):
    """The routines that read on the CPU and not on a device (engine.host.reads_are_free) give the same SSD
    tokens either way, draw for draw."""

    def run():
        target = tiny_lm(0, scale=4.0)
        spec = SpeculativeConfig(K=3, placement=DraftPlacement(in_process=True))
        with LLM(target, noisy_copy(target, 1.0), strategy="ssd", speculative=spec) as llm:
            return [o.token_ids for o in llm.generate([[1, 2, 3, 4, 5], [7, 8]], params)]

    on_cpu = run()
    monkeypatch.setattr(host, "reads_are_free", lambda device: False)
    assert run() == on_cpu
