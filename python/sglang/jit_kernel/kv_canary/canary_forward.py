"""Triton kernel of the two launches of every model forward.

``launch_pre_forward`` (before the model forward: verify prefixes, write this forward's records,
check and advance request ownership) and ``launch_post_forward`` (after it: verify prefixes and
the new positions, store the new slots' fingerprints, check ownership) implement exactly the
semantics of :mod:`.canary_forward_ref` (the plain-torch reference, same signatures); tests
compare the two exactly. Call both for every forward, also for an empty batch.

Design
------
One ``@triton.jit`` kernel, specialized by ``PHASE`` (pre / post). Work planning happens inside
the kernel from the ForwardBatch tensors: there is no plan launch and no workspace. Each launch
is a 1-D grid whose size depends only on host-known sizes (``bs``, ``num_tokens``,
``max_context_len``, the SM count), so it is CUDA-graph capturable and replays for any batch
contents of that shape.

No recompiles while serving: every constexpr depends only on the pool's fixed shapes and the
configuration (phase, layout, real-data mode, token checks); the batch size, token count and
grid are runtime arguments that are not specialized on (nor is the alignment of the batch
tensors). Batches of any size are walked in fixed blocks of ``ROW_BLOCK`` rows.

* Work items. Every program walks the batch in row blocks. Per block it loads the rows'
  metadata, derives each live row's verify length (prefix, plus the new tokens after the
  forward, clipped to ``max_context_len``) and write length, turns them into tile counts and
  their inclusive prefix sums, and takes its share of the block's flat sequence of (row, tile)
  items: the items of the whole launch are numbered across blocks and dealt round-robin, item
  ``i`` to program ``i % num_programs``. An item finds its row with one vector compare against
  the prefix sum. Load balance therefore does not depend on how prefixes are spread over rows:
  one 8k-token row is split over 16 programs just as 64 such rows are over 1024 items.
* Verify tile (``VERIFY_TILE`` positions of one row). Lane ``p`` loads ``req_to_token[rp, p]``
  and ``[rp, p - 1]`` (the same cache lines), the slot's record and its predecessor's (one
  16-byte load each: the record's token/position and chain; the predecessor is the
  neighbouring lane's, mostly an L1 hit) and, when needed, the record's fingerprint and stamp
  (the other half of the same 32-byte sector). It recomputes the expected chain, folds the
  slot's real-data words (partial: one 16-byte load per source; all: ``[tile, 16]`` blocks),
  compares the token with the history, and ORs the reason bits. The post launch stores the
  fingerprint of each new slot its pre launch stamped.
* Write tile (``WRITE_TILE`` tokens of one EXTEND row, or ``DECODE_WRITE_ROWS`` DECODE rows
  of one token each). The additive chain rule makes the chain value of a row's ``k``-th token
  ``seed + exclusive_prefix_sum(chain_term)``: inside the tile that is one scan; the sum over
  the row's earlier tiles is recomputed by the tile's own program, ``SCAN_BLOCK`` tokens per
  vector step, so an 8k-token prefill chunk is written by 16 programs in parallel. The lane
  holding a row's last token checks the row's owner chain and advances it (one program per
  row, load before store). With real data, each written slot's landing window in every source
  gets this forward's poison (16 bytes per source); the post launch, which reads the new slots'
  windows anyway to store their fingerprints, reports a slot where the model left the poison in
  place (``VERIFY_NOT_LANDED``: its K/V write landed elsewhere). The checks of the written
  tokens' inputs (positions, write-input expectations, unmapped slots) run in the pre launch
  for DECODE and in the post launch for EXTEND, which walks the same tiles again: an eager
  prefill's expectations are then built and sent while the model runs, off the path to its
  first token.
* Live rows. A row block's live lanes (:data:`.consts.PADDING_REQ_POOL_INDEX`) compare each
  row's ``req_pool_idx`` with the earlier rows', ``DUP_CHUNK`` rows per vector step (a few steps
  for a decode batch), and stop at ``live_rows`` (the rows the scheduler sent, read from the
  device: a replayed graph's padded rows lie past it). Rows that are not live are never
  verified or written and never change an owner chain.
* Row checks (padded rows and the seq_lens invariant in the pre launch, ownership at the last
  position in the post launch) are vectorized over a row block by one program per block.
* Violations. A tile with failing lanes reserves ring rows with one atomic add on
  ``counters[COUNTER_VIOLATIONS]`` and places them at the reserved indices (modulo the ring's
  capacity, dropped past ``capacity`` unconsumed rows). Clean tiles touch no atomics. Each
  program adds its verified / written slot counts with one atomic add per counter at its end;
  program 0 adds the run counters (and advances the step in the post launch).

Memory traffic per verified slot: one int32 ``req_to_token`` entry and one 32-byte record
sector (the predecessor's is a neighbouring lane's), plus a 16-byte sector per source (partial)
or the whole rows (all): about 36 bytes without real data, so a decode batch of 64 rows with
8k-token prefixes moves about 19 MB per verify pass.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from sglang.jit_kernel.kv_canary.consts import (
    COUNTER_ENTRIES,
    COUNTER_KERNEL_RUNS,
    COUNTER_STEP,
    FIELD_CHAIN,
    FIELD_FINGERPRINT,
    FIELD_STAMP,
    FIELD_TOKEN_POSITION,
    POSITION_SHIFT,
    RECORD_FIELDS,
    TOKEN_MASK,
    CheckKind,
    Reason,
)
from sglang.jit_kernel.kv_canary.direct_launch import DirectLauncher, TailLauncher, ceil_div
from sglang.jit_kernel.kv_canary.kernel_inputs import (
    BatchLayout,
    CanaryBatchView,
    CanaryDeviceState,
    check_same_device,
)
from sglang.jit_kernel.kv_canary.launch_config import (
    interpreted,
    require_cuda_or_interpreter,
    max_programs,
    real_data_args,
    real_data_constexprs,
    window_args,
    window_constexprs,
)
from sglang.jit_kernel.kv_canary.triton_helpers import (
    CHAIN_ANCHOR_C,
    NO_TOKEN_C,
    append_verify_rows,
    cdiv,
    chain_term,
    check_records,
    check_token,
    cumsum_1d,
    known_history_len,
    lane_mask,
    load_history_token,
    load_record_head,
    load_record_tail,
    load_req_to_token,
    landing_window_poisoned,
    poison_landing_window,
    ring_append,
    row_sums,
    slot_fingerprint,
    source_rows,
    successor_chain,
    sum_1d,
    unpack_token,
    window_slots,
    windowed_lane,
)

PRE = tl.constexpr(int(CheckKind.PRE_VERIFY))
POST = tl.constexpr(int(CheckKind.POST_VERIFY))
_WRITE = tl.constexpr(int(CheckKind.WRITE))
_DECODE = tl.constexpr(int(BatchLayout.DECODE))
_TOKEN_MASK = tl.constexpr(TOKEN_MASK)
_POSITION_SHIFT = tl.constexpr(POSITION_SHIFT)
_RECORD_FIELDS = tl.constexpr(RECORD_FIELDS)
_FIELD_TOKEN_POSITION = tl.constexpr(FIELD_TOKEN_POSITION)
_FIELD_FINGERPRINT = tl.constexpr(FIELD_FINGERPRINT)
# A record is written as two 16-byte halves: (token/position, chain), (fingerprint, stamp).
assert FIELD_CHAIN == FIELD_TOKEN_POSITION + 1 and FIELD_STAMP == FIELD_FINGERPRINT + 1
_COUNTER_STEP = tl.constexpr(COUNTER_STEP)
_RUNS_PRE = tl.constexpr(COUNTER_KERNEL_RUNS + CheckKind.PRE_VERIFY)
_RUNS_POST = tl.constexpr(COUNTER_KERNEL_RUNS + CheckKind.POST_VERIFY)
_RUNS_WRITE = tl.constexpr(COUNTER_KERNEL_RUNS + CheckKind.WRITE)
_ENTRIES = tl.constexpr(COUNTER_ENTRIES)
_ENTRIES_WRITE = tl.constexpr(COUNTER_ENTRIES + CheckKind.WRITE)
_VERIFY_REAL_KV = tl.constexpr(int(Reason.VERIFY_REAL_KV))
_LOWER_HALF = tl.constexpr((1 << 32) - 1)  # an all-mode fingerprint's half of the sources not windowed
_VERIFY_OWNER = tl.constexpr(int(Reason.VERIFY_OWNER))
_VERIFY_OVERWRITTEN = tl.constexpr(int(Reason.VERIFY_OVERWRITTEN))
_VERIFY_UNWRITTEN = tl.constexpr(int(Reason.VERIFY_UNWRITTEN))
_VERIFY_SEQ_LENS = tl.constexpr(int(Reason.VERIFY_SEQ_LENS))
_PADDED_ROW = tl.constexpr(int(Reason.PADDED_ROW))
_VERIFY_NOT_LANDED = tl.constexpr(int(Reason.VERIFY_NOT_LANDED))
_VERIFY_WINDOW_UNMAPPED = tl.constexpr(int(Reason.VERIFY_WINDOW_UNMAPPED))
_VERIFY_WINDOW_OWNER = tl.constexpr(int(Reason.VERIFY_WINDOW_OWNER))
_WRITE_TOKEN = tl.constexpr(int(Reason.WRITE_TOKEN))
_WRITE_POSITION = tl.constexpr(int(Reason.WRITE_POSITION))
_WRITE_UNMAPPED = tl.constexpr(int(Reason.WRITE_UNMAPPED))


# ============================================================================= row metadata


@triton.jit
def _prefix_lens(seq_lens_ptr, extend_prefix_lens_ptr, rows, mask, LAYOUT: tl.constexpr):
    """int64 prefix lengths of ``rows`` (vector or scalar)."""
    if LAYOUT == _DECODE:
        return tl.load(seq_lens_ptr + rows, mask=mask, other=1).to(tl.int64) - 1
    else:
        return tl.load(extend_prefix_lens_ptr + rows, mask=mask, other=0).to(tl.int64)


@triton.jit
def _token_counts(extend_seq_lens_ptr, rows, mask, LAYOUT: tl.constexpr):
    """int64 number of tokens each of ``rows`` writes this forward (0 where masked off)."""
    if LAYOUT == _DECODE:
        return tl.where(mask, 1, 0).to(tl.int64)
    else:
        counts = tl.load(extend_seq_lens_ptr + rows, mask=mask, other=0).to(tl.int64)
        return tl.maximum(counts, 0)


@triton.jit
def _repeats_earlier_row(req_pool_indices_ptr, rows, rp, on, end, DUP_CHUNK: tl.constexpr):
    """bool: lanes ``on`` whose pool row ``rp`` is also carried by an earlier batch row
    ``j < rows`` (``j < end``, ``req_pool_indices[j] != 0``). ``rows`` / ``rp`` / ``on`` are
    vectors of one shape; ``end`` bounds the earlier rows read (``DUP_CHUNK`` per step)."""
    repeats = rows < 0
    for start in range(0, end, DUP_CHUNK):
        j = start + tl.arange(0, DUP_CHUNK)
        rp_j = tl.load(req_pool_indices_ptr + j, mask=j < end, other=0).to(tl.int64)
        same = (rp_j[None, :] == rp[:, None]) & (j[None, :] < rows[:, None])
        same = same & (rp_j[None, :] != 0)
        repeats = repeats | (row_sums(same.to(tl.int32)) != 0)
    return on & repeats


@triton.jit
def _live_lanes(req_pool_indices_ptr, rows, rp, in_batch, live_rows, end,
                DUP_CHUNK: tl.constexpr):
    """bool: the live lanes among ``rows`` (see :data:`.consts.PADDING_REQ_POOL_INDEX`):
    inside the batch, a request row, before ``live_rows``, not repeating an earlier live row
    (``end``: one past the last of ``rows``, clipped to ``live_rows``)."""
    inside = in_batch & (rp != 0) & (rows < live_rows)
    return inside & ~_repeats_earlier_row(req_pool_indices_ptr, rows, rp, inside, end, DUP_CHUNK)


@triton.jit
def _first_owned_item(item_base, pid, num_programs):
    """The first global item index ``>= item_base`` dealt to program ``pid``."""
    return item_base + (pid + num_programs - item_base % num_programs) % num_programs


@triton.jit
def _locate(local_item, tile_counts, tile_ends, lanes):
    """(row within the block, tile within the row) of a block-local item index."""
    row = sum_1d((tile_ends <= local_item).to(tl.int32))
    first_item = sum_1d(tl.where(lanes == row, tile_ends - tile_counts, 0))
    return row, local_item - first_item


# ============================================================================= landing poison


@triton.jit
def _poison_sources(
    slot, mask, window_slot, window_live, step,
    src0_ptr, src0_rows, src0_stride, src1_ptr, src1_rows, src1_stride,
    src2_ptr, src2_rows, src2_stride, src3_ptr, src3_rows, src3_stride,
    NUM_SOURCES: tl.constexpr, WORDS0: tl.constexpr, WORDS1: tl.constexpr,
    WORDS2: tl.constexpr, WORDS3: tl.constexpr, WINDOWED: tl.constexpr,
):
    """Write the landing poison of forward ``step`` into every source's window of ``slot`` (a
    windowed source's: of ``window_slot``, where ``window_live``)."""
    if NUM_SOURCES > 0:
        row, on = source_rows(slot, mask, window_slot, window_live, 0, WINDOWED)
        poison_landing_window(src0_ptr, src0_rows, src0_stride, row, on, step, 0, WORDS0)
    if NUM_SOURCES > 1:
        row, on = source_rows(slot, mask, window_slot, window_live, 1, WINDOWED)
        poison_landing_window(src1_ptr, src1_rows, src1_stride, row, on, step, 1, WORDS1)
    if NUM_SOURCES > 2:
        row, on = source_rows(slot, mask, window_slot, window_live, 2, WINDOWED)
        poison_landing_window(src2_ptr, src2_rows, src2_stride, row, on, step, 2, WORDS2)
    if NUM_SOURCES > 3:
        row, on = source_rows(slot, mask, window_slot, window_live, 3, WINDOWED)
        poison_landing_window(src3_ptr, src3_rows, src3_stride, row, on, step, 3, WORDS3)


