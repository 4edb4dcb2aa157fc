"""Where the KV canary's GPU time goes in one decode step of a real SGLang server, by kernel name,
for several configurations side by side in one run.

What it measures: for one model (``--model``), one workload (``--workload``) and each
configuration of ``--configs`` (the names and environments of ``bench_server_overhead.py``:
``off``, ``oracle``, ``canary``, ``canary+partial``, ``all-checks``, ``stock``,
``stock-piecewise``), the GPU work of the server's decode steps as SGLang's torch profiler
records it (kineto / CUPTI; GPU activity only, no stacks, no shapes): per configuration the GPU
busy time per step (the union of every kernel, memcpy and memset interval), the kernel time and
the number of kernels, memcpys and memsets per step, and the top kernels by time per step; then,
for every other configuration, what differs from the first one (default ``off``): kernels it
adds first, then kernels it drops, kernels whose count per step differs, and kernels whose time
per step differs by at least ``--diff-min-us`` and 5 %. That is "what the canary adds per step".
With ``--cpu``, also the host (Python) time of the scheduler's main thread per step, by function
(see "Host time" below): on a small model the canary's cost is mostly Python, not GPU time.

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
   false, "record_shapes": false, "profile_prefix"}`` (``ProfileReqInput``; with ``--cpu``:
   ``"activities": ["CPU", "GPU"], "with_stack": true``). Without
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

Host time (``--cpu``): the classic profiler path passes ``with_stack`` to
``torch.profiler.profile`` (the server also gets ``SGLANG_PROFILE_WITH_STACK=true``: the
tokenizer manager drops the request's ``with_stack`` when it is false); with CPU activity that
starts torch's Python tracer, whose calls the trace holds as ``python_function`` events
(``path/to/file.py(123): func``, or a C function's repr; ``at 0x...`` addresses are dropped so
that one builtin called on many objects is one name). Of the scheduler process's threads the
main one is the thread of the decode graph launches (``cudaGraphLaunch`` runtime events), or
where the trace numbers threads apart, the thread inside a Python call at half the graph
launches or more that makes the most calls (a thread blocked in one long wait has time but few
calls). Its calls nest by time. The window is that of the GPU steps: from the first to the last
of the K + 1 decode graph launches on the CPU clock (without them, the thread's whole traced
span over ``num_steps - 1``), and every host figure is the total over that window divided by K
(a call's time is its overlap with the window; it is counted as a call if it starts in it).
Per configuration: the window's wall time per step, the time inside Python calls and inside
``kv_canary`` code; the top 25 functions by inclusive time per step (a call inside a call of
the same name, recursion, not counted again), the top 25 by self time (duration minus direct
children), the functions whose file path contains ``kv_canary`` (inclusive time and calls per
step); then per configuration the functions whose inclusive time differs from the baseline's
by 20 us/step or more (added ones first). Names print as the last two path components, line and
function, at most 80 characters. The Python tracer slows every call several-fold, so host
figures are for comparing configurations with each other, not absolute costs; the GPU figures
come from the same (slower) steps. Traces are read as a stream (one event at a time); a trace
over 1.5 GB of JSON gets GPU figures only (``host (Python): skipped``). A trace with stacks
grows with ``--profile-steps`` (default 20; lower it if traces get large).

Usage (on a GPU host with sglang 0.5.12.post1 and sglang-kv-canary installed)::

    python benchmark/profile_server_step.py [--model tiny|8b] [--configs off,oracle,all-checks]
        [--workload decode64_8k] [--profile-steps 20] [--top 15] [--diff-min-us 0.5]
        [--out-dir profile-out] [--time-budget-s 540] [--cpu]

Written under ``--out-dir`` (rewritten after every configuration): ``traces/MODEL-CONFIG/`` (the
raw ``*.trace.json.gz``), ``logs/MODEL-CONFIG.log`` (server logs), ``summary.txt`` (the printed
tables) and ``summary.json`` (every figure, every kernel's full name, the diffs, the options;
with ``--cpu`` every function's host figures under ``host`` and the host diffs).

Time budget (``--time-budget-s``, default 540 s: a 10-minute command with room to stop): a
configuration starts only if the longest one so far (before the first: the model's estimates of
``bench_server_overhead.py`` plus 40 s, plus 60 s with ``--cpu``) still fits; the rest are
``skipped: time budget`` and what was profiled is reported.

Caveats:

- GPU time from CUPTI (host time only with ``--cpu``): kernel durations are the GPU's, but
  tracing adds CPU time to every launch, so the steps of the profiled round are slower than
  unprofiled ones; compare GPU figures with GPU figures, and the client ms/step (round 1,
  unprofiled) only for scale.
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
import functools
import gzip
import hashlib
import importlib.metadata
import json
import pathlib
import re
import sys
import tempfile
import time
import zlib
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TextIO

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

PYTHON_CATEGORY = "python_function"
CANARY_PATH_PART = "kv_canary"  # host section: functions whose file path contains this
CPU_TOP = 25  # functions per host table
CPU_DIFF_MIN_US = 20.0  # host diff: smallest change of inclusive time per step listed
FUNCTION_CHARS = 80
MAX_HOST_TRACE_BYTES = 1.5e9  # uncompressed JSON; larger traces: GPU figures only
CPU_PROFILE_OVERHEAD_S = 60.0  # with --cpu: slower steps, a larger export and parse
CPU_TRACE_TIMEOUT_S = 240.0
READ_CHARS = 1 << 22  # characters per read of the streaming trace reader
MAX_VALUE_CHARS = 1 << 26  # an event this long without parsing: the JSON is broken
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")
_FRAME = re.compile(r"^(?P<path>[^()]*)\((?P<line>\d+)\): (?P<function>.*)$", re.DOTALL)

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
    ``cuLaunchKernel``, ``cudaGraphLaunch``, ``cudaMemcpyAsync``, ...), on the CPU clock;
    ``thread`` is ``"pid:tid"`` of the calling thread as the trace has it."""

    name: str
    ts_us: float
    correlation: int
    thread: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class PyEvent:
    """One Python call (``python_function`` event of ``with_stack``) on the CPU clock.

    ``name``: ``path/to/file.py(123): func`` or a C function's repr, without ``at 0x...``
    addresses (so that calls of one builtin on different objects share a name).
    """

    name: str
    thread: str  # "pid:tid"
    ts_us: float
    dur_us: float


