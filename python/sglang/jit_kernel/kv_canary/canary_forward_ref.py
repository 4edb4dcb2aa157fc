"""Plain-torch reference of the two launches of every model forward (same keyword signatures as
:mod:`.canary_forward`, same results); tests compare the two exactly (records, counters and
owner chains equal, violation rings equal as multisets).

This module is the executable specification. It loops over batch rows on the host and
synchronizes freely: use it for tests and CPU self-checks, never in the forward path.

Terms. Row ``b`` is live when ``rp = req_pool_indices[b] != 0``, ``b < live`` (``live =
live_rows[0]`` clipped to ``[0, bs]`` where given, else ``bs``) and no earlier row ``b' < b`` with
``rp' != 0`` and ``b' < live`` has ``rp' == rp``. Only live rows are verified, written or change
owner chains; every other row with ``rp != 0`` is reported by the pre launch (step 0 there) and
otherwise skipped, like a row with ``rp == 0`` (padding).
``P`` is its prefix length (``DECODE``: ``seq_lens[b] - 1``; ``EXTEND``: ``extend_prefix_lens[b]``),
``n`` the tokens it writes this forward (``DECODE``: 1; ``EXTEND``: ``max(extend_seq_lens[b],
0)``), its ``k``-th token is ``i = first + k`` (``DECODE``: ``first = b``; ``EXTEND``: ``first =
extend_start_loc[b]``); token indices outside ``[0, num_tokens)`` are ignored and add nothing to
any chain. ``rt(rp, p)`` is ``req_to_token[rp, p]`` (0 outside the tensor); ``record(slot)`` is
``records[slot]``, all zeros outside ``[0, num_slots)``; tokens are compared and hashed by their
low 32 bits. ``L`` is ``req_to_token``'s width. ``S`` is the forward's step index, and ``derived(r)
= r.chain + chain_term(r.token, r.position)`` the chain value that follows record ``r``.

Pre launch (before the model forward; ``S = counters[COUNTER_STEP]``):

0. padded rows: each row ``b`` with ``rp != 0`` that is not live gives a ``PRE_VERIFY`` row
   ``PADDED_ROW`` with slot 0, position ``b``, tokens -1, stored / expected chain ``b`` /
   ``live`` (so ``b >= live``: past the batch's live rows, e.g. a stale CUDA-graph padding row;
   ``b < live``: it repeats an earlier live row's ``req_pool_idx``).
   seq_lens invariant (``host_seq_lens`` given): a live row with ``seq_lens[b] !=
   host_seq_lens[b]`` gives a ``PRE_VERIFY`` row ``VERIFY_SEQ_LENS`` with slot 0, position
   ``seq_lens[b]``, tokens -1, stored/expected chain ``seq_lens[b]`` / ``host_seq_lens[b]``.
1. verify (``PRE_VERIFY``) every position ``p`` in ``[0, min(P, L))`` with ``slot = rt(rp, p)``:
   slot 0 gives ``VERIFY_UNMAPPED`` alone (tokens -1, chains 0). Else, with ``r =
   record(slot)``: ``VERIFY_POSITION`` if ``r.position != p``; ``VERIFY_CHAIN`` if ``r.chain``
   differs from ``CHAIN_ANCHOR`` (``p == 0``) or from ``derived(record(rt(rp, p - 1)))`` (not
   checked where ``rt(rp, p - 1) == 0``, which reports itself as unmapped; the row then repeats
   ``r.chain`` as expected); ``VERIFY_TOKEN``
   (token history given and ``verify_token``) if ``p < known_len(rp)`` and ``r.token !=
   token_history[rp, p]`` (``known_len(rp) = token_history_lens[rp]`` clipped to the history's
   width, 0 for a row outside it; the row's expected token is the history's where known, else
   -1).
2. write (``WRITE``) the row's tokens: ``slot = out_cache_loc[i]``; slot 0 is not written;
   otherwise ``records[slot] = (pack(input_ids[i], positions[i]), chain_k, 0, S + 1)`` (never
   outside ``[1, num_slots)``; such a slot is still checked and counted) and, real data on,
   the landing window of each written slot in every source gets the landing poison of step
   ``S`` (:func:`~.hashing.landing_poison_scalar`), where ``chain_k =
   seed + sum(chain_term)`` over the row's earlier tokens and ``seed = CHAIN_ANCHOR`` if ``P ==
   0``, else ``derived(record(rt(rp, P - 1)))``. Write checks (layout ``DECODE`` only: an
   ``EXTEND`` layout's are made by the post launch, step 2 there): ``WRITE_UNMAPPED`` for slot 0;
   ``WRITE_POSITION`` if ``positions[i] != P + k`` or (given, not -1) ``!= expected_positions[i]``;
   ``WRITE_TOKEN`` (``expected_input_ids`` given) if the expectation ``e`` is not -1 and the token
   differs, where ``e = expected_input_ids[i]``, or, where that is -1 and the token history is
   given, ``token_history[rp, P + k]`` when ``0 <= P + k < known_len(rp)``. Row: position ``P +
   k``, stored token ``input_ids[i]``, expected token ``e``, stored chain ``positions[i]``,
   expected chain the position expectation that failed (``P + k`` first, else the given one;
   ``P + k`` when none failed).
3. ownership, per live row with ``n >= 1``: ``owner = owner_chains[rp]`` (0 outside the tensor).
   If ``owner != 0`` and ``owner != seed``: a ``PRE_VERIFY`` row ``VERIFY_OWNER`` with slot
   ``rt(rp, P - 1)`` (0 if ``P == 0``), position ``P - 1``, stored token that record's (-1 if ``P
   == 0``), expected token -1, stored chain ``seed``, expected chain ``owner``. Then
   ``owner_chains[rp] = (owner or seed) + sum(chain_term)`` over all the row's tokens.
4. counters: ``KERNEL_RUNS`` of ``PRE_VERIFY`` and ``WRITE`` += 1; ``ENTRIES`` of ``PRE_VERIFY``
   += slots verified (nonzero), of ``WRITE`` += tokens written (nonzero slots).

Post launch (after the model forward; ``S = counters[COUNTER_KERNEL_RUNS + PRE_VERIFY] - 1``,
equal to the pre launch's ``S`` whenever every forward runs pre then post; the post launch
advances ``COUNTER_STEP`` itself and so cannot read it race-free):

1. verify (``POST_VERIFY``) every position ``p`` in ``[0, min(P + n, L))``, same checks as the pre
   launch, plus real data (only here: the pre launch does not fold bytes) and: for ``p < P``
   ``VERIFY_REAL_KV`` (real data on, ``r.stamp != S + 1``) if ``r.fingerprint`` differs from
   the fingerprint of the slot's live bytes (only where ``(p + S) % verify_stride == 0``, see
   :class:`~.kernel_inputs.RealDataSources`; ``partial``: in the lane of the source due at
   ``p``, :func:`~.hashing.due_source_scalar`), ``VERIFY_OVERWRITTEN`` if ``r.stamp == S + 1`` (a
   prefix slot was rewritten by this forward); for ``p >= P`` ``VERIFY_UNWRITTEN`` if ``r.stamp
   != S + 1`` (the position this forward wrote maps to a slot it did not write), and, real data
   on and ``r.stamp == S + 1``: ``VERIFY_NOT_LANDED`` if some source's landing window of the
   slot still holds every word of step ``S``'s poison (the model's K/V write for it landed
   elsewhere, or never happened), and instead of checking the fingerprint
   ``records[slot][FIELD_FINGERPRINT] =`` the fingerprint of the bytes the model just wrote.
2. write checks of an ``EXTEND`` layout: the pre launch's write checks (step 2 there) of every
   token the row wrote, from the same ``input_ids``, ``positions``, ``out_cache_loc`` and
   expectations, with the token history as it is now (the host may have sent a new request's
   history while the model ran); ``WRITE`` rows, ``ROW_STEP = S``. Checking them after the model
   lets an eager prefill's write-input expectations be built while the model runs.
3. ownership, per live row with ``n >= 1`` and ``owner = owner_chains[rp] != 0``, at ``p = P + n
   - 1``: if ``derived(record(rt(rp, p))) != owner``, a ``POST_VERIFY`` row ``VERIFY_OWNER`` with
   slot ``rt(rp, p)``, position ``p``, that record's token, expected token -1, stored chain the
   derived value, expected chain ``owner``. The post launch never writes ``owner_chains``.
4. counters: ``KERNEL_RUNS[POST_VERIFY] += 1``, ``ENTRIES[POST_VERIFY] +=`` slots verified,
   ``COUNTER_STEP += 1``.

Window slots (``state.window`` given, :class:`~.kernel_inputs.SlotWindow`). In both verify
steps, a mapped position ``p >= P - window`` of a live row needs a window slot ``w =
slot_table[slot]`` (0 outside the table): ``w`` outside ``[1, G)`` gives
``VERIFY_WINDOW_UNMAPPED``; otherwise a position the launch does not write (``p < P``) gives
``VERIFY_WINDOW_OWNER`` if ``owners[w] != slot``, and the post launch sets ``owners[w] =
slot`` for each new, stamped position. A windowed real-data source reads row ``w`` instead of
``slot`` (the landing poison too) and only where ``w`` is live; elsewhere it folds zero words
and is not compared: with ``partial`` a due lane of a windowed source is compared only where
``w`` is live, without ``partial`` (one folded value) nothing is compared where ``w`` is not
live. The same rows go to the ring as for the other reasons (the record's token and chains).

Every violation row carries ``ROW_STEP = S``; ring placement as in :mod:`.consts`. Both launches
run for every forward, also an empty one: the run counters are the health check's evidence.

Order. The reference verifies (and reads seeds and owners) before it writes, row by row. On a
GPU the programs of one launch run in no defined order, so where the pre launch's verified or
seed slots overlap the slots it writes, or two rows share a pool row, the outcome for those slots
differs from run to run. That only happens in a corrupt batch, and the post launch reports it
deterministically (``VERIFY_OVERWRITTEN``, ``VERIFY_OWNER``, ...): the post launch only reads
what the pre launch wrote and writes fingerprints only of records stamped by this forward, which
it never checks.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sglang.jit_kernel.kv_canary.consts import (
    CHAIN_ANCHOR,
    COUNTER_ENTRIES,
    COUNTER_KERNEL_RUNS,
    COUNTER_STEP,
    FIELD_FINGERPRINT,
    NO_EXPECTED_TOKEN,
    TOKEN_MASK,
    CheckKind,
    Reason,
    pack_token_position,
)
from sglang.jit_kernel.kv_canary.hashing import (
    chain_term_torch,
    due_sources_torch,
    landing_columns_torch,
    landing_poison_torch,
    lane_masks_torch,
    to_signed_i64,
)
from sglang.jit_kernel.kv_canary.kernel_inputs import (
    BatchLayout,
    CanaryBatchView,
    CanaryDeviceState,
    check_same_device,
)
from sglang.jit_kernel.kv_canary.torch_helpers import (
    add_counter,
    append_rows,
    failing_rows,
    fingerprints,
    history_tokens,
    RowSeed,
    owner_chain,
    read_records,
    req_to_token,
    row_seed,
    WindowSlots,
    window_owners,
    window_slots,
)

_PRE, _POST, _WRITE = CheckKind.PRE_VERIFY, CheckKind.POST_VERIFY, CheckKind.WRITE
_LOWER_HALF = (1 << 32) - 1  # a whole-row fingerprint's half of the sources not windowed


def launch_pre_forward(*, state: CanaryDeviceState, batch: CanaryBatchView) -> None:
    """Reference of the pre-forward launch: verify prefixes, write this forward's records,
    check and advance request ownership (see the module docstring)."""
    check_same_device(state=state, device=batch.device, what="CanaryBatchView")
    step = int(state.counters[COUNTER_STEP])
    rows = live_rows(batch)
    violations: list[list[int]] = _padded_rows(batch=batch, rows=rows, step=step)
    if batch.host_seq_lens is not None:
        violations += _seq_lens_rows(batch=batch, rows=rows, step=step)
    verified = 0
    for row in rows:
        verified += _verify_row(
            state=state, batch=batch, row=row, phase=_PRE, step=step, violations=violations
        )
    # read before any record is written
    seeds = [row_seed(state, row.rp, row.prefix) for row in rows]
    written = 0
    checks_inputs = batch.layout is BatchLayout.DECODE
    for row, seed in zip(rows, seeds):
        written += _write_row(
            state=state, batch=batch, row=row, seed=seed, step=step, violations=violations
        )
        if checks_inputs:
            violations += _write_check_rows(batch=batch, row=row, step=step)
    append_rows(state=state, rows=violations)
    add_counter(state, COUNTER_KERNEL_RUNS + _PRE, 1)
    add_counter(state, COUNTER_KERNEL_RUNS + _WRITE, 1)
    add_counter(state, COUNTER_ENTRIES + _PRE, verified)
    add_counter(state, COUNTER_ENTRIES + _WRITE, written)


def launch_post_forward(*, state: CanaryDeviceState, batch: CanaryBatchView) -> None:
    """Reference of the post-forward launch: verify prefixes and the new positions, store the
    new slots' fingerprints, check request ownership (see the module docstring)."""
    check_same_device(state=state, device=batch.device, what="CanaryBatchView")
    step = int(state.counters[COUNTER_KERNEL_RUNS + _PRE]) - 1
    violations: list[list[int]] = []
    verified = 0
    for row in live_rows(batch):
        verified += _verify_row(
            state=state, batch=batch, row=row, phase=_POST, step=step, violations=violations
        )
        if batch.layout is BatchLayout.EXTEND:
            violations += _write_check_rows(batch=batch, row=row, step=step)
        violations += _post_owner_rows(state=state, row=row, step=step)
    append_rows(state=state, rows=violations)
    add_counter(state, COUNTER_KERNEL_RUNS + _POST, 1)
    add_counter(state, COUNTER_ENTRIES + _POST, verified)
    add_counter(state, COUNTER_STEP, 1)


