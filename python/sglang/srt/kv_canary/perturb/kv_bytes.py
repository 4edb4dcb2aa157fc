"""Flipping one fingerprinted K/V byte of a slot (the real-data perturbations share this).

The flipped byte lies in one of the pool's fingerprint buffers (for the MHA pool: K or V of the
first or the last layer)
at the slot's rotating 16-byte offset, so ``SGLANG_KV_CANARY_REAL_DATA=partial`` covers it as
well as ``all``. With ``partial`` fingerprints and a verify named by ``due_at`` (position, step),
the row is the one that verify reads at that position (when the position is due then; see
:func:`sglang.jit_kernel.kv_canary.hashing.due_source_scalar`); otherwise the caller's seeded
generator picks it. The slot is a device tensor and the offset is computed on the device:
flipping never synchronizes.
"""

from __future__ import annotations

import random
from collections.abc import Callable

import torch

from sglang.jit_kernel.kv_canary.hashing import due_source_scalar
from sglang.jit_kernel.kv_canary.kernel_inputs import RealDataSources
from sglang.srt.kv_canary.pools.real_data import PARTIAL_BYTES_PER_SOURCE
from sglang.srt.kv_canary.pools.seam import CanaryPool

FLIP_MASK = 0xFF


class FingerprintedBytes:
    """Byte views of a pool's fingerprint buffers (the pool seam names them; ``real_data``: the
    canary's sources, or None with real data off)."""

    def __init__(self, *, pool: CanaryPool, real_data: RealDataSources | None = None) -> None:
        self._real_data = real_data
        self._rows: list[tuple[str, torch.Tensor]] = []
        for source in pool.fingerprint_buffers():
            buffer = source.buffer
            if not buffer.is_contiguous():
                raise ValueError(
                    f"the real-data perturbations need a contiguous {source.name} buffer"
                )
            self._rows.append((source.name.replace(" ", "_"),
                               buffer.view(buffer.shape[0], -1).view(torch.uint8)))

    def flip(
        self, *, slot: torch.Tensor, rng: random.Random, due_at: tuple[int, int] | None = None
    ) -> tuple[str, Callable[[], None]]:
        """XOR :data:`FLIP_MASK` into one fingerprinted byte of ``slot`` (int ``[1]`` device
        tensor), in the row the ``partial`` verify at ``due_at = (position, step)`` reads (see
        the module docstring); returns the buffer's name and the undo (the same flip again)."""
        source = None
        real = self._real_data
        if due_at is not None and real is not None and real.partial:
            position, step = due_at
            source = due_source_scalar(position=position, step=step, stride=real.verify_stride,
                                       num_sources=len(real.sources))
        name, row_bytes = self._rows[source] if source is not None else rng.choice(self._rows)
        windows = max(row_bytes.shape[1] // PARTIAL_BYTES_PER_SOURCE, 1)
        slot = slot.to(torch.int64)
        byte_index = slot * row_bytes.shape[1] + (slot % windows) * PARTIAL_BYTES_PER_SOURCE
        flat = row_bytes.view(-1)

        def flip() -> None:
            flat.index_copy_(0, byte_index, flat.index_select(0, byte_index) ^ FLIP_MASK)

        flip()
        return name, flip
