"""The canary over SGLang's hybrid sliding-window pool ``SWAKVPool`` (gpt-oss, Gemma 4,
Llama 4, MiMo-V2, Step-3.5, Laguna): a full-attention ``MHATokenToKVPool`` and a sliding-window
one, with ``SWATokenToKVPoolAllocator`` mapping each full slot to its SWA slot
(``full_to_swa_index_mapping``) and freeing the SWA slots of positions that left the window.

Records: one per full slot, same index (``req_to_token`` and ``out_cache_loc`` name full
slots), so chain, position, token and ownership are checked at every position of a prefix,
inside the window or not. Window slots: the SWA sub-pool, reached through SGLang's mapping on
the device (no copy); a row needs them over its attention window (``p >= P - W``, ``W`` the
model's ``sliding_window_size``, the distance back a query reads), where each must be mapped and
owned by its full slot (the canary's owner table, one int64 per SWA slot, written when the slot
is stamped). SGLang frees SWA slots only below that window (``ScheduleBatch._evict_swa``
keeps ``pre_len - W - page_size`` and up, ``SWARadixCache`` the last ``W`` tokens of a match), so
freed slots are never reported. Real data: K of the first and V of the last layer of each
sub-pool (the SWA ones read through the mapping). The radix sweep walks ``SWARadixCache``:
every cached full slot, and the SWA slots the cache still holds (tombstoned nodes have none).
"""

from __future__ import annotations

import torch

from sglang.srt.kv_canary.pools.seam import (
    FingerprintBuffer,
    PoolContext,
    SlotMapping,
    WindowSpec,
)

POOL_CLASS = "SWAKVPool"
WINDOW_OWNER_BYTES = 8  # the canary's int64 owner per SWA slot


def _classes() -> tuple[type, type]:
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool
    from sglang.srt.mem_cache.swa_memory_pool import SWAKVPool

    return SWAKVPool, MHATokenToKVPool