# ----------------------------------------------------------------------------- batch rows


@dataclass(frozen=True, slots=True, kw_only=True)
class LiveRow:
    """One live batch row: its index, pool row, prefix length, token count and first token."""

    b: int
    rp: int
    prefix: int
    count: int
    first: int


def live_row_count(batch: CanaryBatchView) -> int:
    """How many of the batch's rows the scheduler sent: ``live_rows[0]`` clipped to ``[0,
    bs]``, or ``bs`` without ``live_rows``."""
    bs = batch.batch_size
    if batch.live_rows is None:
        return bs
    return min(max(int(batch.live_rows[0]), 0), bs)


def live_rows(batch: CanaryBatchView) -> list[LiveRow]:
    """The batch's live rows (see the module docstring), in batch order."""
    bs = batch.batch_size
    rps = batch.req_pool_indices.tolist()
    live = live_row_count(batch)
    first_rows: set[int] = set()
    is_live = []
    for b, rp in enumerate(rps):
        is_live.append(rp != 0 and b < live and rp not in first_rows)
        if rp != 0 and b < live:
            first_rows.add(rp)
    if batch.layout is BatchLayout.DECODE:
        prefixes = [s - 1 for s in batch.seq_lens.tolist()]
        counts, firsts = [1] * bs, list(range(bs))
    else:
        prefixes = batch.extend_prefix_lens.tolist()
        counts = [max(n, 0) for n in batch.extend_seq_lens.tolist()]
        firsts = batch.extend_start_loc.tolist()
    return [
        LiveRow(b=b, rp=rps[b], prefix=prefixes[b], count=counts[b], first=firsts[b])
        for b in range(bs)
        if is_live[b]
    ]


