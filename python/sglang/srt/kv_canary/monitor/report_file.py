"""The forensics report file (``SGLANG_KV_CANARY_REPORT_PATH``): what the violation reporter
handles, appended as JSON lines (format: :mod:`sglang.srt.kv_canary.report.schema`).

One job: turn each report of the :class:`~.violation_reporter.ViolationReporter` (its new rows,
which of them log mode did not print as repeats, the rows the ring dropped) into JSON objects,
with each row's request and forward looked up in the runner's
:class:`~.forward_history.ForwardHistory`, and append them in one ``write``: the file is
complete after every poll, also when raise mode raises next, or the process dies.

Cold path only: a report exists only when violation indices moved. Built only with the knob set
(nothing of this module is imported otherwise). The file is opened at start-up, when the
canary's pool exists, once per process and path (an EAGLE draft canary shares its target's), in
append mode: several processes (tensor-parallel ranks) may append to one file, each object in
one ``write`` and carrying its ``pid``. A failed write is logged and serving goes on (the log
keeps the violation lines).
"""

from __future__ import annotations

import dataclasses
import datetime
import enum
import json
import logging
import os
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from sglang.jit_kernel.kv_canary.consts import CheckKind
from sglang.srt.kv_canary.config import ENV_PREFIX, CanaryConfig
from sglang.srt.kv_canary.monitor.forward_history import (
    HISTORY_STEPS,
    ForwardContext,
    ForwardHistory,
)
from sglang.srt.kv_canary.monitor.violations import ViolationRow
from sglang.srt.kv_canary.report.schema import (
    ABORT,
    CACHE_EVICTION,
    HEADER,
    POOL_KEY,
    RING_OVERFLOW,
    SCHEMA_VERSION,
    TYPE_KEY,
    VIOLATION,
)

if TYPE_CHECKING:
    from sglang.srt.kv_canary.monitor.containment_records import AbortRecord, EvictionRecord

logger = logging.getLogger(__name__)

REPORT_PATH_VARIABLE = ENV_PREFIX + "REPORT_PATH"
REPORT_FILE_ERROR_PREFIX = "kv_canary report file:"
_UNKNOWN = ForwardContext(rid=None, forward_mode=None, batch_size=None)


class ReportFileError(RuntimeError):
    """The report file cannot be opened or its header written (at start-up)."""


class _AppendOnlyFile:
    """A file opened for appending; each :meth:`append` is one unbuffered ``write``."""

    def __init__(self, *, path: str) -> None:
        self.path = path
        try:
            self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            raise ReportFileError(
                f"{REPORT_PATH_VARIABLE}={path!r}: cannot open it for appending: "
                f"{exc.strerror or exc}"
            ) from exc

    def append(self, data: bytes) -> None:
        """Write all of ``data`` at the end of the file.

        Raises:
            OSError: the write failed (disk full, file system gone).
        """
        view = memoryview(data)
        while view:
            written = os.write(self._fd, view)
            view = view[written:]


_open_files: dict[str, _AppendOnlyFile] = {}  # path -> the file this process appends to


def _shared_file(path: str) -> _AppendOnlyFile:
    file = _open_files.get(path)
    if file is None:
        file = _open_files[path] = _AppendOnlyFile(path=path)
    return file


