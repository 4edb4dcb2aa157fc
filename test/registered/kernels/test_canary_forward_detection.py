"""Hand cases for the detection upgrades of the forward launches: request ownership, unmapped
slots, slots overwritten or left unwritten by a forward, stored and multi-source fingerprints,
ring reuse through ``COUNTER_CONSUMED``, and the seq_lens invariant.

Run on the torch reference and the Triton kernels; every expectation is computed independently
of both (scalar hashing, explicit ring rows).
"""

import sys

import pytest
import torch

from _canary_sim import (
    IMPLS,
    SOURCE_WORDS,
    KvSim,
    PaddedRow,
    Violation,
    assert_history_records,
    canary_impl,
    chain_at,
    clone_state,
    expected_counters,
    prefilled,
)
from sglang.jit_kernel.kv_canary.consts import (
    COUNTER_CONSUMED,
    COUNTER_VIOLATIONS,
    FIELD_STAMP,
    FIELD_TOKEN_POSITION,
    ROW_INDEX,
    CheckKind,
    Reason,
    pack_token_position,
)
from sglang.jit_kernel.kv_canary.hashing import (
    due_source_scalar,
    chain_term_scalar,
    fingerprint_columns,
    to_signed_i64,
)
from sglang.test.ci.ci_register import register_cpu_ci, register_cuda_ci

register_cpu_ci(est_time=30, suite="kv-canary-cpu")
register_cuda_ci(est_time=90, suite="kv-canary-gpu")

pytestmark = pytest.mark.parametrize("impl, device", IMPLS)

PRE, POST, WRITE = CheckKind.PRE_VERIFY, CheckKind.POST_VERIFY, CheckKind.WRITE
TOKENS_A = [11, 12, 13, 14, 15, 16, 17, 18, 19]
TOKENS_B = [21, 22, 23, 24, 25, 26, 27, 28, 29]


def _term(token, position):
    return chain_term_scalar(token, position)


def _after(chain, token, position):
    return to_signed_i64(chain + _term(token, position))


# ----------------------------------------------------------------------------- ownership


def test_unknown_owner_is_adopted_and_then_followed(impl, device):
    sim = KvSim(device=device)
    launches = canary_impl(impl)
    sim.add_request(1, TOKENS_A)
    assert sim.owner(1) == 0
    sim.forward(launches, sim.extend_batch([(1, 4)]))
    assert sim.owner(1) == chain_at(TOKENS_A, 4)
    for length in (5, 6):
        sim.forward(launches, sim.decode_batch([1]))
        assert sim.owner(1) == chain_at(TOKENS_A, length)
    sim.forward(launches, sim.extend_batch([(1, 2)]))
    assert sim.owner(1) == chain_at(TOKENS_A, 8)
    assert sim.violations() == []


def test_a_known_owner_is_checked_and_advanced(impl, device):
    sim, launches = prefilled(impl, device, prompts=[(TOKENS_A, 4)])
    sim.state.owner_chains[1] = chain_at(TOKENS_A, 4)  # what the host computes on admission
    sim.forward(launches, sim.extend_batch([(1, 3)]))
    assert sim.owner(1) == chain_at(TOKENS_A, 7)
    assert sim.violations() == []


def test_a_consistent_but_foreign_history_is_caught_by_the_owner_chain(impl, device):
    """Request 2's req_to_token row points at request 1's slots: a self-consistent history,
    so every record check passes; only the owner chain tells whose history it is."""
    sim, launches = prefilled(impl, device, prompts=[(TOKENS_A, 6), (TOKENS_B, 6)])
    slots_a = sim.requests[1].slots
    sim.state.req_to_token[2, :6] = torch.tensor(slots_a, dtype=torch.int32)
    batch = sim.decode_batch([2])
    new_slot = sim.requests[2].slots[6]
    owner = chain_at(TOKENS_B, 6)
    sim.forward(launches, batch)
    seed = chain_at(TOKENS_A, 6)  # what the foreign prefix chains to
    advanced = _after(owner, TOKENS_B[6], 6)
    assert sim.violations() == sorted([
        Violation(PRE, Reason.VERIFY_OWNER, 2, slots_a[5], 5, TOKENS_A[5], -1, seed, owner, 1),
        Violation(POST, Reason.VERIFY_OWNER, 2, new_slot, 6, TOKENS_B[6], -1,
                  _after(seed, TOKENS_B[6], 6), advanced, 1),
    ])
    assert sim.owner(2) == advanced  # advanced from the owner, not from the foreign seed


