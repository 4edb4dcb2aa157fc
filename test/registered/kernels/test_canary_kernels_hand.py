"""Hand cases for the canary launches, run on the torch reference and the Triton kernels.

Every expectation is computed independently of both implementations (scalar hashing, explicit
ring rows), so each case pins the contract itself, not only kernel == reference. The Triton
kernels run in Triton's interpreter on CPU and compiled on CUDA (``gpu`` variants).
"""

import dataclasses
import sys

import pytest

from _canary_sim import (
    IMPLS,
    KvSim,
    Violation,
    canary_impl,
    clone_state,
    expected_history_records,
    reference_module,
)
from sglang.jit_kernel.kv_canary.consts import (
    CHAIN_ANCHOR,
    COUNTER_ENTRIES,
    COUNTER_KERNEL_RUNS,
    COUNTER_STEP,
    COUNTER_VIOLATIONS,
    FIELD_CHAIN,
    FIELD_POSITION,
    FIELD_TOKEN,
    NO_EXPECTED_TOKEN,
    CheckKind,
    Reason,
)
from sglang.jit_kernel.kv_canary.hashing import (
    chain_term_scalar,
    fingerprint_scalar,
    to_signed_i64,
)
from sglang.test.ci.ci_register import register_cpu_ci, register_cuda_ci

register_cpu_ci(est_time=20, suite="kv-canary-cpu")
register_cuda_ci(est_time=90, suite="kv-canary-gpu")

pytestmark = pytest.mark.parametrize("impl, device", IMPLS)

PRE, POST, WRITE = CheckKind.PRE_VERIFY, CheckKind.POST_VERIFY, CheckKind.WRITE
TOKENS_A = [11, 12, 13, 14, 15, 16, 17, 18, 19]
TOKENS_B = [21, 22, 23, 24, 25, 26, 27, 28, 29]


def _counters(
    *, pre=0, post=0, step=None, verified_pre=0, verified_post=0, written=0, violations=0
):
    counters = [0] * (COUNTER_ENTRIES + len(CheckKind))
    counters[COUNTER_VIOLATIONS] = violations
    counters[COUNTER_STEP] = post if step is None else step
    counters[COUNTER_KERNEL_RUNS + PRE] = pre
    counters[COUNTER_KERNEL_RUNS + POST] = post
    counters[COUNTER_KERNEL_RUNS + WRITE] = post
    counters[COUNTER_ENTRIES + PRE] = verified_pre
    counters[COUNTER_ENTRIES + POST] = verified_post
    counters[COUNTER_ENTRIES + WRITE] = written
    return counters


def _prefilled(impl, device, *, prompts, **sim_options):
    """A sim whose requests ``1..`` hold ``prompts[i][:prefill]`` after one EXTEND forward."""
    sim = KvSim(device=device, **sim_options)
    launches = canary_impl(impl)
    rows = []
    for index, (tokens, prefill) in enumerate(prompts, start=1):
        sim.add_request(index, tokens)
        rows.append((index, prefill))
    sim.forward(launches, sim.extend_batch(rows))
    return sim, launches


def _verify_row(kind, reasons, slot, position, token, chain, expected_chain, expected_token=-1):
    """A verify violation row of request 1 in forward step 1."""
    return Violation(
        kind, reasons, 1, slot, position, token, expected_token, chain, expected_chain, 1
    )


def _chain(tokens, position):
    return expected_history_records(tokens[: position + 1])[position][2]


def _assert_history_records(sim, rp, *, with_fingerprints=False):
    request = sim.requests[rp]
    for (token, position, chain), slot in zip(
        expected_history_records(request.tokens[: len(request.slots)]), request.slots
    ):
        record = sim.record(slot)
        assert record[:3] == (token, position, chain), f"slot {slot} (position {position})"
        if with_fingerprints:
            words = sim.state.real_kv_words[slot, : sim.state.real_kv_num_words].tolist()
            assert record[3] == to_signed_i64(fingerprint_scalar(words))
        else:
            assert record[3] == 0


# ----------------------------------------------------------------------------- clean paths