@dataclass(frozen=True, slots=True, kw_only=True)
class Trace:
    """What the step attribution (and, with ``--cpu``, the host analysis) needs of a trace."""

    gpu_events: tuple[GpuEvent, ...]  # by start time
    launches: tuple[Launch, ...]  # by start time
    python_events: tuple[PyEvent, ...] = ()  # as the trace lists them


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


_WHITESPACE = re.compile(r"[ \t\n\r]*")
_DECODER = json.JSONDecoder()


class _JsonStream:
    """One JSON document read value by value from a text stream (``json.JSONDecoder.raw_decode``
    on a buffer refilled ``read_chars`` at a time), so that a trace's events can be consumed
    without holding the whole document."""

    def __init__(self, stream: TextIO, *, read_chars: int) -> None:
        self._stream, self._read_chars = stream, read_chars
        self._buffer, self._pos, self._eof = "", 0, False

    def _fill(self) -> bool:
        """Append a chunk (dropping what was consumed); False at the end of the stream."""
        if self._eof:
            return False
        chunk = self._stream.read(self._read_chars)
        if not chunk:
            self._eof = True
            return False
        self._buffer = self._buffer[self._pos:] + chunk
        self._pos = 0
        return True

    def peek(self) -> str:
        """The next character that is not whitespace ("" at the end of the stream)."""
        if self._pos < len(self._buffer) and self._buffer[self._pos] not in " \t\n\r":
            return self._buffer[self._pos]
        while True:
            self._pos = _WHITESPACE.match(self._buffer, self._pos).end()  # type: ignore[union-attr]
            if self._pos < len(self._buffer):
                return self._buffer[self._pos]
            if not self._fill():
                return ""

    def expect(self, char: str) -> None:
        found = self.peek()
        if found != char:
            raise ValueError(f"expected {char!r} in the trace's JSON, found {found!r}")
        self._pos += 1

    def value(self) -> object:
        """The next JSON value."""
        self.peek()
        while True:
            try:
                value, end = _DECODER.raw_decode(self._buffer, self._pos)
            except json.JSONDecodeError as error:
                if len(self._buffer) - self._pos < MAX_VALUE_CHARS and self._fill():
                    continue
                raise ValueError(f"the trace's JSON is invalid or truncated: {error}") from None
            if end == len(self._buffer) and self._fill():
                continue  # a number may go on in the next chunk
            self._pos = end
            return value

    def items(self) -> Iterator[object]:
        """The values of the array that starts here."""
        self.expect("[")
        if self.peek() == "]":
            self._pos += 1
            return
        while True:
            yield self.value()
            separator = self.peek()
            if separator not in (",", "]"):
                raise ValueError("the trace's JSON is truncated or its event list malformed "
                                 f"(found {separator!r} after an event)")
            self._pos += 1
            if separator == "]":
                return


def iter_trace_events(path: pathlib.Path, *,
                      read_chars: int = READ_CHARS) -> Iterator[object]:
    """The events of a Chrome trace file, like :func:`load_trace_events` but one at a time
    (memory: one chunk and one event; keys after ``traceEvents`` are not read).

    Raises:
        OSError, EOFError, zlib.error: the file is missing or its gzip stream is incomplete.
        ValueError: it is not (complete) JSON, or holds no event list.
    """
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as text:
        stream = _JsonStream(text, read_chars=read_chars)  # type: ignore[arg-type]
        first = stream.peek()
        if first == "{":
            stream.expect("{")
            while stream.peek() == '"':
                key = stream.value()
                stream.expect(":")
                if key == "traceEvents" and stream.peek() == "[":
                    break
                stream.value()
                if stream.peek() == ",":
                    stream.expect(",")
            else:
                raise ValueError(f"{path} holds no list of trace events")
        elif first != "[":
            raise ValueError(f"{path} holds no list of trace events")
        yield from stream.items()


