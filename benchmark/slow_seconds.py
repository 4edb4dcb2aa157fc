"""Which seconds of a ``ttft1`` run were slow, and what the machine did in them.

Joins two records of one GPU run: the server logs (a folder, or a ``.tar.gz`` of one; SGLang's
batch-1 prefill lines, whose ``input throughput`` gives each request's cycle, as in
``prefill_gaps.py``) and the JSON lines ``machine_sampler.py`` wrote beside the run (per-thread
CPU ticks and run-queue waits, the GPU's SM clock). Per server second with at least
``--min-requests`` prefills it takes the median cycle; a second is **slow** when that median is
over ``--slow-factor`` times the smallest such median of the run. For the slow and the fast
seconds it prints how many there were, their median cycle, and the means of what the sampler
saw then: the SM clock and utilization, the scheduler's main thread (``sglang::schedul``) on a
CPU (and of that in the kernel), waiting to run and faulting pages in (minor faults per second;
"-" in sample files written before the sampler read them), the CPU used by every other
thread of the SGLang processes (with the busiest such thread) and, where the sampler ran with
``--probe``, how long its fixed piece of work took on its own CPU (per server log too: its
seconds' median cycle and median probe). If slow seconds show the same CPU time for the
scheduler, no more waiting, the same clock and no busier thread, the slowness comes from
outside what the guest can see.

    python benchmark/slow_seconds.py \
      benchmark/results/2026-11-29-h200-8b-ttft1-sampled-459e85d-logs.tar.gz \
      --samples benchmark/results/2026-11-29-h200-8b-ttft1-sampled-459e85d-samples.jsonl.gz

``--cpu-probe FILE`` takes the lines of a second sampler run with ``--probe-only`` on the
scheduler's own CPU and judges each second by that vCPU's speed instead: fast when its probe,
and its memory probe where sampled, are under ``--fast-factor`` times their p10 over the run.
Per server log it prints its seconds with a probe, the fast ones, and the median request cycle
in its fast and its slow seconds; per configuration the median cycle over the fast seconds of
all its servers. Configurations compared
over their fast seconds ran on equally fast vCPUs; and if the slow request cycles fall in the
vCPU's slow seconds, the slow mode is the vCPU's, not the server's.

Server log times are read as UTC (the GPU host's clock); runs on any machine.
"""

from __future__ import annotations

import argparse
import datetime
import gzip
import json
import pathlib
import re
import statistics
import sys
from collections import defaultdict
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from cpu_pinning import SCHEDULER_TITLE
from prefill_gaps import config_of, logs_of, prefill_gaps_ms

_STAMP = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)\]")
SCHEDULER_THREAD = "sglang::schedul"  # the scheduler's main thread (names are cut at 15 chars)


@dataclass(frozen=True, slots=True, kw_only=True)
class Second:
    """What the sampler saw during one second (means over its samples): ``sm_mhz`` / ``gpu_util``
    (None: no GPU reading), the scheduler main thread's share of a CPU, of it in the kernel, of
    waiting, and its minor faults per second (those two None: not sampled), the CPU of every
    other sampled thread together, the busiest of them (name, share), and the sampler's probe
    and memory probe in µs (None: sampled without ``--probe``, or by a sampler older than the
    memory probe)."""

    sm_mhz: float | None
    gpu_util: float | None
    scheduler_cpu: float
    scheduler_kernel: float | None
    scheduler_wait: float
    scheduler_faults_per_s: float | None
    others_cpu: float
    busiest_other: tuple[str, float]
    probe_us: float | None = None
    probe_mem_us: float | None = None


def _open_text(path: pathlib.Path) -> Iterator[str]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as lines:
        yield from lines


