"""Where the KV canary's GPU time goes in one decode step of a real SGLang server, by kernel name,
for several configurations side by side in one run.

What it measures: for one model (``--model``), one workload (``--workload``) and each
configuration of ``--configs`` (the names and environments of ``bench_server_overhead.py``:
``off``, ``oracle``, ``canary``, ``canary+partial``, ``all-checks``, ``stock``,
``stock-piecewise``), the GPU work of the server's decode steps as SGLang's torch profiler
records it (kineto / CUPTI, GPU activity only, no stacks, no shapes): per configuration the GPU
busy time per step (the union of every kernel, memcpy and memset interval), the kernel time and
the number of kernels, memcpys and memsets per step, and the top kernels by time per step; then,
for every other configuration, what differs from the first one (default ``off``): kernels it
adds first, then kernels it drops, kernels whose count per step differs, and kernels whose time
per step differs by at least ``--diff-min-us`` and 5 %. That is "what the canary adds per step".

How, per configuration (one server each, started and stopped here):

1. ``python -m sglang.launch_server`` with the flags of ``bench_server_overhead.py``
   (``launch_args``: ``TINY_MODEL_SERVER_ARGS``, the model's pool flags, the sampling backend)
   and the configuration's environment plus ``SGLANG_TORCH_PROFILER_DIR`` (this run's trace
   folder) and ``SGLANG_PROFILE_V2=false`` (the classic profiler path of SGLang's
   ``scheduler_profiler_mixin.py``, the one described here).
2. Round 0 of the workload (``server_workloads.run_round``: it flushes the radix cache, then
   the cached prefixes are prefilled), then round 1, timed as the benchmark does (its client
   ms per decode step is printed beside the GPU figures; nothing is being profiled then).
3. Round 2 streams in a background thread. When round 1 had streamed its last first token
   (plus its payload-building time, 4 of its decode steps and 50 ms), ``POST /start_profile``
   with ``{"output_dir", "num_steps": --profile-steps, "activities": ["GPU"], "with_stack":
   false, "record_shapes": false, "profile_prefix"}`` (``ProfileReqInput``). Without
   ``start_step`` SGLang starts the torch profiler at once and stops it by itself in
   ``run_batch`` when ``forward_ct`` reaches the count at the request plus ``num_steps``, so the
   trace holds the batches of ``num_steps - 1`` forward passes. It writes
   ``{profile_prefix}-{profile_id}-TP-0.trace.json.gz`` (gzip of a Chrome trace, written
   progressively: complete once it decompresses and parses). If round 2 ends without a trace,
   ``POST /stop_profile`` is sent. After round 2 the script checks, from round 2's own times,
   that the profile started after its last first token (printed as a note otherwise).
4. The server is stopped; the trace is read with the standard library.

How steps are delimited: decode runs as one CUDA graph replay per step (``--cuda-graph-max-bs``
64 covers every workload's batch), and a replay's kernels appear in the trace as ordinary
``kernel`` events whose ``args.correlation`` is that of the ``cudaGraphLaunch`` runtime event
(kineto records ``cuda_runtime`` and ``cuda_driver`` events with GPU activity alone). The step
markers are the ``cudaGraphLaunch`` (or ``cuGraphLaunch``) events whose graph ran at least half
as many GPU events as the largest one; K + 1 markers give K whole steps. Every GPU event
(kernel, memcpy, memset) is put in the step whose marker precedes its launch (the runtime or
driver event of the same correlation, on the CPU clock), so a step holds its graph replay and
everything the scheduler launched until the next replay (input preparation, sampling, the
canary's work outside the graph), and the partial steps at the window's edges are left out.
Figures per step are sums over the K steps divided by K. If more than 1 % of GPU events have no
launch record, the steps are cut on the GPU clock instead, at the first GPU event of each
marker's replay. Without two graph replays (CUDA graphs off) every GPU event of the trace is
divided by ``num_steps - 1`` (the scheduler's count; prefill batches in the window would then be
counted too). The method used is printed with every configuration, with the range of kernels per
step (equal bounds: identical steps).

Usage (on a GPU host with sglang 0.5.12.post1 and sglang-kv-canary installed)::

    python benchmark/profile_server_step.py [--model tiny|8b] [--configs off,oracle,all-checks]
        [--workload decode64_8k] [--profile-steps 20] [--top 15] [--diff-min-us 0.5]
        [--out-dir profile-out] [--time-budget-s 540]

Written under ``--out-dir`` (rewritten after every configuration): ``traces/MODEL-CONFIG/`` (the
raw ``*.trace.json.gz``), ``logs/MODEL-CONFIG.log`` (server logs), ``summary.txt`` (the printed
tables) and ``summary.json`` (every figure, every kernel's full name, the diffs, the options).

Time budget (``--time-budget-s``, default 540 s: a 10-minute command with room to stop): a
configuration starts only if the longest one so far (before the first: the model's estimates of
``bench_server_overhead.py`` plus 40 s) still fits; the rest are ``skipped: time budget`` and
what was profiled is reported.

Caveats:

- GPU time only, from CUPTI: kernel durations are the GPU's, but tracing adds CPU time to every
  launch, so the steps of the profiled round are slower than unprofiled ones; compare GPU
  figures with GPU figures, and the client ms/step (round 1, unprofiled) only for scale.
- Busy time is the union of GPU intervals; kernel time sums durations, so kernels overlapping on
  two streams count twice there.
- Kernel names are CUPTI's (demangled); kernels are grouped by full name, printed to 60
  characters (parameter lists dropped, a short hash added where two names would print alike).
- One window of ``--profile-steps`` steps per configuration, one server each: per-kernel times
  vary by a few % between runs; counts per step are exact when the steps are identical.
- ``decode64_8k`` on ``8b`` needs the KV pool of a 139 GiB H200; where the pool is too small the
  configuration is ``skipped: does not fit``.
"""

