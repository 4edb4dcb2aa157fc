"""``foreign_prefix`` perturbation: a request reads another request's whole, consistent history.

Models a scheduler / radix-cache bug that hands a request the cached prefix of a *different*
request of the same length (a wrong radix match, stale pointers into slots another request now
owns at the same positions). The target row's ``req_to_token[rp, 0:P)`` is pointed at another
live row's ``[0, P)``: every record it then reads is self-consistent (positions match, each
chain value follows from its predecessor), so the chain, position and real-data checks stay
silent; only the ownership check can see that the history is not the request's own
(``verify_owner``). Undone right after the forward, like ``req_to_token``; the records this
forward wrote were chained from the foreign history, so the next forward may add
``verify_chain_hash`` at the row's first new position. A pair of rows that share the prefix
(siblings of one prompt) is skipped: that would change nothing (the only perturbation that reads
the device: one comparison of two records per injected fault, to know the history is foreign).
"""

from __future__ import annotations

import random

import torch

from sglang.jit_kernel.kv_canary.consts import FIELD_STAMP
from sglang.srt.kv_canary.perturb.fault import InjectedFault
from sglang.srt.kv_canary.perturb.live_rows import LiveRow


class ForeignPrefixPerturbation:
    """Points one live row's whole prefix at another live row's prefix, for one forward."""

    kind = "foreign_prefix"

    def __init__(self, *, req_to_token: torch.Tensor, records: torch.Tensor) -> None:
        self._req_to_token = req_to_token
        self._records = records

    def inject(
        self, *, forward_batch: object, rows: list[LiveRow], rng: random.Random,
        step: int,
    ) -> InjectedFault | None:
        pairs = [
            (target, source)
            for target in rows
            for source in rows
            if source is not target and 1 <= target.prefix_len <= source.prefix_len
        ]
        if not pairs:
            return None
        target, source = rng.choice(pairs)
        length = target.prefix_len
        table = self._req_to_token
        target_rp = forward_batch.req_pool_indices[target.row : target.row + 1].to(torch.int64)
        source_rp = forward_batch.req_pool_indices[source.row : source.row + 1].to(torch.int64)
        saved = table.index_select(0, target_rp)[:, :length]
        foreign = table.index_select(0, source_rp)[:, :length]
        last = torch.stack([saved[0, -1], foreign[0, -1]]).to(torch.int64)
        if torch.equal(*self._records.index_select(0, last)[:, :FIELD_STAMP]):
            # Both rows hold the same history up to here (siblings of one prompt, a shared
            # radix prefix): the same token, position and chain value at the last position.
            # Pointing one at the other would change nothing. The one host sync of the
            # perturbations (test-only).
            return None
        columns = torch.arange(length, device=table.device)

        def write(values: torch.Tensor) -> None:
            table.index_put_((target_rp.expand(length), columns), values[0])

        write(foreign)
        return InjectedFault(
            fault=self.kind, row=target, position=length - 1,
            detail=f"source_row={source.row} source_rid={source.rid} length={length}",
            undo=lambda: write(saved),
        )