def test_prefill_writes_oracle_records(impl, device):
    sim, _ = _prefilled(
        impl, device, prompts=[(TOKENS_A, 5), (TOKENS_B, 3)], real_kv_num_words=2
    )
    _assert_history_records(sim, 1, with_fingerprints=True)
    _assert_history_records(sim, 2, with_fingerprints=True)
    assert sim.counters() == _counters(pre=1, post=1, written=8)
    assert sim.violations() == []


def test_decode_steps_verify_clean_with_padding_rows(impl, device):
    sim, launches = _prefilled(impl, device, prompts=[(TOKENS_A, 4), (TOKENS_B, 2)])
    verified = 0
    for _ in range(3):
        prefix = sum(len(sim.requests[rp].slots) for rp in (1, 2))
        sim.forward(launches, sim.decode_batch([1, 2], padded_rows=2))
        verified += prefix
    _assert_history_records(sim, 1)
    _assert_history_records(sim, 2)
    assert sim.counters() == _counters(
        pre=4, post=4, verified_pre=verified, verified_post=verified, written=6 + 6
    )
    assert sim.violations() == []


def test_chunked_prefill_then_decode_pipeline_is_clean(impl, device):
    sim = KvSim(device=device, page_size=4, real_kv_num_words=2, seed=3)
    launches = canary_impl(impl)
    sim.add_request(1, TOKENS_A)
    sim.add_request(2, TOKENS_B)
    checks = dict(token_pool=True, expected_inputs=True)
    sim.forward(launches, sim.extend_batch([(1, 5)], **checks))  # first chunk
    sim.forward(launches, sim.extend_batch([(1, 2), (2, 3)], **checks))  # chunk + new prompt
    for _ in range(2):
        sim.forward(launches, sim.decode_batch([1, 2], padded_rows=1, **checks))
    sim.forward(launches, sim.extend_batch([(2, 1), (1, 0)], padded_rows=1, **checks))  # mixed
    _assert_history_records(sim, 1, with_fingerprints=True)
    _assert_history_records(sim, 2, with_fingerprints=True)
    verified = 0 + 5 + (7 + 3) + (8 + 4) + (9 + 5)
    assert sim.counters() == _counters(
        pre=5, post=5, verified_pre=verified, verified_post=verified, written=5 + 5 + 2 + 2 + 1
    )
    assert sim.violations() == []


def test_radix_shared_prefix_verifies_clean(impl, device):
    shared = TOKENS_A[:4]
    sim = KvSim(device=device, page_size=4)
    launches = canary_impl(impl)
    sim.add_request(1, shared + [31, 32, 33])
    sim.add_request(2, shared + [41, 42])
    sim.forward(launches, sim.extend_batch([(1, 6)]))
    sim.share_prefix(req_pool_index=2, source=1, num_tokens=4)
    sim.forward(launches, sim.extend_batch([(2, 1)]))
    sim.forward(launches, sim.decode_batch([1, 2]))
    assert sim.requests[1].slots[:4] == sim.requests[2].slots[:4]
    _assert_history_records(sim, 1)
    _assert_history_records(sim, 2)
    assert sim.violations() == []
    assert sim.counters()[COUNTER_ENTRIES + PRE] == 4 + 6 + 5


def test_empty_batches_only_count_runs(impl, device):
    sim = KvSim(device=device)
    launches = canary_impl(impl)
    sim.forward(launches, sim.decode_batch([]))
    sim.forward(launches, sim.extend_batch([]))
    sim.forward(launches, sim.extend_batch([], padded_rows=3))
    assert sim.counters() == _counters(pre=3, post=3)
    assert int(sim.state.records.abs().sum()) == 0


def test_rows_with_empty_prefix_write_from_the_anchor(impl, device):
    sim = KvSim(device=device)
    launches = canary_impl(impl)
    sim.add_request(1, TOKENS_A)
    sim.add_request(2, TOKENS_B)
    sim.forward(launches, sim.decode_batch([1]))  # decode row with prefix 0
    sim.forward(launches, sim.extend_batch([(2, 0), (1, 1)]))  # extend row with no tokens
    assert sim.record(sim.requests[1].slots[0]) == (TOKENS_A[0], 0, CHAIN_ANCHOR, 0)
    _assert_history_records(sim, 1)
    assert sim.counters() == _counters(pre=2, post=2, verified_pre=1, verified_post=1, written=2)
    assert sim.violations() == []


