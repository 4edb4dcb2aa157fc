"""The host side of violation reporting: the counter mailbox gives the newest labeled publication
and ignores reads that mix two copies (never waits), a graph replay publishes with no host work,
violations surface one step late, idle passes poll after a forward and then at most once per
interval, each ring row is reported once,
the host's consumed count frees ring rows for reuse, ring overflow is reported with the number of
dropped rows, raise mode raises with the lines."""

import logging
import sys

import pytest
import torch

from sglang.jit_kernel.kv_canary import publish_counters_ref
from sglang.jit_kernel.kv_canary.consts import (
    COUNTER_CHECKSUM,
    COUNTER_CONSUMED,
    COUNTER_KERNEL_RUNS,
    COUNTER_PUBLISHES,
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
from sglang.srt.kv_canary.monitor.monitor import (
    IDLE_POLL_INTERVAL_S,
    WHOLE_READ_EVERY_POLLS,
    CanaryMonitor,
)
from sglang.srt.kv_canary.monitor.counter_mailbox import CounterMailbox
from sglang.srt.kv_canary.monitor.health import HEALTH_OK_PREFIX, PER_FORWARD_KINDS
from sglang.srt.kv_canary.monitor.violation_reporter import (
    REPEATS_PREFIX,
    RING_OVERFLOW_PREFIX,
    ViolationReporter,
)
from sglang.srt.kv_canary.monitor.stats import IDLE_LINE_RE
from sglang.srt.kv_canary.monitor.violations import CanaryViolationError, find_violation_rows
from sglang.test.ci.ci_register import register_cpu_ci, register_cuda_ci

register_cpu_ci(est_time=5, suite="kv-canary-cpu")
register_cuda_ci(est_time=5, suite="kv-canary-gpu")


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


_SEAL = publish_counters_ref.launch_publish_counters


def _mailbox_with_publications(counters: torch.Tensor, count: int) -> CounterMailbox:
    """A mailbox whose counters were published ``count`` times, publication ``n`` labeled with
    steps ``n``, launches ``10 n`` and sweep launches ``n - 1``; nothing read yet."""
    mailbox = CounterMailbox(counters=counters, seal=_SEAL)
    for number in range(1, count + 1):
        counters[COUNTER_VIOLATIONS] += 1
        mailbox.publish()
        mailbox.label(publications=number, steps=number, launches=10 * number,
                      sweep_launches=number - 1)
    return mailbox


def test_mailbox_reads_the_newest_labeled_publication_once() -> None:
    counters = torch.zeros(NUM_COUNTERS, dtype=torch.int64)
    mailbox = _mailbox_with_publications(counters, 3)
    snapshot = mailbox.read()
    assert (snapshot.steps, snapshot.launches, snapshot.sweep_launches) == (3, 30, 2)
    assert snapshot.counters == tuple(counters.tolist()) and snapshot.violations == 3
    assert mailbox.read() is None  # nothing newer
    mailbox.label(publications=3, steps=99, launches=99, sweep_launches=99)  # a forward that
    counters[COUNTER_VIOLATIONS] += 1  # published nothing keeps the label it had
    mailbox.publish()
    mailbox.label(publications=4, steps=4, launches=40, sweep_launches=3)
    assert (mailbox.read().steps, mailbox.read()) == (4, None)


def test_mailbox_ignores_a_read_that_mixes_two_publications() -> None:
    """The host may read while a copy lands: any mix of two publications' words fails the
    checksum; the whole copy, once landed, is read."""
    counters = torch.zeros(NUM_COUNTERS, dtype=torch.int64)
    mailbox = _mailbox_with_publications(counters, 1)
    older = mailbox._words.copy()
    counters[COUNTER_KERNEL_RUNS + CheckKind.PRE_VERIFY] += 1
    counters[COUNTER_VIOLATIONS] += 2
    mailbox.publish()
    mailbox.label(publications=2, steps=2, launches=20, sweep_launches=1)
    newer = mailbox._words.copy()
    changed = [index for index in range(NUM_COUNTERS) if older[index] != newer[index]]
    assert len(changed) == 4 and {COUNTER_PUBLISHES, COUNTER_CHECKSUM} < set(changed)
    for mask in range(1, (1 << len(changed)) - 1):  # every proper mix of the two copies
        mailbox._words[:] = older
        for bit, index in enumerate(changed):
            if mask >> bit & 1:
                mailbox._words[index] = newer[index]
        assert mailbox.read() is None, [changed[b] for b in range(len(changed)) if mask >> b & 1]
    mailbox._words[:] = newer
    assert mailbox.read().steps == 2


def test_mailbox_skips_an_unlabeled_publication_and_forgets_everything_at_reset() -> None:
    counters = torch.zeros(NUM_COUNTERS, dtype=torch.int64)
    mailbox = _mailbox_with_publications(counters, 1)
    mailbox.publish()  # publication 2: a graph warm-up outside any forward, never labeled
    assert mailbox.read() is None
    mailbox.publish()
    mailbox.label(publications=3, steps=2, launches=20, sweep_launches=0)
    assert mailbox.read().launches == 20
    counters.zero_()
    mailbox.reset()
    assert mailbox.read() is None and not mailbox._words.any()
    mailbox.publish()
    mailbox.label(publications=1, steps=1, launches=1, sweep_launches=0)
    assert mailbox.read().steps == 1


def _monitor(state: _State, *, mode: CanaryMode = CanaryMode.LOG,
             mailbox: CounterMailbox | None = None, **config: int) -> CanaryMonitor:
    return CanaryMonitor(state=state, config=CanaryConfig(mode=mode, **config), seal=_SEAL,
                         mailbox=mailbox)


def _counting_reads(state: _State, reads: list, record) -> CounterMailbox:
    """A mailbox of ``state``'s counters whose whole reads append ``record()`` to ``reads``."""
    mailbox = CounterMailbox(counters=state.counters, seal=_SEAL)
    mailbox.read = (lambda read=mailbox.read: reads.append(record()) or read())
    return mailbox


def _forward(monitor: CanaryMonitor, step: int) -> None:
    """The host side of forward ``step`` (1-based): one launch pair, its publication."""
    monitor.publish()
    monitor.after_forward(steps=step, launches=step, publications=step)


class _UnlandedCopies:
    """A mailbox's host copy whose copies have not landed until :meth:`land` (what a CPU copy
    cannot show by itself): the words hold what they were, the newest copy waits."""

    def __init__(self) -> None:
        self._words = torch.zeros(NUM_COUNTERS, dtype=torch.int64).numpy()
        self._newest = self._words.copy()

    def numpy(self):
        return self._words

    def copy_(self, source: torch.Tensor, *, non_blocking: bool) -> None:
        self._newest = source.numpy().copy()

    def land(self) -> None:
        self._words[:] = self._newest


def test_violation_surfaces_at_the_next_poll_and_only_once(caplog) -> None:
    state = _State()
    monitor = _monitor(state)
    caplog.set_level(logging.INFO, logger="sglang.srt.kv_canary")
    monitor.poll()
    state.add_violation(position=5, step=0)  # forward 0 finds a violation
    _forward(monitor, 1)
    assert not find_violation_rows(caplog.text)  # not during the step that produced it
    monitor.poll()  # start of the next step
    rows = find_violation_rows(caplog.text)
    assert [(r.position, r.step) for r in rows] == [(5, 0)]
    assert all(rec.levelno == logging.WARNING for rec in caplog.records
               if "kv_canary violation" in rec.getMessage())
    _forward(monitor, 2)
    monitor.poll()
    assert len(find_violation_rows(caplog.text)) == 1


def test_an_unlanded_copy_delays_the_report_without_waiting(caplog) -> None:
    state = _State()
    copies = _UnlandedCopies()
    monitor = _monitor(state, mailbox=CounterMailbox(counters=state.counters, seal=_SEAL,
                                                     host=copies))
    state.add_violation(position=3, step=0)
    _forward(monitor, 1)
    monitor.poll()  # the copy has not landed: nothing yet, and no blocking
    assert not find_violation_rows(caplog.text)
    copies.land()
    monitor.poll()
    assert len(find_violation_rows(caplog.text)) == 1


def test_idle_passes_poll_after_a_forward_then_at_most_once_per_interval(caplog) -> None:
    state = _State()
    now = [100.0]
    copies = _UnlandedCopies()
    reads = []
    mailbox = CounterMailbox(counters=state.counters, seal=_SEAL, host=copies)
    mailbox.read = (lambda read=mailbox.read: reads.append(now[0]) or read())
    monitor = CanaryMonitor(state=state, config=CanaryConfig(mode=CanaryMode.LOG), seal=_SEAL,
                            clock=lambda: now[0], mailbox=mailbox)
    state.add_violation(position=3, step=0)
    _forward(monitor, 1)
    monitor.poll_idle()  # the first idle pass after a forward polls (the copy is in flight)
    monitor.poll_idle()  # the next passes within the interval do not
    now[0] += IDLE_POLL_INTERVAL_S / 2
    monitor.poll_idle()
    assert reads == [100.0] and not find_violation_rows(caplog.text)
    copies.land()
    now[0] += IDLE_POLL_INTERVAL_S  # more than one interval after the last idle poll
    monitor.poll_idle()
    assert len(reads) == 2 and len(find_violation_rows(caplog.text)) == 1
    _forward(monitor, 2)  # a forward: the next idle pass polls at once
    monitor.poll_idle()
    assert len(reads) == 3
    state.add_violation(position=5, step=1)
    _forward(monitor, 3)
    copies.land()
    monitor.poll()  # a forward's own poll is never paced: the new violation is reported
    assert len(reads) == 4 and len(find_violation_rows(caplog.text)) == 2


def test_the_idle_line_follows_the_read_of_the_last_forwards_publication(caplog) -> None:
    """Once per idle period, and only when the publication of the last forward has been read
    (its violation rows reported before the line): readers of the log wait for it."""
    caplog.set_level(logging.INFO, logger="sglang.srt.kv_canary")
    state = _State()
    now = [100.0]
    copies = _UnlandedCopies()
    monitor = CanaryMonitor(state=state, config=CanaryConfig(mode=CanaryMode.LOG), seal=_SEAL,
                            clock=lambda: now[0],
                            mailbox=CounterMailbox(counters=state.counters, seal=_SEAL,
                                                   host=copies))

    def idle_lines() -> list[tuple[int, int]]:
        return [(int(m["steps"]), int(m["violations"]))
                for m in map(IDLE_LINE_RE.search, caplog.text.splitlines()) if m]

    def idle_pass() -> None:
        now[0] += IDLE_POLL_INTERVAL_S
        monitor.poll_idle()

    idle_pass()
    assert idle_lines() == []  # no forward yet
    state.add_violation(position=3, step=0)
    _forward(monitor, 1)
    idle_pass()  # the copy is in flight: the report is not complete
    assert idle_lines() == []
    copies.land()
    idle_pass()
    assert idle_lines() == [(1, 1)]
    text = caplog.text
    assert text.index("position=3") < text.index("KV canary idle")  # the row came first
    idle_pass()
    idle_pass()
    assert idle_lines() == [(1, 1)]  # once per idle period
    _forward(monitor, 2)
    _forward(monitor, 3)
    copies.land()
    idle_pass()
    assert idle_lines() == [(1, 1), (3, 1)]


def test_polls_read_the_whole_publication_only_when_violations_moved_or_every_few_polls(
    caplog,
) -> None:
    """A forward's poll reads one counter word; it reads the whole publication (checksum, label,
    snapshot) when that word moved past the newest snapshot's, and every WHOLE_READ_EVERY_POLLS
    polls, so the snapshots the health check reads stay fresh."""
    state = _State()
    reads = []
    monitor = CanaryMonitor(state=state, config=CanaryConfig(mode=CanaryMode.LOG), seal=_SEAL,
                            mailbox=_counting_reads(state, reads, lambda: 1))
    for step in range(1, 2 * WHOLE_READ_EVERY_POLLS + 1):
        _forward(monitor, step)
        monitor.poll()
    assert len(reads) == 2  # no violation: the periodic whole reads only
    assert monitor.latest.steps == 2 * WHOLE_READ_EVERY_POLLS
    state.add_violation(position=7, step=3)
    _forward(monitor, 2 * WHOLE_READ_EVERY_POLLS + 1)
    monitor.poll()  # the word moved: read whole and reported at once
    assert len(reads) == 3 and [r.position for r in find_violation_rows(caplog.text)] == [7]
    monitor.poll()
    assert len(reads) == 3


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
    _forward(monitor, 1)
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
        _forward(monitor, step)
    stats = [m for m in caplog.messages if m.startswith("KV canary stats:")]
    assert len(stats) == 2
    assert stats[-1].endswith("0 violations, 3 steps")  # the newest consumed snapshot: step 3


def test_health_checks_and_stats_lines_come_at_their_multiples_after_a_whole_read(
    caplog,
) -> None:
    """With the health check every 3 steps and the stats line every 5, they run at exactly those
    multiples (a forward without request rows repeats its step and runs neither), the poll before
    each reads the whole publication, and after the counters are discarded (serving starts, steps
    count from 1 again) the multiples start over."""
    caplog.set_level(logging.INFO, logger="sglang.srt.kv_canary")
    state = _State()
    whole_reads: list[int] = []
    polled_step = [0]
    monitor = _monitor(state, stats_print_every_n_steps=5, health_check_every_n_steps=3,
                       mailbox=_counting_reads(state, whole_reads, lambda: polled_step[0]))

    def serve(steps: int) -> tuple[list[int], list[int]]:
        caplog.clear()
        health, stats = [], []
        for step in range(1, steps + 1):
            polled_step[0] = step
            monitor.poll()
            for kind in PER_FORWARD_KINDS:
                state.counters[COUNTER_KERNEL_RUNS + kind] += 1
            lines = len(caplog.messages)
            _forward(monitor, step)
            if step % 4 == 0:  # an IDLE forward: the same step, nothing published
                monitor.after_forward(steps=step, launches=step, publications=step)
            new = caplog.messages[lines:]
            health += [step] * sum(m.startswith(HEALTH_OK_PREFIX) for m in new)
            stats += [step] * sum(m.startswith("KV canary stats:") for m in new)
        return health, stats

    health, stats = serve(30)
    assert health == list(range(3, 31, 3))
    assert stats == list(range(5, 31, 5))
    periodic = set(health) | set(stats)
    assert periodic <= set(whole_reads)  # the snapshot they read is the step before's
    state.counters.zero_()
    monitor.discard_pending()
    health, stats = serve(7)
    assert (health, stats) == ([3, 6], [5])


def test_discarded_publications_are_never_reported(caplog) -> None:
    """Serving starts: the counters are zeroed and publications made before are forgotten."""
    state = _State()
    monitor = _monitor(state)
    state.add_violation(position=4, step=0)  # a start-up forward's row
    _forward(monitor, 1)
    state.counters.zero_()
    monitor.discard_pending()
    monitor.poll()
    _forward(monitor, 1)
    monitor.poll()
    assert find_violation_rows(caplog.text) == []


def test_reporter_rejects_mode_none() -> None:
    with pytest.raises(ValueError, match="log or raise"):
        ViolationReporter(ring=torch.zeros((1, RING_ROW_FIELDS), dtype=torch.int64),
                          counters=torch.zeros((NUM_COUNTERS,), dtype=torch.int64),
                          mode=CanaryMode.NONE)


def _cuda_state() -> _State:
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    state = _State()
    state.counters = state.counters.cuda()
    return state


@pytest.mark.gpu
def test_a_cuda_publication_arrives_behind_the_stream_work_before_it() -> None:
    """The Triton publish launch and the pinned copy run on the current stream: behind a side
    stream busy for a while, the host reads nothing new until that work is done, then reads the
    publication without any event or sync of its own."""
    from sglang.jit_kernel.kv_canary import publish_counters

    state = _cuda_state()
    mailbox = CounterMailbox(counters=state.counters,
                             seal=publish_counters.launch_publish_counters)
    # warm-up: the first launch of a kernel loads its module, which waits for the device
    mailbox.publish()
    torch.cuda._sleep(1000)
    state.counters[COUNTER_VIOLATIONS] += 0
    torch.cuda.synchronize()
    mailbox.reset()
    state.counters.zero_()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        torch.cuda._sleep(1_000_000_000)  # ~0.5 s of GPU cycles
        state.counters[COUNTER_VIOLATIONS] += 7
        mailbox.publish()
    mailbox.label(publications=1, steps=1, launches=1, sweep_launches=0)
    assert mailbox.read() is None  # still behind the sleep on `side`
    side.synchronize()
    snapshot = mailbox.read()
    assert (snapshot.steps, snapshot.violations) == (1, 7)
    assert snapshot.counters == tuple(state.counters.tolist())


@pytest.mark.gpu
def test_a_replayed_cuda_graph_publishes_with_no_host_work() -> None:
    """A publication captured into a CUDA graph: each replay seals and copies the counters; the
    host only labels the publications and reads the newest."""
    from sglang.jit_kernel.kv_canary import publish_counters

    state = _cuda_state()
    mailbox = CounterMailbox(counters=state.counters,
                             seal=publish_counters.launch_publish_counters)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        mailbox.publish()  # warm-up outside the capture
        stream.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            state.counters[COUNTER_KERNEL_RUNS + CheckKind.PRE_VERIFY] += 1
            mailbox.publish()
    torch.cuda.synchronize()
    state.counters.zero_()
    mailbox.reset()
    for number in range(1, 6):
        graph.replay()
        mailbox.label(publications=number, steps=number, launches=number, sweep_launches=0)
    torch.cuda.synchronize()
    snapshot = mailbox.read()
    assert (snapshot.steps, snapshot.kernel_runs(CheckKind.PRE_VERIFY)) == (5, 5)
    assert snapshot.counters[COUNTER_PUBLISHES] == 5


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
