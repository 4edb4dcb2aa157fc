"""The canary over SGLang's ``MHATokenToKVPool`` (per layer a K and a V buffer of
``[size + page_size, heads, head_dim]``, bf16/fp16, or uint8 bytes of FP8 with
``--kv-cache-dtype fp8_e4m3|fp8_e5m2``: that pool keeps no per-token scales) and its FP4 variant
``MHATokenToKVPoolFP4`` (``--kv-cache-dtype fp4_e2m1``: per layer packed K and V of
``[size + page_size, heads, head_dim / 2]`` bytes plus K and V scale buffers of
``[size + page_size, heads * head_dim / 16]`` bytes).

Records: one per pool slot, same index (slot 0, SGLang's padding slot, included). Real data
(views of SGLang's buffers, never copies): K and V of the first and the last layer; for FP4 the
packed K of the first layer and its scales, the packed V of the last layer and its scales (four
sources at most: a scale byte decides sixteen values, so the scales are read where the data
is). The radix sweep walks SGLang's plain ``RadixCache``, whose node values are pool slots.
"""

from __future__ import annotations

import torch

from sglang.srt.kv_canary.pools.plain_slots import PlainSlotPool, fingerprinted_layers
from sglang.srt.kv_canary.pools.seam import FingerprintBuffer, PoolContext

POOL_CLASS = "MHATokenToKVPool"
FP4_POOL_CLASS = "MHATokenToKVPoolFP4"


def _pool_class(name: str) -> type:
    from sglang.srt.mem_cache import memory_pool

    return getattr(memory_pool, name)


class MHACanaryPool(PlainSlotPool):
    """:class:`~.seam.CanaryPool` of an ``MHATokenToKVPool`` (exactly that class: its
    subclasses lay their buffers out differently)."""

    kind = POOL_CLASS

    def __init__(self, kv_pool: object) -> None:
        if not self.accepts(kv_pool):
            raise TypeError(
                f"{type(self).__name__} needs an {self.kind}, got {type(kv_pool).__name__}"
            )
        self._pool = kv_pool

    @classmethod
    def build(cls, kv_pool: object, *, context: PoolContext) -> MHACanaryPool:
        """The canary view of ``kv_pool`` (nothing of the context plays a part)."""
        return cls(kv_pool)

    @classmethod
    def accepts(cls, kv_pool: object) -> bool:
        """Whether ``kv_pool`` is exactly this implementation's pool class."""
        return type(kv_pool) is _pool_class(cls.kind)

    @property
    def num_record_slots(self) -> int:
        return self._pool.k_buffer[0].shape[0]

    @property
    def device(self) -> torch.device:
        return self._pool.k_buffer[0].device

    def fingerprinted_layers(self) -> tuple[int, ...]:
        """The layers whose rows the fingerprint reads: the first and the last."""
        return fingerprinted_layers(len(self._pool.k_buffer))

    def fingerprint_buffers(self) -> tuple[FingerprintBuffer, ...]:
        buffers = []
        for layer in self.fingerprinted_layers():
            buffers.append(FingerprintBuffer(name=f"layer {layer} K",
                                             buffer=self._pool.k_buffer[layer]))
            buffers.append(FingerprintBuffer(name=f"layer {layer} V",
                                             buffer=self._pool.v_buffer[layer]))
        return tuple(buffers)

    host_pool_class = "MHATokenToKVPoolHost"
    host_view_layouts = ("layer_first", "page_first")

    def _host_views(self, host_pool: object) -> tuple[FingerprintBuffer, ...]:
        """``k_data_refs`` / ``v_data_refs``: per layer ``[host slots, heads, head_dim]``."""
        buffers = []
        for layer in self.fingerprinted_layers():
            buffers.append(FingerprintBuffer(name=f"layer {layer} K",
                                             buffer=host_pool.k_data_refs[layer]))
            buffers.append(FingerprintBuffer(name=f"layer {layer} V",
                                             buffer=host_pool.v_data_refs[layer]))
        return tuple(buffers)

    def _stored_as(self) -> str:
        dtype = self._pool.dtype
        return str(dtype).removeprefix("torch.") + (
            " stored as bytes" if self._pool.store_dtype != dtype else ""
        )

    def describe(self) -> str:
        layers = self.fingerprinted_layers()
        return (
            f"{self.kind} ({self._stored_as()}), {self.num_record_slots} record slots (one per "
            f"KV slot), real data from K and V of layer{'s' if len(layers) > 1 else ''} "
            f"{' and '.join(map(str, layers))}"
        )


class MHAFP4CanaryPool(MHACanaryPool):
    """:class:`~.seam.CanaryPool` of an ``MHATokenToKVPoolFP4`` (packed FP4 K/V and their
    scales)."""

    kind = FP4_POOL_CLASS

    def fingerprint_buffers(self) -> tuple[FingerprintBuffer, ...]:
        pool = self._pool
        first, last = 0, len(pool.k_buffer) - 1
        return (
            FingerprintBuffer(name=f"layer {first} K", buffer=pool.k_buffer[first]),
            FingerprintBuffer(name=f"layer {first} K scales", buffer=pool.k_scale_buffer[first]),
            FingerprintBuffer(name=f"layer {last} V", buffer=pool.v_buffer[last]),
            FingerprintBuffer(name=f"layer {last} V scales", buffer=pool.v_scale_buffer[last]),
        )

    # SGLang's MHATokenToKVPoolHost copies an FP4 pool's packed K/V but not its scales
    host_pool_class = None

    def describe(self) -> str:
        last = len(self._pool.k_buffer) - 1
        return (
            f"{self.kind} (packed fp4 and scales), {self.num_record_slots} record slots (one per "
            f"KV slot), real data from K and its scales of layer 0 and V and its scales of "
            f"layer {last}"
        )
