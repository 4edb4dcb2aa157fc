"""``lost_write`` perturbation: the model's K/V write of one new token lands elsewhere.

Models a wrong index in a backend's KV store or a slot-mapping bug: the intended slot keeps the
bytes it held, the model's K/V goes to another slot. Injected inside an eager forward, after the
canary's pre launch and before the model (so the canary saw the intended slot): the token's
``out_cache_loc`` entry points at the padding slot 0 while the model runs, and is restored
before the post launch. With real data on, the post launch must report ``verify_not_landed`` at
the token's position in that step; with real data off nothing can see it. A replayed CUDA graph
offers no host point inside its forward, so only eager forwards (prefill, mixed, and decode
without CUDA graphs) are perturbed.
"""

from __future__ import annotations

import random

from sglang.srt.kv_canary.perturb.fault import InjectedFault
from sglang.srt.kv_canary.perturb.input_ids import pick_new_token
from sglang.srt.kv_canary.perturb.live_rows import LiveRow


class LostWritePerturbation:
    """Sends one new token's K/V write to slot 0 for the model's part of one forward."""

    kind = "lost_write"

    def inject(
        self, *, forward_batch: object, rows: list[LiveRow], rng: random.Random,
        step: int,
    ) -> InjectedFault | None:
        picked = pick_new_token(forward_batch, rows, rng)
        if picked is None:
            return None
        row, offset, token_index = picked
        entry = forward_batch.out_cache_loc[token_index : token_index + 1]
        intended = entry.clone()
        entry.zero_()
        return InjectedFault(
            fault=self.kind, row=row, position=row.prefix_len + offset,
            detail=f"token_index={token_index}", undo=lambda: entry.copy_(intended),
        )
