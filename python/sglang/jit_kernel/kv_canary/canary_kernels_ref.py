"""Plain-torch references of the canary kernels: same keyword signatures, same results.

This module is the executable specification of :mod:`.canary_kernels`; tests compare the two
exactly (records and counters equal, violation rings equal as multisets). It loops over batch
rows on the host and synchronizes freely: use it for tests and CPU self-checks, never in the
forward path.

Semantics (the contract in ``kernel_api.md``; layouts in :mod:`.consts`):

Rows and prefixes. A batch row ``b`` is live when ``req_pool_indices[b] != 0``; padded rows are
skipped entirely. Its prefix length is ``seq_lens[b] - 1`` (``DECODE``) or
``extend_prefix_lens[b]`` (``EXTEND``). ``rt(rp, pos)`` is ``req_to_token[rp, pos]``, read as 0
outside the tensor; ``record(slot)`` is ``records[slot]``, read as all zeros outside
``[0, num_slots)``; the fingerprint of a slot outside ``real_kv_words`` folds zero words.
Corrupt indices therefore never fault: they read as empty data and fail the checks.

Verify (``PRE_VERIFY`` before the forward, ``POST_VERIFY`` after it). For every live row and
every ``pos`` in ``[0, prefix_len)`` (clipped to ``[0, max_context_len)``) with
``slot = rt(rp, pos) != 0``, with ``r = record(slot)``:

- ``VERIFY_POSITION`` if ``r.position != pos``;
- ``VERIFY_CHAIN`` if ``r.chain`` differs from ``CHAIN_ANCHOR`` (``pos == 0``) or from
  ``p.chain + chain_term(p.token, p.position)`` of ``p = record(rt(rp, pos - 1))``; not checked
  when that predecessor slot is 0 (the ring row then repeats ``r.chain`` as expected);
- ``VERIFY_REAL_KV`` (real data on) if ``r.fingerprint`` differs from the slot's fingerprint;
- ``VERIFY_TOKEN`` (token history given and ``verify_token``) if ``pos < known_len(rp)`` and
  ``r.token != expected_token_pool[rp, pos]``, where ``known_len(rp)`` is
  ``expected_token_valid_lens[rp]`` (indexed by *pool row*) clipped to the pool's width, and 0
  for a row outside the pool.

Write (post launch only). For every live row, its ``k``-th token ``i`` of this forward (token
``b`` for ``DECODE``; ``extend_start_loc[b] + k`` for ``k < extend_seq_lens[b]`` for ``EXTEND``;
indices outside ``[0, num_tokens)`` are ignored and add nothing to the chain) with
``slot = out_cache_loc[i] != 0``: ``records[slot] = (input_ids[i], positions[i], chain_k,
fingerprint or 0)``, where ``chain_k = seed + sum(chain_term(input_ids[j], positions[j]))`` over
the row's tokens ``j`` before ``i`` (slot 0 or not), and ``seed`` is ``CHAIN_ANCHOR`` when
``prefix_len == 0`` or ``rt(rp, prefix_len - 1) == 0``, else ``p.chain + chain_term(p.token,
p.position)`` of that predecessor's record. Checks: ``WRITE_POSITION`` if ``positions[i] !=
prefix_len + k`` or (if given and not ``NO_EXPECTED_TOKEN``) ``!= expected_positions[i]``;
``WRITE_TOKEN`` (``expected_input_ids`` given) if the token's expectation ``e`` is not
``NO_EXPECTED_TOKEN`` and ``input_ids[i] != e``, where ``e = expected_input_ids[i]``, or, where
that is ``NO_EXPECTED_TOKEN`` and the token history is given, ``expected_token_pool[rp,
prefix_len + k]`` when ``0 <= prefix_len + k < known_len(rp)`` (history fallback: prompt tokens
are checked against the request's history). The record is written even when a check fails, and
never outside ``[1, num_slots)`` (such a slot is still checked and counted). The post launch
verifies before it writes; the two sets are disjoint unless the batch itself is corrupt (then the
order of the overlapping reads and writes is undefined on a GPU).

Violation rows (layout in :mod:`.consts`): one per failing (row, position) or written token,
reasons OR-ed. Verify rows: stored/expected token (expected ``NO_EXPECTED_TOKEN`` when the token
is not checked) and stored/expected chain. Write rows: ``ROW_POSITION = prefix_len + k``, stored
token ``input_ids[i]``, expected ``e`` (``NO_EXPECTED_TOKEN`` when there is none),
``ROW_STORED_CHAIN = positions[i]`` and ``ROW_EXPECTED_CHAIN`` = the position expectation that
failed (``prefix_len + k`` first, else ``expected_positions[i]``; ``prefix_len + k`` when none
failed). ``ROW_STEP`` is the forward's step index ``S``: ``counters[COUNTER_STEP]`` as the pre
launch reads it. The post launch advances ``COUNTER_STEP`` to ``S + 1``; as it cannot read its
own increment race-free on a GPU, it takes ``S`` from ``counters[COUNTER_KERNEL_RUNS +
PRE_VERIFY] - 1``, which equals ``S`` whenever every forward runs the pre launch then the post
launch on counters that started at zero.

Ring and counters: row ``n`` of the launch-wide sequence goes to ``ring[counters[VIOLATIONS] +
n]`` if that index is below capacity (else it is dropped) and ``counters[VIOLATIONS]`` grows by
the number of rows either way. The pre launch adds 1 to ``KERNEL_RUNS + PRE_VERIFY`` and the
verified slot count to ``ENTRIES + PRE_VERIFY``; the post launch adds 1 to ``KERNEL_RUNS`` of
``POST_VERIFY`` and of ``WRITE``, the verified / written slot counts to ``ENTRIES`` of the same,
and 1 to ``COUNTER_STEP``. Slots equal to 0 are never counted.
"""

