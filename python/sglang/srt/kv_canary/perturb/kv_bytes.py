"""Flipping one fingerprinted K/V byte of a slot (the real-data perturbations share this).

The flipped byte lies in one of the pool's fingerprint buffers (for the MHA pool: K or V of the
first or the last layer)
at the slot's rotating 16-byte offset, so ``SGLANG_KV_CANARY_REAL_DATA=partial`` covers it as
well as ``all``. With ``partial`` fingerprints and a verify named by ``due_at`` (position, step),
the row is the one that verify reads at that position (when the position is due then; see
:func:`sglang.jit_kernel.kv_canary.hashing.due_source_scalar`); otherwise the caller's seeded
generator picks it. The slot is a device tensor and the offset is computed on the device:
flipping never synchronizes.

A hybrid pool's windowed buffers (its sliding-window sub-pool) are indexed by window slot: the
slot is translated through SGLang's mapping on the device. ``sub_pool`` restricts the flips to
the buffers of one sub-pool (``full``: the others, ``window``: the windowed ones); a windowed
buffer is only flipped at a position inside the row's window (:meth:`FingerprintedBytes.
position_range`), where the canary requires its bytes.
"""

from __future__ import annotations

import random
from collections.abc import Callable

import torch

from sglang.jit_kernel.kv_canary.hashing import due_source_scalar
from sglang.jit_kernel.kv_canary.kernel_inputs import RealDataSources
from sglang.srt.kv_canary.config import KvSubPool
from sglang.srt.kv_canary.pools.real_data import PARTIAL_BYTES_PER_SOURCE
from sglang.srt.kv_canary.pools.seam import CanaryPool

FLIP_MASK = 0xFF


class FingerprintedBytes:
    """Byte views of a pool's fingerprint buffers (the pool seam names them; ``real_data``: the
    canary's sources, or None with real data off; ``sub_pool``: which buffers may be flipped).

    A buffer may be a strided view (an MLA pool's latent or RoPE part): each slot's bytes are
    contiguous, rows may lie apart.

    Raises:
        ValueError: a slot's bytes are not contiguous, or ``sub_pool`` names a sub-pool the pool
            does not have.
    """

    def __init__(self, *, pool: CanaryPool, real_data: RealDataSources | None = None,
                 sub_pool: KvSubPool = KvSubPool.ANY) -> None:
        self._real_data = real_data
        window = pool.window_spec()
        self._slot_table = None if window is None else window.slot_table
        self._window = 0 if window is None else window.window
        # (name, bytes [rows, row_bytes], windowed) per fingerprint buffer, in source order
        self._rows: list[tuple[str, torch.Tensor, bool]] = []
        for source in pool.fingerprint_buffers():
            buffer = source.buffer
            if not buffer[0].is_contiguous() or buffer.stride(-1) != 1:
                raise ValueError(
                    f"the real-data perturbations need each slot's {source.name} bytes "
                    "contiguous"
                )
            self._rows.append((source.name.replace(" ", "_"),
                               buffer.view(buffer.shape[0], -1).view(torch.uint8),
                               source.windowed))
        self._allowed = [
            index for index, (_, _, windowed) in enumerate(self._rows)
            if sub_pool is KvSubPool.ANY or windowed == (sub_pool is KvSubPool.WINDOW)
        ]
        if not self._allowed:
            raise ValueError(
                f"SGLANG_KV_CANARY_PERTURB_KV_SUB_POOL={sub_pool.value}, but the {pool.kind} "
                "pool has no such sub-pool (window: a hybrid sliding-window pool only)"
            )
        self._sub_pool = sub_pool

    def position_range(self, *, prefix_len: int) -> range:
        """The prefix positions a flip may target: every one, or with ``sub_pool=window`` the
        row's window (the positions whose window-slot bytes the canary requires)."""
        if self._sub_pool is KvSubPool.WINDOW:
            return range(max(0, prefix_len - self._window), prefix_len)
        return range(prefix_len)

    def _in_window(self, due_at: tuple[int, int] | None, prefix_len: int | None) -> bool:
        if due_at is None or prefix_len is None:
            return True
        return due_at[0] >= prefix_len - self._window

    def flip(
        self, *, slot: torch.Tensor, rng: random.Random, due_at: tuple[int, int] | None = None,
        prefix_len: int | None = None,
    ) -> tuple[str, Callable[[], None]]:
        """XOR :data:`FLIP_MASK` into one fingerprinted byte of ``slot`` (int ``[1]`` device
        tensor), in the row the ``partial`` verify at ``due_at = (position, step)`` reads (see
        the module docstring); returns the buffer's name and the undo (the same flip again).
        With ``prefix_len`` (the row's), a windowed buffer is chosen only for a position inside
        the window."""
        allowed = self._allowed
        if not self._in_window(due_at, prefix_len):
            allowed = [index for index in allowed if not self._rows[index][2]] or allowed
        source = None
        real = self._real_data
        if due_at is not None and real is not None and real.partial:
            position, step = due_at
            source = due_source_scalar(position=position, step=step, stride=real.verify_stride,
                                       num_sources=len(real.sources))
        if source not in allowed:
            source = rng.choice(allowed)
        name, row_bytes, windowed = self._rows[source]
        windows = max(row_bytes.shape[1] // PARTIAL_BYTES_PER_SOURCE, 1)
        slot = slot.to(torch.int64)
        if windowed:  # the window slot, looked up on the device
            slot = self._slot_table.index_select(0, slot)
        column = (slot % windows) * PARTIAL_BYTES_PER_SOURCE

        def flip() -> None:
            row_bytes.index_put_((slot, column), row_bytes[slot, column] ^ FLIP_MASK)

        flip()
        return name, flip
