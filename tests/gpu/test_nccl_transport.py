"""The SSD link over NCCL: the target (rank 0, cuda:0) sends a round to a draft process (rank 1, cuda:1),
which echoes it back unchanged. Needs two GPUs: NCCL refuses two ranks on one device."""

import pytest
import torch
import torch.multiprocessing as mp

from engine.ssd.messages import Join, Round
from engine.ssd.transport import TARGET_RANK, connect, host_store
from tests.gpu.devices import gpu_count
from tests.gpu.nccl_peer import TIMEOUT_S, echo

pytestmark = pytest.mark.cuda


def test_a_round_crosses_nccl_to_another_process_and_back():
    if gpu_count() < 2:
        pytest.skip("the NCCL round-trip needs two GPUs (target on cuda:0, draft on cuda:1)")
    store, address = host_store("tcp://127.0.0.1:0", TIMEOUT_S)
    child = mp.get_context("spawn").Process(target=echo, args=(address, "cuda:1"), daemon=True)
    child.start()
    endpoint = connect(store, TARGET_RANK, torch.device("cuda:0"), TIMEOUT_S)
    join = Join(seq_id=3, prompt=[1, 2, 3], pending=4, temperature=0.7, top_k=5, top_p=0.9, seed=9)
    sent = Round(round=2, accepted=[0, 2], bonus=[5, 6], alive=[True, False], verify_ms=1.5, joins=[join])
    try:
        endpoint.send(sent, TIMEOUT_S)
        back = endpoint.recv(TIMEOUT_S)
    finally:
        endpoint.close()
        child.join(TIMEOUT_S)
        if child.is_alive():
            child.kill()
            child.join()
    assert child.exitcode == 0
    assert (back.round, back.accepted, back.bonus, back.alive) == (2, [0, 2], [5, 6], [True, False])
    assert back.joins[0].prompt == [1, 2, 3] and back.joins[0].seed == 9
