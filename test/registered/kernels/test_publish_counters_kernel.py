"""The counter publication's seal (count the publication, checksum the words before it) on the
torch reference and the Triton kernel (interpreted on a CPU, compiled on CUDA), against the
contract computed with Python ints; input errors; and, on CUDA, one captured launch sealing
each replay's counters."""

import random
import sys

import numpy as np
import pytest
import torch

from _canary_sim import IMPLS, publish_impl
from sglang.jit_kernel.kv_canary.consts import (
    COUNTER_CHECKSUM,
    COUNTER_PUBLISHES,
    NUM_COUNTERS,
)
from sglang.jit_kernel.kv_canary.hashing import counters_checksum, counters_checksum_holds
from sglang.test.ci.ci_register import register_cpu_ci, register_cuda_ci

register_cpu_ci(est_time=5, suite="kv-canary-cpu")
register_cuda_ci(est_time=10, suite="kv-canary-gpu")


def _expected(words: list[int]) -> list[int]:
    """The contract with Python ints."""
    sealed = list(words)
    sealed[COUNTER_PUBLISHES] += 1
    sealed[COUNTER_CHECKSUM] = counters_checksum(sealed)
    return sealed


def _counter_cases() -> list[list[int]]:
    rng = random.Random(7)
    cases = [[0] * NUM_COUNTERS, list(range(NUM_COUNTERS))]
    cases += [  # large and negative words: the checksum wraps like int64
        [rng.randrange(-(1 << 62), 1 << 62) for _ in range(NUM_COUNTERS)] for _ in range(6)
    ]
    return cases


@pytest.mark.parametrize("impl, device", IMPLS)
def test_matches_the_contract(impl, device):
    launch = publish_impl(impl).launch_publish_counters
    for words in _counter_cases():
        counters = torch.tensor(words, dtype=torch.int64, device=device)
        launch(counters=counters)
        assert counters.cpu().tolist() == _expected(words)


def test_every_word_before_the_checksum_enters_it():
    words = list(range(10, 10 + NUM_COUNTERS))
    sealed = _expected(words)
    for index in range(COUNTER_CHECKSUM):
        changed = list(sealed)
        changed[index] += 1
        assert counters_checksum(changed) != sealed[COUNTER_CHECKSUM], index
    assert counters_checksum([0] * NUM_COUNTERS) != 0  # a zeroed copy never checks out


def test_the_host_check_agrees_with_the_scalar_checksum():
    """The numpy check the mailbox runs on every copy it reads: true for a sealed copy, false
    once any word (the checksum included) differs."""
    for words in _counter_cases():
        sealed = np.array(_expected(words), dtype=np.int64)
        assert counters_checksum_holds(sealed)
        for index in range(NUM_COUNTERS):
            changed = sealed.copy()
            changed[index] += 1
            assert not counters_checksum_holds(changed), index


@pytest.mark.parametrize("impl, device", [p for p in IMPLS if "cuda" not in p.id])
@pytest.mark.parametrize(
    "counters, error, match",
    [
        ([0] * NUM_COUNTERS, TypeError, "int64 torch.Tensor"),
        (torch.zeros(NUM_COUNTERS, dtype=torch.int32), TypeError, "torch.int32"),
        (torch.zeros(NUM_COUNTERS + 1, dtype=torch.int64), ValueError, "NUM_COUNTERS"),
        (torch.zeros(2 * NUM_COUNTERS, dtype=torch.int64)[::2], ValueError, "contiguous"),
    ],
    ids=["not a tensor", "int32", "too long", "strided"],
)
def test_contract_errors_name_the_argument(impl, device, counters, error, match):
    with pytest.raises(error, match=match):
        publish_impl(impl).launch_publish_counters(counters=counters)


@pytest.mark.gpu
def test_one_captured_launch_seals_each_replay_s_counters():
    counters = torch.zeros(NUM_COUNTERS, dtype=torch.int64, device="cuda")
    launch = publish_impl("triton").launch_publish_counters
    launch(counters=counters)  # compile first
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        launch(counters=counters)
    rng = random.Random(3)
    for _ in range(4):
        words = [rng.randrange(1 << 40) for _ in range(NUM_COUNTERS)]
        counters.copy_(torch.tensor(words))
        graph.replay()
        torch.cuda.synchronize()
        assert counters.cpu().tolist() == _expected(words)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
