"""Triton kernel of the sweep launch: check slots the host lists (every slot the radix cache
holds, say), with exactly the semantics of :mod:`.sweep_ref` (same signature; tests compare
the two exactly).

One program per ``TILE`` entries; lane ``e`` loads its slot's record and its predecessor's (one
16-byte load each), folds the slot's real-data words when real data is on, and ORs the reason
bits; failing lanes reserve ring rows with one atomic add per tile. The grid follows the number
of entries (no constexpr depends on it), so the launch is meant to run outside CUDA graphs;
it never synchronizes with the host and allocates nothing.
"""

from __future__ import annotations

import triton
import triton.language as tl

from sglang.jit_kernel.kv_canary.consts import (
    COUNTER_ENTRIES,
    COUNTER_KERNEL_RUNS,
    COUNTER_STEP,
    TOKEN_MASK,
    CheckKind,
    Reason,
)
from sglang.jit_kernel.kv_canary.direct_launch import ceil_div
from sglang.jit_kernel.kv_canary.kernel_inputs import (
    CanaryDeviceState,
    SweepEntries,
    check_same_device,
)
from sglang.jit_kernel.kv_canary.launch_config import (
    interpreted,
    require_cuda_or_interpreter,
    real_data_args,
    real_data_constexprs,
    window_args,
    window_constexprs,
)
from sglang.jit_kernel.kv_canary.triton_helpers import (
    NO_TOKEN_C,
    append_verify_rows,
    check_records,
    check_token,
    lane_mask,
    load_record_tail,
    slot_fingerprint,
    sum_1d,
    window_slots,
)

_SWEEP = tl.constexpr(int(CheckKind.SWEEP))
_COUNTER_STEP = tl.constexpr(COUNTER_STEP)
_RUNS_SWEEP = tl.constexpr(COUNTER_KERNEL_RUNS + CheckKind.SWEEP)
_ENTRIES_SWEEP = tl.constexpr(COUNTER_ENTRIES + CheckKind.SWEEP)
_VERIFY_REAL_KV = tl.constexpr(int(Reason.VERIFY_REAL_KV))
_VERIFY_WINDOW_OWNER = tl.constexpr(int(Reason.VERIFY_WINDOW_OWNER))
_LOWER_HALF = tl.constexpr((1 << 32) - 1)  # an all-mode fingerprint's half of the sources not windowed
_TOKEN_MASK = tl.constexpr(TOKEN_MASK)
_ANCHOR_PREV_SLOT = tl.constexpr(-1)


