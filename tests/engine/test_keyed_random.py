"""Keyed random numbers (engine/keyed_random.py): the torch functions equal the pure-Python reference bit for bit,
a value depends only on its key (never on the batch, its shape or its order), nothing is read back from the device,
and bad keys are rejected with what to do. The statistical properties are in test_keyed_random_statistics.py.

Device-parametrised tests run on the CPU always and on CUDA (marker `cuda`) with --run-gpu where a GPU is present.
"""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks.host_syncs import count_host_syncs
from engine.keyed_random import (
    MASK64,
    POSITION_LIMIT,
    SEED_LIMIT,
    Purpose,
    check_keys,
    gumbel_from_bits,
    keyed_bits,
    keyed_gumbel,
    keyed_uniforms,
    reference_absorb,
    reference_bits,
    reference_gumbel,
    reference_uniform,
    uniforms_from_bits,
)

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]
INT64 = st.integers(-(1 << 63), (1 << 63) - 1)
KEY = st.tuples(
    st.integers(0, SEED_LIMIT - 1),
    st.integers(0, POSITION_LIMIT - 1),
    st.sampled_from(Purpose),
    st.integers(0, POSITION_LIMIT - 1),
)
KEYS = st.lists(KEY, min_size=1, max_size=8)


def as_unsigned(t: torch.Tensor) -> list[int]:
    return [v & MASK64 for v in t.flatten().tolist()]


def columns(keys, device):
    """seeds [B], positions [B, 1], index [B, 1] for keys of one purpose each."""
    seeds = torch.tensor([k[0] for k in keys], dtype=torch.int64, device=device)
    positions = torch.tensor([[k[1]] for k in keys], dtype=torch.int64, device=device)
    index = torch.tensor([[k[3]] for k in keys], dtype=torch.int64, device=device)
    return seeds, positions, index


def test_the_finaliser_reproduces_published_splitmix64_outputs():
    # The first five outputs of SplitMix64 seeded with 1234567, as published (Rosetta Code, "Pseudo-random
    # numbers/Splitmix64"): output x of the stream from state h is reference_absorb(h, x).
    published = [
        6457827717110365317,
        3203168211198807973,
        9817491932198370423,
        4593380528125082431,
        16408922859458223821,
    ]
    assert [reference_absorb(1234567, x) for x in range(5)] == published


@pytest.mark.parametrize("device", DEVICES)
@settings(deadline=None, max_examples=50)
@given(pairs=st.lists(st.tuples(INT64, INT64), min_size=1, max_size=16))
def test_int64_add_and_multiply_wrap_modulo_2_to_the_64(device, pairs):
    # The construction relies on torch's int64 arithmetic wrapping like unsigned 64-bit arithmetic.
    a = torch.tensor([x for x, _ in pairs], dtype=torch.int64, device=device)
    b = torch.tensor([y for _, y in pairs], dtype=torch.int64, device=device)
    assert as_unsigned(a * b) == [(x * y) & MASK64 for x, y in pairs]
    assert as_unsigned(a + b) == [(x + y) & MASK64 for x, y in pairs]


@pytest.mark.parametrize("device", DEVICES)
@settings(deadline=None, max_examples=60)
@given(keys=KEYS)
def test_words_equal_the_pure_python_reference(device, keys):
    for purpose in Purpose:
        seeds, positions, index = columns(keys, device)
        words = keyed_bits(seeds, positions, purpose, index)  # [B, 1]
        assert as_unsigned(words) == [reference_bits(s, p, purpose, i) for s, p, _, i in keys]


@pytest.mark.parametrize("device", DEVICES)
@settings(deadline=None, max_examples=60)
@given(keys=KEYS)
def test_uniforms_equal_the_pure_python_reference_in_both_dtypes(device, keys):
    seeds, positions, index = columns(keys, device)
    for purpose in Purpose:
        for dtype, bits in ((torch.float32, 24), (torch.float64, 53)):
            got = keyed_uniforms(seeds, positions, purpose, dtype, index)[:, 0].tolist()  # [B]
            assert got == [reference_uniform(s, p, purpose, i, bits) for s, p, _, i in keys]