from __future__ import annotations

import argparse
import bisect
import concurrent.futures
import dataclasses
import gzip
import hashlib
import importlib.metadata
import json
import pathlib
import sys
import tempfile
import time
import zlib
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from sglang.srt.kv_canary.tools.server import (
    RunningServer,
    ServerLaunch,
    ServerStartError,
    start_server,
)

# Sibling modules (this directory is on sys.path when the script runs).
from bench_server_overhead import (
    CONFIGS,
    MODELS,
    READY_TIMEOUT_S,
    Deadline,
    ModelShape,
    ServerConfig,
    _names,
    launch_args,
    make_model,
    misfit,
    read_pool_limits,
    refusal_reason,
    server_note,
)
from server_workloads import WORKLOADS_BY_NAME, RoundTiming, Workload, run_round

DEFAULT_CONFIGS = ("off", "oracle", "all-checks")
DEFAULT_TIME_BUDGET_S = 540.0
TRACE_GLOB = "*.trace.json.gz"
PROFILE_OVERHEAD_S = 40.0  # profiler start, trace export and parse, round 2's tail, stopping
TRACE_TIMEOUT_S = 120.0  # from /start_profile to a complete trace
STOP_GRACE_S = 5.0  # round 2 ended this long ago without a trace: send /stop_profile
POLL_S = 0.2
TRIGGER_STEPS = 4  # decode steps after the last first token before /start_profile
TRIGGER_SLACK_S = 0.05
NAME_CHARS = 60
_REASON_CHARS = 240

GPU_KINDS = {"kernel": "kernel", "gpu_memcpy": "memcpy", "gpu_memset": "memset"}
LAUNCH_CATEGORIES = frozenset({"cuda_runtime", "cuda_driver"})
GRAPH_LAUNCHES = ("cudaGraphLaunch", "cuGraphLaunch")  # runtime and driver names
UNMATCHED_TOLERANCE = 0.01  # above this share of GPU events without a launch: the GPU clock
COUNT_TOLERANCE = 0.05  # per step: counts closer than this are equal
TIME_TOLERANCE = 0.05  # relative: a time change must also be at least this share of the base

LAUNCH_METHOD = "graph launches, by CPU launch time"
GPU_CLOCK_METHOD = "graph launches, by GPU start time"
SCHEDULER_METHOD = "scheduler step count (no CUDA graph replays in the trace)"


# ----------------------------------------------------------------------------- the trace

@dataclass(frozen=True, slots=True, kw_only=True)
class GpuEvent:
    """One kernel, memcpy or memset as the trace has it (µs on the trace's clock)."""

    name: str
    kind: str  # "kernel", "memcpy" or "memset"
    ts_us: float
    dur_us: float
    correlation: int | None


@dataclass(frozen=True, slots=True, kw_only=True)
class Launch:
    """One CUDA runtime or driver call with a correlation id (``cudaLaunchKernel``,
    ``cuLaunchKernel``, ``cudaGraphLaunch``, ``cudaMemcpyAsync``, ...), on the CPU clock."""

    name: str
    ts_us: float
    correlation: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Trace:
    """What the step attribution needs of a trace."""

    gpu_events: tuple[GpuEvent, ...]  # by start time
    launches: tuple[Launch, ...]  # by start time


def load_trace_events(path: pathlib.Path) -> list[Mapping[str, object]]:
    """The events of a Chrome trace file (``.json`` or ``.json.gz``; an object with
    ``traceEvents`` or a bare list).

    Raises:
        OSError, EOFError, zlib.error: the file is missing or its gzip stream is incomplete.
        ValueError: it is not (complete) JSON, or holds no event list.
    """
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as stream:
        document = json.load(stream)
    events = document.get("traceEvents") if isinstance(document, Mapping) else document
    if not isinstance(events, list):
        raise ValueError(f"{path} holds no list of trace events")
    return events


def _number(value: object) -> float | None:
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None


def _correlation(event: Mapping[str, object]) -> int | None:
    args = event.get("args")
    value = _number(args.get("correlation")) if isinstance(args, Mapping) else None
    return None if value is None else int(value)


def parse_trace(events: Iterable[Mapping[str, object]]) -> Trace:
    """The GPU events and the launch calls of a kineto trace (complete ``"ph": "X"`` events;
    categories ``kernel``, ``gpu_memcpy``, ``gpu_memset``, ``cuda_runtime``, ``cuda_driver``)."""
    gpu_events: list[GpuEvent] = []
    launches: list[Launch] = []
    for event in events:
        if not isinstance(event, Mapping) or event.get("ph") != "X":
            continue
        category = str(event.get("cat", "")).lower()
        ts_us = _number(event.get("ts"))
        if ts_us is None:
            continue
        name = str(event.get("name", ""))
        correlation = _correlation(event)
        if category in GPU_KINDS:
            gpu_events.append(GpuEvent(name=name, kind=GPU_KINDS[category], ts_us=ts_us,
                                       dur_us=_number(event.get("dur")) or 0.0,
                                       correlation=correlation))
        elif category in LAUNCH_CATEGORIES and correlation is not None:
            launches.append(Launch(name=name, ts_us=ts_us, correlation=correlation))
    gpu_events.sort(key=lambda gpu_event: gpu_event.ts_us)
    launches.sort(key=lambda launch: launch.ts_us)
    return Trace(gpu_events=tuple(gpu_events), launches=tuple(launches))


