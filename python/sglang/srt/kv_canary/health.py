"""Liveness of the canary: every launch that should run keeps running.

A detector that silently stopped (a lost wrapper, a graph captured without the canary, a model
replaced at run time) reports zero violations forever. Every ``health_check_every_n_steps``
forward steps the checker compares two counter snapshots: each of the per-forward kernels
(pre-verify, post-verify, write) must have advanced its run counter at least once per live
forward in between. Otherwise it raises in every mode. It reads the pinned snapshots the monitor
already consumed, so it never synchronizes with the device.
"""

from __future__ import annotations

from sglang.jit_kernel.kv_canary.consts import CheckKind
from sglang.srt.kv_canary.snapshots import ZERO_SNAPSHOT, CounterSnapshot

PER_FORWARD_KINDS: tuple[CheckKind, ...] = (
    CheckKind.PRE_VERIFY,
    CheckKind.POST_VERIFY,
    CheckKind.WRITE,
)
HEALTH_OK_PREFIX = "kv_canary health ok:"
# The consumed snapshots may trail the host by a few steps (the device runs behind); trailing by
# more than this many steps at a check means the snapshot path itself stopped.
MAX_SNAPSHOT_LAG_STEPS = 64


class CanaryHealthError(RuntimeError):
    """The canary path is not executing; raised in every mode."""


class HealthChecker:
    """Checks kernel-run counters against live forwards every ``every_n_steps`` steps."""

    def __init__(self, *, every_n_steps: int) -> None:
        if every_n_steps < 1:
            raise ValueError(f"every_n_steps must be >= 1, got {every_n_steps}")
        self._every = every_n_steps
        self._baseline = ZERO_SNAPSHOT

    def check(self, *, steps: int, latest: CounterSnapshot) -> str | None:
        """Run the check when ``steps`` (forwards completed) is a multiple of the interval.

        Returns:
            The "health ok" line when a check ran, else None.
        Raises:
            CanaryHealthError: a per-forward kernel did not run for every live forward, or the
                counter snapshots stopped arriving.
        """
        if steps % self._every != 0:
            return None
        lag = steps - latest.steps
        if lag > max(MAX_SNAPSHOT_LAG_STEPS, 2 * self._every):
            raise CanaryHealthError(
                f"KV canary health check failed: canary path is not executing: the newest "
                f"counter snapshot is from step {latest.steps}, {lag} steps behind step {steps} "
                "(device-to-host counter copies stopped completing)"
            )
        base = self._baseline
        live = latest.live_forwards - base.live_forwards
        advanced = {
            kind: latest.kernel_runs(kind) - base.kernel_runs(kind) for kind in PER_FORWARD_KINDS
        }
        stalled = [kind for kind, runs in advanced.items() if runs < live]
        summary = ", ".join(f"{kind.name.lower()} +{runs}" for kind, runs in advanced.items())
        window = f"steps {base.steps}..{latest.steps} ({live} live forwards)"
        if stalled:
            names = ", ".join(kind.name.lower() for kind in stalled)
            raise CanaryHealthError(
                f"KV canary health check failed: canary path is not executing: over {window} "
                f"the kernel run counters advanced {summary}; each must advance at least once "
                f"per live forward ({names} did not). Corruption would go unreported."
            )
        self._baseline = latest
        return f"{HEALTH_OK_PREFIX} {window}: kernel runs {summary}"
