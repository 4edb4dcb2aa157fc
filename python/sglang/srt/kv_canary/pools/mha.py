"""The canary over SGLang's ``MHATokenToKVPool`` (per layer a K and a V buffer of
``[size + page_size, heads, head_dim]``).

Records: one per pool slot, same index (slot 0, SGLang's padding slot, included). Real data:
the K and V rows of the first and the last layer (views of SGLang's buffers, never copies). The
radix sweep walks SGLang's plain ``RadixCache``, whose node values are pool slots.
"""

from __future__ import annotations

import torch

from sglang.jit_kernel.kv_canary.consts import RECORD_BYTES
from sglang.srt.kv_canary.pools.seam import FingerprintBuffer, SlotMapping

POOL_CLASS = "MHATokenToKVPool"


def _mha_pool_class() -> type:
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool

    return MHATokenToKVPool


class MHACanaryPool:
    """:class:`~.seam.CanaryPool` of an ``MHATokenToKVPool`` (exactly that class: its
    subclasses lay their buffers out differently)."""

    kind = POOL_CLASS
    slot_mapping = SlotMapping.IDENTITY

    def __init__(self, kv_pool: object) -> None:
        if type(kv_pool) is not _mha_pool_class():
            raise TypeError(
                f"MHACanaryPool needs an {POOL_CLASS}, got {type(kv_pool).__name__}"
            )
        self._pool = kv_pool

    @classmethod
    def build(cls, kv_pool: object, *, sliding_window_size: int | None) -> MHACanaryPool:
        """The canary view of ``kv_pool`` (the sliding window plays no part)."""
        return cls(kv_pool)

    @staticmethod
    def accepts(kv_pool: object) -> bool:
        """Whether ``kv_pool`` is an ``MHATokenToKVPool`` (not a subclass)."""
        return type(kv_pool) is _mha_pool_class()

    @staticmethod
    def record_bytes_per_token() -> int:
        """Bytes the records add to each KV token's cell."""
        return RECORD_BYTES

    @staticmethod
    def extra_record_rows(*, page_size: int) -> int:
        """Record rows beyond the pool's token capacity: its padding page."""
        return page_size

    @property
    def num_record_slots(self) -> int:
        return self._pool.k_buffer[0].shape[0]

    @property
    def device(self) -> torch.device:
        return self._pool.k_buffer[0].device

    def fingerprinted_layers(self) -> tuple[int, ...]:
        """The layers whose K and V rows the fingerprint reads: the first and the last."""
        last = len(self._pool.k_buffer) - 1
        return (0,) if last == 0 else (0, last)

    def fingerprint_buffers(self) -> tuple[FingerprintBuffer, ...]:
        buffers = []
        for layer in self.fingerprinted_layers():
            buffers.append(FingerprintBuffer(name=f"layer {layer} K",
                                             buffer=self._pool.k_buffer[layer]))
            buffers.append(FingerprintBuffer(name=f"layer {layer} V",
                                             buffer=self._pool.v_buffer[layer]))
        return tuple(buffers)

    def window_spec(self) -> None:
        return None

    def sweep_refusal(self, tree_cache: object) -> str | None:
        from sglang.srt.mem_cache.radix_cache import RadixCache

        if type(tree_cache) is RadixCache:  # EAGLE's too (bigram keys: slot i holds token i)
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
        return sorted(
            (leaf for leaf in tree_cache.evictable_leaves
             if leaf.lock_ref == 0 and leaf.value is not None and len(leaf.value) > 0),
            key=lambda leaf: leaf.id,
        )

    def describe(self) -> str:
        layers = self.fingerprinted_layers()
        return (
            f"{POOL_CLASS}, {self.num_record_slots} record slots (one per KV slot), real data "
            f"from K and V of layer{'s' if len(layers) > 1 else ''} "
            f"{' and '.join(map(str, layers))}"
        )