def uncompressed_bytes(path: pathlib.Path) -> int:
    """The size of a trace's JSON: the file's size, or for ``.gz`` the gzip trailer's size
    (modulo 4 GiB there; corrected upward while under twice the compressed size)."""
    size = path.stat().st_size
    if not path.name.endswith(".gz") or size < 18:
        return size
    with open(path, "rb") as stream:
        stream.seek(-4, 2)
        estimate = int.from_bytes(stream.read(4), "little")
    while size > 1 << 20 and estimate < 2 * size:
        estimate += 1 << 32
    return estimate


def _number(value: object) -> float | None:
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None


def _correlation(event: Mapping[str, object]) -> int | None:
    args = event.get("args")
    value = _number(args.get("correlation")) if isinstance(args, Mapping) else None
    return None if value is None else int(value)


def _thread(event: Mapping[str, object]) -> str:
    return sys.intern(f"{event.get('pid')}:{event.get('tid')}")


def function_key(name: str) -> str:
    """A ``python_function`` name without ``at 0x...`` addresses (interned)."""
    return sys.intern(_ADDRESS.sub("", name) if " at 0x" in name else name)


def parse_trace(events: Iterable[Mapping[str, object]], *, python: bool = False) -> Trace:
    """The GPU events and the launch calls of a kineto trace (complete ``"ph": "X"`` events;
    categories ``kernel``, ``gpu_memcpy``, ``gpu_memset``, ``cuda_runtime``, ``cuda_driver``),
    and with ``python`` its ``python_function`` events too."""
    gpu_events: list[GpuEvent] = []
    launches: list[Launch] = []
    python_events: list[PyEvent] = []
    wanted = GPU_KINDS.keys() | LAUNCH_CATEGORIES | ({PYTHON_CATEGORY} if python else set())
    for event in events:
        if type(event) is not dict and not isinstance(event, Mapping):
            continue
        category = event.get("cat", "")
        category = category.lower() if isinstance(category, str) else str(category).lower()
        if category not in wanted or event.get("ph") != "X":
            continue
        ts_us = _number(event.get("ts"))
        if ts_us is None:
            continue
        name = str(event.get("name", ""))
        if category == PYTHON_CATEGORY:
            python_events.append(PyEvent(name=function_key(name), thread=_thread(event),
                                         ts_us=ts_us,
                                         dur_us=max(_number(event.get("dur")) or 0.0, 0.0)))
            continue
        correlation = _correlation(event)
        if category in GPU_KINDS:
            gpu_events.append(GpuEvent(name=name, kind=GPU_KINDS[category], ts_us=ts_us,
                                       dur_us=_number(event.get("dur")) or 0.0,
                                       correlation=correlation))
        elif correlation is not None:
            launches.append(Launch(name=name, ts_us=ts_us, correlation=correlation,
                                   thread=_thread(event)))
    gpu_events.sort(key=lambda gpu_event: gpu_event.ts_us)
    launches.sort(key=lambda launch: launch.ts_us)
    return Trace(gpu_events=tuple(gpu_events), launches=tuple(launches),
                 python_events=tuple(python_events))


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
    return analyse_trace(path, fallback_steps=fallback_steps, host=False).summary


@dataclass(frozen=True, slots=True, kw_only=True)
class TraceAnalysis:
    """A trace's GPU figures, and with ``--cpu`` its host figures or why there are none."""

    summary: StepSummary
    host: HostSummary | None = None
    host_note: str | None = None


def analyse_trace(path: pathlib.Path, *, fallback_steps: int, host: bool,
                  max_host_bytes: float = MAX_HOST_TRACE_BYTES) -> TraceAnalysis:
    """One streaming pass over a trace file: :func:`summarise` of its decode steps and, with
    ``host``, :func:`summarise_host` (skipped, with a note, for JSON over ``max_host_bytes``).

    Raises:
        OSError, EOFError, zlib.error, ValueError: as :func:`iter_trace_events`; ValueError too
            when the window holds no step.
    """
    note = None
    if host and (size := uncompressed_bytes(path)) > max_host_bytes:
        note = (f"skipped: the trace holds {size / 1e9:.2f} GB of JSON, over "
                f"{max_host_bytes / 1e9:.2f} GB (profile fewer --profile-steps)")
        host = False
    trace = parse_trace(iter_trace_events(path), python=host)  # type: ignore[arg-type]
    summary = summarise(select_steps(trace, fallback_steps=fallback_steps))
    host_summary = summarise_host(trace, fallback_steps=fallback_steps) if host else None
    if host and host_summary is None:
        note = "no python_function events in the trace (stacks were not recorded)"
    return TraceAnalysis(summary=summary, host=host_summary, host_note=note)


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


