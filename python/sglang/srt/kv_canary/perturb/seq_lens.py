"""``seq_lens`` perturbation: one live row's device ``seq_lens`` drifts from its host mirror.

Models forward-side code that reads a device ``seq_lens`` that drifted (a mirror that was not
refreshed, or one changed in place): the device value the attention and the graph replay read
no longer equals ``seq_lens_cpu``, the host mirror the scheduler plans with. Before the forward
(before a graph replay copies it), the batch's ``seq_lens`` is replaced by a copy whose entry of
a chosen live row is one larger; the host mirror keeps the true value; the batch gets its own
tensor back right after the forward. The seq_lens invariant must report ``verify_seq_lens`` for
that row (a decode row's shifted prefix may add other reasons).

A copy, not the tensor itself: with the overlap scheduler SGLang's batch shares that tensor and
plans the next decode step's KV allocation from it while this forward runs (its page-boundary
test reads the device values), so an in-place drift could leak or double-free a page, which
SGLang's idle memory check then reports (and, strict by default, stops the server on). The
fault is the forward reading a wrong value, not SGLang's allocator seeing one.
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
        original = forward_batch.seq_lens
        drifted_lens = original.clone()
        drifted_lens[row.row : row.row + 1].add_(1)
        forward_batch.seq_lens = drifted_lens

        def undo() -> None:
            forward_batch.seq_lens = original

        drifted = int(forward_batch.seq_lens_cpu[row.row]) + 1
        return InjectedFault(  # position: the drifted device value the violation row reports
            fault=self.kind, row=row, position=drifted, detail="delta=1", undo=undo,
        )
