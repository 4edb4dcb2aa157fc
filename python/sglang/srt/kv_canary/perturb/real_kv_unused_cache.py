"""``real_kv_unused_cache`` perturbation: flip a byte of a cached slot no live request uses.

Models corruption of a cached prefix nobody reads right now (a stray write into a freed-looking
page, a bad offload reload). The per-forward checks cannot see it; the radix sweep must
(``check=sweep``, ``verify_real_kv_hash``). Injected when a sweep pass starts, into a leaf of
the radix cache that no request holds (the pool seam lists them), and never undone: the slot stays
corrupt until the cache evicts it.
"""

from __future__ import annotations

import random
from typing import Any

import torch

from sglang.srt.kv_canary.perturb.fault import InjectedFault
from sglang.srt.kv_canary.perturb.kv_bytes import FingerprintedBytes
from sglang.srt.kv_canary.perturb.live_rows import LiveRow
from sglang.srt.kv_canary.pools.seam import CanaryPool


def _keep(*_: object) -> None:
    return None


class RealKvUnusedCachePerturbation:
    """Flips one fingerprinted byte of an unlocked radix-cache leaf's slot."""

    kind = "real_kv_unused_cache"

    def __init__(self, *, kv_bytes: FingerprintedBytes, pool: CanaryPool) -> None:
        self._kv_bytes = kv_bytes
        self._pool = pool

    def inject_into_cache(self, *, tree_cache: Any, rng: random.Random) -> InjectedFault | None:
        leaves = self._pool.unlocked_leaves(tree_cache)
        if not leaves:
            return None
        leaf = rng.choice(leaves)
        offset = rng.randrange(len(leaf.value))
        depth = 0
        node = leaf.parent
        while node is not None and node.parent is not None:
            depth += len(node.key)
            node = node.parent
        slot = leaf.value[offset : offset + 1].to(torch.int64)
        name, _ = self._kv_bytes.flip(slot=slot, rng=rng)
        return InjectedFault(
            fault=self.kind, row=LiveRow(row=0, prefix_len=0, rid="radix-cache"),
            position=depth + offset, detail=f"buffer={name} node={leaf.id} persistent=1",
            undo=_keep,
        )
