"""What the host counts of the canary's launches: the health check's evidence.

The host counts the canary launch pairs (pre + post) and the counter publications it enqueues:
one pair per eager ``model.forward``, and, per graph replay, as many as were captured into that
graph. Every forward with request rows must account for exactly one pair
(:meth:`LaunchAccounting.check_forward`); the device's run counters must equal the host's count
at every counter snapshot (:class:`~sglang.srt.kv_canary.monitor.health.HealthChecker`).

A launch or a publication made while a CUDA graph is being captured counts into that capture
(:meth:`LaunchAccounting.capturing`); otherwise it counts as enqueued now. Start-up work (warm-up
runs, captures) is forgotten when serving starts (:meth:`LaunchAccounting.reset`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch

from sglang.srt.kv_canary.batch.forward_kind import capturing
from sglang.srt.kv_canary.monitor.health import CanaryHealthError

_T = TypeVar("_T")


@dataclass(slots=True)
class _Capture:
    """What one capture has counted so far."""

    launches: int = 0
    publications: int = 0


@dataclass(slots=True, kw_only=True)
class _Captured:
    """Per captured graph (graph runner, batch size): its launch pairs and publications."""

    launches: dict[tuple[int, int], int] = field(default_factory=dict)
    publications: dict[tuple[int, int], int] = field(default_factory=dict)
    # EAGLE graph runners: the launches every batch size captured (the same for all sizes)
    per_runner: dict[int, int] = field(default_factory=dict)


class LaunchAccounting:
    """Launch pairs, sweep launches and counter publications of one canary.

    Args:
        device: the canary's device (captures are detected on its current stream).
        is_capturing: whether a graph is being captured now (default: :func:`capturing` of
            ``device``; tests on a CPU pass their own).
    """

    def __init__(self, *, device: torch.device,
                 is_capturing: Callable[[], bool] | None = None) -> None:
        self._is_capturing = is_capturing or (lambda: capturing(device))
        self.launches = 0  # canary launch pairs enqueued (eager + replayed) since serving started
        self.sweep_launches = 0
        self.publications = 0  # counter publications enqueued (eager + replayed)
        self._capture: _Capture | None = None
        self._captured = _Captured()

    def reset(self) -> None:
        """Serving starts: the counts start at zero (the device counters are zeroed too)."""
        self.launches = 0
        self.sweep_launches = 0
        self.publications = 0

    def count_launch(self) -> None:
        """One canary launch pair was enqueued (or captured into the graph being captured)."""
        if self._is_capturing():
            if self._capture is not None:
                self._capture.launches += 1
        else:
            self.launches += 1

    def count_publication(self) -> None:
        """One counter publication was enqueued (or captured)."""
        if self._is_capturing():
            if self._capture is not None:
                self._capture.publications += 1
        else:
            self.publications += 1

    def count_sweep_launches(self, count: int) -> None:
        """``count`` sweep launches were enqueued."""
        self.sweep_launches += count

    @contextmanager
    def _capture_scope(self) -> Iterator[_Capture]:
        self._capture = scope = _Capture()
        try:
            yield scope
        finally:
            self._capture = None

    def capture_graph(self, *, graph_runner: Any, bs: int, capture: Callable[[], _T]) -> _T:
        """Run one decode / target-verify capture of ``bs`` rows, keeping what it captured."""
        with self._capture_scope() as scope:
            result = capture()
        key = (id(graph_runner), bs)
        self._captured.launches[key] = scope.launches
        self._captured.publications[key] = scope.publications
        return result

    def capture_same_per_size(self, *, graph_runner: Any, capture: Callable[[], _T]) -> _T:
        """Run one capture of an EAGLE graph runner, which must capture the same launch pairs for
        every batch size (each replay then enqueues them).

        Raises:
            CanaryHealthError: this size captured another number than an earlier one.
        """
        with self._capture_scope() as scope:
            result = capture()
        known = self._captured.per_runner.setdefault(id(graph_runner), scope.launches)
        if known != scope.launches:
            raise CanaryHealthError(
                f"KV canary: {type(graph_runner).__name__} captured {scope.launches} canary "
                f"launches for one batch size but {known} for another"
            )
        return result

    def replayed(self, *, graph_runner: Any, bs: int) -> None:
        """A decode / target-verify graph of ``bs`` rows was replayed."""
        key = (id(graph_runner), bs)
        self.launches += self._captured.launches.get(key, 0)
        self.publications += self._captured.publications.get(key, 0)

    def replayed_same_per_size(self, *, graph_runner: Any) -> None:
        """An EAGLE graph runner's graph was replayed."""
        self.launches += self._captured.per_runner.get(id(graph_runner), 0)

    def check_forward(self, *, launches_before: int, live: bool, step: int,
                      forward_batch: Any) -> None:
        """The forward that began when :attr:`launches` was ``launches_before`` is done: it must
        have enqueued exactly one launch pair if it had request rows, none otherwise.

        Raises:
            CanaryHealthError: it did not (corruption would go unreported).
        """
        ran = self.launches - launches_before
        if ran > 1 or (live and ran != 1):
            raise CanaryHealthError(
                f"KV canary health check failed: canary path is not executing as it must: "
                f"forward step {step} ({forward_batch.forward_mode.name}, "
                f"{forward_batch.batch_size} rows) ran the canary launches {ran} times, "
                f"expected {int(live)}. Corruption would go unreported."
            )
