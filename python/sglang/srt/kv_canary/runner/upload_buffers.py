"""Host buffers of the per-forward uploads, reused round robin.

Every forward copies its seq_lens mirror (and, when it has new owners, its packed row updates)
from a host buffer to the device without waiting (pinned memory on CUDA). Allocating that buffer
per forward goes through torch's caching host allocator, which polls the events of the pinned
blocks in flight on every call. :class:`UploadBufferRing` instead hands out slices of a few
preallocated buffers in turn, and hands a buffer out again only once its copy has completed. Nothing ever waits: an
upload that finds the next buffer still in flight, or that is larger than a buffer, gets a
buffer of its own from the allocator.

**Completion without events.** Every forward that uploads publishes the device counters after
its canary launches, on the same stream (:mod:`sglang.srt.kv_canary.monitor.counter_mailbox`),
and each publication carries its number, which the host copy of the counters shows as soon as
it lands. So a copy enqueued while ``n`` publications had been enqueued has completed once the
host copy shows publication ``n + 1`` or later: the caller passes that number as the copy's
``mark`` and the ring compares it with ``landed()``, the newest publication number that landed
(one read of host memory). No event is recorded after a copy or queried before a reuse (two
CUDA calls per decode step). It needs the host's and the device's publication numbers to agree, which the runner
establishes when serving starts (it zeroes both, with the device synchronized) and the health
check enforces after; so the ring stays closed until :meth:`UploadBufferRing.open` (warm-up and
capture forwards get buffers of their own). The ring reads ``landed()`` only when the last value
it read is older than the mark of the slot it is about to reuse.

A buffer taken but never copied (a batch that never runs) is simply reused. A buffer taken and
then handed out again before its own copy (more than :data:`UPLOAD_BUFFER_SLOTS` packs before
one upload, which the runner never does) is refused loudly at the copy.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np
import torch

UPLOAD_BUFFER_SLOTS = 8  # up to three uploads per forward; the device trails by one or two forwards
UPLOAD_BUFFER_WORDS = 1 << 14  # int64 words per buffer: a decode step of 256 rows uses ~1.3k
_MAX_CACHED_VIEWS = 256  # views of the buffers kept for reuse (forgotten all at once beyond)


class UploadBuffer(NamedTuple):
    """One upload's host buffer: ``tensor`` (int64 ``[words]``) and ``array``, a numpy view of the
    same memory; a slice of ring buffer ``slot`` handed out as its ``generation``-th use, or
    (``slot`` None) a buffer of its own. (An immutable named tuple rather than a frozen
    dataclass: one is made per forward on the decode step's host path, and a named tuple is
    made in a third of the time.)"""

    tensor: torch.Tensor
    array: np.ndarray
    slot: int | None = None
    generation: int = 0


class UploadBufferRing:
    """Round-robin host buffers for uploads (see the module docstring).

    Args:
        slots: buffers in the ring.
        words: int64 words per buffer.
        pin_memory: pinned buffers (CUDA).
    """

    def __init__(self, *, slots: int, words: int, pin_memory: bool) -> None:
        if slots < 1 or words < 1:
            raise ValueError(f"slots and words must be >= 1, got {slots} and {words}")
        self._pin_memory = pin_memory
        self._buffers = [
            torch.empty((words,), dtype=torch.int64, pin_memory=pin_memory) for _ in range(slots)
        ]
        self._arrays = [buffer.numpy() for buffer in self._buffers]
        self._landed: Callable[[], int] | None = None  # set by open()
        self._landed_seen = 0  # the newest value it returned (publications only advance)
        # per slot: the publication that follows its last copy (0: no copy pending)
        self._marks = [0] * slots
        self._generations = [0] * slots
        self._next = 0
        self._words = words
        # the views handed out, per (slot, start, words): a decode batch takes the same sizes
        # each step (the tensor view and its numpy twin, made once)
        self._views: dict[tuple[int, int, int], tuple[torch.Tensor, np.ndarray]] = {}

    def open(self, *, landed: Callable[[], int]) -> None:
        """Hand out the ring's buffers from now on: the host's and the device's publication
        numbers were just zeroed together, with every earlier copy complete (the caller
        synchronized the device). ``landed()``: the number of the newest counter publication
        whose host copy has landed (host only, never waits)."""
        self._marks = [0] * len(self._buffers)
        self._landed = landed
        self._landed_seen = 0

    @property
    def words(self) -> int:
        return self._words

    def take(self, words: int) -> UploadBuffer:
        """A host buffer of ``words`` int64 words (contents undefined); host only."""
        slot = self._next
        mark = self._marks[slot]
        if mark > self._landed_seen and self._landed is not None:
            self._landed_seen = self._landed()  # read only when the last value is not enough
        if words > self._words or self._landed is None or mark > self._landed_seen:
            tensor = torch.empty((words,), dtype=torch.int64, pin_memory=self._pin_memory)
            return UploadBuffer(tensor=tensor, array=tensor.numpy())
        self._next = (slot + 1) % len(self._buffers)
        self._marks[slot] = 0
        generation = self._generations[slot] = self._generations[slot] + 1
        tensor, array = self._view(slot, 0, words)
        return UploadBuffer(tensor, array, slot, generation)  # positional: the cheaper call

    def view(self, buffer: UploadBuffer, *, start: int, words: int) -> torch.Tensor:
        """``buffer.tensor[start : start + words]``; for a ring slice, the same view object
        every time these sizes repeat (a decode batch's sections); host only."""
        if buffer.slot is None:
            return buffer.tensor[start : start + words]
        return self._view(buffer.slot, start, words)[0]

    def _view(self, slot: int, start: int, words: int) -> tuple[torch.Tensor, np.ndarray]:
        key = (slot, start, words)
        views = self._views.get(key)
        if views is None:
            if len(self._views) >= _MAX_CACHED_VIEWS:
                self._views.clear()
            end = start + words
            views = self._views[key] = (
                self._buffers[slot][start:end], self._arrays[slot][start:end]
            )
        return views

    def copy(self, buffer: UploadBuffer, *, to: torch.Tensor, mark: int) -> None:
        """Copy ``buffer`` into ``to`` (same length) on the current stream without waiting, and
        keep its ring slot until the copy completed: until publication ``mark`` has landed
        (``mark``: one more than the publications enqueued so far; the caller publishes after
        the copy, on the same stream).

        Raises:
            RuntimeError: the slot was handed out again since ``buffer`` was taken (its
                contents are another upload's).
        """
        slot = buffer.slot
        if slot is not None and self._generations[slot] != buffer.generation:
            raise RuntimeError(
                f"KV canary upload buffer {slot} was handed out again before its upload "
                f"(generation {buffer.generation}, now {self._generations[slot]}): more than "
                f"{len(self._buffers)} row updates were packed before one was uploaded"
            )
        to.copy_(buffer.tensor, non_blocking=True)
        if slot is not None:
            self._marks[slot] = mark
