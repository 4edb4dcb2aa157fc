"""The host side of violation reporting: counter snapshots are read only once their copy
completed (never waited for), violations surface one step late, idle passes poll after a
forward and then at most once per interval, each ring row is reported once,
the host's consumed count frees ring rows for reuse, ring overflow is reported with the number of
dropped rows, raise mode raises with the lines."""

import logging
import sys
from collections.abc import Callable

import pytest
import torch

from sglang.jit_kernel.kv_canary.consts import (
    COUNTER_CONSUMED,
    COUNTER_KERNEL_RUNS,
    COUNTER_VIOLATIONS,
    NUM_COUNTERS,
    RING_ROW_FIELDS,
    ROW_CHECK,
    ROW_INDEX,
    ROW_POSITION,
    ROW_REASONS,
    ROW_STEP,
    CheckKind,
    Reason,
)
from sglang.srt.kv_canary.config import CanaryConfig, CanaryMode
from sglang.srt.kv_canary.monitor.monitor import IDLE_POLL_INTERVAL_S, CanaryMonitor
from sglang.srt.kv_canary.monitor.counter_snapshots import (
    CounterSnapshotPipe,
    CurrentStreamEvent,
    HostEvent,
)
from sglang.srt.kv_canary.monitor.violation_reporter import (
    REPEATS_PREFIX,
    RING_OVERFLOW_PREFIX,
    ViolationReporter,
)
from sglang.srt.kv_canary.monitor.violations import CanaryViolationError, find_violation_rows
from sglang.test.ci.ci_register import register_cpu_ci, register_cuda_ci

register_cpu_ci(est_time=5, suite="kv-canary-cpu")
register_cuda_ci(est_time=5, suite="kv-canary-gpu")


class _ManualEvent:
    """An event the test completes by hand (the pipe can only query it, never wait on it)."""

    def __init__(self, record_order: list | None = None) -> None:
        self.done = False
        self._record_order = record_order if record_order is not None else []

    def record(self) -> None:
        self._record_order.append(self)
        self.done = False

    def query(self) -> bool:
        return self.done


class _State:
    """The two tensors the monitor reads (ring, counters), on the CPU."""

    def __init__(self, *, ring_capacity: int = 8) -> None:
        self.ring = torch.zeros((ring_capacity, RING_ROW_FIELDS), dtype=torch.int64)
        self.counters = torch.zeros((NUM_COUNTERS,), dtype=torch.int64)

    def add_violation(self, *, position: int, step: int) -> None:
        """What a kernel does: reserve index ``n`` at the counter, store the row (with ``n``) at
        ``ring[n % capacity]`` while ``n - consumed < capacity``, else drop it; count it."""
        index = int(self.counters[COUNTER_VIOLATIONS])
        capacity = self.ring.shape[0]
        if index - int(self.counters[COUNTER_CONSUMED]) < capacity:
            row = self.ring[index % capacity]
            row.zero_()
            row[ROW_CHECK] = int(CheckKind.PRE_VERIFY)
            row[ROW_REASONS] = int(Reason.VERIFY_POSITION)
            row[ROW_POSITION] = position
            row[ROW_STEP] = step
            row[ROW_INDEX] = index
        self.counters[COUNTER_VIOLATIONS] += 1


def test_pipe_reads_a_copy_only_after_its_event_completed() -> None:
    counters = torch.arange(NUM_COUNTERS, dtype=torch.int64)
    recorded: list[_ManualEvent] = []
    pipe = CounterSnapshotPipe(
        counters=counters, new_event=lambda: _ManualEvent(recorded), depth=2
    )
    for steps in (1, 2):
        assert pipe.enqueue(steps=steps, launches=steps, sweep_launches=steps - 1)
        counters += 100  # later device work must not leak into a copy already taken
    assert not pipe.enqueue(steps=3, launches=3, sweep_launches=2)  # both in flight: skipped
    assert pipe.drain() == []
    recorded[1].done = True  # the newer copy alone is not consumed out of order
    assert pipe.drain() == []
    recorded[0].done = True
    first, second = pipe.drain()
    assert (first.steps, first.sweep_launches, first.counters) == (
        1, 0, tuple(range(NUM_COUNTERS))
    )
    assert (second.steps, second.sweep_launches, second.counters) == (
        2, 1, tuple(range(100, 100 + NUM_COUNTERS))
    )
    assert pipe.enqueue(steps=4, launches=4, sweep_launches=2)  # slots are free again