# ----------------------------------------------------------------------------- host time

@dataclass(frozen=True, slots=True, kw_only=True)
class FunctionStat:
    """One Python function (or C function) of the main thread, per step.

    Attributes:
        calls_per_step: its calls that start in the window.
        inclusive_us_per_step: the window's part of its calls, a call inside a call of the same
            name (recursion) not counted again.
        self_us_per_step: the window's part of its calls minus that of their direct children.
    """

    name: str
    calls_per_step: float
    inclusive_us_per_step: float
    self_us_per_step: float


@dataclass(frozen=True, slots=True, kw_only=True)
class HostSummary:
    """Python time of the scheduler's main thread per decode step (``python_function`` events).

    Attributes:
        thread: ``"pid:tid"`` of the main thread; ``thread_rule``: how it was chosen.
        threads: threads with ``python_function`` events.
        window: which span of the thread was summed; every figure is that total / ``steps``.
        wall_us_per_step: the window's length.
        python_us_per_step: time inside (outermost) Python calls.
        canary_us_per_step: time inside outermost calls of functions whose path contains
            ``kv_canary``.
        calls_per_step: calls that start in the window.
        functions: every function with calls or time in the window, by inclusive time.
    """

    thread: str
    thread_rule: str
    threads: int
    window: str
    steps: int
    wall_us_per_step: float
    python_us_per_step: float
    canary_us_per_step: float
    calls_per_step: float
    functions: tuple[FunctionStat, ...]

    def canary_functions(self) -> tuple[FunctionStat, ...]:
        return tuple(stat for stat in self.functions if is_canary_function(stat.name))


STEP_WINDOW = "from the first to the last decode graph launch (CPU clock), as the GPU steps"
WHOLE_WINDOW = "the thread's whole traced span (no graph launches: the scheduler's step count)"
THREAD_OF_LAUNCHES = "the thread of the graph launches"
THREAD_IN_LAUNCHES = "most calls among threads inside a Python call at the graph launches"
THREAD_MOST_CALLS = "most calls"


def function_path(name: str) -> str:
    """The file path of a ``path/to/file.py(123): func`` name ("" for C functions)."""
    match = _FRAME.match(name)
    return match["path"] if match else ""


@functools.lru_cache(maxsize=1 << 16)
def is_canary_function(name: str) -> bool:
    return CANARY_PATH_PART in function_path(name)


def _outer_spans(events: Iterable[PyEvent]) -> tuple[list[float], list[float]]:
    """Starts and ends of the union of the events' intervals, in order."""
    starts: list[float] = []
    ends: list[float] = []
    for start, end in sorted((event.ts_us, event.ts_us + event.dur_us) for event in events):
        if ends and start <= ends[-1]:
            ends[-1] = max(ends[-1], end)
        else:
            starts.append(start)
            ends.append(end)
    return starts, ends


def main_thread(by_thread: Mapping[str, Sequence[PyEvent]], *,
                markers: Sequence[Launch]) -> tuple[str, str]:
    """The thread that runs the decode loop, and the rule that chose it: the thread of the
    graph launches when it has Python calls; else, among the threads inside a Python call at
    half of the graph launches or more, the one with the most calls (not the most time: a
    thread blocked in one long call, a sleep or a queue wait, has time and few calls); else
    (no graph launch) the thread with the most calls."""
    calls = {thread: len(events) for thread, events in by_thread.items()}
    same = Counter(marker.thread for marker in markers if marker.thread in calls)
    if same:
        return same.most_common(1)[0][0], THREAD_OF_LAUNCHES
    inside = []
    for thread, events in by_thread.items():
        starts, ends = _outer_spans(events)
        covered = 0
        for marker in markers:
            index = bisect.bisect_right(starts, marker.ts_us) - 1
            covered += index >= 0 and marker.ts_us <= ends[index]
        if markers and 2 * covered >= len(markers):
            inside.append(thread)
    if inside:
        return max(inside, key=lambda thread: (calls[thread], thread)), THREAD_IN_LAUNCHES
    return max(calls, key=lambda thread: (calls[thread], thread)), THREAD_MOST_CALLS


@dataclass(slots=True)
class _Frame:
    name: str
    end_us: float
    clipped_us: float
    children_us: float = 0.0


