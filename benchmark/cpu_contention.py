"""How much CPU a benchmarked server's scheduler got while a workload ran, from ``/proc``.

A server process sometimes runs SGLang's own host code up to 1.8x slower than another process
of the same configuration, for its whole life or for a stretch of it (see
``benchmark/prefill_gaps.py``). Two causes outside the process show in ``/proc``:

- **steal**: time the hypervisor ran something else on this machine's virtual CPUs
  (``/proc/stat``, the eighth value of each ``cpuN`` line, in clock ticks);
- **run-queue wait**: time the scheduler's main thread was runnable but another thread of this
  machine had its CPU (``/proc/PID/schedstat``: nanoseconds on a CPU, nanoseconds waiting, time
  slices).

:func:`take_snapshot` reads both before and after a workload's rounds, and :func:`cpu_use` turns
two snapshots into fractions of the wall time between them. Neither sees a physical core shared
with another guest's thread (a hyperthread sibling on the host), nor memory placement; a slow
process with no steal and no wait points there.
"""

from __future__ import annotations

import os
import pathlib
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass

_PROC = pathlib.Path("/proc")
_STEAL_FIELD = 8  # of a "cpuN" line of /proc/stat: user nice system idle iowait irq softirq steal


@dataclass(frozen=True, slots=True, kw_only=True)
class CpuSnapshot:
    """What :func:`take_snapshot` read at ``wall_s`` (``time.monotonic``).

    ``steal_ticks``: per logical CPU, its cumulative steal in clock ticks. ``scheduler_ns``:
    the scheduler's main thread's cumulative ``(on a CPU, waiting to run)`` nanoseconds, or
    None (no scheduler, or it is gone)."""

    wall_s: float
    steal_ticks: Mapping[int, int]
    scheduler_ns: tuple[int, int] | None


@dataclass(frozen=True, slots=True, kw_only=True)
class CpuUse:
    """Fractions of the wall time between two snapshots (``seconds``).

    ``steal_all``: mean steal over every logical CPU (None: ``/proc/stat`` not read);
    ``steal_scheduler``: mean steal over the CPUs the scheduler may run on (None: unknown);
    ``scheduler_on_cpu`` / ``scheduler_waiting``: the scheduler's main thread on a CPU /
    runnable but waiting (None: not read)."""

    seconds: float
    steal_all: float | None
    steal_scheduler: float | None
    scheduler_on_cpu: float | None
    scheduler_waiting: float | None

    def describe(self) -> str:
        parts = []
        if self.steal_all is not None:
            parts.append(f"steal {100 * self.steal_all:.2f} % of all CPUs")
        if self.steal_scheduler is not None:
            parts.append(f"{100 * self.steal_scheduler:.2f} % of the scheduler's")
        if self.scheduler_on_cpu is not None and self.scheduler_waiting is not None:
            parts.append(f"scheduler on a CPU {100 * self.scheduler_on_cpu:.1f} %, "
                         f"waiting {100 * self.scheduler_waiting:.2f} %")
        return ", ".join(parts or ["nothing read"]) + f" (over {self.seconds:.1f} s)"

    def to_json(self) -> dict[str, float | None]:
        return {"seconds": self.seconds, "steal_all": self.steal_all,
                "steal_scheduler": self.steal_scheduler, "scheduler_on_cpu": self.scheduler_on_cpu,
                "scheduler_waiting": self.scheduler_waiting}

    @classmethod
    def from_json(cls, data: Mapping[str, float | None]) -> CpuUse:
        def fraction(key: str) -> float | None:
            value = data.get(key)
            return None if value is None else float(value)

        return cls(seconds=float(data["seconds"]), steal_all=fraction("steal_all"),
                   steal_scheduler=fraction("steal_scheduler"),
                   scheduler_on_cpu=fraction("scheduler_on_cpu"),
                   scheduler_waiting=fraction("scheduler_waiting"))


def parse_steal_ticks(proc_stat: str) -> dict[int, int]:
    """Per logical CPU, its steal ticks from the text of ``/proc/stat`` (0 where a line has
    fewer than eight values, as kernels without steal accounting write)."""
    steal: dict[int, int] = {}
    for line in proc_stat.splitlines():
        name, _, values = line.partition(" ")
        if not (name.startswith("cpu") and name[3:].isdigit()):
            continue
        fields = values.split()
        steal[int(name[3:])] = int(fields[_STEAL_FIELD - 1]) if len(fields) >= _STEAL_FIELD else 0
    return steal


def parse_schedstat(text: str) -> tuple[int, int]:
    """``(on a CPU, waiting to run)`` nanoseconds from the text of ``/proc/PID/schedstat``.

    Raises:
        ValueError: the text does not start with two integers.
    """
    fields = text.split()
    if len(fields) < 2:
        raise ValueError(f"/proc/PID/schedstat text {text!r} has fewer than two values")
    return int(fields[0]), int(fields[1])


def take_snapshot(*, scheduler_pid: int | None, proc: pathlib.Path = _PROC,
                  clock: Callable[[], float] = time.monotonic) -> CpuSnapshot:
    """Read the steal of every CPU and, given its pid, the scheduler's main thread (what
    cannot be read is left out: no CPUs, or ``scheduler_ns`` None)."""
    try:
        steal_ticks = parse_steal_ticks((proc / "stat").read_text())
    except OSError:
        steal_ticks = {}
    scheduler_ns = None
    if scheduler_pid is not None:
        try:
            scheduler_ns = parse_schedstat((proc / str(scheduler_pid) / "schedstat").read_text())
        except (OSError, ValueError):
            scheduler_ns = None
    return CpuSnapshot(wall_s=clock(), steal_ticks=steal_ticks, scheduler_ns=scheduler_ns)


def cpu_use(before: CpuSnapshot, after: CpuSnapshot, *, scheduler_cpus: Collection[int] | None,
            ticks_per_s: float | None = None) -> CpuUse:
    """The fractions of the wall time from ``before`` to ``after`` (see :class:`CpuUse`);
    ``scheduler_cpus``: where the scheduler may run (None: unknown); ``ticks_per_s``: the
    kernel's clock ticks per second (default ``os.sysconf("SC_CLK_TCK")``).

    Raises:
        ValueError: ``after`` is not later than ``before``.
    """
    seconds = after.wall_s - before.wall_s
    if seconds <= 0:
        raise ValueError(f"the second snapshot ({after.wall_s}) is not later than the first "
                         f"({before.wall_s})")
    tick_s = 1.0 / (ticks_per_s or os.sysconf("SC_CLK_TCK"))

    def mean_steal(cpus: Collection[int]) -> float | None:
        known = [cpu for cpu in cpus if cpu in before.steal_ticks and cpu in after.steal_ticks]
        if not known:
            return None
        ticks = sum(after.steal_ticks[cpu] - before.steal_ticks[cpu] for cpu in known)
        return ticks * tick_s / (seconds * len(known))

    on_cpu = waiting = None
    if before.scheduler_ns is not None and after.scheduler_ns is not None:
        on_cpu = (after.scheduler_ns[0] - before.scheduler_ns[0]) / (seconds * 1e9)
        waiting = (after.scheduler_ns[1] - before.scheduler_ns[1]) / (seconds * 1e9)
    return CpuUse(seconds=seconds, steal_all=mean_steal(list(after.steal_ticks)),
                  steal_scheduler=None if scheduler_cpus is None else mean_steal(scheduler_cpus),
                  scheduler_on_cpu=on_cpu, scheduler_waiting=waiting)