def _monitor(state: _State, *, mode: CanaryMode = CanaryMode.LOG, new_event=HostEvent,
             **config: int) -> CanaryMonitor:
    return CanaryMonitor(
        state=state, config=CanaryConfig(mode=mode, **config), new_event=new_event
    )


def test_violation_surfaces_at_the_next_poll_and_only_once(caplog) -> None:
    state = _State()
    monitor = _monitor(state)
    caplog.set_level(logging.INFO, logger="sglang.srt.kv_canary")
    monitor.poll()
    state.add_violation(position=5, step=0)  # forward 0 finds a violation
    monitor.after_forward(steps=1, launches=1)
    assert not find_violation_rows(caplog.text)  # not during the step that produced it
    monitor.poll()  # start of the next step
    rows = find_violation_rows(caplog.text)
    assert [(r.position, r.step) for r in rows] == [(5, 0)]
    assert all(rec.levelno == logging.WARNING for rec in caplog.records
               if "kv_canary violation" in rec.getMessage())
    monitor.after_forward(steps=2, launches=2)
    monitor.poll()
    assert len(find_violation_rows(caplog.text)) == 1


def _manual_events() -> tuple[list[_ManualEvent], Callable[[], _ManualEvent]]:
    """An event factory for the pipe and the list of the events it made."""
    events: list[_ManualEvent] = []

    def new_event() -> _ManualEvent:
        events.append(_ManualEvent())
        return events[-1]

    return events, new_event


def test_pending_copy_delays_the_report_without_waiting(caplog) -> None:
    state = _State()
    events, new_event = _manual_events()
    monitor = _monitor(state, new_event=new_event)
    state.add_violation(position=3, step=0)
    monitor.after_forward(steps=1, launches=1)
    monitor.poll()  # the device has not finished the copy: nothing yet, and no blocking
    assert not find_violation_rows(caplog.text)
    for event in events:
        event.done = True
    monitor.poll()
    assert len(find_violation_rows(caplog.text)) == 1


def test_idle_passes_poll_after_a_forward_then_at_most_once_per_interval(caplog) -> None:
    state = _State()
    events, new_event = _manual_events()
    now = [100.0]
    monitor = CanaryMonitor(state=state, config=CanaryConfig(mode=CanaryMode.LOG),
                            new_event=new_event, clock=lambda: now[0])
    drains = []
    monitor._pipe.drain = (lambda drain=monitor._pipe.drain: drains.append(now[0]) or drain())
    state.add_violation(position=3, step=0)
    monitor.after_forward(steps=1, launches=1)
    monitor.poll_idle()  # the first idle pass after a forward polls (the copy is in flight)
    monitor.poll_idle()  # the next passes within the interval do not
    now[0] += IDLE_POLL_INTERVAL_S / 2
    monitor.poll_idle()
    assert drains == [100.0] and not find_violation_rows(caplog.text)
    for event in events:
        event.done = True
    now[0] += IDLE_POLL_INTERVAL_S  # more than one interval after the last idle poll
    monitor.poll_idle()
    assert len(drains) == 2 and len(find_violation_rows(caplog.text)) == 1
    monitor.after_forward(steps=2, launches=2)  # a forward: the next idle pass polls at once
    monitor.poll_idle()
    assert len(drains) == 3
    monitor.poll()  # a forward's own poll is never paced
    monitor.poll()
    assert len(drains) == 5


