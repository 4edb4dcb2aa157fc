"""Rounds of every workload on every participant (a server), interleaved, within a deadline.

First a warm-up sweep: one round 0 of every workload on every participant (compiles, fills
caches; not reported). Then measured sweeps ``k = 1, 2, ...``: for each workload in turn, round
``k`` on every participant, their order rotated by one each sweep. Every participant's round
``k`` of a workload is thus measured within seconds of the others', so a ratio of two
participants can be taken round by round (:func:`.stats.paired_ratios`) and slow drift of the
machine over the run cancels out of it.

A sweep starts only if the longest sweep so far (before any, the warm-up sweep) still ends
before the deadline, and no more than ``max_rounds`` sweeps run. A participant whose round fails
is left out of later rounds with the reason. Each participant is resumed just before each of its
rounds and paused just after, so (for servers that are paused between rounds) only the server
being measured runs.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from .deadline import Deadline
from .workloads import RoundTiming, Workload

_T = TypeVar("_T")


def rotated(items: Sequence[_T], *, by: int) -> list[_T]:
    """``items`` rotated left by ``by`` (modulo their count): round ``k`` of an interleaved
    measurement starts with the ``k``-th item, so every item takes every place in turn."""
    if not items:
        return []
    shift = by % len(items)
    return [*items[shift:], *items[:shift]]


def _nothing() -> None:
    return None


@dataclass(slots=True, kw_only=True)
class Participant:
    """One server measured: ``run_round(workload, round_index)`` times one round (raises
    ``RuntimeError`` when it fails); ``skip`` gives why a workload cannot run there (None: it
    can); ``resume`` is called before each of its rounds and ``pause`` after (a server runs
    only while it is measured)."""

    label: str
    run_round: Callable[[Workload, int], RoundTiming]
    skip: Callable[[Workload], str | None] = lambda _: None
    resume: Callable[[], None] = _nothing
    pause: Callable[[], None] = _nothing
    failure: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class Interleaved:
    """What :func:`measure_interleaved` measured.

    Attributes:
        rounds: per participant label, per workload name, round index -> timing.
        sweeps: measured sweeps run.
        warm_up_s: the warm-up sweep's duration.
        longest_sweep_s: the longest measured sweep (0.0: none).
        stopped: why no further sweep ran (``max rounds``, ``time budget``, ``no participant``).
        notes: participants left out and workloads skipped, with the reasons.
    """

    rounds: Mapping[str, Mapping[str, Mapping[int, RoundTiming]]]
    sweeps: int
    warm_up_s: float
    longest_sweep_s: float
    stopped: str
    notes: tuple[str, ...] = ()

    def series(self, *, label: str, workload: str) -> Mapping[int, RoundTiming]:
        """Round index -> timing of ``label`` on ``workload`` (empty: none)."""
        return self.rounds.get(label, {}).get(workload, {})


@dataclass(slots=True)
class _Sweeper:
    participants: Sequence[Participant]
    workloads: Sequence[Workload]
    clock: Callable[[], float]
    rounds: dict[str, dict[str, dict[int, RoundTiming]]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def sweep(self, round_index: int) -> float:
        """Round ``round_index`` of every workload on every live participant; its duration."""
        begun = self.clock()
        for workload in self.workloads:
            for participant in rotated(self.participants, by=max(round_index - 1, 0)):
                if participant.failure or participant.skip(workload) is not None:
                    continue
                participant.resume()
                try:
                    timing = participant.run_round(workload, round_index)
                except RuntimeError as error:
                    participant.failure = str(error).splitlines()[0][:240] or repr(error)
                    self.notes.append(f"{participant.label}: left out from {workload.name} "
                                      f"round {round_index} on: {participant.failure}")
                    continue
                finally:
                    participant.pause()
                if round_index > 0:
                    self.rounds.setdefault(participant.label, {}).setdefault(
                        workload.name, {})[round_index] = timing
        return self.clock() - begun


def measure_interleaved(*, participants: Sequence[Participant], workloads: Sequence[Workload],
                        deadline: Deadline, max_rounds: int,
                        clock: Callable[[], float] = time.monotonic) -> Interleaved:
    """Warm up, then measure sweeps of ``workloads`` on ``participants`` as the module docstring
    says, until ``max_rounds`` sweeps ran or the next would end after ``deadline``.

    Raises:
        ValueError: ``max_rounds`` < 1.
    """
    if max_rounds < 1:
        raise ValueError(f"max_rounds={max_rounds!r} is invalid; allowed: an integer >= 1")
    sweeper = _Sweeper(participants=participants, workloads=workloads, clock=clock)
    for participant in participants:
        for workload in workloads:
            if (why := participant.skip(workload)) is not None:
                sweeper.notes.append(f"{participant.label}: {workload.name} skipped: {why}")
    if not participants:
        return Interleaved(rounds={}, sweeps=0, warm_up_s=0.0, longest_sweep_s=0.0,
                           stopped="no participant", notes=tuple(sweeper.notes))
    warm_up_s = sweeper.sweep(0)
    longest = 0.0
    sweeps = 0
    stopped = "max rounds"
    while sweeps < max_rounds:
        if not any(not participant.failure for participant in participants):
            stopped = "no participant"
            break
        if not deadline.allows(longest or warm_up_s):
            stopped = "time budget"
            break
        sweeps += 1
        longest = max(longest, sweeper.sweep(sweeps))
    return Interleaved(rounds=sweeper.rounds, sweeps=sweeps, warm_up_s=warm_up_s,
                       longest_sweep_s=longest, stopped=stopped, notes=tuple(sweeper.notes))