def test_seq_lens_drift_that_overwrites_the_last_prefix_pointer(impl, device):
    """seq_lens one short: the new token lands at position P - 1 (the scheduler overwrote the
    pointer to the last prefix slot), a history that is consistent slot by slot."""
    sim, launches = prefilled(impl, device, prompts=[(TOKENS_A, 6)])
    slots = sim.requests[1].slots
    batch = sim.decode_batch([1], host_seq_lens=True)  # seq_lens 7, host mirror 7
    new_slot = int(batch.out_cache_loc[0])
    batch.seq_lens[0] = 6
    batch.positions[0] = 5
    sim.state.req_to_token[1, 5] = new_slot
    sim.state.req_to_token[1, 6] = 0
    sim.forward(launches, batch)
    seed = chain_at(TOKENS_A, 5)
    owner = chain_at(TOKENS_A, 6)
    advanced = _after(owner, TOKENS_A[6], 5)
    assert sim.violations() == sorted([
        Violation(PRE, Reason.VERIFY_SEQ_LENS, 1, 0, 6, -1, -1, 6, 7, 1),
        Violation(PRE, Reason.VERIFY_OWNER, 1, slots[4], 4, TOKENS_A[4], -1, seed, owner, 1),
        Violation(POST, Reason.VERIFY_OWNER, 1, new_slot, 5, TOKENS_A[6], -1,
                  _after(seed, TOKENS_A[6], 5), advanced, 1),
    ])


def test_two_rows_given_the_same_slot(impl, device):
    """A double allocation: both rows write one slot; whichever record wins, the other row's
    post launch sees a foreign record at its new position."""
    sim, launches = prefilled(impl, device, prompts=[(TOKENS_A, 6), (TOKENS_B, 6)])
    batch = sim.decode_batch([1, 2])
    shared = int(batch.out_cache_loc[0])
    batch.out_cache_loc[1] = shared
    sim.state.req_to_token[2, 6] = shared
    sim.forward(launches, batch)
    tokens = {1: TOKENS_A, 2: TOKENS_B}
    winner = 1 if sim.record(shared).token == TOKENS_A[6] else 2
    loser = 3 - winner
    won, lost = tokens[winner], tokens[loser]
    assert sim.record(shared)[:3] == (won[6], 6, chain_at(won, 6))
    assert sim.violations() == sorted([
        Violation(POST, Reason.VERIFY_CHAIN, loser, shared, 6, won[6], -1, chain_at(won, 6),
                  chain_at(lost, 6), 1),
        Violation(POST, Reason.VERIFY_OWNER, loser, shared, 6, won[6], -1, chain_at(won, 7),
                  chain_at(lost, 7), 1),
    ])


def test_padded_rows_are_neither_verified_written_nor_owned(impl, device):
    sim, launches = prefilled(impl, device, prompts=[(TOKENS_A, 4)])
    victim = sim.requests[1].slots[0]
    before = sim.record(victim)
    sim.state.owner_chains[0] = 12345  # row 0 is the padding row: never read or written
    batch = sim.decode_batch([1], padded_rows=2, host_seq_lens=True)
    batch.seq_lens[1:] = 3  # stale padding metadata must not matter
    batch.host_seq_lens[1:] = 9
    batch.out_cache_loc[1:] = victim
    batch.input_ids[1:] = 999
    sim.forward(launches, batch)
    assert sim.record(victim) == before
    assert sim.owner(0) == 12345
    assert sim.counters() == expected_counters(
        pre=2, verified_pre=4, verified_post=4 + 5, written=5
    )
    assert sim.violations() == []


