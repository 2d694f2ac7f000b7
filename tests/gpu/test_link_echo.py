"""The SSD link between two processes: the target (rank 0) sends a round and a speculation to a draft process
(rank 1), which echoes them back unchanged. The link is gloo on every device (engine.ssd.transport): on "cuda" the
target sits on cuda:0 and the peer on cuda:1 when there is one (else cuda:0 too), and both stage through pinned
host memory."""

import torch
import torch.multiprocessing as mp

from engine.sparse import SparseQ
from engine.ssd.messages import Join, Round, Source, Speculation, encode
from engine.ssd.transport import TARGET_RANK, connect, host_store
from tests.gpu.devices import peer_device, target_device
from tests.gpu.link_peer import TIMEOUT_S, echo

V = 50


def _messages() -> list:
    join = Join(seq_id=3, prompt=[1, 2, 3], pending=4, temperature=0.7, top_k=5, top_p=0.9, seed=9)
    g = torch.Generator().manual_seed(0)
    q = torch.rand(2, 3, V, generator=g) + 1e-3
    tokens = torch.randint(0, V, (2, 3), generator=g)
    return [
        Round(round=2, accepted=[0, 2], bonus=[5, 6], alive=[True, False], verify_ms=1.5, joins=[join], K=3, V=V),
        Speculation(
            2,
            [Source.HIT, Source.NEURAL],
            tokens,
            SparseQ(V, None, q / q.sum(-1, keepdim=True)),
            1.0,
            2.0,
            4,
            [1, 1, 1, 1],
            [0, 3],
        ),
    ]


def test_messages_cross_to_another_process_and_back(device):
    store, address = host_store("tcp://127.0.0.1:0", TIMEOUT_S)
    sent = _messages()
    child = mp.get_context("spawn").Process(target=echo, args=(address, peer_device(device), len(sent)), daemon=True)
    child.start()
    endpoint = connect(store, TARGET_RANK, torch.device(target_device(device)), TIMEOUT_S)
    back = []
    try:
        for msg in sent:
            endpoint.send(msg, TIMEOUT_S)
            back.append(endpoint.recv(TIMEOUT_S))
    finally:
        endpoint.close()
        child.join(TIMEOUT_S)
        if child.is_alive():
            child.kill()
            child.join()
    assert child.exitcode == 0
    for got, msg in zip(back, sent, strict=True):
        assert all(torch.equal(a, b) for a, b in zip(encode(got), encode(msg), strict=True))
    assert back[0].joins[0].prompt == [1, 2, 3] and back[0].joins[0].seed == 9
    assert back[1].tokens.device.type == "cpu"  # what arrives is in host memory, for engine.host.upload
