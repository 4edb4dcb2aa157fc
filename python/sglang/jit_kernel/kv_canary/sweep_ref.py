"""Plain-torch reference of the sweep launch (same keyword signature as :mod:`.sweep`, same
results); tests compare the two exactly.

A sweep checks slots the host lists (:class:`SweepEntries`), typically every slot the radix
cache holds, including cached slots no live request references. Per entry ``e`` (kind
``SWEEP``), with ``r = record(slots[e])`` (all zeros outside ``[0, num_slots)``):

- ``slots[e] == 0``: ``VERIFY_UNMAPPED`` alone (tokens -1, chains 0);
- ``VERIFY_POSITION`` if ``r.position != positions[e]``;
- ``VERIFY_CHAIN`` if ``r.chain`` differs from ``CHAIN_ANCHOR`` (``prev_slots[e] == -1``) or
  from ``derived(record(prev_slots[e]))``; not checked where ``prev_slots[e] == 0`` (the row then
  repeats ``r.chain`` as expected);
- ``VERIFY_TOKEN`` if ``tokens[e] != -1`` and ``r.token != tokens[e] & TOKEN_MASK``;
- ``VERIFY_REAL_KV`` (real data on) if ``r.fingerprint`` differs from the live bytes';
- window slots (``state.window`` given): a cached slot keeps its window slot ``w =
  slot_table[slot]`` only while the cache holds it in the window, so the sweep checks where
  ``w`` is live (in ``[1, G)``): ``VERIFY_WINDOW_OWNER`` if ``owners[w] != slot``; a windowed
  source is read through ``w`` there and folds zero words elsewhere, where its lane
  (``partial``) or, without ``partial``, the fingerprint's upper half is not compared.

Rows carry ``req_pool_index`` 0, the entry's slot and position, stored / expected token and
chain, and ``step = counters[COUNTER_STEP]``. Counters: ``KERNEL_RUNS[SWEEP] += 1``,
``ENTRIES[SWEEP] +=`` entries with a nonzero slot. This reference synchronizes (tests and CPU
self-checks only).
"""

from __future__ import annotations

import torch

from sglang.jit_kernel.kv_canary.consts import (
    CHAIN_ANCHOR,
    COUNTER_ENTRIES,
    COUNTER_KERNEL_RUNS,
    COUNTER_STEP,
    NO_EXPECTED_TOKEN,
    TOKEN_MASK,
    CheckKind,
    Reason,
)
from sglang.jit_kernel.kv_canary.hashing import lane_mask_scalar
from sglang.jit_kernel.kv_canary.kernel_inputs import (
    CanaryDeviceState,
    SweepEntries,
    check_same_device,
)
from sglang.jit_kernel.kv_canary.torch_helpers import (
    add_counter,
    append_rows,
    failing_rows,
    fingerprints,
    read_records,
    window_owners,
    window_slots,
)

ANCHOR_PREV_SLOT = -1  # prev_slots entry of a position-0 slot


def launch_sweep(*, state: CanaryDeviceState, entries: SweepEntries) -> None:
    """Reference of the sweep launch (see the module docstring)."""
    check_same_device(state=state, device=entries.device, what="SweepEntries")
    step = int(state.counters[COUNTER_STEP])
    slots, prev_slots = entries.slots, entries.prev_slots
    mapped = slots != 0
    record = read_records(state, slots)
    expected_chain = read_records(state, prev_slots).successor_chain()
    expected_chain = torch.where(prev_slots == 0, record.chain, expected_chain)
    expected_chain = torch.where(prev_slots == ANCHOR_PREV_SLOT, CHAIN_ANCHOR, expected_chain)
    reasons = (record.position != entries.positions) * int(Reason.VERIFY_POSITION)
    reasons |= (record.chain != expected_chain) * int(Reason.VERIFY_CHAIN)
    token_known = entries.tokens != NO_EXPECTED_TOKEN
    expected_token = torch.where(token_known, entries.tokens & TOKEN_MASK, NO_EXPECTED_TOKEN)
    reasons |= (token_known & (record.token != expected_token)) * int(Reason.VERIFY_TOKEN)
    window = None
    if state.window is not None:
        window = window_slots(state, slots, needed=mapped)
        owned = window_owners(state, window) == slots
        reasons |= (window.live & ~owned) * int(Reason.VERIFY_WINDOW_OWNER)
    if state.real_data is not None:
        real = state.real_data
        live_bytes = fingerprints(state, slots, window_slots=window)
        differs = record.fingerprint ^ live_bytes
        checked = torch.ones_like(mapped)
        if window is not None and state.window.windowed_sources:
            if real.partial:  # drop the lanes of windowed sources without a window slot
                for source in range(len(real.sources)):
                    if state.window.windows_source(source):
                        lane = lane_mask_scalar(source=source, num_sources=len(real.sources))
                        differs &= torch.where(window.live, -1, ~lane)
            else:  # the lower half (the other sources) always, the upper where live
                differs &= torch.where(window.live, -1, (1 << 32) - 1)
        reasons |= (checked & (differs != 0)) * int(Reason.VERIFY_REAL_KV)
    unmapped = ~mapped
    reasons = torch.where(unmapped, int(Reason.VERIFY_UNMAPPED), reasons)
    rows = failing_rows(
        reasons=reasons,
        columns=[
            int(CheckKind.SWEEP),
            reasons,
            0,
            slots,
            entries.positions,
            torch.where(unmapped, NO_EXPECTED_TOKEN, record.token),
            torch.where(unmapped, NO_EXPECTED_TOKEN, expected_token),
            torch.where(unmapped, 0, record.chain),
            torch.where(unmapped, 0, expected_chain),
            step,
        ],
    )
    append_rows(state=state, rows=rows)
    add_counter(state, COUNTER_KERNEL_RUNS + CheckKind.SWEEP, 1)
    add_counter(state, COUNTER_ENTRIES + CheckKind.SWEEP, int(mapped.sum()))
