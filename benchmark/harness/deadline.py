"""The time budget of a benchmark run: a deadline on a monotonic clock."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True, kw_only=True)
class Deadline:
    """A point in time on ``clock`` (seconds) that work must end before."""

    end: float
    clock: Callable[[], float] = time.monotonic

    @classmethod
    def after(cls, seconds: float, *, clock: Callable[[], float] = time.monotonic) -> Deadline:
        """The deadline ``seconds`` from now.

        Raises:
            ValueError: ``seconds`` is not > 0.
        """
        if not seconds > 0:
            raise ValueError(f"a deadline after {seconds!r} s is invalid; allowed: > 0")
        return cls(end=clock() + seconds, clock=clock)

    def remaining_s(self) -> float:
        """Seconds left (negative once passed)."""
        return self.end - self.clock()

    def allows(self, seconds: float) -> bool:
        """Whether work expected to take ``seconds`` ends before the deadline."""
        return self.remaining_s() >= seconds

    def earlier_by(self, seconds: float) -> Deadline:
        """The deadline ``seconds`` earlier, on the same clock (time kept for later work)."""
        return dataclasses.replace(self, end=self.end - seconds)

    def capped_at(self, other: Deadline) -> Deadline:
        """The earlier of this deadline and ``other`` (same clock)."""
        return self if self.end <= other.end else other
