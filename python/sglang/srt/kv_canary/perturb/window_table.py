"""``window_table`` perturbation: a live slot's sliding-window mapping entry points at another
slot's window slot (hybrid sliding-window pools).

Models an SWA allocator or eviction bug that maps a position inside a request's window to a
window slot holding another position's K/V (SGLang's ``full_to_swa_index_mapping`` is the
sliding-window sub-pool's ``req_to_token``). The target is a prefix position inside a live row's
window and the source another position inside a live row's window: the window slot
the target then names is owned by the source's slot, so the verify of this forward reports it
(``verify_window_owner``). Undone right after the forward; the table is only read and written on
the device (no host sync).
"""

from __future__ import annotations

import random

import torch

from sglang.srt.kv_canary.perturb.fault import InjectedFault
from sglang.srt.kv_canary.perturb.live_rows import LiveRow


class WindowTablePerturbation:
    """Redirects one sliding-window mapping entry for one forward."""

    kind = "window_table"

    def __init__(self, *, req_to_token: torch.Tensor, slot_table: torch.Tensor,
                 window: int) -> None:
        self._req_to_token_flat = req_to_token.view(-1)
        self._row_len = req_to_token.shape[1]
        self._table = slot_table
        self._window = window

    def _window_positions(self, row: LiveRow) -> range:
        return range(max(0, row.prefix_len - self._window), row.prefix_len)

    def _slot(self, *, forward_batch: object, row: int, position: int) -> torch.Tensor:
        """Device ``req_to_token[req_pool_indices[row], position]`` (int64 ``[1]``)."""
        req_pool_index = forward_batch.req_pool_indices[row : row + 1].to(torch.int64)
        index = req_pool_index * self._row_len + position
        return self._req_to_token_flat.index_select(0, index).to(torch.int64)

    def inject(
        self, *, forward_batch: object, rows: list[LiveRow], rng: random.Random,
        step: int,
    ) -> InjectedFault | None:
        targets = [row for row in rows if len(self._window_positions(row)) >= 1]
        if not targets:
            return None
        target = rng.choice(targets)
        # two distinct positions name distinct slots (rows sharing a cached prefix share the
        # slots of equal positions)
        sources = [row for row in targets
                   if len(set(self._window_positions(row)) | set(self._window_positions(target)))
                   >= 2]
        if not sources:
            return None
        source = rng.choice(sources)
        target_pos = rng.choice(self._window_positions(target))
        choices = [p for p in self._window_positions(source) if p != target_pos]
        if not choices:
            target_pos = rng.choice([p for p in self._window_positions(target)
                                     if p != self._window_positions(source)[0]])
            choices = [self._window_positions(source)[0]]
        source_pos = rng.choice(choices)
        target_slot = self._slot(forward_batch=forward_batch, row=target.row, position=target_pos)
        source_slot = self._slot(forward_batch=forward_batch, row=source.row, position=source_pos)
        table = self._table
        saved = table.index_select(0, target_slot)
        table.index_copy_(0, target_slot, table.index_select(0, source_slot))
        return InjectedFault(
            fault=self.kind,
            row=target,
            position=target_pos,
            detail=f"source_row={source.row} source_rid={source.rid} source_position={source_pos}",
            undo=lambda: table.index_copy_(0, target_slot, saved),
        )
