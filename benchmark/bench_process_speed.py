"""How fast one fixed piece of pure-Python work runs on each CPU, in each fresh process, and over
time, on this machine: where the spread between benchmark servers comes from.

Two tiny-model servers of one configuration can differ by 1.7x in SGLang's own host code per call
on the H200 host, whether started in turn or at once and measured interleaved
(``2026-11-28-h200-tiny-together-6be6b48.txt``). This separates the candidates without SGLang or
a GPU. The work is interpreter-bound like a scheduler step (attribute reads, dict and list
operations, small objects; a working set of about 40 MB), timed in slices of ``--slice-ms``:

- **per CPU**: one child process moves itself over every CPU it may use, ``--passes`` times, and
  times the work on each (same process, same memory): the spread between CPUs, and between
  passes of one CPU (time);
- **per process**: ``--processes`` fresh children, one after another, each pinned to the same
  CPU (the last): the spread between processes on one CPU. With ``--variant-env KEY=VALUE``
  (repeatable) every other child runs with that environment too (e.g. a malloc setting), so the
  two groups' spreads can be compared in one run.

Prints, per CPU and per process, the median µs of one unit of work (lower is faster) and each
group's max / min. Runs on any Linux machine.
Usage: ``python benchmark/bench_process_speed.py [--passes 3] [--processes 8] [--slice-ms 50]
[--variant-env KEY=VALUE ...]``
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

UNIT_ROUNDS = 200  # loop rounds in one unit of work


class _Item:
    __slots__ = ("rid", "row", "tokens", "state")

    def __init__(self, rid: str, row: int, tokens: list[int]) -> None:
        self.rid, self.row, self.tokens, self.state = rid, row, tokens, {"n": 0}


def _make_heap() -> tuple[list[_Item], dict[str, _Item]]:
    """About 40 MB of small Python objects that the work walks (a scheduler's requests)."""
    items = [_Item(f"r{i}", i, list(range(i % 97, i % 97 + 64))) for i in range(60_000)]
    return items, {item.rid: item for item in items}


def _unit(items: list[_Item], by_rid: dict[str, _Item], offset: int) -> int:
    """One unit of interpreter-bound work over a stride of the heap."""
    total = 0
    count = len(items)
    for step in range(UNIT_ROUNDS):
        item = items[(offset + step * 7919) % count]
        same = by_rid[item.rid]
        same.state["n"] += 1
        total += same.row + len(same.tokens) + same.tokens[-1]
        pair = (item.row, same.tokens[step % 64])
        total += pair[0] ^ pair[1]
    return total


def measure_unit_us(*, slice_ms: float, slices: int, heap: tuple[list[_Item], dict[str, _Item]]
                    ) -> float:
    """Median µs of one unit over ``slices`` slices of about ``slice_ms`` each."""
    items, by_rid = heap
    results = []
    offset = 0
    for _ in range(slices):
        units = 0
        started = time.perf_counter()
        deadline = started + slice_ms / 1e3
        while True:
            _unit(items, by_rid, offset)
            offset += 1
            units += 1
            now = time.perf_counter()
            if now >= deadline:
                break
        results.append((now - started) / units * 1e6)
    return statistics.median(results)


def _child(mode: str, *, cpus: list[int], passes: int, slice_ms: float) -> None:
    """The child's side: print one JSON line of results."""
    heap = _make_heap()
    if mode == "per-cpu":
        table: dict[str, list[float]] = {str(cpu): [] for cpu in cpus}
        for _ in range(passes):
            for cpu in cpus:
                os.sched_setaffinity(0, {cpu})
                measure_unit_us(slice_ms=slice_ms, slices=1, heap=heap)  # settle on the CPU
                table[str(cpu)].append(measure_unit_us(slice_ms=slice_ms, slices=3, heap=heap))
        print(json.dumps(table))
    else:
        os.sched_setaffinity(0, {cpus[0]})
        measure_unit_us(slice_ms=slice_ms, slices=2, heap=heap)
        print(json.dumps({"unit_us": measure_unit_us(slice_ms=slice_ms, slices=9, heap=heap)}))


def _run_child(mode: str, *, cpus: list[int], passes: int, slice_ms: float,
               env: dict[str, str]) -> dict[str, object]:
    command = [sys.executable, __file__, "--child", mode, "--cpus", ",".join(map(str, cpus)),
               "--passes", str(passes), "--slice-ms", str(slice_ms)]
    done = subprocess.run(command, capture_output=True, text=True, check=True,
                          env={**os.environ, **env})
    return json.loads(done.stdout.strip().splitlines()[-1])


def _spread(values: list[float]) -> str:
    return f"max/min {max(values) / min(values):.3f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--passes", type=int, default=3, help="passes over the CPUs (default 3)")
    parser.add_argument("--processes", type=int, default=8,
                        help="fresh processes on one CPU (default 8)")
    parser.add_argument("--slice-ms", type=float, default=50.0,
                        help="ms per timed slice (default 50)")
    parser.add_argument("--variant-env", action="append", default=[], metavar="KEY=VALUE",
                        help="environment of every other fresh process (repeatable)")
    parser.add_argument("--child", choices=("per-cpu", "per-process"), help=argparse.SUPPRESS)
    parser.add_argument("--cpus", help=argparse.SUPPRESS)
    options = parser.parse_args(argv)
    for name in ("passes", "processes"):
        if getattr(options, name) < 1:
            parser.error(f"--{name}={getattr(options, name)} is invalid; allowed: an integer >= 1")
    if not options.slice_ms > 0:
        parser.error(f"--slice-ms={options.slice_ms} is invalid; allowed: > 0")
    variant: dict[str, str] = {}
    for text in options.variant_env:
        key, sep, value = text.partition("=")
        if not sep or not key:
            parser.error(f"--variant-env={text!r} is invalid; allowed: KEY=VALUE")
        variant[key] = value
    if options.child:
        cpus = [int(cpu) for cpu in options.cpus.split(",")]
        _child(options.child, cpus=cpus, passes=options.passes, slice_ms=options.slice_ms)
        return 0
    cpus = sorted(os.sched_getaffinity(0))
    print(f"CPUs {cpus[0]}-{cpus[-1]} ({len(cpus)}); one unit = {UNIT_ROUNDS} loop rounds; "
          "µs per unit, median of timed slices (lower is faster)")
    per_cpu = _run_child("per-cpu", cpus=cpus, passes=options.passes,
                         slice_ms=options.slice_ms, env={})
    print(f"\nper CPU, one process moving over them ({options.passes} passes):")
    medians = []
    for cpu, values in per_cpu.items():
        medians.append(statistics.median(values))
        print(f"  cpu {cpu:>3}: " + "  ".join(f"{value:7.2f}" for value in values)
              + f"   (passes {_spread(values)})")
    print(f"  between CPUs (their medians): {_spread(medians)}")
    print(f"\nper process, {options.processes} fresh processes in turn, each on CPU {cpus[-1]}"
          + (f"; every other one with {' '.join(options.variant_env)}" if variant else "") + ":")
    groups: dict[str, list[float]] = {"default": [], "variant": []}
    for index in range(options.processes):
        group = "variant" if variant and index % 2 else "default"
        result = _run_child("per-process", cpus=[cpus[-1]], passes=1,
                            slice_ms=options.slice_ms, env=variant if group == "variant" else {})
        groups[group].append(float(result["unit_us"]))
        print(f"  process {index + 1:>2} ({group}): {result['unit_us']:7.2f}")
    for group, values in groups.items():
        if values:
            print(f"  {group}: median {statistics.median(values):.2f}, {_spread(values)} over "
                  f"{len(values)} processes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
