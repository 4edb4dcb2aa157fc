"""Plain-torch building blocks of the reference launches (``*_ref.py``): masked reads of
``req_to_token``, records and the token history, fingerprints, and the ring append.

These read values on the host (they synchronize): for the references, tests and CPU
self-checks only, never for the forward path. Every read follows the kernels' masking rule:
an index outside its tensor reads as zero (records: all fields zero), never raises.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from sglang.jit_kernel.kv_canary.consts import (
    CHAIN_ANCHOR,
    COUNTER_CONSUMED,
    COUNTER_VIOLATIONS,
    FIELD_CHAIN,
    FIELD_FINGERPRINT,
    FIELD_STAMP,
    FIELD_TOKEN_POSITION,
    NO_EXPECTED_TOKEN,
    TOKEN_MASK,
    unpack_position,
    unpack_token,
)
from sglang.jit_kernel.kv_canary.hashing import (
    chain_term_torch,
    slot_fingerprints_torch,
    to_signed_i64,
)
from sglang.jit_kernel.kv_canary.kernel_inputs import CanaryBatchView, CanaryDeviceState


@dataclass(frozen=True, slots=True, kw_only=True)
class Records:
    """Decoded records of a vector of slots (int64 ``[n]`` each; zeros outside the table)."""

    token: torch.Tensor  # low 32 bits, non-negative
    position: torch.Tensor
    chain: torch.Tensor
    fingerprint: torch.Tensor
    stamp: torch.Tensor

    def successor_chain(self) -> torch.Tensor:
        """``chain + chain_term(token, position)``: the chain value of the next position."""
        return self.chain + chain_term_torch(self.token, self.position)


def req_to_token(state: CanaryDeviceState, rp: int, positions: torch.Tensor) -> torch.Tensor:
    """int64 ``req_to_token[rp, positions]``; 0 outside the tensor."""
    table = state.req_to_token
    positions = positions.to(device=table.device, dtype=torch.int64)
    if not 0 <= rp < table.shape[0] or table.shape[1] == 0:
        return torch.zeros_like(positions)
    inside = (positions >= 0) & (positions < table.shape[1])
    slots = table[rp, positions.clamp(0, table.shape[1] - 1)].to(torch.int64)
    return torch.where(inside, slots, 0)


def read_records(state: CanaryDeviceState, slots: torch.Tensor) -> Records:
    """Records of ``slots`` (int64 ``[n]``); all fields zero outside ``[0, num_slots)``."""
    inside = (slots >= 0) & (slots < state.num_slots)
    rows = state.records[slots.clamp(0, state.num_slots - 1)]
    rows = torch.where(inside[:, None], rows, 0)
    packed = rows[:, FIELD_TOKEN_POSITION]
    return Records(
        token=unpack_token(packed),
        position=unpack_position(packed),
        chain=rows[:, FIELD_CHAIN],
        fingerprint=rows[:, FIELD_FINGERPRINT],
        stamp=rows[:, FIELD_STAMP],
    )


def fingerprints(
    state: CanaryDeviceState, slots: torch.Tensor, *, window_slots: WindowSlots | None = None
) -> torch.Tensor:
    """int64 ``[n]`` fingerprints of the live KV bytes of ``slots`` (real data must be on).

    With ``state.window``, the windowed sources read the window slots of ``window_slots``
    (required then) where they are live, and fold zero words elsewhere (see
    :func:`~.hashing.slot_fingerprints_torch` for the split of a whole-row fingerprint)."""
    real_data = state.real_data
    assert real_data is not None
    source_rows = None
    if state.window is not None and state.window.windowed_sources:
        assert window_slots is not None
        rows = torch.where(window_slots.live, window_slots.slots, -1)
        source_rows = [rows if state.window.windows_source(k) else None
                       for k in range(len(real_data.sources))]
    return slot_fingerprints_torch(
        slots=slots, sources=real_data.sources, partial=real_data.partial,
        source_rows=source_rows,
        windowed_sources=0 if state.window is None else state.window.windowed_sources,
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class WindowSlots:
    """The window slots of a vector of record slots (int64 / bool ``[n]``): ``slots`` the table's
    value (0 outside it), ``needed`` the lanes whose position lies in the window, ``live`` the
    needed lanes whose window slot is in ``[1, G)``."""

    slots: torch.Tensor
    needed: torch.Tensor
    live: torch.Tensor


def window_slots(
    state: CanaryDeviceState, slots: torch.Tensor, *, needed: torch.Tensor
) -> WindowSlots:
    """Look ``slots`` up in ``state.window.slot_table`` (0 outside it); live where ``needed``
    and the value is a window slot."""
    window = state.window
    assert window is not None
    table = window.slot_table
    inside = (slots >= 0) & (slots < table.shape[0])
    values = torch.where(inside, table[slots.clamp(0, max(table.shape[0] - 1, 0))], 0)
    live = needed & (values >= 1) & (values < window.num_window_slots)
    return WindowSlots(slots=values, needed=needed, live=live)


def window_owners(state: CanaryDeviceState, window: WindowSlots) -> torch.Tensor:
    """int64 ``[n]``: ``owners[window.slots]`` where live, else 0."""
    owners = state.window.owners
    index = torch.where(window.live, window.slots, 0)
    return torch.where(window.live, owners[index], 0)


def history_tokens(
    batch: CanaryBatchView, rp: int, positions: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(tokens, known)``: the history's token (low 32 bits; 0 where unknown) at ``positions``
    of pool row ``rp``, and whether ``0 <= position < known_len(rp)``, where ``known_len(rp)`` is
    ``token_history_lens[rp]`` clipped to the history's width (0 for a row outside it)."""
    history = batch.token_history
    assert history is not None and batch.token_history_lens is not None
    rows, width = history.shape
    known_len = min(int(batch.token_history_lens[rp]), width) if 0 <= rp < rows else 0
    known = (positions >= 0) & (positions < known_len)
    if known_len <= 0:
        return torch.zeros_like(positions), known
    tokens = history[rp, positions.clamp(0, width - 1)].to(torch.int64) & TOKEN_MASK
    return torch.where(known, tokens, 0), known