def sampled_seconds(lines: Iterable[str]) -> dict[int, Second]:
    """Per whole second of the wall clock, the means of the rates between consecutive samples
    that end in it (:class:`Second`)."""
    rates: dict[int, list[dict[str, object]]] = defaultdict(list)
    previous = None
    for line in lines:
        sample = json.loads(line)
        if previous is not None:
            elapsed = sample["t"] - previous["t"]
            if elapsed > 0:
                rates[int(sample["t"])].append(_rates(previous, sample, elapsed=elapsed))
        previous = sample
    return {second: _mean_second(items) for second, items in rates.items()}


def _rates(before: Mapping, after: Mapping, *, elapsed: float) -> dict[str, object]:
    earlier = {(row[0], row[1]): row for row in before["threads"]}
    scheduler_cpu = scheduler_wait = others = 0.0
    kernel = faults = None
    busiest = ("-", 0.0)
    for row in after["threads"]:
        old = earlier.get((row[0], row[1]))
        if old is None:
            continue
        cpu = (row[4] - old[4]) / 100.0 / elapsed  # clock ticks (USER_HZ 100) per second
        if row[2].startswith(SCHEDULER_TITLE) and row[3] == SCHEDULER_THREAD:
            scheduler_cpu += cpu
            if row[5] >= 0 and old[5] >= 0:
                scheduler_wait += (row[5] - old[5]) / 1e9 / elapsed
            if len(row) >= 8 and len(old) >= 8:
                kernel = (kernel or 0.0) + (row[6] - old[6]) / 100.0 / elapsed
                faults = (faults or 0.0) + (row[7] - old[7]) / elapsed
            continue
        others += cpu
        if cpu > busiest[1]:
            busiest = (f"{row[2].split()[0][:24]}/{row[3]}", cpu)
    gpu = after.get("gpu") or {}
    return {"sm": gpu.get("sm_mhz"), "util": gpu.get("util"), "cpu": scheduler_cpu,
            "kernel": kernel, "wait": scheduler_wait, "faults": faults, "others": others,
            "busiest": busiest, "probe": after.get("probe_us"),
            "probe_mem": after.get("probe_mem_us")}


def _mean_second(items: Sequence[Mapping[str, object]]) -> Second:
    def mean(key: str) -> float | None:
        values = [item[key] for item in items if item[key] is not None]
        return statistics.fmean(values) if values else None

    busiest = max((item["busiest"] for item in items), key=lambda pair: pair[1])
    return Second(sm_mhz=mean("sm"), gpu_util=mean("util"), scheduler_cpu=mean("cpu") or 0.0,
                  scheduler_kernel=mean("kernel"), scheduler_wait=mean("wait") or 0.0,
                  scheduler_faults_per_s=mean("faults"), others_cpu=mean("others") or 0.0,
                  busiest_other=busiest, probe_us=mean("probe"),
                  probe_mem_us=mean("probe_mem"))


def probe_spread(lines: Iterable[str]) -> list[str]:
    """The probe's p10 / p50 / p90 over every sample, and over the samples taken while no SGLang
    thread ran (an idle machine: what the probe's CPU does on its own); no line without a probe.
    A probe that changes as much on an idle machine as in slow seconds says the CPUs' speed
    changes by itself, whatever runs."""
    every: dict[str, list[float]] = defaultdict(list)
    idle: dict[str, list[float]] = defaultdict(list)
    for line in lines:
        sample = json.loads(line)
        for key in ("probe_us", "probe_mem_us"):
            probe = sample.get(key)
            if probe is None:
                continue
            every[key].append(probe)
            if sample.get("threads") == []:
                idle[key].append(probe)

    def describe(values: list[float]) -> str:
        if len(values) < 2:
            return f"{values[0]:.0f} µs (1 sample)" if values else "no samples"
        deciles = statistics.quantiles(values, n=10, method="inclusive")
        return (f"p10 / p50 / p90 {deciles[0]:.0f} / {statistics.median(values):.0f} / "
                f"{deciles[8]:.0f} µs ({len(values)} samples)")

    return [f"the {label} over the run: {describe(every[key])}; with no SGLang thread running: "
            f"{describe(idle[key])}"
            for key, label in (("probe_us", "probe"), ("probe_mem_us", "memory probe"))
            if every[key]]


