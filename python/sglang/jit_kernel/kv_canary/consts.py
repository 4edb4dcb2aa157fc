"""Layouts and constants shared by the canary kernels, their torch references and the runtime.

Records (``records``: int64 ``[num_slots, RECORD_FIELDS]``, row = KV-pool slot index)
=====================  ===========================================================================
FIELD_TOKEN_POSITION   ``(position << 32) | (token & 0xFFFFFFFF)`` of the token whose K/V the slot
                       holds (see :func:`pack_token_position`)
FIELD_CHAIN            chain value: ``CHAIN_ANCHOR`` at position 0, else
                       ``chain(prev) + chain_term(token(prev), position(prev))`` of the record at
                       the previous position of the same request
FIELD_FINGERPRINT      fingerprint of the slot's real K/V bytes; 0 when real data is off
FIELD_STAMP            1 + the step index of the forward whose pre launch wrote the record
                       (0: never written)
=====================  ===========================================================================

One record is 32 bytes: one memory sector, so a verifier reads a slot's record in one sector.
Token ids and positions are below ``2**31``; wherever a token enters a hash or a comparison its
low 32 bits are used, as a non-negative int64 (``token & TOKEN_MASK``).

Chain rule. ``chain_term`` is a 40-bit hash of (token, position), so the chain value at position
``p`` is ``CHAIN_ANCHOR + sum(chain_term(t_q, q) for q < p)``: a function of the whole history
before ``p``, identical for identical histories (radix-shared prefixes verify), different for a
pointer into another history. No sum overflows int64 for histories shorter than ``2**22`` tokens,
and the additive form lets a long chunk be chained with a parallel prefix sum.

Violation ring (``ring``: int64 ``[capacity, RING_ROW_FIELDS]``) and counters (int64
``[NUM_COUNTERS]``). A launch that finds violations reserves violation indices ``n`` by an atomic
add on ``counters[COUNTER_VIOLATIONS]`` (ever-growing: the number of violation rows ever
produced). Row ``n`` is stored at ``ring[n % capacity]`` if ``n - counters[COUNTER_CONSUMED] <
capacity``, else it is dropped (it is still counted); a stored row carries ``n`` in ``ROW_INDEX``, so
the host can tell a stored row from a slot still holding an older one. ``COUNTER_CONSUMED`` is
written only by the host: how many violation indices it has handled, which frees their ring rows
for reuse.

Counter publications. After each forward the publish launch (:mod:`.publish_counters`) adds 1 to
``counters[COUNTER_PUBLISHES]`` and writes the checksum of words ``[0, COUNTER_CHECKSUM)``
(:func:`.hashing.counters_checksum`) into ``counters[COUNTER_CHECKSUM]``; the runtime then copies the counters into pinned host memory,
which the host reads without an event or a sync. A copy the host reads while it lands mixes two
publications' words, and its checksum then differs (but with probability ~2**-54): such a read is
ignored, a later one sees the whole copy.
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    import torch

IntOrTensor = TypeVar("IntOrTensor", int, "torch.Tensor")

# ----------------------------------------------------------------------------- records
RECORD_FIELDS = 4
FIELD_TOKEN_POSITION = 0
FIELD_CHAIN = 1
FIELD_FINGERPRINT = 2
FIELD_STAMP = 3
RECORD_BYTES = RECORD_FIELDS * 8

TOKEN_MASK = 0xFFFFFFFF  # the low 32 bits of a token id: what hashes and comparisons use
POSITION_SHIFT = 32  # FIELD_TOKEN_POSITION keeps the position in the high 32 bits

PADDING_SLOT = 0  # the allocator's padding slot: never verified, never written
PADDING_REQ_POOL_INDEX = 0  # a padded batch row (CUDA-graph padding): never verified or written
# A batch row is *live* when it carries a request row (``req_pool_idx != 0``), lies inside the
# batch's live rows (``b < live_rows``: the rows the scheduler sent; a replayed CUDA graph pads
# past them) and does not repeat the ``req_pool_idx`` of an earlier live row. Only live rows are
# verified or change any canary state; any other row with ``req_pool_idx != 0`` is reported once
# per forward (``PADDED_ROW``) and changes nothing.

CHAIN_ANCHOR = 0x0C0FFEE5EED5A17  # < 2**61
CHAIN_TERM_BITS = 40
CHAIN_SALT = 0x5EED_C4A1_0000_0001
FINGERPRINT_SALT = 0x7EA1_0D47_A000_0003
LANDING_SALT = 0x3A9D_51C7_0000_0005  # < 2**63: the landing poison (see hashing.py)
LANDING_STEP_SHIFT = 40  # the step enters the landing poison above the slot's bits
NO_EXPECTED_TOKEN = -1  # no expectation (token or position): not checked
MAX_REAL_DATA_SOURCES = 4


def pack_token_position(*, token: IntOrTensor, position: IntOrTensor) -> IntOrTensor:
    """``(position << 32) | (token & TOKEN_MASK)``: the ``FIELD_TOKEN_POSITION`` value.

    Works elementwise on Python ints and on int64 torch tensors alike (int64 wrap-around for a
    position outside ``[-2**31, 2**31)``, which only a corrupt forward produces).
    """
    return (position << POSITION_SHIFT) | (token & TOKEN_MASK)


def unpack_token(packed: IntOrTensor) -> IntOrTensor:
    """The token (low 32 bits, non-negative) of a ``FIELD_TOKEN_POSITION`` value."""
    return packed & TOKEN_MASK


def unpack_position(packed: IntOrTensor) -> IntOrTensor:
    """The position (high 32 bits, sign-extended) of a ``FIELD_TOKEN_POSITION`` value."""
    return packed >> POSITION_SHIFT


class CheckKind(enum.IntEnum):
    """Which check produced a violation row (stamped into the row; indexes counters)."""

    PRE_VERIFY = 0  # before the model forward: prefix slots, seq_lens, request ownership
    POST_VERIFY = 1  # after the model forward: prefix and new slots, request ownership
    WRITE = 2  # the records written by this forward (in the pre launch)
    SWEEP = 3  # slots listed by the host (e.g. every slot the radix cache holds)


class Reason(enum.IntFlag):
    """Reason bits of a violation row."""

    VERIFY_CHAIN = 1
    VERIFY_POSITION = 2
    VERIFY_REAL_KV = 4
    VERIFY_TOKEN = 8
    WRITE_TOKEN = 16
    WRITE_POSITION = 32
    VERIFY_OWNER = 64
    VERIFY_UNMAPPED = 128
    VERIFY_OVERWRITTEN = 256
    VERIFY_UNWRITTEN = 512
    WRITE_UNMAPPED = 1024
    VERIFY_SEQ_LENS = 2048
    PADDED_ROW = 4096
    VERIFY_NOT_LANDED = 8192
    VERIFY_WINDOW_UNMAPPED = 16384
    VERIFY_WINDOW_OWNER = 32768


REASON_LABELS: dict[Reason, str] = {
    Reason.VERIFY_CHAIN: "verify_chain_hash",
    Reason.VERIFY_POSITION: "verify_position",
    Reason.VERIFY_REAL_KV: "verify_real_kv_hash",
    Reason.VERIFY_TOKEN: "verify_token",
    Reason.WRITE_TOKEN: "write_token",
    Reason.WRITE_POSITION: "write_position",
    Reason.VERIFY_OWNER: "verify_owner",
    Reason.VERIFY_UNMAPPED: "verify_unmapped",
    Reason.VERIFY_OVERWRITTEN: "verify_overwritten",
    Reason.VERIFY_UNWRITTEN: "verify_unwritten",
    Reason.WRITE_UNMAPPED: "write_unmapped",
    Reason.VERIFY_SEQ_LENS: "verify_seq_lens",
    Reason.PADDED_ROW: "padded_row",
    Reason.VERIFY_NOT_LANDED: "verify_not_landed",
    Reason.VERIFY_WINDOW_UNMAPPED: "verify_window_unmapped",
    Reason.VERIFY_WINDOW_OWNER: "verify_window_owner",
}

# ----------------------------------------------------------------------------- violation ring
RING_ROW_FIELDS = 11
ROW_CHECK = 0  # CheckKind
ROW_REASONS = 1  # Reason bits
ROW_REQ_POOL_INDEX = 2  # 0 for sweep rows
ROW_SLOT = 3
ROW_POSITION = 4  # the position checked or written
ROW_STORED_TOKEN = 5  # verify: the record's token; write: the forward's input token
ROW_EXPECTED_TOKEN = 6  # the token expectation, or NO_EXPECTED_TOKEN
ROW_STORED_CHAIN = 7  # verify: the record's chain; write: the forward's position
ROW_EXPECTED_CHAIN = 8  # verify: the expected chain; write: the expected position
ROW_STEP = 9  # the step index of the forward (sweep: counters[COUNTER_STEP])
ROW_INDEX = 10  # the row's violation index n (the host tells stored rows from dropped ones)

# ----------------------------------------------------------------------------- counters
COUNTER_VIOLATIONS = 0  # violation indices ever reserved (device)
COUNTER_STEP = 1  # forwards completed: the post launch adds 1 (device)
COUNTER_CONSUMED = 2  # violation indices the host has handled (host)
COUNTER_KERNEL_RUNS = 3  # + CheckKind: launches that ran (device)
COUNTER_ENTRIES = COUNTER_KERNEL_RUNS + len(CheckKind)  # + CheckKind: slots checked/written
COUNTER_PUBLISHES = COUNTER_ENTRIES + len(CheckKind)  # publications: the publish launch adds 1
COUNTER_CHECKSUM = COUNTER_PUBLISHES + 1  # checksum of the words before it (device)
NUM_COUNTERS = COUNTER_CHECKSUM + 1

CHECKSUM_BASE = 0x4B56_4341_4E41_5259  # < 2**63: an all-zero copy never checks out
CHECKSUM_MULTIPLIER = 0x1F35_A7BD_5E3A_9B17  # < 2**63, odd: word i's key, see hashing.py
