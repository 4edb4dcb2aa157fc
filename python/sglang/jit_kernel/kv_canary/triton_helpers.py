"""Triton device functions shared by the canary kernels (``canary_forward``, ``sweep``,
``scatter_req_token_ids``).

- hashing: ``mix64``, ``chain_term``, the fingerprint key / term and the slot fingerprint over
  the real-data sources: bit-identical to :mod:`.hashing` (pinned by a test). Arithmetic runs on
  ``tl.uint64`` bitcasts so right shifts are logical and multiplications wrap modulo 2**64;
  inputs and outputs are ``tl.int64``.
- reductions and scans (``sum_1d``, ``cumsum_1d``, ``xor_rows``) through ``tl.reduce`` /
  ``tl.associative_scan`` rather than ``tl.sum`` / ``tl.cumsum``: those are ``@jit`` functions
  of Triton's standard library, fixed as compiled or interpreted when triton is first imported,
  which breaks the interpreter when that import came first. Sums pass Triton's own add combine
  function, which this code never calls: the compiler inlines it as ``tl.sum`` does, and the
  interpreter recognizes it and sums with numpy (a combine function of ours would be called once
  per element there).
- masked loads of ``req_to_token``, records and the token history; every index is bounds-checked
  and an index outside its tensor reads as zero, so a corrupt index becomes a reported violation,
  never a memory fault.
- the violation-ring append.

Only builtins of ``triton.language`` are used (no ``tl.cdiv``, ``tl.zeros``, ``tl.sum``...).
"""

from __future__ import annotations

import triton
import triton.language as tl

from sglang.jit_kernel.kv_canary.consts import (
    CHAIN_ANCHOR,
    CHAIN_SALT,
    CHAIN_TERM_BITS,
    COUNTER_CONSUMED,
    COUNTER_VIOLATIONS,
    FIELD_CHAIN,
    FIELD_FINGERPRINT,
    FIELD_STAMP,
    FIELD_TOKEN_POSITION,
    FINGERPRINT_SALT,
    LANDING_SALT,
    LANDING_STEP_SHIFT,
    NO_EXPECTED_TOKEN,
    POSITION_SHIFT,
    RECORD_FIELDS,
    RING_ROW_FIELDS,
    ROW_CHECK,
    ROW_EXPECTED_CHAIN,
    ROW_EXPECTED_TOKEN,
    ROW_POSITION,
    ROW_REASONS,
    ROW_REQ_POOL_INDEX,
    ROW_SLOT,
    ROW_INDEX,
    ROW_STEP,
    ROW_STORED_CHAIN,
    ROW_STORED_TOKEN,
    TOKEN_MASK,
    Reason,
)
from sglang.jit_kernel.kv_canary.hashing import MIX64_MULTIPLIER_1, MIX64_MULTIPLIER_2

# load_record_head / load_record_tail read a record as two 16-byte halves.
assert (FIELD_TOKEN_POSITION, FIELD_CHAIN, FIELD_FINGERPRINT, FIELD_STAMP) == (0, 1, 2, 3)

# Triton sees module globals only as constexprs.
_M1 = tl.constexpr(MIX64_MULTIPLIER_1)
_M2 = tl.constexpr(MIX64_MULTIPLIER_2)
_CHAIN_SALT = tl.constexpr(CHAIN_SALT)
_CHAIN_TERM_SHIFT = tl.constexpr(64 - CHAIN_TERM_BITS)
_FINGERPRINT_SALT = tl.constexpr(FINGERPRINT_SALT)
_LANDING_SALT = tl.constexpr(LANDING_SALT)
_LANDING_STEP_SHIFT = tl.constexpr(LANDING_STEP_SHIFT)
_TOKEN_MASK = tl.constexpr(TOKEN_MASK)
_POSITION_SHIFT = tl.constexpr(POSITION_SHIFT)
_RECORD_FIELDS = tl.constexpr(RECORD_FIELDS)
CHAIN_ANCHOR_C = tl.constexpr(CHAIN_ANCHOR)
NO_TOKEN_C = tl.constexpr(NO_EXPECTED_TOKEN)
_VIOLATIONS = tl.constexpr(COUNTER_VIOLATIONS)
_CONSUMED = tl.constexpr(COUNTER_CONSUMED)
_RING_ROW_FIELDS = tl.constexpr(RING_ROW_FIELDS)
_ROW_INDEX = tl.constexpr(ROW_INDEX)
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
_VERIFY_CHAIN = tl.constexpr(int(Reason.VERIFY_CHAIN))
_VERIFY_POSITION = tl.constexpr(int(Reason.VERIFY_POSITION))
_VERIFY_TOKEN = tl.constexpr(int(Reason.VERIFY_TOKEN))
_VERIFY_UNMAPPED = tl.constexpr(int(Reason.VERIFY_UNMAPPED))