# ----------------------------------------------------------------------------- decode steps

@dataclass(frozen=True, slots=True, kw_only=True)
class StepWindow:
    """The GPU events of ``steps`` whole decode steps.

    Attributes:
        method: how the steps were cut (see the module docstring).
        kernels_per_step: kernels of each step (empty: steps not delimited).
        unattributed: GPU events left out because they have no launch record.
    """

    method: str
    steps: int
    events: tuple[GpuEvent, ...]
    kernels_per_step: tuple[int, ...] = ()
    unattributed: int = 0


def step_markers(trace: Trace) -> tuple[Launch, ...]:
    """The ``cudaGraphLaunch`` calls of decode steps: those whose replay ran at least half as
    many GPU events as the largest replay of the trace, by launch time."""
    sizes = Counter(event.correlation for event in trace.gpu_events
                    if event.correlation is not None)
    graphs = [launch for launch in trace.launches
              if launch.name.startswith(GRAPH_LAUNCHES) and sizes[launch.correlation]]
    if not graphs:
        return ()
    largest = max(sizes[launch.correlation] for launch in graphs)
    return tuple(launch for launch in graphs if 2 * sizes[launch.correlation] >= largest)


def _gpu_clock_bounds(trace: Trace, markers: Sequence[Launch]) -> list[float]:
    """The GPU start of each marker's replay (its first GPU event), in order."""
    starts: dict[int, float] = {}
    for event in trace.gpu_events:
        if event.correlation is not None:
            starts.setdefault(event.correlation, event.ts_us)  # events are by start time
    return sorted(starts[marker.correlation] for marker in markers)


def select_steps(trace: Trace, *, fallback_steps: int) -> StepWindow:
    """The whole decode steps of ``trace`` (see the module docstring); without two step
    markers, every GPU event over ``fallback_steps`` steps."""
    markers = step_markers(trace)
    if len(markers) < 2:
        return StepWindow(method=SCHEDULER_METHOD, steps=fallback_steps,
                          events=trace.gpu_events)
    launch_ts = {launch.correlation: launch.ts_us for launch in trace.launches}
    times: list[float | None] = [launch_ts.get(event.correlation)  # type: ignore[arg-type]
                                 for event in trace.gpu_events]
    unmatched = times.count(None)
    if unmatched <= UNMATCHED_TOLERANCE * len(times):
        method, bounds = LAUNCH_METHOD, [marker.ts_us for marker in markers]
    else:
        method, bounds, unmatched = GPU_CLOCK_METHOD, _gpu_clock_bounds(trace, markers), 0
        times = [event.ts_us for event in trace.gpu_events]
    steps: list[list[GpuEvent]] = [[] for _ in range(len(bounds) - 1)]
    for event, at in zip(trace.gpu_events, times):
        index = -1 if at is None else bisect.bisect_right(bounds, at) - 1
        if 0 <= index < len(steps):
            steps[index].append(event)
    return StepWindow(
        method=method, steps=len(steps),
        events=tuple(event for step in steps for event in step),
        kernels_per_step=tuple(sum(event.kind == "kernel" for event in step) for step in steps),
        unattributed=unmatched,
    )


# ----------------------------------------------------------------------------- per-step figures

@dataclass(frozen=True, slots=True, kw_only=True)
class KernelStat:
    """One GPU event name (kernel, memcpy or memset) per step."""

    name: str
    kind: str
    count_per_step: float
    us_per_step: float


@dataclass(frozen=True, slots=True, kw_only=True)
class StepSummary:
    """Per-step GPU figures of one configuration.

    Attributes:
        busy_us_per_step: the union of every GPU event's interval.
        kernel_us_per_step: the sum of kernel durations (overlaps count twice).
        kernels_per_step_range: (min, max) kernels of one step; None when steps were not cut.
        stats: every name, by time per step (largest first).
    """

    method: str
    steps: int
    busy_us_per_step: float
    kernel_us_per_step: float
    kernels_per_step: float
    memcpy_per_step: float
    memcpy_us_per_step: float
    memset_per_step: float
    memset_us_per_step: float
    kernels_per_step_range: tuple[int, int] | None
    unattributed: int
    stats: tuple[KernelStat, ...]


def busy_us(events: Iterable[GpuEvent]) -> float:
    """The length of the union of the events' intervals."""
    total, covered_to = 0.0, float("-inf")
    for start, end in sorted((event.ts_us, event.ts_us + event.dur_us) for event in events):
        if end > covered_to:
            total += end - max(start, covered_to)
            covered_to = end
    return total


def kernel_stats(events: Iterable[GpuEvent], *, steps: int) -> tuple[KernelStat, ...]:
    """Count and time per step of every (kind, name), by time per step (largest first)."""
    counts: Counter[tuple[str, str]] = Counter()
    durations: defaultdict[tuple[str, str], float] = defaultdict(float)
    for event in events:
        counts[event.kind, event.name] += 1
        durations[event.kind, event.name] += event.dur_us
    stats = [KernelStat(name=name, kind=kind, count_per_step=counts[kind, name] / steps,
                        us_per_step=durations[kind, name] / steps)
             for kind, name in counts]
    return tuple(sorted(stats, key=lambda stat: (-stat.us_per_step, stat.kind, stat.name)))