# ----------------------------------------------------------------------------- unmapped


def test_slot_zero_in_a_live_prefix_is_reported_unmapped(impl, device):
    sim, launches = prefilled(impl, device, prompts=[(TOKENS_A, 6)])
    sim.state.req_to_token[1, 2] = 0  # position 2 unmapped; position 3's chain is not checked
    sim.forward(launches, sim.decode_batch([1]))
    assert sim.violations() == sorted(
        Violation(kind, Reason.VERIFY_UNMAPPED, 1, 0, 2, -1, -1, 0, 0, 1) for kind in (PRE, POST)
    )
    assert sim.counters() == expected_counters(
        pre=2, verified_pre=5, verified_post=6 + 6, written=7, violations=2
    )


def test_a_live_token_written_to_slot_zero(impl, device):
    sim = KvSim(device=device)
    launches = canary_impl(impl)
    sim.add_request(1, TOKENS_A)
    batch = sim.extend_batch([(1, 4)])
    slots = sim.requests[1].slots
    batch.out_cache_loc[1] = 0
    sim.forward(launches, batch)
    assert sim.record(slots[1]) == (0, 0, 0, 0, 0)  # never written
    assert sim.violations() == sorted([
        Violation(WRITE, Reason.WRITE_UNMAPPED, 1, 0, 1, TOKENS_A[1], -1, 1, 1, 0),
        # req_to_token names a slot this forward did not write: an empty record
        Violation(POST, Reason.VERIFY_UNWRITTEN | Reason.VERIFY_POSITION | Reason.VERIFY_CHAIN,
                  1, slots[1], 1, 0, -1, 0, chain_at(TOKENS_A, 1), 0),
        Violation(POST, Reason.VERIFY_CHAIN, 1, slots[2], 2, TOKENS_A[2], -1,
                  chain_at(TOKENS_A, 2), _term(0, 0), 0),
    ])
    assert sim.owner(1) == chain_at(TOKENS_A, 4)  # the token still counts in the chain
    assert sim.counters()[3 + 4 + WRITE] == 3


# ------------------------------------------------------------------------ overwritten, unwritten


def test_a_prefix_slot_overwritten_in_the_same_forward_is_caught_by_post(impl, device):
    """Row 2's new token is written into row 1's prefix slot (a double allocation). The pre
    launch may verify that slot before or after the write; the post launch always sees it."""
    sim, launches = prefilled(impl, device, prompts=[(TOKENS_A, 6), (TOKENS_B, 6)])
    slots_a = sim.requests[1].slots
    batch = sim.decode_batch([1, 2])
    victim = slots_a[2]
    batch.out_cache_loc[1] = victim
    sim.state.req_to_token[2, 6] = victim
    sim.forward(launches, batch)
    post_rows = [v for v in sim.violations() if v.check == POST]
    assert post_rows == sorted([
        Violation(POST, Reason.VERIFY_OVERWRITTEN | Reason.VERIFY_POSITION | Reason.VERIFY_CHAIN,
                  1, victim, 2, TOKENS_B[6], -1, chain_at(TOKENS_B, 6), chain_at(TOKENS_A, 2), 1),
        Violation(POST, Reason.VERIFY_CHAIN, 1, slots_a[3], 3, TOKENS_A[3], -1,
                  chain_at(TOKENS_A, 3), chain_at(TOKENS_B, 7), 1),
    ])
    assert sim.record(victim)[:3] == (TOKENS_B[6], 6, chain_at(TOKENS_B, 6))


