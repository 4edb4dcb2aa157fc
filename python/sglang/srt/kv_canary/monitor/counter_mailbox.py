"""The host's copy of the canary counters, refreshed after every forward and read without an
event, a query or a sync.

After each forward the runtime calls :meth:`CounterMailbox.publish` on the forward's stream:
the publish launch (:mod:`sglang.jit_kernel.kv_canary.publish_counters`) counts the publication
and seals the counters with a checksum, and a non-blocking copy brings them into one pinned host
buffer. Both are captured into the decode graphs, so a replayed decode step publishes with no
host work at all; an eager forward enqueues the two itself.

The host reads that buffer whenever it polls. It may read while a copy lands, mixing two
publications: the checksum then fails and the read is ignored (a later one sees the whole copy).
A publication carries its number (``COUNTER_PUBLISHES``); the host pairs it with the label it
recorded when it enqueued that publication (its step, launch and sweep counts, see
:class:`CounterSnapshot`), so the health check compares the device's counts with the host's
counts of the same moment. Counters are cumulative: reading only the newest publication loses
nothing.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

import torch

from sglang.jit_kernel.kv_canary.consts import COUNTER_PUBLISHES, COUNTER_VIOLATIONS
from sglang.jit_kernel.kv_canary.hashing import counters_checksum_holds
from sglang.srt.kv_canary.monitor.counter_snapshots import CounterSnapshot

MAX_LABELS = 4096  # labels kept for publications not read yet (the device trails by a few)

# (publication number, steps, launches, sweep launches): a plain tuple, one per forward
_Label = tuple[int, int, int, int]


class CounterMailbox:
    """One pinned host copy of ``counters`` (a CPU tensor when they are on a CPU).

    Args:
        counters: the device state's counters, int64 ``[NUM_COUNTERS]``.
        seal: the publish launch, ``seal(counters=...)`` (Triton on a GPU, the torch reference
            on a CPU).
        host: where the copies land: anything with ``copy_(tensor, non_blocking=...)`` and
            ``numpy()`` over the same ``[NUM_COUNTERS]`` int64 words (default: a pinned tensor
            on CUDA, a plain one on a CPU; tests pass copies that land late).
    """

    def __init__(self, *, counters: torch.Tensor, seal: Callable[..., None],
                 host: object | None = None) -> None:
        self._counters = counters
        self._seal = seal
        if host is None:
            pinned = counters.device.type == "cuda"
            host = torch.zeros(counters.shape, dtype=torch.int64, pin_memory=pinned)
        self._host = host
        self._words = self._host.numpy()
        # the same words read one at a time: indexing a memoryview gives a Python int directly,
        # a third of the time of ``int(self._words[i])`` (the per-forward peeks)
        self._word_view = memoryview(self._words)
        self._labels: deque[_Label] = deque()
        self._last_labeled = 0
        self._last_read = 0
        # the last read found a newer publication whose copy was still landing (checksum)
        self.last_read_torn = False

    def publish(self) -> None:
        """Seal the counters and copy them to the host, on the current stream (eagerly or into
        a graph being captured); never waits. Label the publication with :meth:`label`."""
        self._seal(counters=self._counters)
        self._host.copy_(self._counters, non_blocking=True)

    def label(self, *, publications: int, steps: int, launches: int, sweep_launches: int) -> None:
        """Record the host's counts as of publication number ``publications`` (the publications
        enqueued so far): ``steps`` forward steps with request rows, ``launches`` canary launch
        pairs and ``sweep_launches`` sweep launches enqueued before it. A number already
        labeled is ignored (a forward that published nothing)."""
        if publications <= self._last_labeled:
            return
        self._last_labeled = publications
        labels = self._labels
        labels.append((publications, steps, launches, sweep_launches))
        if len(labels) > MAX_LABELS:
            labels.popleft()

    def peek_violations(self) -> int:
        """The violation counter of the host copy as it is now, unchecked: one word, which a
        landing copy writes whole (an older or a newer publication's count, never a mix). What
        :meth:`CanaryMonitor.poll` reads when it skips a whole read. Host only, never waits."""
        return self._word_view[COUNTER_VIOLATIONS]

    def peek_publications(self) -> int:
        """The number of the newest publication whose copy reached the host copy, unchecked (one
        word, as :meth:`peek_violations`): every stream operation enqueued before that
        publication has completed. Host only, never waits."""
        return self._word_view[COUNTER_PUBLISHES]

    def read(self) -> CounterSnapshot | None:
        """The newest publication that arrived since the last read, with its label; None when
        none did, when the read caught a copy landing (checksum), or when the publication has
        no label (a graph warm-up outside a forward). Host only, never waits."""
        words = self._words.copy()  # one read of the host copy; the checks below look at it
        publication = int(words[COUNTER_PUBLISHES])
        self.last_read_torn = False
        if publication <= self._last_read:
            return None
        if not counters_checksum_holds(words):
            self.last_read_torn = True
            return None
        self._last_read = publication
        labels = self._labels
        while labels and labels[0][0] < publication:
            labels.popleft()
        if not labels or labels[0][0] != publication:
            return None
        _, steps, launches, sweep_launches = labels.popleft()
        return CounterSnapshot(
            steps=steps, launches=launches, sweep_launches=sweep_launches,
            counters=tuple(words.tolist()),
        )

    def reset(self) -> None:
        """The device counters were zeroed and the device is idle (the caller synchronized):
        forget every publication and label."""
        self._host.zero_()
        self._labels.clear()
        self._last_labeled = 0
        self._last_read = 0