def summarise(window: StepWindow) -> StepSummary:
    """The per-step figures of a window.

    Raises:
        ValueError: the window holds no step.
    """
    if window.steps < 1:
        raise ValueError(f"no whole decode step in the trace ({window.method})")
    steps = window.steps

    def per_step(kind: str) -> tuple[float, float]:
        chosen = [event for event in window.events if event.kind == kind]
        return len(chosen) / steps, sum(event.dur_us for event in chosen) / steps

    kernels, kernel_us = per_step("kernel")
    memcpys, memcpy_us = per_step("memcpy")
    memsets, memset_us = per_step("memset")
    spread = window.kernels_per_step
    return StepSummary(
        method=window.method, steps=steps, busy_us_per_step=busy_us(window.events) / steps,
        kernel_us_per_step=kernel_us, kernels_per_step=kernels,
        memcpy_per_step=memcpys, memcpy_us_per_step=memcpy_us,
        memset_per_step=memsets, memset_us_per_step=memset_us,
        kernels_per_step_range=(min(spread), max(spread)) if spread else None,
        unattributed=window.unattributed, stats=kernel_stats(window.events, steps=steps),
    )


def summarise_trace(path: pathlib.Path, *, fallback_steps: int) -> StepSummary:
    """:func:`summarise` of the decode steps of a trace file."""
    return summarise(select_steps(parse_trace(load_trace_events(path)),
                                  fallback_steps=fallback_steps))


# ----------------------------------------------------------------------------- differences

@dataclass(frozen=True, slots=True, kw_only=True)
class KernelDiff:
    """One name whose presence, count or time per step differs from the baseline's.

    ``change``: ``added``, ``removed``, ``count`` or ``time``.
    """

    name: str
    kind: str
    change: str
    base_count: float
    count: float
    base_us: float
    us: float

    @property
    def delta_us(self) -> float:
        return self.us - self.base_us

    @property
    def delta_count(self) -> float:
        return self.count - self.base_count

    def to_json(self) -> dict[str, object]:
        return {**dataclasses.asdict(self), "delta_us": self.delta_us,
                "delta_count": self.delta_count}


_CHANGE_ORDER = {"added": 0, "removed": 1, "count": 2, "time": 3}


def _change(*, base: KernelStat | None, other: KernelStat | None, min_us: float) -> str | None:
    if base is None:
        return "added"
    if other is None:
        return "removed"
    if abs(other.count_per_step - base.count_per_step) >= COUNT_TOLERANCE:
        return "count"
    if abs(other.us_per_step - base.us_per_step) >= max(min_us,
                                                        TIME_TOLERANCE * base.us_per_step):
        return "time"
    return None


def diff_summaries(*, base: StepSummary, other: StepSummary,
                   min_us: float) -> tuple[KernelDiff, ...]:
    """What ``other`` runs per step that ``base`` does not, or differently: added names first,
    then removed ones, changed counts, then times changed by at least ``min_us`` and 5 %; each
    group by the size of its time change (largest first)."""
    base_stats = {(stat.kind, stat.name): stat for stat in base.stats}
    other_stats = {(stat.kind, stat.name): stat for stat in other.stats}
    diffs = []
    for key in dict.fromkeys([*other_stats, *base_stats]):
        before, after = base_stats.get(key), other_stats.get(key)
        change = _change(base=before, other=after, min_us=min_us)
        if change is not None:
            diffs.append(KernelDiff(
                name=key[1], kind=key[0], change=change,
                base_count=before.count_per_step if before else 0.0,
                count=after.count_per_step if after else 0.0,
                base_us=before.us_per_step if before else 0.0,
                us=after.us_per_step if after else 0.0))
    return tuple(sorted(diffs, key=lambda diff: (_CHANGE_ORDER[diff.change],
                                                 -abs(diff.delta_us), diff.name)))


# ----------------------------------------------------------------------------- printing

def short_name(name: str, *, kind: str = "kernel", width: int = NAME_CHARS) -> str:
    """A kernel name without ``void`` and its parameter list, cut to ``width`` characters."""
    text = name.strip()
    if kind == "kernel":
        text = text.removeprefix("void ")
        if text.endswith(")"):
            depth = 0
            for index in range(len(text) - 1, 0, -1):
                depth += {")": 1, "(": -1}.get(text[index], 0)
                if depth == 0:
                    text = text[:index].rstrip()
                    break
    return text if len(text) <= width else text[:width - 3] + "..."


def display_names(keys: Iterable[tuple[str, str]]) -> dict[tuple[str, str], str]:
    """Per (kind, name), its short name; names that would print alike get a short hash."""
    shorts = {key: short_name(key[1], kind=key[0]) for key in dict.fromkeys(keys)}
    clashes = Counter(shorts.values())
    for key, short in shorts.items():
        if clashes[short] > 1:
            digest = hashlib.sha1(key[1].encode()).hexdigest()[:6]
            shorts[key] = f"{short_name(key[1], kind=key[0], width=NAME_CHARS - 9)} [{digest}]"
    return shorts


def summary_lines(summary: StepSummary, *, client_step_ms: float | None) -> list[str]:
    """The per-step totals of one configuration."""
    spread = summary.kernels_per_step_range
    left_out = (f"; {summary.unattributed} GPU events without a launch record left out"
                if summary.unattributed else "")
    client = ("" if client_step_ms is None
              else f"; client {client_step_ms:.3f} ms/step (round 1, unprofiled)")
    return [
        f"{summary.steps} steps ({summary.method}); kernels per step "
        + ("not delimited" if spread is None else f"{spread[0]}..{spread[1]}") + left_out,
        f"GPU busy {summary.busy_us_per_step:.1f} us/step{client}",
        f"per step: kernels {summary.kernels_per_step:.2f} ({summary.kernel_us_per_step:.1f} "
        f"us), memcpy {summary.memcpy_per_step:.2f} ({summary.memcpy_us_per_step:.1f} us), "
        f"memset {summary.memset_per_step:.2f} ({summary.memset_us_per_step:.1f} us)",
    ]