# ----------------------------------------------------------------------------- padding, slot 0


def test_padded_rows_are_neither_verified_nor_written(impl, device):
    sim, launches = _prefilled(impl, device, prompts=[(TOKENS_A, 4)])
    victim = sim.requests[1].slots[0]
    before = sim.record(victim)
    batch = sim.decode_batch([1], padded_rows=2)
    batch.seq_lens[1:] = 3  # stale padding metadata must not matter
    batch.out_cache_loc[1:] = victim
    batch.input_ids[1:] = 999
    sim.forward(launches, batch)
    assert sim.record(victim) == before
    assert sim.counters() == _counters(pre=2, post=2, verified_pre=4, verified_post=4, written=5)
    assert sim.violations() == []


def test_slot_zero_is_skipped_and_breaks_no_chain(impl, device):
    sim, launches = _prefilled(impl, device, prompts=[(TOKENS_A, 6)])
    sim.state.req_to_token[1, 2] = 0  # position 2 unmapped: skipped, position 3's chain too
    sim.forward(launches, sim.decode_batch([1]))
    assert sim.violations() == []
    assert sim.counters() == _counters(pre=2, post=2, verified_pre=5, verified_post=5, written=7)


def test_out_cache_loc_zero_is_not_written_but_chained(impl, device):
    sim = KvSim(device=device)
    launches = canary_impl(impl)
    sim.add_request(1, TOKENS_A)
    batch = sim.extend_batch([(1, 4)])
    skipped = int(batch.out_cache_loc[1])
    batch.out_cache_loc[1] = 0
    sim.forward(launches, batch)
    assert sim.record(skipped) == (0, 0, 0, 0)
    third = sim.requests[1].slots[2]
    assert sim.record(third)[:3] == (TOKENS_A[2], 2, _chain(TOKENS_A, 2))
    assert sim.counters()[COUNTER_ENTRIES + WRITE] == 3


# ----------------------------------------------------------------------------- reason bits


def _decode_once(sim, launches, **checks):
    batch = sim.decode_batch([1], **checks)
    sim.forward(launches, batch)
    return batch


def test_verify_chain(impl, device):
    sim, launches = _prefilled(impl, device, prompts=[(TOKENS_A, 6)])
    slots = sim.requests[1].slots
    sim.state.records[slots[2], FIELD_CHAIN] += 1
    _decode_once(sim, launches)
    chain2, chain3 = _chain(TOKENS_A, 2), _chain(TOKENS_A, 3)
    expected = []
    for kind in (PRE, POST):
        expected += [
            _verify_row(kind, Reason.VERIFY_CHAIN, slots[2], 2, TOKENS_A[2], chain2 + 1, chain2),
            _verify_row(kind, Reason.VERIFY_CHAIN, slots[3], 3, TOKENS_A[3], chain3, chain3 + 1),
        ]
    assert sim.violations() == sorted(expected)
    assert sim.counters()[COUNTER_VIOLATIONS] == 4


def test_verify_position(impl, device):
    sim, launches = _prefilled(impl, device, prompts=[(TOKENS_A, 6)])
    slots = sim.requests[1].slots
    sim.state.records[slots[2], FIELD_POSITION] = 7
    _decode_once(sim, launches)
    chain2, chain3 = _chain(TOKENS_A, 2), _chain(TOKENS_A, 3)
    wrong_chain3 = to_signed_i64(chain2 + chain_term_scalar(TOKENS_A[2], 7))
    expected = []
    for kind in (PRE, POST):
        expected += [
            _verify_row(kind, Reason.VERIFY_POSITION, slots[2], 2, TOKENS_A[2], chain2, chain2),
            _verify_row(kind, Reason.VERIFY_CHAIN, slots[3], 3, TOKENS_A[3], chain3, wrong_chain3),
        ]
    assert sim.violations() == sorted(expected)


