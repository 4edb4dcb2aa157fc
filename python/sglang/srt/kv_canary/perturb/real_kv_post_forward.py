"""``real_kv_post_forward`` perturbation: flip a byte of a slot this forward just wrote.

Models a late or stray write landing on freshly written K/V after the forward (a transfer
engine, an offload copy). Injected after the forward, once the canary has fingerprinted the new
slots, and never undone: the next verify of that slot (the request's next forward, a radix-cache
hit, the sweep) must report ``verify_real_kv_hash``. Needs real data on to be visible.
"""

from __future__ import annotations

import random

from sglang.srt.kv_canary.perturb.fault import InjectedFault
from sglang.srt.kv_canary.perturb.input_ids import pick_new_token
from sglang.srt.kv_canary.perturb.kv_bytes import FingerprintedBytes
from sglang.srt.kv_canary.perturb.live_rows import LiveRow


def _keep(*_: object) -> None:
    return None


class RealKvPostForwardPerturbation:
    """Flips one fingerprinted byte of a slot written by this forward, after the forward."""

    kind = "real_kv_post_forward"

    def __init__(self, *, kv_bytes: FingerprintedBytes) -> None:
        self._kv_bytes = kv_bytes

    def inject(
        self, *, forward_batch: object, rows: list[LiveRow], rng: random.Random,
        step: int,
    ) -> InjectedFault | None:
        picked = pick_new_token(forward_batch, rows, rng)
        if picked is None:
            return None
        row, offset, token_index = picked
        slot = forward_batch.out_cache_loc[token_index : token_index + 1]
        position = row.prefix_len + offset
        # the row the request's next forward reads there (partial), if it comes next
        name, _ = self._kv_bytes.flip(slot=slot, rng=rng, due_at=(position, step + 1))
        return InjectedFault(
            fault=self.kind, row=row, position=position,
            detail=f"buffer={name} token_index={token_index} persistent=1", undo=_keep,
        )