def function_stats(events: Iterable[PyEvent], *, start_us: float, end_us: float,
                   steps: int) -> tuple[tuple[FunctionStat, ...], float, float]:
    """Per function, its figures per step within ``[start_us, end_us)`` (see
    :class:`FunctionStat`; a call's time is its overlap with the window), by inclusive time;
    and the time per step inside outermost calls and inside outermost ``kv_canary`` calls.

    Nesting comes from time (one thread's calls nest): a call is the child of the innermost
    open call it starts in (its end is cut at its parent's end)."""
    inclusive: defaultdict[str, float] = defaultdict(float)
    own: defaultdict[str, float] = defaultdict(float)
    calls: Counter[str] = Counter()
    open_names: Counter[str] = Counter()
    stack: list[_Frame] = []
    outer_us = canary_us = 0.0
    canary_depth = 0

    def close(frame: _Frame) -> None:
        nonlocal canary_depth
        own[frame.name] += max(frame.clipped_us - frame.children_us, 0.0)
        open_names[frame.name] -= 1
        canary_depth -= is_canary_function(frame.name)

    for event in sorted(events, key=lambda event: (event.ts_us, -event.dur_us)):
        while stack and event.ts_us >= stack[-1].end_us:
            close(stack.pop())
        end = event.ts_us + event.dur_us
        if stack:
            end = min(end, stack[-1].end_us)
        clipped = max(min(end, end_us) - max(event.ts_us, start_us), 0.0)
        if stack:
            stack[-1].children_us += clipped
        else:
            outer_us += clipped
        if not open_names[event.name]:
            inclusive[event.name] += clipped
        canary = is_canary_function(event.name)
        if canary and not canary_depth:
            canary_us += clipped
        canary_depth += canary
        calls[event.name] += start_us <= event.ts_us < end_us
        open_names[event.name] += 1
        stack.append(_Frame(name=event.name, end_us=end, clipped_us=clipped))
    while stack:
        close(stack.pop())
    stats = [FunctionStat(name=name, calls_per_step=calls[name] / steps,
                          inclusive_us_per_step=inclusive[name] / steps,
                          self_us_per_step=own[name] / steps)
             for name in inclusive if calls[name] or inclusive[name] > 0]
    stats.sort(key=lambda stat: (-stat.inclusive_us_per_step, -stat.self_us_per_step,
                                 stat.name))
    return tuple(stats), outer_us / steps, canary_us / steps


def summarise_host(trace: Trace, *, fallback_steps: int) -> HostSummary | None:
    """The main thread's Python time per decode step (None: no ``python_function`` events).
    The window and the step count are those of :func:`select_steps` (K + 1 decode graph
    launches: the K steps between the first and the last, on the CPU clock); without two
    graph launches, the thread's whole span over ``fallback_steps``."""
    by_thread: defaultdict[str, list[PyEvent]] = defaultdict(list)
    for event in trace.python_events:
        by_thread[event.thread].append(event)
    if not by_thread:
        return None
    markers = step_markers(trace)
    thread, rule = main_thread(by_thread, markers=markers)
    events = by_thread[thread]
    if len(markers) >= 2:
        start_us, end_us, steps, window = (markers[0].ts_us, markers[-1].ts_us,
                                           len(markers) - 1, STEP_WINDOW)
    else:
        start_us = min(event.ts_us for event in events)
        end_us = max(event.ts_us + event.dur_us for event in events)
        steps, window = fallback_steps, WHOLE_WINDOW
    steps = max(steps, 1)
    functions, python_us, canary_us = function_stats(events, start_us=start_us,
                                                     end_us=end_us, steps=steps)
    return HostSummary(
        thread=thread, thread_rule=rule, threads=len(by_thread), window=window, steps=steps,
        wall_us_per_step=(end_us - start_us) / steps, python_us_per_step=python_us,
        canary_us_per_step=canary_us,
        calls_per_step=sum(start_us <= event.ts_us < end_us for event in events) / steps,
        functions=functions)


@dataclass(frozen=True, slots=True, kw_only=True)
class FunctionDiff:
    """One function whose inclusive time per step differs from the baseline's.

    ``change``: ``added`` (no call in the baseline), ``removed`` or ``time``.
    """

    name: str
    change: str
    base_calls: float
    calls: float
    base_us: float
    us: float

    @property
    def delta_us(self) -> float:
        return self.us - self.base_us

    def to_json(self) -> dict[str, object]:
        return {**dataclasses.asdict(self), "delta_us": self.delta_us}


_HOST_CHANGE_ORDER = {"added": 0, "removed": 1, "time": 2}


