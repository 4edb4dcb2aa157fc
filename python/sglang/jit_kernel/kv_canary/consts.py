"""Layouts and constants shared by the canary kernels, their torch references and the runtime.

Per-slot record (``records``: int64 ``[num_slots, RECORD_FIELDS]``, row = KV-pool slot index):

=========  ==================================================================================
TOKEN       token id whose K/V the slot holds (``input_ids[i]`` of the forward that wrote it)
POSITION    its sequence position (``positions[i]``)
CHAIN       chain value: ``CHAIN_ANCHOR`` for position 0, else
            ``CHAIN(prev) + chain_term(TOKEN(prev), POSITION(prev))`` of the predecessor slot
FINGERPRINT fold of the slot's real K bytes (layer 0); 0 when real data is off
=========  ==================================================================================

Chain rule. ``chain_term`` is a 40-bit hash of (token, position), so the chain value of the slot
at position p is ``CHAIN_ANCHOR + sum(chain_term(t_q, q) for q < p)``: a function of the whole
history before p, identical for identical histories (radix-shared prefixes verify), different
for a pointer into another history. No sum can overflow int64 for histories shorter than 2**22
tokens, and the additive form lets a long chunk be chained with a parallel prefix sum.

Violation ring (``ring``: int64 ``[capacity, RING_ROW_FIELDS]``) and ``counters`` (int64
``[NUM_COUNTERS]``) layouts are below. ``counters[COUNTER_VIOLATIONS]`` is the number of
violation rows ever produced; it keeps counting when the ring is full (rows beyond capacity are
dropped), so it is also the ring's write index.
"""

from __future__ import annotations

import enum

# ----------------------------------------------------------------------------- records
RECORD_FIELDS = 4
FIELD_TOKEN = 0
FIELD_POSITION = 1
FIELD_CHAIN = 2
FIELD_FINGERPRINT = 3
RECORD_BYTES = RECORD_FIELDS * 8

PADDING_SLOT = 0  # the allocator's padding slot: never verified
PADDING_REQ_POOL_INDEX = 0  # a padded batch row (CUDA-graph padding): never verified or written

CHAIN_ANCHOR = 0x0C0FFEE5EED5A17  # < 2**61
CHAIN_TERM_BITS = 40
CHAIN_SALT = 0x5EED_C4A1_0000_0001
FINGERPRINT_SALT = 0x7EA1_0D47_A000_0003
NO_EXPECTED_TOKEN = -1  # verify-token: position beyond the known history, skip


class CheckKind(enum.IntEnum):
    """Which kernel produced a violation row (stamped into the row; indexes counters)."""

    PRE_VERIFY = 0  # before the model forward: every prefix slot of every live row
    POST_VERIFY = 1  # after the model forward: the same slots again, real data included
    WRITE = 2  # records of the slots written this forward
    SWEEP = 3  # every slot held by the radix cache


class Reason(enum.IntFlag):
    """Reason bits of a violation row."""

    VERIFY_CHAIN = 1
    VERIFY_POSITION = 2
    VERIFY_REAL_KV = 4
    VERIFY_TOKEN = 8
    WRITE_TOKEN = 16
    WRITE_POSITION = 32


REASON_LABELS: dict[Reason, str] = {
    Reason.VERIFY_CHAIN: "verify_chain_hash",
    Reason.VERIFY_POSITION: "verify_position",
    Reason.VERIFY_REAL_KV: "verify_real_kv_hash",
    Reason.VERIFY_TOKEN: "verify_token",
    Reason.WRITE_TOKEN: "write_token",
    Reason.WRITE_POSITION: "write_position",
}


def reason_labels(bits: int) -> list[str]:
    """Labels of the set bits, in bit order."""
    return [label for reason, label in REASON_LABELS.items() if bits & int(reason)]


# ----------------------------------------------------------------------------- violation ring
RING_ROW_FIELDS = 10
ROW_CHECK = 0  # CheckKind
ROW_REASONS = 1  # Reason bits
ROW_REQ_POOL_INDEX = 2
ROW_SLOT = 3
ROW_POSITION = 4  # the position being checked/written
ROW_STORED_TOKEN = 5  # verify: record's token; write: the forward's input_ids[i]
ROW_EXPECTED_TOKEN = 6  # verify-token / write-input expectation, or NO_EXPECTED_TOKEN
ROW_STORED_CHAIN = 7  # verify: record's chain; write: the forward's positions[i]
ROW_EXPECTED_CHAIN = 8  # verify: recomputed chain; write: expected position
ROW_STEP = 9  # the canary's forward step counter when the row was produced

# ----------------------------------------------------------------------------- counters
COUNTER_VIOLATIONS = 0
COUNTER_STEP = 1  # forward steps seen on the device (advanced once per forward)
COUNTER_KERNEL_RUNS = 2  # + CheckKind: launches that ran
COUNTER_ENTRIES = 2 + len(CheckKind)  # + CheckKind: slots checked or written
NUM_COUNTERS = 2 + 2 * len(CheckKind)
