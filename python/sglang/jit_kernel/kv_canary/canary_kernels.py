"""Triton kernels of the KV canary: the two launches of every model forward.

``launch_pre_forward_verify`` (before ``model.forward``) and
``launch_post_forward_write_and_verify`` (after it) implement exactly the semantics written down
in :mod:`.canary_kernels_ref` (the plain-torch reference, same signatures); tests compare the two
exactly. Call both for every forward, also for an empty batch: the run counters are the health
check's evidence, and the post launch stamps its violation rows with the step the pre launch
counted (see the reference's docstring).

Design
------
Work planning happens inside the kernels, from the ForwardBatch tensors: there is no plan
launch and no workspace. Each launch is one 1-D grid whose size is fixed by host-known sizes
only (``bs`` from tensor shapes, ``max_context_len``, ``num_tokens``, the SM count: at most 4
programs per SM), so a launch is CUDA-graph capturable and replays for any batch contents of
that shape. Arguments that change from forward to forward (``bs``, ``num_tokens``, the grid) are
not specialized on, so serving never recompiles; a new kernel variant is compiled only for a new
power-of-two bucket of ``bs`` or a new option set (layout, real data, token checks).

* Work items. Every program loads the batch rows' metadata (``bs`` padded to a power of two),
  derives each live row's verify length (its prefix, clipped to ``max_context_len``) and write
  length (its tokens this forward), and turns them into tile counts and their inclusive prefix
  sum. The flat sequence of (row, tile) items is shared out round-robin: program ``p`` takes items
  ``p, p + num_programs, ...`` up to a device-side bound; an item finds its row with one vector
  compare against the prefix sum. Load balance therefore does not depend on how the prefixes
  are spread over rows: one 8k-token row is split over 16 programs just as 64 such rows are
  split over 1024 items.
* Verify tile (512 prefix positions of one row; 64 when whole K rows are fingerprinted, to bound
  registers). Lane ``pos`` loads ``req_to_token[rp, pos]`` and ``[rp, pos - 1]``, the slot's record
  and its predecessor's (the neighbouring lane's, so mostly an L1 hit), recomputes the expected
  chain value, optionally folds the slot's real K words (a ``[tile, 16]`` block per step) and
  compares the slot's token with the token history's ``pool[rp, pos]`` (below the history's
  known length of pool row ``rp``: persistent per-pool-row tensors, so a replayed graph checks
  tokens as an eager forward does), and ORs the reason bits.
* Write tile (512 tokens of one row; 16 for decode, where a row has one token). The additive
  chain rule makes the chain value of a row's ``k``-th new token ``seed +
  exclusive_prefix_sum(chain_term)``: inside the tile that is one scan; the sum over the row's
  earlier tiles is recomputed by the tile's own program, 2048 tokens per vector step
  (``chain_term`` is a few integer ops per token, and no program waits for another). An 8k-token
  prefill chunk is thus written by 16 programs in parallel, never by one thread per request.
  The seed comes from the record of ``req_to_token[rp, prefix_len - 1]`` (the anchor for an
  empty prefix). The write-input assert runs in the same lanes: a token without a given
  expectation (a prompt token the oracle does not predict) is compared with the token history
  at its position, so extend rows are checked against the request, not against themselves.
* Violations. A tile with ``n > 0`` failing lanes reserves ``n`` ring rows with one atomic add
  on ``counters[COUNTER_VIOLATIONS]`` and places them at the reserved base plus the exclusive
  prefix sum of its failure mask; rows at or past the ring's capacity are dropped while the
  counter keeps counting. Clean tiles touch no atomics. Each program adds its checked and
  written slot counts with one atomic add per counter at its end; program 0 adds the run
  counters (and advances the step in the post launch).

Everything stays in bounds: indices read from the batch or from ``req_to_token`` that fall
outside their tensors are masked and read as zero (the reference documents the same rule), so
a corrupt index becomes a reported violation, never a memory fault.

Memory traffic per verified slot is about 36 bytes (one int32 ``req_to_token`` entry; the
predecessor's is the neighbouring lane's; one 32-byte record), plus 8 bytes per real-data word.
A decode batch of 64 rows with 8k-token prefixes (512k slots) is about 19 MB per verify pass,
a few microseconds of HBM bandwidth on an H200; ``benchmark/bench_canary_kernels.py`` measures
it.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction

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
    RECORD_FIELDS,
    RING_ROW_FIELDS,
    ROW_CHECK,
    ROW_EXPECTED_CHAIN,
    ROW_EXPECTED_TOKEN,
    ROW_POSITION,
    ROW_REASONS,
    ROW_REQ_POOL_INDEX,
    ROW_SLOT,
    ROW_STEP,
    ROW_STORED_CHAIN,
    ROW_STORED_TOKEN,
    CheckKind,
    Reason,
)
from sglang.jit_kernel.kv_canary.triton_hashing import chain_term, fingerprint_rows

# Triton sees module globals only as constexprs.
_DECODE = tl.constexpr(int(BatchLayout.DECODE))
_CHAIN_ANCHOR = tl.constexpr(CHAIN_ANCHOR)
_NO_EXPECTED_TOKEN = tl.constexpr(NO_EXPECTED_TOKEN)
_RECORD_FIELDS = tl.constexpr(RECORD_FIELDS)
_FIELD_TOKEN = tl.constexpr(FIELD_TOKEN)
_FIELD_POSITION = tl.constexpr(FIELD_POSITION)
_FIELD_CHAIN = tl.constexpr(FIELD_CHAIN)
_FIELD_FINGERPRINT = tl.constexpr(FIELD_FINGERPRINT)
_RING_ROW_FIELDS = tl.constexpr(RING_ROW_FIELDS)
_ROW_CHECK = tl.constexpr(ROW_CHECK)
_ROW_REASONS = tl.constexpr(ROW_REASONS)
_ROW_REQ_POOL_INDEX = tl.constexpr(ROW_REQ_POOL_INDEX)
_ROW_SLOT = tl.constexpr(ROW_SLOT)
_ROW_POSITION = tl.constexpr(ROW_POSITION)
_ROW_STORED_TOKEN = tl.constexpr(ROW_STORED_TOKEN)
_ROW_EXPECTED_TOKEN = tl.constexpr(ROW_EXPECTED_TOKEN)
_ROW_STORED_CHAIN = tl.constexpr(ROW_STORED_CHAIN)
_ROW_EXPECTED_CHAIN = tl.constexpr(ROW_EXPECTED_CHAIN)
_ROW_STEP = tl.constexpr(ROW_STEP)
_COUNTER_VIOLATIONS = tl.constexpr(COUNTER_VIOLATIONS)
_COUNTER_STEP = tl.constexpr(COUNTER_STEP)
_RUNS_PRE = tl.constexpr(COUNTER_KERNEL_RUNS + CheckKind.PRE_VERIFY)
_RUNS_POST = tl.constexpr(COUNTER_KERNEL_RUNS + CheckKind.POST_VERIFY)
_RUNS_WRITE = tl.constexpr(COUNTER_KERNEL_RUNS + CheckKind.WRITE)
_ENTRIES_PRE = tl.constexpr(COUNTER_ENTRIES + CheckKind.PRE_VERIFY)
_ENTRIES_POST = tl.constexpr(COUNTER_ENTRIES + CheckKind.POST_VERIFY)
_ENTRIES_WRITE = tl.constexpr(COUNTER_ENTRIES + CheckKind.WRITE)
_KIND_PRE = tl.constexpr(int(CheckKind.PRE_VERIFY))
_KIND_POST = tl.constexpr(int(CheckKind.POST_VERIFY))
_KIND_WRITE = tl.constexpr(int(CheckKind.WRITE))
_VERIFY_CHAIN = tl.constexpr(int(Reason.VERIFY_CHAIN))
_VERIFY_POSITION = tl.constexpr(int(Reason.VERIFY_POSITION))
_VERIFY_REAL_KV = tl.constexpr(int(Reason.VERIFY_REAL_KV))
_VERIFY_TOKEN = tl.constexpr(int(Reason.VERIFY_TOKEN))
_WRITE_TOKEN = tl.constexpr(int(Reason.WRITE_TOKEN))
_WRITE_POSITION = tl.constexpr(int(Reason.WRITE_POSITION))


# ============================================================================= device helpers
# Sums and scans go through this module's own combine function rather than tl.sum/tl.cumsum:
# those are @jit functions of Triton's standard library, fixed as compiled or interpreted when
# triton is first imported, which breaks the interpreter when that import came first.


@triton.jit
def _add(a, b):
    return a + b


@triton.jit
def _sum(x):
    return tl.reduce(x, 0, _add)


@triton.jit
def _cumsum(x):
    return tl.associative_scan(x, 0, _add)


@triton.jit
def _append_violations(
    ring_ptr,
    counters_ptr,
    ring_capacity,
    bad,
    kind,
    reasons,
    req_pool_index,
    slot,
    position,
    stored_token,
    expected_token,
    stored_chain,
    expected_chain,
    step,
):
    """Reserve ring rows for the ``bad`` lanes with one atomic add and fill those that fit."""
    bad_count = bad.to(tl.int64)
    total = _sum(bad_count)
    if total > 0:
        base = tl.atomic_add(counters_ptr + _COUNTER_VIOLATIONS, total)
        index = base + _cumsum(bad_count) - 1
        keep = bad & (index < ring_capacity)
        row = ring_ptr + index * _RING_ROW_FIELDS
        zero = tl.full(index.shape, 0, dtype=tl.int64)
        tl.store(row + _ROW_CHECK, zero + kind, mask=keep)
        tl.store(row + _ROW_REASONS, reasons.to(tl.int64), mask=keep)
        tl.store(row + _ROW_REQ_POOL_INDEX, zero + req_pool_index, mask=keep)
        tl.store(row + _ROW_SLOT, slot, mask=keep)
        tl.store(row + _ROW_POSITION, position, mask=keep)
        tl.store(row + _ROW_STORED_TOKEN, stored_token, mask=keep)
        tl.store(row + _ROW_EXPECTED_TOKEN, expected_token, mask=keep)
        tl.store(row + _ROW_STORED_CHAIN, stored_chain, mask=keep)
        tl.store(row + _ROW_EXPECTED_CHAIN, expected_chain, mask=keep)
        tl.store(row + _ROW_STEP, zero + step, mask=keep)


@triton.jit
def _prefix_lens(seq_lens_ptr, extend_prefix_lens_ptr, offsets, mask, LAYOUT: tl.constexpr):
    """int64 prefix length of the rows at ``offsets`` (vector or scalar)."""
    if LAYOUT == _DECODE:
        return tl.load(seq_lens_ptr + offsets, mask=mask, other=1).to(tl.int64) - 1
    else:
        return tl.load(extend_prefix_lens_ptr + offsets, mask=mask, other=0).to(tl.int64)


@triton.jit
def _locate(item, tile_counts, tile_ends, row_ids):
    """(row, tile within the row) of flat work ``item`` given per-row tile counts and ends."""
    row = _sum((tile_ends <= item).to(tl.int32))
    first_item = _sum(tl.where(row_ids == row, tile_ends - tile_counts, 0))
    return row, item - first_item


@triton.jit
def _load_record_field(records_ptr, slot, mask, FIELD: tl.constexpr):
    return tl.load(records_ptr + slot * _RECORD_FIELDS + FIELD, mask=mask, other=0)


@triton.jit
def _known_history_len(valid_lens_ptr, token_pool_rows, token_pool_cols, rp):
    """int64 number of leading positions of pool row ``rp`` whose token the history knows
    (``valid_lens[rp]`` clipped to the pool's width; 0 for a row outside the pool)."""
    inside = (rp >= 0) & (rp < token_pool_rows)
    known = tl.load(valid_lens_ptr + rp, mask=inside, other=0).to(tl.int64)
    return tl.minimum(known, token_pool_cols)


@triton.jit
def _req_to_token(req_to_token_ptr, rt_rows, rt_cols, rt_stride, req_pool_index, position, mask):
    """int64 ``req_to_token[rp, position]``; 0 where masked or outside the tensor."""
    inside = mask & (req_pool_index >= 0) & (req_pool_index < rt_rows)
    inside = inside & (position >= 0) & (position < rt_cols)
    slot = tl.load(
        req_to_token_ptr + req_pool_index * rt_stride + position, mask=inside, other=0
    )
    return slot.to(tl.int64)


@triton.jit
def _verify_prefixes(
    pid,
    num_programs,
    kind,
    step,
    req_pool_indices_ptr,
    seq_lens_ptr,
    extend_prefix_lens_ptr,
    bs,
    token_pool_ptr,
    token_pool_rows,
    token_pool_cols,
    token_pool_stride,
    valid_lens_ptr,
    records_ptr,
    num_slots,
    req_to_token_ptr,
    rt_rows,
    rt_cols,
    rt_stride,
    ring_ptr,
    ring_capacity,
    counters_ptr,
    kv_words_ptr,
    kv_rows,
    kv_stride,
    LAYOUT: tl.constexpr,
    VERIFY_TOKEN: tl.constexpr,
    NUM_WORDS: tl.constexpr,
    WORD_CHUNK: tl.constexpr,
    BS_BLOCK: tl.constexpr,
    TILE: tl.constexpr,
):
    """Verify this program's share of every live row's prefix; return slots checked (int64)."""
    row_ids = tl.arange(0, BS_BLOCK)
    in_batch = row_ids < bs
    live = in_batch & (tl.load(req_pool_indices_ptr + row_ids, mask=in_batch, other=0) != 0)
    prefix = _prefix_lens(seq_lens_ptr, extend_prefix_lens_ptr, row_ids, in_batch, LAYOUT)
    verify_len = tl.minimum(tl.maximum(prefix, 0), rt_cols)
    tile_counts = tl.where(live, (verify_len + TILE - 1) // TILE, 0).to(tl.int32)
    tile_ends = _cumsum(tile_counts)
    total = _sum(tile_counts)
    lanes = tl.arange(0, TILE)
    checked = tl.full([], 0, dtype=tl.int64)
    for item in range(pid, total, num_programs):
        row, tile = _locate(item, tile_counts, tile_ends, row_ids)
        rp = tl.load(req_pool_indices_ptr + row).to(tl.int64)
        row_prefix = _prefix_lens(seq_lens_ptr, extend_prefix_lens_ptr, row, row < bs, LAYOUT)
        row_len = tl.minimum(tl.maximum(row_prefix, 0), rt_cols)
        position = tile.to(tl.int64) * TILE + lanes
        in_tile = position < row_len
        slot = _req_to_token(req_to_token_ptr, rt_rows, rt_cols, rt_stride, rp, position, in_tile)
        active = in_tile & (slot != 0)
        checked += _sum(active.to(tl.int64))
        readable = active & (slot >= 0) & (slot < num_slots)
        stored_token = _load_record_field(records_ptr, slot, readable, _FIELD_TOKEN)
        stored_position = _load_record_field(records_ptr, slot, readable, _FIELD_POSITION)
        stored_chain = _load_record_field(records_ptr, slot, readable, _FIELD_CHAIN)

        prev_slot = _req_to_token(
            req_to_token_ptr, rt_rows, rt_cols, rt_stride, rp, position - 1, active
        )
        prev_readable = active & (prev_slot > 0) & (prev_slot < num_slots)
        prev_token = _load_record_field(records_ptr, prev_slot, prev_readable, _FIELD_TOKEN)
        prev_position = _load_record_field(records_ptr, prev_slot, prev_readable, _FIELD_POSITION)
        prev_chain = _load_record_field(records_ptr, prev_slot, prev_readable, _FIELD_CHAIN)
        expected_chain = prev_chain + chain_term(prev_token, prev_position)
        expected_chain = tl.where(prev_slot == 0, stored_chain, expected_chain)
        expected_chain = tl.where(position == 0, _CHAIN_ANCHOR, expected_chain)

        reasons = tl.where(stored_position != position, _VERIFY_POSITION, 0)
        reasons |= tl.where(stored_chain != expected_chain, _VERIFY_CHAIN, 0)
        if NUM_WORDS > 0:
            stored_fingerprint = _load_record_field(
                records_ptr, slot, readable, _FIELD_FINGERPRINT
            )
            kv_readable = active & (slot >= 0) & (slot < kv_rows)
            fingerprint = fingerprint_rows(
                kv_words_ptr, slot * kv_stride, kv_readable, NUM_WORDS, WORD_CHUNK
            )
            reasons |= tl.where(stored_fingerprint != fingerprint, _VERIFY_REAL_KV, 0)
        expected_token = tl.full([TILE], _NO_EXPECTED_TOKEN, dtype=tl.int64)
        if VERIFY_TOKEN:
            known_len = _known_history_len(valid_lens_ptr, token_pool_rows, token_pool_cols, rp)
            token_checked = active & (position < known_len)
            pooled = tl.load(
                token_pool_ptr + rp * token_pool_stride + position, mask=token_checked, other=0
            )
            expected_token = tl.where(token_checked, pooled.to(tl.int64), expected_token)
            reasons |= tl.where(token_checked & (stored_token != expected_token), _VERIFY_TOKEN, 0)

        _append_violations(
            ring_ptr,
            counters_ptr,
            ring_capacity,
            active & (reasons != 0),
            kind,
            reasons,
            rp,
            slot,
            position,
            stored_token,
            expected_token,
            stored_chain,
            expected_chain,
            step,
        )
    return checked


@triton.jit
def _row_chain_seed(
    records_ptr, num_slots, req_to_token_ptr, rt_rows, rt_cols, rt_stride, rp, prefix
):
    """Chain value of a row's first new token: from its predecessor record, or the anchor."""
    prev_slot = _req_to_token(
        req_to_token_ptr, rt_rows, rt_cols, rt_stride, rp, prefix - 1, prefix > 0
    )
    readable = (prev_slot > 0) & (prev_slot < num_slots)
    token = _load_record_field(records_ptr, prev_slot, readable, _FIELD_TOKEN)
    position = _load_record_field(records_ptr, prev_slot, readable, _FIELD_POSITION)
    chain = _load_record_field(records_ptr, prev_slot, readable, _FIELD_CHAIN)
    seed = chain + chain_term(token, position)
    return tl.where(prev_slot == 0, _CHAIN_ANCHOR, seed)


@triton.jit
def _chain_terms(input_ids_ptr, positions_ptr, num_tokens, token_index, mask):
    """chain_term of the tokens at ``token_index``; 0 where masked or outside the forward."""
    valid = mask & (token_index >= 0) & (token_index < num_tokens)
    token = tl.load(input_ids_ptr + token_index, mask=valid, other=0).to(tl.int64)
    position = tl.load(positions_ptr + token_index, mask=valid, other=0).to(tl.int64)
    return tl.where(valid, chain_term(token, position), 0)


@triton.jit
def _write_tokens(
    pid,
    num_programs,
    step,
    req_pool_indices_ptr,
    seq_lens_ptr,
    extend_prefix_lens_ptr,
    extend_seq_lens_ptr,
    extend_start_loc_ptr,
    bs,
    input_ids_ptr,
    positions_ptr,
    out_cache_loc_ptr,
    num_tokens,
    expected_input_ids_ptr,
    expected_positions_ptr,
    token_pool_ptr,
    token_pool_rows,
    token_pool_cols,
    token_pool_stride,
    valid_lens_ptr,
    records_ptr,
    num_slots,
    req_to_token_ptr,
    rt_rows,
    rt_cols,
    rt_stride,
    ring_ptr,
    ring_capacity,
    counters_ptr,
    kv_words_ptr,
    kv_rows,
    kv_stride,
    LAYOUT: tl.constexpr,
    HAS_EXPECTED_INPUT_IDS: tl.constexpr,
    HAS_EXPECTED_POSITIONS: tl.constexpr,
    HISTORY_FALLBACK: tl.constexpr,
    NUM_WORDS: tl.constexpr,
    WORD_CHUNK: tl.constexpr,
    BS_BLOCK: tl.constexpr,
    TILE: tl.constexpr,
    SCAN_BLOCK: tl.constexpr,
):
    """Write this program's share of the forward's records; return slots written (int64)."""
    row_ids = tl.arange(0, BS_BLOCK)
    in_batch = row_ids < bs
    live = in_batch & (tl.load(req_pool_indices_ptr + row_ids, mask=in_batch, other=0) != 0)
    if LAYOUT == _DECODE:
        token_counts = tl.where(live, 1, 0).to(tl.int64)
    else:
        token_counts = tl.load(extend_seq_lens_ptr + row_ids, mask=live, other=0).to(tl.int64)
        token_counts = tl.maximum(token_counts, 0)
    tile_counts = tl.where(live, (token_counts + TILE - 1) // TILE, 0).to(tl.int32)
    tile_ends = _cumsum(tile_counts)
    total = _sum(tile_counts)
    lanes = tl.arange(0, TILE)
    scan_lanes = tl.arange(0, SCAN_BLOCK)
    written = tl.full([], 0, dtype=tl.int64)
    for item in range(pid, total, num_programs):
        row, tile = _locate(item, tile_counts, tile_ends, row_ids)
        rp = tl.load(req_pool_indices_ptr + row).to(tl.int64)
        prefix = _prefix_lens(seq_lens_ptr, extend_prefix_lens_ptr, row, row < bs, LAYOUT)
        if LAYOUT == _DECODE:
            first_token = row.to(tl.int64)
            row_tokens = tl.full([], 1, dtype=tl.int64)
        else:
            first_token = tl.load(extend_start_loc_ptr + row).to(tl.int64)
            row_tokens = tl.maximum(tl.load(extend_seq_lens_ptr + row).to(tl.int64), 0)
        tile_start = tile.to(tl.int64) * TILE

        # Chain value before this tile: the row's seed plus the terms of its earlier tiles.
        chain_base = _row_chain_seed(
            records_ptr, num_slots, req_to_token_ptr, rt_rows, rt_cols, rt_stride, rp, prefix
        )
        for scan_start in range(0, tile_start, SCAN_BLOCK):
            k = scan_start + scan_lanes
            terms = _chain_terms(
                input_ids_ptr, positions_ptr, num_tokens, first_token + k, k < tile_start
            )
            chain_base += _sum(terms)

        k = tile_start + lanes
        in_tile = k < row_tokens
        token_index = first_token + k
        valid = in_tile & (token_index >= 0) & (token_index < num_tokens)
        token = tl.load(input_ids_ptr + token_index, mask=valid, other=0).to(tl.int64)
        position = tl.load(positions_ptr + token_index, mask=valid, other=0).to(tl.int64)
        slot = tl.load(out_cache_loc_ptr + token_index, mask=valid, other=0).to(tl.int64)
        terms = tl.where(valid, chain_term(token, position), 0)
        chain = chain_base + _cumsum(terms) - terms

        active = valid & (slot != 0)
        written += _sum(active.to(tl.int64))
        storable = active & (slot > 0) & (slot < num_slots)
        record = records_ptr + slot * _RECORD_FIELDS
        tl.store(record + _FIELD_TOKEN, token, mask=storable)
        tl.store(record + _FIELD_POSITION, position, mask=storable)
        tl.store(record + _FIELD_CHAIN, chain, mask=storable)
        if NUM_WORDS > 0:
            kv_readable = active & (slot >= 0) & (slot < kv_rows)
            fingerprint = fingerprint_rows(
                kv_words_ptr, slot * kv_stride, kv_readable, NUM_WORDS, WORD_CHUNK
            )
        else:
            fingerprint = tl.full([TILE], 0, dtype=tl.int64)
        tl.store(record + _FIELD_FINGERPRINT, fingerprint, mask=storable)

        expected_position = prefix + k
        position_bad = position != expected_position
        reported_position = expected_position
        if HAS_EXPECTED_POSITIONS:
            given_position = tl.load(
                expected_positions_ptr + token_index, mask=valid, other=_NO_EXPECTED_TOKEN
            ).to(tl.int64)
            given_bad = (given_position != _NO_EXPECTED_TOKEN) & (position != given_position)
            # The expectation that failed: the prefix rule first, then the given one.
            reported_position = tl.where(given_bad, given_position, expected_position)
            reported_position = tl.where(position_bad, expected_position, reported_position)
            position_bad |= given_bad
        reasons = tl.where(position_bad, _WRITE_POSITION, 0)
        expected_token = tl.full([TILE], _NO_EXPECTED_TOKEN, dtype=tl.int64)
        if HAS_EXPECTED_INPUT_IDS:
            expected_token = tl.load(
                expected_input_ids_ptr + token_index, mask=valid, other=_NO_EXPECTED_TOKEN
            ).to(tl.int64)
            if HISTORY_FALLBACK:
                # No expectation given (the oracle predicts no prompt token): the token the
                # request's history has at this position, where the history knows it.
                known_len = _known_history_len(
                    valid_lens_ptr, token_pool_rows, token_pool_cols, rp
                )
                from_history = (expected_token == _NO_EXPECTED_TOKEN) & valid
                from_history = from_history & (expected_position >= 0)
                from_history = from_history & (expected_position < known_len)
                history = tl.load(
                    token_pool_ptr + rp * token_pool_stride + expected_position,
                    mask=from_history,
                    other=0,
                )
                expected_token = tl.where(from_history, history.to(tl.int64), expected_token)
            token_bad = (expected_token != _NO_EXPECTED_TOKEN) & (token != expected_token)
            reasons |= tl.where(token_bad, _WRITE_TOKEN, 0)

        _append_violations(
            ring_ptr,
            counters_ptr,
            ring_capacity,
            active & (reasons != 0),
            _KIND_WRITE,
            reasons,
            rp,
            slot,
            expected_position,
            token,
            expected_token,
            position,
            reported_position,
            step,
        )
    return written


# ============================================================================= kernels


# Arguments that change from forward to forward are not specialized on (no recompiles while
# serving); pool sizes and strides are fixed per pool and keep Triton's specialization.
@triton.jit(do_not_specialize=["bs", "num_programs"])
def _pre_forward_verify_kernel(
    req_pool_indices_ptr,
    seq_lens_ptr,
    extend_prefix_lens_ptr,
    bs,
    token_pool_ptr,
    token_pool_rows,
    token_pool_cols,
    token_pool_stride,
    valid_lens_ptr,
    records_ptr,
    num_slots,
    req_to_token_ptr,
    rt_rows,
    rt_cols,
    rt_stride,
    ring_ptr,
    ring_capacity,
    counters_ptr,
    kv_words_ptr,
    kv_rows,
    kv_stride,
    num_programs,
    LAYOUT: tl.constexpr,
    VERIFY_TOKEN: tl.constexpr,
    NUM_WORDS: tl.constexpr,
    WORD_CHUNK: tl.constexpr,
    BS_BLOCK: tl.constexpr,
    VERIFY_TILE: tl.constexpr,
):
    pid = tl.program_id(0)
    # Rows carry counters[STEP], which only the post launch changes.
    step = tl.load(counters_ptr + _COUNTER_STEP)
    checked = _verify_prefixes(
        pid,
        num_programs,
        _KIND_PRE,
        step,
        req_pool_indices_ptr,
        seq_lens_ptr,
        extend_prefix_lens_ptr,
        bs,
        token_pool_ptr,
        token_pool_rows,
        token_pool_cols,
        token_pool_stride,
        valid_lens_ptr,
        records_ptr,
        num_slots,
        req_to_token_ptr,
        rt_rows,
        rt_cols,
        rt_stride,
        ring_ptr,
        ring_capacity,
        counters_ptr,
        kv_words_ptr,
        kv_rows,
        kv_stride,
        LAYOUT,
        VERIFY_TOKEN,
        NUM_WORDS,
        WORD_CHUNK,
        BS_BLOCK,
        VERIFY_TILE,
    )
    if checked > 0:
        tl.atomic_add(counters_ptr + _ENTRIES_PRE, checked)
    if pid == 0:
        tl.atomic_add(counters_ptr + _RUNS_PRE, 1)


@triton.jit(do_not_specialize=["bs", "num_tokens", "num_programs"])
def _post_forward_write_and_verify_kernel(
    req_pool_indices_ptr,
    seq_lens_ptr,
    extend_prefix_lens_ptr,
    extend_seq_lens_ptr,
    extend_start_loc_ptr,
    bs,
    input_ids_ptr,
    positions_ptr,
    out_cache_loc_ptr,
    num_tokens,
    expected_input_ids_ptr,
    expected_positions_ptr,
    token_pool_ptr,
    token_pool_rows,
    token_pool_cols,
    token_pool_stride,
    valid_lens_ptr,
    records_ptr,
    num_slots,
    req_to_token_ptr,
    rt_rows,
    rt_cols,
    rt_stride,
    ring_ptr,
    ring_capacity,
    counters_ptr,
    kv_words_ptr,
    kv_rows,
    kv_stride,
    num_programs,
    LAYOUT: tl.constexpr,
    VERIFY_TOKEN: tl.constexpr,
    HAS_EXPECTED_INPUT_IDS: tl.constexpr,
    HAS_EXPECTED_POSITIONS: tl.constexpr,
    HISTORY_FALLBACK: tl.constexpr,
    NUM_WORDS: tl.constexpr,
    WORD_CHUNK: tl.constexpr,
    BS_BLOCK: tl.constexpr,
    VERIFY_TILE: tl.constexpr,
    WRITE_TILE: tl.constexpr,
    SCAN_BLOCK: tl.constexpr,
):
    pid = tl.program_id(0)
    # The forward's step index. This launch advances counters[STEP] itself, so it cannot read
    # that race-free; the pre launch of the same forward counted itself in RUNS_PRE.
    step = tl.load(counters_ptr + _RUNS_PRE) - 1
    checked = _verify_prefixes(
        pid,
        num_programs,
        _KIND_POST,
        step,
        req_pool_indices_ptr,
        seq_lens_ptr,
        extend_prefix_lens_ptr,
        bs,
        token_pool_ptr,
        token_pool_rows,
        token_pool_cols,
        token_pool_stride,
        valid_lens_ptr,
        records_ptr,
        num_slots,
        req_to_token_ptr,
        rt_rows,
        rt_cols,
        rt_stride,
        ring_ptr,
        ring_capacity,
        counters_ptr,
        kv_words_ptr,
        kv_rows,
        kv_stride,
        LAYOUT,
        VERIFY_TOKEN,
        NUM_WORDS,
        WORD_CHUNK,
        BS_BLOCK,
        VERIFY_TILE,
    )
    written = _write_tokens(
        pid,
        num_programs,
        step,
        req_pool_indices_ptr,
        seq_lens_ptr,
        extend_prefix_lens_ptr,
        extend_seq_lens_ptr,
        extend_start_loc_ptr,
        bs,
        input_ids_ptr,
        positions_ptr,
        out_cache_loc_ptr,
        num_tokens,
        expected_input_ids_ptr,
        expected_positions_ptr,
        token_pool_ptr,
        token_pool_rows,
        token_pool_cols,
        token_pool_stride,
        valid_lens_ptr,
        records_ptr,
        num_slots,
        req_to_token_ptr,
        rt_rows,
        rt_cols,
        rt_stride,
        ring_ptr,
        ring_capacity,
        counters_ptr,
        kv_words_ptr,
        kv_rows,
        kv_stride,
        LAYOUT,
        HAS_EXPECTED_INPUT_IDS,
        HAS_EXPECTED_POSITIONS,
        HISTORY_FALLBACK,
        NUM_WORDS,
        WORD_CHUNK,
        BS_BLOCK,
        WRITE_TILE,
        SCAN_BLOCK,
    )
    if checked > 0:
        tl.atomic_add(counters_ptr + _ENTRIES_POST, checked)
    if written > 0:
        tl.atomic_add(counters_ptr + _ENTRIES_WRITE, written)
    if pid == 0:
        tl.atomic_add(counters_ptr + _RUNS_POST, 1)
        tl.atomic_add(counters_ptr + _RUNS_WRITE, 1)
        tl.atomic_add(counters_ptr + _COUNTER_STEP, 1)


# ============================================================================= launches


def launch_pre_forward_verify(*, state: CanaryDeviceState, batch: CanaryBatchView) -> None:
    """Verify every live row's prefix slots before the model forward (kind ``PRE_VERIFY``).

    One kernel launch; no host synchronization, no allocation; CUDA-graph capturable (the grid
    depends only on ``bs``, ``max_context_len`` and the device). Semantics: see
    :mod:`.canary_kernels_ref`.
    """
    plan = _plan_launch(state=state, batch=batch)
    pool = _token_pool_args(batch)
    _pre_forward_verify_kernel[(plan.num_programs_pre,)](
        batch.req_pool_indices,
        batch.seq_lens,
        _or(batch.extend_prefix_lens, batch.seq_lens),
        batch.batch_size,
        *pool,
        state.records,
        state.num_slots,
        state.req_to_token,
        *state.req_to_token.shape,
        state.req_to_token.stride(0),
        state.ring,
        state.ring_capacity,
        state.counters,
        *_real_kv_args(state),
        plan.num_programs_pre,
        LAYOUT=int(batch.layout),
        VERIFY_TOKEN=_verifies_tokens(batch),
        NUM_WORDS=state.real_kv_num_words,
        WORD_CHUNK=plan.word_chunk,
        BS_BLOCK=plan.bs_block,
        VERIFY_TILE=plan.verify_tile,
        num_warps=_NUM_WARPS,
    )


def launch_post_forward_write_and_verify(
    *, state: CanaryDeviceState, batch: CanaryBatchView
) -> None:
    """Verify prefix slots again and write this forward's records (``POST_VERIFY``, ``WRITE``).

    One kernel launch (the verified and the written slot sets are disjoint); no host
    synchronization, no allocation; CUDA-graph capturable. Semantics: see
    :mod:`.canary_kernels_ref`.
    """
    plan = _plan_launch(state=state, batch=batch)
    pool = _token_pool_args(batch)
    _post_forward_write_and_verify_kernel[(plan.num_programs_post,)](
        batch.req_pool_indices,
        batch.seq_lens,
        _or(batch.extend_prefix_lens, batch.seq_lens),
        _or(batch.extend_seq_lens, batch.seq_lens),
        _or(batch.extend_start_loc, batch.seq_lens),
        batch.batch_size,
        batch.input_ids,
        batch.positions,
        batch.out_cache_loc,
        batch.num_tokens,
        _or(batch.expected_input_ids, batch.input_ids),
        _or(batch.expected_positions, batch.positions),
        *pool,
        state.records,
        state.num_slots,
        state.req_to_token,
        *state.req_to_token.shape,
        state.req_to_token.stride(0),
        state.ring,
        state.ring_capacity,
        state.counters,
        *_real_kv_args(state),
        plan.num_programs_post,
        LAYOUT=int(batch.layout),
        VERIFY_TOKEN=_verifies_tokens(batch),
        HAS_EXPECTED_INPUT_IDS=batch.expected_input_ids is not None,
        HAS_EXPECTED_POSITIONS=batch.expected_positions is not None,
        HISTORY_FALLBACK=(
            batch.expected_input_ids is not None and batch.expected_token_pool is not None
        ),
        NUM_WORDS=state.real_kv_num_words,
        WORD_CHUNK=plan.word_chunk,
        BS_BLOCK=plan.bs_block,
        VERIFY_TILE=plan.verify_tile,
        WRITE_TILE=plan.write_tile,
        SCAN_BLOCK=_SCAN_BLOCK,
        num_warps=_NUM_WARPS,
    )


# ============================================================================= launch planning

_INTERPRETED = isinstance(_pre_forward_verify_kernel, InterpretedFunction)  # TRITON_INTERPRET=1

_PROGRAMS_PER_SM = 4
_CPU_PROGRAMS = 3  # the interpreter runs programs one after another: few, each looping
_NUM_WARPS = 4
_MAX_WORD_CHUNK = 16
_TILE_ELEMENTS = 1024  # tile lanes x words read per fingerprint step (register budget)
_MIN_TILE = 64
_VERIFY_TILE = 512
_EXTEND_WRITE_TILE = 512
_DECODE_WRITE_TILE = 16  # a decode row writes one token
_SCAN_BLOCK = 2048


@dataclass(frozen=True, slots=True, kw_only=True)
class _LaunchPlan:
    """Tile and grid sizes of one launch; derived from host-known sizes only."""

    bs_block: int  # batch rows padded to a power of two
    word_chunk: int  # real K words read per row per fingerprint step
    verify_tile: int  # prefix positions per verify item
    write_tile: int  # tokens per write item
    num_programs_pre: int
    num_programs_post: int


def _plan_launch(*, state: CanaryDeviceState, batch: CanaryBatchView) -> _LaunchPlan:
    check_same_device(state=state, batch=batch)
    device = state.device
    if device.type != "cuda" and not _INTERPRETED:
        raise ValueError(
            f"the canary Triton kernels need CUDA tensors, got {device}; on a CPU use "
            "canary_kernels_ref (same signatures) or set TRITON_INTERPRET=1 before importing them"
        )
    bs = batch.batch_size
    word_chunk = min(triton.next_power_of_2(max(state.real_kv_num_words, 1)), _MAX_WORD_CHUNK)
    tile_cap = max(_MIN_TILE, _TILE_ELEMENTS // word_chunk)
    verify_tile = min(_VERIFY_TILE, tile_cap)
    if batch.layout is BatchLayout.DECODE:
        write_tile = _DECODE_WRITE_TILE
        max_write_items = bs
    else:
        write_tile = min(_EXTEND_WRITE_TILE, tile_cap)
        max_write_items = triton.cdiv(batch.num_tokens, write_tile) + bs
    max_verify_items = bs * triton.cdiv(state.req_to_token.shape[1], verify_tile)
    cap = _max_programs(device)
    return _LaunchPlan(
        bs_block=max(16, triton.next_power_of_2(bs)),
        word_chunk=word_chunk,
        verify_tile=verify_tile,
        write_tile=write_tile,
        num_programs_pre=max(1, min(cap, max_verify_items)),
        num_programs_post=max(1, min(cap, max_verify_items + max_write_items)),
    )


@functools.cache
def _max_programs_cuda(device_index: int) -> int:
    sms = torch.cuda.get_device_properties(device_index).multi_processor_count
    return sms * _PROGRAMS_PER_SM


def _max_programs(device: torch.device) -> int:
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        return _max_programs_cuda(index)
    return _CPU_PROGRAMS


def _or(tensor: torch.Tensor | None, placeholder: torch.Tensor) -> torch.Tensor:
    """``tensor``, or a never-read placeholder where the kernel's constexpr flag is off."""
    return placeholder if tensor is None else tensor


def _verifies_tokens(batch: CanaryBatchView) -> bool:
    return batch.expected_token_pool is not None and batch.verify_token


def _token_pool_args(batch: CanaryBatchView) -> tuple:
    pool = batch.expected_token_pool
    if pool is None:
        return (batch.req_pool_indices, 0, 0, 0, batch.req_pool_indices)
    return (pool, pool.shape[0], pool.shape[1], pool.stride(0), batch.expected_token_valid_lens)


def _real_kv_args(state: CanaryDeviceState) -> tuple:
    words = state.real_kv_words
    if words is None:
        return (state.records, 0, 0)
    return (words, words.shape[0], words.stride(0))