@dataclass(frozen=True, slots=True, kw_only=True)
class RowSeed:
    """What a row's first new token chains onto (the pre launch's write, the admission check)."""

    chain: int  # CHAIN_ANCHOR if P == 0, else derived(record(rt(rp, P - 1)))
    slot: int  # rt(rp, P - 1), 0 if P == 0
    token: int  # that record's token, NO_EXPECTED_TOKEN if P == 0


def row_seed(state: CanaryDeviceState, rp: int, prefix: int) -> RowSeed:
    """The seed of pool row ``rp`` with ``prefix`` cached tokens."""
    if prefix == 0:
        return RowSeed(chain=CHAIN_ANCHOR, slot=0, token=NO_EXPECTED_TOKEN)
    slot = req_to_token(state, rp, torch.tensor([prefix - 1], device=state.device))
    record = read_records(state, slot)
    return RowSeed(
        chain=int(record.successor_chain()[0]), slot=int(slot[0]), token=int(record.token[0])
    )


def owner_chain(state: CanaryDeviceState, rp: int) -> int:
    """``owner_chains[rp]``; 0 (unknown) for a row outside the tensor."""
    if 0 <= rp < state.owner_chains.shape[0]:
        return int(state.owner_chains[rp])
    return 0


def append_rows(*, state: CanaryDeviceState, rows: Sequence[Sequence[int]]) -> None:
    """Append violation rows: row ``n`` (counting from ``counters[COUNTER_VIOLATIONS]``) goes to
    ``ring[n % capacity]`` (with ``n`` in its ``ROW_INDEX`` field) if ``n -
    counters[COUNTER_CONSUMED] < capacity``, else it is dropped; ``counters[COUNTER_VIOLATIONS]``
    grows by ``len(rows)`` either way. ``rows`` hold every field but ``ROW_INDEX``."""
    base = int(state.counters[COUNTER_VIOLATIONS])
    consumed = int(state.counters[COUNTER_CONSUMED])
    capacity = state.ring_capacity
    for offset, row in enumerate(rows):
        index = base + offset
        if index - consumed < capacity:
            state.ring[index % capacity] = torch.tensor(
                [to_signed_i64(int(value)) for value in row] + [index], dtype=torch.int64,
                device=state.device,
            )
    add_counter(state, COUNTER_VIOLATIONS, len(rows))


def add_counter(state: CanaryDeviceState, index: int, amount: int) -> None:
    state.counters[index] += amount


def failing_rows(
    *, reasons: torch.Tensor, columns: Sequence[torch.Tensor | int]
) -> list[list[int]]:
    """Violation rows of the lanes with ``reasons != 0``: each row lists ``columns`` (tensors
    ``[n]`` indexed per lane, or ints repeated), in ring-row order."""
    rows = []
    for lane in torch.nonzero(reasons).flatten().tolist():
        rows.append(
            [int(c[lane]) if isinstance(c, torch.Tensor) else int(c) for c in columns]
        )
    return rows
