"""Liveness of the canary: every forward runs it, exactly once, and the device agrees.

A detector that silently stopped (a lost wrapper, a graph captured without the canary, a model
replaced at run time) reports zero violations forever. Two checks, both raising in every mode:

* per forward (:meth:`CanaryRunner.run_forward
  <sglang.srt.kv_canary.runner.canary_runner.CanaryRunner.run_forward>`): the host counts the
  canary launch pairs each forward enqueued (eager calls, and per graph replay the launches that
  were captured into that graph); a forward with request rows must account for exactly one;
* device agreement (:class:`HealthChecker`, every ``health_check_every_n_steps`` forward steps,
  on the counter snapshots the monitor already consumed, so it never synchronizes): each
  per-forward kernel's run counter must *equal* the number of launches the host had enqueued
  when the snapshot was taken (and the sweep's run counter the host's sweep launches). Exact,
  not "at least": extra runs (capture warm-ups, idle replays) cannot hide a forward that
  skipped the canary.
"""

from __future__ import annotations

from sglang.jit_kernel.kv_canary.consts import CheckKind
from sglang.srt.kv_canary.monitor.counter_snapshots import ZERO_SNAPSHOT, CounterSnapshot
from sglang.srt.kv_canary.monitor.stats import next_multiple

PER_FORWARD_KINDS: tuple[CheckKind, ...] = (
    CheckKind.PRE_VERIFY,
    CheckKind.POST_VERIFY,
    CheckKind.WRITE,
)
HEALTH_OK_PREFIX = "kv_canary health ok:"
# The snapshots read may trail the host by a few steps (the device runs behind); trailing by
# more than this many steps at a check means the publication path itself stopped.
MAX_SNAPSHOT_LAG_STEPS = 64


class CanaryHealthError(RuntimeError):
    """The canary path is not executing; raised in every mode."""


class HealthChecker:
    """Compares the device's kernel run counters with the host's launch count."""

    def __init__(self, *, every_n_steps: int) -> None:
        if every_n_steps < 1:
            raise ValueError(f"every_n_steps must be >= 1, got {every_n_steps}")
        self._every = every_n_steps
        self._baseline = ZERO_SNAPSHOT

    def due(self, *, steps: int) -> bool:
        """Whether :meth:`check` runs after ``steps`` forward steps."""
        return steps % self._every == 0

    def next_due(self, *, steps: int) -> int:
        """The first step count from ``steps`` on at which :meth:`check` runs."""
        return next_multiple(steps=steps, every_n_steps=self._every)

    def check(self, *, steps: int, latest: CounterSnapshot) -> str | None:
        """Run the check when ``steps`` (forward steps completed) is a multiple of the interval.

        Returns:
            The "health ok" line when a check ran, else None.
        Raises:
            CanaryHealthError: a per-forward kernel's run counter differs from the host's launch
                count, or the counter snapshots stopped arriving.
        """
        if not self.due(steps=steps):
            return None
        lag = steps - latest.steps
        if lag > max(MAX_SNAPSHOT_LAG_STEPS, 2 * self._every):
            raise CanaryHealthError(
                f"KV canary health check failed: canary path is not executing: the newest "
                f"counter snapshot is from step {latest.steps}, {lag} steps behind step {steps} "
                "(the device's counter publications stopped arriving)"
            )
        runs = {kind: latest.kernel_runs(kind) for kind in PER_FORWARD_KINDS}
        expected = {kind: latest.launches for kind in PER_FORWARD_KINDS}
        runs[CheckKind.SWEEP] = latest.kernel_runs(CheckKind.SWEEP)
        expected[CheckKind.SWEEP] = latest.sweep_launches
        wrong = [kind for kind, count in runs.items() if count != expected[kind]]
        summary = ", ".join(f"{kind.name.lower()} {count}" for kind, count in runs.items())
        window = f"steps {self._baseline.steps}..{latest.steps}"
        if wrong:
            names = ", ".join(kind.name.lower() for kind in wrong)
            raise CanaryHealthError(
                f"KV canary health check failed: canary path is not executing as it must: at "
                f"step {latest.steps} the host had enqueued {latest.launches} canary launches "
                f"and {latest.sweep_launches} sweep launches but the device counted {summary} "
                f"({names} differ). Corruption would go unreported."
            )
        self._baseline = latest
        return f"{HEALTH_OK_PREFIX} {window}: {latest.launches} launches, kernel runs {summary}"