# ============================================================================= hashing


@triton.jit
def mix64_u64(x):
    """SplitMix64 finalizer on a ``tl.uint64`` tensor."""
    x ^= x >> 30
    x *= _M1
    x ^= x >> 27
    x *= _M2
    x ^= x >> 31
    return x


@triton.jit
def mix64(x):
    """SplitMix64 finalizer on an int64 tensor (unsigned semantics); returns int64."""
    return mix64_u64(x.to(tl.uint64, bitcast=True)).to(tl.int64, bitcast=True)


@triton.jit
def chain_term(token, position):
    """Chain-rule term of int64 (token, position) tensors; int64 values in ``[0, 2**40)``.
    Callers pass the token's low 32 bits."""
    token_u = token.to(tl.int64).to(tl.uint64, bitcast=True)
    position_u = position.to(tl.int64).to(tl.uint64, bitcast=True)
    mixed = mix64_u64((token_u << 32) ^ position_u ^ _CHAIN_SALT)
    return (mixed >> _CHAIN_TERM_SHIFT).to(tl.int64)


@triton.jit
def fingerprint_key(source, column):
    """``mix64(((source << 32) | column) ^ FINGERPRINT_SALT)`` of int64 ``column``; int64."""
    packed = (column.to(tl.int64) | (source << 32)).to(tl.uint64, bitcast=True)
    return mix64_u64(packed ^ _FINGERPRINT_SALT).to(tl.int64, bitcast=True)


@triton.jit
def fingerprint_term(word, key):
    """One word's contribution ``mix64(word ^ key)``; int64."""
    return mix64(word ^ key)