@triton.jit
def _any_source_poisoned(
    slot, mask, window_slot, window_live, step,
    src0_ptr, src0_rows, src0_stride, src1_ptr, src1_rows, src1_stride,
    src2_ptr, src2_rows, src2_stride, src3_ptr, src3_rows, src3_stride,
    NUM_SOURCES: tl.constexpr, WORDS0: tl.constexpr, WORDS1: tl.constexpr,
    WORDS2: tl.constexpr, WORDS3: tl.constexpr, WINDOWED: tl.constexpr,
):
    """bool: lanes ``mask`` where some source's window still holds forward ``step``'s poison
    (a windowed source's window of ``window_slot``, where ``window_live``)."""
    poisoned = mask ^ mask
    if NUM_SOURCES > 0:
        row, on = source_rows(slot, mask, window_slot, window_live, 0, WINDOWED)
        poisoned |= landing_window_poisoned(src0_ptr, src0_rows, src0_stride, row, on, step,
                                            0, WORDS0)
    if NUM_SOURCES > 1:
        row, on = source_rows(slot, mask, window_slot, window_live, 1, WINDOWED)
        poisoned |= landing_window_poisoned(src1_ptr, src1_rows, src1_stride, row, on, step,
                                            1, WORDS1)
    if NUM_SOURCES > 2:
        row, on = source_rows(slot, mask, window_slot, window_live, 2, WINDOWED)
        poisoned |= landing_window_poisoned(src2_ptr, src2_rows, src2_stride, row, on, step,
                                            2, WORDS2)
    if NUM_SOURCES > 3:
        row, on = source_rows(slot, mask, window_slot, window_live, 3, WINDOWED)
        poisoned |= landing_window_poisoned(src3_ptr, src3_rows, src3_stride, row, on, step,
                                            3, WORDS3)
    return poisoned


