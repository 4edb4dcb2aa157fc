"""Counter snapshots (what the host learns from one publication of the device counters, see
:mod:`.counter_mailbox`) and the completion events the upload buffers wait on without blocking.
"""

from __future__ import annotations

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


class CompletionEvent(Protocol):
    """The calls the upload buffers need from a device event."""

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
    """The device counters as of one publication, with the host's counts at that point."""

    steps: int  # forward steps with request rows completed when the publication was enqueued
    launches: int  # canary launch pairs the host had enqueued before the publication
    sweep_launches: int  # radix sweep launches the host had enqueued before it
    counters: tuple[int, ...]  # consts.py counter layout

    @property
    def violations(self) -> int:
        return self.counters[COUNTER_VIOLATIONS]

    def kernel_runs(self, kind: CheckKind) -> int:
        return self.counters[COUNTER_KERNEL_RUNS + kind]

    def entries(self, kind: CheckKind) -> int:
        return self.counters[COUNTER_ENTRIES + kind]


ZERO_SNAPSHOT = CounterSnapshot(steps=0, launches=0, sweep_launches=0, counters=(0,) * NUM_COUNTERS)
