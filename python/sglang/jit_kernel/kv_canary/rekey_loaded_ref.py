"""Plain-torch reference of the load-back re-key (same keyword signature as
:mod:`.rekey_loaded`, same results); tests compare the two exactly.

A slot the host tier loaded back got the record of the slot its host copy was taken from, and
so a fingerprint whose ``partial`` windows are placed by that *origin* slot. Per entry ``i``
with ``s = slots[i]`` in ``[1, num_slots)`` (other entries are skipped), real data on:

- ``before = fingerprint(s, windows placed by origins[i])`` (every lane, see
  :func:`~.hashing.slot_fingerprints_torch` with ``rotations``);
- ``after = fingerprint(s)``, the windows placed by ``s`` as every other check places them;
- ``records[s][FIELD_FINGERPRINT] = after`` if ``before`` equals the restored fingerprint, else
  ``~after`` (every bit differs, so every lane differs).

So bytes that arrived intact verify from here on like bytes written on the device, and bytes
that changed between the backup and the load (or never arrived) fail the next verify of any
lane: the load-back forward's post launch reports ``VERIFY_REAL_KV`` at the position. Entries
naming the same slot leave one of their results. Without real data nothing changes. No ring
rows and no counters: the launch changes fingerprints only. This reference synchronizes
(tests and CPU self-checks only).
"""

from __future__ import annotations

import torch

from sglang.jit_kernel.kv_canary.consts import FIELD_FINGERPRINT
from sglang.jit_kernel.kv_canary.hashing import slot_fingerprints_torch
from sglang.jit_kernel.kv_canary.kernel_inputs import (
    CanaryDeviceState,
    LoadedSlots,
    check_same_device,
)


def launch_rekey_loaded(*, state: CanaryDeviceState, loaded: LoadedSlots) -> None:
    """Re-key the restored fingerprints of ``loaded`` (see the module docstring)."""
    check_same_device(state=state, device=loaded.device, what="LoadedSlots")
    real_data = state.real_data
    if real_data is None or loaded.count == 0:
        return
    if state.window is not None:
        raise ValueError("rekey_loaded: a pool with window slots has no host tier")
    inside = (loaded.slots >= 1) & (loaded.slots < state.num_slots)
    slots = loaded.slots[inside]
    origins = loaded.origins[inside]
    before = slot_fingerprints_torch(slots=slots, sources=real_data.sources,
                                     partial=real_data.partial, rotations=origins)
    after = slot_fingerprints_torch(slots=slots, sources=real_data.sources,
                                    partial=real_data.partial)
    restored = state.records[slots, FIELD_FINGERPRINT]
    state.records[slots, FIELD_FINGERPRINT] = torch.where(before == restored, after, ~after)