def test_ring_overflow_reports_kept_rows_and_the_dropped_count(caplog) -> None:
    state = _State(ring_capacity=2)
    reporter = ViolationReporter(ring=state.ring, counters=state.counters, mode=CanaryMode.LOG)
    for position in range(5):
        state.add_violation(position=position, step=0)
    reporter.report(violation_count=5)
    assert [r.position for r in find_violation_rows(caplog.text)] == [0, 1]
    assert int(state.counters[COUNTER_CONSUMED]) == 5  # indices 0..4 handled: the ring is free
    overflow = [m for m in caplog.messages if m.startswith(RING_OVERFLOW_PREFIX)]
    assert overflow == [
        f"{RING_OVERFLOW_PREFIX} 3 violation row(s) were dropped (3 in total): more than 2 rows "
        "arrived between two reads by the host; set SGLANG_KV_CANARY_RING_CAPACITY to keep more"
    ]
    assert (reporter.rows_reported, reporter.rows_dropped) == (2, 3)
    # The ring is reused once consumed (it used to stop after its first `capacity` rows): index 5
    # lands in ring row 1 and is reported; nothing more is dropped.
    state.add_violation(position=9, step=1)
    reporter.report(violation_count=6)
    assert [r.position for r in find_violation_rows(caplog.text)] == [0, 1, 9]
    assert sum(m.startswith(RING_OVERFLOW_PREFIX) for m in caplog.messages) == 1
    reporter.report(violation_count=6)  # nothing new: nothing more reported
    assert len(find_violation_rows(caplog.text)) == 3
    # Three rows between two reads: two fit, the third is dropped and counted.
    for position in (20, 21, 22):
        state.add_violation(position=position, step=2)
    reporter.report(violation_count=9)
    assert [r.position for r in find_violation_rows(caplog.text)][3:] == [20, 21]
    assert caplog.messages[-1].startswith(
        f"{RING_OVERFLOW_PREFIX} 1 violation row(s) were dropped (4 in total)"
    )
    assert (reporter.rows_reported, reporter.rows_dropped) == (5, 4)
    assert int(state.counters[COUNTER_CONSUMED]) == 9


def test_a_ring_row_holding_an_older_index_is_not_reported_again(caplog) -> None:
    """A slot still holding an older row (its index differs) is a dropped row, not a report."""
    state = _State(ring_capacity=2)
    reporter = ViolationReporter(ring=state.ring, counters=state.counters, mode=CanaryMode.LOG)
    state.add_violation(position=1, step=0)
    state.add_violation(position=2, step=0)
    reporter.report(violation_count=2)
    state.counters[COUNTER_VIOLATIONS] += 1  # index 2 reserved but its store never landed
    reporter.report(violation_count=3)
    assert [r.position for r in find_violation_rows(caplog.text)] == [1, 2]
    assert reporter.rows_dropped == 1


def test_log_mode_prints_a_persisting_corruption_once_and_summarizes_its_repeats(caplog) -> None:
    """Log mode: a row whose (check, req_pool_idx, slot, position, reasons) was reported one step
    earlier is counted, not printed; one that went away and came back is printed again."""
    state = _State(ring_capacity=8)
    reporter = ViolationReporter(ring=state.ring, counters=state.counters, mode=CanaryMode.LOG)
    printed = lambda: [(r.position, r.step) for r in find_violation_rows(caplog.text)]  # noqa: E731
    for step in range(3):  # the same corruption seen by steps 0, 1, 2
        state.add_violation(position=5, step=step)
        reporter.report(violation_count=int(state.counters[COUNTER_VIOLATIONS]))
    assert printed() == [(5, 0)]
    repeats = [m for m in caplog.messages if m.startswith(REPEATS_PREFIX)]
    assert repeats == [
        f"{REPEATS_PREFIX} 1 row(s) of corruption already reported and still present were not "
        "printed again (1 suppressed in total)"
    ]  # the first summary comes at once; later ones at most every REPEAT_SUMMARY_EVERY reports
    state.add_violation(position=6, step=3)  # a different corruption: printed
    state.add_violation(position=5, step=5)  # gone at steps 3 and 4, back at 5: printed again
    reporter.report(violation_count=int(state.counters[COUNTER_VIOLATIONS]))
    assert printed() == [(5, 0), (6, 3), (5, 5)]
    assert (reporter.rows_reported, reporter.rows_suppressed, reporter.rows_dropped) == (3, 2, 0)