# ============================================================================= verify


@triton.jit
def _verify_tile(
    rp,
    prefix,
    position,
    lanes_on,
    step,
    history_ptr,
    history_rows,
    history_cols,
    history_stride,
    history_lens_ptr,
    records_ptr,
    num_slots,
    req_to_token_ptr,
    rt_rows,
    rt_cols,
    rt_stride,
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
    PHASE: tl.constexpr,
    VERIFY_TOKEN: tl.constexpr,
    NUM_SOURCES: tl.constexpr,
    PARTIAL: tl.constexpr,
    WORDS0: tl.constexpr,
    WORDS1: tl.constexpr,
    WORDS2: tl.constexpr,
    WORDS3: tl.constexpr,
    WORD_CHUNK: tl.constexpr,
    REAL_DATA_STRIDE: tl.constexpr,
    HAS_WINDOW: tl.constexpr,
    WINDOWED: tl.constexpr,
):
    """Verify positions ``position`` (lanes ``lanes_on``) of pool row ``rp`` whose prefix length
    is ``prefix``; append violation rows; return the number of slots verified (int64). The
    real-data sources are read after the forward only."""
    slot = load_req_to_token(req_to_token_ptr, rt_rows, rt_cols, rt_stride, rp, position, lanes_on)
    mapped = lanes_on & (slot != 0)
    prev_slot = load_req_to_token(
        req_to_token_ptr, rt_rows, rt_cols, rt_stride, rp, position - 1, mapped
    )
    reasons, token, chain, expected_chain = check_records(
        records_ptr, num_slots, slot, mapped, position, prev_slot, position == 0
    )
    new = position >= prefix
    # Window slots: every position the forward's queries attend to needs one, owned by its slot.
    window_slot = slot
    window_live = mapped
    if HAS_WINDOW:
        needed = mapped & (position >= prefix - window_size)
        window_slot, window_live = window_slots(
            window_table_ptr, window_table_len, num_window_slots, slot, needed
        )
        reasons |= tl.where(needed & ~window_live, _VERIFY_WINDOW_UNMAPPED, 0)
        owned_by = tl.load(window_owners_ptr + window_slot, mask=window_live & ~new, other=0)
        reasons |= tl.where(window_live & ~new & (owned_by != slot), _VERIFY_WINDOW_OWNER, 0)
    if PHASE == POST:
        fingerprint, stamp = load_record_tail(records_ptr, num_slots, slot, mapped)
        stamped = stamp == step + 1
        reasons |= tl.where(~new & stamped, _VERIFY_OVERWRITTEN, 0)
        reasons |= tl.where(new & ~stamped, _VERIFY_UNWRITTEN, 0)
        if HAS_WINDOW:
            tl.store(window_owners_ptr + window_slot, slot, mask=window_live & new & stamped)
        if NUM_SOURCES > 0:
            # The model must have replaced the landing poison of every slot it wrote.
            landed = mapped & new & stamped
            poisoned = _any_source_poisoned(
                slot, landed, window_slot, window_live, step,
                src0_ptr, src0_rows, src0_stride, src1_ptr, src1_rows, src1_stride,
                src2_ptr, src2_rows, src2_stride, src3_ptr, src3_rows, src3_stride,
                NUM_SOURCES, WORDS0, WORDS1, WORDS2, WORDS3, WINDOWED,
            )
            reasons |= tl.where(poisoned, _VERIFY_NOT_LANDED, 0)
            # The lanes whose bytes are read: every mapped one, or with a stride the prefix
            # positions due this step and the new ones (whose fingerprints are stored).
            folded = mapped
            if REAL_DATA_STRIDE > 1:
                folded = mapped & (((position + step) % REAL_DATA_STRIDE == 0) | new)
            # partial: a due prefix position reads one source (its lane is compared), a new one
            # every source (its whole fingerprint is stored)
            due = (position + step) // REAL_DATA_STRIDE % NUM_SOURCES
            live = slot_fingerprint(
                slot, folded, window_slot, window_live, due, new,
                src0_ptr, src0_rows, src0_stride, src1_ptr, src1_rows, src1_stride,
                src2_ptr, src2_rows, src2_stride, src3_ptr, src3_rows, src3_stride,
                NUM_SOURCES, PARTIAL, WORDS0, WORDS1, WORDS2, WORDS3, WORD_CHUNK, WINDOWED,
            )
            # A new slot's bytes were just written by the model: store, do not check.
            checked = ~stamped & folded & ~new
            store = mapped & new & stamped
            tl.store(records_ptr + slot * _RECORD_FIELDS + _FIELD_FINGERPRINT, live, mask=store)
            differs = fingerprint ^ live
            if PARTIAL:
                differs &= lane_mask(due, NUM_SOURCES)
            if WINDOWED != 0:
                # a windowed source's bytes are compared only where its window slot is live
                if PARTIAL:
                    checked &= ~windowed_lane(due, WINDOWED) | window_live
                else:  # the lower half (the other sources) always, the upper where live
                    differs = tl.where(window_live, differs, differs & _LOWER_HALF)
            reasons |= tl.where(checked & (differs != 0), _VERIFY_REAL_KV, 0)
    expected_token = tl.full(position.shape, NO_TOKEN_C, dtype=tl.int64)
    if VERIFY_TOKEN:
        known_len = known_history_len(history_lens_ptr, history_rows, history_cols, rp, rp >= 0)
        known = mapped & (position < known_len)
        history = load_history_token(history_ptr, history_stride, rp, position, known)
        expected_token = tl.where(known, history, NO_TOKEN_C)
        reasons = check_token(reasons, token, expected_token)
    append_verify_rows(
        ring_ptr, counters_ptr, ring_capacity, lanes_on, reasons, PHASE, rp, slot, position,
        token, expected_token, chain, expected_chain, step,
    )
    return sum_1d(mapped.to(tl.int64))