from __future__ import annotations

import torch

from sglang.jit_kernel.kv_canary.batch_view import (
    BatchLayout,
    CanaryBatchView,
    CanaryDeviceState,
    check_same_device,
)
from sglang.jit_kernel.kv_canary.consts import (
    CHAIN_ANCHOR,
    COUNTER_ENTRIES,
    COUNTER_KERNEL_RUNS,
    COUNTER_STEP,
    COUNTER_VIOLATIONS,
    FIELD_CHAIN,
    FIELD_FINGERPRINT,
    FIELD_POSITION,
    FIELD_TOKEN,
    NO_EXPECTED_TOKEN,
    NUM_COUNTERS,
    RECORD_FIELDS,
    RING_ROW_FIELDS,
    CheckKind,
    Reason,
)
from sglang.jit_kernel.kv_canary.hashing import chain_term_torch, fingerprint_torch


def allocate_device_state(
    *,
    num_slots: int,
    req_to_token: torch.Tensor,
    ring_capacity: int,
    real_kv_words: torch.Tensor | None = None,
    real_kv_num_words: int = 0,
) -> CanaryDeviceState:
    """Zero-initialized records, ring and counters on ``req_to_token``'s device.

    Allocates ``num_slots * RECORD_FIELDS * 8 + ring_capacity * RING_ROW_FIELDS * 8 +
    NUM_COUNTERS * 8`` bytes once; the launches never allocate.
    """
    if num_slots < 1:
        raise ValueError(f"num_slots must be >= 1, got {num_slots}")
    if ring_capacity < 1:
        raise ValueError(f"ring_capacity must be >= 1, got {ring_capacity}")
    device = req_to_token.device
    return CanaryDeviceState(
        records=torch.zeros((num_slots, RECORD_FIELDS), dtype=torch.int64, device=device),
        req_to_token=req_to_token,
        ring=torch.zeros((ring_capacity, RING_ROW_FIELDS), dtype=torch.int64, device=device),
        counters=torch.zeros((NUM_COUNTERS,), dtype=torch.int64, device=device),
        real_kv_words=real_kv_words,
        real_kv_num_words=real_kv_num_words,
    )


