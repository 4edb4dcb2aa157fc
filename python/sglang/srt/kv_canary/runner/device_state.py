"""Allocation of the canary's device state beside one MHA KV pool."""

from __future__ import annotations

import torch

from sglang.jit_kernel.kv_canary.batch_view import CanaryDeviceState
from sglang.jit_kernel.kv_canary.consts import NUM_COUNTERS, RECORD_FIELDS, RING_ROW_FIELDS
from sglang.srt.kv_canary.config import CanaryConfig, RealDataMode
from sglang.srt.kv_canary.runner.refusals import CanaryUnsupportedError

PARTIAL_REAL_DATA_BYTES = 16  # SGLANG_KV_CANARY_REAL_DATA=partial folds the first 16 bytes
_WORD_BYTES = 8


def layer0_key_buffer(kv_pool: object) -> torch.Tensor:
    """The pool's first K buffer, ``[num_slots, head_num, head_dim]``: row = slot."""
    return kv_pool.k_buffer[0]


def real_kv_words(*, kv_pool: object, real_data: RealDataMode) -> tuple[torch.Tensor | None, int]:
    """The layer-0 K buffer viewed as int64 words per slot, and how many words to fold.

    Returns a view (never a copy: the fingerprint must read the live bytes) of shape
    ``[num_slots, row_bytes // 8]`` and the number of leading words per slot that go into the
    fingerprint: 0 with no real data, 2 for ``partial`` (16 bytes), every word for ``all``.

    Raises:
        CanaryUnsupportedError: the buffer's rows cannot be read as whole int64 words.
    """
    if real_data is RealDataMode.NONE:
        return None, 0
    keys = layer0_key_buffer(kv_pool)
    row_bytes = keys[0].numel() * keys.element_size()
    variable = "SGLANG_KV_CANARY_REAL_DATA"
    if not keys.is_contiguous() or row_bytes % _WORD_BYTES != 0:
        raise CanaryUnsupportedError(
            [f"{variable}={real_data.value} needs a contiguous layer-0 K buffer whose rows are a "
             f"multiple of 8 bytes (rows are {row_bytes} bytes); set {variable}=none"]
        )
    if real_data is RealDataMode.PARTIAL and row_bytes < PARTIAL_REAL_DATA_BYTES:
        raise CanaryUnsupportedError(
            [f"{variable}=partial folds 16 bytes per slot but K rows are {row_bytes} bytes; "
             f"set {variable}=all"]
        )
    words = keys.view(keys.shape[0], -1).view(torch.int64)
    if real_data is RealDataMode.PARTIAL:
        return words, PARTIAL_REAL_DATA_BYTES // _WORD_BYTES
    return words, words.shape[1]


def allocate_device_state(
    *, config: CanaryConfig, req_to_token_pool: object, kv_pool: object
) -> CanaryDeviceState:
    """Zeroed records (one row per pool slot, same index), ring and counters on the pool's device.

    A zero record never verifies (its chain is not ``CHAIN_ANCHOR``), so a slot that is read
    before any forward wrote it is reported.
    """
    keys = layer0_key_buffer(kv_pool)
    words, num_words = real_kv_words(kv_pool=kv_pool, real_data=config.real_data)
    # Plain tensors even if start-up runs under inference mode: counters are reset in place later.
    with torch.inference_mode(False):
        records = torch.zeros((keys.shape[0], RECORD_FIELDS), dtype=torch.int64, device=keys.device)
        ring = torch.zeros(
            (config.ring_capacity, RING_ROW_FIELDS), dtype=torch.int64, device=keys.device
        )
        counters = torch.zeros((NUM_COUNTERS,), dtype=torch.int64, device=keys.device)
    return CanaryDeviceState(
        records=records,
        req_to_token=req_to_token_pool.req_to_token,
        ring=ring,
        counters=counters,
        real_kv_words=words,
        real_kv_num_words=num_words,
    )