@pytest.mark.parametrize("device", DEVICES)
@settings(deadline=None, max_examples=40)
@given(key=KEY, vocab=st.integers(1, 40))
def test_gumbel_noise_equals_the_pure_python_reference(device, key, vocab):
    seed, position, _, _ = key
    seeds = torch.tensor([seed], device=device)
    positions = torch.tensor([[position]], device=device)
    expected = torch.tensor([reference_gumbel(seed, position, t) for t in range(vocab)], dtype=torch.float64)
    got64 = keyed_gumbel(seeds, positions, vocab, torch.float64)[0, 0].cpu()  # [V]
    got32 = keyed_gumbel(seeds, positions, vocab)[0, 0].cpu()
    torch.testing.assert_close(got64, expected, rtol=1e-14, atol=0)  # log may differ in the last bit
    torch.testing.assert_close(got32, expected.float(), rtol=2e-7, atol=0)


@pytest.mark.parametrize("device", DEVICES)
@settings(deadline=None, max_examples=40)
@given(keys=KEYS, data=st.data())
def test_a_uniform_does_not_depend_on_the_batch_it_is_drawn_in(device, keys, data):
    alone = [keyed_uniforms(*columns([k], device)[:2], k[2], torch.float64, k[3]).item() for k in keys]
    order = data.draw(st.permutations(range(len(keys))))
    width = data.draw(st.integers(1, 4))
    shuffled = [keys[r] for r in order]
    seeds = torch.tensor([k[0] for k in shuffled], device=device)
    # each row's key sits in a random column among other positions of the same seed
    column = data.draw(st.lists(st.integers(0, width - 1), min_size=len(keys), max_size=len(keys)))
    positions = torch.tensor(
        [
            [k[1] if c == column[r] else (k[1] + 1 + c) % POSITION_LIMIT for c in range(width)]
            for r, k in enumerate(shuffled)
        ],
        device=device,
    )
    index = torch.tensor([[k[3]] for k in shuffled], device=device).expand(-1, width)
    for purpose in Purpose:
        rows = [r for r, k in enumerate(shuffled) if k[2] == purpose]
        batch = keyed_uniforms(seeds, positions, purpose, torch.float64, index)  # [B, width]
        for r in rows:
            assert batch[r, column[r]].item() == alone[order[r]]


@pytest.mark.parametrize("device", DEVICES)
def test_gumbel_noise_at_a_position_does_not_depend_on_n_or_b(device):
    vocab = 50
    alone = keyed_gumbel(torch.tensor([7], device=device), torch.tensor([[103]], device=device), vocab)  # [1, 1, V]
    seeds = torch.tensor([3, 7, 8], device=device)
    positions = torch.tensor([[100, 101, 102, 103, 104]], device=device).expand(3, -1)
    batch = keyed_gumbel(seeds, positions, vocab)  # [3, 5, V]
    assert torch.equal(batch[1, 3], alone[0, 0])
    assert not torch.equal(batch[1, 2], alone[0, 0])


@pytest.mark.parametrize("device", DEVICES)
def test_broadcast_positions_and_index_give_the_same_values_as_full_ones(device):
    seeds = torch.tensor([0, 1, 2**62], device=device)
    shared = torch.tensor([[5, 6, 7, 8]], device=device)  # [1, n]
    full = shared.expand(3, -1).contiguous()  # [B, n]
    assert torch.equal(keyed_bits(seeds, shared, Purpose.DRAFT, 3), keyed_bits(seeds, full, Purpose.DRAFT, 3))
    per_row = torch.tensor([[9], [10], [11]], device=device)  # [B, 1]
    index = torch.full((3, 1), 3, device=device)
    assert torch.equal(
        keyed_bits(seeds, per_row, Purpose.TARGET, index)[:, 0], keyed_bits(seeds, per_row, Purpose.TARGET, 3)[:, 0]
    )