def test_verify_token_against_the_token_pool(impl, device):
    sim, launches = _prefilled(impl, device, prompts=[(TOKENS_A, 6)])
    slots = sim.requests[1].slots
    sim.state.records[slots[2], FIELD_TOKEN] = 77  # the slot claims another token
    batch = sim.decode_batch([1], token_pool=True)
    batch.expected_token_valid_lens[1] = 5  # positions >= 5 are not known: not token-checked
    sim.forward(launches, batch)
    chain2, chain3 = _chain(TOKENS_A, 2), _chain(TOKENS_A, 3)
    wrong_chain3 = to_signed_i64(chain2 + chain_term_scalar(77, 2))
    expected = []
    for kind in (PRE, POST):
        expected += [
            _verify_row(
                kind, Reason.VERIFY_TOKEN, slots[2], 2, 77, chain2, chain2, TOKENS_A[2]
            ),
            _verify_row(
                kind, Reason.VERIFY_CHAIN, slots[3], 3, TOKENS_A[3], chain3, wrong_chain3,
                TOKENS_A[3],
            ),
        ]
    assert sim.violations() == sorted(expected)


def test_verify_token_skips_positions_past_the_valid_length(impl, device):
    sim, launches = _prefilled(impl, device, prompts=[(TOKENS_A, 6)])
    batch = sim.decode_batch([1], token_pool=True)
    batch.expected_token_pool[1, 3:] = 0  # a wrong history, but only known up to position 3
    batch.expected_token_valid_lens[1] = 3  # indexed by pool row
    sim.forward(launches, batch)
    assert sim.violations() == []


@pytest.mark.parametrize("real_kv_num_words", [2, 4])
def test_verify_real_kv(impl, device, real_kv_num_words):
    sim, launches = _prefilled(
        impl, device, prompts=[(TOKENS_A, 6)], real_kv_num_words=real_kv_num_words
    )
    slots = sim.requests[1].slots
    sim.state.real_kv_words[slots[4], real_kv_num_words - 1] ^= 1 << 40  # flip one bit
    _decode_once(sim, launches)
    chain4 = _chain(TOKENS_A, 4)
    assert sim.violations() == [
        Violation(kind, Reason.VERIFY_REAL_KV, 1, slots[4], 4, TOKENS_A[4], -1, chain4, chain4, 1)
        for kind in (PRE, POST)
    ]


def test_real_kv_bytes_past_the_partial_window_are_not_covered(impl, device):
    sim, launches = _prefilled(impl, device, prompts=[(TOKENS_A, 6)], real_kv_num_words=2)
    sim.state.real_kv_words[sim.requests[1].slots[4], 3] ^= 1
    _decode_once(sim, launches)
    assert sim.violations() == []


def test_write_token(impl, device):
    sim, launches = _prefilled(impl, device, prompts=[(TOKENS_A, 6)])
    batch = sim.decode_batch([1], expected_inputs=True)
    batch.expected_input_ids[0] = 5
    sim.forward(launches, batch)
    slot = sim.requests[1].slots[6]
    assert sim.violations() == [
        Violation(WRITE, Reason.WRITE_TOKEN, 1, slot, 6, TOKENS_A[6], 5, 6, 6, 1)
    ]
    assert sim.record(slot)[:3] == (TOKENS_A[6], 6, _chain(TOKENS_A, 6))  # written anyway


def test_write_position_against_the_prefix(impl, device):
    sim, launches = _prefilled(impl, device, prompts=[(TOKENS_A, 6)])
    batch = sim.decode_batch([1], expected_inputs=True)
    batch.positions[0] = 8
    sim.forward(launches, batch)
    slot = sim.requests[1].slots[6]
    assert sim.violations() == [
        Violation(WRITE, Reason.WRITE_POSITION, 1, slot, 6, TOKENS_A[6], TOKENS_A[6], 8, 6, 1)
    ]
    assert sim.record(slot)[:2] == (TOKENS_A[6], 8)  # the record says what the slot holds


def test_write_position_against_the_expectation(impl, device):
    sim, launches = _prefilled(impl, device, prompts=[(TOKENS_A, 6)])
    batch = sim.decode_batch([1], expected_inputs=True)
    batch.expected_positions[0] = 9
    sim.forward(launches, batch)
    slot = sim.requests[1].slots[6]
    assert sim.violations() == [
        Violation(WRITE, Reason.WRITE_POSITION, 1, slot, 6, TOKENS_A[6], TOKENS_A[6], 6, 9, 1)
    ]