def probe_by_second(lines: Iterable[str], *, key: str = "probe_us") -> dict[int, float]:
    """The mean of ``key`` (``probe_us``, ``probe_mem_us``) per whole second of the wall clock
    (lines without it skipped)."""
    probes: dict[int, list[float]] = defaultdict(list)
    for line in lines:
        sample = json.loads(line)
        if sample.get(key) is not None:
            probes[int(sample["t"])].append(sample[key])
    return {second: statistics.fmean(values) for second, values in probes.items()}


def gated_report(*, logs: Sequence[tuple[str, dict[int, list[float]]]],
                 cpu_probe: Mapping[int, float], min_requests: int, fast_factor: float,
                 cpu_memory_probe: Mapping[int, float] | None = None,
                 slow_cycle_ms: float | None = None) -> list[str]:
    """``--cpu-probe`` (module docstring): seconds judged by the scheduler's vCPU's speed (its
    probe and, where sampled, its memory probe: a fast second is under both bounds); with
    ``slow_cycle_ms``, also that vCPU's probes in the seconds slow by their request cycle
    against the others."""
    if len(cpu_probe) < 2:
        return ["--cpu-probe: fewer than two seconds with a probe"]

    def bound_of(probes: Mapping[int, float]) -> float:
        return fast_factor * statistics.quantiles(probes.values(), n=10, method="inclusive")[0]

    bound = bound_of(cpu_probe)
    memory = cpu_memory_probe if cpu_memory_probe and len(cpu_memory_probe) >= 2 else {}
    memory_bound = bound_of(memory) if memory else None
    also = "" if memory_bound is None else f" and its memory probe under {memory_bound:.0f} µs"
    lines = [f"the scheduler's CPU (--cpu-probe): a second is fast when its probe is under "
             f"{bound:.0f} µs{also} ({fast_factor:g} x {'its' if not also else 'their'} p10 "
             "over the run)"]

    def is_fast(second: int) -> bool:
        slow_memory = memory_bound is not None and memory.get(second, 0.0) >= memory_bound
        return cpu_probe[second] < bound and not slow_memory
    by_config: dict[str, list[float]] = defaultdict(list)
    servers: dict[str, int] = defaultdict(int)

    def median(values: Sequence[float]) -> str:
        return f"{statistics.median(values):.1f} ms" if values else "-"

    for name, by_second in logs:
        fast: list[float] = []
        slow: list[float] = []
        for second, cycles in sorted(by_second.items()):
            if len(cycles) >= min_requests and second in cpu_probe:
                (fast if is_fast(second) else slow).append(statistics.median(cycles))
        lines.append(f"{name}: {len(fast) + len(slow)} seconds with a probe, {len(fast)} fast; "
                     f"median cycle {median(fast)} in the fast ones, {median(slow)} in the slow")
        config = config_of(name)
        servers[config] += 1
        by_config[config] += fast
    for config, fast in by_config.items():
        lines.append(f"{config} ({servers[config]} server{'s' if servers[config] > 1 else ''}): "
                     f"median cycle {median(fast)} over its {len(fast)} fast seconds")
    if slow_cycle_ms is not None:
        lines += _probes_by_cycle_class(logs=logs, cpu_probe=cpu_probe, memory=memory,
                                        min_requests=min_requests, slow_cycle_ms=slow_cycle_ms)
    return lines


