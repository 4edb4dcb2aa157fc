"""Non-blocking device-to-host snapshots of the canary counters.

After every forward the host enqueues a copy of the device counters into pinned memory on the
forward's stream and records an event behind it. Later steps look at the oldest pending copies
with ``event.query()`` and consume the completed ones: the host learns what the kernels counted
(violations, kernel runs, entries) about one step late and never waits for the device.

The counters are cumulative, so skipping a copy loses nothing: when every slot of the pipe is
still in flight the new copy is simply not enqueued and a later one covers it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch

from sglang.jit_kernel.kv_canary.consts import (
    COUNTER_ENTRIES,
    COUNTER_KERNEL_RUNS,
    COUNTER_VIOLATIONS,
    NUM_COUNTERS,
    CheckKind,
)

PIPE_DEPTH = 4  # copies in flight at most; the scheduler never runs this far ahead of the device


class CompletionEvent(Protocol):
    """The two calls the pipe needs from a device event."""

    def record(self) -> None: ...

    def query(self) -> bool: ...

    def synchronize(self) -> None: ...


class HostEvent:
    """Event of a CPU "device": copies there complete before ``copy_`` returns."""

    def record(self) -> None:
        return None

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        return None


class CurrentStreamEvent:
    """A CUDA event recorded on the current stream of ``device``.

    ``torch.cuda.Event.record()`` builds a ``torch.cuda.current_stream()`` object on every call
    (5-8 us of host time on an H100 host, once per forward here); this looks the current
    stream's raw handle up instead (what Triton's launches use, about 0.2 us) and records on
    the stream object ``torch.cuda.current_stream()`` gave the first time that handle was
    current. (Not a ``torch.cuda.ExternalStream`` of the handle: for the default stream, handle
    0, an event recorded on that completes at once; a GPU test pins this.)
    """

    _streams: dict[tuple[int, int], torch.cuda.Stream] = {}

    def __init__(self, device: torch.device) -> None:
        self._device_index = (
            device.index if device.index is not None else torch.cuda.current_device()
        )
        self._event = torch.cuda.Event()

    def record(self) -> None:
        key = (self._device_index, _current_raw_stream(self._device_index))
        stream = self._streams.get(key)
        if stream is None:
            stream = torch.cuda.current_stream(self._device_index)
            self._streams[key] = stream
        self._event.record(stream)

    def query(self) -> bool:
        return self._event.query()

    def synchronize(self) -> None:
        self._event.synchronize()


def _current_raw_stream(device_index: int) -> int:
    """The ``cudaStream_t`` of ``device_index``'s current stream, as an int."""
    return torch._C._cuda_getCurrentRawStream(device_index)


def event_factory_for(device: torch.device) -> Callable[[], CompletionEvent]:
    """:class:`CurrentStreamEvent` on a GPU, :class:`HostEvent` on a CPU."""
    if device.type == "cuda":
        return lambda: CurrentStreamEvent(device)
    return HostEvent


@dataclass(frozen=True, slots=True, kw_only=True)
class CounterSnapshot:
    """The device counters as of one forward, with the host's step counts at that point."""

    steps: int  # forward steps with request rows completed when the copy was enqueued
    launches: int  # canary launch pairs the host had enqueued when the copy was enqueued
    sweep_launches: int  # radix sweep launches the host had enqueued by then
    counters: tuple[int, ...]  # consts.py counter layout

    @property
    def violations(self) -> int:
        return self.counters[COUNTER_VIOLATIONS]

    def kernel_runs(self, kind: CheckKind) -> int:
        return self.counters[COUNTER_KERNEL_RUNS + kind]

    def entries(self, kind: CheckKind) -> int:
        return self.counters[COUNTER_ENTRIES + kind]


ZERO_SNAPSHOT = CounterSnapshot(steps=0, launches=0, sweep_launches=0, counters=(0,) * NUM_COUNTERS)


# a copy in flight: (host tensor, its event, steps, launches, sweep launches) -- a plain tuple,
# made once per forward
_PendingCopy = tuple[torch.Tensor, CompletionEvent, int, int, int]


class CounterSnapshotPipe:
    """Up to :data:`PIPE_DEPTH` counter copies in flight; consumed in order, never waited for."""

    def __init__(
        self,
        *,
        counters: torch.Tensor,
        new_event: Callable[[], CompletionEvent],
        depth: int = PIPE_DEPTH,
    ) -> None:
        self._counters = counters
        pinned = counters.device.type == "cuda"
        self._free: list[tuple[torch.Tensor, CompletionEvent]] = [
            (torch.empty(counters.shape, dtype=counters.dtype, pin_memory=pinned), new_event())
            for _ in range(depth)
        ]
        self._pending: deque[_PendingCopy] = deque()

    def enqueue(self, *, steps: int, launches: int, sweep_launches: int) -> bool:
        """Copy the counters on the current stream; False when every slot is still in flight."""
        if not self._free:
            return False
        host, event = self._free.pop()
        host.copy_(self._counters, non_blocking=True)
        event.record()
        self._pending.append((host, event, steps, launches, sweep_launches))
        return True

    def drain(self) -> list[CounterSnapshot]:
        """The completed copies, oldest first (never blocks)."""
        done = []
        pending = self._pending
        while pending and pending[0][1].query():
            host, event, steps, launches, sweep_launches = pending.popleft()
            done.append(
                CounterSnapshot(
                    steps=steps, launches=launches, sweep_launches=sweep_launches,
                    counters=tuple(host.tolist()),
                )
            )
            self._free.append((host, event))
        return done

    def discard(self) -> None:
        """Forget every copy in flight (after the device counters were reset): waits for them."""
        while self._pending:
            host, event, *_ = self._pending.popleft()
            if not event.query():
                event.synchronize()
            self._free.append((host, event))