def test_raise_mode_raises_with_the_same_lines(caplog) -> None:
    state = _State()
    monitor = _monitor(state, mode=CanaryMode.RAISE)
    state.add_violation(position=7, step=0)
    state.add_violation(position=8, step=0)
    monitor.after_forward(steps=1, launches=1)
    with pytest.raises(CanaryViolationError) as raised:
        monitor.poll()
    assert [r.position for r in raised.value.rows] == [7, 8]
    assert find_violation_rows(str(raised.value)) == list(raised.value.rows)
    assert find_violation_rows(caplog.text) == list(raised.value.rows)  # logged too


def test_stats_line_every_n_steps_from_the_snapshot(caplog) -> None:
    caplog.set_level(logging.INFO, logger="sglang.srt.kv_canary")
    state = _State()
    monitor = _monitor(state, stats_print_every_n_steps=2, health_check_every_n_steps=1000)
    for step in range(1, 5):
        monitor.poll()
        state.counters[COUNTER_KERNEL_RUNS + CheckKind.PRE_VERIFY] += 1
        monitor.after_forward(steps=step, launches=step)
    stats = [m for m in caplog.messages if m.startswith("KV canary stats:")]
    assert len(stats) == 2
    assert stats[-1].endswith("0 violations, 3 steps")  # the newest consumed snapshot: step 3


def test_discarded_copies_are_never_reported(caplog) -> None:
    """Serving starts: the counters are zeroed and copies taken before are forgotten."""
    state = _State()
    monitor = _monitor(state)
    state.add_violation(position=4, step=0)  # a start-up forward's row
    monitor.after_forward(steps=1, launches=1)
    state.counters.zero_()
    monitor.discard_pending()
    monitor.poll()
    monitor.after_forward(steps=1, launches=1)
    monitor.poll()
    assert find_violation_rows(caplog.text) == []


def test_reporter_rejects_mode_none() -> None:
    with pytest.raises(ValueError, match="log or raise"):
        ViolationReporter(ring=torch.zeros((1, RING_ROW_FIELDS), dtype=torch.int64),
                          counters=torch.zeros((NUM_COUNTERS,), dtype=torch.int64),
                          mode=CanaryMode.NONE)


@pytest.mark.gpu
def test_a_cuda_counter_copy_completes_with_the_stream_it_was_enqueued_on() -> None:
    """The pipe's CUDA events are recorded on the current stream (looked up by its raw
    handle): on a side stream busy for a while the copy is not done until that work is."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    device = torch.device("cuda")
    counters = torch.zeros(NUM_COUNTERS, dtype=torch.int64, device=device)
    pipe = CounterSnapshotPipe(counters=counters, new_event=lambda: CurrentStreamEvent(device),
                               depth=2)
    # Warm-up: the first launch of a kernel loads its module, which waits for the device
    torch.cuda._sleep(1000)
    counters[COUNTER_VIOLATIONS] += 0
    torch.cuda.synchronize()
    for _ in range(2):  # a second stream object for the same handle is the same stream
        side = torch.cuda.Stream()
        with torch.cuda.stream(side):
            torch.cuda._sleep(1_000_000_000)  # ~0.5 s of GPU cycles
            counters[COUNTER_VIOLATIONS] += 1
            assert pipe.enqueue(steps=1, launches=1, sweep_launches=0)
        assert pipe.drain() == []  # still behind the sleep on `side`
        side.synchronize()
        (snapshot,) = pipe.drain()
        assert snapshot.violations == int(counters[COUNTER_VIOLATIONS])
    # the default stream (raw handle 0), recorded through the same cache
    torch.cuda._sleep(1_000_000_000)
    counters[COUNTER_VIOLATIONS] += 1
    assert pipe.enqueue(steps=2, launches=2, sweep_launches=0)
    assert pipe.drain() == []  # still behind the sleep on the default stream
    torch.cuda.synchronize()
    assert [s.violations for s in pipe.drain()] == [3]


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