@triton.jit
def source_fingerprint(
    words_ptr,
    num_rows,
    row_stride,
    slot,
    mask,
    SOURCE: tl.constexpr,
    WORDS: tl.constexpr,
    PARTIAL: tl.constexpr,
    WORD_CHUNK: tl.constexpr,
):
    """Fingerprint contribution of one real-data source for int64 ``slot [N]``.

    Lanes outside ``mask`` or whose slot lies outside ``[0, num_rows)`` fold zero words (and
    rotate as slot 0 in partial mode), as :func:`.hashing.slot_fingerprints_torch` does.
    ``PARTIAL``: the two words ``c0, c0 + 1`` with ``c0 = 2 * (slot mod (WORDS // 2))``, one
    16-byte load per lane; otherwise every word, ``WORD_CHUNK`` (a power of two) per step.
    Returns int64 ``[N]``.
    """
    inside = mask & (slot >= 0) & (slot < num_rows)
    row = tl.where(inside, slot, 0)
    if PARTIAL:
        first = 2 * (row % (WORDS // 2))
        columns = first[:, None] + tl.arange(0, 2)[None, :]
        words = tl.load(
            words_ptr + row[:, None] * row_stride + columns, mask=inside[:, None], other=0
        )
        terms = fingerprint_term(words, fingerprint_key(SOURCE, columns))
        low, high = tl.split(terms)
        acc = low ^ high
    else:
        acc = tl.full(slot.shape, 0, dtype=tl.int64)
        for chunk_start in tl.static_range(0, WORDS, WORD_CHUNK):
            column = chunk_start + tl.arange(0, WORD_CHUNK)
            in_row = column < WORDS
            words = tl.load(
                words_ptr + row[:, None] * row_stride + column[None, :],
                mask=inside[:, None] & in_row[None, :],
                other=0,
            )
            key = fingerprint_key(SOURCE, column)
            terms = tl.where(in_row[None, :], fingerprint_term(words, key[None, :]), 0)
            acc ^= xor_rows(terms)
    return acc


@triton.jit
def rotated_source_fingerprint(
    words_ptr,
    num_rows,
    row_stride,
    slot,
    rotation,
    mask,
    SOURCE: tl.constexpr,
    WORDS: tl.constexpr,
    PARTIAL: tl.constexpr,
    WORD_CHUNK: tl.constexpr,
):
    """:func:`source_fingerprint` of the bytes of ``slot`` with the ``PARTIAL`` window placed
    by int64 ``rotation [N]`` instead of the slot (a rotation outside ``[0, num_rows)``, or a
    slot outside them, places it as slot 0; without ``PARTIAL`` the rotation is unused), as
    :func:`.hashing.slot_fingerprints_torch` with ``rotations``. Returns int64 ``[N]``.

    A function of its own, not a parameter of :func:`source_fingerprint`: Triton 3.6 fails to
    compile the per-forward kernel (``TritonGPURemoveLayoutConversions``: an operand that does
    not dominate its use) when that function places its window through a second ``where``.
    """
    if PARTIAL:
        inside = mask & (slot >= 0) & (slot < num_rows)
        row = tl.where(inside, slot, 0)
        placed = tl.where(inside & (rotation >= 0) & (rotation < num_rows), rotation, 0)
        first = 2 * (placed % (WORDS // 2))
        columns = first[:, None] + tl.arange(0, 2)[None, :]
        words = tl.load(
            words_ptr + row[:, None] * row_stride + columns, mask=inside[:, None], other=0
        )
        terms = fingerprint_term(words, fingerprint_key(SOURCE, columns))
        low, high = tl.split(terms)
        return low ^ high
    else:
        return source_fingerprint(words_ptr, num_rows, row_stride, slot, mask, SOURCE, WORDS,
                                  False, WORD_CHUNK)


@triton.jit
def source_lane(folded, SOURCE: tl.constexpr, NUM_SOURCES: tl.constexpr):
    """The top ``W = 64 // NUM_SOURCES`` bits of int64 ``folded`` at lane ``SOURCE`` (bits
    ``[SOURCE * W, (SOURCE + 1) * W)``); int64."""
    top = folded.to(tl.uint64, bitcast=True) >> (64 - 64 // NUM_SOURCES)
    return (top << (SOURCE * (64 // NUM_SOURCES))).to(tl.int64, bitcast=True)


@triton.jit
def lane_mask(source, NUM_SOURCES: tl.constexpr):
    """The bits of each lane ``source`` (int64 tensor) of a ``partial`` fingerprint; int64."""
    ones = tl.full(source.shape, -1, dtype=tl.int64).to(tl.uint64, bitcast=True)
    mask = (ones >> (64 - 64 // NUM_SOURCES)) << (source * (64 // NUM_SOURCES)).to(tl.uint64)
    return mask.to(tl.int64, bitcast=True)


@triton.jit
def _selected_lane(
    words_ptr, num_rows, row_stride, slot, mask, due, every,
    SOURCE: tl.constexpr, NUM_SOURCES: tl.constexpr, WORDS: tl.constexpr, WORD_CHUNK: tl.constexpr,
):
    """Lane ``SOURCE`` of a ``partial`` fingerprint where the source is selected (``every`` or
    ``due == SOURCE``), else 0; only the selected elements load."""
    selected = mask & (every | (due == SOURCE))
    folded = source_fingerprint(
        words_ptr, num_rows, row_stride, slot, selected, SOURCE, WORDS, True, WORD_CHUNK
    )
    return tl.where(selected, source_lane(folded, SOURCE, NUM_SOURCES), 0)


@triton.jit
def source_rows(slot, mask, window_slot, window_live, SOURCE: tl.constexpr,
                WINDOWED: tl.constexpr):
    """(rows, lanes) that real-data source ``SOURCE`` is read at: ``slot`` where ``mask``, or
    for a windowed source (bit ``SOURCE`` of ``WINDOWED``) ``window_slot`` where ``mask`` and
    ``window_live`` (see :class:`~.kernel_inputs.SlotWindow`)."""
    if (WINDOWED >> SOURCE) & 1:
        return window_slot, mask & window_live
    else:
        return slot, mask


@triton.jit
def window_slots(table_ptr, table_len, num_window_slots, slot, needed):
    """(window slot, live) of int64 record slots ``slot`` where bool ``needed``: the table's
    value where it lies in ``[1, num_window_slots)``, else (0, False); a slot outside the table
    reads as none."""
    inside = needed & (slot >= 0) & (slot < table_len)
    value = tl.load(table_ptr + slot, mask=inside, other=0).to(tl.int64)
    live = inside & (value >= 1) & (value < num_window_slots)
    return tl.where(live, value, 0), live


@triton.jit
def windowed_lane(source, WINDOWED: tl.constexpr):
    """bool: whether each source index of the int64 tensor ``source`` is windowed."""
    bits = tl.full(source.shape, WINDOWED, dtype=tl.int64)
    return ((bits >> source) & 1) != 0


@triton.jit
def slot_fingerprint(
    slot,
    mask,
    window_slot,
    window_live,
    due,
    every,
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
    WINDOWED: tl.constexpr,
):
    """Fingerprint of the live KV bytes of int64 ``slot [N]`` over ``NUM_SOURCES`` (0..4)
    real-data sources; int64 ``[N]`` (0 with no sources). A windowed source (bit of
    ``WINDOWED``) reads ``window_slot`` and only where ``window_live`` (:func:`source_rows`);
    without ``PARTIAL`` the windowed sources then fold into the upper 32-bit half and the others
    into the lower (:func:`.hashing.slot_fingerprints_torch`).

    ``PARTIAL``: the lanes of :func:`.hashing.slot_fingerprints_torch`, each source read only
    where it is selected: where bool ``every [N]`` holds, or where int64 ``due [N]`` names it;
    the lanes of sources not selected are 0. Otherwise every source is read where ``mask``
    holds (``due`` and ``every`` unused).
    """
    acc = tl.full(slot.shape, 0, dtype=tl.int64)
    if NUM_SOURCES > 0:
        row0, on0 = source_rows(slot, mask, window_slot, window_live, 0, WINDOWED)
    if NUM_SOURCES > 1:
        row1, on1 = source_rows(slot, mask, window_slot, window_live, 1, WINDOWED)
    if NUM_SOURCES > 2:
        row2, on2 = source_rows(slot, mask, window_slot, window_live, 2, WINDOWED)
    if NUM_SOURCES > 3:
        row3, on3 = source_rows(slot, mask, window_slot, window_live, 3, WINDOWED)
    if PARTIAL:
        if NUM_SOURCES > 0:
            acc |= _selected_lane(src0_ptr, src0_rows, src0_stride, row0, on0, due, every,
                                  0, NUM_SOURCES, WORDS0, WORD_CHUNK)
        if NUM_SOURCES > 1:
            acc |= _selected_lane(src1_ptr, src1_rows, src1_stride, row1, on1, due, every,
                                  1, NUM_SOURCES, WORDS1, WORD_CHUNK)
        if NUM_SOURCES > 2:
            acc |= _selected_lane(src2_ptr, src2_rows, src2_stride, row2, on2, due, every,
                                  2, NUM_SOURCES, WORDS2, WORD_CHUNK)
        if NUM_SOURCES > 3:
            acc |= _selected_lane(src3_ptr, src3_rows, src3_stride, row3, on3, due, every,
                                  3, NUM_SOURCES, WORDS3, WORD_CHUNK)
        return acc
    # Whole rows: one folded value, or with windowed sources two halves (the other sources',
    # the windowed ones'), so the first half still verifies where no window slot is live.
    windowed = acc
    if NUM_SOURCES > 0:
        folded = source_fingerprint(
            src0_ptr, src0_rows, src0_stride, row0, on0, 0, WORDS0, PARTIAL, WORD_CHUNK
        )
        if (WINDOWED >> 0) & 1:
            windowed ^= folded
        else:
            acc ^= folded
    if NUM_SOURCES > 1:
        folded = source_fingerprint(
            src1_ptr, src1_rows, src1_stride, row1, on1, 1, WORDS1, PARTIAL, WORD_CHUNK
        )
        if (WINDOWED >> 1) & 1:
            windowed ^= folded
        else:
            acc ^= folded
    if NUM_SOURCES > 2:
        folded = source_fingerprint(
            src2_ptr, src2_rows, src2_stride, row2, on2, 2, WORDS2, PARTIAL, WORD_CHUNK
        )
        if (WINDOWED >> 2) & 1:
            windowed ^= folded
        else:
            acc ^= folded
    if NUM_SOURCES > 3:
        folded = source_fingerprint(
            src3_ptr, src3_rows, src3_stride, row3, on3, 3, WORDS3, PARTIAL, WORD_CHUNK
        )
        if (WINDOWED >> 3) & 1:
            windowed ^= folded
        else:
            acc ^= folded
    if WINDOWED != 0:
        acc = source_lane(acc, 0, 2) | source_lane(windowed, 1, 2)
    return acc


@triton.jit
def rotated_slot_fingerprint(
    slot,
    rotation,
    mask,
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
):
    """The whole fingerprint (``PARTIAL``: every lane) of the bytes of int64 ``slot [N]`` where
    ``mask``, each source's window placed by ``rotation`` (:func:`rotated_source_fingerprint`);
    no windowed sources. With ``rotation == slot`` it equals :func:`slot_fingerprint` with
    ``every``. Returns int64 ``[N]``."""
    acc = tl.full(slot.shape, 0, dtype=tl.int64)
    if NUM_SOURCES > 0:
        folded = rotated_source_fingerprint(src0_ptr, src0_rows, src0_stride, slot, rotation,
                                            mask, 0, WORDS0, PARTIAL, WORD_CHUNK)
        acc = _add_source(acc, folded, 0, NUM_SOURCES, PARTIAL)
    if NUM_SOURCES > 1:
        folded = rotated_source_fingerprint(src1_ptr, src1_rows, src1_stride, slot, rotation,
                                            mask, 1, WORDS1, PARTIAL, WORD_CHUNK)
        acc = _add_source(acc, folded, 1, NUM_SOURCES, PARTIAL)
    if NUM_SOURCES > 2:
        folded = rotated_source_fingerprint(src2_ptr, src2_rows, src2_stride, slot, rotation,
                                            mask, 2, WORDS2, PARTIAL, WORD_CHUNK)
        acc = _add_source(acc, folded, 2, NUM_SOURCES, PARTIAL)
    if NUM_SOURCES > 3:
        folded = rotated_source_fingerprint(src3_ptr, src3_rows, src3_stride, slot, rotation,
                                            mask, 3, WORDS3, PARTIAL, WORD_CHUNK)
        acc = _add_source(acc, folded, 3, NUM_SOURCES, PARTIAL)
    return tl.where(mask, acc, 0)


@triton.jit
def _add_source(acc, folded, SOURCE: tl.constexpr, NUM_SOURCES: tl.constexpr,
                PARTIAL: tl.constexpr):
    """``acc`` with one source's fold added: its lane (``PARTIAL``) or XORed in."""
    if PARTIAL:
        return acc | source_lane(folded, SOURCE, NUM_SOURCES)
    else:
        return acc ^ folded


# ============================================================================= landing poison


@triton.jit
def _landing_window(words_ptr, num_rows, row_stride, slot, mask, step, SOURCE: tl.constexpr,
                    WORDS: tl.constexpr):
    """(addresses, lanes on, poison) of the landing window of int64 ``slot [N]`` in one source
    (:func:`.hashing.landing_columns`, :func:`.hashing.landing_poison_scalar`): ``[N, 2]`` each,
    the second column off for a one-word row and every column off outside ``mask`` or the
    source's rows."""
    inside = mask & (slot >= 0) & (slot < num_rows)
    row = tl.where(inside, slot, 0)
    if WORDS >= 2:
        first = 2 * (row % (WORDS // 2))
    else:
        first = row * 0
    columns = first[:, None] + tl.arange(0, 2)[None, :]
    on = inside[:, None] & (columns < WORDS)
    step_bits = (step + 1) << _LANDING_STEP_SHIFT
    base = mix64((row ^ step_bits) ^ _LANDING_SALT)
    poison = base[:, None] ^ fingerprint_key(SOURCE, columns)
    return words_ptr + row[:, None] * row_stride + columns, on, poison


@triton.jit
def poison_landing_window(words_ptr, num_rows, row_stride, slot, mask, step,
                          SOURCE: tl.constexpr, WORDS: tl.constexpr):
    """Write the landing poison into the window of ``slot`` (lanes ``mask``) of one source."""
    address, on, poison = _landing_window(words_ptr, num_rows, row_stride, slot, mask, step,
                                          SOURCE, WORDS)
    tl.store(address, poison, mask=on)


@triton.jit
def landing_window_poisoned(words_ptr, num_rows, row_stride, slot, mask, step,
                            SOURCE: tl.constexpr, WORDS: tl.constexpr):
    """bool ``[N]``: lanes ``mask`` whose window in one source still holds the landing poison
    of forward ``step`` (every word of it; False outside the source's rows)."""
    address, on, poison = _landing_window(words_ptr, num_rows, row_stride, slot, mask, step,
                                          SOURCE, WORDS)
    words = tl.load(address, mask=on, other=0)
    kept = tl.where(on, (words == poison).to(tl.int32), 0)
    inside = mask & (slot >= 0) & (slot < num_rows)
    return inside & (row_sums(kept) == row_sums(on.to(tl.int32)))


# ============================================================================= reductions


_ADD = tl.standard._sum_combine  # only passed to tl.reduce / tl.associative_scan


@triton.jit
def _xor(a, b):
    return a ^ b


@triton.jit
def sum_1d(x):
    """Sum of a 1-D tensor (a scalar)."""
    return tl.reduce(x, 0, _ADD)


@triton.jit
def row_sums(x):
    """Sum of each row of a 2-D tensor (1-D, one per row)."""
    return tl.reduce(x, 1, _ADD)


@triton.jit
def cumsum_1d(x):
    """Inclusive prefix sum of a 1-D tensor."""
    return tl.associative_scan(x, 0, _ADD)


@triton.jit
def xor_rows(x):
    """XOR over axis 1 of a 2-D tensor."""
    return tl.reduce(x, 1, _xor)


@triton.jit
def cdiv(a, b):
    """Ceiling division of non-negative ``a`` by positive ``b``."""
    return (a + b - 1) // b


# ============================================================================= loads


@triton.jit
def load_req_to_token(table_ptr, num_rows, num_cols, row_stride, rp, position, mask):
    """int64 ``req_to_token[rp, position]`` (``rp`` scalar or vector); 0 where masked off or
    outside the table."""
    inside = mask & (rp >= 0) & (rp < num_rows) & (position >= 0) & (position < num_cols)
    slot = tl.load(table_ptr + rp * row_stride + position, mask=inside, other=0)
    return slot.to(tl.int64)


@triton.jit
def load_record_head(records_ptr, num_slots, slot, mask):
    """``(token_position, chain)`` of the records of int64 ``slot [N]``: one 16-byte load per
    lane; zeros where masked off or outside ``[0, num_slots)``."""
    inside = mask & (slot >= 0) & (slot < num_slots)
    fields = slot[:, None] * _RECORD_FIELDS + tl.arange(0, 2)[None, :]
    pair = tl.load(records_ptr + fields, mask=inside[:, None], other=0)
    return tl.split(pair)


@triton.jit
def load_record_tail(records_ptr, num_slots, slot, mask):
    """``(fingerprint, stamp)`` of the records of int64 ``slot [N]``, as
    :func:`load_record_head`."""
    inside = mask & (slot >= 0) & (slot < num_slots)
    fields = slot[:, None] * _RECORD_FIELDS + 2 + tl.arange(0, 2)[None, :]
    pair = tl.load(records_ptr + fields, mask=inside[:, None], other=0)
    return tl.split(pair)


@triton.jit
def unpack_token(packed):
    """Token (low 32 bits, non-negative int64) of a packed token/position field."""
    return packed & _TOKEN_MASK


@triton.jit
def unpack_position(packed):
    """Position (high 32 bits, sign-extended) of a packed token/position field."""
    return packed >> _POSITION_SHIFT


@triton.jit
def successor_chain(packed, chain):
    """``chain + chain_term(token, position)``: the chain value after a record."""
    return chain + chain_term(unpack_token(packed), unpack_position(packed))


@triton.jit
def known_history_len(lens_ptr, num_rows, num_cols, rp, mask):
    """int64 number of leading positions of pool row ``rp`` whose token the history knows
    (``lens[rp]`` clipped to the history's width; 0 for a row outside the history)."""
    inside = mask & (rp >= 0) & (rp < num_rows)
    known = tl.load(lens_ptr + rp, mask=inside, other=0).to(tl.int64)
    return tl.minimum(known, num_cols)


@triton.jit
def load_history_token(history_ptr, row_stride, rp, position, mask):
    """Low 32 bits of ``history[rp, position]`` (int64) where ``mask``; 0 elsewhere. Callers
    mask with ``0 <= position < known_history_len(rp)``."""
    token = tl.load(history_ptr + rp * row_stride + position, mask=mask, other=0)
    return token.to(tl.int64) & _TOKEN_MASK


# ============================================================================= checks


@triton.jit
def check_records(
    records_ptr,
    num_slots,
    slot,
    mapped,
    expected_position,
    prev_slot,
    anchored,
):
    """Position and chain checks of the records of int64 ``slot [N]`` (lanes ``mapped``).

    ``anchored`` lanes must hold ``CHAIN_ANCHOR``; other lanes ``successor_chain`` of
    ``prev_slot``'s record, unless ``prev_slot`` is 0 (not checked: the expected chain repeats
    the stored one). Returns ``(reasons, token, chain, expected_chain)``, int64 ``[N]``.
    """
    packed, chain = load_record_head(records_ptr, num_slots, slot, mapped)
    has_prev = mapped & (prev_slot != 0) & ~anchored
    prev_packed, prev_chain = load_record_head(records_ptr, num_slots, prev_slot, has_prev)
    expected_chain = tl.where(has_prev, successor_chain(prev_packed, prev_chain), chain)
    expected_chain = tl.where(anchored, CHAIN_ANCHOR_C, expected_chain)
    reasons = tl.where(unpack_position(packed) != expected_position, _VERIFY_POSITION, 0)
    reasons |= tl.where(chain != expected_chain, _VERIFY_CHAIN, 0)
    return reasons, unpack_token(packed), chain, expected_chain


@triton.jit
def check_token(reasons, token, expected_token):
    """Add ``VERIFY_TOKEN`` where ``expected_token != NO_EXPECTED_TOKEN`` and differs."""
    bad = (expected_token != NO_TOKEN_C) & (token != expected_token)
    return reasons | tl.where(bad, _VERIFY_TOKEN, 0)


# ============================================================================= ring


@triton.jit
def ring_append(
    ring_ptr,
    counters_ptr,
    capacity,
    bad,
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
):
    """Append a violation row for each ``bad`` lane of 1-D tensors (scalars broadcast).

    One atomic add on ``counters[COUNTER_VIOLATIONS]`` reserves indices ``n`` for the failing
    lanes (none for a clean tile); row ``n`` goes to ``ring[n % capacity]`` if ``n -
    counters[COUNTER_CONSUMED] < capacity``, else it is dropped (it is still counted); a stored
    row carries ``n`` in ``ROW_INDEX``.
    """
    flags = bad.to(tl.int64)
    total = sum_1d(flags)
    if total > 0:
        base = tl.atomic_add(counters_ptr + _VIOLATIONS, total)
        consumed = tl.load(counters_ptr + _CONSUMED)
        index = base + cumsum_1d(flags) - 1
        keep = bad & (index - consumed < capacity)
        row = ring_ptr + (index % capacity) * _RING_ROW_FIELDS
        zero = index * 0
        tl.store(row + _ROW_CHECK, zero + kind, mask=keep)
        tl.store(row + _ROW_REASONS, zero + reasons, mask=keep)
        tl.store(row + _ROW_REQ_POOL_INDEX, zero + rp, mask=keep)
        tl.store(row + _ROW_SLOT, zero + slot, mask=keep)
        tl.store(row + _ROW_POSITION, zero + position, mask=keep)
        tl.store(row + _ROW_STORED_TOKEN, zero + stored_token, mask=keep)
        tl.store(row + _ROW_EXPECTED_TOKEN, zero + expected_token, mask=keep)
        tl.store(row + _ROW_STORED_CHAIN, zero + stored_chain, mask=keep)
        tl.store(row + _ROW_EXPECTED_CHAIN, zero + expected_chain, mask=keep)
        tl.store(row + _ROW_STEP, zero + step, mask=keep)
        tl.store(row + _ROW_INDEX, index, mask=keep)


@triton.jit
def append_verify_rows(
    ring_ptr,
    counters_ptr,
    capacity,
    lanes,
    reasons,
    kind,
    rp,
    slot,
    position,
    token,
    expected_token,
    chain,
    expected_chain,
    step,
):
    """Append verify rows of the ``lanes`` with ``reasons != 0``; a lane whose slot is 0 gets
    ``VERIFY_UNMAPPED`` alone, tokens ``NO_EXPECTED_TOKEN`` and chains 0."""
    unmapped = lanes & (slot == 0)
    reasons = tl.where(unmapped, _VERIFY_UNMAPPED, reasons)
    ring_append(
        ring_ptr,
        counters_ptr,
        capacity,
        lanes & (reasons != 0),
        kind,
        reasons,
        rp,
        slot,
        position,
        tl.where(unmapped, NO_TOKEN_C, token),
        tl.where(unmapped, NO_TOKEN_C, expected_token),
        tl.where(unmapped, 0, chain),
        tl.where(unmapped, 0, expected_chain),
        step,
    )
