"""Counter snapshots: what the host learns from one publication of the device counters (see
:mod:`.counter_mailbox`)."""

from __future__ import annotations

from dataclasses import dataclass

from sglang.jit_kernel.kv_canary.consts import (
    COUNTER_ENTRIES,
    COUNTER_KERNEL_RUNS,
    COUNTER_VIOLATIONS,
    NUM_COUNTERS,
    CheckKind,
)


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

    @property
    def slots_verified(self) -> int:
        """Slot verifications so far: pre-forward plus post-forward entries."""
        return self.entries(CheckKind.PRE_VERIFY) + self.entries(CheckKind.POST_VERIFY)


ZERO_SNAPSHOT = CounterSnapshot(steps=0, launches=0, sweep_launches=0, counters=(0,) * NUM_COUNTERS)