@triton.jit(
    do_not_specialize=["count"],
    do_not_specialize_on_alignment=["slots_ptr", "prev_slots_ptr", "positions_ptr", "tokens_ptr"],
)
def _sweep_kernel(
    slots_ptr,
    prev_slots_ptr,
    positions_ptr,
    tokens_ptr,
    count,
    records_ptr,
    num_slots,
    ring_ptr,
    ring_capacity,
    counters_ptr,
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
    window_table_ptr,
    window_table_len,
    window_owners_ptr,
    num_window_slots,
    window_size,
    NUM_SOURCES: tl.constexpr,
    PARTIAL: tl.constexpr,
    WORDS0: tl.constexpr,
    WORDS1: tl.constexpr,
    WORDS2: tl.constexpr,
    WORDS3: tl.constexpr,
    WORD_CHUNK: tl.constexpr,
    HAS_WINDOW: tl.constexpr,
    WINDOWED: tl.constexpr,
    TILE: tl.constexpr,
):
    pid = tl.program_id(0)
    step = tl.load(counters_ptr + _COUNTER_STEP)
    entry = pid.to(tl.int64) * TILE + tl.arange(0, TILE)
    lanes_on = entry < count
    slot = tl.load(slots_ptr + entry, mask=lanes_on, other=0)
    prev_slot = tl.load(prev_slots_ptr + entry, mask=lanes_on, other=0)
    position = tl.load(positions_ptr + entry, mask=lanes_on, other=0)
    expected_token = tl.load(tokens_ptr + entry, mask=lanes_on, other=NO_TOKEN_C)
    expected_token = tl.where(
        expected_token == NO_TOKEN_C, NO_TOKEN_C, expected_token & _TOKEN_MASK
    )
    mapped = lanes_on & (slot != 0)
    reasons, token, chain, expected_chain = check_records(
        records_ptr, num_slots, slot, mapped, position, prev_slot,
        prev_slot == _ANCHOR_PREV_SLOT,
    )
    reasons = check_token(reasons, token, expected_token)
    # A cached slot keeps its window slot only while the cache holds it in the window.
    window_slot = slot
    window_live = mapped
    if HAS_WINDOW:
        window_slot, window_live = window_slots(
            window_table_ptr, window_table_len, num_window_slots, slot, mapped
        )
        owned_by = tl.load(window_owners_ptr + window_slot, mask=window_live, other=0)
        reasons |= tl.where(window_live & (owned_by != slot), _VERIFY_WINDOW_OWNER, 0)
    if NUM_SOURCES > 0:
        fingerprint, _ = load_record_tail(records_ptr, num_slots, slot, mapped)
        live = slot_fingerprint(  # every source of every slot (partial: every lane)
            slot, mapped, window_slot, window_live, slot * 0, mapped,
            src0_ptr, src0_rows, src0_stride, src1_ptr, src1_rows, src1_stride,
            src2_ptr, src2_rows, src2_stride, src3_ptr, src3_rows, src3_stride,
            NUM_SOURCES, PARTIAL, WORDS0, WORDS1, WORDS2, WORDS3, WORD_CHUNK, WINDOWED,
        )
        differs = fingerprint ^ live
        checked = mapped
        if WINDOWED != 0:
            if PARTIAL:  # drop the lanes of windowed sources without a window slot
                for source in tl.static_range(NUM_SOURCES):
                    if (WINDOWED >> source) & 1:
                        differs = tl.where(
                            window_live, differs,
                            differs & ~lane_mask(differs * 0 + source, NUM_SOURCES),
                        )
            else:  # the lower half (the other sources) always, the upper where live
                differs = tl.where(window_live, differs, differs & _LOWER_HALF)
        reasons |= tl.where(checked & (differs != 0), _VERIFY_REAL_KV, 0)
    append_verify_rows(
        ring_ptr, counters_ptr, ring_capacity, lanes_on, reasons, _SWEEP, 0, slot, position,
        token, expected_token, chain, expected_chain, step,
    )
    swept = sum_1d(mapped.to(tl.int64))
    if swept > 0:
        tl.atomic_add(counters_ptr + _ENTRIES_SWEEP, swept)
    if pid == 0:
        tl.atomic_add(counters_ptr + _RUNS_SWEEP, 1)


TILE = 1024  # entries per program
TILE_ELEMENTS = 8192  # entries x words per fingerprint step when whole rows are folded
NUM_WARPS = 4


def launch_sweep(*, state: CanaryDeviceState, entries: SweepEntries) -> None:
    """Check every entry's slot (see :mod:`.sweep_ref` for the exact contract).

    One kernel launch on the current stream, ``ceil(n / TILE)`` programs (at least one: an
    empty sweep still counts its run); no host synchronization, no allocation. Eager only: the
    grid follows ``n``.
    """
    check_same_device(state=state, device=entries.device, what="SweepEntries")
    require_cuda_or_interpreter(
        device=state.device, kernel_interpreted=_INTERPRETED,
        who_needs="the canary sweep kernel needs", reference="sweep_ref (same signature)",
    )
    real = real_data_constexprs(state.real_data)
    tile = TILE
    if real["NUM_SOURCES"] and not real["PARTIAL"]:
        tile = max(64, min(tile, TILE_ELEMENTS // real["WORD_CHUNK"]))
    _sweep_kernel[(max(1, ceil_div(entries.count, tile)),)](
        entries.slots,
        entries.prev_slots,
        entries.positions,
        entries.tokens,
        entries.count,
        state.records,
        state.num_slots,
        state.ring,
        state.ring_capacity,
        state.counters,
        *real_data_args(state.real_data, placeholder=state.records),
        *window_args(state.window, placeholder=state.owner_chains),
        **real,
        **dict(zip(("HAS_WINDOW", "WINDOWED"), window_constexprs(state.window, state.real_data))),
        TILE=tile,
        num_warps=NUM_WARPS,
    )


_INTERPRETED = interpreted(_sweep_kernel)
