"""What the pools whose KV slots are their record slots share (MHA, FP4 MHA, MLA): one record
per pool slot at the same index, the padding page's rows, no window slots, and the radix sweep
over SGLang's plain ``RadixCache`` (its node values are pool slots)."""

from __future__ import annotations

import torch

from sglang.jit_kernel.kv_canary.consts import RECORD_BYTES
from sglang.srt.kv_canary.pools.seam import SlotMapping


def fingerprinted_layers(num_layers: int) -> tuple[int, ...]:
    """The layers whose rows real data reads: the first and the last."""
    last = num_layers - 1
    return (0,) if last == 0 else (0, last)


class PlainSlotPool:
    """The part of a :class:`~.seam.CanaryPool` common to these pools; a subclass says where its
    buffers are (``num_record_slots``, ``device``, ``fingerprint_buffers``, ``describe``)."""

    slot_mapping = SlotMapping.IDENTITY

    @staticmethod
    def record_bytes_per_token() -> int:
        """Bytes the records add to each KV token's cell."""
        return RECORD_BYTES

    @staticmethod
    def extra_record_rows(*, page_size: int) -> int:
        """Record rows beyond the pool's token capacity: its padding page."""
        return page_size

    def window_spec(self) -> None:
        return None

    def sweep_refusal(self, tree_cache: object) -> str | None:
        """None for SGLang's ``RadixCache`` (EAGLE's included: its bigram keys still map node
        position ``i`` to the slot of token ``i``)."""
        from sglang.srt.mem_cache.radix_cache import RadixCache

        if type(tree_cache) is RadixCache:
            return None
        name = type(tree_cache).__name__
        hint = (
            "the radix cache is disabled (--disable-radix-cache)"
            if "Chunk" in name
            else f"the scheduler's prefix cache is {name}"
        )
        return (
            f"SGLANG_KV_CANARY_SWEEP_INTERVAL needs SGLang's RadixCache, but {hint}; unset "
            "SGLANG_KV_CANARY_SWEEP_INTERVAL or use the default radix cache"
        )

    def cached_record_slots(self, node_value: torch.Tensor) -> torch.Tensor:
        return node_value.to(device=self.device, dtype=torch.int64)

    def unlocked_leaves(self, tree_cache: object) -> list:
        """The ``RadixCache`` leaves with KV that no request holds, by node id."""
        return sorted(
            (leaf for leaf in tree_cache.evictable_leaves
             if leaf.lock_ref == 0 and leaf.value is not None and len(leaf.value) > 0),
            key=lambda leaf: leaf.id,
        )
