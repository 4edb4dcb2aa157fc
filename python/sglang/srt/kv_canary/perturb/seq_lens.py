"""``seq_lens`` perturbation: one live row's device ``seq_lens`` drifts from its host mirror.

Models forward-side code that mutates the scheduler's device ``seq_lens`` (or a mirror that
was not refreshed): the device value the attention and the graph replay read no longer equals
``seq_lens_cpu``, the host mirror the scheduler plans with. Before the forward (before a graph
replay copies it), ``seq_lens[row]`` of a chosen live row is increased by one; the host mirror
keeps the true value; undone right after the forward. The seq_lens invariant must report
``verify_seq_lens`` for that row (a decode row's shifted prefix may add other reasons).
"""

from __future__ import annotations

import random

from sglang.srt.kv_canary.perturb.fault import InjectedFault
from sglang.srt.kv_canary.perturb.live_rows import LiveRow


class SeqLensPerturbation:
    """Adds one to a live row's device ``seq_lens`` for one forward."""

    kind = "seq_lens"

    def inject(
        self, *, forward_batch: object, rows: list[LiveRow], rng: random.Random,
        step: int,
    ) -> InjectedFault | None:
        if not rows:
            return None
        row = rng.choice(rows)
        value = forward_batch.seq_lens[row.row : row.row + 1]  # a view
        value.add_(1)
        drifted = int(forward_batch.seq_lens_cpu[row.row]) + 1
        return InjectedFault(  # position: the drifted device value the violation row reports
            fault=self.kind, row=row, position=drifted, detail="delta=1",
            undo=lambda: value.sub_(1),
        )
