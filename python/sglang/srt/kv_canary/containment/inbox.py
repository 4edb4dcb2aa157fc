"""The violation rows abort mode has not acted on yet: a :class:`~..monitor.violation_reporter.
ReportSink` beside the report file and the metrics, filled at every poll of the monitor (before
a forward, at the containment point, while idle) and emptied by the containment controller."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sglang.srt.kv_canary.monitor.violations import ViolationRow


@dataclass(frozen=True, slots=True, kw_only=True)
class PendingViolations:
    """Rows reported since the last :meth:`ContainmentInbox.take`, and the rows the ring dropped
    meanwhile (their slots and requests are unknown)."""

    rows: tuple[ViolationRow, ...]
    dropped: int


class ContainmentInbox:
    """Collects every report's rows (repeats included) and dropped count. Host only, cold path."""

    def __init__(self) -> None:
        self._rows: list[ViolationRow] = []
        self._dropped = 0

    def record(
        self, *, rows: Sequence[ViolationRow], repeats: Sequence[bool], dropped: int,
        dropped_total: int, first_index: int, end_index: int,
    ) -> None:
        """Keep the report's rows and drops (never raises)."""
        self._rows.extend(rows)
        self._dropped += dropped

    @property
    def empty(self) -> bool:
        return not self._rows and not self._dropped

    def take(self) -> PendingViolations | None:
        """What arrived since the last call (None: nothing), and forget it."""
        if self.empty:
            return None
        pending = PendingViolations(rows=tuple(self._rows), dropped=self._dropped)
        self._rows.clear()
        self._dropped = 0
        return pending
