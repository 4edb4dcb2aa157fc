"""``real_kv_used`` perturbation: flip a byte of a live prefix slot's fingerprinted K/V bytes.

Models corruption of cached K/V bytes that a request is about to read (a stray write, a bad
transfer). The mapping and the record stay intact, so only the real-data fingerprint can see it
(``verify_real_kv_hash``, with ``SGLANG_KV_CANARY_REAL_DATA=partial`` or ``all``); with real data
off it must stay silent. Undone right after the forward. With ``partial`` the byte is in the row
this forward's verify reads at the position (see :mod:`.kv_bytes`), so it is reported in this
forward whenever the position is due (always, with ``REAL_DATA_STRIDE=1``).
"""

from __future__ import annotations

import random

import torch

from sglang.srt.kv_canary.perturb.fault import InjectedFault
from sglang.srt.kv_canary.perturb.kv_bytes import FingerprintedBytes
from sglang.srt.kv_canary.perturb.live_rows import LiveRow


class RealKvUsedPerturbation:
    """Flips one fingerprinted byte of a live prefix slot for one forward."""

    kind = "real_kv_used"

    def __init__(self, *, req_to_token: torch.Tensor, kv_bytes: FingerprintedBytes) -> None:
        self._req_to_token_flat = req_to_token.view(-1)
        self._row_len = req_to_token.shape[1]
        self._kv_bytes = kv_bytes

    def inject(
        self, *, forward_batch: object, rows: list[LiveRow], rng: random.Random,
        step: int,
    ) -> InjectedFault | None:
        targets = [row for row in rows if row.prefix_len >= 1]
        if not targets:
            return None
        target = rng.choice(targets)
        position = rng.choice(self._kv_bytes.position_range(prefix_len=target.prefix_len))
        req_pool_index = forward_batch.req_pool_indices[target.row : target.row + 1].to(torch.int64)
        slot = self._req_to_token_flat.index_select(0, req_pool_index * self._row_len + position)
        name, undo = self._kv_bytes.flip(slot=slot, rng=rng, due_at=(position, step),
                                         prefix_len=target.prefix_len)
        return InjectedFault(
            fault=self.kind, row=target, position=position, detail=f"buffer={name}", undo=undo
        )
