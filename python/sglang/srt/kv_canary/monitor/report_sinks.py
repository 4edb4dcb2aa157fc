"""Several :class:`~.violation_reporter.ReportSink` objects behind one (the report file and the
prometheus metrics, each optional)."""

from __future__ import annotations

from collections.abc import Sequence

from sglang.srt.kv_canary.monitor.violation_reporter import ReportSink
from sglang.srt.kv_canary.monitor.violations import ViolationRow


class ReportFanOut:
    """Hands each report to every sink, in order (each sink must not raise)."""

    def __init__(self, *, sinks: Sequence[ReportSink]) -> None:
        self.sinks = tuple(sinks)

    def record(
        self, *, rows: Sequence[ViolationRow], repeats: Sequence[bool], dropped: int,
        dropped_total: int, first_index: int, end_index: int,
    ) -> None:
        for sink in self.sinks:
            sink.record(rows=rows, repeats=repeats, dropped=dropped, dropped_total=dropped_total,
                        first_index=first_index, end_index=end_index)


def combine_sinks(*, sinks: Sequence[ReportSink | None]) -> ReportSink | None:
    """The sinks that are not None as one: None for none, the sink itself for one, else a
    :class:`ReportFanOut` (in the order given)."""
    present = [sink for sink in sinks if sink is not None]
    if not present:
        return None
    return present[0] if len(present) == 1 else ReportFanOut(sinks=present)
