"""HashOracle against the independent scalar SplitMix64 reference, and the manager's +1 rule."""

import random
import sys

import pytest
import torch

from _oracle_reference import oracle_token, splitmix64_finalizer
from sglang.srt.kv_canary.token_oracle.oracle import HashOracle, hash_oracle_token_scalar
from sglang.srt.kv_canary.token_oracle.manager import TokenOracleManager
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=10, suite="kv-canary-cpu")

VOCAB_SIZES = (1, 2, 3, 7, 32000 + 11, 1 << 5, 1 << 16, 1 << 30, 151936, (1 << 31) - 1)
_INT64_EDGES = (0, 1, -1, (1 << 63) - 1, -(1 << 63), (1 << 32) - 1, 1 << 32, -(1 << 32))


def _random_ids(count: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    values = list(_INT64_EDGES)
    values += [rng.randint(-(1 << 63), (1 << 63) - 1) for _ in range(count)]
    return values


def test_splitmix64_reference_matches_published_vectors() -> None:
    # The SplitMix64 generator seeded with 0 outputs mix64(k * golden_gamma) for k = 1, 2, 3:
    # 0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4, 0x06C45D188009454F (Steele et al. / Vigna).
    gamma = 0x9E3779B97F4A7C15
    outputs = [splitmix64_finalizer((k * gamma) % (1 << 64)) for k in (1, 2, 3)]
    assert outputs == [0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4, 0x06C45D188009454F]
    assert splitmix64_finalizer(0) == 0


@pytest.mark.parametrize("vocab_size", VOCAB_SIZES)
def test_hash_oracle_bit_exact_against_scalar_reference(vocab_size: int) -> None:
    ids = _random_ids(200, seed=vocab_size)
    rng = random.Random(vocab_size + 1)
    positions = [rng.choice([0, 1, 4095, 131071, (1 << 40) + 3, (1 << 63) - 1,
                             rng.randint(0, 1 << 20)]) for _ in ids]
    oracle = HashOracle(vocab_size=vocab_size)
    tokens = oracle.expected_tokens(
        generalized_req_ids=torch.tensor(ids, dtype=torch.int64),
        positions=torch.tensor(positions, dtype=torch.int64),
    )
    assert tokens.dtype == torch.int32
    expected = [oracle_token(i, p, vocab_size) for i, p in zip(ids, positions)]
    assert tokens.tolist() == expected
    assert [hash_oracle_token_scalar(generalized_req_id=i, position=p, vocab_size=vocab_size)
            for i, p in zip(ids, positions)] == expected


def test_hash_oracle_keeps_shape_and_is_deterministic() -> None:
    oracle = HashOracle(vocab_size=151936)
    ids = torch.tensor([[5, -7], [1 << 62, 0]], dtype=torch.int64)
    positions = torch.tensor([[0, 1], [2, 3]], dtype=torch.int64)
    first = oracle.expected_tokens(generalized_req_ids=ids, positions=positions)
    assert first.shape == (2, 2)
    assert torch.equal(first, oracle.expected_tokens(generalized_req_ids=ids, positions=positions))


@pytest.mark.parametrize("vocab_size", [0, -3, 1 << 31, 2.5, True])
def test_hash_oracle_rejects_bad_vocab_size(vocab_size: object) -> None:
    with pytest.raises(ValueError, match="vocab_size"):
        HashOracle(vocab_size=vocab_size)


def test_hash_oracle_rejects_bad_inputs() -> None:
    oracle = HashOracle(vocab_size=10)
    with pytest.raises(TypeError, match="positions must be int64"):
        oracle.expected_tokens(generalized_req_ids=torch.zeros(2, dtype=torch.int64),
                               positions=torch.zeros(2, dtype=torch.int32))
    with pytest.raises(ValueError, match="differ in shape"):
        oracle.expected_tokens(generalized_req_ids=torch.zeros(2, dtype=torch.int64),
                               positions=torch.zeros(3, dtype=torch.int64))


@pytest.mark.parametrize("position_dtype", [torch.int32, torch.int64])
def test_sample_next_tokens_is_the_oracle_at_position_plus_one(position_dtype: torch.dtype) -> None:
    vocab_size = 4096
    manager = TokenOracleManager(oracle=HashOracle(vocab_size=vocab_size))
    ids = [11, -4, 1 << 50]
    positions = [0, 17, 4000]
    tokens = manager.sample_next_tokens(
        generalized_req_ids=torch.tensor(ids, dtype=torch.int64),
        logits_positions=torch.tensor(positions, dtype=position_dtype),
    )
    assert tokens.dtype == torch.int32
    assert tokens.tolist() == [oracle_token(i, p + 1, vocab_size) for i, p in zip(ids, positions)]



def test_sampling_by_request_selects_the_room_over_the_rid() -> None:
    manager = TokenOracleManager(oracle=HashOracle(vocab_size=4096))
    rids, rooms, positions = [11, -4, 1 << 50], [-1, 9, 0], [0, 17, 4000]
    tokens = manager.sample_next_tokens_by_request(
        rids_int=torch.tensor(rids, dtype=torch.int64),
        bootstrap_room_ids_int=torch.tensor(rooms, dtype=torch.int64),
        logits_positions=torch.tensor(positions, dtype=torch.int32),
    )
    generalized = [room if room >= 0 else rid for rid, room in zip(rids, rooms)]
    assert tokens.dtype == torch.int32
    assert tokens.tolist() == [oracle_token(i, p + 1, 4096) for i, p in zip(generalized, positions)]

if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