def top_table(summary: StepSummary, *, top: int) -> list[str]:
    """The ``top`` names by time per step."""
    stats = summary.stats[:top]
    names = display_names((stat.kind, stat.name) for stat in stats)
    busy = summary.busy_us_per_step or 1.0
    lines = [f"  {'kind':<6} {'n/step':>8} {'us/step':>9} {'%busy':>6}  name"]
    lines += [f"  {stat.kind:<6} {stat.count_per_step:>8.2f} {stat.us_per_step:>9.2f} "
              f"{100 * stat.us_per_step / busy:>6.1f}  {names[stat.kind, stat.name]}"
              for stat in stats]
    if len(summary.stats) > top:
        rest = summary.stats[top:]
        lines.append(f"  ({len(rest)} more names, {sum(s.us_per_step for s in rest):.2f} "
                     "us/step together)")
    return lines


def diff_table(*, base: StepSummary, other: StepSummary,
               diffs: Sequence[KernelDiff]) -> list[str]:
    """Totals and the differing names of ``other`` vs ``base``."""
    lines = [
        f"  GPU busy {other.busy_us_per_step - base.busy_us_per_step:+.1f} us/step "
        f"({base.busy_us_per_step:.1f} -> {other.busy_us_per_step:.1f}); kernels "
        f"{other.kernels_per_step - base.kernels_per_step:+.2f}/step, "
        f"{other.kernel_us_per_step - base.kernel_us_per_step:+.1f} us; memcpy "
        f"{other.memcpy_per_step - base.memcpy_per_step:+.2f}/step; memset "
        f"{other.memset_per_step - base.memset_per_step:+.2f}/step",
    ]
    if not diffs:
        return lines + ["  no kernel differs"]
    names = display_names((diff.kind, diff.name) for diff in diffs)
    lines.append(f"  {'change':<7} {'kind':<6} {'n base':>7} {'n':>7} {'us base':>9} "
                 f"{'us':>9} {'d us':>8}  name")
    lines += [f"  {diff.change:<7} {diff.kind:<6} {diff.base_count:>7.2f} {diff.count:>7.2f} "
              f"{diff.base_us:>9.2f} {diff.us:>9.2f} {diff.delta_us:>+8.2f}  "
              f"{names[diff.kind, diff.name]}" for diff in diffs]
    return lines


# ----------------------------------------------------------------------------- one server

@dataclass(frozen=True, slots=True, kw_only=True)
class ConfigProfile:
    """One configuration's server and what its trace says.

    Attributes:
        status: ``profiled``, ``skipped: <why>``, ``refused: <reason>`` (the server stopped at
            start-up) or ``failed: <reason>``.
        notes: about the profiled window (when it started, a forced stop) and the canary.
    """

    config: str
    status: str
    summary: StepSummary | None = None
    client_step_ms: float | None = None
    trace_path: str | None = None
    log_path: str | None = None
    notes: tuple[str, ...] = ()
    duration_s: float = 0.0

    def to_json(self) -> dict[str, object]:
        return {**dataclasses.asdict(self),
                "summary": None if self.summary is None else dataclasses.asdict(self.summary)}


@dataclass(frozen=True, slots=True, kw_only=True)
class ProfiledRound:
    """Round 1's client step time, and round 2's trace with notes on its window."""

    trace_path: pathlib.Path
    client_step_ms: float
    notes: tuple[str, ...]


class TraceError(RuntimeError):
    """No complete trace came (message: why)."""


def profiler_env(trace_dir: pathlib.Path) -> dict[str, str]:
    """The server environment that selects the torch profiler and its default folder."""
    return {"SGLANG_TORCH_PROFILER_DIR": str(trace_dir), "SGLANG_PROFILE_V2": "false"}


def start_profile(server: RunningServer, *, trace_dir: pathlib.Path, steps: int,
                  prefix: str) -> None:
    """``POST /start_profile``: GPU activity for ``steps`` forward passes, no stacks, no shapes
    (returns once the scheduler started the profiler).

    Raises:
        ServerRequestError: the server refused or cannot be reached.
    """
    server.request_json("POST", "/start_profile", {
        "output_dir": str(trace_dir), "num_steps": steps, "activities": ["GPU"],
        "with_stack": False, "record_shapes": False, "profile_prefix": prefix,
    })


def _complete_trace(paths: Iterable[pathlib.Path]) -> pathlib.Path | None:
    """The first of ``paths`` that decompresses and parses completely."""
    for path in sorted(paths):
        try:
            load_trace_events(path)
        except (OSError, EOFError, zlib.error, ValueError):
            continue
        return path
    return None