def test_write_position_against_the_prefix_when_the_expectation_agrees(impl, device):
    sim, launches = _prefilled(impl, device, prompts=[(TOKENS_A, 6)])
    batch = sim.decode_batch([1], expected_inputs=True)
    batch.positions[0] = 8
    batch.expected_positions[0] = 8  # an expectation derived from the same wrong position
    sim.forward(launches, batch)
    slot = sim.requests[1].slots[6]
    assert sim.violations() == [
        Violation(WRITE, Reason.WRITE_POSITION, 1, slot, 6, TOKENS_A[6], TOKENS_A[6], 8, 6, 1)
    ]


def test_write_checks_cover_every_token_of_an_extend_chunk(impl, device):
    sim = KvSim(device=device)
    launches = canary_impl(impl)
    sim.add_request(1, TOKENS_A)
    batch = sim.extend_batch([(1, 5)], expected_inputs=True)
    batch.input_ids[3] = 0
    batch.positions[4] = 0
    sim.forward(launches, batch)
    slots = sim.requests[1].slots
    assert sim.violations() == sorted(
        [
            Violation(WRITE, Reason.WRITE_TOKEN, 1, slots[3], 3, 0, TOKENS_A[3], 3, 3, 0),
            Violation(
                WRITE, Reason.WRITE_POSITION, 1, slots[4], 4, TOKENS_A[4], TOKENS_A[4], 0, 4, 0
            ),
        ]
    )


# ----------------------------------------------------------------------------- token history


def _unpredicted(batch):
    """The batch with no given token expectation (as the oracle leaves prompt tokens)."""
    batch.expected_input_ids.fill_(NO_EXPECTED_TOKEN)
    return batch


def test_write_token_falls_back_to_the_history_where_nothing_is_predicted(impl, device):
    sim = KvSim(device=device)
    launches = canary_impl(impl)
    sim.add_request(1, TOKENS_A)
    batch = _unpredicted(sim.extend_batch([(1, 5)], token_pool=True, expected_inputs=True))
    batch.input_ids[3] = 0  # the model consumes a token the request does not have
    sim.forward(launches, batch)
    slot = sim.requests[1].slots[3]
    assert sim.violations() == [
        Violation(WRITE, Reason.WRITE_TOKEN, 1, slot, 3, 0, TOKENS_A[3], 3, 3, 0)
    ]


def test_without_history_an_unpredicted_token_is_not_checked(impl, device):
    sim = KvSim(device=device)
    launches = canary_impl(impl)
    sim.add_request(1, TOKENS_A)
    batch = _unpredicted(sim.extend_batch([(1, 5)], expected_inputs=True))
    batch.input_ids[3] = 0
    sim.forward(launches, batch)
    assert sim.violations() == []


def test_history_fallback_skips_positions_the_history_does_not_know(impl, device):
    sim = KvSim(device=device)
    launches = canary_impl(impl)
    sim.add_request(1, TOKENS_A)
    batch = _unpredicted(sim.extend_batch([(1, 5)], token_pool=True, expected_inputs=True))
    batch.expected_token_valid_lens[1] = 3  # known up to position 3 (pool row 1)
    batch.input_ids[3] = 0
    batch.input_ids[2] = 0
    sim.forward(launches, batch)
    slot = sim.requests[1].slots[2]
    assert sim.violations() == [
        Violation(WRITE, Reason.WRITE_TOKEN, 1, slot, 2, 0, TOKENS_A[2], 2, 2, 0)
    ]


def test_a_given_expectation_wins_over_the_history(impl, device):
    sim, launches = _prefilled(impl, device, prompts=[(TOKENS_A, 6)])
    batch = sim.decode_batch([1], token_pool=True, expected_inputs=True)
    batch.expected_input_ids[0] = 5  # the oracle's token differs from the history's
    sim.forward(launches, batch)
    slot = sim.requests[1].slots[6]
    assert sim.violations() == [
        Violation(WRITE, Reason.WRITE_TOKEN, 1, slot, 6, TOKENS_A[6], 5, 6, 6, 1)
    ]


def test_no_expected_position_is_no_expectation(impl, device):
    sim, launches = _prefilled(impl, device, prompts=[(TOKENS_A, 6)])
    batch = sim.decode_batch([1], expected_inputs=True)
    batch.expected_positions[0] = NO_EXPECTED_TOKEN
    sim.forward(launches, batch)
    assert sim.violations() == []


