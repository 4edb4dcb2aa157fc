"""Sample, every ``--interval-s``, what the machine's SGLang processes and GPU are doing, as JSON
lines, while a benchmark runs beside it.

Each line: ``t`` (wall clock, seconds since the epoch, to line up with server logs), ``gpu``
(SM clock in MHz, utilization in %, read through NVML when ``pynvml`` imports; absent
otherwise) and ``threads``: for every thread of every process whose command line contains
``--match`` (default ``sglang``), ``[pid, tid, process title, thread name, CPU ticks so far,
nanoseconds waited to run so far, of the CPU ticks those in the kernel, minor page faults so
far]`` (``/proc/PID/task/TID/stat`` utime + stime, ``schedstat``, stime, minflt). Differences
between lines say which thread used the CPU, whether it spent that time in the kernel or
faulting pages in, and whether the GPU's clock dropped, during a stretch of slow requests that
the server log shows. (Files written before the last two values existed have six.)

With ``--probe`` each line also has ``probe_us``: how long a fixed piece of pure-Python work
(:func:`probe_work`, about a millisecond) took on the sampler's own CPU. Pin the sampler to one
CPU that nothing else uses (``taskset -c 13``): if the probe slows in the same seconds as the
server's scheduler, the whole machine's CPUs ran slower (clock, shared caches, memory); if it
does not, the slowness is local to the scheduler's CPU or process.

The probe has a second part, ``probe_mem_us``: a fixed number of steps of a pointer chase
through a list far larger than a CPU's caches (``--probe-memory-words``, 4 Mi entries, about
150 MB), each step's address read from the step before. The first part runs in
the CPU's registers and first-level cache and so follows its clock; the second follows the
latency of memory. The scheduler's Python chases pointers through a large heap: a slowdown in
the second part alone (the vCPU's memory further away, another tenant's traffic) slows it while
the first part does not move.

``--probe-only`` writes ``t``, ``probe_us`` and ``probe_mem_us`` only (no ``/proc`` walk, no
NVML: a few ms of work per sample), for a second sampler pinned to the scheduler's own CPU
(``taskset -c 15``, where ``--pin-scheduler`` puts it): it tells how fast that very vCPU ran in
each second (``slow_seconds.py --cpu-probe``), at a cost of well under 1 % of its time at the
default interval.

Usage: ``taskset -c 13 python benchmark/machine_sampler.py --out samples.jsonl
[--interval-s 0.5] [--duration-s 600] [--probe | --probe-only] [--probe-memory-words N]``;
the chase is built before the first sample (a few seconds); it stops after
``--duration-s`` or on SIGTERM.
"""

from __future__ import annotations

import argparse
import functools
import json
import pathlib
import random
import signal
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

from cpu_contention import parse_schedstat
from cpu_pinning import process_title

_PROC = pathlib.Path("/proc")


def parse_task_stat(text: str) -> tuple[str, int, int, int]:
    """``(thread name, utime + stime ticks, stime ticks, minor faults)`` from the text of
    ``/proc/PID/task/TID/stat`` (the name sits in parentheses and may hold spaces or parentheses
    itself).

    Raises:
        ValueError: the text is not a stat line.
    """
    opened, closed = text.find("("), text.rfind(")")
    if opened < 0 or closed < opened:
        raise ValueError(f"not a /proc stat line: {text[:80]!r}")
    fields = text[closed + 2:].split()  # from field 3 (state) on
    if len(fields) < 13:
        raise ValueError(f"/proc stat line with {len(fields) + 2} fields: {text[:80]!r}")
    # fields 10 (minflt), 14 (utime) and 15 (stime) of proc(5), counted from 1
    minor_faults, user, system = int(fields[7]), int(fields[11]), int(fields[12])
    return text[opened + 1:closed], user + system, system, minor_faults


def matching_pids(*, match: str, proc: pathlib.Path = _PROC) -> Iterator[tuple[int, str]]:
    """``(pid, command line)`` of every process whose command line contains ``match``."""
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        title = process_title(int(entry.name), proc=proc)  # "" once the process is gone
        if title and match in title:
            yield int(entry.name), title


def thread_rows(*, match: str, proc: pathlib.Path = _PROC) -> list[list[Any]]:
    """``[pid, tid, title, thread name, CPU ticks, ns waited, kernel ticks, minor faults]`` of
    every thread of the matching processes (threads gone meanwhile left out; waited -1 where
    ``schedstat`` is missing)."""
    rows: list[list[Any]] = []
    for pid, title in matching_pids(match=match, proc=proc):
        try:
            tids = sorted(int(entry.name) for entry in (proc / str(pid) / "task").iterdir())
        except OSError:
            continue
        for tid in tids:
            task = proc / str(pid) / "task" / str(tid)
            try:
                name, ticks, system, minor_faults = parse_task_stat((task / "stat").read_text())
            except (OSError, ValueError):
                continue
            try:
                waited = parse_schedstat((task / "schedstat").read_text())[1]
            except (OSError, ValueError):
                waited = -1
            rows.append([pid, tid, title[:80], name, ticks, waited, system, minor_faults])
    return rows


