"""What the pools whose KV slots are their record slots share (MHA, FP4 MHA, MLA): one record
per pool slot at the same index, the padding page's rows, no window slots, and the radix sweep
over SGLang's plain ``RadixCache`` (its node values are pool slots)."""

from __future__ import annotations

import torch

from sglang.jit_kernel.kv_canary.consts import RECORD_BYTES
from sglang.srt.kv_canary.pools.seam import FingerprintBuffer, SlotMapping


def is_hiradix_cache(tree_cache: object) -> bool:
    """Whether ``tree_cache`` is exactly SGLang's ``HiRadixCache`` (told by its class's module
    and name: that module needs SGLang's CUDA kernels to import)."""
    cls = type(tree_cache)
    return (cls.__module__, cls.__qualname__) == ("sglang.srt.mem_cache.hiradix_cache",
                                                  "HiRadixCache")


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
        position ``i`` to the slot of token ``i``) and its ``HiRadixCache`` (the sweep walks the
        nodes with device slots; host-only nodes are verified when loaded)."""
        from sglang.srt.mem_cache.radix_cache import RadixCache

        if type(tree_cache) is RadixCache or is_hiradix_cache(tree_cache):
            return None
        name = type(tree_cache).__name__
        hint = (
            "the radix cache is disabled (--disable-radix-cache)"
            if "Chunk" in name
            else f"the scheduler's prefix cache is {name}"
        )
        return (
            f"SGLANG_KV_CANARY_SWEEP_INTERVAL needs SGLang's RadixCache or HiRadixCache, but "
            f"{hint}; unset "
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

    # the host pool class that copies this pool's slots (None: no host tier)
    host_pool_class: str | None = None
    # host pool layouts whose per-layer views keep each slot's row in one piece
    host_view_layouts: tuple[str, ...] = ("layer_first",)

    def host_tier_refusal(self, host_pool: object) -> str | None:
        """None for exactly :attr:`host_pool_class` (its backups and loads copy whole slots by
        index, any layout or io backend)."""
        name = type(host_pool).__name__
        if self.host_pool_class is not None and name == self.host_pool_class:
            return None
        return (
            f"the hierarchical cache's host pool is {name}, which the canary does not cover "
            f"over {self.kind} (covered: MHATokenToKVPool with MHATokenToKVPoolHost, "
            "MLATokenToKVPool with MLATokenToKVPoolHost); remove --enable-hierarchical-cache"
        )

    def host_fingerprint_buffers(self, host_pool: object) -> tuple[FingerprintBuffer, ...]:
        layout = getattr(host_pool, "layout", None)
        if layout not in self.host_view_layouts:
            raise ValueError(
                f"the host-tier faults read {type(host_pool).__name__} rows in the "
                f"{' or '.join(self.host_view_layouts)} layout only, got "
                f"--hicache-mem-layout {layout}"
            )
        return self._host_views(host_pool)

    def _host_views(self, host_pool: object) -> tuple[FingerprintBuffer, ...]:
        raise NotImplementedError