def test_a_new_position_mapped_to_a_slot_this_forward_did_not_write(impl, device):
    sim, launches = prefilled(impl, device, prompts=[(TOKENS_A, 6)])
    batch = sim.decode_batch([1])
    stale = sim.free_pages.pop() * sim.page_size
    # A faithful copy of what position 6 should hold, but stamped by an earlier forward.
    sim.state.records[stale] = torch.tensor(
        [pack_token_position(token=TOKENS_A[6], position=6), chain_at(TOKENS_A, 6), 0, 1]
    )
    sim.state.req_to_token[1, 6] = stale
    sim.forward(launches, batch)
    chain6 = chain_at(TOKENS_A, 6)
    assert sim.violations() == [
        Violation(POST, Reason.VERIFY_UNWRITTEN, 1, stale, 6, TOKENS_A[6], -1, chain6, chain6, 1)
    ]


def test_a_record_stamped_by_this_forward_in_the_prefix_is_overwritten(impl, device):
    sim, launches = prefilled(impl, device, prompts=[(TOKENS_A, 6)], real_data="partial")
    slot = sim.requests[1].slots[1]
    sim.state.records[slot, FIELD_STAMP] = 2  # as if step 1's pre launch had written it
    sim.sources[0][slot] ^= 1  # not checked on a record stamped by this forward
    sim.forward(launches, sim.decode_batch([1]))
    chain1 = chain_at(TOKENS_A, 1)
    assert sim.violations() == [
        Violation(POST, Reason.VERIFY_OVERWRITTEN, 1, slot, 1, TOKENS_A[1], -1, chain1, chain1, 1)
    ]


# ----------------------------------------------------------------------------- fingerprints


@pytest.mark.parametrize("real_data", ["partial", "all"])
def test_fingerprints_are_stored_by_post_and_verified_later(impl, device, real_data):
    sim = KvSim(device=device, real_data=real_data, num_sources=4)
    launches = canary_impl(impl)
    sim.add_request(1, TOKENS_A)
    batch = sim.extend_batch([(1, 5)])
    launches.launch_pre_forward(state=sim.state, batch=batch)
    slots = sim.requests[1].slots
    assert [sim.record(slot)[3:] for slot in slots] == [(0, 1)] * 5  # written, no fingerprint
    sim.model_writes_kv(batch)
    launches.launch_post_forward(state=sim.state, batch=batch)
    assert_history_records(sim, 1, fingerprints=True)
    sim.forward(launches, sim.decode_batch([1]))
    assert sim.violations() == []
    # the source whose lane the partial verify reads at position 3 in step 2 (all: any source)
    source = due_source_scalar(position=3, step=2, stride=1, num_sources=4)
    columns = fingerprint_columns(
        slot=slots[3], words_per_row=SOURCE_WORDS[source], num_rows=sim.num_slots,
        partial=real_data == "partial",
    )
    sim.sources[source][slots[3], columns[-1]] ^= 1 << 9  # a folded word
    sim.forward(launches, sim.decode_batch([1]))
    chain3 = chain_at(TOKENS_A, 3)
    # real data is verified after the forward only
    assert sim.violations() == [
        Violation(POST, Reason.VERIFY_REAL_KV, 1, slots[3], 3, TOKENS_A[3], -1, chain3, chain3, 2)
    ]