def diff_hosts(*, base: HostSummary, other: HostSummary,
               min_us: float = CPU_DIFF_MIN_US) -> tuple[FunctionDiff, ...]:
    """Functions whose inclusive time per step differs by at least ``min_us``: added ones
    first, then removed ones, then the others; each group by the size of the change."""
    base_stats = {stat.name: stat for stat in base.functions}
    other_stats = {stat.name: stat for stat in other.functions}
    diffs = []
    for name in dict.fromkeys([*other_stats, *base_stats]):
        before, after = base_stats.get(name), other_stats.get(name)
        diff = FunctionDiff(
            name=name, change="added" if before is None else "removed" if after is None
            else "time", base_calls=before.calls_per_step if before else 0.0,
            calls=after.calls_per_step if after else 0.0,
            base_us=before.inclusive_us_per_step if before else 0.0,
            us=after.inclusive_us_per_step if after else 0.0)
        if abs(diff.delta_us) >= min_us:
            diffs.append(diff)
    return tuple(sorted(diffs, key=lambda diff: (_HOST_CHANGE_ORDER[diff.change],
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


def short_function(name: str, *, width: int = FUNCTION_CHARS) -> str:
    """``dir/file.py(123): func`` (the last two path components) or a C function's repr, cut
    to ``width`` characters."""
    match = _FRAME.match(name)
    text = (f"{'/'.join(match['path'].split('/')[-2:])}({match['line']}): "
            f"{match['function']}" if match else name)
    return text if len(text) <= width else text[:width - 3] + "..."


def display_functions(names: Iterable[str]) -> dict[str, str]:
    """Per function, its short name; names that would print alike get a short hash."""
    shorts = {name: short_function(name) for name in dict.fromkeys(names)}
    clashes = Counter(shorts.values())
    for name, short in shorts.items():
        if clashes[short] > 1:
            digest = hashlib.sha1(name.encode()).hexdigest()[:6]
            shorts[name] = f"{short_function(name, width=FUNCTION_CHARS - 9)} [{digest}]"
    return shorts


def function_table(stats: Sequence[FunctionStat], *, title: str, top: int) -> list[str]:
    if not stats:
        return [f"  {title}: none"]
    shown = stats[:top]
    names = display_functions(stat.name for stat in shown)
    lines = [f"  {title}:", f"  {'n/step':>8} {'incl us':>9} {'self us':>9}  function"]
    lines += [f"  {stat.calls_per_step:>8.2f} {stat.inclusive_us_per_step:>9.1f} "
              f"{stat.self_us_per_step:>9.1f}  {names[stat.name]}" for stat in shown]
    if len(stats) > top:
        lines.append(f"  ({len(stats) - top} more functions)")
    return lines


def host_lines(host: HostSummary, *, top: int = CPU_TOP) -> list[str]:
    """The host (Python) figures of one configuration."""
    share = 100 * host.python_us_per_step / (host.wall_us_per_step or 1.0)
    by_self = sorted(host.functions, key=lambda stat: (-stat.self_us_per_step, stat.name))
    canary = host.canary_functions()
    return [
        f"host (Python): scheduler main thread {host.thread} of {host.threads} traced "
        f"({host.thread_rule})",
        f"  window: {host.window}",
        f"  host figures per step = totals over that window / {host.steps} steps; with_stack's "
        "Python tracer inflates Python time (several-fold): compare configurations only "
        "relatively",
        f"  wall {host.wall_us_per_step:.1f} us/step; in Python calls "
        f"{host.python_us_per_step:.1f} us/step ({share:.0f} %); in {CANARY_PATH_PART} "
        f"functions {host.canary_us_per_step:.1f} us/step; {host.calls_per_step:.0f} calls/step",
        *function_table(host.functions, top=top, title=f"top {top} by inclusive us/step "
                        "(a call inside a call of the same name not counted again)"),
        *function_table(by_self, top=top,
                        title=f"top {top} by self us/step (duration minus direct children)"),
        *function_table(canary, top=top, title=f"{len(canary)} functions whose path contains "
                        f"{CANARY_PATH_PART}, by inclusive us/step"),
    ]


def host_diff_table(*, base: HostSummary, other: HostSummary,
                    diffs: Sequence[FunctionDiff]) -> list[str]:
    """Host totals and the functions of ``other`` whose inclusive time differs from ``base``."""
    lines = [
        f"  wall {other.wall_us_per_step - base.wall_us_per_step:+.1f} us/step "
        f"({base.wall_us_per_step:.1f} -> {other.wall_us_per_step:.1f}); in Python calls "
        f"{other.python_us_per_step - base.python_us_per_step:+.1f}; in {CANARY_PATH_PART} "
        f"functions {other.canary_us_per_step - base.canary_us_per_step:+.1f}; calls "
        f"{other.calls_per_step - base.calls_per_step:+.0f}/step",
    ]
    if not diffs:
        return lines + ["  no function differs"]
    names = display_functions(diff.name for diff in diffs)
    lines.append(f"  {'change':<7} {'calls b':>7} {'calls':>7} {'us base':>8} {'us':>8} "
                 f"{'d us':>8}  function")
    lines += [f"  {diff.change:<7} {diff.base_calls:>7.2f} {diff.calls:>7.2f} "
              f"{diff.base_us:>8.1f} {diff.us:>8.1f} {diff.delta_us:>+8.1f}  {names[diff.name]}"
              for diff in diffs]
    return lines


# ----------------------------------------------------------------------------- one server

@dataclass(frozen=True, slots=True, kw_only=True)
class ConfigProfile:
    """One configuration's server and what its trace says.

    Attributes:
        status: ``profiled``, ``skipped: <why>``, ``refused: <reason>`` (the server stopped at
            start-up) or ``failed: <reason>``.
        notes: about the profiled window (when it started, a forced stop) and the canary.
        host: with ``--cpu``, the main thread's Python time; ``host_note``: why there is none.
    """

    config: str
    status: str
    summary: StepSummary | None = None
    host: HostSummary | None = None
    host_note: str | None = None
    client_step_ms: float | None = None
    trace_path: str | None = None
    log_path: str | None = None
    notes: tuple[str, ...] = ()
    duration_s: float = 0.0

    def to_json(self) -> dict[str, object]:
        return dataclasses.asdict(self)


@dataclass(frozen=True, slots=True, kw_only=True)
class ProfiledRound:
    """Round 1's client step time, and round 2's trace with notes on its window."""

    trace_path: pathlib.Path
    client_step_ms: float
    notes: tuple[str, ...]


class TraceError(RuntimeError):
    """No complete trace came (message: why)."""


def profiler_env(trace_dir: pathlib.Path, *, cpu: bool = False) -> dict[str, str]:
    """The server environment that selects the torch profiler and its default folder (with
    ``cpu``, also ``SGLANG_PROFILE_WITH_STACK=true``: the tokenizer manager clears the
    request's ``with_stack`` when that variable is false)."""
    env = {"SGLANG_TORCH_PROFILER_DIR": str(trace_dir), "SGLANG_PROFILE_V2": "false"}
    return {**env, "SGLANG_PROFILE_WITH_STACK": "true"} if cpu else env


def profile_request(*, trace_dir: pathlib.Path, steps: int, prefix: str,
                    cpu: bool = False) -> dict[str, object]:
    """The body of ``POST /start_profile`` (``ProfileReqInput``): GPU activity for ``steps``
    forward passes, no stacks, no shapes; with ``cpu``, CPU activity and Python stacks too."""
    return {"output_dir": str(trace_dir), "num_steps": steps,
            "activities": ["CPU", "GPU"] if cpu else ["GPU"], "with_stack": cpu,
            "record_shapes": False, "profile_prefix": prefix}


def start_profile(server: RunningServer, *, trace_dir: pathlib.Path, steps: int,
                  prefix: str, cpu: bool = False) -> None:
    """``POST /start_profile`` with :func:`profile_request` (returns once the scheduler
    started the profiler).

    Raises:
        ServerRequestError: the server refused or cannot be reached.
    """
    server.request_json("POST", "/start_profile", profile_request(
        trace_dir=trace_dir, steps=steps, prefix=prefix, cpu=cpu))


def _gzip_complete(path: pathlib.Path) -> None:
    """Decompress ``path`` to its end (the gzip trailer is written when the file is closed).

    Raises:
        OSError, EOFError, zlib.error: missing, or not yet complete.
    """
    with gzip.open(path, "rb") as stream:
        while stream.read(1 << 24):
            pass


def _complete_trace(paths: Iterable[pathlib.Path]) -> pathlib.Path | None:
    """The first of ``paths`` that is complete: a ``.gz`` that decompresses to its end (SGLang
    writes the gzip file once the JSON is complete), another file that parses."""
    for path in sorted(paths):
        try:
            if path.name.endswith(".gz"):
                _gzip_complete(path)
            else:
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
                  steps: int, trace_dir: pathlib.Path, prefix: str, deadline: Deadline,
                  cpu: bool = False) -> ProfiledRound:
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
        start_profile(server, trace_dir=trace_dir, steps=steps, prefix=prefix, cpu=cpu)
        trace_timeout_s = CPU_TRACE_TIMEOUT_S if cpu else TRACE_TIMEOUT_S
        trace_path, forced_stop = wait_for_trace(
            server, trace_dir=trace_dir, known=known, round_future=future,
            timeout_s=max(min(trace_timeout_s, deadline.remaining_s()), 1.0))
        notes = round_two_notes(future, profile_sent_at=sent_at, forced_stop=forced_stop,
                                timeout_s=max(deadline.remaining_s(), 1.0))
    finally:
        pool.shutdown(wait=False)
    return ProfiledRound(trace_path=trace_path, client_step_ms=round_one.step_ms, notes=notes)


def _first_line(error: BaseException) -> str:
    return (str(error).splitlines() or [type(error).__name__])[0][:_REASON_CHARS]


def profile_config(*, model: ModelShape, model_dir: pathlib.Path, config: ServerConfig,
                   workload: Workload, steps: int, out_dir: pathlib.Path,
                   deadline: Deadline, cpu: bool = False) -> ConfigProfile:
    """Start one server with the profiler configured, profile ``steps`` forward passes of the
    workload's decode (with ``cpu``: host activity and Python stacks too), stop it, summarise
    the trace. Failures become the status."""
    started = time.monotonic()
    label = f"{model.name}-{config.name}"
    trace_dir = (out_dir / "traces" / label).resolve()
    trace_dir.mkdir(parents=True, exist_ok=True)
    base_args, args = launch_args(model=model, config=config)
    ready_timeout_s = max(min(READY_TIMEOUT_S, deadline.remaining_s()), 1.0)
    launch = ServerLaunch(
        model_dir=model_dir, log_path=out_dir / "logs" / f"{label}.log",
        env={**config.env, **profiler_env(trace_dir, cpu=cpu)}, base_args=base_args, args=args,
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
                                     trace_dir=trace_dir, prefix=label, deadline=deadline,
                                     cpu=cpu)
        except RuntimeError as error:  # StreamError, ServerRequestError, TraceError
            return result(f"failed: {_first_line(error)}")
        note = server_note(config=config, log_text=server.log_text())
    try:
        analysis = analyse_trace(profiled.trace_path, fallback_steps=steps - 1, host=cpu)
    except (OSError, EOFError, zlib.error, ValueError) as error:
        return result(f"failed: trace {profiled.trace_path}: {_first_line(error)}",
                      trace_path=str(profiled.trace_path))
    notes = profiled.notes + ((note,) if note != "-" else ())
    return result("profiled", summary=analysis.summary, host=analysis.host,
                  host_note=analysis.host_note, client_step_ms=profiled.client_step_ms,
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
    cpu: bool = False

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
    parser.add_argument("--cpu", action="store_true",
                        help="also profile host work: CPU activity and Python stacks "
                             "(with_stack); adds the scheduler main thread's Python time per "
                             "step, by function, and its diff vs the baseline")
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
        time_budget_s=namespace.time_budget_s, cpu=namespace.cpu)


def first_estimate_s(*, model: ModelShape, workload: Workload, cpu: bool = False) -> float:
    """One server before any was timed: start, rounds 0 to 2, profiling and stopping."""
    return (model.startup_estimate_s + model.warm_up_estimate_s[workload.name]
            + 2 * model.round_estimate_s[workload.name] + PROFILE_OVERHEAD_S
            + (CPU_PROFILE_OVERHEAD_S if cpu else 0.0))


def report_text(*, options: ProfileOptions, model: ModelShape, workload: Workload,
                results: Sequence[ConfigProfile]) -> str:
    """The tables: per configuration its totals and top names, then each diff vs the first
    configuration, then every configuration not profiled."""
    lines = [f"== profile_server_step: {model.name}, {workload.name}, num_steps "
             f"{options.profile_steps}, baseline {options.configs[0]}"
             + (", with host (Python) time ==" if options.cpu else " =="),
             f"model: {model.describe()}", f"workload: {workload.describe()}", ""]
    for result in results:
        if result.summary is None:
            continue
        lines.append(f"-- {result.config} --")
        lines += summary_lines(result.summary, client_step_ms=result.client_step_ms)
        lines += [f"note: {note}" for note in result.notes]
        lines += top_table(result.summary, top=options.top)
        if result.host is not None:
            lines += host_lines(result.host)
        elif result.host_note is not None:
            lines.append(f"host (Python): {result.host_note}")
        lines.append("")
    lines += diff_lines(options=options, results=results)
    lines += host_diff_lines(options=options, results=results)
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


def host_diffs_by_config(*, options: ProfileOptions, results: Sequence[ConfigProfile]
                         ) -> dict[str, tuple[FunctionDiff, ...]]:
    """Per configuration after the first with host figures, its host diff vs the first."""
    by_name = {result.config: result for result in results}
    base = by_name.get(options.configs[0])
    if base is None or base.host is None:
        return {}
    return {result.config: diff_hosts(base=base.host, other=result.host)
            for result in results if result.host is not None and result.config != base.config}


def host_diff_lines(*, options: ProfileOptions,
                    results: Sequence[ConfigProfile]) -> list[str]:
    baseline = options.configs[0]
    by_name = {result.config: result for result in results}
    lines = []
    for name, rows in host_diffs_by_config(options=options, results=results).items():
        lines.append(f"-- {name} vs {baseline}: host (Python) inclusive us/step, changes of "
                     f"{CPU_DIFF_MIN_US:.0f} us or more (relative figures: with_stack) --")
        lines += host_diff_table(base=by_name[baseline].host,  # type: ignore[arg-type]
                                 other=by_name[name].host,  # type: ignore[arg-type]
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
        "host_diffs": {name: [row.to_json() for row in rows] for name, rows
                       in host_diffs_by_config(options=options, results=results).items()},
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
    if result.host is not None:
        parts.append(f"host {result.host.wall_us_per_step:.0f} us/step wall, "
                     f"{result.host.python_us_per_step:.0f} in Python")
    elif result.host_note is not None:
        parts.append(f"host: {result.host_note}")
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
                          else first_estimate_s(model=model, workload=workload,
                                                cpu=options.cpu))
            if not deadline.allows(estimate_s):
                result = ConfigProfile(
                    config=name, status=f"skipped: time budget ({estimate_s:.0f} s needed, "
                                        f"{max(deadline.remaining_s(), 0.0):.0f} s left)")
            else:
                result = profile_config(model=model, model_dir=model_dir, config=CONFIGS[name],
                                        workload=workload, steps=options.profile_steps,
                                        out_dir=options.out_dir, deadline=deadline,
                                        cpu=options.cpu)
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