# ============================================================================= write


@triton.jit
def _written_token(input_ids_ptr, positions_ptr, out_cache_loc_ptr, num_tokens, token_index,
                   lanes_on):
    """(lanes inside the forward, their tokens' low 32 bits, positions, slots; int64) of the
    tokens ``token_index`` in ``lanes_on``."""
    valid = lanes_on & (token_index >= 0) & (token_index < num_tokens)
    token = tl.load(input_ids_ptr + token_index, mask=valid, other=0).to(tl.int64) & _TOKEN_MASK
    position = tl.load(positions_ptr + token_index, mask=valid, other=0).to(tl.int64)
    slot = tl.load(out_cache_loc_ptr + token_index, mask=valid, other=0).to(tl.int64)
    return valid, token, position, slot


@triton.jit
def _write_lanes(
    rp,
    prefix,
    k,
    count,
    token_index,
    lanes_on,
    earlier_terms,
    step,
    input_ids_ptr,
    positions_ptr,
    out_cache_loc_ptr,
    num_tokens,
    expected_input_ids_ptr,
    expected_positions_ptr,
    history_ptr,
    history_rows,
    history_cols,
    history_stride,
    history_lens_ptr,
    records_ptr,
    num_slots,
    req_to_token_ptr,
    rt_rows,
    rt_cols,
    rt_stride,
    ring_ptr,
    ring_capacity,
    counters_ptr,
    owner_chains_ptr,
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
    num_window_slots,
    SCAN: tl.constexpr,
    CHECK_INPUTS: tl.constexpr,
    HAS_HISTORY: tl.constexpr,
    HAS_EXPECTED_INPUT_IDS: tl.constexpr,
    HAS_EXPECTED_POSITIONS: tl.constexpr,
    NUM_SOURCES: tl.constexpr,
    WORDS0: tl.constexpr,
    WORDS1: tl.constexpr,
    WORDS2: tl.constexpr,
    WORDS3: tl.constexpr,
    HAS_WINDOW: tl.constexpr,
    WINDOWED: tl.constexpr,
):
    """Write the records of the tokens in ``lanes_on`` (per lane: pool row ``rp``, prefix length
    ``prefix``, index ``k`` of the token within its row of ``count`` tokens, token index
    ``token_index``), check their inputs (``CHECK_INPUTS``: the DECODE layout; an EXTEND
    layout's are checked by the post launch), and check and advance the owner chain of each row
    whose last token is in a lane. ``earlier_terms`` is the sum of the chain terms of the row's
    tokens before the tile; with ``SCAN`` (one row per tile) the lanes chain onto each other,
    else each lane is its row's only token. With real-data sources, the landing window of every
    slot written gets this forward's poison (the post launch requires the model to replace it).
    Returns the number of slots written (int64)."""
    # Seed: the chain value of the row's first new token.
    has_prefix = lanes_on & (prefix != 0)
    seed_slot = load_req_to_token(
        req_to_token_ptr, rt_rows, rt_cols, rt_stride, rp, prefix - 1, has_prefix
    )
    seed_packed, seed_chain = load_record_head(records_ptr, num_slots, seed_slot, has_prefix)
    seed = tl.where(has_prefix, successor_chain(seed_packed, seed_chain), CHAIN_ANCHOR_C)

    valid, token, position, slot = _written_token(
        input_ids_ptr, positions_ptr, out_cache_loc_ptr, num_tokens, token_index, lanes_on
    )
    term = tl.where(valid, chain_term(token, position), 0)
    if SCAN:
        chain = seed + earlier_terms + cumsum_1d(term) - term
    else:
        chain = seed
    written = valid & (slot != 0)
    storable = written & (slot > 0) & (slot < num_slots)
    # The record as two 16-byte stores: (token/position, chain) and (fingerprint 0, stamp).
    fields = slot[:, None] * _RECORD_FIELDS + tl.arange(0, 2)[None, :]
    head = tl.join((position << _POSITION_SHIFT) | token, chain)
    tail = tl.join(chain * 0, chain * 0 + step + 1)
    tl.store(records_ptr + fields + _FIELD_TOKEN_POSITION, head, mask=storable[:, None])
    tl.store(records_ptr + fields + _FIELD_FINGERPRINT, tail, mask=storable[:, None])
    if NUM_SOURCES > 0:
        window_slot = slot
        window_live = storable
        if WINDOWED != 0:
            window_slot, window_live = window_slots(
                window_table_ptr, window_table_len, num_window_slots, slot, storable
            )
        _poison_sources(
            slot, storable, window_slot, window_live, step,
            src0_ptr, src0_rows, src0_stride, src1_ptr, src1_rows, src1_stride,
            src2_ptr, src2_rows, src2_stride, src3_ptr, src3_rows, src3_stride,
            NUM_SOURCES, WORDS0, WORDS1, WORDS2, WORDS3, WINDOWED,
        )

    if CHECK_INPUTS:
        _check_write_inputs(
            rp, prefix, k, token_index, valid, token, position, slot, step,
            expected_input_ids_ptr, expected_positions_ptr,
            history_ptr, history_rows, history_cols, history_stride, history_lens_ptr,
            ring_ptr, ring_capacity, counters_ptr,
            HAS_HISTORY, HAS_EXPECTED_INPUT_IDS, HAS_EXPECTED_POSITIONS,
        )

    # Ownership, in the lane of each row's last token (one program per row).
    last = lanes_on & (k == count - 1)
    in_pool = last & (rp >= 0) & (rp < rt_rows)
    owner = tl.load(owner_chains_ptr + rp, mask=in_pool, other=0)
    mismatch = last & (owner != 0) & (owner != seed)
    ring_append(
        ring_ptr, counters_ptr, ring_capacity, mismatch, PRE, _VERIFY_OWNER, rp, seed_slot,
        prefix - 1, tl.where(has_prefix, unpack_token(seed_packed), NO_TOKEN_C), NO_TOKEN_C,
        seed, owner, step,
    )
    row_terms = chain + term - seed  # the sum of the chain terms of all the row's tokens
    advanced = tl.where(owner != 0, owner, seed) + row_terms
    tl.store(owner_chains_ptr + rp, advanced, mask=in_pool)
    return sum_1d(written.to(tl.int64))


