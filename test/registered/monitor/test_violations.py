"""The violation line format: ring row -> line -> parsed row round trips, for every check and
reason, with logger prefixes around the line; the stats and perturbation line formats."""

import sys

import pytest

from sglang.jit_kernel.kv_canary.consts import (
    COUNTER_ENTRIES,
    COUNTER_KERNEL_RUNS,
    COUNTER_VIOLATIONS,
    NO_EXPECTED_TOKEN,
    NUM_COUNTERS,
    REASON_LABELS,
    RING_ROW_FIELDS,
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
    Reason,
)
from sglang.srt.kv_canary.perturb.fault import PERTURB_LINE_RE, InjectedFault
from sglang.srt.kv_canary.perturb.live_rows import LiveRow
from sglang.srt.kv_canary.monitor.counter_snapshots import CounterSnapshot
from sglang.srt.kv_canary.monitor.stats import STATS_LINE_RE, stats_line
from sglang.srt.kv_canary.monitor.violations import (
    VIOLATION_LINE_RE,
    CanaryViolationError,
    ViolationRow,
    find_violation_rows,
    format_reasons,
    parse_reasons,
    parse_violation_line,
)
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=5, suite="kv-canary-cpu")


def _ring_row(*, check: CheckKind, reasons: int, stored_chain: int, expected_chain: int,
              position: int = 17, step: int = 812) -> list[int]:
    row = [0] * RING_ROW_FIELDS
    row[ROW_CHECK] = int(check)
    row[ROW_REASONS] = reasons
    row[ROW_REQ_POOL_INDEX] = 3
    row[ROW_SLOT] = 1234
    row[ROW_POSITION] = position
    row[ROW_STORED_TOKEN] = 5
    row[ROW_EXPECTED_TOKEN] = NO_EXPECTED_TOKEN
    row[ROW_STORED_CHAIN] = stored_chain
    row[ROW_EXPECTED_CHAIN] = expected_chain
    row[ROW_STEP] = step
    return row


def test_verify_row_line_has_the_documented_fields_in_order() -> None:
    ring_row = _ring_row(
        check=CheckKind.PRE_VERIFY,
        reasons=int(Reason.VERIFY_CHAIN | Reason.VERIFY_POSITION),
        stored_chain=0x0C0FFEE5EED5A17,
        expected_chain=-2,  # int64 ring value with the high bit set
    )
    line = ViolationRow.from_ring_row(ring_row).to_line()
    assert line == (
        "kv_canary violation: check=pre_verify reasons=verify_chain_hash+verify_position "
        "req_pool_idx=3 slot=1234 position=17 stored_token=5 expected_token=-1 "
        "stored_chain=0x00c0ffee5eed5a17 expected_chain=0xfffffffffffffffe step=812"
    )


def test_write_row_line_names_the_positions() -> None:
    ring_row = _ring_row(check=CheckKind.WRITE, reasons=int(Reason.WRITE_POSITION),
                         stored_chain=18, expected_chain=17)
    row = ViolationRow.from_ring_row(ring_row)
    assert (row.input_position, row.expected_position, row.stored_chain) == (18, 17, None)
    assert row.to_line().endswith(
        "expected_token=-1 input_position=18 expected_position=17 step=812"
    )


@pytest.mark.parametrize("check", list(CheckKind))
@pytest.mark.parametrize("reason", list(REASON_LABELS))
def test_round_trip_every_check_and_reason(check: CheckKind, reason: Reason) -> None:
    ring_row = _ring_row(check=check, reasons=int(reason), stored_chain=(1 << 62) + 7,
                         expected_chain=-(1 << 63))
    row = ViolationRow.from_ring_row(ring_row)
    prefixed = f"[2026-01-01 00:00:00 TP0] {row.to_line()}"
    assert VIOLATION_LINE_RE.search(prefixed) is not None
    assert parse_violation_line(prefixed) == row
    assert row.reason_labels == (REASON_LABELS[reason],)


def test_reasons_round_trip_including_unknown_bits() -> None:
    every = sum(int(reason) for reason in REASON_LABELS)
    assert parse_reasons(format_reasons(every)) == every
    unknown = 1 << max(int(reason) for reason in REASON_LABELS).bit_length()  # 0x1000 today
    assert not unknown & every
    assert format_reasons(int(Reason.VERIFY_REAL_KV) | unknown) == (
        f"verify_real_kv_hash+unknown_bits_0x{unknown:x}"
    )
    bits = parse_reasons(f"verify_real_kv_hash+unknown_bits_0x{unknown:x}")
    assert bits == int(Reason.VERIFY_REAL_KV) | unknown
    with pytest.raises(ValueError, match="unknown violation reason label 'bogus'"):
        parse_reasons("bogus")


def test_find_violation_rows_skips_other_lines() -> None:
    rows = [
        ViolationRow.from_ring_row(_ring_row(check=CheckKind.POST_VERIFY, reasons=4,
                                             stored_chain=1, expected_chain=2, step=s))
        for s in range(3)
    ]
    text = "\n".join(["starting", *(f"W {r.to_line()}" for r in rows), "KV canary stats: x"])
    assert find_violation_rows(text) == rows
    assert parse_violation_line("kv_canary violation: check=pre_verify garbage") is None


def test_violation_error_carries_the_lines() -> None:
    row = ViolationRow.from_ring_row(_ring_row(check=CheckKind.PRE_VERIFY, reasons=1,
                                               stored_chain=1, expected_chain=2))
    error = CanaryViolationError(rows=[row], lines=[row.to_line()])
    assert isinstance(error, RuntimeError)
    assert error.rows == (row,)
    assert row.to_line() in str(error)
    assert find_violation_rows(str(error)) == [row]


def test_stats_line_round_trip() -> None:
    counters = [0] * NUM_COUNTERS
    counters[COUNTER_VIOLATIONS] = 2
    counters[COUNTER_ENTRIES + CheckKind.PRE_VERIFY] = 100
    counters[COUNTER_ENTRIES + CheckKind.POST_VERIFY] = 90
    counters[COUNTER_ENTRIES + CheckKind.WRITE] = 30
    counters[COUNTER_KERNEL_RUNS + CheckKind.SWEEP] = 3
    counters[COUNTER_ENTRIES + CheckKind.SWEEP] = 70
    line = stats_line(
        CounterSnapshot(steps=40, launches=38, sweep_launches=3, counters=tuple(counters))
    )
    assert line == ("KV canary stats: protected 190 tokens (slots verified), 30 slots written, "
                    "3 sweeps (70 slots swept), 2 violations, 40 steps")
    match = STATS_LINE_RE.search("[TP0] " + line)
    assert match is not None
    assert match.groupdict() == {"protected": "190", "written": "30", "sweeps": "3",
                                 "swept": "70", "violations": "2", "steps": "40"}


def test_perturb_line_round_trip() -> None:
    fault = InjectedFault(
        fault="req_to_token",
        row=LiveRow(row=2, prefix_len=9, rid="abc123"),
        position=4,
        detail="source_row=0 source_rid=def source_position=7",
        undo=lambda: None,
    )
    match = PERTURB_LINE_RE.search("[TP0] " + fault.log_line(step=55))
    assert match is not None
    assert (match["fault"], match["step"], match["row"], match["rid"], match["position"]) == (
        "req_to_token", "55", "2", "abc123", "4"
    )
    assert match["detail"] == " source_row=0 source_rid=def source_position=7"


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