class SWACanaryPool:
    """:class:`~.seam.CanaryPool` of an ``SWAKVPool`` whose two sub-pools are plain
    ``MHATokenToKVPool`` s with at least one layer each."""

    kind = POOL_CLASS
    slot_mapping = SlotMapping.IDENTITY

    def __init__(self, kv_pool: object, *, sliding_window_size: int) -> None:
        if not self.accepts(kv_pool):
            raise TypeError(
                f"SWACanaryPool needs an {POOL_CLASS} of two MHATokenToKVPool sub-pools, got "
                f"{type(kv_pool).__name__}"
            )
        if isinstance(sliding_window_size, bool) or not isinstance(sliding_window_size, int) \
                or sliding_window_size < 0:
            raise ValueError(
                f"SWACanaryPool needs the model's sliding_window_size (an int >= 0), got "
                f"{sliding_window_size!r}"
            )
        table = kv_pool.full_to_swa_index_mapping
        if table is None:
            raise ValueError(
                f"the {POOL_CLASS} has no full_to_swa_index_mapping yet (SGLang registers it "
                "when it builds the SWA allocator, before the canary attaches)"
            )
        self._pool = kv_pool
        self._full = kv_pool.full_kv_pool
        self._swa = kv_pool.swa_kv_pool
        self._window = WindowSpec(
            slot_table=table, num_window_slots=self._swa.k_buffer[0].shape[0],
            window=sliding_window_size,
        )

    @classmethod
    def build(cls, kv_pool: object, *, context: PoolContext) -> SWACanaryPool:
        """The canary view of ``kv_pool`` with the context's sliding window.

        Raises:
            ValueError: the model runner names no sliding window.
        """
        if context.sliding_window_size is None:
            raise ValueError(
                f"the KV pool is {POOL_CLASS} but the model runner has no sliding_window_size"
            )
        return cls(kv_pool, sliding_window_size=context.sliding_window_size)

    @staticmethod
    def accepts(kv_pool: object) -> bool:
        """Whether ``kv_pool`` is an ``SWAKVPool`` of two non-empty ``MHATokenToKVPool`` s."""
        swa_class, mha_class = _classes()
        if type(kv_pool) is not swa_class:
            return False
        full = getattr(kv_pool, "full_kv_pool", None)
        swa = getattr(kv_pool, "swa_kv_pool", None)
        return (type(full) is mha_class and type(swa) is mha_class
                and len(full.k_buffer) > 0 and len(swa.k_buffer) > 0)

    @staticmethod
    def refusal(kv_pool: object) -> str:
        """Why an ``SWAKVPool`` this class does not accept is refused."""
        full = getattr(kv_pool, "full_kv_pool", None)
        swa = getattr(kv_pool, "swa_kv_pool", None)
        if full is not None and swa is not None and not (full.k_buffer and swa.k_buffer):
            return ("a hybrid pool without full-attention layers (all sliding-window) is not "
                    "supported yet")
        return (f"its sub-pools are {type(full).__name__} and {type(swa).__name__}; only "
                "MHATokenToKVPool sub-pools are supported (use the default --kv-cache-dtype)")

    @property
    def num_record_slots(self) -> int:
        return self._full.k_buffer[0].shape[0]

    @property
    def device(self) -> torch.device:
        return self._full.k_buffer[0].device

    @property
    def sliding_window_size(self) -> int:
        return self._window.window

    @property
    def num_window_slots(self) -> int:
        return self._window.num_window_slots

    def window_spec(self) -> WindowSpec:
        return self._window

    def fingerprint_buffers(self) -> tuple[FingerprintBuffer, ...]:
        buffers = []
        for group, pool, windowed in (("full", self._full, False), ("swa", self._swa, True)):
            last = len(pool.k_buffer) - 1
            buffers.append(FingerprintBuffer(name=f"{group} layer 0 K", buffer=pool.k_buffer[0],
                                             windowed=windowed))
            buffers.append(FingerprintBuffer(name=f"{group} layer {last} V",
                                             buffer=pool.v_buffer[last], windowed=windowed))
        return tuple(buffers)

    def sweep_refusal(self, tree_cache: object) -> str | None:
        from sglang.srt.mem_cache.swa_radix_cache import SWARadixCache

        if type(tree_cache) is SWARadixCache:
            return None
        return (
            f"SGLANG_KV_CANARY_SWEEP_INTERVAL over an {POOL_CLASS} needs SGLang's SWARadixCache, "
            f"but the scheduler's prefix cache is {type(tree_cache).__name__}; unset "
            "SGLANG_KV_CANARY_SWEEP_INTERVAL or use the default radix cache"
        )

    def cached_record_slots(self, node_value: torch.Tensor) -> torch.Tensor:
        return node_value.to(device=self.device, dtype=torch.int64)

    def unlocked_leaves(self, tree_cache: object) -> list:
        leaves = []
        stack = list(tree_cache.root_node.children.values())
        while stack:
            node = stack.pop()
            if node.children:
                stack.extend(node.children.values())
            elif node.full_lock_ref == 0 and node.value is not None and len(node.value) > 0:
                leaves.append(node)
        return sorted(leaves, key=lambda leaf: leaf.id)

    def host_tier_refusal(self, host_pool: object) -> str | None:
        return (
            f"the hierarchical cache of a hybrid sliding-window pool ({type(host_pool).__name__})"
            " moves two slot spaces, which the canary's host tier does not cover yet; remove "
            "--enable-hierarchical-cache"
        )

    def host_fingerprint_buffers(self, host_pool: object) -> tuple[FingerprintBuffer, ...]:
        raise ValueError(self.host_tier_refusal(host_pool))

    def describe(self) -> str:
        full_layers, swa_layers = len(self._full.k_buffer), len(self._swa.k_buffer)
        return (
            f"{POOL_CLASS}, {self.num_record_slots} record slots (one per full-attention slot, "
            f"{full_layers} full layers) and {self.num_window_slots} window slots (one per "
            f"sliding-window slot, {swa_layers} SWA layers, window {self.sliding_window_size}), "
            f"real data from K of the first and V of the last layer of each"
        )
