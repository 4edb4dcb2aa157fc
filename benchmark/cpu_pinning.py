"""Pin a benchmarked server's scheduler to a physical core of its own.

A small model's decode step is bound by the scheduler process's Python, so its speed follows the
CPU that process runs on. Left to the kernel, the scheduler may share a physical core (its
hyperthread sibling) with the tokenizer, the detokenizer or the benchmark client, and two servers
of the same configuration then differ by up to 1.6x on the same machine
(``benchmark/results/2026-11-26-h200-tiny-server-append.txt``: ``off#2`` / ``off#1``). With
``--pin-scheduler`` the benchmark gives every server the same placement once it is ready: every
thread of the scheduler process on the hyperthreads of the last physical core it may use, every
other process of the server and the benchmark itself on the rest (see :func:`plan_pinning`).
With ``--together`` the servers run at once and each scheduler gets a core of its own
(:func:`plan_pinning_apart`). Where sysfs shows one thread per core (the H200 machines of stop
38), a scheduler's core is a single vCPU that all its threads share.

The scheduler is found by its process title: SGLang 0.5.12 names it ``sglang::scheduler...``
(``setproctitle``), which ``/proc/PID/cmdline`` shows.
"""

from __future__ import annotations

import os
import pathlib
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass

SCHEDULER_TITLE = "sglang::scheduler"
_SYS_CPU = pathlib.Path("/sys/devices/system/cpu")
_PROC = pathlib.Path("/proc")


@dataclass(frozen=True, slots=True, kw_only=True)
class PinningPlan:
    """Where the scheduler goes (``scheduler_cpus``: one physical core's hyperthreads) and where
    everything else goes (``other_cpus``)."""

    scheduler_cpus: frozenset[int]
    other_cpus: frozenset[int]

    def describe(self) -> str:
        return (f"scheduler on CPUs {_cpu_list(self.scheduler_cpus)}, the rest of the server and "
                f"the benchmark on {_cpu_list(self.other_cpus)}")


def _cpu_list(cpus: Collection[int]) -> str:
    return ",".join(str(cpu) for cpu in sorted(cpus))


def parse_cpu_list(text: str) -> frozenset[int]:
    """The CPUs of a sysfs list such as ``"0-3,8,10-11"``."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        first, _, last = part.partition("-")
        cpus.update(range(int(first), int(last or first) + 1))
    return frozenset(cpus)


def thread_siblings(cpu: int, *, sys_cpu: pathlib.Path = _SYS_CPU) -> frozenset[int]:
    """The logical CPUs sharing ``cpu``'s physical core (``{cpu}`` when sysfs does not say)."""
    path = sys_cpu / f"cpu{cpu}" / "topology" / "thread_siblings_list"
    try:
        return parse_cpu_list(path.read_text()) | {cpu}
    except (OSError, ValueError):
        return frozenset({cpu})


def plan_pinning(allowed: Collection[int], *,
                 siblings: Callable[[int], frozenset[int]] = thread_siblings) -> PinningPlan | None:
    """The scheduler on the highest allowed CPU and its allowed siblings, the rest elsewhere;
    None when that leaves nothing for the rest (one physical core)."""
    plans = plan_pinning_apart(allowed, servers=1, siblings=siblings)
    return None if plans is None else plans[0]


def plan_pinning_apart(allowed: Collection[int], *, servers: int,
                       siblings: Callable[[int], frozenset[int]] = thread_siblings,
                       ) -> list[PinningPlan] | None:
    """One plan per server of ``servers`` running at once: each scheduler on a physical core of
    its own (the highest allowed ones, the first server's the highest), everything else of every
    server, and the benchmark, on the allowed CPUs left; None when fewer than ``servers`` + 1
    physical cores are allowed."""
    left = frozenset(allowed)
    cores: list[frozenset[int]] = []
    while len(cores) < servers and left:
        core = siblings(max(left)) & left
        cores.append(core)
        left -= core
    if len(cores) < servers or not left:
        return None
    return [PinningPlan(scheduler_cpus=core, other_cpus=left) for core in cores]


def process_title(pid: int, *, proc: pathlib.Path = _PROC) -> str:
    """``/proc/PID/cmdline`` with NULs as spaces ("" once the process is gone)."""
    try:
        return (proc / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode(
            errors="replace").strip()
    except OSError:
        return ""


def _threads(pid: int, *, proc: pathlib.Path = _PROC) -> list[int]:
    try:
        return [int(entry.name) for entry in (proc / str(pid) / "task").iterdir()]
    except OSError:
        return []


def pin_server(*, pids: Iterable[int], plan: PinningPlan,
               set_affinity: Callable[[int, Collection[int]], None] = os.sched_setaffinity,
               title: Callable[[int], str] = process_title,
               threads: Callable[[int], list[int]] = _threads) -> list[int]:
    """Apply ``plan`` to every thread of ``pids`` (a server's processes) and to this process;
    the scheduler pids found (empty: none, and nothing was pinned).

    A thread that exits meanwhile is skipped. Threads a process starts later inherit the
    affinity of the thread that starts them.
    """
    pids = list(pids)
    schedulers = [pid for pid in pids if title(pid).startswith(SCHEDULER_TITLE)]
    if not schedulers:
        return []
    for pid in pids:
        cpus = plan.scheduler_cpus if pid in schedulers else plan.other_cpus
        for tid in threads(pid) or [pid]:
            try:
                set_affinity(tid, cpus)
            except (ProcessLookupError, PermissionError):
                continue
    set_affinity(0, plan.other_cpus)
    return schedulers
