"""The canary over SGLang's ``MLATokenToKVPool`` (DeepSeek V2/V3, Kimi K2 and the other
multi-head-latent-attention models): per layer one buffer of ``[size + page_size, 1,
kv_lora_rank + qk_rope_head_dim]`` holding each token's compressed latent then its RoPE key
(bf16, or uint8 bytes of FP8 with ``--kv-cache-dtype fp8_e4m3``: no per-token scales); there is
no separate V.

Records: one per pool slot, same index. Real data (views of SGLang's buffers, never copies):
the latent and the RoPE part of the first and of the last layer, as four sources (so
``partial`` reads 16 bytes of each part; a layout whose parts are not whole 8-byte words is
read as one row per layer). The radix sweep walks SGLang's plain ``RadixCache``.

Attention backends: the ones tested with the canary on this pool (:data:`TESTED_BACKENDS`);
any other is refused at start-up with the reason.
"""

from __future__ import annotations

import torch

from sglang.srt.kv_canary.pools.plain_slots import PlainSlotPool, fingerprinted_layers
from sglang.srt.kv_canary.pools.seam import FingerprintBuffer, PoolContext

POOL_CLASS = "MLATokenToKVPool"
# Attention backends served with the canary on an MLA pool in the GPU end-to-end tests.
TESTED_BACKENDS: tuple[str, ...] = ("triton", "flashinfer")
_WORD_BYTES = 8


def _mla_pool_class() -> type:
    from sglang.srt.mem_cache.memory_pool import MLATokenToKVPool

    return MLATokenToKVPool


def backend_refusal(attention_backends: tuple[str, ...]) -> str | None:
    """Why these (prefill, decode) attention backends are refused on an MLA pool, or None."""
    untested = [name for name in dict.fromkeys(attention_backends) if name not in TESTED_BACKENDS]
    if not untested:
        return None
    return (
        f"the canary on {POOL_CLASS} is tested with the {' and '.join(TESTED_BACKENDS)} "
        f"attention backends only, and this server reads the pool with "
        f"{', '.join(untested)} (SGLang picks fa3 for MLA models on Hopper by default); pass "
        f"--attention-backend {TESTED_BACKENDS[0]}"
    )


class MLACanaryPool(PlainSlotPool):
    """:class:`~.seam.CanaryPool` of an ``MLATokenToKVPool`` (exactly that class: NSA's and
    FP4's subclasses lay their buffers out differently)."""

    kind = POOL_CLASS

    def __init__(self, kv_pool: object) -> None:
        if not self.accepts(kv_pool):
            raise TypeError(f"MLACanaryPool needs an {POOL_CLASS}, got {type(kv_pool).__name__}")
        self._pool = kv_pool

    @classmethod
    def build(cls, kv_pool: object, *, context: PoolContext) -> MLACanaryPool:
        """The canary view of ``kv_pool``.

        Raises:
            ValueError: an attention backend in the context is not one of
                :data:`TESTED_BACKENDS`.
        """
        reason = backend_refusal(context.attention_backends)
        if reason is not None:
            raise ValueError(reason)
        return cls(kv_pool)

    @staticmethod
    def accepts(kv_pool: object) -> bool:
        """Whether ``kv_pool`` is an ``MLATokenToKVPool`` (not a subclass)."""
        return type(kv_pool) is _mla_pool_class()

    @property
    def num_record_slots(self) -> int:
        return self._pool.kv_buffer[0].shape[0]

    @property
    def device(self) -> torch.device:
        return self._pool.kv_buffer[0].device

    def fingerprinted_layers(self) -> tuple[int, ...]:
        """The layers whose rows the fingerprint reads: the first and the last."""
        return fingerprinted_layers(len(self._pool.kv_buffer))

    def _split(self) -> int | None:
        """The element where the RoPE part starts, when both parts are whole words."""
        buffer = self._pool.kv_buffer[0]
        latent = self._pool.kv_lora_rank
        element = buffer.element_size()
        if 0 < latent < buffer.shape[-1] and latent * element % _WORD_BYTES == 0 \
                and (buffer.shape[-1] - latent) * element % _WORD_BYTES == 0:
            return latent
        return None

    def fingerprint_buffers(self) -> tuple[FingerprintBuffer, ...]:
        split = self._split()
        buffers = []
        for layer in self.fingerprinted_layers():
            rows = self._pool.kv_buffer[layer]
            if split is None:
                buffers.append(FingerprintBuffer(name=f"layer {layer} KV", buffer=rows))
                continue
            buffers.append(FingerprintBuffer(name=f"layer {layer} latent",
                                             buffer=rows[..., :split]))
            buffers.append(FingerprintBuffer(name=f"layer {layer} rope",
                                             buffer=rows[..., split:]))
        return tuple(buffers)

    host_pool_class = "MLATokenToKVPoolHost"

    def _host_views(self, host_pool: object) -> tuple[FingerprintBuffer, ...]:
        """``data_refs``: per layer ``[host slots, 1, latent + RoPE]``, split as on the
        device."""
        split = self._split()
        buffers = []
        for layer in self.fingerprinted_layers():
            rows = host_pool.data_refs[layer]
            if split is None:
                buffers.append(FingerprintBuffer(name=f"layer {layer} KV", buffer=rows))
                continue
            buffers.append(FingerprintBuffer(name=f"layer {layer} latent",
                                             buffer=rows[..., :split]))
            buffers.append(FingerprintBuffer(name=f"layer {layer} rope",
                                             buffer=rows[..., split:]))
        return tuple(buffers)

    def describe(self) -> str:
        pool = self._pool
        layers = self.fingerprinted_layers()
        stored = str(pool.dtype).removeprefix("torch.") + (
            " stored as bytes" if pool.store_dtype != pool.dtype else ""
        )
        parts = "latent and RoPE" if self._split() is not None else "the latent+RoPE row"
        return (
            f"{POOL_CLASS} ({stored}, latent {pool.kv_lora_rank} + RoPE "
            f"{pool.qk_rope_head_dim}), {self.num_record_slots} record slots (one per KV slot), "
            f"real data from {parts} of layer{'s' if len(layers) > 1 else ''} "
            f"{' and '.join(map(str, layers))}"
        )