def wait_for_trace(server: RunningServer, *, trace_dir: pathlib.Path,
                   known: Iterable[pathlib.Path], round_future: concurrent.futures.Future,
                   timeout_s: float) -> tuple[pathlib.Path, bool]:
    """The new complete trace file of ``trace_dir`` and whether ``/stop_profile`` had to be
    sent (round 2 ended ``STOP_GRACE_S`` before without a trace).

    Raises:
        TraceError: none within ``timeout_s``, or the server exited.
    """
    known = set(known)
    end = time.monotonic() + timeout_s
    round_ended_at: float | None = None
    stopped = False
    while time.monotonic() < end:
        path = _complete_trace(set(trace_dir.glob(TRACE_GLOB)) - known)
        if path is not None:
            return path, stopped
        if server.returncode is not None:
            raise TraceError(f"the server exited with code {server.returncode} before the "
                             "trace was written")
        if round_future.done() and not stopped:
            round_ended_at = round_ended_at or time.monotonic()
            if time.monotonic() - round_ended_at > STOP_GRACE_S:
                stopped = True
                try:
                    server.request_json("POST", "/stop_profile")
                except RuntimeError:  # it stopped by itself meanwhile: the trace is coming
                    pass
        time.sleep(POLL_S)
    raise TraceError(f"no complete {TRACE_GLOB} in {trace_dir} after {timeout_s:.0f} s")


def _timed_round(server: RunningServer, *, workload: Workload, vocab_size: int,
                 round_index: int, timeout_s: float) -> tuple[RoundTiming, float]:
    """:func:`run_round` and the monotonic time it returned at."""
    timing = run_round(server, workload=workload, vocab_size=vocab_size,
                       round_index=round_index, timeout_s=timeout_s, clock=time.monotonic)
    return timing, time.monotonic()


def window_notes(*, round_two: RoundTiming, ended_at: float, profile_sent_at: float,
                 forced_stop: bool) -> tuple[str, ...]:
    """Where the profile started in round 2 (from round 2's own times), and a forced stop."""
    last_first_token = ended_at - round_two.wall_s + max(round_two.ttft_s)
    lead_ms = 1e3 * (profile_sent_at - last_first_token)
    notes = [f"/start_profile sent {lead_ms:.0f} ms after round 2's last first token"
             if lead_ms >= 0 else
             f"/start_profile sent {-lead_ms:.0f} ms BEFORE round 2's last first token (a "
             "prefill may be in the window; graph-launch steps keep decode steps only)"]
    if forced_stop:
        notes.append("round 2 ended before --profile-steps forward passes; /stop_profile sent")
    return tuple(notes)


def round_two_notes(future: concurrent.futures.Future, *, profile_sent_at: float,
                    forced_stop: bool, timeout_s: float) -> tuple[str, ...]:
    """:func:`window_notes` once round 2 ended (waiting at most ``timeout_s``); a note that the
    window is unchecked if it failed or still runs (the trace is kept either way)."""
    try:
        round_two, ended_at = future.result(timeout=timeout_s)
    except (RuntimeError, concurrent.futures.TimeoutError) as error:
        return (f"round 2 did not complete ({_first_line(error)}); window unchecked",)
    return window_notes(round_two=round_two, ended_at=ended_at,
                        profile_sent_at=profile_sent_at, forced_stop=forced_stop)


def profile_round(server: RunningServer, *, model: ModelShape, workload: Workload,
                  steps: int, trace_dir: pathlib.Path, prefix: str,
                  deadline: Deadline) -> ProfiledRound:
    """Rounds 0 and 1, then round 2 in the background with the profiler started during its
    decode; its trace (see the module docstring).

    Raises:
        RuntimeError: a round failed, the server refused the profiler, or no trace came.
    """
    timeout_s = server.launch.request_timeout_s
    run_round(server, workload=workload, vocab_size=model.vocab_size, round_index=0,
              timeout_s=timeout_s, clock=time.monotonic)
    started = time.monotonic()
    round_one = run_round(server, workload=workload, vocab_size=model.vocab_size,
                          round_index=1, timeout_s=timeout_s, clock=time.monotonic)
    preparation_s = max(time.monotonic() - started - round_one.wall_s, 0.0)
    delay_s = (preparation_s + max(round_one.ttft_s) + TRIGGER_SLACK_S
               + TRIGGER_STEPS * round_one.step_ms / 1e3)
    known = set(trace_dir.glob(TRACE_GLOB))
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="round2")
    try:
        launched = time.monotonic()
        future = pool.submit(_timed_round, server, workload=workload,
                             vocab_size=model.vocab_size, round_index=2, timeout_s=timeout_s)
        concurrent.futures.wait([future],
                                timeout=max(delay_s - (time.monotonic() - launched), 0.0))
        if future.done():
            future.result()  # raises the round's error
            raise TraceError("round 2 ended before /start_profile was due")
        sent_at = time.monotonic()
        start_profile(server, trace_dir=trace_dir, steps=steps, prefix=prefix)
        trace_path, forced_stop = wait_for_trace(
            server, trace_dir=trace_dir, known=known, round_future=future,
            timeout_s=max(min(TRACE_TIMEOUT_S, deadline.remaining_s()), 1.0))
        notes = round_two_notes(future, profile_sent_at=sent_at, forced_stop=forced_stop,
                                timeout_s=max(deadline.remaining_s(), 1.0))
    finally:
        pool.shutdown(wait=False)
    return ProfiledRound(trace_path=trace_path, client_step_ms=round_one.step_ms, notes=notes)


def _first_line(error: BaseException) -> str:
    return (str(error).splitlines() or [type(error).__name__])[0][:_REASON_CHARS]


