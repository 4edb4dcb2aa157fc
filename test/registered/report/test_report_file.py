"""The report file: a header, then every row the violation reporter handles (repeats included and
flagged, rows written before raise mode raises), each ring overflow, one write per report, and
clear errors when the file cannot be opened."""

import errno
import json
import logging
import os
import pathlib
import sys

import pytest
import torch

from sglang.jit_kernel.kv_canary.consts import (
    COUNTER_CONSUMED,
    COUNTER_VIOLATIONS,
    NO_EXPECTED_TOKEN,
    NUM_COUNTERS,
    RING_ROW_FIELDS,
    ROW_CHECK,
    ROW_EXPECTED_CHAIN,
    ROW_EXPECTED_TOKEN,
    ROW_INDEX,
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
from sglang.srt.kv_canary.config import CanaryConfig, CanaryMode
from sglang.srt.kv_canary.monitor.forward_history import HISTORY_STEPS, ForwardHistory
from sglang.srt.kv_canary.monitor.report_file import (
    REPORT_FILE_ERROR_PREFIX,
    ReportFileError,
    config_summary,
    open_report_file,
)
from sglang.srt.kv_canary.monitor.violation_reporter import RING_OVERFLOW_PREFIX, ViolationReporter
from sglang.srt.kv_canary.monitor.violations import CanaryViolationError
from sglang.srt.kv_canary.report.schema import (
    HEADER_KEYS,
    RING_OVERFLOW_KEYS,
    SCHEMA_VERSION,
    VIOLATION_KEYS,
)
from sglang.srt.model_executor.forward_batch_info import ForwardMode
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=5, suite="kv-canary-cpu")


class _State:
    """The ring and the counters, on the CPU, filled the way the kernels fill them."""

    def __init__(self, *, ring_capacity: int = 8) -> None:
        self.ring = torch.zeros((ring_capacity, RING_ROW_FIELDS), dtype=torch.int64)
        self.counters = torch.zeros((NUM_COUNTERS,), dtype=torch.int64)

    def add(self, *, step: int, req_pool_idx: int = 3, position: int = 5,
            check: CheckKind = CheckKind.PRE_VERIFY,
            reasons: int = int(Reason.VERIFY_POSITION)) -> None:
        index = int(self.counters[COUNTER_VIOLATIONS])
        capacity = self.ring.shape[0]
        if index - int(self.counters[COUNTER_CONSUMED]) < capacity:
            row = self.ring[index % capacity]
            row.zero_()
            row[ROW_CHECK] = int(check)
            row[ROW_REASONS] = reasons
            row[ROW_REQ_POOL_INDEX] = req_pool_idx
            row[ROW_SLOT] = 100 + position
            row[ROW_POSITION] = position
            row[ROW_STORED_TOKEN] = 7
            row[ROW_EXPECTED_TOKEN] = NO_EXPECTED_TOKEN
            row[ROW_STORED_CHAIN] = 0x1234 if check is not CheckKind.WRITE else position + 1
            row[ROW_EXPECTED_CHAIN] = -2 if check is not CheckKind.WRITE else position
            row[ROW_STEP] = step
            row[ROW_INDEX] = index
        self.counters[COUNTER_VIOLATIONS] += 1

    @property
    def violations(self) -> int:
        return int(self.counters[COUNTER_VIOLATIONS])


def _history() -> ForwardHistory:
    """Steps 0..9: an EXTEND at step 0 admits rows 3 (rid-a) and 4 (rid-b), decode steps follow;
    an EXTEND at step 6 gives row 3 to rid-c (rid-a finished)."""
    history = ForwardHistory()
    history.record_forward(step=0, mode=ForwardMode.EXTEND, batch_size=2,
                           owners=[(3, "rid-a"), (4, "rid-b")])
    for step in range(1, 6):
        history.record_forward(step=step, mode=ForwardMode.DECODE, batch_size=2, owners=None)
    history.record_forward(step=6, mode=ForwardMode.MIXED, batch_size=2,
                           owners=[(3, "rid-c"), (4, "rid-b")])
    for step in range(7, 10):
        history.record_forward(step=step, mode=ForwardMode.DECODE, batch_size=2, owners=None)
    return history


def _setup(tmp_path: pathlib.Path, *, mode: CanaryMode, ring_capacity: int = 8,
           pool: str | None = None) -> tuple[_State, ViolationReporter, pathlib.Path]:
    path = tmp_path / f"report-{mode.value}-{pool}.jsonl"
    config = CanaryConfig(mode=mode, ring_capacity=ring_capacity, report_path=str(path))
    state = _State(ring_capacity=ring_capacity)
    report = open_report_file(config=config, history=_history(), pool=pool,
                              pool_description="MHA test pool", ring_capacity=ring_capacity,
                              tp_rank=0)
    reporter = ViolationReporter(ring=state.ring, counters=state.counters, mode=mode,
                                 sink=report)
    return state, reporter, path