def gpu_reader() -> Callable[[], dict[str, int]] | None:
    """A function reading GPU 0's SM clock and utilization through NVML, or None (no pynvml,
    or no GPU)."""
    try:
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    except Exception:  # noqa: BLE001 - any NVML failure means: no GPU readings
        return None

    def read() -> dict[str, int]:
        return {"sm_mhz": pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM),
                "util": pynvml.nvmlDeviceGetUtilizationRates(handle).gpu}

    return read


PROBE_ITERATIONS = 20_000


def probe_work(iterations: int = PROBE_ITERATIONS) -> int:
    """A fixed piece of pure-Python work (integer arithmetic in a loop, no allocation that
    grows, no system call); returns its result so it cannot be skipped."""
    value = 0
    for step in range(iterations):
        value = (value * 31 + step) & 0xFFFFFFFF
    return value


def probe_us(*, timer: Callable[[], int] = time.perf_counter_ns) -> float:
    """Microseconds :func:`probe_work` took this time."""
    started = timer()
    probe_work()
    return (timer() - started) / 1e3


MEMORY_PROBE_WORDS = 1 << 22  # entries of the pointer chase (far beyond a CPU's caches)
MEMORY_PROBE_STEPS = 2_000


def memory_chain(words: int, *, seed: int = 0) -> list[int]:
    """A random permutation of ``range(words)`` that is one cycle (Sattolo's algorithm): chasing
    ``i = chain[i]`` from any entry visits every entry before it comes back.

    Raises:
        ValueError: ``words`` < 2.
    """
    if words < 2:
        raise ValueError(f"a pointer chase needs at least 2 entries, got {words}")
    chain = list(range(words))
    rng = random.Random(seed)
    for i in range(words - 1, 0, -1):
        j = rng.randrange(i)
        chain[i], chain[j] = chain[j], chain[i]
    return chain


def memory_probe_us(chain: list[int], *, steps: int = MEMORY_PROBE_STEPS,
                    timer: Callable[[], int] = time.perf_counter_ns) -> float:
    """Microseconds ``steps`` steps of the pointer chase through ``chain`` took this time."""
    started = timer()
    index = 0
    for _ in range(steps):
        index = chain[index]
    return (timer() - started) / 1e3


def sample_line(*, match: str, gpu: Callable[[], dict[str, int]] | None,
                proc: pathlib.Path = _PROC, clock: Callable[[], float] = time.time,
                probe: Callable[[], float] | None = None,
                memory_probe: Callable[[], float] | None = None, threads: bool = True) -> str:
    """One JSON line of the current state (``probe`` / ``memory_probe``: add ``probe_us`` /
    ``probe_mem_us``, see :func:`probe_us` and :func:`memory_probe_us`; ``threads`` False: no
    ``threads`` rows, no ``/proc`` read)."""
    line: dict[str, Any] = {"t": round(clock(), 3)}
    if probe is not None:
        line["probe_us"] = round(probe(), 1)
    if memory_probe is not None:
        line["probe_mem_us"] = round(memory_probe(), 1)
    if gpu is not None:
        line["gpu"] = gpu()
    if threads:
        line["threads"] = thread_rows(match=match, proc=proc)
    return json.dumps(line, separators=(",", ":"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=pathlib.Path, required=True, help="JSON-lines file to write")
    parser.add_argument("--interval-s", type=float, default=0.5,
                        help="seconds between samples (> 0; default 0.5)")
    parser.add_argument("--duration-s", type=float, default=600.0,
                        help="stop after this many seconds (> 0; default 600)")
    parser.add_argument("--match", default="sglang",
                        help="sample the processes whose command line contains this")
    parser.add_argument("--probe", action="store_true",
                        help="time a fixed piece of pure-Python work (probe_us) and a pointer "
                             "chase through memory (probe_mem_us) in every sample")
    parser.add_argument("--probe-only", action="store_true",
                        help="write only the time and the probe (no threads, no GPU): for a "
                             "sampler on the scheduler's own CPU")
    parser.add_argument("--probe-memory-words", type=int, default=MEMORY_PROBE_WORDS,
                        help="entries of the probe's pointer chase (>= 2; default "
                             f"{MEMORY_PROBE_WORDS}, about 150 MB)")
    options = parser.parse_args(argv)
    if options.probe_memory_words < 2:
        parser.error(f"--probe-memory-words={options.probe_memory_words} is invalid; allowed: "
                     "an integer >= 2")
    if options.probe_only and options.probe:
        parser.error("--probe and --probe-only are exclusive; allowed: one of them "
                     "(--probe-only implies the probe)")
    for name in ("interval_s", "duration_s"):
        if not getattr(options, name) > 0:
            parser.error(f"--{name.replace('_', '-')}={getattr(options, name)} is invalid; "
                         "allowed: > 0")
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    gpu = None if options.probe_only else gpu_reader()
    probe = memory_probe = None
    if options.probe or options.probe_only:
        probe = probe_us
        chain = memory_chain(options.probe_memory_words)
        memory_probe = functools.partial(memory_probe_us, chain)
    end = time.monotonic() + options.duration_s
    with options.out.open("w", encoding="utf-8") as out:
        while not stopping and time.monotonic() < end:
            out.write(sample_line(match=options.match, gpu=gpu, probe=probe,
                                  memory_probe=memory_probe,
                                  threads=not options.probe_only) + "\n")
            out.flush()
            time.sleep(options.interval_s)
    return 0


if __name__ == "__main__":
    sys.exit(main())
