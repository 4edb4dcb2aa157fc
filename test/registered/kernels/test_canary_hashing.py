"""chain_term, fingerprint and mix64: scalar reference == torch == Triton, bit for bit.

The values are part of the record format (a prefill server and a decode server must agree on
them), so a few are also pinned as literals.
"""

import random
import sys

import pytest
import torch

from _canary_sim import TRITON_DEVICES, import_triton_modules
from sglang.jit_kernel.kv_canary.hashing import (
    chain_term_scalar,
    chain_term_torch,
    fingerprint_scalar,
    fingerprint_torch,
    mix64_scalar,
    mix64_torch,
    to_signed_i64,
)
from sglang.test.ci.ci_register import register_cpu_ci, register_cuda_ci

register_cpu_ci(est_time=5, suite="kv-canary-cpu")
register_cuda_ci(est_time=15, suite="kv-canary-gpu")

triton_hashing, _ = import_triton_modules()  # before the kernel below is decorated

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

I64_MIN, I64_MAX = -(1 << 63), (1 << 63) - 1
EDGE_VALUES = [0, 1, -1, 2, 151643, (1 << 31) - 1, 1 << 31, 1 << 32, I64_MAX, I64_MIN, I64_MIN + 1]


def _random_values(count: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return EDGE_VALUES + [rng.randint(I64_MIN, I64_MAX) for _ in range(count - len(EDGE_VALUES))]


def _signed(values):
    return [to_signed_i64(v) for v in values]


def test_pinned_values():
    assert chain_term_scalar(0, 0) == 564591347747
    assert chain_term_scalar(151643, 7) == 226011646570
    assert chain_term_scalar(-1, 1 << 40) == 656956252769
    assert fingerprint_scalar([]) == 0
    assert fingerprint_scalar([1, 2]) == 16189602710100240649
    assert fingerprint_scalar([-1, -1, -1]) == 17313785640128031384
    assert mix64_scalar(1) == 6238072747940578789


def test_chain_term_is_a_40_bit_value():
    values = _random_values(64, seed=1)
    terms = [chain_term_scalar(a, b) for a, b in zip(values, reversed(values))]
    assert all(0 <= term < (1 << 40) for term in terms)


def test_torch_forms_match_the_scalar_reference():
    tokens = torch.tensor(_random_values(128, seed=2), dtype=torch.int64)
    positions = torch.tensor(_random_values(128, seed=3), dtype=torch.int64)
    assert mix64_torch(tokens).tolist() == _signed(mix64_scalar(t) for t in tokens.tolist())
    assert chain_term_torch(tokens, positions).tolist() == [
        chain_term_scalar(t, p) for t, p in zip(tokens.tolist(), positions.tolist())
    ]
    for num_words in (0, 1, 2, 3, 5, 16, 37):
        values = _random_values(8 * num_words + 11, seed=num_words)[: 8 * num_words]
        words = torch.tensor(values, dtype=torch.int64)
        words = words.view(8, num_words)
        assert fingerprint_torch(words).tolist() == _signed(
            fingerprint_scalar(row) for row in words.tolist()
        )


def test_fingerprint_sees_every_single_word_change_and_word_order():
    rng = random.Random(4)
    words = [rng.randint(I64_MIN, I64_MAX) for _ in range(16)]
    base = fingerprint_scalar(words)
    for index in range(len(words)):
        for bit in (0, 17, 63):
            changed = list(words)
            changed[index] = to_signed_i64(changed[index] ^ (1 << bit))
            assert fingerprint_scalar(changed) != base
    swapped = [words[1], words[0]] + words[2:]
    assert fingerprint_scalar(swapped) != base


def test_torch_forms_reject_other_dtypes():
    with pytest.raises(TypeError, match="int64"):
        chain_term_torch(torch.zeros(2, dtype=torch.int32), torch.zeros(2, dtype=torch.int64))
    with pytest.raises(TypeError, match="int64"):
        fingerprint_torch(torch.zeros(2, 2, dtype=torch.int32))


@triton.jit
def _hash_kernel(
    tokens_ptr,
    positions_ptr,
    words_ptr,
    mix_out_ptr,
    term_out_ptr,
    fingerprint_out_ptr,
    N: tl.constexpr,
    NUM_WORDS: tl.constexpr,
    WORD_CHUNK: tl.constexpr,
):
    lanes = tl.arange(0, N)
    tokens = tl.load(tokens_ptr + lanes)
    positions = tl.load(positions_ptr + lanes)
    tl.store(mix_out_ptr + lanes, triton_hashing.mix64(tokens))
    tl.store(term_out_ptr + lanes, triton_hashing.chain_term(tokens, positions))
    row_offsets = lanes.to(tl.int64) * NUM_WORDS
    fingerprint = triton_hashing.fingerprint_rows(
        words_ptr, row_offsets, lanes < N, NUM_WORDS, WORD_CHUNK
    )
    tl.store(fingerprint_out_ptr + lanes, fingerprint)


@pytest.mark.parametrize("device", TRITON_DEVICES)
@pytest.mark.parametrize("num_words, word_chunk", [(0, 1), (2, 2), (5, 4), (37, 16)])
def test_triton_forms_match_the_scalar_reference(device, num_words, word_chunk):
    n = 64
    tokens = torch.tensor(_random_values(n, seed=5), dtype=torch.int64)
    positions = torch.tensor(_random_values(n, seed=6), dtype=torch.int64)
    values = _random_values(n * num_words + 11, seed=7)[: n * num_words]
    words = torch.tensor(values, dtype=torch.int64)
    words = words.view(n, num_words)
    outputs = [torch.empty(n, dtype=torch.int64, device=device) for _ in range(3)]
    inputs = (tokens.to(device), positions.to(device), words.to(device))
    _hash_kernel[(1,)](*inputs, *outputs, n, num_words, word_chunk)
    mix, term, fingerprint = (out.tolist() for out in outputs)
    assert mix == _signed(mix64_scalar(t) for t in tokens.tolist())
    assert term == [chain_term_scalar(t, p) for t, p in zip(tokens.tolist(), positions.tolist())]
    assert fingerprint == _signed(fingerprint_scalar(row) for row in words.tolist())


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
