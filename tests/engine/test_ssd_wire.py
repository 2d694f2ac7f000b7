"""The SSD link's framing (a message in at most two transfers) and the checks on q in the form it crossed in."""

import threading

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.sparse import SparseQ
from engine.ssd.messages import (
    Join,
    KeepAlive,
    MalformedMessage,
    Prefill,
    Round,
    Source,
    Speculation,
    Stop,
    decode,
    encode,
)
from engine.ssd.transport import DRAFT_RANK, TARGET_RANK, connect, host_store, join_store
from engine.ssd.wire import FRAME_BYTES, from_frame, rest_bytes, to_wire, unpack
from tests.engine.fake_link import FakeLink

V = 50
TIMEOUT_S = 30.0


def _speculation(B: int, S: int, seed: int = 0) -> Speculation:
    """B rows, K = 3, q with S support entries per position (S = 0: dense)."""
    g = torch.Generator().manual_seed(seed)
    K = 3
    if S:
        ids = torch.stack([torch.randperm(V, generator=g)[:S] for _ in range(B * K)]).reshape(B, K, S)
        values = torch.rand(B, K, S, generator=g) + 1e-3
        q = SparseQ(V, ids, values / values.sum(-1, keepdim=True))
        tokens = ids[..., 0]
    else:
        dense = torch.rand(B, K, V, generator=g) + 1e-3
        q = SparseQ(V, None, dense / dense.sum(-1, keepdim=True))
        tokens = torch.randint(0, V, (B, K), generator=g)
    return Speculation(
        4,
        [Source.HIT, Source.NEURAL][:B] + [Source.LOOKUP] * max(0, B - 2),
        tokens,
        q,
        1.5,
        2.5,
        9,
        [3, 2, 1, 1],
        list(range(B)),
    )


def _messages() -> list:
    join = Join(7, list(range(1, 40)), 4, 0.7, 5, 0.9, 2**62)
    return [
        Stop(),
        KeepAlive(),
        Prefill([4, 9], [[1, 2, 3], [7]], V),
        Round(3, [1, 2], [9, 9], [True, False], 12.5, [join], K=2, V=V),
        Round(5, [0], [1], [True], 1.0, [Join(8, [3] * 5000, 1, 0.0, 0, 1.0, 0)], K=3, V=V),
        _speculation(2, 1),
        _speculation(4, 7),
        _speculation(3, 0),
        _speculation(0, 0),
    ]


def _through_wire(tensors: list[torch.Tensor]) -> tuple[list[torch.Tensor], int]:
    wire = to_wire(tensors)
    assert all(t.dtype == torch.uint8 and t.dim() == 1 for t in wire) and wire[0].numel() == FRAME_BYTES
    got, rest = from_frame(wire[0].clone())
    if rest:
        assert len(wire) == 2 and wire[1].numel() == rest_bytes(rest)
        got += unpack(wire[1].clone(), rest)
    else:
        assert len(wire) == 1
    return got, len(wire)


