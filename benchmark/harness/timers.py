"""Host and CUDA timers.

Host timers use ``time.perf_counter``. :class:`ExcludedTime` lets an enclosing timer leave out
the time of calls nested inside it (a model forward, a stubbed kernel launch). The CUDA timers
need a CUDA device and import torch only when called; they return microseconds as a
:class:`~.stats.Spread` over repeated calls, each after one warm-up call.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

from .stats import Spread, spread

_T = TypeVar("_T")


class ExcludedTime:
    """A running total of seconds that enclosing timers leave out.

    :meth:`excluding` wraps a callable so that its calls add their duration to :attr:`seconds`;
    an enclosing timer reads :attr:`seconds` before and after its own span and subtracts the
    difference.
    """

    def __init__(self) -> None:
        self.seconds = 0.0
        self.calls = 0

    def excluding(self, fn: Callable[..., _T]) -> Callable[..., _T]:
        """``fn`` whose calls (each counted in :attr:`calls`) are excluded time."""

        def excluded(*args: Any, **kwargs: Any) -> _T:
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - start
                self.calls += 1

        return excluded


def host_time_us(*, fn: Callable[[], object], repeats: int) -> Spread:
    """Host wall time of one ``fn()`` call in µs over ``repeats`` calls, after one warm-up call.

    Raises:
        ValueError: ``repeats`` < 1.
    """
    if repeats < 1:
        raise ValueError(f"repeats={repeats!r} is invalid; allowed: an integer >= 1")
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e6)
    return spread(times)


def launch_host_time_us(*, fn: Callable[[], object], repeats: int) -> Spread:
    """Host time of one asynchronous CUDA launch ``fn()`` in µs: each call timed without a
    synchronization, the device drained (untimed) after every call so its queue never fills."""
    import torch

    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e6)
        torch.cuda.synchronize()
    return spread(times)


def event_time_us(*, fn: Callable[[], object], repeats: int) -> Spread:
    """Device time in µs between CUDA events around one ``fn()`` call (the host's launch cost
    shows where it exceeds the kernel's), over ``repeats`` calls after one warm-up call."""
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


def graph_of(*, fn: Callable[[], object], launches: int) -> Any:
    """A ``torch.cuda.CUDAGraph`` of ``launches`` calls of ``fn`` (warmed up on a side stream
    first, so lazy compilation happens outside the capture)."""
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


def graph_time_us(*, fn: Callable[[], object], launches: int, repeats: int) -> Spread:
    """Device time in µs of one ``fn()``: ``launches`` calls captured in one CUDA graph and
    replayed ``repeats`` times, each replay's time divided by ``launches`` (no host cost)."""
    graph = graph_of(fn=fn, launches=launches)
    return event_time_us(fn=graph.replay, repeats=repeats).scaled(1 / launches)


def copy_bandwidth_bytes_per_s(*, num_bytes: int = 1 << 30) -> float:
    """The device's copy bandwidth (bytes read plus bytes written per second) of a
    device-to-device copy of ``num_bytes``: the memory bound a kernel is measured against."""
    import torch

    source = torch.empty(num_bytes, dtype=torch.uint8, device="cuda")
    target = torch.empty_like(source)
    seconds = graph_time_us(fn=lambda: target.copy_(source), launches=4, repeats=5).median * 1e-6
    return 2 * num_bytes / seconds