def test_purposes_keep_their_numbers():
    # The numbers are part of the reproducibility contract: renumbering changes every seeded output.
    assert {p.name: p.value for p in Purpose} == {"DRAFT": 1, "ACCEPT": 2, "TARGET": 3, "GUMBEL": 4}


@pytest.mark.parametrize("device", DEVICES)
def test_uniforms_at_the_extreme_words_are_in_the_unit_interval(device):
    words = torch.tensor([0, -1, -(1 << 63), (1 << 63) - 1], device=device)  # all zeros, all ones, top bit only, rest
    assert uniforms_from_bits(words, torch.float32).tolist() == [0.0, 1 - 2**-24, 0.5, 0.5 - 2**-24]
    assert uniforms_from_bits(words, torch.float64).tolist() == [0.0, 1 - 2**-53, 0.5, 0.5 - 2**-53]


@pytest.mark.parametrize("device", DEVICES)
def test_gumbel_noise_at_the_extreme_words_is_finite(device):
    words = torch.tensor([0, -1, -(1 << 63), (1 << 63) - 1], device=device)
    for dtype in (torch.float32, torch.float64):
        noise = gumbel_from_bits(words, dtype).cpu().double()
        lowest = -math.log(53 * math.log(2))  # u = 2^-53
        highest = -math.log(-math.log1p(-(2.0**-53)))  # u = 1 - 2^-53
        torch.testing.assert_close(noise[:2], torch.tensor([lowest, highest], dtype=torch.float64), rtol=1e-6, atol=0)
        assert torch.isfinite(noise).all()


@pytest.mark.parametrize("device", DEVICES)
def test_gumbel_noise_over_a_whole_vocabulary_is_finite(device):
    noise = keyed_gumbel(
        torch.tensor([0, 2**63 - 1], device=device), torch.tensor([[0, 2**40 - 1]], device=device), 151936
    )  # [2, 2, V]
    assert noise.shape == (2, 2, 151936) and torch.isfinite(noise).all()


@pytest.mark.parametrize("device", DEVICES)
def test_outputs_stay_on_the_inputs_device(device):
    seeds, positions = torch.tensor([1, 2], device=device), torch.tensor([[3, 4]], device=device)
    outputs = [
        keyed_bits(seeds, positions, Purpose.DRAFT),
        keyed_uniforms(seeds, positions, Purpose.ACCEPT),
        keyed_gumbel(seeds, positions, 8),
    ]
    assert {o.device.type for o in outputs} == {device}


@pytest.mark.parametrize("device", DEVICES)
def test_unchecked_calls_never_read_from_the_device(device):
    seeds, positions = torch.tensor([1, 2], device=device), torch.tensor([[3, 4]], device=device)
    with count_host_syncs() as unchecked:
        keyed_uniforms(seeds, positions, Purpose.ACCEPT, check=False)
        keyed_gumbel(seeds, positions, 8, check=False)
    with count_host_syncs() as checked:
        keyed_uniforms(seeds, positions, Purpose.ACCEPT)
    assert unchecked.total == 0, str(unchecked)
    assert checked.total == 1, str(checked)  # the range check reads its verdict once


@pytest.mark.cuda
def test_cuda_and_cpu_give_the_same_words_uniforms_and_gumbel_noise():
    seeds = torch.tensor([0, 1, 42, 2**63 - 1])
    positions = torch.arange(0, 2**40, 2**34)[None, :]  # [1, 64]
    cuda = [seeds.cuda(), positions.cuda()]
    assert torch.equal(keyed_bits(*cuda, Purpose.DRAFT).cpu(), keyed_bits(seeds, positions, Purpose.DRAFT))
    for dtype in (torch.float32, torch.float64):
        assert torch.equal(
            keyed_uniforms(*cuda, Purpose.ACCEPT, dtype).cpu(), keyed_uniforms(seeds, positions, Purpose.ACCEPT, dtype)
        )
    # float64 log may differ in its last bit between the CPU's and CUDA's libraries
    torch.testing.assert_close(
        keyed_gumbel(*cuda, 1000, torch.float64).cpu(),
        keyed_gumbel(seeds, positions, 1000, torch.float64),
        rtol=1e-14,
        atol=0,
    )