@pytest.mark.parametrize("real_data", ["partial", "all"])
@pytest.mark.parametrize("source", [1, 2, 3])
@pytest.mark.parametrize("offset", [1, 2])
def test_a_flipped_word_in_any_source(impl, device, real_data, source, offset):
    """A flipped word of V (first layer) or of the last layer's K/V: always detected with
    ``all``; with ``partial`` exactly when it lies in the slot's rotating 16 bytes of the source
    due at its position in this forward (step 1, position 4: source 1)."""
    sim, launches = prefilled(impl, device, prompts=[(TOKENS_A, 6)], real_data=real_data,
                              num_sources=4)
    slot = sim.requests[1].slots[4]
    words = SOURCE_WORDS[source]
    partial_columns = fingerprint_columns(
        slot=slot, words_per_row=words, num_rows=sim.num_slots, partial=True
    )
    column = (partial_columns[0] + offset) % words
    sim.sources[source][slot, column] ^= 1 << 33
    sim.forward(launches, sim.decode_batch([1]))
    due = due_source_scalar(position=4, step=1, stride=1, num_sources=4)
    detected = real_data == "all" or (column in partial_columns and source == due)
    chain4 = chain_at(TOKENS_A, 4)
    expected = [  # real data is verified after the forward only
        Violation(POST, Reason.VERIFY_REAL_KV, 1, slot, 4, TOKENS_A[4], -1, chain4, chain4, 1)
    ]
    assert sim.violations() == (expected if detected else [])


@pytest.mark.parametrize("stride", [1, 3])
def test_partial_reads_one_source_per_due_position_and_each_in_turn(impl, device, stride):
    """``partial`` compares one lane per due prefix position and forward: a word flipped in
    every source's window of one slot is reported in the first forward where the position is
    due; restoring the due source's word silences that forward's report, and the flip of
    source ``s`` is reported exactly in the forwards where ``s`` is due (one per source within
    ``4 * stride`` forwards)."""
    tokens = list(range(100, 108 + 4 * stride))
    sim, launches = prefilled(impl, device, prompts=[(tokens, 6)], real_data="partial",
                              num_sources=4, real_data_stride=stride)
    position = 2
    slot = sim.requests[1].slots[position]
    for source in range(4):
        columns = fingerprint_columns(slot=slot, words_per_row=SOURCE_WORDS[source],
                                      num_rows=sim.num_slots, partial=True)
        sim.sources[source][slot, columns[0]] ^= 1 << 40
    reported_sources = []
    for step in range(1, 1 + 4 * stride):
        due = due_source_scalar(position=position, step=step, stride=stride, num_sources=4)
        sim.consume()
        sim.forward(launches, sim.decode_batch([1]))
        assert [(r.position, r.reasons, r.step) for r in sim.violations()] == (
            [] if due is None else [(position, Reason.VERIFY_REAL_KV, step)]
        )
        if due is not None:
            reported_sources.append(due)
    assert sorted(reported_sources) == [0, 1, 2, 3]


def test_partial_ignores_a_flip_outside_the_due_lane(impl, device):
    """Only the due source is read: a flip in another source of the slot is not seen in this
    forward, and its word was not loaded (the lanes of the others are not compared)."""
    sim, launches = prefilled(impl, device, prompts=[(TOKENS_A, 6)], real_data="partial",
                              num_sources=4)
    slot = sim.requests[1].slots[1]
    due = due_source_scalar(position=1, step=1, stride=1, num_sources=4)
    other = (due + 2) % 4
    columns = fingerprint_columns(slot=slot, words_per_row=SOURCE_WORDS[other],
                                  num_rows=sim.num_slots, partial=True)
    sim.sources[other][slot, columns[1]] ^= 1 << 3
    sim.forward(launches, sim.decode_batch([1]))
    assert sim.violations() == []


# ----------------------------------------------------------------------------- ring, counters


def _six_bad_positions(sim):
    """Positions 0..4 shifted: rows at positions 0..5 (5's chain follows 4's position)."""
    for slot in sim.requests[1].slots[:5]:
        record = sim.record(slot)
        sim.state.records[slot, FIELD_TOKEN_POSITION] = pack_token_position(
            token=record.token, position=record.position + 100
        )