@pytest.mark.parametrize("msg", _messages(), ids=lambda m: type(m).__name__)
def test_every_message_crosses_in_at_most_two_transfers_bit_for_bit(msg):
    sent = encode(msg)
    got, transfers = _through_wire(sent)
    assert [(t.dtype, t.shape) for t in got] == [(t.dtype, t.shape) for t in sent]
    assert all(torch.equal(a, b) for a, b in zip(got, sent, strict=True))
    back = decode(got)
    if isinstance(msg, Speculation):
        assert torch.equal(back.q.dense(), msg.q.dense()) and torch.equal(back.tokens, msg.tokens)
        assert (back.source, back.ranks, back.fanout, back.backup_ms) == (msg.source, msg.ranks, msg.fanout, 1.5)
    else:
        assert back == msg
    size = sum(-(-t.numel() * t.element_size() // 8) * 8 for t in sent)
    assert transfers == (1 if size <= FRAME_BYTES else 2)


def test_a_top_k_answer_at_the_real_vocabulary_crosses_in_one_transfer():
    B, K, S, vocab = 4, 8, 50, 151936
    ids = torch.arange(B * K * S).reshape(B, K, S)
    q = SparseQ(vocab, ids, torch.full((B, K, S), 1 / S))
    msg = Speculation(2, [Source.HIT] * B, ids[..., 0], q, 1.0, 1.0, 9, [3, 2, 1, 1, 1, 1, 1, 1, 1], [0] * B)
    assert len(to_wire(encode(msg))) == 1
    dense = Speculation(2, [Source.NEURAL], ids[:1, :, 0], SparseQ(vocab, None, q.dense()[:1]), 1.0, 1.0, 0, [], [0])
    wire = to_wire(encode(dense))
    assert len(wire) == 2 and wire[1].numel() == K * vocab * 4
    assert wire[1].data_ptr() == dense.q.values.data_ptr()  # the dense q alone goes as it is, not copied


def test_a_frame_whose_header_is_not_one_is_refused():
    frame = to_wire(encode(Stop()))[0]
    frame[:8] = torch.tensor([99], dtype=torch.long).view(torch.uint8)
    with pytest.raises(MalformedMessage, match="unknown message kind 99"):
        from_frame(frame)


def _dense_check(q: torch.Tensor, tokens: torch.Tensor) -> bool:
    """The check on the dense q (a [B, K, V] mask): the reference the checks on the support must agree with."""
    B, K = tokens.shape
    return not B or (
        bool(torch.isfinite(q).all())
        and not bool((q < 0).any())
        and torch.allclose(q.sum(-1), torch.ones(B, K), atol=1e-3)
        and bool((q.gather(-1, tokens[..., None]) > 0).all())
    )


@settings(max_examples=300, deadline=None)
@given(
    st.integers(0, 2**31),
    st.sampled_from([0, 1, 4]),
    st.sampled_from(
        ["none", "nan", "inf", "-inf", "negative", "mass", "zero at token", "token off support", "padding at token"]
    ),
)
def test_q_is_checked_on_its_support_as_strictly_as_dense(seed, S, fault):
    msg = _speculation(2, S, seed)
    g = torch.Generator().manual_seed(seed)
    values = msg.q.values.clone()
    ids = None if msg.q.ids is None else msg.q.ids.clone()
    tokens = msg.tokens.clone()
    b, k = int(torch.randint(0, 2, (1,), generator=g)), int(torch.randint(0, 3, (1,), generator=g))
    at = tokens[b, k] if ids is None else 0  # the entry of row (b, k) a fault hits: its token's
    bad = {"nan": float("nan"), "inf": float("inf"), "-inf": float("-inf"), "negative": -0.25, "mass": 0.0}
    if fault in bad:
        values[b, k, at] = bad[fault]
    elif fault == "zero at token":
        values[b, k] = torch.where(torch.arange(values.shape[-1]) == at, 0.0, values[b, k])
        values[b, k] /= values[b, k].sum()
    elif fault == "token off support" and ids is not None:
        tokens[b, k] = next(t for t in range(V) if t not in ids[b, k].tolist())
    elif fault == "padding at token" and ids is not None and S > 1:  # a zero entry naming the token, as cat's padding
        values[b, k, 0], values[b, k, 1] = 0.0, values[b, k, 0] + values[b, k, 1]
    q = SparseQ(V, ids, values)
    bad_msg = Speculation(msg.round, msg.source, tokens, q, 0.0, 0.0, 1, [], [])
    if _dense_check(q.dense(), tokens):
        assert torch.equal(decode(encode(bad_msg), 3, V).q.dense(), q.dense())
    else:
        with pytest.raises(MalformedMessage, match="not a probability distribution|probability 0"):
            decode(encode(bad_msg), 3, V)


def test_dense_q_of_the_wrong_shape_is_refused():
    tensors = encode(_speculation(2, 0))
    tensors[3] = tensors[3][..., :-1]
    with pytest.raises(MalformedMessage, match="q has the wrong shape"):
        decode(tensors)


def test_messages_cross_a_real_gloo_link_and_back():
    store, address = host_store("tcp://127.0.0.1:0", TIMEOUT_S)
    sent = [m for m in _messages() if not isinstance(m, KeepAlive)]  # a receive drops keep-alives
    errors: list[BaseException] = []

    def echo():
        try:
            peer = connect(join_store(address, TIMEOUT_S), DRAFT_RANK, torch.device("cpu"), TIMEOUT_S)
            for _ in sent:
                peer.send(peer.recv(TIMEOUT_S), TIMEOUT_S)
            peer.close()
        except BaseException as err:  # noqa: BLE001  reported by the test below
            errors.append(err)

    child = threading.Thread(target=echo, daemon=True)
    child.start()
    target = connect(store, TARGET_RANK, torch.device("cpu"), TIMEOUT_S)
    try:
        for msg in sent:
            target.send(msg, TIMEOUT_S)
            back = target.recv(TIMEOUT_S)
            assert all(torch.equal(a, b) for a, b in zip(encode(back), encode(msg), strict=True))
    finally:
        child.join(TIMEOUT_S)
        target.close()
    assert not errors


def test_a_link_made_by_another_backend_carries_the_messages():
    fake = FakeLink()
    target = connect(None, TARGET_RANK, torch.device("cpu"), TIMEOUT_S, fake.backend)
    draft = connect(None, DRAFT_RANK, torch.device("cpu"), TIMEOUT_S, fake.backend)
    for msg in [m for m in _messages() if not isinstance(m, KeepAlive)]:  # a receive drops keep-alives
        target.send(msg, TIMEOUT_S)
        draft.send(draft.recv(TIMEOUT_S), TIMEOUT_S)
        back = target.recv(TIMEOUT_S)
        assert all(torch.equal(a, b) for a, b in zip(encode(back), encode(msg), strict=True))
    assert all(q.empty() for q in fake.inbox.values())  # every transfer sent was received


def test_a_greedy_rounds_bytes_on_the_link_do_not_grow_with_the_vocabulary():
    """At temperature 0 a round sends the outcome and the next speculation with its point masses: a few ids a
    row, whatever V is (engine.ssd.messages.encode of both directions, the worker in process)."""
    from engine import LLM, SamplingParams, SpeculativeConfig
    from engine.config import DraftPlacement
    from engine.ssd.messages import encode
    from tests.engine.tiny import noisy_copy, tiny_lm

    per_round = {}
    for V in (64, 8192):
        target = tiny_lm(0, vocab_size=V, scale=3.0)
        sizes: list[int] = []
        spec = SpeculativeConfig(K=3, placement=DraftPlacement(in_process=True))
        with LLM(target, noisy_copy(target, 0.5), strategy="ssd", speculative=spec) as llm:
            channel = llm.loop.proposer.channel
            exchange = channel.exchange

            def counted(msg, exchange=exchange, sizes=sizes):
                answer = exchange(msg)
                sizes.append(sum(t.numel() * t.element_size() for t in encode(msg) + encode(answer)))
                return answer

            channel.exchange = counted
            llm.generate([[1, 2, 3], [4, 5]], SamplingParams(temperature=0.0, max_new_tokens=24, stop_on_eos=False))
        per_round[V] = max(sizes[1:])  # the first exchange also carries the prompts
    assert per_round[8192] == per_round[64] < 1024