@triton.jit
def _check_write_inputs(
    rp,
    prefix,
    k,
    token_index,
    valid,
    token,
    position,
    slot,
    step,
    expected_input_ids_ptr,
    expected_positions_ptr,
    history_ptr,
    history_rows,
    history_cols,
    history_stride,
    history_lens_ptr,
    ring_ptr,
    ring_capacity,
    counters_ptr,
    HAS_HISTORY: tl.constexpr,
    HAS_EXPECTED_INPUT_IDS: tl.constexpr,
    HAS_EXPECTED_POSITIONS: tl.constexpr,
):
    """The write checks of the tokens in ``valid`` (per lane: pool row ``rp``, prefix length
    ``prefix``, index ``k`` within the row, token index ``token_index``, and the low 32 bits of
    its token, its position and its slot): position, write-input expectations, unmapped slot.
    Appends one ``WRITE`` row per failing token."""
    expected_position = prefix + k
    position_bad = position != expected_position
    reported_position = expected_position
    if HAS_EXPECTED_POSITIONS:
        given = tl.load(expected_positions_ptr + token_index, mask=valid, other=NO_TOKEN_C)
        given = given.to(tl.int64)
        given_bad = (given != NO_TOKEN_C) & (position != given)
        # The expectation that failed: the prefix rule first, then the given one.
        reported_position = tl.where(given_bad, given, expected_position)
        reported_position = tl.where(position_bad, expected_position, reported_position)
        position_bad |= given_bad
    reasons = tl.where(position_bad, _WRITE_POSITION, 0)
    expected_token = tl.full(token.shape, NO_TOKEN_C, dtype=tl.int64)
    if HAS_EXPECTED_INPUT_IDS:
        expected_token = tl.load(
            expected_input_ids_ptr + token_index, mask=valid, other=NO_TOKEN_C
        ).to(tl.int64)
        if HAS_HISTORY:
            # No expectation given (the oracle predicts no prompt token): the token the
            # request's history has at this position, where the history knows it.
            known = known_history_len(history_lens_ptr, history_rows, history_cols, rp, valid)
            from_history = valid & (expected_token == NO_TOKEN_C)
            from_history &= (expected_position >= 0) & (expected_position < known)
            history = load_history_token(
                history_ptr, history_stride, rp, expected_position, from_history
            )
            expected_token = tl.where(from_history, history, expected_token)
        expected_token = tl.where(
            expected_token == NO_TOKEN_C, NO_TOKEN_C, expected_token & _TOKEN_MASK
        )
        token_bad = (expected_token != NO_TOKEN_C) & (token != expected_token)
        reasons |= tl.where(token_bad, _WRITE_TOKEN, 0)
    reasons |= tl.where(slot == 0, _WRITE_UNMAPPED, 0)
    ring_append(
        ring_ptr, counters_ptr, ring_capacity, valid & (reasons != 0), _WRITE, reasons, rp, slot,
        expected_position, token, expected_token, position, reported_position, step,
    )


@triton.jit
def _row_terms_before(input_ids_ptr, positions_ptr, num_tokens, first_token, tile_start,
                      SCAN_BLOCK: tl.constexpr):
    """Sum of the chain terms of a row's tokens ``[0, tile_start)`` (first token index
    ``first_token``), ``SCAN_BLOCK`` tokens per step; tokens outside the forward add 0."""
    total = tile_start * 0
    for scan_start in range(0, tile_start, SCAN_BLOCK):
        k = scan_start + tl.arange(0, SCAN_BLOCK)
        index = first_token + k
        valid = (k < tile_start) & (index >= 0) & (index < num_tokens)
        token = tl.load(input_ids_ptr + index, mask=valid, other=0).to(tl.int64) & _TOKEN_MASK
        position = tl.load(positions_ptr + index, mask=valid, other=0).to(tl.int64)
        total += sum_1d(tl.where(valid, chain_term(token, position), 0))
    return total


# ============================================================================= row checks


@triton.jit
def _check_seq_lens(rows, live, rp, seq_lens_ptr, host_seq_lens_ptr, ring_ptr, ring_capacity,
                    counters_ptr, step):
    """Pre launch: a row whose ``seq_lens`` differs from the host's mirror."""
    seq_lens = tl.load(seq_lens_ptr + rows, mask=live, other=0).to(tl.int64)
    host = tl.load(host_seq_lens_ptr + rows, mask=live, other=0).to(tl.int64)
    ring_append(
        ring_ptr, counters_ptr, ring_capacity, live & (seq_lens != host), PRE, _VERIFY_SEQ_LENS,
        rp, 0, seq_lens, NO_TOKEN_C, NO_TOKEN_C, seq_lens, host, step,
    )


@triton.jit
def _report_padded_rows(rows, in_batch, rp, live, live_rows, ring_ptr, ring_capacity,
                        counters_ptr, step):
    """Pre launch: a row with a request row that is not live (past ``live_rows``, or repeating an
    earlier live row's ``req_pool_idx``) changes nothing and is reported once."""
    padded = in_batch & (rp != 0) & ~live
    ring_append(
        ring_ptr, counters_ptr, ring_capacity, padded, PRE, _PADDED_ROW, rp, 0, rows,
        NO_TOKEN_C, NO_TOKEN_C, rows, rows * 0 + live_rows, step,
    )


@triton.jit
def _check_owner_after(rp, prefix, count, live, records_ptr, num_slots, req_to_token_ptr,
                       rt_rows, rt_cols, rt_stride, owner_chains_ptr, ring_ptr, ring_capacity,
                       counters_ptr, step):
    """Post launch: the chain after each row's last record must equal its owner chain."""
    in_pool = live & (count >= 1) & (rp >= 0) & (rp < rt_rows)
    owner = tl.load(owner_chains_ptr + rp, mask=in_pool, other=0)
    checked = in_pool & (owner != 0)
    last = prefix + count - 1
    slot = load_req_to_token(req_to_token_ptr, rt_rows, rt_cols, rt_stride, rp, last, checked)
    packed, chain = load_record_head(records_ptr, num_slots, slot, checked)
    derived = successor_chain(packed, chain)
    ring_append(
        ring_ptr, counters_ptr, ring_capacity, checked & (derived != owner), POST,
        _VERIFY_OWNER, rp, slot, last, unpack_token(packed), NO_TOKEN_C, derived, owner, step,
    )


# ============================================================================= kernel