def launch_pre_forward_verify(*, state: CanaryDeviceState, batch: CanaryBatchView) -> None:
    """Reference of the pre-forward launch: verify every live row's prefix slots."""
    check_same_device(state=state, batch=batch)
    rows: list[list[int]] = []
    step = int(state.counters[COUNTER_STEP])
    checked = _verify_prefixes(
        state=state, batch=batch, kind=CheckKind.PRE_VERIFY, step=step, rows=rows
    )
    _append_rows(state=state, rows=rows)
    _add_counter(state, COUNTER_KERNEL_RUNS + CheckKind.PRE_VERIFY, 1)
    _add_counter(state, COUNTER_ENTRIES + CheckKind.PRE_VERIFY, checked)


def launch_post_forward_write_and_verify(
    *, state: CanaryDeviceState, batch: CanaryBatchView
) -> None:
    """Reference of the post-forward launch: verify prefix slots again, write this step's."""
    check_same_device(state=state, batch=batch)
    rows: list[list[int]] = []
    step = int(state.counters[COUNTER_KERNEL_RUNS + CheckKind.PRE_VERIFY]) - 1
    checked = _verify_prefixes(
        state=state, batch=batch, kind=CheckKind.POST_VERIFY, step=step, rows=rows
    )
    written = _write_tokens(state=state, batch=batch, step=step, rows=rows)
    _append_rows(state=state, rows=rows)
    _add_counter(state, COUNTER_KERNEL_RUNS + CheckKind.POST_VERIFY, 1)
    _add_counter(state, COUNTER_KERNEL_RUNS + CheckKind.WRITE, 1)
    _add_counter(state, COUNTER_ENTRIES + CheckKind.POST_VERIFY, checked)
    _add_counter(state, COUNTER_ENTRIES + CheckKind.WRITE, written)
    _add_counter(state, COUNTER_STEP, 1)


# ----------------------------------------------------------------------------- batch rows


def prefix_lens(batch: CanaryBatchView) -> torch.Tensor:
    """int64 ``[bs]``: tokens already in the KV cache before this forward, per row."""
    if batch.layout is BatchLayout.DECODE:
        return batch.seq_lens.to(torch.int64) - 1
    return batch.extend_prefix_lens.to(torch.int64)


def token_ranges(batch: CanaryBatchView) -> tuple[torch.Tensor, torch.Tensor]:
    """int64 ``[bs]`` first token index and token count of each row in this forward."""
    if batch.layout is BatchLayout.DECODE:
        return (
            torch.arange(batch.batch_size, dtype=torch.int64, device=batch.device),
            torch.ones(batch.batch_size, dtype=torch.int64, device=batch.device),
        )
    return batch.extend_start_loc.to(torch.int64), batch.extend_seq_lens.to(torch.int64)


# ----------------------------------------------------------------------------- verify