def profile_config(*, model: ModelShape, model_dir: pathlib.Path, config: ServerConfig,
                   workload: Workload, steps: int, out_dir: pathlib.Path,
                   deadline: Deadline) -> ConfigProfile:
    """Start one server with the profiler configured, profile ``steps`` forward passes of the
    workload's decode, stop it, summarise the trace. Failures become the status."""
    started = time.monotonic()
    label = f"{model.name}-{config.name}"
    trace_dir = (out_dir / "traces" / label).resolve()
    trace_dir.mkdir(parents=True, exist_ok=True)
    base_args, args = launch_args(model=model, config=config)
    ready_timeout_s = max(min(READY_TIMEOUT_S, deadline.remaining_s()), 1.0)
    launch = ServerLaunch(
        model_dir=model_dir, log_path=out_dir / "logs" / f"{label}.log",
        env={**config.env, **profiler_env(trace_dir)}, base_args=base_args, args=args,
        ready_timeout_s=ready_timeout_s, inherit_canary_env=False)

    def result(status: str, **fields: object) -> ConfigProfile:
        return ConfigProfile(config=config.name, status=status, log_path=str(launch.log_path),
                             duration_s=time.monotonic() - started, **fields)

    with start_server(launch) as server:
        try:
            server.wait_ready()
        except ServerStartError as error:
            if server.returncode is None:
                return result(f"failed: not ready within {ready_timeout_s:.0f} s")
            return result("refused: " + refusal_reason(log_text=server.log_text(),
                                                       fallback=str(error)))
        why = misfit(workload=workload, limits=read_pool_limits(server.log_text()))
        if why is not None:
            return result(f"skipped: {why}")
        try:
            profiled = profile_round(server, model=model, workload=workload, steps=steps,
                                     trace_dir=trace_dir, prefix=label, deadline=deadline)
        except RuntimeError as error:  # StreamError, ServerRequestError, TraceError
            return result(f"failed: {_first_line(error)}")
        note = server_note(config=config, log_text=server.log_text())
    try:
        summary = summarise_trace(profiled.trace_path, fallback_steps=steps - 1)
    except (OSError, EOFError, zlib.error, ValueError) as error:
        return result(f"failed: trace {profiled.trace_path}: {_first_line(error)}",
                      trace_path=str(profiled.trace_path))
    notes = profiled.notes + ((note,) if note != "-" else ())
    return result("profiled", summary=summary, client_step_ms=profiled.client_step_ms,
                  trace_path=str(profiled.trace_path), notes=notes)


# ----------------------------------------------------------------------------- the run

@dataclass(frozen=True, slots=True, kw_only=True)
class ProfileOptions:
    model: str
    configs: tuple[str, ...]
    workload: str
    profile_steps: int
    top: int
    diff_min_us: float
    out_dir: pathlib.Path
    time_budget_s: float

    def to_json(self) -> dict[str, object]:
        return {**dataclasses.asdict(self), "out_dir": str(self.out_dir)}


def parse_args(argv: Sequence[str] | None = None) -> ProfileOptions:
    """The options; bad values exit with status 2 and a message naming the option."""
    parser = argparse.ArgumentParser(prog="profile_server_step.py",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="tiny", choices=list(MODELS),
                        help="the dummy-weight model (default tiny)")
    parser.add_argument("--configs", default=",".join(DEFAULT_CONFIGS),
                        help=f"comma-separated, in run order, of {', '.join(CONFIGS)}; the "
                             f"first is the baseline (default {','.join(DEFAULT_CONFIGS)})")
    parser.add_argument("--workload", default="decode64_8k", choices=list(WORKLOADS_BY_NAME),
                        help="the workload whose decode is profiled (default decode64_8k)")
    parser.add_argument("--profile-steps", type=int, default=20,
                        help="num_steps of /start_profile: forward passes in the profile "
                             "(default 20; at most half the workload's new tokens)")
    parser.add_argument("--top", type=int, default=15,
                        help="names listed per configuration (default 15)")
    parser.add_argument("--diff-min-us", type=float, default=0.5,
                        help="smallest time change per step listed in a diff (default 0.5)")
    parser.add_argument("--out-dir", type=pathlib.Path, default=pathlib.Path("profile-out"),
                        help="traces, server logs, summary.txt and summary.json (default "
                             "profile-out)")
    parser.add_argument("--time-budget-s", type=float, default=DEFAULT_TIME_BUDGET_S,
                        help="start no server that would end later than this many seconds "
                             f"after the start (default {DEFAULT_TIME_BUDGET_S:.0f})")
    namespace = parser.parse_args(argv)
    most_steps = WORKLOADS_BY_NAME[namespace.workload].new_tokens // 2
    if not 3 <= namespace.profile_steps <= most_steps:
        parser.error(f"--profile-steps={namespace.profile_steps} is invalid; allowed for "
                     f"{namespace.workload}: 3..{most_steps}")
    if namespace.top < 1:
        parser.error(f"--top={namespace.top} is invalid; allowed: an integer >= 1")
    if not namespace.diff_min_us >= 0:
        parser.error(f"--diff-min-us={namespace.diff_min_us} is invalid; allowed: >= 0")
    if not namespace.time_budget_s > 0:
        parser.error(f"--time-budget-s={namespace.time_budget_s} is invalid; allowed: > 0")
    return ProfileOptions(
        model=namespace.model,
        configs=_names(parser, option="--configs", text=namespace.configs,
                       allowed=list(CONFIGS)),
        workload=namespace.workload, profile_steps=namespace.profile_steps, top=namespace.top,
        diff_min_us=namespace.diff_min_us, out_dir=namespace.out_dir,
        time_budget_s=namespace.time_budget_s)


def first_estimate_s(*, model: ModelShape, workload: Workload) -> float:
    """One server before any was timed: start, rounds 0 to 2, profiling and stopping."""
    return (model.startup_estimate_s + model.warm_up_estimate_s[workload.name]
            + 2 * model.round_estimate_s[workload.name] + PROFILE_OVERHEAD_S)