def _padded_rows(*, batch: CanaryBatchView, rows: list[LiveRow], step: int) -> list[list[int]]:
    """The ``PADDED_ROW`` rows of the pre launch: rows with a request row that are not live."""
    live = live_row_count(batch)
    live_indices = {row.b for row in rows}
    return [
        [_PRE, Reason.PADDED_ROW, rp, 0, b, NO_EXPECTED_TOKEN, NO_EXPECTED_TOKEN, b, live, step]
        for b, rp in enumerate(batch.req_pool_indices.tolist())
        if rp != 0 and b not in live_indices
    ]


def _seq_lens_rows(*, batch: CanaryBatchView, rows: list[LiveRow], step: int) -> list[list[int]]:
    seq_lens = batch.seq_lens.tolist()
    host = batch.host_seq_lens.tolist()
    return [
        [_PRE, Reason.VERIFY_SEQ_LENS, row.rp, 0, seq_lens[row.b], NO_EXPECTED_TOKEN,
         NO_EXPECTED_TOKEN, seq_lens[row.b], host[row.b], step]
        for row in rows
        if seq_lens[row.b] != host[row.b]
    ]


# ----------------------------------------------------------------------------- verify


def _verify_row(
    *,
    state: CanaryDeviceState,
    batch: CanaryBatchView,
    row: LiveRow,
    phase: CheckKind,
    step: int,
    violations: list[list[int]],
) -> int:
    """Verify one row's positions; append its violation rows; return the slots verified."""
    end = row.prefix + (row.count if phase is _POST else 0)
    end = min(max(end, 0), state.req_to_token.shape[1])
    positions = torch.arange(end, dtype=torch.int64, device=state.device)
    slots = req_to_token(state, row.rp, positions)
    mapped = slots != 0
    record = read_records(state, slots)
    prev_slots = req_to_token(state, row.rp, positions - 1)
    expected_chain = read_records(state, prev_slots).successor_chain()
    expected_chain = torch.where(prev_slots == 0, record.chain, expected_chain)
    expected_chain = torch.where(positions == 0, CHAIN_ANCHOR, expected_chain)

    reasons = (record.position != positions) * int(Reason.VERIFY_POSITION)
    reasons |= (record.chain != expected_chain) * int(Reason.VERIFY_CHAIN)
    stamped = record.stamp == step + 1
    new = positions >= row.prefix
    window = None
    if state.window is not None:
        window = window_slots(
            state, slots, needed=mapped & (positions >= row.prefix - state.window.window)
        )
        reasons |= (window.needed & ~window.live) * int(Reason.VERIFY_WINDOW_UNMAPPED)
        owned = window_owners(state, window) == slots
        reasons |= (window.live & ~new & ~owned) * int(Reason.VERIFY_WINDOW_OWNER)
    if state.real_data is not None and phase is _POST:  # real data: after the forward only
        real = state.real_data
        poisoned = _landing_poisoned(state, slots, step=step, window=window)
        reasons |= (mapped & new & stamped & poisoned) * int(Reason.VERIFY_NOT_LANDED)
        live_bytes = fingerprints(state, slots, window_slots=window)
        due, source = due_sources_torch(positions=positions, step=step,
                                        stride=real.verify_stride, num_sources=len(real.sources))
        differs = record.fingerprint ^ live_bytes
        checked = ~stamped & ~new & due
        if real.partial:  # only the due source's lane
            differs &= lane_masks_torch(sources=source, num_sources=len(real.sources))
        if window is not None and state.window.windowed_sources:
            if real.partial:  # a windowed due lane needs its window slot
                windowed = (state.window.windowed_sources >> source) & 1 != 0
                checked &= ~windowed | window.live
            else:  # the lower half (the other sources) always, the upper where live
                differs &= torch.where(window.live, -1, _LOWER_HALF)
        reasons |= (checked & (differs != 0)) * int(Reason.VERIFY_REAL_KV)
    expected_token = torch.full_like(positions, NO_EXPECTED_TOKEN)
    if batch.verifies_tokens:
        history, known = history_tokens(batch, row.rp, positions)
        expected_token = torch.where(known, history, NO_EXPECTED_TOKEN)
        reasons |= (known & (record.token != history)) * int(Reason.VERIFY_TOKEN)
    if phase is _POST:
        reasons |= (~new & stamped) * int(Reason.VERIFY_OVERWRITTEN)
        reasons |= (new & ~stamped) * int(Reason.VERIFY_UNWRITTEN)
        if state.real_data is not None:
            store = mapped & new & stamped & (slots > 0) & (slots < state.num_slots)
            state.records[slots[store], FIELD_FINGERPRINT] = live_bytes[store]
        if window is not None:
            stamp = window.live & new & stamped
            state.window.owners[window.slots[stamp]] = slots[stamp]

    unmapped = ~mapped
    reasons = torch.where(unmapped, int(Reason.VERIFY_UNMAPPED), reasons)
    violations += failing_rows(
        reasons=reasons,
        columns=[
            int(phase),
            reasons,
            row.rp,
            slots,
            positions,
            torch.where(unmapped, NO_EXPECTED_TOKEN, record.token),
            torch.where(unmapped, NO_EXPECTED_TOKEN, expected_token),
            torch.where(unmapped, 0, record.chain),
            torch.where(unmapped, 0, expected_chain),
            step,
        ],
    )
    return int(mapped.sum())


