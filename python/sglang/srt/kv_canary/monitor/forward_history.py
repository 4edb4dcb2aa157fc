"""What a violation row's step and request row stood for on the host: the forward's mode and
batch size, and the request (``rid``) that owned the row. A bounded history the runner keeps
only while the report file is on (``SGLANG_KV_CANARY_REPORT_PATH``).

Fed by the runner from host values only, never from device memory:

* every live forward, :meth:`ForwardHistory.record_forward` stores the forward's mode and row
  count in a ring of :data:`HISTORY_STEPS` entries indexed by step: O(1);
* with it, the ``(req_pool_idx, rid)`` of every row, but only for the forwards whose request rows
  the runner packs on the host anyway (EXTEND / MIXED, and every forward of a speculative
  canary: see ``CanaryRunner.on_init_new``); a plain decode step passes None. Its rows were
  all admitted by an earlier such forward: a request row changes owner only at an admission.
  Each row keeps its owner changes as ``(first step, rid)``, the newest :data:`OWNERS_PER_ROW`.

:meth:`ForwardHistory.context` answers for one row's ``(step, req_pool_idx)``. What it does not
know is None, never a guess: the mode and batch size of a step older than the last
:data:`HISTORY_STEPS` forwards (or of a step no forward ran at), the rid of a request row with
no owner recorded at or before the step (row 0: padding rows; a row whose owner changed more
than :data:`OWNERS_PER_ROW` times since).

:data:`HISTORY_STEPS` covers the reporting delay with a wide margin: a violation is reported at
the first poll after its forward's counter publication reached the host, normally one step
later; a snapshot that trails the host by more than ``health.MAX_SNAPSHOT_LAG_STEPS`` (64) steps
fails the health check, and the mailbox labels at most ``counter_mailbox.MAX_LABELS`` (4096)
unread publications.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

HISTORY_STEPS = 4096  # forwards whose mode and batch size are kept
OWNERS_PER_ROW = 8  # owner changes kept per request row

_Forward = tuple[int, enum.Enum, int]  # (step, forward mode, batch size)


@dataclass(frozen=True, slots=True, kw_only=True)
class ForwardContext:
    """What the host knew of one violation row's forward and request (None: unknown)."""

    rid: str | None
    forward_mode: str | None  # SGLang's ForwardMode name (DECODE, EXTEND, MIXED, ...)
    batch_size: int | None  # rows of the live (unpadded) batch


class ForwardHistory:
    """The last :data:`HISTORY_STEPS` forwards and each request row's recent owners.

    Args:
        steps: forwards kept (tests: fewer).
        owners_per_row: owner changes kept per request row.
    """

    def __init__(self, *, steps: int = HISTORY_STEPS,
                 owners_per_row: int = OWNERS_PER_ROW) -> None:
        if steps < 1 or owners_per_row < 1:
            raise ValueError(f"steps and owners_per_row must be >= 1, got {steps}, "
                             f"{owners_per_row}")
        self._forwards: list[_Forward | None] = [None] * steps
        self._owners_per_row = owners_per_row
        self._owners: dict[int, deque[tuple[int, str]]] = {}
        self._latest_step: int | None = None

    @property
    def latest_step(self) -> int | None:
        """The step of the newest forward recorded (None: none yet)."""
        return self._latest_step

    def record_forward(
        self, *, step: int, mode: enum.Enum, batch_size: int,
        owners: Sequence[tuple[int, str]] | None,
    ) -> None:
        """Forward ``step`` ran in ``mode`` over ``batch_size`` rows; ``owners`` are its rows'
        ``(req_pool_idx, rid)`` when the caller read them (None: no row changed owner). O(1)
        without owners; with them, O(rows) dictionary look-ups."""
        forwards = self._forwards
        forwards[step % len(forwards)] = (step, mode, batch_size)
        self._latest_step = step
        if owners is None:
            return
        kept = self._owners
        for row, rid in owners:
            changes = kept.get(row)
            if changes is None:
                kept[row] = deque(((step, rid),), maxlen=self._owners_per_row)
            elif changes[-1][1] != rid:
                changes.append((step, rid))

    def context(self, *, step: int, req_pool_idx: int) -> ForwardContext:
        """The forward of ``step`` and the owner of request row ``req_pool_idx`` at that step
        (see the module docstring for what is None)."""
        forwards = self._forwards
        entry = forwards[step % len(forwards)] if step >= 0 else None
        known = entry is not None and entry[0] == step
        return ForwardContext(
            rid=self._owner_at(step=step, row=req_pool_idx),
            forward_mode=entry[1].name if known else None,
            batch_size=entry[2] if known else None,
        )

    def _owner_at(self, *, step: int, row: int) -> str | None:
        changes = self._owners.get(row)
        if changes is None:
            return None
        for first_step, rid in reversed(changes):
            if first_step <= step:
                return rid
        return None
