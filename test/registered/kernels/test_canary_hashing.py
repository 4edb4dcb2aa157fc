"""mix64, chain_term, chain_after and the slot fingerprint: scalar reference == torch (and the host's
numpy ``chain_after``), bit for bit (the Triton forms are pinned against the same references in ``test_canary_triton_helpers.py``).

The values are part of the record format (a prefill server and a decode server must agree on
them), so a few are also pinned as literals.
"""

import random
import sys

import numpy as np
import pytest
import torch

from sglang.jit_kernel.kv_canary.consts import CHAIN_ANCHOR, TOKEN_MASK
from sglang.jit_kernel.kv_canary.hashing import (
    chain_after_numpy,
    mix64_numpy,
    chain_after_scalar,
    chain_after_torch,
    chain_before_torch,
    chain_term_scalar,
    chain_term_torch,
    due_source_scalar,
    due_sources_torch,
    fingerprint_columns,
    fingerprint_lane_bits,
    fingerprint_fold_torch,
    fingerprint_keys_torch,
    fingerprint_scalar,
    lane_mask_scalar,
    lane_masks_torch,
    mix64_scalar,
    mix64_torch,
    slot_fingerprint_scalar,
    slot_fingerprints_torch,
    to_signed_i64,
)
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=5, suite="kv-canary-cpu")

I64_MIN, I64_MAX = -(1 << 63), (1 << 63) - 1
EDGE_VALUES = [0, 1, -1, 2, 151643, (1 << 31) - 1, 1 << 31, 1 << 32, I64_MAX, I64_MIN, I64_MIN + 1]