def _probes_by_cycle_class(*, logs: Sequence[tuple[str, dict[int, list[float]]]],
                           cpu_probe: Mapping[int, float], memory: Mapping[int, float],
                           min_requests: int, slow_cycle_ms: float) -> list[str]:
    """The scheduler's vCPU's probes (medians) in the seconds slow by their request cycle and in
    the others, over every log: does a slow second go with a slow vCPU?"""
    probes: dict[str, tuple[list[float], list[float]]] = {"slow": ([], []), "other": ([], [])}
    for (_, second), cycle in _second_medians(logs=logs, seconds=cpu_probe,
                                              min_requests=min_requests).items():
        clock, chase = probes["slow" if cycle > slow_cycle_ms else "other"]
        clock.append(cpu_probe[second])
        if second in memory:
            chase.append(memory[second])

    def described(values: list[float]) -> str:
        return f"{statistics.median(values):.0f} µs" if values else "-"

    where = {"slow": f"seconds slow by request cycle (over {slow_cycle_ms:.1f} ms)",
             "other": "other seconds"}
    return [f"the scheduler's CPU in the {where[label]}: {len(clock)} seconds, probe median "
            f"{described(clock)}, memory probe median {described(chase)}"
            for label, (clock, chase) in probes.items()]


def cycles_by_second(lines: Iterable[str], *, new_tokens: int) -> dict[int, list[float]]:
    """Per whole second (UTC epoch) of the log, the request cycles (ms) of its prefill lines."""
    found: dict[int, list[float]] = defaultdict(list)
    for line in lines:
        stamp = _STAMP.match(line)
        if stamp is None:
            continue
        for gap in prefill_gaps_ms(iter([line]), new_tokens=new_tokens):
            when = datetime.datetime.strptime(stamp[1], "%Y-%m-%d %H:%M:%S").replace(
                tzinfo=datetime.timezone.utc)
            found[int(when.timestamp())].append(gap)
    return found


def _second_medians(*, logs: Sequence[tuple[str, dict[int, list[float]]]],
                    seconds: Collection[int], min_requests: int) -> dict[tuple[str, int], float]:
    """The median request cycle of every (log, second) judged: enough prefills, a sample."""
    return {(name, second): statistics.median(cycles) for name, by_second in logs
            for second, cycles in by_second.items()
            if len(cycles) >= min_requests and second in seconds}


def slow_cycle_bound(*, logs: Sequence[tuple[str, dict[int, list[float]]]],
                     seconds: Collection[int], min_requests: int,
                     slow_factor: float) -> float | None:
    """The median cycle over which a second is slow: ``slow_factor`` x the run's fastest second
    (None: no second judged)."""
    medians = _second_medians(logs=logs, seconds=seconds, min_requests=min_requests)
    return slow_factor * min(medians.values()) if medians else None


