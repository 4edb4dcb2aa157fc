"""What a perturbation did, how to undo it, and its log line."""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from sglang.srt.kv_canary.perturb.live_rows import LiveRow

PERTURB_LINE_PREFIX = "kv_canary perturb:"
PERTURB_LINE_RE = re.compile(
    r"kv_canary perturb: fault=(?P<fault>[a-z_]+) step=(?P<step>\d+) row=(?P<row>\d+) "
    r"rid=(?P<rid>\S+) position=(?P<position>\d+)(?P<detail>(?: [a-z_]+=\S+)*)$"
)


@dataclass(frozen=True, slots=True, kw_only=True)
class InjectedFault:
    """One injected fault: where (batch row, request, position) and how to undo it.

    ``undo`` enqueues device work on the current stream; calling it right after the forward
    restores the exact previous bytes.
    """

    fault: str  # perturbation kind, e.g. "req_to_token"
    row: LiveRow
    position: int  # the prefix position of ``row`` whose slot (or mapping) was corrupted
    detail: str  # extra "key=value" pairs for the log line
    undo: Callable[[], None]

    def log_line(self, *, step: int) -> str:
        """``kv_canary perturb: fault=<kind> step=<n> row=<i> rid=<rid> position=<p> ...``."""
        return (
            f"{PERTURB_LINE_PREFIX} fault={self.fault} step={step} row={self.row.row} "
            f"rid={self.row.rid} position={self.position} {self.detail}"
        )


class Perturbation(Protocol):
    """One kind of fault."""

    kind: str

    def inject(
        self, *, forward_batch: object, rows: list[LiveRow], rng: random.Random,
        step: int,
    ) -> InjectedFault | None:
        """Corrupt state for the forward with step ``step``; None when the batch offers no
        valid target."""