def test_ring_rows_wrap_modulo_capacity_once_consumed(impl, device):
    sim, launches = prefilled(impl, device, prompts=[(TOKENS_A, 6)], ring_capacity=8)
    sim.state.counters[COUNTER_VIOLATIONS] = 21  # the host has seen 21 rows so far
    sim.state.counters[COUNTER_CONSUMED] = 21
    _six_bad_positions(sim)
    batch = sim.decode_batch([1])
    reference = clone_state(sim.state)
    canary_impl("reference").launch_pre_forward(state=reference, batch=batch)
    launches.launch_pre_forward(state=sim.state, batch=batch)
    assert sim.counters()[COUNTER_VIOLATIONS] == 27
    rows = sim.violations()
    assert len(rows) == 6 and {v.position for v in rows} == set(range(6))
    # indices 21..26 live in ring rows 5, 6, 7, 0, 1, 2; rows 3 and 4 are untouched
    assert sorted(map(tuple, sim.state.ring.tolist())) == sorted(
        map(tuple, reference.ring.tolist())
    )
    assert sim.state.ring[3:5].abs().sum() == 0


def test_ring_drops_rows_past_the_unconsumed_capacity_and_keeps_counting(impl, device):
    sim, launches = prefilled(impl, device, prompts=[(TOKENS_A, 6)], ring_capacity=3)
    _six_bad_positions(sim)
    batch = sim.decode_batch([1])
    unbounded = clone_state(sim.state, ring_capacity=64)
    canary_impl("reference").launch_pre_forward(state=unbounded, batch=batch)
    every_row = [Violation(*row[:ROW_INDEX]) for row in unbounded.ring[:6].tolist()]
    launches.launch_pre_forward(state=sim.state, batch=batch)
    kept = sim.violations()
    assert sim.counters()[COUNTER_VIOLATIONS] == 6
    assert len(kept) == 3 and len(set(kept)) == 3 and set(kept) <= set(every_row)
    sim.model_writes_kv(batch)
    launches.launch_post_forward(state=sim.state, batch=batch)
    assert sim.counters()[COUNTER_VIOLATIONS] == 12
    assert sim.violations() == kept  # unconsumed rows are never overwritten
    sim.consume()
    sim.forward(launches, sim.decode_batch([1]))  # six more rows each launch
    assert sim.counters()[COUNTER_VIOLATIONS] == 24
    assert len(sim.violations()) == 3
    assert {v.step for v in sim.violations()} == {2}


def test_seq_lens_invariant(impl, device):
    sim, launches = prefilled(impl, device, prompts=[(TOKENS_A, 5), (TOKENS_B, 3)])
    batch = sim.decode_batch([1, 2], padded_rows=1, host_seq_lens=True)
    assert bool((batch.host_seq_lens == batch.seq_lens).all())
    batch.host_seq_lens[1] += 1  # the device seq_lens lags the scheduler's by one
    batch.host_seq_lens[2] = 77  # a padded row: ignored
    sim.forward(launches, batch)
    assert sim.violations() == [
        Violation(PRE, Reason.VERIFY_SEQ_LENS, 2, 0, 4, -1, -1, 4, 5, 1)
    ]


def test_many_row_blocks_with_scattered_live_rows(impl, device):
    """A DECODE batch of 4096 rows, mostly padding: live rows in several row blocks."""
    sim = KvSim(device=device, num_pages=64, req_rows=6, max_context_len=16)
    launches = canary_impl(impl)
    rows = []
    for rp in range(1, 6):
        sim.add_request(rp, [100 * rp + q for q in range(10)])
    sim.forward(launches, sim.extend_batch([(rp, 3) for rp in range(1, 6)]))
    live_at = {0: 1, 130: 2, 257: 3, 2047: 4, 4095: 5}
    for b in range(4096):
        rows.append(live_at.get(b, PaddedRow(prefix_len=2, stale_slot=1)))
    sim.forward(launches, sim.decode_batch(rows, host_seq_lens=True))
    for rp in range(1, 6):
        assert_history_records(sim, rp)
    assert sim.violations() == []
    assert sim.counters() == expected_counters(
        pre=2, verified_pre=15, verified_post=15 + 20, written=15 + 5
    )


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