def _landing_windows(words: torch.Tensor, slots: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """(rows, columns, inside) of the landing windows of ``slots`` in one source."""
    num_rows, words_per_row = words.shape
    inside = (slots >= 0) & (slots < num_rows)
    rows = torch.where(inside, slots, 0)
    columns = landing_columns_torch(slots=rows, words_per_row=words_per_row, num_rows=num_rows)
    return rows, columns, inside


def _source_rows(state: CanaryDeviceState, slots: torch.Tensor, window: WindowSlots | None,
                 source: int) -> torch.Tensor:
    """The rows of ``slots`` in real-data source ``source``: the slots, or for a windowed source
    the live window slots (-1, outside every source, elsewhere)."""
    if window is None or not state.window.windows_source(source):
        return slots
    return torch.where(window.live, window.slots, -1)


def _poison_landing_windows(state: CanaryDeviceState, slots: torch.Tensor, *, step: int) -> None:
    """Write forward ``step``'s landing poison into every source's window of ``slots``."""
    window = None
    if state.window is not None:
        window = window_slots(state, slots, needed=torch.ones_like(slots, dtype=torch.bool))
    for source, words in enumerate(state.real_data.sources):
        rows, columns, inside = _landing_windows(words, _source_rows(state, slots, window, source))
        rows, columns = rows[inside], columns[inside]
        poison = landing_poison_torch(slots=rows, step=step, source=source, columns=columns)
        words[rows[:, None], columns] = poison


def _landing_poisoned(state: CanaryDeviceState, slots: torch.Tensor, *, step: int,
                      window: WindowSlots | None) -> torch.Tensor:
    """bool: ``slots`` where some source's window still holds forward ``step``'s poison."""
    poisoned = torch.zeros_like(slots, dtype=torch.bool)
    for source, words in enumerate(state.real_data.sources):
        rows, columns, inside = _landing_windows(words, _source_rows(state, slots, window, source))
        poison = landing_poison_torch(slots=rows, step=step, source=source, columns=columns)
        poisoned |= inside & (words[rows[:, None], columns] == poison).all(dim=1)
    return poisoned


def _post_owner_rows(*, state: CanaryDeviceState, row: LiveRow, step: int) -> list[list[int]]:
    owner = owner_chain(state, row.rp)
    if row.count < 1 or owner == 0:
        return []
    last = row.prefix + row.count - 1
    slot = req_to_token(state, row.rp, torch.tensor([last], device=state.device))
    record = read_records(state, slot)
    derived = int(record.successor_chain()[0])
    if derived == owner:
        return []
    return [[_POST, Reason.VERIFY_OWNER, row.rp, int(slot[0]), last, int(record.token[0]),
             NO_EXPECTED_TOKEN, derived, owner, step]]


# ----------------------------------------------------------------------------- write


def _write_row(
    *,
    state: CanaryDeviceState,
    batch: CanaryBatchView,
    row: LiveRow,
    seed: RowSeed,
    step: int,
    violations: list[list[int]],
) -> int:
    """Write one row's records, check and advance its ownership; return the slots written."""
    _, tokens, positions, slots = _written_tokens(batch=batch, row=row)
    terms = chain_term_torch(tokens, positions)
    chains = seed.chain + torch.cumsum(terms, dim=0) - terms

    storable = (slots > 0) & (slots < state.num_slots)
    new_records = torch.stack(
        [
            pack_token_position(token=tokens, position=positions),
            chains,
            torch.zeros_like(chains),
            torch.full_like(chains, step + 1),
        ],
        dim=1,
    )
    state.records[slots[storable]] = new_records[storable]
    if state.real_data is not None:
        _poison_landing_windows(state, slots[storable], step=step)

    if row.count >= 1:
        violations += _pre_owner(state=state, row=row, seed=seed, total=int(terms.sum()),
                                 step=step)
    return int((slots != 0).sum())


def _written_tokens(
    *, batch: CanaryBatchView, row: LiveRow
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The row's tokens inside the forward: their index ``k`` within the row, their tokens (low
    32 bits), positions and slots (int64 each)."""
    k = torch.arange(row.count, dtype=torch.int64, device=batch.device)
    index = row.first + k
    inside = (index >= 0) & (index < batch.num_tokens)
    k, index = k[inside], index[inside]
    tokens = batch.input_ids[index].to(torch.int64) & TOKEN_MASK
    positions = batch.positions[index].to(torch.int64)
    slots = batch.out_cache_loc[index].to(torch.int64)
    return k, tokens, positions, slots


def _write_check_rows(*, batch: CanaryBatchView, row: LiveRow, step: int) -> list[list[int]]:
    """The ``WRITE`` rows of one row's written tokens (position, write-input expectations,
    unmapped slot)."""
    k, tokens, positions, slots = _written_tokens(batch=batch, row=row)
    index = row.first + k
    expected_position = row.prefix + k
    position_bad = positions != expected_position
    reported_position = expected_position
    if batch.expected_positions is not None:
        given = batch.expected_positions[index]
        given_bad = (given != NO_EXPECTED_TOKEN) & (positions != given)
        reported_position = torch.where(
            position_bad, expected_position, torch.where(given_bad, given, expected_position)
        )
        position_bad |= given_bad
    reasons = position_bad * int(Reason.WRITE_POSITION)
    expected_token = torch.full_like(tokens, NO_EXPECTED_TOKEN)
    if batch.expected_input_ids is not None:
        expected_token = batch.expected_input_ids[index]
        if batch.token_history is not None:
            history, known = history_tokens(batch, row.rp, expected_position)
            expected_token = torch.where(
                known & (expected_token == NO_EXPECTED_TOKEN), history, expected_token
            )
        expected_token = torch.where(
            expected_token == NO_EXPECTED_TOKEN, NO_EXPECTED_TOKEN, expected_token & TOKEN_MASK
        )
        token_bad = (expected_token != NO_EXPECTED_TOKEN) & (tokens != expected_token)
        reasons |= token_bad * int(Reason.WRITE_TOKEN)
    reasons |= (slots == 0) * int(Reason.WRITE_UNMAPPED)
    return failing_rows(
        reasons=reasons,
        columns=[
            int(_WRITE), reasons, row.rp, slots, expected_position, tokens, expected_token,
            positions, reported_position, step,
        ],
    )



def _pre_owner(
    *, state: CanaryDeviceState, row: LiveRow, seed: RowSeed, total: int, step: int
) -> list[list[int]]:
    """Check the row's seed against its owner chain and advance the owner chain."""
    owner = owner_chain(state, row.rp)
    rows = []
    if owner != 0 and owner != seed.chain:
        rows.append([_PRE, Reason.VERIFY_OWNER, row.rp, seed.slot, row.prefix - 1, seed.token,
                     NO_EXPECTED_TOKEN, seed.chain, owner, step])
    if 0 <= row.rp < state.owner_chains.shape[0]:
        state.owner_chains[row.rp] = to_signed_i64((owner if owner != 0 else seed.chain) + total)
    return rows