# Forward-to-forward arguments are not specialized on (values nor alignment): serving never
# recompiles. Pool shapes and strides are fixed per pool and keep Triton's specialization.
_BATCH_POINTERS = [
    "req_pool_indices_ptr", "seq_lens_ptr", "extend_prefix_lens_ptr", "extend_seq_lens_ptr",
    "extend_start_loc_ptr", "host_seq_lens_ptr", "input_ids_ptr", "positions_ptr",
    "out_cache_loc_ptr", "expected_input_ids_ptr", "expected_positions_ptr", "live_rows_ptr",
]


@triton.jit(
    do_not_specialize=["bs", "num_tokens", "num_programs"],
    do_not_specialize_on_alignment=_BATCH_POINTERS,
)
def _canary_forward_kernel(
    # ---- per launch: the batch (its tensors, sizes, token history) and its check flags
    req_pool_indices_ptr,
    seq_lens_ptr,
    extend_prefix_lens_ptr,
    extend_seq_lens_ptr,
    extend_start_loc_ptr,
    host_seq_lens_ptr,
    input_ids_ptr,
    positions_ptr,
    out_cache_loc_ptr,
    expected_input_ids_ptr,
    expected_positions_ptr,
    live_rows_ptr,
    bs,
    num_tokens,
    history_ptr,
    history_rows,
    history_cols,
    history_stride,
    history_lens_ptr,
    num_programs,
    LAYOUT: tl.constexpr,
    VERIFY_TOKEN: tl.constexpr,
    HAS_HISTORY: tl.constexpr,
    HAS_EXPECTED_INPUT_IDS: tl.constexpr,
    HAS_EXPECTED_POSITIONS: tl.constexpr,
    HAS_HOST_SEQ_LENS: tl.constexpr,
    HAS_LIVE_ROWS: tl.constexpr,
    # ---- fixed per device state and phase (the launcher's bound tail: _bound_launch)
    PHASE: tl.constexpr,
    records_ptr,
    num_slots,
    req_to_token_ptr,
    rt_rows,
    rt_cols,
    rt_stride,
    ring_ptr,
    ring_capacity,
    counters_ptr,
    owner_chains_ptr,
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
    REAL_DATA_STRIDE: tl.constexpr,
    HAS_WINDOW: tl.constexpr,
    WINDOWED: tl.constexpr,
    ROW_BLOCK: tl.constexpr,
    VERIFY_TILE: tl.constexpr,
    WRITE_TILE: tl.constexpr,
    DECODE_WRITE_ROWS: tl.constexpr,
    SCAN_BLOCK: tl.constexpr,
    DUP_CHUNK: tl.constexpr,
):
    pid = tl.program_id(0).to(tl.int64)
    live_rows = bs.to(tl.int64)
    if HAS_LIVE_ROWS:
        live_rows = tl.minimum(tl.maximum(tl.load(live_rows_ptr), 0), live_rows)
    if PHASE == PRE:
        step = tl.load(counters_ptr + _COUNTER_STEP)
    else:
        # This launch advances counters[STEP] itself, so it cannot read it race-free; the pre
        # launch of the same forward counted itself in RUNS_PRE.
        step = tl.load(counters_ptr + _RUNS_PRE) - 1
    lanes = tl.arange(0, ROW_BLOCK)
    verify_lanes = tl.arange(0, VERIFY_TILE)
    verified = pid * 0
    written = pid * 0
    item_base = pid * 0  # global index of the current block's first item
    for block_start in range(0, bs, ROW_BLOCK):
        rows = block_start + lanes
        in_batch = rows < bs
        rp_block = tl.load(req_pool_indices_ptr + rows, mask=in_batch, other=0).to(tl.int64)
        live = _live_lanes(req_pool_indices_ptr, rows, rp_block, in_batch, live_rows,
                           tl.minimum(block_start + ROW_BLOCK, live_rows), DUP_CHUNK)
        prefix_block = _prefix_lens(seq_lens_ptr, extend_prefix_lens_ptr, rows, live, LAYOUT)
        count_block = _token_counts(extend_seq_lens_ptr, rows, live, LAYOUT)

        # ---- verify items: VERIFY_TILE positions of one row
        verify_end = prefix_block
        if PHASE == POST:
            verify_end += count_block
        verify_len = tl.minimum(tl.maximum(verify_end, 0), rt_cols)
        tile_counts = tl.where(live, cdiv(verify_len, VERIFY_TILE), 0)
        tile_ends = cumsum_1d(tile_counts)
        total = sum_1d(tile_counts)
        for item in range(_first_owned_item(item_base, pid, num_programs), item_base + total,
                          num_programs):
            row, tile = _locate(item - item_base, tile_counts, tile_ends, lanes)
            b = block_start + row
            rp = tl.load(req_pool_indices_ptr + b).to(tl.int64)
            prefix = _prefix_lens(seq_lens_ptr, extend_prefix_lens_ptr, b, b < bs, LAYOUT)
            end = prefix
            if PHASE == POST:
                end += _token_counts(extend_seq_lens_ptr, b, b < bs, LAYOUT)
            position = tile * VERIFY_TILE + verify_lanes
            lanes_on = position < tl.minimum(end, rt_cols)
            verified += _verify_tile(
                rp, prefix, position, lanes_on, step,
                history_ptr, history_rows, history_cols, history_stride, history_lens_ptr,
                records_ptr, num_slots, req_to_token_ptr, rt_rows, rt_cols, rt_stride,
                ring_ptr, ring_capacity, counters_ptr,
                src0_ptr, src0_rows, src0_stride, src1_ptr, src1_rows, src1_stride,
                src2_ptr, src2_rows, src2_stride, src3_ptr, src3_rows, src3_stride,
                window_table_ptr, window_table_len, window_owners_ptr, num_window_slots,
                window_size,
                PHASE, VERIFY_TOKEN, NUM_SOURCES, PARTIAL, WORDS0, WORDS1, WORDS2, WORDS3,
                WORD_CHUNK, REAL_DATA_STRIDE, HAS_WINDOW, WINDOWED,
            )
        item_base += total

        # ---- write items: the pre launch writes the records (and checks a DECODE layout's
        # inputs); the post launch checks an EXTEND layout's inputs, so their expectations can
        # be sent while the model runs
        if PHASE == PRE or LAYOUT != _DECODE:
            if LAYOUT == _DECODE:
                # DECODE_WRITE_ROWS rows per item, one token (lane) per row.
                block_rows = tl.minimum(bs - block_start, ROW_BLOCK)
                total = cdiv(block_rows, DECODE_WRITE_ROWS)
                for item in range(_first_owned_item(item_base, pid, num_programs),
                                  item_base + total, num_programs):
                    first_row = block_start + (item - item_base) * DECODE_WRITE_ROWS
                    b = first_row + tl.arange(0, DECODE_WRITE_ROWS)
                    on = b < bs
                    rp = tl.load(req_pool_indices_ptr + b, mask=on, other=0).to(tl.int64)
                    on = _live_lanes(req_pool_indices_ptr, b, rp, on, live_rows,
                                     tl.minimum(first_row + DECODE_WRITE_ROWS, live_rows),
                                     DUP_CHUNK)
                    prefix = _prefix_lens(seq_lens_ptr, extend_prefix_lens_ptr, b, on, LAYOUT)
                    written += _write_lanes(
                        rp, prefix, b * 0, b * 0 + 1, b, on, 0, step,
                        input_ids_ptr, positions_ptr, out_cache_loc_ptr, num_tokens,
                        expected_input_ids_ptr, expected_positions_ptr,
                        history_ptr, history_rows, history_cols, history_stride,
                        history_lens_ptr, records_ptr, num_slots,
                        req_to_token_ptr, rt_rows, rt_cols, rt_stride,
                        ring_ptr, ring_capacity, counters_ptr, owner_chains_ptr,
                        src0_ptr, src0_rows, src0_stride, src1_ptr, src1_rows, src1_stride,
                        src2_ptr, src2_rows, src2_stride, src3_ptr, src3_rows, src3_stride,
                        window_table_ptr, window_table_len, num_window_slots,
                        False, True, HAS_HISTORY, HAS_EXPECTED_INPUT_IDS, HAS_EXPECTED_POSITIONS,
                        NUM_SOURCES, WORDS0, WORDS1, WORDS2, WORDS3, HAS_WINDOW, WINDOWED,
                    )
            else:
                # WRITE_TILE tokens of one row per item.
                tile_counts = tl.where(live, cdiv(count_block, WRITE_TILE), 0)
                tile_ends = cumsum_1d(tile_counts)
                total = sum_1d(tile_counts)
                write_lanes = tl.arange(0, WRITE_TILE)
                for item in range(_first_owned_item(item_base, pid, num_programs),
                                  item_base + total, num_programs):
                    row, tile = _locate(item - item_base, tile_counts, tile_ends, lanes)
                    b = block_start + row
                    rp = tl.load(req_pool_indices_ptr + b).to(tl.int64)
                    prefix = _prefix_lens(seq_lens_ptr, extend_prefix_lens_ptr, b, b < bs, LAYOUT)
                    count = _token_counts(extend_seq_lens_ptr, b, b < bs, LAYOUT)
                    first = tl.load(extend_start_loc_ptr + b).to(tl.int64)
                    tile_start = tile.to(tl.int64) * WRITE_TILE
                    k = tile_start + write_lanes
                    zero = k * 0
                    if PHASE == PRE:
                        earlier = _row_terms_before(
                            input_ids_ptr, positions_ptr, num_tokens, first, tile_start,
                            SCAN_BLOCK,
                        )
                        written += _write_lanes(
                            zero + rp, zero + prefix, k, zero + count, first + k, k < count,
                            earlier, step,
                            input_ids_ptr, positions_ptr, out_cache_loc_ptr, num_tokens,
                            expected_input_ids_ptr, expected_positions_ptr,
                            history_ptr, history_rows, history_cols, history_stride,
                            history_lens_ptr, records_ptr, num_slots,
                            req_to_token_ptr, rt_rows, rt_cols, rt_stride,
                            ring_ptr, ring_capacity, counters_ptr, owner_chains_ptr,
                            src0_ptr, src0_rows, src0_stride, src1_ptr, src1_rows, src1_stride,
                            src2_ptr, src2_rows, src2_stride, src3_ptr, src3_rows, src3_stride,
                            window_table_ptr, window_table_len, num_window_slots,
                            True, False, HAS_HISTORY, False, False,
                            NUM_SOURCES, WORDS0, WORDS1, WORDS2, WORDS3, HAS_WINDOW, WINDOWED,
                        )
                    else:  # the same tokens' write checks, after the model
                        valid, token, position, slot = _written_token(
                            input_ids_ptr, positions_ptr, out_cache_loc_ptr, num_tokens, first + k,
                            k < count,
                        )
                        _check_write_inputs(
                            zero + rp, zero + prefix, k, first + k, valid, token, position, slot,
                            step, expected_input_ids_ptr, expected_positions_ptr,
                            history_ptr, history_rows, history_cols, history_stride,
                            history_lens_ptr, ring_ptr, ring_capacity, counters_ptr,
                            HAS_HISTORY, HAS_EXPECTED_INPUT_IDS, HAS_EXPECTED_POSITIONS,
                        )
            item_base += total

        # ---- row checks: one program per row block
        if (block_start // ROW_BLOCK) % num_programs == pid:
            if PHASE == PRE:
                _report_padded_rows(rows, in_batch, rp_block, live, live_rows, ring_ptr,
                                    ring_capacity, counters_ptr, step)
                if HAS_HOST_SEQ_LENS:
                    _check_seq_lens(rows, live, rp_block, seq_lens_ptr, host_seq_lens_ptr,
                                    ring_ptr, ring_capacity, counters_ptr, step)
            else:
                _check_owner_after(
                    rp_block, prefix_block, count_block, live, records_ptr, num_slots,
                    req_to_token_ptr, rt_rows, rt_cols, rt_stride, owner_chains_ptr, ring_ptr,
                    ring_capacity, counters_ptr, step,
                )

    # ---- counters
    if verified > 0:
        tl.atomic_add(counters_ptr + _ENTRIES + PHASE, verified)
    if PHASE == PRE:
        if written > 0:
            tl.atomic_add(counters_ptr + _ENTRIES_WRITE, written)
    if pid == 0:
        if PHASE == PRE:
            tl.atomic_add(counters_ptr + _RUNS_PRE, 1)
            tl.atomic_add(counters_ptr + _RUNS_WRITE, 1)
        else:
            tl.atomic_add(counters_ptr + _RUNS_POST, 1)
            tl.atomic_add(counters_ptr + _COUNTER_STEP, 1)


# ============================================================================= launches


def launch_pre_forward(*, state: CanaryDeviceState, batch: CanaryBatchView) -> None:
    """Before the model forward: verify every live row's prefix (real data excepted: the post
    launch verifies it), write this forward's records (stamped ``step + 1``, fingerprint 0) and,
    real data on, the landing poison of their slots, check a DECODE layout's written inputs,
    check and advance the rows' owner chains, report the rows that carry a request row but are
    not live, check the seq_lens invariant (see :mod:`.canary_forward_ref` for the exact
    contract). An EXTEND layout's write-input expectations are not read here (the post launch
    checks them).

    One kernel launch on the current stream; no host synchronization, no allocation;
    CUDA-graph capturable (the grid depends only on ``bs``, ``num_tokens``, ``max_context_len``
    and the device).
    """
    _launch(state=state, batch=batch, phase=CheckKind.PRE_VERIFY)


def launch_post_forward(*, state: CanaryDeviceState, batch: CanaryBatchView) -> None:
    """After the model forward: verify every live row's prefix and new positions (real data on:
    the new slots' landing poison must be gone), store the new slots' fingerprints, check an
    EXTEND layout's written inputs, check the rows' owner chains,
    advance the step counter (see :mod:`.canary_forward_ref`).

    One kernel launch on the current stream; no host synchronization, no allocation;
    CUDA-graph capturable.
    """
    _launch(state=state, batch=batch, phase=CheckKind.POST_VERIFY)


@dataclass(frozen=True, slots=True, kw_only=True)
class Tiles:
    """Block and tile sizes (powers of two). Fixed per process: they are constexprs."""

    row_block: int = 256  # batch rows per metadata block
    verify_tile: int = 512  # positions per verify item (fewer with whole-row fingerprints)
    write_tile: int = 512  # tokens per EXTEND write item
    decode_write_rows: int = 64  # rows per DECODE write item
    scan_block: int = 2048  # tokens per step of the cross-tile chain sum
    dup_chunk: int = 16  # earlier rows per step of the repeated-row check
    tile_elements: int = 1024  # verify lanes x words per fingerprint step (register budget)
    min_verify_tile: int = 64


TILES = Tiles()
NUM_WARPS = 4


@dataclass(frozen=True, slots=True, kw_only=True)
class _BoundLaunch:
    """The launch of one phase on one device state: the kernel's launcher with the state's
    arguments and the per-pool constexprs bound (:meth:`DirectLauncher.with_tail`), and the
    verify tile they imply."""

    state: CanaryDeviceState  # held: the bound tail's tensors are its own
    launch: TailLauncher
    verify_tile: int


# (id(state), phase) -> its bound launch; a few entries (a server has one state, two with
# EAGLE, and two phases), the oldest dropped beyond _MAX_BOUND
_BOUND: dict[tuple[int, int], _BoundLaunch] = {}
_MAX_BOUND = 8


def _bound_launch(state: CanaryDeviceState, phase: CheckKind) -> _BoundLaunch:
    """The bound launch of ``phase`` on ``state``, made at its first use."""
    bound = _BOUND.get((id(state), int(phase)))
    if bound is not None and bound.state is state:
        return bound
    require_cuda_or_interpreter(
        device=state.device, kernel_interpreted=_INTERPRETED,
        who_needs="the canary Triton kernels need",
        reference="canary_forward_ref (same signatures)",
    )
    tiles = TILES
    # Real data is verified after the forward only: the post launch sees every corruption the
    # pre launch would (bytes changed before the forward are still changed after it) plus the
    # ones made during the forward, so folding the bytes twice per step would double the cost
    # for nothing. The pre launch only writes the landing poison into the slots to be written.
    real_data = state.real_data
    real = real_data_constexprs(real_data)
    verify_tile = tiles.verify_tile
    if phase is CheckKind.POST_VERIFY and real["NUM_SOURCES"] and not real["PARTIAL"]:
        verify_tile = min(
            verify_tile, max(tiles.min_verify_tile, tiles.tile_elements // real["WORD_CHUNK"])
        )
    tail = (
        int(phase),
        state.records,
        state.num_slots,
        state.req_to_token,
        *state.req_to_token.shape,
        state.req_to_token.stride(0),
        state.ring,
        state.ring_capacity,
        state.counters,
        state.owner_chains,
        *real_data_args(real_data, placeholder=state.records),
        *window_args(state.window, placeholder=state.owner_chains),
        real["NUM_SOURCES"], real["PARTIAL"], real["WORDS0"], real["WORDS1"], real["WORDS2"],
        real["WORDS3"], real["WORD_CHUNK"],
        1 if real_data is None else real_data.verify_stride,
        *window_constexprs(state.window, real_data),
        tiles.row_block,
        verify_tile,
        tiles.write_tile,
        tiles.decode_write_rows,
        tiles.scan_block,
        tiles.dup_chunk,
    )
    bound = _BoundLaunch(state=state, launch=_LAUNCH.with_tail(tail), verify_tile=verify_tile)
    if len(_BOUND) >= _MAX_BOUND:
        del _BOUND[next(iter(_BOUND))]
    _BOUND[(id(state), int(phase))] = bound
    return bound


def _launch(*, state: CanaryDeviceState, batch: CanaryBatchView, phase: CheckKind) -> None:
    check_same_device(state=state, device=batch.device, what="CanaryBatchView")
    bound = _bound_launch(state, phase)
    num_programs = _num_programs(state=state, batch=batch, verify_tile=bound.verify_tile,
                                 tiles=TILES)
    history = batch.token_history
    placeholder = batch.req_pool_indices  # never read where its constexpr flag is off
    # the launch that checks the written tokens' inputs (and so reads the expectations)
    checks_inputs = (phase is CheckKind.PRE_VERIFY) == (batch.layout is BatchLayout.DECODE)
    expected_input_ids = batch.expected_input_ids
    expected_positions = batch.expected_positions
    host_seq_lens = batch.host_seq_lens
    bound.launch(
        (num_programs,),
        batch.req_pool_indices,
        batch.seq_lens,
        _or(batch.extend_prefix_lens, placeholder),
        _or(batch.extend_seq_lens, placeholder),
        _or(batch.extend_start_loc, placeholder),
        _or(host_seq_lens, placeholder),
        batch.input_ids,
        batch.positions,
        batch.out_cache_loc,
        _or(expected_input_ids, placeholder),
        _or(expected_positions, placeholder),
        _or(batch.live_rows, placeholder),
        batch.batch_size,
        batch.num_tokens,
        *((placeholder, 0, 0, 0, placeholder) if history is None
          else (history, history.shape[0], history.shape[1], history.stride(0),
                batch.token_history_lens)),
        num_programs,
        int(batch.layout),
        batch.verifies_tokens,
        history is not None,
        checks_inputs and expected_input_ids is not None,
        checks_inputs and expected_positions is not None,
        phase is CheckKind.PRE_VERIFY and host_seq_lens is not None,
        batch.live_rows is not None,
    )


def _num_programs(
    *, state: CanaryDeviceState, batch: CanaryBatchView, verify_tile: int, tiles: Tiles
) -> int:
    """Grid size from host-known sizes: enough programs for the largest possible number of
    items, capped at what the device runs at once."""
    bs = batch.batch_size
    verify_items = bs * ceil_div(state.req_to_token.shape[1], verify_tile)
    if batch.layout is BatchLayout.DECODE:
        write_items = ceil_div(bs, tiles.decode_write_rows) + ceil_div(bs, tiles.row_block)
    else:
        write_items = ceil_div(batch.num_tokens, tiles.write_tile) + bs
    return max(1, min(max_programs(state.device), verify_items + write_items))


def _or(tensor: torch.Tensor | None, placeholder: torch.Tensor) -> torch.Tensor:
    return placeholder if tensor is None else tensor


_INTERPRETED = interpreted(_canary_forward_kernel)
_LAUNCH = DirectLauncher(_canary_forward_kernel, num_warps=NUM_WARPS)