def report_text(*, options: ProfileOptions, model: ModelShape, workload: Workload,
                results: Sequence[ConfigProfile]) -> str:
    """The tables: per configuration its totals and top names, then each diff vs the first
    configuration, then every configuration not profiled."""
    lines = [f"== profile_server_step: {model.name}, {workload.name}, num_steps "
             f"{options.profile_steps}, baseline {options.configs[0]} ==",
             f"model: {model.describe()}", f"workload: {workload.describe()}", ""]
    for result in results:
        if result.summary is None:
            continue
        lines.append(f"-- {result.config} --")
        lines += summary_lines(result.summary, client_step_ms=result.client_step_ms)
        lines += [f"note: {note}" for note in result.notes]
        lines += top_table(result.summary, top=options.top) + [""]
    lines += diff_lines(options=options, results=results)
    lines += [f"{result.config}: {result.status}" for result in results
              if result.summary is None]
    return "\n".join(lines).rstrip() + "\n"


def diffs_by_config(*, options: ProfileOptions,
                    results: Sequence[ConfigProfile]) -> dict[str, tuple[KernelDiff, ...]]:
    """Per profiled configuration after the first, its diff vs the first (the baseline)."""
    by_name = {result.config: result for result in results}
    base = by_name.get(options.configs[0])
    if base is None or base.summary is None:
        return {}
    return {result.config: diff_summaries(base=base.summary, other=result.summary,
                                          min_us=options.diff_min_us)
            for result in results
            if result.summary is not None and result.config != base.config}


def diff_lines(*, options: ProfileOptions, results: Sequence[ConfigProfile]) -> list[str]:
    baseline = options.configs[0]
    by_name = {result.config: result for result in results}
    diffs = diffs_by_config(options=options, results=results)
    if not diffs:
        return [f"(no diff: the baseline {baseline} or every other configuration has no "
                "trace)", ""] if len(results) > 1 else []
    lines = []
    for name, rows in diffs.items():
        lines.append(f"-- {name} vs {baseline}: what it adds per step --")
        lines += diff_table(base=by_name[baseline].summary, other=by_name[name].summary,
                            diffs=rows) + [""]
    return lines


def report_json(*, options: ProfileOptions, model: ModelShape, workload: Workload,
                results: Sequence[ConfigProfile]) -> dict[str, object]:
    return {
        "sglang_version": importlib.metadata.version("sglang"),
        "options": options.to_json(),
        "model": {**dataclasses.asdict(model), "description": model.describe()},
        "workload": dataclasses.asdict(workload),
        "configs": {name: {**CONFIGS[name].to_json(),
                           "server_args": list(sum(launch_args(model=model,
                                                               config=CONFIGS[name]), ()))}
                    for name in options.configs},
        "baseline": options.configs[0],
        "results": [result.to_json() for result in results],
        "diffs": {name: [row.to_json() for row in rows]
                  for name, rows in diffs_by_config(options=options, results=results).items()},
    }


def write_reports(*, options: ProfileOptions, model: ModelShape, workload: Workload,
                  results: Sequence[ConfigProfile]) -> str:
    """Write ``summary.txt`` and ``summary.json``; the text."""
    text = report_text(options=options, model=model, workload=workload, results=results)
    (options.out_dir / "summary.txt").write_text(text, encoding="utf-8")
    document = report_json(options=options, model=model, workload=workload, results=results)
    (options.out_dir / "summary.json").write_text(json.dumps(document, indent=1) + "\n",
                                                  encoding="utf-8")
    return text


def progress_line(result: ConfigProfile) -> str:
    parts = [f"{result.config}: {result.status} after {result.duration_s:.0f} s"]
    if result.summary is not None:
        parts.append(f"{result.summary.busy_us_per_step:.1f} GPU us/step over "
                     f"{result.summary.steps} steps; trace {result.trace_path}")
    return "; ".join(parts + list(result.notes))


def main(argv: Sequence[str] | None = None) -> int:
    """Profile every configuration that fits the budget; always 0 (what failed is reported)."""
    options = parse_args(argv)
    deadline = Deadline.after(options.time_budget_s)
    model, workload = MODELS[options.model], WORKLOADS_BY_NAME[options.workload]
    options.out_dir.mkdir(parents=True, exist_ok=True)
    print(f"out dir {options.out_dir}; time budget {options.time_budget_s:.0f} s", flush=True)
    results: list[ConfigProfile] = []
    profiled_s: list[float] = []  # durations of the servers profiled so far
    with tempfile.TemporaryDirectory(prefix="kv_canary_profile_model_") as models_root:
        model_dir = make_model(model, directory=pathlib.Path(models_root) / model.name)
        for name in options.configs:
            estimate_s = (max(profiled_s) if profiled_s
                          else first_estimate_s(model=model, workload=workload))
            if not deadline.allows(estimate_s):
                result = ConfigProfile(
                    config=name, status=f"skipped: time budget ({estimate_s:.0f} s needed, "
                                        f"{max(deadline.remaining_s(), 0.0):.0f} s left)")
            else:
                result = profile_config(model=model, model_dir=model_dir, config=CONFIGS[name],
                                        workload=workload, steps=options.profile_steps,
                                        out_dir=options.out_dir, deadline=deadline)
                if result.status == "profiled":
                    profiled_s.append(result.duration_s)
            results.append(result)
            print(progress_line(result), flush=True)
            write_reports(options=options, model=model, workload=workload, results=results)
    print("\n" + write_reports(options=options, model=model, workload=workload,
                               results=results), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
