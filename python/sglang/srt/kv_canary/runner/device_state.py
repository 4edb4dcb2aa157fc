"""Allocation of the canary's device state beside one MHA KV pool.

The records get one row per pool slot (same index); the real-data fingerprint reads the live K
and V rows of the pool's first and last layer (views of SGLang's buffers, never copies).
"""

from __future__ import annotations

import torch

from sglang.jit_kernel.kv_canary.kernel_inputs import CanaryDeviceState, RealDataSources
from sglang.srt.kv_canary.config import CanaryConfig, RealDataMode
from sglang.srt.kv_canary.runner.refusals import CanaryUnsupportedError

PARTIAL_BYTES_PER_SOURCE = 16  # SGLANG_KV_CANARY_REAL_DATA=partial: 16 bytes of each row
_WORD_BYTES = 8
_VARIABLE = "SGLANG_KV_CANARY_REAL_DATA"


def fingerprinted_layers(kv_pool: object) -> tuple[int, ...]:
    """The layers whose K and V rows the fingerprint reads: the first and the last."""
    last = len(kv_pool.k_buffer) - 1
    return (0,) if last == 0 else (0, last)


def fingerprinted_buffers(kv_pool: object) -> list[tuple[str, torch.Tensor]]:
    """``(name, buffer)`` of every fingerprinted K/V buffer, ``[num_slots, heads, head_dim]``."""
    buffers = []
    for layer in fingerprinted_layers(kv_pool):
        buffers.append((f"layer {layer} K", kv_pool.k_buffer[layer]))
        buffers.append((f"layer {layer} V", kv_pool.v_buffer[layer]))
    return buffers


def real_data_sources(
    *, kv_pool: object, real_data: RealDataMode, verify_stride: int = 1
) -> RealDataSources | None:
    """Word views of the fingerprinted K/V rows, or None with real data off.

    Raises:
        CanaryUnsupportedError: a buffer's rows cannot be read as whole int64 words, or are
            shorter than the 16 bytes ``partial`` reads.
    """
    if real_data is RealDataMode.NONE:
        return None
    views = []
    for name, buffer in fingerprinted_buffers(kv_pool):
        row_bytes = buffer[0].numel() * buffer.element_size()
        if not buffer[0].is_contiguous() or row_bytes % _WORD_BYTES != 0:
            raise CanaryUnsupportedError(
                [f"{_VARIABLE}={real_data.value} needs KV rows of whole 8-byte words, contiguous "
                 f"within a slot ({name} rows are {row_bytes} bytes); set {_VARIABLE}=none"]
            )
        if real_data is RealDataMode.PARTIAL and row_bytes < PARTIAL_BYTES_PER_SOURCE:
            raise CanaryUnsupportedError(
                [f"{_VARIABLE}=partial reads 16 bytes per row but {name} rows are {row_bytes} "
                 f"bytes; set {_VARIABLE}=all"]
            )
        views.append(buffer.view(buffer.shape[0], -1).view(torch.int64))
    return RealDataSources(sources=tuple(views), partial=real_data is RealDataMode.PARTIAL,
                           verify_stride=verify_stride)


def allocate_device_state(
    *, config: CanaryConfig, req_to_token_pool: object, kv_pool: object
) -> CanaryDeviceState:
    """Zeroed records (one row per pool slot, same index), ring, counters and owner chains on
    the pool's device. A zero record never verifies, so a slot read before any forward wrote it
    is reported."""
    keys = kv_pool.k_buffer[0]
    sources = real_data_sources(kv_pool=kv_pool, real_data=config.real_data,
                                verify_stride=config.real_data_stride)
    # Plain tensors even if start-up runs under inference mode: they are updated in place later.
    with torch.inference_mode(False):
        return CanaryDeviceState.zeros(
            num_slots=keys.shape[0],
            req_to_token=req_to_token_pool.req_to_token,
            ring_capacity=config.ring_capacity,
            real_data=sources,
        )
