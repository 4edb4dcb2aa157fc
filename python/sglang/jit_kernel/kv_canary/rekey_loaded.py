"""Triton kernel of the load-back re-key, with exactly the semantics of
:mod:`.rekey_loaded_ref` (same signature; tests compare the two exactly).

One program per ``TILE`` entries: lane ``i`` folds the live bytes of ``slots[i]`` twice, once
with the windows placed by ``origins[i]`` and once by the slot, and stores the second fold (or
its complement where the first differs from the restored fingerprint). Runs on the forward's
stream between the model and the post launch of the forward that reads the loaded slots
(eager: the grid follows ``n``); no host synchronization, no allocation, no ring rows.
"""

from __future__ import annotations

import triton
import triton.language as tl

from sglang.jit_kernel.kv_canary.consts import FIELD_FINGERPRINT, RECORD_FIELDS
from sglang.jit_kernel.kv_canary.direct_launch import ceil_div
from sglang.jit_kernel.kv_canary.kernel_inputs import (
    CanaryDeviceState,
    LoadedSlots,
    check_same_device,
)
from sglang.jit_kernel.kv_canary.launch_config import (
    interpreted,
    real_data_args,
    real_data_constexprs,
    require_cuda_or_interpreter,
)
from sglang.jit_kernel.kv_canary.triton_helpers import rotated_slot_fingerprint

_FINGERPRINT = tl.constexpr(FIELD_FINGERPRINT)
_RECORD_FIELDS = tl.constexpr(RECORD_FIELDS)


@triton.jit(do_not_specialize=["count"],
            do_not_specialize_on_alignment=["slots_ptr", "origins_ptr"])
def _rekey_loaded_kernel(
    slots_ptr,
    origins_ptr,
    count,
    records_ptr,
    num_slots,
    src0_ptr,
    src0_rows,
    src0_stride,
    src1_ptr,
    src1_rows,
    src1_stride,
    src2_ptr,
    src2_rows,
    src2_stride,
    src3_ptr,
    src3_rows,
    src3_stride,
    NUM_SOURCES: tl.constexpr,
    PARTIAL: tl.constexpr,
    WORDS0: tl.constexpr,
    WORDS1: tl.constexpr,
    WORDS2: tl.constexpr,
    WORDS3: tl.constexpr,
    WORD_CHUNK: tl.constexpr,
    TILE: tl.constexpr,
):
    entry = tl.program_id(0).to(tl.int64) * TILE + tl.arange(0, TILE)
    lanes_on = entry < count
    slot = tl.load(slots_ptr + entry, mask=lanes_on, other=0)
    origin = tl.load(origins_ptr + entry, mask=lanes_on, other=0)
    on = lanes_on & (slot >= 1) & (slot < num_slots)
    before = rotated_slot_fingerprint(
        slot, origin, on,
        src0_ptr, src0_rows, src0_stride, src1_ptr, src1_rows, src1_stride,
        src2_ptr, src2_rows, src2_stride, src3_ptr, src3_rows, src3_stride,
        NUM_SOURCES, PARTIAL, WORDS0, WORDS1, WORDS2, WORDS3, WORD_CHUNK,
    )
    after = rotated_slot_fingerprint(
        slot, slot, on,
        src0_ptr, src0_rows, src0_stride, src1_ptr, src1_rows, src1_stride,
        src2_ptr, src2_rows, src2_stride, src3_ptr, src3_rows, src3_stride,
        NUM_SOURCES, PARTIAL, WORDS0, WORDS1, WORDS2, WORDS3, WORD_CHUNK,
    )
    address = records_ptr + slot * _RECORD_FIELDS + _FINGERPRINT
    restored = tl.load(address, mask=on, other=0)
    tl.store(address, tl.where(before == restored, after, ~after), mask=on)


TILE = 256  # entries per program
TILE_ELEMENTS = 8192  # entries x words per fingerprint step when whole rows are folded
NUM_WARPS = 4


def launch_rekey_loaded(*, state: CanaryDeviceState, loaded: LoadedSlots) -> None:
    """Re-key the restored fingerprints of ``loaded`` (contract: :mod:`.rekey_loaded_ref`).

    One launch on the current stream, ``ceil(n / TILE)`` programs; nothing without real data
    or entries.
    """
    check_same_device(state=state, device=loaded.device, what="LoadedSlots")
    if state.real_data is None or loaded.count == 0:
        return
    if state.window is not None:
        raise ValueError("rekey_loaded: a pool with window slots has no host tier")
    require_cuda_or_interpreter(
        device=state.device, kernel_interpreted=_INTERPRETED,
        who_needs="the canary load-back re-key kernel needs",
        reference="rekey_loaded_ref (same signature)",
    )
    real = real_data_constexprs(state.real_data)
    tile = TILE
    if not real["PARTIAL"]:
        tile = max(32, min(tile, TILE_ELEMENTS // real["WORD_CHUNK"]))
    _rekey_loaded_kernel[(ceil_div(loaded.count, tile),)](
        loaded.slots,
        loaded.origins,
        loaded.count,
        state.records,
        state.num_slots,
        *real_data_args(state.real_data, placeholder=state.records),
        **real,
        TILE=tile,
        num_warps=NUM_WARPS,
    )


_INTERPRETED = interpreted(_rekey_loaded_kernel)