def test_the_history_alone_does_not_verify_tokens_when_verify_token_is_off(impl, device):
    sim, launches = _prefilled(impl, device, prompts=[(TOKENS_A, 6)])
    batch = sim.decode_batch([1], token_pool=True, expected_inputs=True)
    batch = dataclasses.replace(batch, verify_token=False)
    batch.expected_token_pool[1, 2] = 77  # the slot's token differs from the history
    sim.forward(launches, batch)
    assert sim.violations() == []
    batch = sim.decode_batch([1], token_pool=True, expected_inputs=True)
    batch.expected_token_pool[1, 2] = 77
    sim.forward(launches, batch)
    slot = sim.requests[1].slots[2]
    chain2 = _chain(TOKENS_A, 2)
    assert sim.violations() == sorted(
        Violation(kind, Reason.VERIFY_TOKEN, 1, slot, 2, TOKENS_A[2], 77, chain2, chain2, 2)
        for kind in (PRE, POST)
    )


def test_valid_lengths_are_read_by_pool_row(impl, device):
    """Rows 1 and 3 in the batch as batch rows 0 and 1: row 3's length governs row 3."""
    sim, launches = _prefilled(impl, device, prompts=[(TOKENS_A, 6), (TOKENS_B, 3),
                                                      (TOKENS_B, 6)])
    batch = sim.decode_batch([1, 3], token_pool=True)
    batch.expected_token_pool[3, 4] = 99
    batch.expected_token_valid_lens[3] = 4  # position 4 of row 3 is not known yet
    batch.expected_token_valid_lens[2] = 0  # a row outside the batch: irrelevant
    sim.forward(launches, batch)
    assert sim.violations() == []
    batch = sim.decode_batch([1, 3], token_pool=True)
    batch.expected_token_pool[3, 4] = 99
    sim.forward(launches, batch)
    assert {(v.req_pool_index, v.position, v.reasons) for v in sim.violations()} == {
        (3, 4, Reason.VERIFY_TOKEN)
    }


# ----------------------------------------------------------------------------- mapping faults


def test_pointer_into_another_history_is_detected_by_the_chain(impl, device):
    sim, launches = _prefilled(impl, device, prompts=[(TOKENS_A, 6), (TOKENS_B, 6)])
    slots_a, slots_b = sim.requests[1].slots, sim.requests[2].slots
    sim.state.req_to_token[1, 3] = slots_b[3]  # same position, another request's history
    sim.forward(launches, sim.decode_batch([1, 2]))
    chain_b3, chain_a4 = _chain(TOKENS_B, 3), _chain(TOKENS_A, 4)
    from_b = to_signed_i64(chain_b3 + chain_term_scalar(TOKENS_B[3], 3))
    expected = []
    for kind in (PRE, POST):
        expected += [
            _verify_row(
                kind, Reason.VERIFY_CHAIN, slots_b[3], 3, TOKENS_B[3], chain_b3, _chain(TOKENS_A, 3)
            ),
            _verify_row(kind, Reason.VERIFY_CHAIN, slots_a[4], 4, TOKENS_A[4], chain_a4, from_b),
        ]
    assert sim.violations() == sorted(expected)


def test_out_of_range_slot_reads_as_an_empty_record(impl, device):
    sim, launches = _prefilled(impl, device, prompts=[(TOKENS_A, 6)], real_kv_num_words=2)
    bad_slot = sim.num_slots + 7
    sim.state.req_to_token[1, 2] = bad_slot
    launches.launch_pre_forward_verify(state=sim.state, batch=sim.decode_batch([1]))
    first, second = sorted(sim.violations(), key=lambda violation: violation.position)
    all_record_reasons = Reason.VERIFY_CHAIN | Reason.VERIFY_POSITION | Reason.VERIFY_REAL_KV
    chain2, chain3 = _chain(TOKENS_A, 2), _chain(TOKENS_A, 3)
    assert first == Violation(PRE, all_record_reasons, 1, bad_slot, 2, 0, -1, 0, chain2, 1)
    empty_record_successor = chain_term_scalar(0, 0)
    assert second == Violation(
        PRE, Reason.VERIFY_CHAIN, 1, sim.requests[1].slots[3], 3, TOKENS_A[3], -1, chain3,
        empty_record_successor, 1,
    )
    sim.assert_guards_intact()


