"""Violation rows as stable, parseable log lines.

Every row of the device violation ring becomes one line::

    kv_canary violation: check=<check> reasons=<reason>[+<reason>...] req_pool_idx=<int>
        slot=<int> position=<int> stored_token=<int> expected_token=<int> <pair> step=<int>

(one line in the log; wrapped here), single spaces, fields always in this order:

==============  ===========================================================================
check           which launch found it: ``pre_verify`` (before the model forward),
                ``post_verify`` (after it), ``write`` (while writing this forward's records),
                ``sweep``
reasons         ``+``-joined labels of the reason bits: ``verify_chain_hash``,
                ``verify_position``, ``verify_real_kv_hash``, ``verify_token``, ``write_token``,
                ``write_position`` (bits unknown to this version: ``unknown_bits_0x<hex>``)
req_pool_idx    the request's row in ``req_to_token``
slot            the KV-pool slot (same index as the K/V buffers)
position        verify: the position being verified; write: the position the written token
                must have (the row's prefix length + its index among the row's new tokens)
stored_token    verify: the token the slot's record holds; write: the forward's ``input_ids[i]``
expected_token  the expected token (token checks), or -1 when there is no expectation
<pair>          verify rows: ``stored_chain=0x<16 hex> expected_chain=0x<16 hex>``: the record's
                chain value and the one recomputed from the predecessor slot (unsigned 64-bit)
                write rows: ``input_position=<int> expected_position=<int>``: the forward's
                ``positions[i]`` and the position the request's history implies
step            index of the forward that produced the row, counted on the device from the end
                of start-up (the first forward that runs the canary is step 0; forwards with no
                request rows, DP-attention IDLE, do not count)
==============  ===========================================================================

:data:`VIOLATION_LINE_RE` matches a line (anywhere in a log line, so logger prefixes are fine) and
:func:`parse_violation_line` turns it back into a :class:`ViolationRow`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from sglang.jit_kernel.kv_canary.consts import (
    REASON_LABELS,
    ROW_CHECK,
    ROW_EXPECTED_CHAIN,
    ROW_EXPECTED_TOKEN,
    ROW_POSITION,
    ROW_REASONS,
    ROW_REQ_POOL_INDEX,
    ROW_SLOT,
    ROW_STEP,
    ROW_STORED_CHAIN,
    ROW_STORED_TOKEN,
    CheckKind,
)
from sglang.jit_kernel.kv_canary.hashing import to_unsigned_u64

VIOLATION_LINE_PREFIX = "kv_canary violation:"
_UNKNOWN_BITS = "unknown_bits_0x"
_KNOWN_BITS = sum(int(reason) for reason in REASON_LABELS)
_LABEL_BITS = {label: int(reason) for reason, label in REASON_LABELS.items()}

VIOLATION_LINE_RE = re.compile(
    r"kv_canary violation: check=(?P<check>[a-z_]+) reasons=(?P<reasons>[a-z0-9_+]+)"
    r" req_pool_idx=(?P<req_pool_idx>-?\d+) slot=(?P<slot>-?\d+) position=(?P<position>-?\d+)"
    r" stored_token=(?P<stored_token>-?\d+) expected_token=(?P<expected_token>-?\d+)"
    r" (?:stored_chain=0x(?P<stored_chain>[0-9a-f]{16})"
    r" expected_chain=0x(?P<expected_chain>[0-9a-f]{16})"
    r"|input_position=(?P<input_position>-?\d+)"
    r" expected_position=(?P<expected_position>-?\d+))"
    r" step=(?P<step>-?\d+)"
)


def format_reasons(bits: int) -> str:
    """``+``-joined labels of ``bits`` in bit order (unknown bits kept as one hex label)."""
    labels = [label for label, bit in _LABEL_BITS.items() if bits & bit]
    unknown = bits & ~_KNOWN_BITS
    if unknown or not labels:
        labels.append(f"{_UNKNOWN_BITS}{unknown:x}")
    return "+".join(labels)


def parse_reasons(text: str) -> int:
    """Inverse of :func:`format_reasons`.

    Raises:
        ValueError: an unknown label.
    """
    bits = 0
    for label in text.split("+"):
        if label.startswith(_UNKNOWN_BITS):
            bits |= int(label[len(_UNKNOWN_BITS):], 16)
        elif label in _LABEL_BITS:
            bits |= _LABEL_BITS[label]
        else:
            raise ValueError(f"unknown violation reason label {label!r}")
    return bits


@dataclass(frozen=True, slots=True, kw_only=True)
class ViolationRow:
    """One violation, as read from the device ring (see the module docstring for each field).

    Verify rows carry ``stored_chain``/``expected_chain`` (unsigned 64-bit values) and leave the
    two position fields None; write rows the other way round.
    """

    check: CheckKind
    reasons: int
    req_pool_idx: int
    slot: int
    position: int
    stored_token: int
    expected_token: int
    stored_chain: int | None
    expected_chain: int | None
    input_position: int | None
    expected_position: int | None
    step: int

    @property
    def reason_labels(self) -> tuple[str, ...]:
        return tuple(format_reasons(self.reasons).split("+"))

    @classmethod
    def from_ring_row(cls, row: Sequence[int]) -> ViolationRow:
        """Decode one ring row (``consts.RING_ROW_FIELDS`` int64 values)."""
        check = CheckKind(row[ROW_CHECK])
        is_write = check is CheckKind.WRITE
        return cls(
            check=check,
            reasons=to_unsigned_u64(row[ROW_REASONS]),
            req_pool_idx=row[ROW_REQ_POOL_INDEX],
            slot=row[ROW_SLOT],
            position=row[ROW_POSITION],
            stored_token=row[ROW_STORED_TOKEN],
            expected_token=row[ROW_EXPECTED_TOKEN],
            stored_chain=None if is_write else to_unsigned_u64(row[ROW_STORED_CHAIN]),
            expected_chain=None if is_write else to_unsigned_u64(row[ROW_EXPECTED_CHAIN]),
            input_position=row[ROW_STORED_CHAIN] if is_write else None,
            expected_position=row[ROW_EXPECTED_CHAIN] if is_write else None,
            step=row[ROW_STEP],
        )

    def to_line(self) -> str:
        """The one log line of this row (format in the module docstring)."""
        if self.check is CheckKind.WRITE:
            pair = (
                f"input_position={self.input_position} "
                f"expected_position={self.expected_position}"
            )
        else:
            pair = (
                f"stored_chain=0x{to_unsigned_u64(self.stored_chain):016x} "
                f"expected_chain=0x{to_unsigned_u64(self.expected_chain):016x}"
            )
        return (
            f"{VIOLATION_LINE_PREFIX} check={self.check.name.lower()} "
            f"reasons={format_reasons(self.reasons)} req_pool_idx={self.req_pool_idx} "
            f"slot={self.slot} position={self.position} stored_token={self.stored_token} "
            f"expected_token={self.expected_token} {pair} step={self.step}"
        )


def parse_violation_line(line: str) -> ViolationRow | None:
    """The row of the first violation line inside ``line``, or None when there is none."""
    match = VIOLATION_LINE_RE.search(line)
    if match is None:
        return None
    fields = match.groupdict()
    is_write = fields["input_position"] is not None

    def optional(name: str, base: int = 10) -> int | None:
        return None if fields[name] is None else int(fields[name], base)

    return ViolationRow(
        check=CheckKind[fields["check"].upper()],
        reasons=parse_reasons(fields["reasons"]),
        req_pool_idx=int(fields["req_pool_idx"]),
        slot=int(fields["slot"]),
        position=int(fields["position"]),
        stored_token=int(fields["stored_token"]),
        expected_token=int(fields["expected_token"]),
        stored_chain=None if is_write else optional("stored_chain", 16),
        expected_chain=None if is_write else optional("expected_chain", 16),
        input_position=optional("input_position"),
        expected_position=optional("expected_position"),
        step=int(fields["step"]),
    )


def find_violation_rows(text: str) -> list[ViolationRow]:
    """Every violation row in a log text, one per matching line, in order."""
    rows = []
    for line in text.splitlines():
        row = parse_violation_line(line)
        if row is not None:
            rows.append(row)
    return rows


class CanaryViolationError(RuntimeError):
    """Raised in the scheduler (``SGLANG_KV_CANARY_MODE=raise``) with the violation lines."""

    def __init__(self, *, rows: Sequence[ViolationRow], lines: Sequence[str]) -> None:
        self.rows = tuple(rows)
        self.lines = tuple(lines)
        super().__init__(
            f"KV canary detected KV-cache corruption ({len(self.rows)} violation row(s); "
            "SGLANG_KV_CANARY_MODE=raise):\n" + "\n".join(self.lines)
        )
