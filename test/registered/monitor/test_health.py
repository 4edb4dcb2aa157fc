"""The health check: passes while each per-forward kernel's run counter equals the number of
canary launches the host enqueued and the sweep's run counter the sweep launches it enqueued
(exactly: extra runs fail too), fails loudly (any mode) when one differs or when the counter
snapshots stop arriving."""

import sys

import pytest

from sglang.jit_kernel.kv_canary.consts import COUNTER_KERNEL_RUNS, NUM_COUNTERS, CheckKind
from sglang.srt.kv_canary.monitor.health import (
    HEALTH_OK_PREFIX,
    MAX_SNAPSHOT_LAG_STEPS,
    CanaryHealthError,
    HealthChecker,
)
from sglang.srt.kv_canary.monitor.counter_snapshots import CounterSnapshot
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=3, suite="kv-canary-cpu")


def _snapshot(
    *,
    steps: int,
    launches: int,
    pre: int,
    post: int,
    write: int,
    sweep_launches: int = 0,
    sweep: int = 0,
) -> CounterSnapshot:
    counters = [0] * NUM_COUNTERS
    counters[COUNTER_KERNEL_RUNS + CheckKind.PRE_VERIFY] = pre
    counters[COUNTER_KERNEL_RUNS + CheckKind.POST_VERIFY] = post
    counters[COUNTER_KERNEL_RUNS + CheckKind.WRITE] = write
    counters[COUNTER_KERNEL_RUNS + CheckKind.SWEEP] = sweep
    return CounterSnapshot(
        steps=steps, launches=launches, sweep_launches=sweep_launches, counters=tuple(counters)
    )


def test_checks_only_at_the_interval_and_passes_when_kernels_run() -> None:
    checker = HealthChecker(every_n_steps=10)
    early = _snapshot(steps=4, launches=4, pre=0, post=0, write=0)
    assert checker.check(steps=5, latest=early) is None
    line = checker.check(steps=10, latest=_snapshot(steps=9, launches=8, pre=8, post=8, write=8))
    assert line == (
        f"{HEALTH_OK_PREFIX} steps 0..9: 8 launches, kernel runs pre_verify 8, post_verify 8, "
        "write 8, sweep 0"
    )
    line = checker.check(steps=20, latest=_snapshot(steps=19, launches=18, pre=18, post=18,
                                                    write=18))
    assert line is not None and line.startswith(f"{HEALTH_OK_PREFIX} steps 9..19: 18 launches")


@pytest.mark.parametrize("extra", ["pre", "post", "write"])
def test_extra_runs_fail_too(extra: str) -> None:
    """Exact, not "at least": a run the host did not launch (e.g. a replay of a graph captured
    without the canary being counted) could hide a forward that skipped the canary."""
    checker = HealthChecker(every_n_steps=4)
    runs = {"pre": 2, "post": 2, "write": 2}
    runs[extra] = 3
    with pytest.raises(CanaryHealthError, match="host had enqueued 2 canary launches"):
        checker.check(steps=4, latest=_snapshot(steps=3, launches=2, **runs))


@pytest.mark.parametrize("stopped", ["pre", "post", "write"])
def test_a_stopped_kernel_fails_in_the_next_window(stopped: str) -> None:
    checker = HealthChecker(every_n_steps=10)
    checker.check(steps=10, latest=_snapshot(steps=9, launches=9, pre=9, post=9, write=9))
    runs = {"pre": 19, "post": 19, "write": 19}
    runs[stopped] = 12  # stopped running after 3 of the next 10 launches
    with pytest.raises(CanaryHealthError, match="canary path is not executing") as raised:
        checker.check(steps=20, latest=_snapshot(steps=19, launches=19, **runs))
    name = {"pre": "pre_verify", "post": "post_verify", "write": "write"}[stopped]
    assert f"({name} differ)" in str(raised.value)
    assert f"{name} 12" in str(raised.value)


def test_sweep_runs_must_equal_the_sweep_launches() -> None:
    """The sweep's run counter is compared with the host's sweep launches, exactly, in both
    directions (its launches are not per forward: a pass runs only every N steps)."""
    checker = HealthChecker(every_n_steps=4)
    line = checker.check(steps=4, latest=_snapshot(steps=3, launches=3, pre=3, post=3, write=3,
                                                   sweep_launches=2, sweep=2))
    assert line is not None and line.endswith("write 3, sweep 2")
    for runs in (1, 3):
        with pytest.raises(CanaryHealthError, match=r"and 2 sweep launches .*\(sweep differ\)"):
            checker.check(steps=8, latest=_snapshot(steps=7, launches=7, pre=7, post=7, write=7,
                                                    sweep_launches=2, sweep=runs))


def test_no_launch_needs_no_run() -> None:
    checker = HealthChecker(every_n_steps=3)
    assert checker.check(steps=3, latest=_snapshot(steps=2, launches=0, pre=0, post=0, write=0))


def test_snapshots_that_stop_arriving_fail() -> None:
    checker = HealthChecker(every_n_steps=1)
    assert checker.check(steps=MAX_SNAPSHOT_LAG_STEPS,
                         latest=_snapshot(steps=0, launches=0, pre=0, post=0, write=0))
    with pytest.raises(CanaryHealthError, match="counter publications stopped arriving"):
        checker.check(steps=MAX_SNAPSHOT_LAG_STEPS + 1,
                      latest=_snapshot(steps=0, launches=0, pre=0, post=0, write=0))


def test_interval_must_be_positive() -> None:
    with pytest.raises(ValueError, match="every_n_steps must be >= 1"):
        HealthChecker(every_n_steps=0)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