def test_out_of_range_out_cache_loc_is_checked_but_never_stored(impl, device):
    sim = KvSim(device=device)
    launches = canary_impl(impl)
    sim.add_request(1, TOKENS_A)
    batch = sim.extend_batch([(1, 3)], expected_inputs=True)
    batch.out_cache_loc[1] = sim.num_slots + 3
    batch.input_ids[1] = 0
    sim.forward(launches, batch)  # asserts that nothing was written past the records
    assert sim.violations() == [
        Violation(WRITE, Reason.WRITE_TOKEN, 1, sim.num_slots + 3, 1, 0, TOKENS_A[1], 1, 1, 0)
    ]
    assert sim.counters()[COUNTER_ENTRIES + WRITE] == 3


# ----------------------------------------------------------------------------- layouts


@pytest.mark.parametrize("page_size", [4, 16])
def test_paged_pool_with_strided_real_kv_rows(impl, device, page_size):
    sim = KvSim(device=device, page_size=page_size, num_pages=8, real_kv_num_words=4, seed=5)
    launches = canary_impl(impl)
    assert sim.state.real_kv_words.stride(0) != sim.state.real_kv_words.shape[1]
    sim.add_request(1, TOKENS_A + TOKENS_B)
    sim.add_request(2, TOKENS_B)
    sim.forward(launches, sim.extend_batch([(1, 7), (2, 5)]))
    for _ in range(2):
        sim.forward(launches, sim.decode_batch([2, 1]))
    _assert_history_records(sim, 1, with_fingerprints=True)
    _assert_history_records(sim, 2, with_fingerprints=True)
    assert sim.violations() == []
    victim = sim.requests[1].slots[5]
    sim.state.real_kv_words[victim, 2] ^= 1
    sim.forward(launches, sim.decode_batch([1]))
    assert [(v.check, v.reasons, v.slot, v.position) for v in sim.violations()] == [
        (kind, Reason.VERIFY_REAL_KV, victim, 5) for kind in (PRE, POST)
    ]


# ----------------------------------------------------------------------------- ring, counters


def test_ring_overflow_drops_rows_and_keeps_counting(impl, device):
    sim, launches = _prefilled(impl, device, prompts=[(TOKENS_A, 6)], ring_capacity=3)
    sim.state.records[sim.requests[1].slots[:6], FIELD_POSITION] += 100  # 6 bad positions
    batch = sim.decode_batch([1])
    unbounded = clone_state(sim.state, ring_capacity=64)
    reference_module().launch_pre_forward_verify(state=unbounded, batch=batch)
    every_row = [Violation(*row) for row in unbounded.ring[:6].tolist()]
    launches.launch_pre_forward_verify(state=sim.state, batch=batch)
    kept = sim.violations()
    assert sim.counters()[COUNTER_VIOLATIONS] == 6
    assert len(kept) == 3 and len(set(kept)) == 3
    assert set(kept) <= set(every_row)
    launches.launch_post_forward_write_and_verify(state=sim.state, batch=batch)
    assert sim.counters()[COUNTER_VIOLATIONS] == 12
    assert sim.violations() == kept  # a full ring is never overwritten


def test_counters_and_row_steps_follow_the_forwards(impl, device):
    sim, launches = _prefilled(impl, device, prompts=[(TOKENS_A, 3)])
    for _ in range(3):
        sim.forward(launches, sim.decode_batch([1], padded_rows=1))
    sim.state.records[sim.requests[1].slots[0], FIELD_TOKEN] = 5
    sim.forward(launches, sim.decode_batch([1]))
    assert sim.counters() == _counters(
        pre=5,
        post=5,
        verified_pre=3 + 4 + 5 + 6,
        verified_post=3 + 4 + 5 + 6,
        written=3 + 4,
        violations=2,
    )
    assert [(v.check, v.step) for v in sim.violations()] == [(PRE, 4), (POST, 4)]
    assert all(v.expected_token == NO_EXPECTED_TOKEN for v in sim.violations())


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