def _verify_prefixes(
    *,
    state: CanaryDeviceState,
    batch: CanaryBatchView,
    kind: CheckKind,
    step: int,
    rows: list[list[int]],
) -> int:
    """Append a violation row per failing prefix position; return how many slots were checked."""
    max_context_len = state.req_to_token.shape[1]
    req_pool_indices = batch.req_pool_indices.tolist()
    prefixes = prefix_lens(batch).tolist()
    checked = 0
    for b, rp in enumerate(req_pool_indices):
        if rp == 0:
            continue
        positions = torch.arange(
            min(max(prefixes[b], 0), max_context_len), dtype=torch.int64, device=state.device
        )
        slots = _req_to_token(state, rp, positions)
        live = slots != 0
        positions, slots = positions[live], slots[live]
        checked += positions.numel()
        stored = _gather_records(state, slots)
        prev_slots = _req_to_token(state, rp, positions - 1)
        prev = _gather_records(state, prev_slots)
        expected_chain = prev[:, FIELD_CHAIN] + chain_term_torch(
            prev[:, FIELD_TOKEN], prev[:, FIELD_POSITION]
        )
        expected_chain = torch.where(prev_slots == 0, stored[:, FIELD_CHAIN], expected_chain)
        expected_chain = torch.where(positions == 0, CHAIN_ANCHOR, expected_chain)
        reasons = torch.zeros_like(positions)
        reasons |= (stored[:, FIELD_POSITION] != positions) * int(Reason.VERIFY_POSITION)
        reasons |= (stored[:, FIELD_CHAIN] != expected_chain) * int(Reason.VERIFY_CHAIN)
        if state.real_kv_num_words > 0:
            mismatch = stored[:, FIELD_FINGERPRINT] != _fingerprints(state, slots)
            reasons |= mismatch * int(Reason.VERIFY_REAL_KV)
        expected_token = torch.full_like(positions, NO_EXPECTED_TOKEN)
        if batch.expected_token_pool is not None and batch.verify_token:
            history, known = _history_tokens(batch, rp, positions)
            expected_token = torch.where(known, history, NO_EXPECTED_TOKEN)
            token_bad = known & (stored[:, FIELD_TOKEN] != history)
            reasons |= token_bad * int(Reason.VERIFY_TOKEN)
        for n in torch.nonzero(reasons).flatten().tolist():
            rows.append(
                [
                    int(kind),
                    int(reasons[n]),
                    rp,
                    int(slots[n]),
                    int(positions[n]),
                    int(stored[n, FIELD_TOKEN]),
                    int(expected_token[n]),
                    int(stored[n, FIELD_CHAIN]),
                    int(expected_chain[n]),
                    step,
                ]
            )
    return checked


# ----------------------------------------------------------------------------- write


def _write_tokens(
    *, state: CanaryDeviceState, batch: CanaryBatchView, step: int, rows: list[list[int]]
) -> int:
    """Write this forward's records, append write-check violation rows; return slots written."""
    starts, counts = (t.tolist() for t in token_ranges(batch))
    prefixes = prefix_lens(batch).tolist()
    written = 0
    for b, rp in enumerate(batch.req_pool_indices.tolist()):
        if rp == 0:
            continue
        prefix = prefixes[b]
        k = torch.arange(max(counts[b], 0), dtype=torch.int64, device=state.device)
        index = starts[b] + k
        inside = (index >= 0) & (index < batch.num_tokens)
        k, index = k[inside], index[inside]  # tokens outside the forward are ignored
        tokens = batch.input_ids[index].to(torch.int64)
        positions = batch.positions[index].to(torch.int64)
        slots = batch.out_cache_loc[index].to(torch.int64)
        terms = chain_term_torch(tokens, positions)
        chains = _row_chain_seed(state, rp, prefix) + torch.cumsum(terms, dim=0) - terms

        live = slots != 0
        k, index, tokens, positions, slots, chains = (
            t[live] for t in (k, index, tokens, positions, slots, chains)
        )
        written += slots.numel()
        storable = (slots > 0) & (slots < state.num_slots)
        fingerprints = (
            _fingerprints(state, slots)
            if state.real_kv_num_words > 0
            else torch.zeros_like(slots)
        )
        new_records = torch.stack([tokens, positions, chains, fingerprints], dim=1)
        state.records[slots[storable]] = new_records[storable]

        expected_positions = prefix + k
        position_bad = positions != expected_positions
        reported_positions = expected_positions
        if batch.expected_positions is not None:
            given = batch.expected_positions[index].to(torch.int64)
            given_bad = (given != NO_EXPECTED_TOKEN) & (positions != given)
            reported_positions = torch.where(
                position_bad, expected_positions, torch.where(given_bad, given, expected_positions)
            )
            position_bad |= given_bad
        reasons = position_bad * int(Reason.WRITE_POSITION)
        expected_tokens = torch.full_like(tokens, NO_EXPECTED_TOKEN)
        if batch.expected_input_ids is not None:
            expected_tokens = batch.expected_input_ids[index].to(torch.int64)
            if batch.expected_token_pool is not None:
                history, known = _history_tokens(batch, rp, expected_positions)
                from_history = known & (expected_tokens == NO_EXPECTED_TOKEN)
                expected_tokens = torch.where(from_history, history, expected_tokens)
            token_bad = (expected_tokens != NO_EXPECTED_TOKEN) & (tokens != expected_tokens)
            reasons |= token_bad * int(Reason.WRITE_TOKEN)
        for n in torch.nonzero(reasons).flatten().tolist():
            rows.append(
                [
                    int(CheckKind.WRITE),
                    int(reasons[n]),
                    rp,
                    int(slots[n]),
                    int(expected_positions[n]),
                    int(tokens[n]),
                    int(expected_tokens[n]),
                    int(positions[n]),
                    int(reported_positions[n]),
                    step,
                ]
            )
    return written


