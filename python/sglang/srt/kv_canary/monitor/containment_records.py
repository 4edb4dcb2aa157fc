"""What abort mode did, as values: one :class:`AbortRecord` per request it finished and one
:class:`EvictionRecord` per set of radix-cache nodes it made unmatchable. Their consumers (the
report file's ``abort`` / ``cache_eviction`` objects, the prometheus counters) implement
:class:`ContainmentSink`."""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol


class AbortCause(enum.Enum):
    """Why a request was aborted."""

    VIOLATION = "violation"  # a violation row names it (its forward read or wrote the slot)
    CACHE = "cache"  # its cached prefix holds a radix node being evicted (it reads that slot)
    RING_OVERFLOW = "ring_overflow"  # rows were dropped: every live request is aborted
    UNKNOWN_OWNER = "unknown_owner"  # a row's request is unknown: every live request is aborted


class EvictionCause(enum.Enum):
    """Why radix nodes were evicted."""

    VIOLATION = "violation"  # they hold a reported slot or a reported request's prefix
    RING_OVERFLOW = "ring_overflow"  # rows were dropped: the whole tree goes


@dataclass(frozen=True, slots=True, kw_only=True)
class AbortRecord:
    """One request finished with the canary's error.

    ``step``, ``check``, ``reasons``, ``slot``, ``position``: the first violation row that named
    the request (None for the causes that name no row). ``tokens_delivered``: output tokens the
    request had produced before the abort, all from forwards before the violation's (the
    faulted forward's token is withheld).
    """

    rid: str
    cause: AbortCause
    step: int | None
    check: str | None
    reasons: tuple[str, ...]
    slot: int | None
    position: int | None
    tokens_delivered: int


@dataclass(frozen=True, slots=True, kw_only=True)
class EvictionRecord:
    """Radix nodes made unmatchable at once (freed as soon as no request holds them).

    ``nodes`` / ``tokens``: tree nodes and KV tokens removed from the tree; ``locked_nodes``:
    those still held by (aborted) requests, freed when they finish; ``slots``: the reported
    slots whose content is suspect; ``rids``: the requests whose cached prefix was cut from the
    reported position on.
    """

    cause: EvictionCause
    nodes: int
    tokens: int
    locked_nodes: int
    slots: tuple[int, ...]
    rids: tuple[str, ...]


class ContainmentSink(Protocol):
    """Told what abort mode did (cold path). Must not raise."""

    def record_containment(
        self, *, aborts: Sequence[AbortRecord], evictions: Sequence[EvictionRecord]
    ) -> None:
        ...
