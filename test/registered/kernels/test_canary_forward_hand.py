"""Hand cases for the forward launches: clean pipelines and the record / write-input checks.

Run on the torch reference and the Triton kernels (Triton's interpreter on CPU, compiled on
CUDA in the ``gpu`` variants). Every expectation is computed independently of both
implementations (scalar hashing, explicit ring rows), so each case pins the contract itself.
The detection upgrades (ownership, unmapped, overwritten, unwritten, fingerprints, ring reuse,
seq_lens) are in ``test_canary_forward_detection.py``.
"""

import dataclasses
import sys

import pytest

from _canary_sim import (
    IMPLS,
    KvSim,
    Violation,
    assert_history_records,
    canary_impl,
    chain_at,
    expected_counters,
    prefilled,
)
from sglang.jit_kernel.kv_canary.consts import (
    CHAIN_ANCHOR,
    COUNTER_ENTRIES,
    COUNTER_STEP,
    FIELD_CHAIN,
    FIELD_TOKEN_POSITION,
    NO_EXPECTED_TOKEN,
    CheckKind,
    Reason,
    pack_token_position,
)
from sglang.jit_kernel.kv_canary.hashing import (
    chain_term_scalar,
    due_source_scalar,
    to_signed_i64,
)
from sglang.test.ci.ci_register import register_cpu_ci, register_cuda_ci

register_cpu_ci(est_time=30, suite="kv-canary-cpu")
register_cuda_ci(est_time=90, suite="kv-canary-gpu")

pytestmark = pytest.mark.parametrize("impl, device", IMPLS)

PRE, POST, WRITE = CheckKind.PRE_VERIFY, CheckKind.POST_VERIFY, CheckKind.WRITE
TOKENS_A = [11, 12, 13, 14, 15, 16, 17, 18, 19]
TOKENS_B = [21, 22, 23, 24, 25, 26, 27, 28, 29]


def _verify_row(kind, reasons, slot, position, token, chain, expected_chain, expected_token=-1,
                step=1, rp=1):
    """A verify violation row (default: request 1, forward step 1)."""
    return Violation(
        kind, reasons, rp, slot, position, token, expected_token, chain, expected_chain, step
    )


def _chain(tokens, position):
    return chain_at(tokens, position)


def _set_position(sim, slot, position):
    record = sim.record(slot)
    sim.state.records[slot, FIELD_TOKEN_POSITION] = pack_token_position(
        token=record.token, position=position
    )


def _set_token(sim, slot, token):
    record = sim.record(slot)
    sim.state.records[slot, FIELD_TOKEN_POSITION] = pack_token_position(
        token=token, position=record.position
    )


# ----------------------------------------------------------------------------- clean paths


def test_prefill_writes_oracle_records(impl, device):
    sim, _ = prefilled(impl, device, prompts=[(TOKENS_A, 5), (TOKENS_B, 3)], real_data="partial")
    assert_history_records(sim, 1, fingerprints=True)
    assert_history_records(sim, 2, fingerprints=True)
    assert {sim.record(slot).stamp for rp in (1, 2) for slot in sim.requests[rp].slots} == {1}
    assert sim.counters() == expected_counters(pre=1, verified_post=8, written=8)
    assert sim.violations() == []


def test_decode_steps_verify_clean_with_padding_rows(impl, device):
    sim, launches = prefilled(impl, device, prompts=[(TOKENS_A, 4), (TOKENS_B, 2)])
    verified_pre = 0
    verified_post = 6
    for _ in range(3):
        prefix = sum(len(sim.requests[rp].slots) for rp in (1, 2))
        sim.forward(launches, sim.decode_batch([1, 2], padded_rows=2))
        verified_pre += prefix
        verified_post += prefix + 2
    assert_history_records(sim, 1)
    assert_history_records(sim, 2)
    assert sim.counters() == expected_counters(
        pre=4, verified_pre=verified_pre, verified_post=verified_post, written=6 + 6
    )
    assert sim.violations() == []


