"""Timers shared by the benchmark scripts (kernel, token history, server).

GPU timers need CUDA; :func:`spread`, :func:`ratio`, :func:`difference` and :func:`host_time_us`
run anywhere. The timers are keyword-only and return microseconds (or a :class:`Spread` of them);
:func:`spread`, :func:`ratio` and :func:`difference` summarize numbers of any unit (the server
benchmark's ms and tok/s).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

_T = TypeVar("_T")


@dataclass(frozen=True, slots=True, kw_only=True)
class Spread:
    """Median of repeated measurements and their relative spread ((max - min) / median)."""

    median: float
    relative_spread: float
    samples: int

    @property
    def half_width(self) -> float:
        """Half of (max - min), in the unit of ``median``: the "±" of :meth:`describe`."""
        return abs(self.median) * self.relative_spread / 2

    def describe(self, *, unit: str = "") -> str:
        return f"{self.median:.3f}{unit} (±{100 * self.relative_spread / 2:.1f}%, n={self.samples})"


def spread(values: Sequence[float]) -> Spread:
    """The median and relative spread of ``values`` (at least one)."""
    if not values:
        raise ValueError("spread() needs at least one value")
    median = statistics.median(values)
    width = max(values) - min(values)
    return Spread(
        median=median,
        relative_spread=width / median if median else 0.0,
        samples=len(values),
    )


def ratio(*, numerator: Spread, denominator: Spread) -> Spread:
    """``numerator.median / denominator.median`` with the two relative spreads added: to first
    order, the widest the ratio of any sample of one to any sample of the other can swing."""
    if not denominator.median:
        raise ValueError("ratio() needs a denominator with a non-zero median")
    return Spread(
        median=numerator.median / denominator.median,
        relative_spread=numerator.relative_spread + denominator.relative_spread,
        samples=min(numerator.samples, denominator.samples),
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class Difference:
    """A difference of two medians and its noise: the two half-widths added (same unit)."""

    value: float
    half_width: float


def difference(*, minuend: Spread, subtrahend: Spread) -> Difference:
    """``minuend.median - subtrahend.median``, with the two half-widths added."""
    return Difference(value=minuend.median - subtrahend.median,
                      half_width=minuend.half_width + subtrahend.half_width)


class InnerTime:
    """A callable whose own time an enclosing timer leaves out: :meth:`wrap` returns ``fn``
    timed; ``seconds`` holds the duration of its last call (0 before one)."""

    def __init__(self) -> None:
        self.seconds = 0.0

    def wrap(self, fn: Callable[[], _T]) -> Callable[[], _T]:
        def timed() -> _T:
            start = time.perf_counter()
            try:
                return fn()
            finally:
                self.seconds = time.perf_counter() - start

        return timed


def host_time_us(*, fn: Callable[[], object], repeats: int = 20) -> Spread:
    """Host wall time of one ``fn`` call (perf_counter), after one warm-up call."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e6)
    return spread(times)


def graph_of(*, fn: Callable[[], None], launches: int = 1):
    """A CUDA graph of ``launches`` calls of ``fn`` (compiled and warmed up on a side stream)."""
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(launches):
            fn()
    return graph


def event_time_us(*, fn: Callable[[], None], repeats: int = 20) -> Spread:
    """Device time between CUDA events around one ``fn`` call (host launch cost included when
    the launch is slower than the device), after one warm-up call."""
    import torch

    fn()
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(repeats):
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return spread(times)


def graph_time_us(*, fn: Callable[[], None], launches: int = 20, repeats: int = 10) -> Spread:
    """Device time of one ``fn`` call: ``launches`` calls captured in one CUDA graph, replayed
    (no host launch cost), divided by ``launches``."""
    graph = graph_of(fn=fn, launches=launches)
    total = event_time_us(fn=graph.replay, repeats=repeats)
    return Spread(
        median=total.median / launches,
        relative_spread=total.relative_spread,
        samples=total.samples,
    )


def copy_bandwidth_bytes_per_s(*, device: str = "cuda", num_bytes: int = 1 << 30) -> float:
    """Device-to-device copy bandwidth (bytes read + written per second): the memory bound."""
    import torch

    source = torch.empty(num_bytes, dtype=torch.uint8, device=device)
    target = torch.empty_like(source)
    seconds = graph_time_us(fn=lambda: target.copy_(source), launches=4, repeats=5).median * 1e-6
    return 2 * num_bytes / seconds
