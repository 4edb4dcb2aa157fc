"""Cold path: new violation rows of the device ring become log lines or an exception.

Runs only when a counter snapshot shows more violations than were already reported, so the
synchronous read of the ring rows is off the steady-state path.
"""

from __future__ import annotations

import logging

import torch

from sglang.srt.kv_canary.config import CanaryMode
from sglang.srt.kv_canary.monitor.violations import CanaryViolationError, ViolationRow

logger = logging.getLogger(__name__)

RING_OVERFLOW_PREFIX = "kv_canary ring overflow:"


class ViolationReporter:
    """Reports each ring row once: WARNING lines in ``log`` mode, an exception in ``raise`` mode.

    ``counters[COUNTER_VIOLATIONS]`` counts every violation ever produced, including the rows the
    full ring dropped; rows ``[reported, min(count, capacity))`` are the new ones in the ring.
    """

    def __init__(self, *, ring: torch.Tensor, mode: CanaryMode) -> None:
        if mode is CanaryMode.NONE:
            raise ValueError("ViolationReporter needs mode log or raise, got none")
        self._ring = ring
        self._mode = mode
        self._capacity = ring.shape[0]
        self._reported = 0  # violations handled so far (rows read + rows dropped)

    def report(self, *, violation_count: int) -> None:
        """Handle the violations ``[reported, violation_count)``.

        Raises:
            CanaryViolationError: raise mode and there is at least one new violation.
        """
        if violation_count <= self._reported:
            return
        first, end = self._reported, violation_count
        kept_end = min(end, self._capacity)
        rows = []
        if first < kept_end:
            values = self._ring[first:kept_end].cpu().tolist()  # synchronous: cold path only
            rows = [ViolationRow.from_ring_row(row) for row in values]
        dropped = end - max(first, self._capacity) if end > self._capacity else 0
        self._reported = end
        lines = [row.to_line() for row in rows]
        if dropped:
            lines.append(
                f"{RING_OVERFLOW_PREFIX} {dropped} more violation row(s) were dropped "
                f"({end - self._capacity} dropped in total; the ring keeps the first "
                f"{self._capacity} rows, set SGLANG_KV_CANARY_RING_CAPACITY to keep more)"
            )
        if self._mode is CanaryMode.RAISE:
            for line in lines:
                logger.error(line)
            raise CanaryViolationError(rows=rows, lines=lines)
        for line in lines:
            logger.warning(line)