class ViolationReportFile:
    """One canary's objects in the report file (the sink of its violation reporter).

    Args:
        file: where the lines go (shared by the canaries of one process).
        history: the runner's forward history (rid, forward mode, batch size of each row).
        pool: ``"draft"`` for an EAGLE draft model's canary (every object says so), else None.
        ring_capacity: rows of the canary's violation ring.
        clock: unix seconds (tests pass a fixed one).
    """

    def __init__(
        self, *, file: _AppendOnlyFile, history: ForwardHistory, pool: str | None,
        ring_capacity: int, clock: Callable[[], float] = time.time,
    ) -> None:
        self._file = file
        self._history = history
        self._ring_capacity = ring_capacity
        self._clock = clock
        self._pid = os.getpid()
        self._pool = {} if pool is None else {POOL_KEY: pool}
        self.objects_lost = 0  # objects whose write failed

    @property
    def path(self) -> str:
        return self._file.path

    def write_header(
        self, *, config: CanaryConfig, pool_description: str, tp_rank: int | None
    ) -> None:
        """Append this canary's header object.

        Raises:
            ReportFileError: the write failed.
        """
        now = self._clock()
        header = {
            TYPE_KEY: HEADER, "schema": SCHEMA_VERSION, "pid": self._pid,
            "start_time": datetime.datetime.fromtimestamp(now, datetime.timezone.utc)
            .isoformat(timespec="milliseconds"),
            "start_unix": now, **self._pool, "path": self.path, "tp_rank": tp_rank,
            "pool_description": pool_description, "ring_capacity": self._ring_capacity,
            "history_steps": HISTORY_STEPS, "config": config_summary(config),
        }
        try:
            self._file.append(_lines([header]))
        except OSError as exc:
            raise ReportFileError(
                f"{REPORT_PATH_VARIABLE}={self.path!r}: cannot write to it: "
                f"{exc.strerror or exc}"
            ) from exc

    def record(
        self, *, rows: Sequence[ViolationRow], repeats: Sequence[bool], dropped: int,
        dropped_total: int, first_index: int, end_index: int,
    ) -> None:
        """Append one poll's report: an object per row (``repeats[i]``: log mode did not print
        ``rows[i]``), then a ``ring_overflow`` object when ``dropped`` rows were lost. One
        ``write``; a failure is logged, never raised."""
        now = self._clock()
        objects: list[dict[str, Any]] = [
            self._violation(row=row, repeat=repeat, now=now) for row, repeat in zip(rows, repeats)
        ]
        if dropped:
            objects.append({
                TYPE_KEY: RING_OVERFLOW, "pid": self._pid, "time": now, **self._pool,
                "dropped": dropped, "dropped_total": dropped_total,
                "ring_capacity": self._ring_capacity, "first_index": first_index,
                "end_index": end_index, "host_step": self._history.latest_step,
            })
        self._append(objects)

    def record_containment(
        self, *, aborts: Sequence[AbortRecord], evictions: Sequence[EvictionRecord]
    ) -> None:
        """Abort mode did this (:mod:`sglang.srt.kv_canary.containment`): one ``abort`` object
        per request, one ``cache_eviction`` object per eviction, in one ``write``; a failure is
        logged, never raised."""
        now = self._clock()
        objects: list[dict[str, Any]] = [{
            TYPE_KEY: ABORT, "pid": self._pid, "time": now, **self._pool, "rid": record.rid,
            "cause": record.cause.value, "step": record.step, "check": record.check,
            "reasons": list(record.reasons), "slot": record.slot, "position": record.position,
            "tokens_delivered": record.tokens_delivered,
        } for record in aborts]
        objects += [{
            TYPE_KEY: CACHE_EVICTION, "pid": self._pid, "time": now, **self._pool,
            "cause": record.cause.value, "nodes": record.nodes, "tokens": record.tokens,
            "locked_nodes": record.locked_nodes, "slots": list(record.slots),
            "rids": list(record.rids),
        } for record in evictions]
        self._append(objects)

    def _append(self, objects: list[dict[str, Any]]) -> None:
        if not objects:
            return
        try:
            self._file.append(_lines(objects))
        except OSError as exc:
            self.objects_lost += len(objects)
            logger.error(
                f"{REPORT_FILE_ERROR_PREFIX} writing {len(objects)} object(s) to {self.path} "
                f"failed ({exc.strerror or exc}); {self.objects_lost} lost so far, the log "
                "still has every violation line"
            )

    def _violation(self, *, row: ViolationRow, repeat: bool, now: float) -> dict[str, Any]:
        context = _UNKNOWN if row.check is CheckKind.SWEEP else self._history.context(
            step=row.step, req_pool_idx=row.req_pool_idx
        )
        return {
            TYPE_KEY: VIOLATION, "pid": self._pid, "time": now, **self._pool, "step": row.step,
            "check": row.check.name.lower(), "reasons": list(row.reason_labels),
            "reason_bits": row.reasons, "req_pool_idx": row.req_pool_idx, "rid": context.rid,
            "slot": row.slot, "position": row.position, "stored_token": row.stored_token,
            "expected_token": row.expected_token, "stored_chain": _hex(row.stored_chain),
            "expected_chain": _hex(row.expected_chain), "input_position": row.input_position,
            "expected_position": row.expected_position, "forward_mode": context.forward_mode,
            "batch_size": context.batch_size, "repeat": repeat,
        }


def open_report_file(
    *, config: CanaryConfig, history: ForwardHistory, pool: str | None, pool_description: str,
    ring_capacity: int, tp_rank: int | None,
) -> ViolationReportFile:
    """Open ``config.report_path`` for appending (once per process and path) and write this
    canary's header.

    Raises:
        ValueError: ``config.report_path`` is None.
        ReportFileError: the file cannot be opened or written (names the variable, the path and
            the reason).
    """
    if config.report_path is None:
        raise ValueError("open_report_file needs config.report_path")
    report = ViolationReportFile(
        file=_shared_file(config.report_path), history=history, pool=pool,
        ring_capacity=ring_capacity,
    )
    report.write_header(config=config, pool_description=pool_description, tp_rank=tp_rank)
    return report


def config_summary(config: CanaryConfig) -> dict[str, Any]:
    """Every setting of ``config`` as JSON values (enums as their values; the perturbations as
    one nested object)."""
    return {
        field.name: _json_value(getattr(config, field.name))
        for field in dataclasses.fields(config)
        if field.name != "launch_flags"  # how the flags were given, not a setting
    }


def _json_value(value: Any) -> Any:
    if isinstance(value, enum.Enum):
        return value.value
    if dataclasses.is_dataclass(value):
        return {field.name: _json_value(getattr(value, field.name))
                for field in dataclasses.fields(value)}
    return value


def _hex(value: int | None) -> str | None:
    return None if value is None else f"0x{value:016x}"


def _lines(objects: Sequence[dict[str, Any]]) -> bytes:
    return "".join(json.dumps(obj) + "\n" for obj in objects).encode()