def random_values(count: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return EDGE_VALUES + [rng.randint(I64_MIN, I64_MAX) for _ in range(count - len(EDGE_VALUES))]


def signed(values):
    return [to_signed_i64(v) for v in values]


def test_pinned_values():
    assert chain_term_scalar(0, 0) == 564591347747
    assert chain_term_scalar(151643, 7) == 226011646570
    assert chain_term_scalar(-1, 1 << 40) == 656956252769
    assert fingerprint_scalar(words=[]) == 0
    assert fingerprint_scalar(words=[(0, 0, 1), (0, 1, 2)]) == 16189602710100240649
    assert fingerprint_scalar(words=[(0, c, -1) for c in range(3)]) == 17313785640128031384
    assert mix64_scalar(1) == 6238072747940578789
    assert chain_after_scalar(tokens=[]) == CHAIN_ANCHOR
    assert chain_after_scalar(tokens=[7, 8]) == (
        CHAIN_ANCHOR + chain_term_scalar(7, 0) + chain_term_scalar(8, 1)
    )


def test_chain_term_is_a_40_bit_value():
    values = random_values(64, seed=1)
    terms = [chain_term_scalar(a, b) for a, b in zip(values, reversed(values))]
    assert all(0 <= term < (1 << 40) for term in terms)


def test_torch_forms_match_the_scalar_reference():
    tokens = torch.tensor(random_values(128, seed=2), dtype=torch.int64)
    positions = torch.tensor(random_values(128, seed=3), dtype=torch.int64)
    assert mix64_torch(tokens).tolist() == signed(mix64_scalar(t) for t in tokens.tolist())
    assert chain_term_torch(tokens, positions).tolist() == [
        chain_term_scalar(t, p) for t, p in zip(tokens.tolist(), positions.tolist())
    ]
    columns = torch.arange(7, dtype=torch.int64)
    for source in range(4):
        keys = fingerprint_keys_torch(source=source, columns=columns)
        words = tokens[: 8 * 7].view(8, 7)
        assert fingerprint_fold_torch(words=words, keys=keys).tolist() == signed(
            fingerprint_scalar(words=[(source, c, w) for c, w in enumerate(row)])
            for row in words.tolist()
        )


def test_numpy_mix64_matches_the_scalar_reference():
    values = random_values(200, seed=12)
    mixed = mix64_numpy(np.array(values, dtype=np.int64).view(np.uint64))
    assert mixed.tolist() == [mix64_scalar(v & ((1 << 64) - 1)) for v in values]


@pytest.mark.parametrize("count", [0, 1, 11, 3000])
def test_numpy_chain_after_matches_the_scalar_reference(count):
    tokens = random_values(max(count, len(EDGE_VALUES)), seed=count)[:count]
    assert chain_after_numpy(np.array(tokens, dtype=np.int64)) == chain_after_scalar(
        tokens=tokens
    )
    with pytest.raises(TypeError, match="1-D int64"):
        chain_after_numpy(np.zeros(3, dtype=np.int32))


def test_chain_forms_use_the_low_32_bits_of_tokens():
    rng = random.Random(4)
    tokens = [rng.randrange(1 << 31) for _ in range(50)]
    high = torch.tensor(tokens, dtype=torch.int64) + (5 << 32)  # same low 32 bits
    positions = torch.arange(50)
    assert int(chain_after_torch(tokens=high, positions=positions)) == chain_after_scalar(
        tokens=tokens
    )
    before = chain_before_torch(tokens=high.view(2, 25), positions=positions.view(2, 25))
    assert before[0].tolist() == [chain_after_scalar(tokens=tokens[:p]) for p in range(25)]
    assert int(before[1, 0]) == CHAIN_ANCHOR  # each row is its own history
    assert int(before[1, 1]) == CHAIN_ANCHOR + chain_term_scalar(tokens[25] & TOKEN_MASK, 25)


@pytest.mark.parametrize("partial", [False, True])
def test_slot_fingerprints_match_the_scalar_reference(partial):
    generator = torch.Generator().manual_seed(5)
    sources = [
        torch.randint(I64_MIN, I64_MAX, (rows, words), generator=generator, dtype=torch.int64)
        for rows, words in ((10, 4), (12, 6), (10, 2), (9, 8))
    ]
    strided = torch.zeros(10, 11, dtype=torch.int64)[:, 1:5]
    strided.copy_(sources[0])
    sources[0] = strided  # rows of a wider buffer
    slots = torch.tensor([0, 1, 2, 3, 5, 8, 9, 10, 11, 12, -1, -7, 1 << 40])
    rows = [source.tolist() for source in sources]
    for count in range(1, 5):
        got = slot_fingerprints_torch(slots=slots, sources=sources[:count], partial=partial)
        assert got.tolist() == signed(
            slot_fingerprint_scalar(slot=slot, sources=rows[:count], partial=partial)
            for slot in slots.tolist()
        )


def test_fingerprint_sees_every_single_word_change_and_word_order():
    rng = random.Random(4)
    words = [rng.randint(I64_MIN, I64_MAX) for _ in range(16)]
    triples = [(source, column % 8, word) for column, word in enumerate(words)
               for source in [column // 8]]
    base = fingerprint_scalar(words=triples)
    for index in range(len(triples)):
        for bit in (0, 17, 63):
            changed = list(triples)
            source, column, word = changed[index]
            changed[index] = (source, column, to_signed_i64(word ^ (1 << bit)))
            assert fingerprint_scalar(words=changed) != base
    swapped = [(0, 0, words[1]), (0, 1, words[0])] + triples[2:]
    assert fingerprint_scalar(words=swapped) != base
    other_source = [(1, c, w) for _, c, w in triples[:8]] + triples[8:]
    assert fingerprint_scalar(words=other_source) != base


@pytest.mark.parametrize("num_sources", [1, 2, 3, 4])
def test_partial_fingerprints_keep_one_lane_per_source(num_sources):
    """Lane ``s`` of a partial fingerprint is the top ``64 // L`` bits of source ``s``'s fold,
    so a changed word of source ``s`` moves only lane ``s``, and the lane masks tile the bits
    the lanes use."""
    rng = random.Random(num_sources)
    rows = [[[rng.randint(I64_MIN, I64_MAX) for _ in range(4)] for _ in range(6)]
            for _ in range(num_sources)]
    bits = fingerprint_lane_bits(num_sources)
    masks = [lane_mask_scalar(source=s, num_sources=num_sources) for s in range(num_sources)]
    assert [m & other for i, m in enumerate(masks) for other in masks[i + 1 :]] == [0] * (
        num_sources * (num_sources - 1) // 2
    )
    slot = 3
    base = to_signed_i64(slot_fingerprint_scalar(slot=slot, sources=rows, partial=True))
    for source in range(num_sources):
        columns = fingerprint_columns(slot=slot, words_per_row=4, num_rows=6, partial=True)
        folded = fingerprint_scalar(words=[(source, c, rows[source][slot][c]) for c in columns])
        assert (base & masks[source]) == to_signed_i64((folded >> (64 - bits)) << (source * bits))
        changed = [[list(row) for row in source_rows] for source_rows in rows]
        changed[source][slot][columns[1]] ^= 1 << 5
        moved = base ^ to_signed_i64(
            slot_fingerprint_scalar(slot=slot, sources=changed, partial=True)
        )
        assert moved & ~masks[source] == 0  # only this source's lane moves (if at all)
    if num_sources == 1:  # one lane of 64 bits: the fold itself
        columns = fingerprint_columns(slot=slot, words_per_row=4, num_rows=6, partial=True)
        assert base == to_signed_i64(
            fingerprint_scalar(words=[(0, c, rows[0][slot][c]) for c in columns])
        )


def test_due_sources_rotate_over_the_due_positions():
    """Position ``p`` in step ``S`` is due when ``(p + S) % N == 0`` and then reads source
    ``((p + S) // N) % L``: every source once in ``N * L`` consecutive forwards."""
    for stride, num_sources in ((1, 4), (3, 4), (2, 2)):
        for position in range(5):
            due = [due_source_scalar(position=position, step=step, stride=stride,
                                     num_sources=num_sources)
                   for step in range(stride * num_sources)]
            assert sorted(s for s in due if s is not None) == list(range(num_sources))
            positions = torch.full((stride * num_sources,), position, dtype=torch.int64)
            for step in range(stride * num_sources):
                is_due, source = due_sources_torch(positions=positions[:1], step=step,
                                                   stride=stride, num_sources=num_sources)
                assert bool(is_due[0]) == (due[step] is not None)
                assert due[step] is None or int(source[0]) == due[step]
    assert lane_masks_torch(sources=torch.tensor([0, 3, 1]), num_sources=4).tolist() == [
        0xFFFF, to_signed_i64(0xFFFF << 48), 0xFFFF << 16
    ]


def test_partial_columns_rotate_with_the_slot():
    seen = [
        tuple(fingerprint_columns(slot=slot, words_per_row=8, num_rows=64, partial=True))
        for slot in range(8)
    ]
    assert seen == [(0, 1), (2, 3), (4, 5), (6, 7)] * 2
    assert tuple(fingerprint_columns(slot=5, words_per_row=5, num_rows=64, partial=True)) == (
        2, 3,
    )
    outside = fingerprint_columns(slot=99, words_per_row=8, num_rows=64, partial=True)
    assert tuple(outside) == (0, 1)
    assert tuple(fingerprint_columns(slot=3, words_per_row=3, num_rows=8, partial=False)) == (
        0, 1, 2,
    )
    with pytest.raises(ValueError, match="words_per_row >= 2"):
        fingerprint_columns(slot=0, words_per_row=1, num_rows=8, partial=True)


def test_torch_forms_reject_other_dtypes():
    with pytest.raises(TypeError, match="int64"):
        chain_term_torch(torch.zeros(2, dtype=torch.int32), torch.zeros(2, dtype=torch.int64))
    with pytest.raises(TypeError, match="int64"):
        fingerprint_fold_torch(
            words=torch.zeros(2, 2, dtype=torch.int32), keys=torch.zeros(2, dtype=torch.int64)
        )
    with pytest.raises(TypeError, match="int64"):
        slot_fingerprints_torch(slots=torch.zeros(2, dtype=torch.int32), sources=[],
                                partial=False)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
