"""Host-side watch over the device counters: violations, health and stats, without host syncs.

Per forward step the runtime calls :meth:`CanaryMonitor.poll` before the forward (report new
violation rows: the newest publication of the counters that arrived is read whole when its
violation counter moved, and every few polls), :meth:`CanaryMonitor.publish`
after the forward's canary launches (eagerly, or captured into its decode graph: see
:mod:`.counter_mailbox`), and :meth:`CanaryMonitor.after_forward` after it (label the publication
with the host's counts, run the periodic health check and stats line on the newest snapshot
read). A violation produced by forward N is therefore reported at the first poll after the
publication of forward N arrived: normally the next step. While the scheduler is idle
(:meth:`CanaryMonitor.poll_idle`, from its idle loop, which in overlap mode passes several times
per forward) it polls at the first idle pass after a forward, then at most once per
:data:`IDLE_POLL_INTERVAL_S`, and logs the idle line (:func:`.stats.idle_line`) once the
publication of the last forward has been read: the report of every forward so far is complete.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Protocol

from sglang.jit_kernel.kv_canary.kernel_inputs import CanaryDeviceState
from sglang.srt.kv_canary.config import CanaryConfig
from sglang.srt.kv_canary.monitor.health import CanaryHealthError, HealthChecker
from sglang.srt.kv_canary.monitor.counter_mailbox import CounterMailbox
from sglang.srt.kv_canary.monitor.counter_snapshots import ZERO_SNAPSHOT, CounterSnapshot
from sglang.srt.kv_canary.monitor.stats import idle_line, next_multiple, stats_due, stats_line
from sglang.srt.kv_canary.monitor.violation_reporter import ReportSink, ViolationReporter

logger = logging.getLogger(__name__)

IDLE_POLL_INTERVAL_S = 0.001  # idle passes without a forward in between poll at most this often
# a poll that finds the violation counter unchanged reads the whole publication only this often
# (the newest snapshot then trails by a few steps: far below health.MAX_SNAPSHOT_LAG_STEPS)
WHOLE_READ_EVERY_POLLS = 8
SETTLE_TRIES = 100_000  # poll_settled's reads at most (each a few microseconds)


class MonitorMetrics(Protocol):
    """Told what the monitor learned on the host (the prometheus metrics, :mod:`.metrics`)."""

    def snapshot_read(self, *, previous: CounterSnapshot, latest: CounterSnapshot) -> None:
        """The newest snapshot read went from ``previous`` to ``latest``. Must not raise."""
        ...

    def health_checked(self, *, ok: bool) -> None:
        """A periodic health check ran (``ok``: it passed). Must not raise."""
        ...


class CanaryMonitor:
    """Owns the counter mailbox, the violation reporter, the health checker and the stats line."""

    def __init__(
        self,
        *,
        state: CanaryDeviceState,
        config: CanaryConfig,
        seal: Callable[..., None],
        line_suffix: str = "",
        clock: Callable[[], float] = time.monotonic,
        mailbox: CounterMailbox | None = None,
        report_sink: ReportSink | None = None,
        metrics: MonitorMetrics | None = None,
    ) -> None:
        """``seal`` is the publish launch (``seal(counters=...)``, see :class:`CounterMailbox`);
        ``line_suffix`` ends every violation, health and stats line (`` pool=draft`` for an
        EAGLE draft model's canary); ``clock`` (seconds) paces :meth:`poll_idle`; ``mailbox``
        replaces the mailbox of ``state``'s counters (tests: one whose copies land late);
        ``report_sink`` receives every report of the violation reporter (the report file, the
        metrics); ``metrics`` is told of every snapshot read and health check run."""
        self._suffix = line_suffix
        self._metrics = metrics
        self._mailbox = mailbox or CounterMailbox(counters=state.counters, seal=seal)
        self._reporter = ViolationReporter(
            ring=state.ring, counters=state.counters, mode=config.mode, line_suffix=line_suffix,
            sink=report_sink,
        )
        self._health = HealthChecker(every_n_steps=config.health_check_every_n_steps)
        self._stats_every = config.stats_print_every_n_steps
        self._latest = ZERO_SNAPSHOT
        self._last_periodic_step = 0
        self._clock = clock
        self._forward_since_idle_poll = False
        self._last_idle_poll = float("-inf")
        self._steps_enqueued = 0  # forward steps with request rows that after_forward saw
        self._idle_line_step = 0  # the step the last idle line covered
        self._polls_since_read = 0  # polls that read only the violation counter (see poll)
        self._periodic_next = False  # the next step runs the health check or prints stats
        # the first step at which the health check or the stats line may be due (0: work it out
        # at the next forward); the steps before it skip both with one comparison
        self._next_periodic_step = 0

    def poll_idle(self) -> None:
        """:meth:`poll` from the scheduler's idle loop: at its first pass after a forward, then
        at most once per :data:`IDLE_POLL_INTERVAL_S` (never waits). The first idle poll that has
        read the publication of the last forward with request rows logs the idle line.

        Raises:
            CanaryViolationError: raise mode and a new violation row arrived.
        """
        now = self._clock()
        if not self._forward_since_idle_poll and now - self._last_idle_poll < IDLE_POLL_INTERVAL_S:
            return
        self._forward_since_idle_poll = False
        self._last_idle_poll = now
        self.poll(whole=True)
        steps = self._steps_enqueued
        if steps > self._idle_line_step and self._latest.steps == steps:
            self._idle_line_step = steps
            logger.info(idle_line(self._latest) + self._suffix)

    def poll(self, *, whole: bool = False) -> None:
        """Report new violation rows, never waiting: when the host copy's violation counter moved
        past the newest snapshot's, or on every :data:`WHOLE_READ_EVERY_POLLS`-th poll (or
        ``whole``, or before a step that runs the health check or prints the stats line), read
        the newest publication that arrived (checksum, label, snapshot); otherwise only that one
        counter word. A violation is still reported at the first poll after its publication
        arrived, and the health check and the stats line read a snapshot as fresh as before.

        Raises:
            CanaryViolationError: raise mode and a new violation row arrived.
        """
        polls = self._polls_since_read + 1
        if (not whole and polls < WHOLE_READ_EVERY_POLLS and not self._periodic_next
                and self._mailbox.peek_violations() == self._latest.violations):
            self._polls_since_read = polls
            return
        self._polls_since_read = 0
        snapshot = self._mailbox.read()
        if snapshot is not None:
            if self._metrics is not None:
                self._metrics.snapshot_read(previous=self._latest, latest=snapshot)
            self._latest = snapshot
            self._reporter.report(violation_count=snapshot.violations)

    def poll_settled(self, *, max_tries: int = SETTLE_TRIES) -> bool:
        """:meth:`poll` (whole) until the read did not catch a copy landing, at most
        ``max_tries`` reads. The caller knows the publication it needs has landed (it waited for
        an event recorded after it): only a newer one still being copied can spoil the read, and
        that copy of a few hundred bytes lands within microseconds. Abort mode's containment
        point (:mod:`sglang.srt.kv_canary.containment`).

        Returns:
            False when every read was torn (the rows then come at the next poll).
        Raises:
            CanaryViolationError: raise mode and a new violation row arrived.
        """
        for _ in range(max_tries):
            self.poll(whole=True)
            if not getattr(self._mailbox, "last_read_torn", False):
                return True
        return False

    @property
    def latest(self) -> CounterSnapshot:
        """The newest counter snapshot read so far."""
        return self._latest

    @property
    def landed_publications(self) -> Callable[[], int]:
        """The newest counter publication that reached the host, as a function (the mailbox's
        :meth:`~CounterMailbox.peek_publications`): the upload ring's clock. Never waits."""
        return self._mailbox.peek_publications

    def publish(self) -> None:
        """Publish the counters after a forward's canary launches, on the current stream (eagerly
        or into a graph being captured); never waits."""
        self._mailbox.publish()

    def after_forward(
        self, *, steps: int, launches: int, sweep_launches: int = 0, publications: int
    ) -> None:
        """Label the forward's publication; periodic health and stats.

        Args:
            steps: forward steps with request rows completed, this one included.
            launches: canary launch pairs the host has enqueued so far.
            sweep_launches: radix sweep launches the host has enqueued so far.
            publications: counter publications the host has enqueued so far (eager and
                replayed), the newest after every launch counted above; equal to the last
                call's when this forward published nothing.
        Raises:
            CanaryHealthError: the periodic health check failed.
        """
        self._mailbox.label(
            publications=publications, steps=steps, launches=launches,
            sweep_launches=sweep_launches,
        )
        self._forward_since_idle_poll = True
        self._steps_enqueued = steps
        if steps == self._last_periodic_step:
            return  # a forward without request rows: nothing new to check or print
        self._last_periodic_step = steps
        following = steps + 1  # the next poll reads whole before a periodic step
        if steps < self._next_periodic_step:
            self._periodic_next = following == self._next_periodic_step
            return
        self._next_periodic_step = self._periodic_step_after(steps)
        self._periodic_next = following == self._next_periodic_step
        try:
            health_line = self._health.check(steps=steps, latest=self._latest)
        except CanaryHealthError:
            if self._metrics is not None:
                self._metrics.health_checked(ok=False)
            raise
        if health_line is not None:
            if self._metrics is not None:
                self._metrics.health_checked(ok=True)
            logger.info(health_line + self._suffix)
        if stats_due(steps=steps, every_n_steps=self._stats_every):
            logger.info(stats_line(self._latest) + self._suffix)

    def _periodic_step_after(self, steps: int) -> int:
        """The first step after ``steps`` at which the health check or the stats line is due."""
        following = steps + 1
        health = self._health.next_due(steps=following)
        if self._stats_every <= 0:
            return health
        return min(health, next_multiple(steps=following, every_n_steps=self._stats_every))

    def discard_pending(self) -> None:
        """Forget the publications and the violations handled so far (the device counters were
        just reset and the device synchronized: violation indices start again at 0)."""
        self._mailbox.reset()
        self._latest = ZERO_SNAPSHOT
        self._polls_since_read = 0
        self._periodic_next = False
        self._last_periodic_step = 0
        self._next_periodic_step = 0
        self._steps_enqueued = 0
        self._idle_line_step = 0
        self._reporter.restart()
