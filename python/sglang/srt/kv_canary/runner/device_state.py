"""Allocation of the canary's device state beside one KV pool, through the pool seam.

The records get one row per record slot (:attr:`~..pools.seam.CanaryPool.num_record_slots`);
the real-data fingerprint reads the pool's fingerprint buffers (views of SGLang's buffers, never
copies); a pool with window slots (:meth:`~..pools.seam.CanaryPool.window_spec`) gets an owner
table of one int64 per window slot beside SGLang's mapping. Nothing here knows a pool type.
"""

from __future__ import annotations

import torch

from sglang.jit_kernel.kv_canary.kernel_inputs import CanaryDeviceState, SlotWindow
from sglang.srt.kv_canary.config import CanaryConfig
from sglang.srt.kv_canary.errors import CanaryUnsupportedError
from sglang.srt.kv_canary.pools.real_data import real_data_sources
from sglang.srt.kv_canary.pools.seam import CanaryPool, SlotMapping


def allocate_device_state(
    *, config: CanaryConfig, pool: CanaryPool, req_to_token: torch.Tensor
) -> CanaryDeviceState:
    """Zeroed records, ring, counters and owner chains on the pool's device. A zero record never
    verifies, so a slot read before any forward wrote it is reported.

    Raises:
        CanaryUnsupportedError: the pool maps KV slots to record slots in a way the kernels do
            not read yet, or its real-data buffers cannot be fingerprinted.
    """
    if pool.slot_mapping is not SlotMapping.IDENTITY:
        raise CanaryUnsupportedError(
            [f"the {pool.kind} pool maps KV slots to record slots by {pool.slot_mapping.value}, "
             "which the canary kernels do not read yet"]
        )
    sources = real_data_sources(pool=pool, real_data=config.real_data,
                                verify_stride=config.real_data_stride)
    # Plain tensors even if start-up runs under inference mode: they are updated in place later.
    with torch.inference_mode(False):
        return CanaryDeviceState.zeros(
            num_slots=pool.num_record_slots,
            req_to_token=req_to_token,
            ring_capacity=config.ring_capacity,
            real_data=sources,
            window=_slot_window(pool=pool, device=req_to_token.device),
        )


def _slot_window(*, pool: CanaryPool, device: torch.device) -> SlotWindow | None:
    """The window slots of ``pool`` with a zeroed owner table, or None."""
    spec = pool.window_spec()
    if spec is None:
        return None
    windowed = 0
    for index, source in enumerate(pool.fingerprint_buffers()):
        windowed |= int(source.windowed) << index
    return SlotWindow(
        slot_table=spec.slot_table,
        owners=torch.zeros(spec.num_window_slots, dtype=torch.int64, device=device),
        window=spec.window,
        windowed_sources=windowed,
    )
