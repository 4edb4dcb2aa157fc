"""``req_to_token`` perturbation: a request's prefix entry points at another request's slot.

Models a scheduler / radix-cache / allocator bug that maps a position of one request to a slot
holding another request's K/V. The target entry is a prefix position of a live request (verified
this forward) and the new slot is a prefix slot of a *different* live request at a *different*
position, so the slot's record can never verify: its stored position differs
(``verify_position``), and its chain value describes another history (``verify_chain_hash`` when
the histories differ). A prefix slot is never one of this forward's ``out_cache_loc`` slots.
"""

from __future__ import annotations

import random

import torch

from sglang.srt.kv_canary.perturb.fault import InjectedFault
from sglang.srt.kv_canary.perturb.live_rows import LiveRow


def distinct_positions(*, rng: random.Random, target_len: int, source_len: int) -> tuple[int, int]:
    """Uniform ``(target_pos, source_pos)`` with ``target_pos < target_len``,
    ``source_pos < source_len`` and ``target_pos != source_pos``.

    Requires both lengths >= 1 and not both == 1.
    """
    if source_len == 1:
        return 1 + rng.randrange(target_len - 1), 0
    target_pos = rng.randrange(target_len)
    if target_pos >= source_len:
        return target_pos, rng.randrange(source_len)
    source_pos = rng.randrange(source_len - 1)
    return target_pos, source_pos + (source_pos >= target_pos)


class ReqToTokenPerturbation:
    """Redirects one ``req_to_token`` prefix entry for one forward."""

    kind = "req_to_token"

    def __init__(self, *, req_to_token: torch.Tensor) -> None:
        self._flat = req_to_token.view(-1)
        self._row_len = req_to_token.shape[1]

    def _entry_index(self, *, forward_batch: object, row: int, position: int) -> torch.Tensor:
        """Device index of ``req_to_token[req_pool_indices[row], position]`` (1 element)."""
        req_pool_index = forward_batch.req_pool_indices[row : row + 1].to(torch.int64)
        return req_pool_index * self._row_len + position

    def inject(
        self, *, forward_batch: object, rows: list[LiveRow], rng: random.Random,
        step: int,
    ) -> InjectedFault | None:
        targets = [row for row in rows if row.prefix_len >= 1]
        if len(targets) < 2:
            return None
        target = rng.choice(targets)
        sources = [
            row for row in targets
            if row is not target and max(row.prefix_len, target.prefix_len) >= 2
        ]
        if not sources:
            return None
        source = rng.choice(sources)
        target_pos, source_pos = distinct_positions(
            rng=rng, target_len=target.prefix_len, source_len=source.prefix_len
        )
        target_index = self._entry_index(
            forward_batch=forward_batch, row=target.row, position=target_pos
        )
        source_index = self._entry_index(
            forward_batch=forward_batch, row=source.row, position=source_pos
        )
        flat = self._flat
        saved = flat.index_select(0, target_index)
        flat.index_copy_(0, target_index, flat.index_select(0, source_index))
        return InjectedFault(
            fault=self.kind,
            row=target,
            position=target_pos,
            detail=f"source_row={source.row} source_rid={source.rid} source_position={source_pos}",
            undo=lambda: flat.index_copy_(0, target_index, saved),
        )