def report(*, logs: Sequence[tuple[str, dict[int, list[float]]]], seconds: Mapping[int, Second],
           min_requests: int, slow_factor: float) -> list[str]:
    """The printed lines: per log its slow and fast seconds, then both classes over the run."""
    medians = _second_medians(logs=logs, seconds=seconds, min_requests=min_requests)
    if not medians:
        return ["no second with enough prefills and a sample"]
    bound = slow_factor * min(medians.values())
    lines = [f"slow: a second whose median request cycle is over {bound:.1f} ms "
             f"({slow_factor:g} x the run's fastest second)"]
    classes: dict[str, list[tuple[float, Second]]] = {"slow": [], "fast": []}
    for name, _ in logs:
        mine = [(cycle, seconds[second]) for (log, second), cycle in sorted(medians.items())
                if log == name]
        slow = sum(cycle > bound for cycle, _ in mine)
        probe = ""
        for label, values in (
            ("probe", [second.probe_us for _, second in mine]),
            ("memory probe", [second.probe_mem_us for _, second in mine]),
        ):
            known = [value for value in values if value is not None]
            if known:
                probe += f"; the {label} {statistics.median(known):.0f} µs"
        cycles = (f", median cycle {statistics.median(cycle for cycle, _ in mine):.1f} ms"
                  if mine else "")
        lines.append(f"{name}: {len(mine)} seconds, {slow} slow{cycles}{probe}")
        for cycle, second in mine:
            classes["slow" if cycle > bound else "fast"].append((cycle, second))
    for label, members in classes.items():
        if not members:
            lines.append(f"{label} seconds: none")
            continue
        picked = [second for _, second in members]

        def mean(values: Iterable[float | None], *, scale: float = 1.0) -> str:
            known = [scale * value for value in values if value is not None]
            return f"{statistics.fmean(known):.1f}" if known else "-"

        busiest = max((second.busiest_other for second in picked), key=lambda pair: pair[1])
        lines.append(
            f"{label} seconds: {len(members)}, median cycle "
            f"{statistics.median(cycle for cycle, _ in members):.1f} ms; SM clock "
            f"{mean(s.sm_mhz for s in picked)} MHz, GPU busy {mean(s.gpu_util for s in picked)} %; "
            f"scheduler on a CPU {mean(100 * s.scheduler_cpu for s in picked)} % (in the kernel "
            f"{mean((s.scheduler_kernel for s in picked), scale=100)} %), waiting "
            f"{mean(100 * s.scheduler_wait for s in picked)} %, "
            f"{mean(s.scheduler_faults_per_s for s in picked)} minor faults/s; the other threads "
            f"{mean(100 * s.others_cpu for s in picked)} % of a CPU together, the busiest "
            f"{busiest[0]} {100 * busiest[1]:.0f} %; the probe "
            f"{mean(s.probe_us for s in picked)} µs"
            + ("" if all(s.probe_mem_us is None for s in picked)
               else f", the memory probe {mean(s.probe_mem_us for s in picked)} µs"))
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("logs", type=pathlib.Path,
                        help="the run's server logs: a folder or a .tar.gz of one")
    parser.add_argument("--samples", type=pathlib.Path, required=True,
                        help="machine_sampler.py's JSON lines (.jsonl or .jsonl.gz)")
    parser.add_argument("--new-tokens", type=int, default=128,
                        help="prompt tokens of the batch-1 prefills to read (default 128)")
    parser.add_argument("--min-requests", type=int, default=5,
                        help="prefills a second needs to be judged (>= 1; default 5)")
    parser.add_argument("--slow-factor", type=float, default=1.3,
                        help="slow: over this times the fastest second (> 1; default 1.3)")
    parser.add_argument("--cpu-probe", type=pathlib.Path,
                        help="machine_sampler.py --probe-only lines from the scheduler's own CPU: "
                             "also judge the seconds by that vCPU's speed")
    parser.add_argument("--fast-factor", type=float, default=1.15,
                        help="--cpu-probe: a fast second's probe is under this times the "
                             "probe's p10 (> 1; default 1.15)")
    options = parser.parse_args(argv)
    if options.min_requests < 1:
        parser.error(f"--min-requests={options.min_requests} is invalid; allowed: an integer >= 1")
    if not options.slow_factor > 1:
        parser.error(f"--slow-factor={options.slow_factor} is invalid; allowed: > 1")
    if not options.fast_factor > 1:
        parser.error(f"--fast-factor={options.fast_factor} is invalid; allowed: > 1")
    for path in (options.logs, options.samples, options.cpu_probe):
        if path is not None and not path.exists():
            parser.error(f"{path} does not exist")
    samples = list(_open_text(options.samples))
    seconds = sampled_seconds(samples)
    logs = [(name, cycles_by_second(lines, new_tokens=options.new_tokens))
            for name, lines in logs_of(options.logs)]
    for line in report(logs=logs, seconds=seconds, min_requests=options.min_requests,
                       slow_factor=options.slow_factor) + probe_spread(samples):
        print(line)
    if options.cpu_probe is not None:
        cpu_lines = list(_open_text(options.cpu_probe))
        slow_cycle_ms = slow_cycle_bound(logs=logs, seconds=seconds,
                                         min_requests=options.min_requests,
                                         slow_factor=options.slow_factor)
        for line in gated_report(logs=logs, cpu_probe=probe_by_second(cpu_lines),
                                 cpu_memory_probe=probe_by_second(cpu_lines, key="probe_mem_us"),
                                 min_requests=options.min_requests,
                                 fast_factor=options.fast_factor, slow_cycle_ms=slow_cycle_ms):
            print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
