"""``real_kv_used`` perturbation: flip byte 0 of a live prefix slot's layer-0 K row.

Models corruption of cached K/V bytes that a request is about to read (a stray write, a bad
transfer). The mapping and the record stay intact, so only the real-data fingerprint can see it
(``verify_real_kv_hash``, with ``SGLANG_KV_CANARY_REAL_DATA=partial`` or ``all``); with real data
off it must stay silent. Byte 0 is inside the 16 bytes ``partial`` folds.
"""

from __future__ import annotations

import random

import torch

from sglang.srt.kv_canary.perturb.fault import InjectedFault
from sglang.srt.kv_canary.perturb.live_rows import LiveRow

FLIP_MASK = 0xFF


class RealKvUsedPerturbation:
    """XORs :data:`FLIP_MASK` into byte 0 of a live prefix slot's layer-0 K row, for one forward."""

    kind = "real_kv_used"

    def __init__(self, *, req_to_token: torch.Tensor, layer0_keys: torch.Tensor) -> None:
        if not layer0_keys.is_contiguous():
            raise ValueError("real_kv_used perturbation needs a contiguous layer-0 K buffer")
        self._req_to_token_flat = req_to_token.view(-1)
        self._row_len = req_to_token.shape[1]
        self._key_bytes = layer0_keys.view(layer0_keys.shape[0], -1).view(torch.uint8)

    def inject(
        self, *, forward_batch: object, rows: list[LiveRow], rng: random.Random
    ) -> InjectedFault | None:
        targets = [row for row in rows if row.prefix_len >= 1]
        if not targets:
            return None
        target = rng.choice(targets)
        position = rng.randrange(target.prefix_len)
        req_pool_index = forward_batch.req_pool_indices[target.row : target.row + 1].to(torch.int64)
        slot = self._req_to_token_flat.index_select(0, req_pool_index * self._row_len + position)
        byte_index = slot.to(torch.int64) * self._key_bytes.shape[1]  # byte 0 of the slot's row
        flat_bytes = self._key_bytes.view(-1)

        def flip() -> None:
            flipped = flat_bytes.index_select(0, byte_index) ^ FLIP_MASK
            flat_bytes.index_copy_(0, byte_index, flipped)

        flip()
        return InjectedFault(
            fault=self.kind, row=target, position=position, detail="layer=0 byte=0", undo=flip
        )