def _objects(path: pathlib.Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_the_header_comes_first_with_schema_config_pool_and_pid(tmp_path: pathlib.Path) -> None:
    _, _, path = _setup(tmp_path, mode=CanaryMode.LOG)
    (header,) = _objects(path)
    assert tuple(header) == HEADER_KEYS  # every key, in the schema's order
    assert header["type"] == "header" and header["schema"] == SCHEMA_VERSION
    assert header["pid"] == os.getpid() and header["tp_rank"] == 0
    assert header["pool_description"] == "MHA test pool" and header["ring_capacity"] == 8
    assert header["history_steps"] == HISTORY_STEPS and header["path"] == str(path)
    assert header["start_time"].endswith("+00:00") and header["start_unix"] > 0
    assert header["config"]["mode"] == "log" and header["config"]["report_path"] == str(path)
    assert header["config"]["perturb"]["seed"] == 0 and "launch_flags" not in header["config"]


def test_log_mode_writes_every_row_with_its_request_and_forward_and_flags_repeats(
    tmp_path: pathlib.Path, caplog: pytest.LogCaptureFixture
) -> None:
    state, reporter, path = _setup(tmp_path, mode=CanaryMode.LOG)
    state.add(step=2)  # rid-a's row 3 at a decode step
    state.add(step=2, req_pool_idx=4, check=CheckKind.WRITE, reasons=int(Reason.WRITE_POSITION))
    with caplog.at_level(logging.WARNING):
        reporter.report(violation_count=state.violations)
        state.add(step=3)  # the same corruption one step later: a repeat, not printed
        reporter.report(violation_count=state.violations)
        state.add(step=7)  # the row's new owner, later: printed again
        reporter.report(violation_count=state.violations)
    printed = [r.getMessage() for r in caplog.records if "kv_canary violation:" in r.getMessage()]
    assert len(printed) == 3 and reporter.rows_suppressed == 1
    header, *rows = _objects(path)
    assert [row["type"] for row in rows] == ["violation"] * 4
    assert all(tuple(row) == VIOLATION_KEYS for row in rows)  # no "pool": the target's
    first, write, repeat, later = rows
    assert first == {
        "type": "violation", "pid": os.getpid(), "time": first["time"], "step": 2,
        "check": "pre_verify", "reasons": ["verify_position"],
        "reason_bits": int(Reason.VERIFY_POSITION), "req_pool_idx": 3, "rid": "rid-a",
        "slot": 105, "position": 5, "stored_token": 7, "expected_token": -1,
        "stored_chain": "0x0000000000001234", "expected_chain": "0xfffffffffffffffe",
        "input_position": None, "expected_position": None, "forward_mode": "DECODE",
        "batch_size": 2, "repeat": False,
    }
    assert (write["check"], write["rid"], write["input_position"], write["expected_position"],
            write["stored_chain"]) == ("write", "rid-b", 6, 5, None)
    assert (repeat["step"], repeat["repeat"], repeat["rid"]) == (3, True, "rid-a")
    assert (later["step"], later["repeat"], later["rid"], later["forward_mode"]) == (
        7, False, "rid-c", "DECODE")


def test_raise_mode_writes_the_rows_before_raising(tmp_path: pathlib.Path) -> None:
    state, reporter, path = _setup(tmp_path, mode=CanaryMode.RAISE)
    state.add(step=6, req_pool_idx=3)
    state.add(step=6, req_pool_idx=3)  # raise mode never flags a repeat
    with pytest.raises(CanaryViolationError):
        reporter.report(violation_count=state.violations)
    _, *rows = _objects(path)
    assert [(row["rid"], row["forward_mode"], row["repeat"]) for row in rows] == [
        ("rid-c", "MIXED", False)] * 2


def test_an_overflow_is_written_after_the_rows_that_were_kept(
    tmp_path: pathlib.Path, caplog: pytest.LogCaptureFixture
) -> None:
    state, reporter, path = _setup(tmp_path, mode=CanaryMode.LOG, ring_capacity=2)
    for position in range(5):  # 2 kept, 3 dropped
        state.add(step=4, position=position)
    with caplog.at_level(logging.WARNING):
        reporter.report(violation_count=state.violations)
    assert any(RING_OVERFLOW_PREFIX in r.getMessage() for r in caplog.records)
    _, first, second, overflow = _objects(path)
    assert (first["position"], second["position"]) == (0, 1)
    assert tuple(overflow) == RING_OVERFLOW_KEYS
    assert {key: overflow[key] for key in RING_OVERFLOW_KEYS if key != "time"} == {
        "type": "ring_overflow", "pid": os.getpid(), "dropped": 3, "dropped_total": 3,
        "ring_capacity": 2, "first_index": 0, "end_index": 5, "host_step": 9,
    }


def test_a_draft_canary_says_pool_draft_and_shares_the_file(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "shared.jsonl"
    config = CanaryConfig(mode=CanaryMode.LOG, report_path=str(path))
    states = []
    for pool in (None, "draft"):
        state = _State()
        report = open_report_file(config=config, history=_history(), pool=pool,
                                  pool_description=f"{pool} pool", ring_capacity=8, tp_rank=None)
        states.append((state, ViolationReporter(ring=state.ring, counters=state.counters,
                                                mode=CanaryMode.LOG, sink=report)))
    for state, reporter in states:
        state.add(step=1)
        reporter.report(violation_count=state.violations)
    target_header, draft_header, target_row, draft_row = _objects(path)
    assert "pool" not in target_header and draft_header["pool"] == "draft"
    assert "pool" not in target_row and draft_row["pool"] == "draft"
    assert draft_row["rid"] == "rid-a"


def test_sweep_rows_name_no_request_and_no_forward(tmp_path: pathlib.Path) -> None:
    state, reporter, path = _setup(tmp_path, mode=CanaryMode.LOG)
    state.add(step=2, req_pool_idx=0, check=CheckKind.SWEEP)
    state.add(step=2, req_pool_idx=9)  # a row no owner was recorded for
    state.add(step=HISTORY_STEPS + 50, req_pool_idx=3)  # a step no forward ran at
    reporter.report(violation_count=state.violations)
    _, sweep, unowned, future = _objects(path)
    assert (sweep["check"], sweep["rid"], sweep["forward_mode"], sweep["batch_size"]) == (
        "sweep", None, None, None)
    assert (unowned["rid"], unowned["forward_mode"]) == (None, "DECODE")
    assert (future["rid"], future["forward_mode"], future["batch_size"]) == ("rid-c", None, None)


def test_nothing_is_written_without_new_violations(tmp_path: pathlib.Path) -> None:
    state, reporter, path = _setup(tmp_path, mode=CanaryMode.LOG)
    reporter.report(violation_count=0)
    assert len(_objects(path)) == 1


def test_each_report_is_one_write(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    state, reporter, path = _setup(tmp_path, mode=CanaryMode.LOG, ring_capacity=2)
    writes: list[bytes] = []
    real_write = os.write
    monkeypatch.setattr(os, "write", lambda fd, data: writes.append(bytes(data))
                        or real_write(fd, data))
    for position in range(4):
        state.add(step=4, position=position)
    reporter.report(violation_count=state.violations)
    assert len(writes) == 1 and writes[0].count(b"\n") == 3  # two rows and the overflow


def test_a_failed_write_is_logged_and_serving_goes_on(
    tmp_path: pathlib.Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "full.jsonl"
    config = CanaryConfig(mode=CanaryMode.LOG, report_path=str(path))
    report = open_report_file(config=config, history=_history(), pool=None,
                              pool_description="p", ring_capacity=8, tp_rank=None)

    class _FullDisk:
        path = str(tmp_path / "full.jsonl")

        def append(self, data: bytes) -> None:
            raise OSError(errno.ENOSPC, "No space left on device")

    report._file = _FullDisk()
    state = _State()
    reporter = ViolationReporter(ring=state.ring, counters=state.counters, mode=CanaryMode.LOG,
                                 sink=report)
    state.add(step=1)
    with caplog.at_level(logging.ERROR):
        reporter.report(violation_count=state.violations)
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert errors and errors[0].startswith(REPORT_FILE_ERROR_PREFIX)
    assert "No space left on device" in errors[0] and report.objects_lost == 1
    assert reporter.rows_reported == 1


def test_a_file_that_cannot_be_opened_names_the_variable_the_path_and_the_reason(
    tmp_path: pathlib.Path
) -> None:
    config = CanaryConfig(mode=CanaryMode.LOG, report_path=str(tmp_path))  # a directory
    with pytest.raises(ReportFileError) as info:
        open_report_file(config=config, history=ForwardHistory(), pool=None,
                         pool_description="p", ring_capacity=8, tp_rank=None)
    message = str(info.value)
    assert f"SGLANG_KV_CANARY_REPORT_PATH={str(tmp_path)!r}" in message
    assert "Is a directory" in message


def test_open_report_file_needs_a_path() -> None:
    with pytest.raises(ValueError, match="report_path"):
        open_report_file(config=CanaryConfig(mode=CanaryMode.LOG), history=ForwardHistory(),
                         pool=None, pool_description="p", ring_capacity=8, tp_rank=None)


def test_config_summary_is_json() -> None:
    summary = config_summary(CanaryConfig(mode=CanaryMode.RAISE))
    assert json.loads(json.dumps(summary)) == summary and summary["mode"] == "raise"


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