def test_the_extreme_valid_keys_pass_the_check():
    check_keys(torch.tensor([0, SEED_LIMIT - 1]), torch.tensor([[0, POSITION_LIMIT - 1]]), POSITION_LIMIT - 1)


BAD_CALLS = {
    "negative seed": (lambda: keyed_uniforms(torch.tensor([-1]), torch.tensor([[0]]), Purpose.DRAFT), "seeds"),
    "negative position": (lambda: keyed_uniforms(torch.tensor([1]), torch.tensor([[-1]]), Purpose.DRAFT), ">= 0"),
    "position of 2^40": (lambda: keyed_gumbel(torch.tensor([1]), torch.tensor([[2**40]]), 4), "< 2\\^40"),
    "negative index": (lambda: keyed_bits(torch.tensor([1]), torch.tensor([[0]]), Purpose.DRAFT, -1), "index"),
    "index tensor of 2^40": (
        lambda: keyed_bits(torch.tensor([1]), torch.tensor([[0]]), Purpose.DRAFT, torch.tensor([[2**40]])),
        "< 2\\^40",
    ),
    "int32 seeds": (
        lambda: keyed_uniforms(torch.tensor([1], dtype=torch.int32), torch.tensor([[0]]), Purpose.DRAFT),
        "torch.int64",
    ),
    "one-dimensional positions": (
        lambda: keyed_uniforms(torch.tensor([1, 2]), torch.tensor([0, 1]), Purpose.DRAFT),
        "positions\\[None, :\\]",
    ),
    "positions of another batch size": (
        lambda: keyed_uniforms(torch.tensor([1, 2]), torch.tensor([[0], [1], [2]]), Purpose.DRAFT),
        "\\[B, n\\]",
    ),
    "index of the wrong shape": (
        lambda: keyed_bits(
            torch.tensor([1, 2]), torch.tensor([[0, 1]]), Purpose.DRAFT, torch.zeros(3, dtype=torch.int64)
        ),
        "broadcast",
    ),
    "half-precision uniforms": (
        lambda: keyed_uniforms(torch.tensor([1]), torch.tensor([[0]]), Purpose.DRAFT, torch.float16),
        "float32 or torch.float64",
    ),
    "empty vocabulary": (lambda: keyed_gumbel(torch.tensor([1]), torch.tensor([[0]]), 0), "vocab"),
    "unknown purpose": (lambda: keyed_uniforms(torch.tensor([1]), torch.tensor([[0]]), 9), "Purpose"),
}


@pytest.mark.parametrize("case", list(BAD_CALLS))
def test_bad_keys_are_rejected_with_what_to_do(case):
    call, message = BAD_CALLS[case]
    with pytest.raises(ValueError, match=message):
        call()


def test_unchecked_calls_trace_into_one_graph():
    # torch.compile(fullgraph=True) fails on a graph break, so the engine can fuse the ~40 small integer operations
    # of a call into one kernel. backend="eager" traces without generating code (seconds, not minutes).
    seeds, positions = torch.tensor([1, 2]), torch.tensor([[3, 4]])

    def draws(seeds, positions):
        return (
            keyed_uniforms(seeds, positions, Purpose.ACCEPT, check=False),
            keyed_gumbel(seeds, positions, 8, check=False),
        )

    compiled = torch.compile(draws, fullgraph=True, backend="eager")
    for got, expected in zip(compiled(seeds, positions), draws(seeds, positions), strict=True):
        assert torch.equal(got, expected)
