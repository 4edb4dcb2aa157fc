"""Cold path: new violation rows of the device ring become log lines or an exception.

Runs only when a counter snapshot shows more violations than were already handled, so the
synchronous read of the ring rows is off the steady-state path.

Ring discipline (shared with the kernels, see :mod:`sglang.jit_kernel.kv_canary.consts`): the
device gives every violation an ever-growing index ``n`` and stores its row at ``ring[n %
capacity]`` only while ``n - counters[COUNTER_CONSUMED] < capacity``; each stored row carries
``n`` in ``ROW_INDEX``. After reading, the host advances ``COUNTER_CONSUMED`` (a stream-ordered
device write, no sync), which frees those ring rows for reuse: the ring never stops reporting.
A row whose slot holds another index was dropped (the ring was full of unread rows); drops are
counted and reported, never mistaken for rows.

Log mode de-duplicates persisting corruption: a row is logged in full unless the same ``(check,
req_pool_idx, slot, position, reasons)`` was also reported by the previous forward step or this
one (then it is the same corruption still there, and it is counted instead). A corruption that
goes away and comes back is printed again. A summary line says how many repeats were suppressed
(at most once per :data:`REPEAT_SUMMARY_EVERY` reports), so one persistent bad slot cannot flood
the log or hide a new, different corruption. Raise mode raises at the first new row (no
de-duplication).

A :class:`ReportSink` (the report file, ``SGLANG_KV_CANARY_REPORT_PATH``) receives every report
in full before anything is logged or raised: every row, the repeats too (flagged), and the
number of rows dropped.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Sequence
from typing import Protocol

import torch

from sglang.jit_kernel.kv_canary.consts import COUNTER_CONSUMED, ROW_INDEX
from sglang.srt.kv_canary.config import CanaryMode
from sglang.srt.kv_canary.monitor.violations import CanaryViolationError, ViolationRow

logger = logging.getLogger(__name__)

RING_OVERFLOW_PREFIX = "kv_canary ring overflow:"
REPEATS_PREFIX = "kv_canary violation repeats:"
MAX_TRACKED_KEYS = 1 << 16  # row keys remembered for de-duplication (LRU)
REPEAT_SUMMARY_EVERY = 100  # reports between two "repeats suppressed" lines

_Key = tuple[int, int, int, int, int]


class ReportSink(Protocol):
    """Receives each report of a :class:`ViolationReporter` whole (cold path only)."""

    def record(
        self, *, rows: Sequence[ViolationRow], repeats: Sequence[bool], dropped: int,
        dropped_total: int, first_index: int, end_index: int,
    ) -> None:
        """One report: the new rows read (``repeats[i]``: log mode does not print ``rows[i]``,
        the same corruption was reported one step earlier; always False in raise mode),
        ``dropped`` rows the ring lost (``dropped_total`` so far), the violation indices
        ``[first_index, end_index)`` handled. Must not raise."""
        ...


class ViolationReporter:
    """Reports each violation: WARNING lines in ``log`` mode (a corruption still present one
    step later is summarized, not printed again), an exception in ``raise`` mode.

    Args:
        ring: the device ring, int64 ``[capacity, RING_ROW_FIELDS]``.
        counters: the device counters (``COUNTER_CONSUMED`` is written here).
        mode: log or raise.
        line_suffix: ends every violation line (`` pool=draft`` for an EAGLE draft model's
            canary, whose rows describe the draft pool).
        sink: receives every report before it is logged or raised (None: none).
    """

    def __init__(
        self, *, ring: torch.Tensor, counters: torch.Tensor, mode: CanaryMode,
        line_suffix: str = "", sink: ReportSink | None = None,
    ) -> None:
        if mode is CanaryMode.NONE:
            raise ValueError("ViolationReporter needs mode log or raise, got none")
        self._suffix = line_suffix
        self._sink = sink
        self._ring = ring
        self._counters = counters
        self._mode = mode
        self._capacity = ring.shape[0]
        self._handled = 0  # violation indices handled (read or found dropped)
        self._last_step: OrderedDict[_Key, int] = OrderedDict()  # key -> step it was last seen
        self._reports = 0
        self._summarized = 0
        self.rows_reported = 0
        self.rows_suppressed = 0
        self.rows_dropped = 0

    def restart(self) -> None:
        """The device counters were reset: violation indices start again at 0."""
        self._handled = 0
        self._last_step.clear()

    def report(self, *, violation_count: int) -> None:
        """Handle the violation indices ``[handled, violation_count)``.

        Raises:
            CanaryViolationError: raise mode and there is at least one new violation.
        """
        if violation_count <= self._handled:
            return
        first, end = self._handled, violation_count
        rows = self._read_rows(first=first, end=end)
        dropped = (end - first) - len(rows)
        self._handled = end
        self._counters[COUNTER_CONSUMED].fill_(end)  # frees the ring rows (stream-ordered)
        self.rows_dropped += dropped
        drop_line = (
            f"{RING_OVERFLOW_PREFIX} {dropped} violation row(s) were dropped "
            f"({self.rows_dropped} in total): more than {self._capacity} rows arrived between "
            "two reads by the host; set SGLANG_KV_CANARY_RING_CAPACITY to keep more"
            if dropped
            else None
        )
        raising = self._mode is CanaryMode.RAISE
        repeats = [False] * len(rows) if raising else self._repeat_flags(rows)
        if self._sink is not None:
            self._sink.record(rows=rows, repeats=repeats, dropped=dropped,
                              dropped_total=self.rows_dropped, first_index=first, end_index=end)
        if raising:
            lines = [row.to_line() + self._suffix for row in rows]
            lines += [drop_line] if drop_line else []
            for line in lines:
                logger.error(line)
            self.rows_reported += len(rows)
            raise CanaryViolationError(rows=rows, lines=lines)
        new_rows = [row for row, repeat in zip(rows, repeats) if not repeat]
        for row in new_rows:
            logger.warning(row.to_line() + self._suffix)
        self.rows_reported += len(new_rows)
        self.rows_suppressed += len(rows) - len(new_rows)
        self._reports += 1
        unsummarized = self.rows_suppressed - self._summarized
        if unsummarized and (self._summarized == 0 or self._reports % REPEAT_SUMMARY_EVERY == 0):
            self._summarized = self.rows_suppressed
            logger.warning(
                f"{REPEATS_PREFIX} {unsummarized} row(s) of corruption already reported and still "
                f"present were not printed again ({self.rows_suppressed} suppressed in total)"
            )
        if drop_line:
            logger.warning(drop_line)

    def _read_rows(self, *, first: int, end: int) -> list[ViolationRow]:
        """The stored rows of indices ``[first, end)`` (synchronous: cold path only)."""
        capacity = self._capacity
        last = min(end, first + capacity)
        slots = [index % capacity for index in range(first, last)]
        start = slots[0]
        if start + len(slots) <= capacity:
            values = self._ring[start : start + len(slots)].cpu().tolist()
        else:
            split = capacity - start
            values = (
                self._ring[start:].cpu().tolist() + self._ring[: len(slots) - split].cpu().tolist()
            )
        return [
            ViolationRow.from_ring_row(row)
            for index, row in zip(range(first, last), values)
            if row[ROW_INDEX] == index
        ]

    def _repeat_flags(self, rows: list[ViolationRow]) -> list[bool]:
        """For each row: whether it continues a corruption reported one step earlier (or in
        this step), so log mode does not print it."""
        flags: list[bool] = []
        for row in rows:
            key = (int(row.check), row.req_pool_idx, row.slot, row.position, row.reasons)
            last = self._last_step.pop(key, None)
            self._last_step[key] = row.step
            flags.append(last is not None and 0 <= row.step - last <= 1)
        while len(self._last_step) > MAX_TRACKED_KEYS:
            self._last_step.popitem(last=False)
        return flags