def test_chunked_prefill_then_decode_pipeline_is_clean(impl, device):
    sim = KvSim(device=device, page_size=4, real_data="partial", num_sources=4, seed=3)
    launches = canary_impl(impl)
    sim.add_request(1, TOKENS_A)
    sim.add_request(2, TOKENS_B)
    checks = dict(token_history=True, expected_inputs=True, host_seq_lens=True)
    sim.forward(launches, sim.extend_batch([(1, 5)], **checks))  # first chunk
    sim.forward(launches, sim.extend_batch([(1, 2), (2, 3)], **checks))  # chunk + new prompt
    for _ in range(2):
        sim.forward(launches, sim.decode_batch([1, 2], padded_rows=1, **checks))
    sim.forward(launches, sim.extend_batch([(2, 1), (1, 0)], padded_rows=1, **checks))  # mixed
    assert_history_records(sim, 1, fingerprints=True)
    assert_history_records(sim, 2, fingerprints=True)
    verified_pre = 0 + 5 + (7 + 3) + (8 + 4) + (9 + 5)
    verified_post = 5 + (7 + 3) + (8 + 4) + (9 + 5) + (9 + 6)
    assert sim.counters() == expected_counters(
        pre=5, verified_pre=verified_pre, verified_post=verified_post,
        written=5 + 5 + 2 + 2 + 1,
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
    assert_history_records(sim, 1)
    assert_history_records(sim, 2)
    assert sim.violations() == []
    assert sim.counters()[COUNTER_ENTRIES + PRE] == 4 + 6 + 5


def test_empty_batches_only_count_runs(impl, device):
    sim = KvSim(device=device)
    launches = canary_impl(impl)
    sim.forward(launches, sim.decode_batch([]))
    sim.forward(launches, sim.extend_batch([]))
    sim.forward(launches, sim.extend_batch([], padded_rows=3))
    assert sim.counters() == expected_counters(pre=3)
    assert int(sim.state.records.abs().sum()) == 0
    assert int(sim.state.owner_chains.abs().sum()) == 0


def test_rows_with_empty_prefix_write_from_the_anchor(impl, device):
    sim = KvSim(device=device)
    launches = canary_impl(impl)
    sim.add_request(1, TOKENS_A)
    sim.add_request(2, TOKENS_B)
    sim.forward(launches, sim.decode_batch([1]))  # decode row with prefix 0
    sim.forward(launches, sim.extend_batch([(2, 0), (1, 1)]))  # extend row with no tokens
    assert sim.record(sim.requests[1].slots[0]) == (TOKENS_A[0], 0, CHAIN_ANCHOR, 0, 1)
    assert_history_records(sim, 1)
    assert sim.owner(2) == 0  # a row without tokens neither checks nor adopts an owner
    assert sim.counters() == expected_counters(
        pre=2, verified_pre=1, verified_post=1 + 2, written=2
    )
    assert sim.violations() == []


# ----------------------------------------------------------------------------- record checks


def _decode_once(sim, launches, **checks):
    batch = sim.decode_batch([1], **checks)
    sim.forward(launches, batch)
    return batch


def test_verify_chain(impl, device):
    sim, launches = prefilled(impl, device, prompts=[(TOKENS_A, 6)])
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
    assert sim.counters()[0] == 4


def test_verify_position(impl, device):
    sim, launches = prefilled(impl, device, prompts=[(TOKENS_A, 6)])
    slots = sim.requests[1].slots
    _set_position(sim, slots[2], 7)
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


def test_only_the_low_32_bits_of_a_token_count(impl, device):
    sim = KvSim(device=device)
    launches = canary_impl(impl)
    sim.add_request(1, TOKENS_A)
    batch = sim.extend_batch([(1, 4)], expected_inputs=True)
    batch.input_ids[2] += 1 << 32  # the same token id as far as the canary is concerned
    batch.expected_input_ids[3] -= 1 << 32
    sim.forward(launches, batch)
    sim.forward(launches, sim.decode_batch([1]))
    assert sim.violations() == []
    assert_history_records(sim, 1)


def test_verify_token_against_the_token_history(impl, device):
    sim, launches = prefilled(impl, device, prompts=[(TOKENS_A, 6)])
    slots = sim.requests[1].slots
    _set_token(sim, slots[2], 77)  # the slot claims another token
    batch = sim.decode_batch([1], token_history=True)
    batch.token_history_lens[1] = 5  # positions >= 5 are not known: not token-checked
    sim.forward(launches, batch)
    chain2, chain3 = _chain(TOKENS_A, 2), _chain(TOKENS_A, 3)
    wrong_chain3 = to_signed_i64(chain2 + chain_term_scalar(77, 2))
    expected = []
    for kind in (PRE, POST):
        expected += [
            _verify_row(kind, Reason.VERIFY_TOKEN, slots[2], 2, 77, chain2, chain2, TOKENS_A[2]),
            _verify_row(
                kind, Reason.VERIFY_CHAIN, slots[3], 3, TOKENS_A[3], chain3, wrong_chain3,
                TOKENS_A[3],
            ),
        ]
    assert sim.violations() == sorted(expected)


def test_post_verifies_the_new_positions_tokens_too(impl, device):
    sim, launches = prefilled(impl, device, prompts=[(TOKENS_A, 6)])
    batch = sim.decode_batch([1], token_history=True)
    batch.token_history[1, 6] = 99  # the history disagrees with the token the forward wrote
    sim.forward(launches, batch)
    slot = sim.requests[1].slots[6]
    assert sim.violations() == [
        _verify_row(POST, Reason.VERIFY_TOKEN, slot, 6, TOKENS_A[6], _chain(TOKENS_A, 6),
                    _chain(TOKENS_A, 6), 99)
    ]


def test_verify_token_skips_positions_past_the_known_length(impl, device):
    sim, launches = prefilled(impl, device, prompts=[(TOKENS_A, 6)])
    batch = sim.decode_batch([1], token_history=True)
    batch.token_history[1, 3:] = 0  # a wrong history, but only known up to position 3
    batch.token_history_lens[1] = 3  # indexed by pool row
    sim.forward(launches, batch)
    assert sim.violations() == []


def test_write_token(impl, device):
    sim, launches = prefilled(impl, device, prompts=[(TOKENS_A, 6)])
    batch = sim.decode_batch([1], expected_inputs=True)
    batch.expected_input_ids[0] = 5
    sim.forward(launches, batch)
    slot = sim.requests[1].slots[6]
    assert sim.violations() == [
        Violation(WRITE, Reason.WRITE_TOKEN, 1, slot, 6, TOKENS_A[6], 5, 6, 6, 1)
    ]
    assert sim.record(slot)[:3] == (TOKENS_A[6], 6, _chain(TOKENS_A, 6))  # written anyway


def test_write_position_against_the_prefix(impl, device):
    sim, launches = prefilled(impl, device, prompts=[(TOKENS_A, 6)])
    batch = sim.decode_batch([1], expected_inputs=True)
    batch.positions[0] = 8
    sim.forward(launches, batch)
    slot = sim.requests[1].slots[6]
    chain6 = _chain(TOKENS_A, 6)
    assert sim.violations() == sorted([
        Violation(WRITE, Reason.WRITE_POSITION, 1, slot, 6, TOKENS_A[6], TOKENS_A[6], 8, 6, 1),
        # the record says what the slot holds; the post launch sees it at position 6
        _verify_row(POST, Reason.VERIFY_POSITION, slot, 6, TOKENS_A[6], chain6, chain6),
    ])
    assert sim.record(slot)[:2] == (TOKENS_A[6], 8)


def test_write_position_against_the_expectation(impl, device):
    sim, launches = prefilled(impl, device, prompts=[(TOKENS_A, 6)])
    batch = sim.decode_batch([1], expected_inputs=True)
    batch.expected_positions[0] = 9
    sim.forward(launches, batch)
    slot = sim.requests[1].slots[6]
    assert sim.violations() == [
        Violation(WRITE, Reason.WRITE_POSITION, 1, slot, 6, TOKENS_A[6], TOKENS_A[6], 6, 9, 1)
    ]


def test_write_position_against_the_prefix_when_the_expectation_agrees(impl, device):
    sim, launches = prefilled(impl, device, prompts=[(TOKENS_A, 6)])
    batch = sim.decode_batch([1], expected_inputs=True)
    batch.positions[0] = 8
    batch.expected_positions[0] = 8  # an expectation derived from the same wrong position
    sim.forward(launches, batch)
    slot = sim.requests[1].slots[6]
    write_rows = [v for v in sim.violations() if v.check == WRITE]
    assert write_rows == [
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
    written = [(t, p) for t, p in zip(TOKENS_A[:5], range(5))]
    written[3], written[4] = (0, 3), (TOKENS_A[4], 0)
    chain4 = CHAIN_ANCHOR + sum(chain_term_scalar(t, p) for t, p in written[:4])
    assert sim.violations() == sorted(
        [
            Violation(WRITE, Reason.WRITE_TOKEN, 1, slots[3], 3, 0, TOKENS_A[3], 3, 3, 0),
            Violation(
                WRITE, Reason.WRITE_POSITION, 1, slots[4], 4, TOKENS_A[4], TOKENS_A[4], 0, 4, 0
            ),
            _verify_row(POST, Reason.VERIFY_POSITION, slots[4], 4, TOKENS_A[4], chain4, chain4,
                        step=0),
        ]
    )


def test_an_extend_layouts_write_checks_come_from_the_post_launch(impl, device):
    """EXTEND: the pre launch writes the records without reading the expectations (the runner
    sends an eager prefill's while the model runs); the post launch makes the WRITE rows.
    DECODE: the pre launch makes them."""
    sim = KvSim(device=device)
    launches = canary_impl(impl)
    sim.add_request(1, TOKENS_A)
    batch = sim.extend_batch([(1, 5)], expected_inputs=True)
    batch.input_ids[3] = 0
    expected = batch.expected_input_ids.clone()
    batch.expected_input_ids.fill_(7)  # what the pre launch would see: every token wrong
    launches.launch_pre_forward(state=sim.state, batch=batch)
    assert sim.violations() == []
    batch.expected_input_ids.copy_(expected)
    sim.model_writes_kv(batch)
    launches.launch_post_forward(state=sim.state, batch=batch)
    slot = sim.requests[1].slots[3]
    assert sim.violations() == [
        Violation(WRITE, Reason.WRITE_TOKEN, 1, slot, 3, 0, TOKENS_A[3], 3, 3, 0)
    ]

    decode = sim.decode_batch([1], expected_inputs=True)
    decode.expected_input_ids[0] = 5
    launches.launch_pre_forward(state=sim.state, batch=decode)
    assert [v.check for v in sim.violations()].count(WRITE) == 2


# ----------------------------------------------------------------------------- token history


def _unpredicted(batch):
    """The batch with no given token expectation (as the oracle leaves prompt tokens)."""
    batch.expected_input_ids.fill_(NO_EXPECTED_TOKEN)
    return batch


def test_write_token_falls_back_to_the_history_where_nothing_is_predicted(impl, device):
    sim = KvSim(device=device)
    launches = canary_impl(impl)
    sim.add_request(1, TOKENS_A)
    batch = _unpredicted(sim.extend_batch([(1, 5)], token_history=True, expected_inputs=True))
    batch = dataclasses.replace(batch, verify_token=False)
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
    batch = _unpredicted(sim.extend_batch([(1, 5)], token_history=True, expected_inputs=True))
    batch = dataclasses.replace(batch, verify_token=False)
    batch.token_history_lens[1] = 3  # known up to position 3 (pool row 1)
    batch.input_ids[3] = 0
    batch.input_ids[2] = 0
    sim.forward(launches, batch)
    slot = sim.requests[1].slots[2]
    assert sim.violations() == [
        Violation(WRITE, Reason.WRITE_TOKEN, 1, slot, 2, 0, TOKENS_A[2], 2, 2, 0)
    ]


def test_a_given_expectation_wins_over_the_history(impl, device):
    sim, launches = prefilled(impl, device, prompts=[(TOKENS_A, 6)])
    batch = sim.decode_batch([1], token_history=True, expected_inputs=True)
    batch.expected_input_ids[0] = 5  # the oracle's token differs from the history's
    sim.forward(launches, batch)
    slot = sim.requests[1].slots[6]
    assert sim.violations() == [
        Violation(WRITE, Reason.WRITE_TOKEN, 1, slot, 6, TOKENS_A[6], 5, 6, 6, 1)
    ]


def test_no_expected_position_is_no_expectation(impl, device):
    sim, launches = prefilled(impl, device, prompts=[(TOKENS_A, 6)])
    batch = sim.decode_batch([1], expected_inputs=True)
    batch.expected_positions[0] = NO_EXPECTED_TOKEN
    sim.forward(launches, batch)
    assert sim.violations() == []


def test_the_history_alone_does_not_verify_tokens_when_verify_token_is_off(impl, device):
    sim, launches = prefilled(impl, device, prompts=[(TOKENS_A, 6)])
    batch = sim.decode_batch([1], token_history=True, expected_inputs=True)
    batch = dataclasses.replace(batch, verify_token=False)
    batch.token_history[1, 2] = 77  # the slot's token differs from the history
    sim.forward(launches, batch)
    assert sim.violations() == []
    batch = sim.decode_batch([1], token_history=True, expected_inputs=True)
    batch.token_history[1, 2] = 77
    sim.forward(launches, batch)
    slot = sim.requests[1].slots[2]
    chain2 = _chain(TOKENS_A, 2)
    assert sim.violations() == sorted(
        _verify_row(kind, Reason.VERIFY_TOKEN, slot, 2, TOKENS_A[2], chain2, chain2, 77, step=2)
        for kind in (PRE, POST)
    )


def test_history_lengths_are_read_by_pool_row(impl, device):
    """Rows 1 and 3 in the batch as batch rows 0 and 1: row 3's length governs row 3."""
    sim, launches = prefilled(impl, device, prompts=[(TOKENS_A, 6), (TOKENS_B, 3),
                                                     (TOKENS_B, 6)])
    batch = sim.decode_batch([1, 3], token_history=True)
    batch.token_history[3, 4] = 99
    batch.token_history_lens[3] = 4  # position 4 of row 3 is not known yet
    batch.token_history_lens[2] = 0  # a row outside the batch: irrelevant
    sim.forward(launches, batch)
    assert sim.violations() == []
    batch = sim.decode_batch([1, 3], token_history=True)
    batch.token_history[3, 4] = 99
    sim.forward(launches, batch)
    assert {(v.req_pool_index, v.position, v.reasons) for v in sim.violations()} == {
        (3, 4, Reason.VERIFY_TOKEN)
    }


# ----------------------------------------------------------------------------- mapping faults


def test_pointer_into_another_history_is_detected_by_the_chain(impl, device):
    sim, launches = prefilled(impl, device, prompts=[(TOKENS_A, 6), (TOKENS_B, 6)])
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
    sim, launches = prefilled(impl, device, prompts=[(TOKENS_A, 6)], real_data="partial")
    bad_slot = sim.num_slots + 7
    sim.state.req_to_token[1, 2] = bad_slot
    launches.launch_pre_forward(state=sim.state, batch=sim.decode_batch([1]))
    rows = sorted(sim.violations(), key=lambda violation: violation.position)
    # (real data is verified by the post launch only)
    all_record_reasons = Reason.VERIFY_CHAIN | Reason.VERIFY_POSITION
    chain2, chain3 = _chain(TOKENS_A, 2), _chain(TOKENS_A, 3)
    assert rows == [
        Violation(PRE, all_record_reasons, 1, bad_slot, 2, 0, -1, 0, chain2, 1),
        Violation(
            PRE, Reason.VERIFY_CHAIN, 1, sim.requests[1].slots[3], 3, TOKENS_A[3], -1, chain3,
            chain_term_scalar(0, 0), 1,
        ),
    ]
    sim.assert_guards_intact()


def test_out_of_range_out_cache_loc_is_checked_but_never_stored(impl, device):
    sim = KvSim(device=device)
    launches = canary_impl(impl)
    sim.add_request(1, TOKENS_A)
    batch = sim.extend_batch([(1, 3)], expected_inputs=True)
    batch.out_cache_loc[1] = sim.num_slots + 3
    batch.input_ids[1] = 0
    sim.forward(launches, batch)  # asserts that nothing was written past the records
    write_rows = [v for v in sim.violations() if v.check == WRITE]
    assert write_rows == [
        Violation(WRITE, Reason.WRITE_TOKEN, 1, sim.num_slots + 3, 1, 0, TOKENS_A[1], 1, 1, 0)
    ]
    # The slot req_to_token names for position 1 was never written by this forward.
    post_rows = {(v.position, v.reasons & Reason.VERIFY_UNWRITTEN) for v in sim.violations()
                 if v.check == POST}
    assert (1, Reason.VERIFY_UNWRITTEN) in post_rows
    assert sim.counters()[COUNTER_ENTRIES + WRITE] == 3


# ----------------------------------------------------------------------------- layouts, steps


@pytest.mark.parametrize("page_size", [4, 16])
def test_paged_pool_with_strided_real_kv_rows(impl, device, page_size):
    sim = KvSim(device=device, page_size=page_size, num_pages=8, real_data="all", seed=5)
    launches = canary_impl(impl)
    assert sim.sources[0].stride(0) != sim.sources[0].shape[1]
    sim.add_request(1, TOKENS_A + TOKENS_B)
    sim.add_request(2, TOKENS_B)
    sim.forward(launches, sim.extend_batch([(1, 7), (2, 5)]))
    for _ in range(2):
        sim.forward(launches, sim.decode_batch([2, 1]))
    assert_history_records(sim, 1, fingerprints=True)
    assert_history_records(sim, 2, fingerprints=True)
    assert sim.violations() == []
    victim = sim.requests[1].slots[5]
    sim.sources[0][victim, 2] ^= 1
    sim.forward(launches, sim.decode_batch([1]))
    assert [(v.check, v.reasons, v.slot, v.position) for v in sim.violations()] == [
        (POST, Reason.VERIFY_REAL_KV, victim, 5)  # real data: after the forward only
    ]


def test_a_real_data_stride_checks_each_prefix_slot_once_every_stride_forwards(impl, device):
    stride = 3
    sim = KvSim(device=device, real_data="partial", real_data_stride=stride, seed=9)
    launches = canary_impl(impl)
    sim.add_request(1, TOKENS_A + TOKENS_B)
    sim.forward(launches, sim.extend_batch([(1, 7)]))
    assert_history_records(sim, 1, fingerprints=True)  # new slots: always fingerprinted
    victim_position = 4
    victim = sim.requests[1].slots[victim_position]
    sim.sources[1][victim, 0] ^= 1 << 7
    reported_at = []
    # partial reads one of the 2 sources per due forward: source 1 is due once in 2 * stride
    for _ in range(2 * stride):
        step = sim.counters()[COUNTER_STEP]  # the step of the next forward
        sim.forward(launches, sim.decode_batch([1]))
        rows = [(v.check, v.reasons, v.slot, v.position) for v in sim.violations()]
        sim.consume()
        if rows:
            assert rows == [(POST, Reason.VERIFY_REAL_KV, victim, victim_position)]
            reported_at.append(step)
    # exactly once in `2 * stride` forwards: in the one whose step is due for that position
    # with source 1
    assert [due_source_scalar(position=victim_position, step=step, stride=stride, num_sources=2)
            for step in reported_at] == [1]


def test_counters_and_row_steps_follow_the_forwards(impl, device):
    sim, launches = prefilled(impl, device, prompts=[(TOKENS_A, 3)])
    for _ in range(3):
        sim.forward(launches, sim.decode_batch([1], padded_rows=1))
    _set_token(sim, sim.requests[1].slots[0], 5)
    sim.forward(launches, sim.decode_batch([1]))
    assert sim.counters() == expected_counters(
        pre=5,
        verified_pre=3 + 4 + 5 + 6,
        verified_post=3 + 4 + 5 + 6 + 7,
        written=3 + 4,
        violations=2,
    )
    # Position 0's token feeds position 1's chain: position 1 fails, before and after.
    assert [(v.check, v.position, v.step) for v in sim.violations()] == [(PRE, 1, 4), (POST, 1, 4)]


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