def _row_chain_seed(state: CanaryDeviceState, rp: int, prefix: int) -> int:
    """Chain value of a row's first new token (from its predecessor record, or the anchor)."""
    prev_slot = int(_req_to_token(state, rp, torch.tensor([prefix - 1]))[0])
    if prefix <= 0 or prev_slot == 0:
        return CHAIN_ANCHOR
    prev = _gather_records(state, torch.tensor([prev_slot], device=state.device))[0]
    return int(prev[FIELD_CHAIN] + chain_term_torch(prev[FIELD_TOKEN], prev[FIELD_POSITION]))


# ----------------------------------------------------------------------------- helpers


def _history_tokens(
    batch: CanaryBatchView, rp: int, positions: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(tokens, known)``: int64 ``expected_token_pool[rp, positions]`` (0 where not known) and
    whether ``0 <= position < known_len(rp)`` (see the module docstring)."""
    pool = batch.expected_token_pool
    rows, width = pool.shape
    known_len = min(int(batch.expected_token_valid_lens[rp]), width) if 0 <= rp < rows else 0
    known = (positions >= 0) & (positions < known_len)
    if known_len <= 0:
        return torch.zeros_like(positions), known
    pooled = pool[rp, positions.clamp(0, width - 1)].to(torch.int64)
    return torch.where(known, pooled, 0), known


def _req_to_token(state: CanaryDeviceState, rp: int, positions: torch.Tensor) -> torch.Tensor:
    """int64 slots ``req_to_token[rp, positions]``, 0 outside the tensor."""
    table = state.req_to_token
    positions = positions.to(device=table.device, dtype=torch.int64)
    if not 0 <= rp < table.shape[0]:
        return torch.zeros_like(positions)
    inside = (positions >= 0) & (positions < table.shape[1])
    slots = table[rp, positions.clamp(0, max(table.shape[1] - 1, 0))].to(torch.int64)
    return torch.where(inside, slots, 0)


def _gather_records(state: CanaryDeviceState, slots: torch.Tensor) -> torch.Tensor:
    """int64 ``[n, RECORD_FIELDS]`` records of ``slots``, zeros outside ``[0, num_slots)``."""
    inside = (slots >= 0) & (slots < state.num_slots)
    records = state.records[slots.clamp(0, state.num_slots - 1)]
    return torch.where(inside[:, None], records, 0)


def _fingerprints(state: CanaryDeviceState, slots: torch.Tensor) -> torch.Tensor:
    """int64 ``[n]`` fingerprints of the real K words of ``slots`` (zero words outside)."""
    words = state.real_kv_words
    inside = (slots >= 0) & (slots < words.shape[0])
    rows = words[slots.clamp(0, max(words.shape[0] - 1, 0)), : state.real_kv_num_words]
    return fingerprint_torch(torch.where(inside[:, None], rows, 0))


def _append_rows(*, state: CanaryDeviceState, rows: list[list[int]]) -> None:
    base = int(state.counters[COUNTER_VIOLATIONS])
    for n, row in enumerate(rows):
        if base + n < state.ring_capacity:
            state.ring[base + n] = torch.tensor(row, dtype=torch.int64, device=state.device)
    _add_counter(state, COUNTER_VIOLATIONS, len(rows))


def _add_counter(state: CanaryDeviceState, index: int, amount: int) -> None:
    state.counters[index] += amount
