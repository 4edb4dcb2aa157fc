"""The periodic stats line and the idle line, from the counter snapshots the monitor already
consumed.

Format (stable, :data:`STATS_LINE_RE` parses it)::

    KV canary stats: protected N tokens (slots verified), W slots written, M sweeps (X slots
        swept), K violations, S steps

(one line in the log). N counts slot verifications (pre-forward plus post-forward; a prefix slot
is verified on every forward of every request that references it), W the records written, M the
radix sweep launches and X the slots they verified, K the violation rows ever produced
(including rows a full ring dropped), S the forward steps the snapshot covers.

The idle line (:data:`IDLE_LINE_RE`), once per idle period, when the host has read the counters
published after every forward it enqueued::

    KV canary idle: every forward through step S polled, K violations

so every violation row of those forwards was reported before it (K counts them all, as above).
Whoever reads the log after a workload (a test, the burn-in) waits for it to know the report is
complete.
"""

from __future__ import annotations

import re

from sglang.jit_kernel.kv_canary.consts import CheckKind
from sglang.srt.kv_canary.monitor.counter_snapshots import CounterSnapshot

STATS_LINE_RE = re.compile(
    r"KV canary stats: protected (?P<protected>\d+) tokens \(slots verified\), "
    r"(?P<written>\d+) slots written, (?P<sweeps>\d+) sweeps \((?P<swept>\d+) slots swept\), "
    r"(?P<violations>\d+) violations, (?P<steps>\d+) steps"
)


def stats_line(snapshot: CounterSnapshot) -> str:
    return (
        f"KV canary stats: protected {snapshot.slots_verified} tokens (slots verified), "
        f"{snapshot.entries(CheckKind.WRITE)} slots written, "
        f"{snapshot.kernel_runs(CheckKind.SWEEP)} sweeps "
        f"({snapshot.entries(CheckKind.SWEEP)} slots swept), "
        f"{snapshot.violations} violations, {snapshot.steps} steps"
    )


IDLE_LINE_RE = re.compile(
    r"KV canary idle: every forward through step (?P<steps>\d+) polled, "
    r"(?P<violations>\d+) violations"
)


def idle_line(snapshot: CounterSnapshot) -> str:
    return (
        f"KV canary idle: every forward through step {snapshot.steps} polled, "
        f"{snapshot.violations} violations"
    )


def stats_due(*, steps: int, every_n_steps: int) -> bool:
    """True when the line is due after ``steps`` forwards (``every_n_steps`` 0 turns it off)."""
    return every_n_steps > 0 and steps % every_n_steps == 0


def next_multiple(*, steps: int, every_n_steps: int) -> int:
    """The first multiple of ``every_n_steps`` (>= 1) from ``steps`` on: the next step at which a
    line or check due every ``every_n_steps`` steps runs."""
    return -(-steps // every_n_steps) * every_n_steps
